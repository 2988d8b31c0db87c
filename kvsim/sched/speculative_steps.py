"""The scheduler's half of speculative decoding (`engine.speculative_config`, `kvsim.sched.speculative`):
a verify step's token totals, its outcome (accepted drafts, the rejected drafts' slots left held), and
the slots rejected drafts hold now (the `draft_rejected` waste share). Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsim.workload.request import RequestStatus

if TYPE_CHECKING:
    import numpy as np

    from kvsim.kv import KVAllocator
    from kvsim.latency.step_plan import StepPlan
    from kvsim.sched.speculative import Speculation
    from kvsim.workload.request import Request


class SpeculativeSteps:
    """Mixed into `kvsim.sched.base.Scheduler`, whose state it uses (`alloc`, `running`, `speculation`)."""

    alloc: KVAllocator
    async_scheduling: bool
    rng: np.random.Generator
    running: list[Request]
    speculation: Speculation | None

    def draft_rejected_slots(self) -> tuple[int, int]:
        """Slots holding the KV of rejected drafts now, split (below the final length, past it).

        A verify that leaves c tokens computed and rejects r drafts leaves their KV in slots [c, c + r)
        of the request's blocks. The next step that schedules the request writes slot c first (its
        last sampled token, counted written when planned), so from then [c + 1, c + r) remain; the
        step overwrites them as it runs; a step that decodes the request without a verify (`overwriting`) writes
        slot c too. Slots below `kv_len` are the pool's reserved ones, the rest its internal fragmentation."""
        assert self.speculation is not None
        verifying, overwriting = self.speculation.pending, self.speculation.overwriting
        below = past = 0
        for req in self.running:
            rejected = req.num_rejected_draft_slots
            if rejected and req.status is RequestStatus.RUNNING:
                computed, request_id = req.num_computed_tokens, req.request_id
                start, end = computed + (request_id in verifying or request_id in overwriting), computed + rejected
                if end > start:
                    inside = max(0, min(end, req.kv_len) - start)
                    below += inside
                    past += end - start - inside
        return below, past

    def draw_verify_outcomes(self, plan: StepPlan) -> None:
        """Draw the drafts each verifying request of `plan` accepts (`Speculation.accepted`), before the step is
        priced, and count the ones rejected in `plan.num_rejected_draft_tokens`: vLLM's drafter runs after the
        verify and its passes after the first read each context without them (`seq_lens -= num_rejected_tokens`
        in `propose`, vllm/v1/spec_decode/eagle.py, `kvsim.latency.speculative`).

        One draw per request of `pending`, in the plan's order, from the run's generator (nothing drawn for a
        fixed acceptance). A request with acceptance lengths from a trace takes its k-th verify step's from there
        (k counted since it arrived, over the steps that verified at least one draft: one whose drafts the budget
        or max_model_len cut to none is a plain decode in vLLM, which counts no spec-decode step for it) in place
        of the model's draw while they last; either is capped at the drafts verified."""
        spec = self.speculation
        if spec is None or not spec.pending:
            return
        pending, accepted = spec.pending, spec.accepted
        draws = iter(spec.model.sample(self.rng, len(pending)).tolist())
        for req, _ in plan.scheduled:
            num_drafts = pending.get(req.request_id)
            if num_drafts is None:
                continue
            num_accepted = next(draws)
            lengths = req.acceptance_lengths
            if lengths is not None and req.num_verify_steps < len(lengths):
                num_accepted = lengths[req.num_verify_steps] - 1  # emitted tokens − the correction/bonus token
            accepted[req.request_id] = num_accepted = min(num_accepted, num_drafts)
            plan.num_rejected_draft_tokens += num_drafts - num_accepted
        assert len(accepted) == len(pending), "every verifying request is in the plan"

    def _complete_verify(self, spec: Speculation, req: Request, num_drafts: int, num_accepted: int) -> bool:
        """A verify step's outcome (`num_accepted` of its `num_drafts`, `draw_verify_outcomes`): the accepted
        drafts and one more token (the correction or the bonus), capped at the request's output length; their KV
        is written, the rejected drafts' slots stay held (the next step overwrites them). True when the request
        has its last token; with async scheduling, one that needed more than the verify's one sure token for it
        (accepted drafts ended it) is due vLLM's discarded verify in the next plan (`in_flight_finished`, holding
        the tokens of this verify vLLM still counts computed then: `kvsim.sched.v1.V1Scheduler.select`)."""
        req.num_verify_steps += num_drafts > 0  # vLLM's: steps with drafts (budget or max_model_len cut some to 0)
        req.num_rejected_draft_slots = 0
        req.num_accepted_drafts = num_accepted
        emitted = min(num_accepted + 1, req.output_len - req.num_output_tokens)
        req.num_computed_tokens += emitted
        req.num_output_tokens += emitted
        spec.record_verify(num_drafts, num_accepted)
        if req.num_output_tokens >= req.output_len:
            if self.async_scheduling and emitted > 1:
                spec.in_flight_finished[req.request_id] = 1 + num_drafts - emitted
            return True
        written = self.alloc.allocate(req.seq_ids[0], req.num_computed_tokens, req.kv_len, req.content)
        assert written is not None, "the verify step held these slots"
        spec.num_rejected_slots += num_drafts - num_accepted
        req.num_rejected_draft_slots = num_drafts - num_accepted
        if num_drafts > num_accepted:
            spec.in_flight_rejected[req.request_id] = num_drafts - num_accepted
        return False

    def forget_draft_hashes(self, req: Request, plan: StepPlan) -> None:
        """Before a preemption frees `req`'s KV (synchronous scheduling): uncache the blocks vLLM has not cached yet.

        vLLM caches a request's full blocks only in `KVCacheManager.allocate_slots`, up to `request.num_tokens`,
        which a verify's drafts are not in; the drafts it accepts join `num_tokens` when its output is processed
        (`Scheduler.update_from_output`, which caches nothing), so their blocks are cached at the request's next
        allocation. Preempted before that (by a plan that has not scheduled it since), vLLM frees them uncached
        (`BlockPool.free_blocks`: to the free queue's head) and the re-admission misses them; kvsim caches the
        accepted tokens when the verify's outcome writes them (`_complete_verify`), so it takes them back here
        (tests/test_vllm_cache_lag.py). With async scheduling (placeholders for the drafts too): not modelled."""
        if self.speculation is None or self.async_scheduling or not req.num_accepted_drafts:
            return
        # a plan that scheduled it cached them; a step after a verify is a verify, whose outcome sets it anew
        if not any(r is req for r, _ in plan.scheduled):
            for seq_id in req.seq_ids:
                self.alloc.forget_newest_hashes(seq_id, req.num_accepted_drafts)
