"""vLLM v1's scheduler: one token budget per step, running requests first, then FCFS admission.

No prefill/decode phases: each request's `num_computed_tokens` catches up to `num_tokens`
by chunks (chunked prefill) or by 1 (decode). Per step:

1. RUNNING, in admission order: schedule `min(remaining, budget)` tokens. If the KV
   blocks are not there, preempt the policy's victim (FCFS: the most recently admitted
   running request; priority: the lowest-priority one, max (priority, arrival)) by
   recompute (free everything, back to the queue) until they are, or until the request
   itself was the one preempted. A priority victim this step already scheduled is taken
   out of the plan and its tokens go back to the budget, as vLLM's scheduler does.
   With speculative decoding every decoding request (one whose last step sampled a token: vLLM drops
   a prefill chunk's drafts) verifies 1 + K tokens (the last sampled one
   and K drafts, fewer if the budget or max_model_len cuts them, as vLLM trims drafts) and holds
   slots for them plus the lookahead (`num_lookahead_tokens`: K for EAGLE and draft models), as does
   a running request's next prefill chunk (vLLM passes the lookahead for every running request; a
   request it admits from the queue gets none unless it holds loaded KV); `complete` accepts a prefix of the drafts
   (`kvsim.sched.speculative`). With async scheduling vLLM plans a verify before the output of the verify ending
   now is processed, so it still counts that verify's rejected drafts as computed (`update_from_output` rolls
   `num_computed_tokens` back afterwards): the cap and the slots start that many tokens further, and a request
   left no token under the cap is passed over for the step (`Speculation.in_flight_rejected`); a running request
   a step leaves out loses its drafts, which live on the GPU (`_drop_unscheduled_drafts`). A request the verify
   ending now ended by accepted drafts is still in vLLM's running list, not sure to have ended: at its place it
   gets one more verify, output discarded (`_wasted_verifies`).
2. If nothing was preempted, admit WAITING requests in the policy's order (FCFS, or
   smallest (priority, arrival)) while budget and `max_num_seqs` allow and the whole prompt
   (after prefix-cache hits) fits (with sliding-window or other hybrid KV groups, for a prompt longer
   than the shortest window: the first chunk, as vLLM v1 allocates it, `kvsim.kv.hybrid`); the first
   that does not fit ends admission for the step.
   With KV offload, a request whose prefix the offload tiers hold past the GPU hit leaves the queue
   to load it (`Scheduler.start_load`) and admission goes on; loaded ones rejoin at the front (under FCFS
   ahead of any request preempted since: `loaded_first`). One whose offload hit another request is loading
   (vLLM's `_blocks_being_loaded`), or whose hit meets a block still being stored (vLLM's HIT_PENDING), sits
   the step out (`waits_for_a_transfer`) and admission goes on behind it; it stays ahead of any request
   preempted since, as the loaded ones do (vLLM's skipped queue holds both).

A request with n > 1 samples (not beam search) joins the queue as n child requests, each scheduled,
counted by `max_num_seqs`, preempted and finished on its own, sharing prompt blocks only through the
prefix cache; its row is written when the last child finishes (`kvsim.sched.fanout`). It is refused only
for what one child could never get: n > max_num_seqs runs its children in turns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice

import numpy as np

from kvsim.kv import KVAllocator
from kvsim.latency.step_plan import StepPlan
from kvsim.results.records import RequestRecords
from kvsim.sched.base import Scheduler, SchedulerLimits
from kvsim.sched.fanout import SampleGroups, fans_out, make_child
from kvsim.sched.request_queue import RequestQueue
from kvsim.workload.request import Request, RequestStatus


def _schedule_plain_decodes(running: list[Request], start: int, budget: int, scheduled: list[tuple[Request, int]],
                            append_token: Callable[[int], bool]) -> int:
    """Schedule `running[start:]`, at most `budget` of them, while each is a plain decode: one sequence, its
    last step sampled (computed = prompt + output − 1 ≥ 1), its token going into its own last block
    (`KVAllocator.append_token`, which writes it); returns how many. The one that stops the run (its token
    needs a new block, or it is no plain decode) is left to the general path, `append_token` already tried.

    The bulk of a step, run as one loop: the same requests in the same order as the general loop
    would schedule them one by one (it starts where this stops), so the same allocator calls."""
    num_before = len(scheduled)
    for req in islice(running, start, start + budget):
        past = req.num_computed_tokens
        if not (past and req.prompt_len + req.num_output_tokens == past + 1 and req.num_samples == 1
                and append_token(req.seq_ids[0])):
            break
        scheduled.append((req, 1))
    return len(scheduled) - num_before


class V1Scheduler(Scheduler):
    name = "v1"
    # vLLM v1's model runner takes a logits row at every scheduled request's last token and samples them all,
    # a partial prefill chunk's too, dropping its token afterwards (`GPUModelRunner._prepare_inputs`:
    # `logits_indices = query_start_loc[1:] - 1`, "we do so for simplicity"; `discard_request_mask`); with
    # speculative decoding `num_draft_tokens + 1` rows a request, so 1 for a chunk (`StepPlan.add_verify`)
    logits_every_request = True

    def __init__(self, allocator: KVAllocator, limits: SchedulerLimits, rng: np.random.Generator | None = None,
                 waiting: RequestQueue | None = None) -> None:
        super().__init__(allocator, limits, rng, waiting)
        self.samples = SampleGroups()  # requests fanned out into child requests, until their last child ends
        self.samples.row_records.append(self.records)

    # ---------------------------------------------- parallel sampling (`kvsim.sched.fanout`)
    def reject_reason(self, req: Request) -> str | None:
        """A request that fans out is refused only for what each of its children (all alike) is."""
        return super().reject_reason(make_child(req, 0) if fans_out(req) else req)

    def enqueue(self, req: Request) -> None:
        """Queue `req`, or the n children it fans out into, in index order."""
        if fans_out(req):
            for child in self.samples.fan_out(req):
                self.waiting.add(child)
        else:
            self.waiting.add(req)

    def num_queued(self, req: Request) -> int:
        return req.num_samples if fans_out(req) else 1

    def record_rows(self, done: list[Request]) -> None:
        self.records.extend(self.samples.ended(done))

    def row_id(self, req: Request) -> int | None:
        return self.samples.row_id(req)

    def row_records(self) -> Sequence[RequestRecords]:
        return self.samples.row_records

    def check_invariants(self) -> None:
        super().check_invariants()
        self.samples.check_invariants()

    def select(self, now: float) -> StepPlan:
        if self.offload is not None:
            self.finish_loads(now)
        plan = StepPlan()
        budget = self.limits.max_num_batched_tokens
        running, scheduled, append_token = self.running, plan.scheduled, self.alloc.append_token
        spec = self.speculation
        # async: requests a verify just ended by accepted drafts, due vLLM's discarded verify (admission order)
        wasted = self._wasted_verifies() if spec is not None and spec.in_flight_finished else []
        order = self.admission_order
        group_tokens: dict[int, int] = {}  # request id -> the budget a scheduled beam group took, all beams
        i = 0
        while budget > 0:
            if spec is None:  # no verifies, none wasted: the plain decodes from `i` on, then one that is not
                num_plain = _schedule_plain_decodes(running, i, budget, scheduled, append_token)
                i += num_plain
                budget -= num_plain
                if not budget or i >= len(running):
                    break
                req, finished = running[i], False
            elif wasted and wasted[0].request_id not in order:
                wasted.pop(0)  # preempted (a finishing victim) since: vLLM took it out of `running`
                continue
            elif wasted and (i >= len(running) or order[wasted[0].request_id] < order[running[i].request_id]):
                req, finished = wasted.pop(0), True
            elif i < len(running):
                req, finished = running[i], False
            else:
                break
            past = req.num_computed_tokens
            # decoding: verify the drafts proposed after its last step, which sampled (a prefill chunk that
            # ends one token short of its tokens sampled nothing: its next step computes that token alone)
            verify = spec is not None and (finished or req.has_drafts)
            num_new, hold_slots, ahead = min(req.num_tokens - past, budget), 0, 0
            num_seqs = self.computing_seqs(req)  # a forked beam group computes num_new tokens per beam
            if num_new * num_seqs > budget:  # vLLM counts each beam's token (v1: a request per beam)
                i += 1  # a group is scheduled whole or not at all: the requests after it may still fit
                continue
            if spec is not None:
                if verify:
                    if self.async_scheduling:  # vLLM still counts the drafts the verify ending now rejected
                        ahead = (spec.in_flight_finished if finished else spec.in_flight_rejected).get(
                            req.request_id, 0)
                    # vLLM caps a running request's tokens at max_model_len - 1 - num_computed_tokens (scheduler.py)
                    max_drafts = self.limits.max_model_len - 1 - req.num_tokens - ahead
                    if max_drafts < 0:  # not one token under that cap: vLLM passes the request over this step
                        i += not finished
                        continue
                    num_drafts = min(spec.num_speculative_tokens, budget - 1, max_drafts)
                    num_new = 1 + num_drafts
                # vLLM's allocate_slots(num_lookahead_tokens) for every running request: a prefill chunk too
                hold_slots = min(past + ahead + num_new + spec.num_lookahead_slots, self.limits.max_model_len)
            num_preempted = len(plan.preempted)
            # a finished request's verify only holds its slots (its output is discarded, its KV freed after the plan)
            fits = self.allocate_or_preempt(req, None if finished else past + 1 if verify else past + num_new, plan,
                                            hold_slots)
            if len(plan.preempted) > num_preempted and self.waiting.policy == "priority":
                refunded, unscheduled = self._unschedule(plan, plan.preempted[num_preempted:], group_tokens)
                budget += refunded
                i -= unscheduled  # they stood before `req` in `running`
            if not fits:
                break
            if verify:
                assert spec is not None
                spec.pending[req.request_id] = num_new - 1
            elif spec is not None and req.num_rejected_draft_slots:
                spec.overwriting.add(req.request_id)
            scheduled.append((req, num_new))
            budget -= num_new * num_seqs
            if num_seqs > 1:
                group_tokens[req.request_id] = num_new * num_seqs
            i += not finished
        if spec is not None:
            spec.in_flight_rejected.clear()  # the next plan comes after this one's output: vLLM counts them no more
            spec.in_flight_finished.clear()
            if self.async_scheduling:
                self._drop_unscheduled_drafts(plan)
        if not plan.preempted:
            self._admit(plan, budget, now)
        return plan

    def _wasted_verifies(self) -> list[Request]:
        """Async scheduling with speculation: the requests the verify ending now ended by accepted drafts
        (`Speculation.in_flight_finished`), in admission order. vLLM plans this step before that verify's output
        is processed, and its running loop skips a request only when it is sure the verify in flight ends it
        (`num_computed_tokens + 2 − num_output_placeholders ≥ num_prompt_tokens + max_tokens`: the one token
        the verify surely emits reaches `max_tokens`), so each of these, still in its `running` at its place,
        gets one more verify of 1 + K placeholder tokens (cut to the budget and `max_model_len`, as any verify),
        its slots allocated (`allocate_slots`, lookahead too; it may preempt, or be preempted), counted in the
        step's batch and time; its output is discarded (the request is gone when it comes) and its KV freed
        when the verify that ended it is processed, right after this plan (`AsyncSteps.release_finished`)."""
        assert self.speculation is not None
        ending = self.speculation.in_flight_finished
        order = self.admission_order
        return sorted((r for r in self.finishing if r.request_id in ending), key=lambda r: order[r.request_id])

    def _drop_unscheduled_drafts(self, plan: StepPlan) -> None:
        """Async scheduling: a running request this step leaves out (the budget ran out, or passed over) loses its
        drafts. They live on the GPU, made for the requests of the step before, and vLLM clears the placeholders of
        a request it does not schedule (`AsyncScheduler._update_after_schedule`): its next step decodes its last
        sampled token alone, and the drafter proposes again after it."""
        scheduled = {id(req) for req, _ in plan.scheduled}
        for req in self.running:
            if req.has_drafts and id(req) not in scheduled:
                req.has_drafts = False

    def _unschedule(self, plan: StepPlan, victims: list[Request], group_tokens: dict[int, int]) -> tuple[int, int]:
        """Take preempted requests that this step already scheduled out of `plan.scheduled`, as vLLM's
        priority preemption does (their tokens go back to the budget, every beam's of a beam group as
        `group_tokens` has them; `account` never sees them); returns (tokens, requests)."""
        gone = {id(v) for v in victims}
        if self.speculation is not None:
            for victim in victims:
                self.speculation.pending.pop(victim.request_id, None)
        kept = [(r, n) for r, n in plan.scheduled if id(r) not in gone]
        refunded = sum(group_tokens.get(r.request_id, n) for r, n in plan.scheduled if id(r) in gone)
        # of `running` only: a finished victim (its discarded verify, `_wasted_verifies`) was never in it
        unscheduled = sum(1 for r, _ in plan.scheduled if id(r) in gone and r.status is not RequestStatus.FINISHED)
        plan.scheduled[:] = kept
        return refunded, unscheduled

    def _admit(self, plan: StepPlan, budget: int, now: float) -> None:
        if (self.held_kv_tokens or self.load_waiters) and self.waiting:
            self.loaded_first()
        max_num_seqs, waiting = self.limits.max_num_seqs, self.waiting
        num_seqs = self.num_running_seqs()
        skipped: list[Request] = []  # waiting for a transfer of their hit (`waits_for_a_transfer`)
        while waiting and budget > 0:
            req = waiting.peek()
            if num_seqs + req.num_samples > max_num_seqs:
                break
            if self.offload is not None:
                self.touch_offloaded(req)  # vLLM's connector lookup touches its blocks, fit or not
            hit = self.lookup(req)
            if self.offload is not None and self.waits_for_a_transfer(req, hit):
                skipped.append(waiting.pop())  # vLLM's skipped_waiting: first in line again next step
                self.load_waiters |= {req.request_id}
                continue
            num_new = min(req.num_tokens - hit.num_tokens, budget)
            if not self.can_admit(req, hit, num_new):
                break
            if self.offload is not None and self.start_load(req, hit, now):
                continue  # it waits for its load (vLLM's WAITING_FOR_REMOTE_KVS); the next may be admitted
            lookahead_slots = self._loaded_lookahead_slots(req, num_new)
            if lookahead_slots and not self.alloc.hold(req.seq_ids[0], lookahead_slots):
                break  # vLLM's allocate_slots fails with the lookahead: admission stops there
            self.admit(req, num_new, hit, plan, now)
            if self.load_waiters:
                self.load_waiters -= {req.request_id}
            budget -= num_new
            num_seqs += req.num_samples
        for req in reversed(skipped):
            waiting.prepend(req)

    def _loaded_lookahead_slots(self, req: Request, num_new: int) -> int:
        """The slots a request that holds loaded KV (from a prefill instance or the offload tiers) holds when
        admitted, with EAGLE's or a draft model's lookahead: vLLM allocates `num_lookahead_tokens` past its
        new tokens for a request whose computed tokens are not 0, which only loaded KV gives a waiting one
        (`effective_lookahead_tokens` in `Scheduler.schedule`); 0 for any other admission (no hold)."""
        spec = self.speculation
        held = self.held_kv_tokens.get(req.request_id) if self.held_kv_tokens else None
        if held is None or spec is None or not spec.num_lookahead_slots:
            return 0
        return min(held + num_new + spec.num_lookahead_slots, self.limits.max_model_len)

    def schedules_whole_decode_batch(self, num_running: int) -> bool:
        """A batch larger than the token budget is decoded in turns."""
        return num_running <= self.limits.max_num_batched_tokens

    def waiting_blocked(self) -> bool:
        req = self.waiting.peek()
        hit = self.lookup(req)
        first_chunk = min(req.num_tokens - hit.num_tokens, self.limits.max_num_batched_tokens)
        return (self.num_running_seqs() + req.num_samples > self.limits.max_num_seqs
                or len(self.running) >= self.limits.max_num_batched_tokens
                or not self.can_admit(req, hit, first_chunk))


def data_parallel_fan_out(schedulers: Sequence[Scheduler]) -> Callable[[Request], list[Request]] | None:
    """What a data-parallel group of v1 engines is sent in place of each arriving request: vLLM's front end
    fans a request with n > 1 out into its children before its DP client routes each child to an engine of
    its own choosing (vllm/v1/engine/async_llm.py `add_request`, then `DPLBAsyncMPClient.add_request_async` per
    child), so siblings may run on different ranks and share no prefix cache. The ranks share one
    `SampleGroups`: the rank whose child ends last writes the parent's row. A request one child could never
    run is sent whole, for its rank to refuse. None for one engine, or engines that are not v1."""
    ranks = [s for s in schedulers if isinstance(s, V1Scheduler)]
    if len(schedulers) < 2 or len(ranks) < len(schedulers):
        return None
    first, shared = ranks[0], ranks[0].samples
    for rank in ranks[1:]:
        rank.samples = shared
        shared.row_records.append(rank.records)  # a preempted finishing child counts on its parent's row, wherever

    def fan_out(req: Request) -> list[Request]:
        req.cap_output(first.limits.max_model_len)
        if not fans_out(req) or first.reject_reason(req) is not None:
            return [req]
        return shared.fan_out(req)
    return fan_out
