"""Request-level (static) batching, as before continuous batching (FasterTransformer era).

When nothing is running, admit a batch FCFS up to `max_num_seqs` sequences and
`max_num_batched_tokens` prompt tokens computed (the one step the engine's memory was
profiled for; `EngineConfig` keeps it at least `max_model_len`, so any prompt fits alone),
whose KV for the whole request (prompt + output, every sample) is set aside at admission,
then prefill the batch in one step and decode until its last request finishes. Requests that finish early leave
the batch, but nobody joins it until it is empty. Memory is reserved up front, so nothing
is ever preempted.
"""

from __future__ import annotations

from kvsim.latency.step_plan import StepPlan
from kvsim.sched.base import Scheduler


class StaticScheduler(Scheduler):
    name = "static"

    def select(self, now: float) -> StepPlan:
        plan = StepPlan()
        if not self.running:
            self._admit_batch(plan, now)
            return plan
        for req in self.running:
            grown = self.try_allocate(req, req.num_computed_tokens + 1, plan)
            assert grown, "static batches never run out"
            plan.scheduled.append((req, 1))
        return plan

    def _admit_batch(self, plan: StepPlan, now: float) -> None:
        available = self.alloc.num_free_slots  # minus what admitted requests will grow into
        budget = self.limits.max_num_batched_tokens
        num_seqs, waiting = 0, self.waiting
        while waiting:
            req = waiting.peek()
            if num_seqs + req.num_samples > self.limits.max_num_seqs:
                break
            hit = self.lookup(req)
            need, num_new = self.request_slots(req), req.num_tokens - hit.num_tokens
            if need > available or num_new > budget or not self.can_admit(req, hit):
                break
            available -= need
            budget -= num_new
            self.admit(req, num_new, hit, plan, now)
            num_seqs += req.num_samples

    def waiting_blocked(self) -> bool:
        """A running batch admits nobody until it is empty."""
        return True
