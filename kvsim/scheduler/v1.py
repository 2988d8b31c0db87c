"""vLLM v1's scheduler: one token budget per step, running requests first, then FCFS admission.

No prefill/decode phases: each request's `num_computed_tokens` catches up to `num_tokens`
by chunks (chunked prefill) or by 1 (decode). Per step:

1. RUNNING, in admission order: schedule `min(remaining, budget)` tokens. If the KV
   blocks are not there, preempt the most recently admitted running request (recompute:
   free everything, back to the front of the queue) until they are, or until the request
   itself was the one preempted.
2. If nothing was preempted, admit WAITING requests FCFS while budget and `max_num_seqs`
   allow and the whole prompt (after prefix-cache hits) fits; the first that does not fit
   ends admission for the step.
"""

from __future__ import annotations

from kvsim.latency import StepPlan
from kvsim.request import Request
from kvsim.scheduler.base import Scheduler


class V1Scheduler(Scheduler):
    name = "v1"

    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        budget = self.limits.max_num_batched_tokens
        running = self.running
        i = 0
        append_token = getattr(self.alloc, "append_token", None)
        while i < len(running) and budget > 0:
            req = running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if num_new == 1 and append_token is not None and req.num_samples == 1 and append_token(req.seq_ids[0]):
                plan.scheduled.append((req, 1))  # fast path: a decode token in its own last block
                plan.add(1, req.num_computed_tokens, 1, samples=True)
                budget -= 1
                i += 1
                continue
            if not self.allocate_or_preempt(req, req.num_computed_tokens + num_new, plan):
                break
            self.plan_tokens(plan, req, num_new)
            budget -= num_new
            i += 1
        if not plan.preempted:
            self._admit(plan, budget, now)
        return plan

    def _admit(self, plan: StepPlan, budget: int, now: float) -> None:
        max_num_seqs = self.limits.max_num_seqs
        num_seqs = self.num_running_seqs()
        while self.waiting and budget > 0 and num_seqs + self.waiting[0].num_samples <= max_num_seqs:
            req = self.waiting[0]
            hit = self.lookup(req)
            if not self.can_admit(req, hit):
                break
            num_new = min(req.num_tokens - hit.num_tokens, budget)
            self.admit(req, num_new, hit, plan, now)
            budget -= num_new
            num_seqs += req.num_samples

    def use_swap(self, req: Request) -> bool:
        """vLLM v1 preempts by recompute only."""
        return False

    def burst_batch(self):  # -> list[Request] | None
        """Also requires the whole batch to fit the token budget (else it is served in turns)."""
        if len(self.running) > self.limits.max_num_batched_tokens:
            return None
        return super().burst_batch()

    def waiting_blocked(self) -> bool:
        req = self.waiting[0]
        return (self.num_running_seqs() + req.num_samples > self.limits.max_num_seqs
                or len(self.running) >= self.limits.max_num_batched_tokens
                or not self.can_admit(req, self.lookup(req)))
