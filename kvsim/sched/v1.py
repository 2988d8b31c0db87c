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

from kvsim.latency.step_plan import StepPlan
from kvsim.sched.base import Scheduler
from kvsim.workload.request import Request


class V1Scheduler(Scheduler):
    name = "v1"

    def schedule(self, now: float) -> StepPlan:
        plan = StepPlan()
        budget = self.limits.max_num_batched_tokens
        running, scheduled, append_token = self.running, plan.scheduled, self.alloc.append_token
        num_decodes = sum_context = max_context = 0  # the plain decodes, accounted at once below
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            past = req.num_computed_tokens
            if (past and req.prompt_len + req.num_output_tokens == past + 1 and req.num_samples == 1
                    and append_token(req.seq_ids[0])):  # a plain decode: one token into its own last block
                scheduled.append((req, 1))
                num_decodes += 1
                sum_context += past + 1
                if past >= max_context:
                    max_context = past + 1
                budget -= 1
                i += 1
                continue
            num_new = min(req.num_tokens - past, budget)
            if not self.allocate_or_preempt(req, past + num_new, plan):
                break
            self.plan_tokens(plan, req, num_new)
            budget -= num_new
            i += 1
        plan.add_decodes(num_decodes, sum_context, max_context)
        if not plan.preempted:
            self._admit(plan, budget, now)
        return plan

    def _admit(self, plan: StepPlan, budget: int, now: float) -> None:
        max_num_seqs, waiting = self.limits.max_num_seqs, self.waiting
        num_seqs = self.num_running_seqs()
        while waiting and budget > 0:
            req = waiting.peek()
            if num_seqs + req.num_samples > max_num_seqs:
                break
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

    def schedules_whole_decode_batch(self, num_running: int) -> bool:
        """A batch larger than the token budget is decoded in turns."""
        return num_running <= self.limits.max_num_batched_tokens

    def waiting_blocked(self) -> bool:
        req = self.waiting.peek()
        return (self.num_running_seqs() + req.num_samples > self.limits.max_num_seqs
                or len(self.running) >= self.limits.max_num_batched_tokens
                or not self.can_admit(req, self.lookup(req)))
