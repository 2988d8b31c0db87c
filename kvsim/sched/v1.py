"""vLLM v1's scheduler: one token budget per step, running requests first, then FCFS admission.

No prefill/decode phases: each request's `num_computed_tokens` catches up to `num_tokens`
by chunks (chunked prefill) or by 1 (decode). Per step:

1. RUNNING, in admission order: schedule `min(remaining, budget)` tokens. If the KV
   blocks are not there, preempt the policy's victim (FCFS: the most recently admitted
   running request; priority: the lowest-priority one, max (priority, arrival)) by
   recompute (free everything, back to the queue) until they are, or until the request
   itself was the one preempted. A priority victim this step already scheduled is taken
   out of the plan and its tokens go back to the budget, as vLLM's scheduler does.
   With speculative decoding every decoding request verifies 1 + K tokens (the last sampled one
   and K drafts, fewer if the budget or max_model_len cuts them, as vLLM trims drafts) and holds
   slots for them plus the lookahead (`num_lookahead_tokens`: K for EAGLE and draft models);
   `complete` accepts a prefix of the drafts (`kvsim.sched.speculative`).
2. If nothing was preempted, admit WAITING requests in the policy's order (FCFS, or
   smallest (priority, arrival)) while budget and `max_num_seqs` allow and the whole prompt
   (after prefix-cache hits) fits (with sliding-window or other hybrid KV groups: the first chunk,
   as vLLM v1 allocates it); the first that does not fit ends admission for the step.
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
        refunded_any = False
        spec = self.speculation
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            past = req.num_computed_tokens
            if (spec is None and past and req.prompt_len + req.num_output_tokens == past + 1 and req.num_samples == 1
                    and append_token(req.seq_ids[0])):  # a plain decode: one token into its own last block
                scheduled.append((req, 1))
                num_decodes += 1
                sum_context += past + 1
                if past >= max_context:
                    max_context = past + 1
                budget -= 1
                i += 1
                continue
            verify = spec is not None and past > 0 and req.num_tokens == past + 1  # decoding: verify drafts
            num_new, hold_slots = min(req.num_tokens - past, budget), 0
            if verify:
                assert spec is not None
                num_drafts = min(spec.num_speculative_tokens, budget - 1, self.limits.max_model_len - req.num_tokens)
                num_new = 1 + num_drafts
                hold_slots = min(past + num_new + spec.num_lookahead_slots, self.limits.max_model_len)
            num_preempted = len(plan.preempted)
            fits = self.allocate_or_preempt(req, past + 1 if verify else past + num_new, plan, hold_slots)
            if len(plan.preempted) > num_preempted and self.waiting.policy == "priority":
                refunded, unscheduled = self._unschedule(plan, plan.preempted[num_preempted:])
                budget += refunded
                i -= unscheduled  # they stood before `req` in `running`
                refunded_any = refunded_any or unscheduled > 0
            if not fits:
                break
            if verify:
                assert spec is not None
                spec.pending[req.request_id] = num_new - 1
                self._plan_verify(plan, req, num_new)
            else:
                self.plan_tokens(plan, req, num_new)
            budget -= num_new
            i += 1
        if refunded_any:  # the decodes counted above include requests taken out again
            plan = self._replan(plan)
        else:
            plan.add_decodes(num_decodes, sum_context, max_context)
        if not plan.preempted:
            self._admit(plan, budget, now)
        return plan

    def _unschedule(self, plan: StepPlan, victims: list[Request]) -> tuple[int, int]:
        """Take preempted requests that this step already scheduled out of `plan.scheduled`, as vLLM's
        priority preemption does (their tokens go back to the budget); returns (tokens, requests)."""
        gone = {id(v) for v in victims}
        if self.speculation is not None:
            for victim in victims:
                self.speculation.pending.pop(victim.request_id, None)
        kept = [(r, n) for r, n in plan.scheduled if id(r) not in gone]
        refunded = sum(n for r, n in plan.scheduled if id(r) in gone)
        unscheduled = len(plan.scheduled) - len(kept)
        plan.scheduled[:] = kept
        return refunded, unscheduled

    def _replan(self, plan: StepPlan) -> StepPlan:
        """A fresh plan accounting only what is still scheduled (after a refund)."""
        fresh = StepPlan(preempted=plan.preempted)
        verifying = self.speculation.pending if self.speculation is not None else {}
        for req, num_new in plan.scheduled:
            if req.request_id in verifying:
                self._plan_verify(fresh, req, num_new)
            else:
                self.plan_tokens(fresh, req, num_new)
        return fresh

    @staticmethod
    def _plan_verify(plan: StepPlan, req: Request, num_new: int) -> None:
        """A speculative verify step: the last sampled token and `num_new` − 1 drafts, computed as one
        chunk after the request's context, each with a row of logits (the target checks every draft)."""
        plan.scheduled.append((req, num_new))
        plan.add(num_new, req.num_computed_tokens, 1, samples=True)
        plan.num_sampled += num_new - 1
        plan.num_spec_decode_seqs += 1
        plan.num_draft_tokens += num_new - 1
        plan.sum_spec_context_tokens += req.num_computed_tokens + num_new

    def _admit(self, plan: StepPlan, budget: int, now: float) -> None:
        max_num_seqs, waiting = self.limits.max_num_seqs, self.waiting
        num_seqs = self.num_running_seqs()
        while waiting and budget > 0:
            req = waiting.peek()
            if num_seqs + req.num_samples > max_num_seqs:
                break
            hit = self.lookup(req)
            num_new = min(req.num_tokens - hit.num_tokens, budget)
            if not self.can_admit(req, hit, num_new):
                break
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
        hit = self.lookup(req)
        first_chunk = min(req.num_tokens - hit.num_tokens, self.limits.max_num_batched_tokens)
        return (self.num_running_seqs() + req.num_samples > self.limits.max_num_seqs
                or len(self.running) >= self.limits.max_num_batched_tokens
                or not self.can_admit(req, hit, first_chunk))
