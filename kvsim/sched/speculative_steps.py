"""The scheduler's half of speculative decoding (`engine.speculative_config`, `kvsim.sched.speculative`):
a verify step's token totals, its outcome (accepted drafts, the rejected drafts' slots left held), and
the slots rejected drafts hold now (the `draft_rejected` waste share). Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsim.workload.request import RequestStatus

if TYPE_CHECKING:
    from kvsim.kv import KVAllocator
    from kvsim.sched.speculative import Speculation
    from kvsim.workload.request import Request


class SpeculativeSteps:
    """Mixed into `kvsim.sched.base.Scheduler`, whose state it uses (`alloc`, `running`, `speculation`)."""

    alloc: KVAllocator
    running: list[Request]
    speculation: Speculation | None

    def draft_rejected_slots(self) -> tuple[int, int]:
        """Slots holding the KV of rejected drafts now, split (below the final length, past it).

        A verify that leaves c tokens computed and rejects r drafts leaves their KV in slots [c, c + r)
        of the request's blocks. The next step that schedules the request writes slot c first (its
        last sampled token, counted written when planned), so from then [c + 1, c + r) remain; the
        step overwrites them as it runs. Slots below `kv_len` are the pool's reserved ones, the rest
        its internal fragmentation."""
        assert self.speculation is not None
        verifying = self.speculation.pending
        below = past = 0
        for req in self.running:
            rejected = req.num_rejected_draft_slots
            if rejected and req.status is RequestStatus.RUNNING:
                computed = req.num_computed_tokens
                start, end = computed + (req.request_id in verifying), computed + rejected
                if end > start:
                    inside = max(0, min(end, req.kv_len) - start)
                    below += inside
                    past += end - start - inside
        return below, past

    def _complete_verify(self, spec: Speculation, req: Request, num_drafts: int, num_accepted: int) -> bool:
        """A verify step's outcome: the accepted drafts and one more token (the correction or the bonus),
        capped at the request's output length; their KV is written, the rejected drafts' slots stay
        held (the next step overwrites them). True when the request has its last token. A request with
        acceptance lengths from a trace takes its k-th verify step's from there (k counted since it
        arrived) in place of the model's draw while they last; either is capped at the drafts verified."""
        lengths = req.acceptance_lengths
        if lengths is not None and req.num_verify_steps < len(lengths):
            num_accepted = lengths[req.num_verify_steps] - 1  # emitted tokens − the correction/bonus token
        req.num_verify_steps += 1
        num_accepted = min(num_accepted, num_drafts)
        req.num_rejected_draft_slots = 0
        emitted = min(num_accepted + 1, req.output_len - req.num_output_tokens)
        req.num_computed_tokens += emitted
        req.num_output_tokens += emitted
        spec.record_verify(num_drafts, num_accepted)
        if req.num_output_tokens >= req.output_len:
            return True
        written = self.alloc.allocate(req.seq_ids[0], req.num_computed_tokens, req.kv_len, req.content)
        assert written is not None, "the verify step held these slots"
        spec.num_rejected_slots += num_drafts - num_accepted
        req.num_rejected_draft_slots = num_drafts - num_accepted
        return False
