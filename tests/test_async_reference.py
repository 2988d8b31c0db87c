"""v1 async scheduling (vLLM's default) against a naive second implementation of vLLM's rules (property test).

The reference below is vLLM v1's `AsyncScheduler` (vllm/v1/core/sched/scheduler.py `Scheduler.schedule`,
`_preempt_request`, `update_from_output`; vllm/v1/core/sched/async_scheduler.py), written from that code and
not from kvsim's, on a bare block count, in vLLM's own order of events: step k + 1 is planned *before* step k's
output is processed (vllm/v1/engine/core.py `step_with_batch_queue`), so a request that step k is still
computing holds output placeholders when step k + 1 is planned. kvsim plans step k + 1 after completing step k
(`kvsim.sched.async_steps`); the two must plan the same steps. The rules the reference follows:

* `_update_after_schedule`: `num_computed_tokens += scheduled`; a step that ends its request's tokens (not a
  prefill chunk) samples one token, counted as an output placeholder until its output is processed.
* RUNNING first, in `self.running` order: a request with placeholders is passed over when
  `num_computed_tokens + 2 − num_output_placeholders ≥ num_prompt_tokens + max_tokens` (the token in flight is
  its last); else `num_tokens + num_output_placeholders − num_computed_tokens` tokens, within the budget.
  When `allocate_slots` fails: FCFS preempts `self.running.pop()` (a request whose last token is in flight
  too), priority `max(self.running, key=(priority, arrival_time))`, its tokens given back if scheduled this
  step and the cursor moved back when it stood before it (vLLM PR #49206, which fixed the skip of the next
  request, issue #49097); `_preempt_request` frees its blocks, zeroes its computed tokens and placeholders
  (PR #48245: the in-flight token is still delivered) and puts it back at the front of the waiting queue (a
  heap under priority); the request that preempts itself ends the loop.
* WAITING only in a step that preempted nothing, FCFS or smallest (priority, arrival, id), while
  `len(self.running) < max_num_seqs` (finishing requests included) and the budget lasts; the whole prompt's
  blocks must be free (`scheduler_reserve_full_isl`, vLLM's default), the first chunk's are taken.
* `update_from_output`: each sampled token is appended (a preempted request's too); the request that reaches
  `max_tokens` finishes and frees its blocks, running or back in the waiting queue.

Blocks: `cdiv(tokens, block_size)` a request, the pool's block 0 reserved (vLLM's null block); no prefix caching.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvsim.kv import PagedAllocator
from kvsim.sched import SchedulerLimits, make_request_queue, make_scheduler
from tests.vllm_reference import RefRequest, arrive, cdiv

BLOCK = 16
MAX_MODEL_LEN = 80  # 5 blocks: every request fits the smallest pool alone, as vLLM's startup check demands




class _VllmAsync:
    """vLLM's scheduler state: `running`, `waiting` (in pop order), free blocks, and the step in flight."""

    def __init__(self, policy: str, num_free_blocks: int, budget: int, max_num_seqs: int) -> None:
        self.policy, self.free, self.budget, self.max_num_seqs = policy, num_free_blocks, budget, max_num_seqs
        self.running: list[RefRequest] = []
        self.waiting: list[RefRequest] = []
        self.in_flight: list[tuple[RefRequest, bool]] = []  # the last planned step: (request, samples a token)

    def add(self, ref: RefRequest) -> None:
        self.waiting.append(ref)
        if self.policy == "priority":
            self.waiting.sort(key=lambda r: (r.priority, r.arrival_s, r.rid))

    def _preempt(self, victim: RefRequest) -> None:
        self.free += victim.blocks
        victim.blocks = victim.computed = victim.placeholders = 0
        victim.running = False
        self.waiting.insert(0, victim)  # prepend_request
        if self.policy == "priority":
            self.waiting.sort(key=lambda r: (r.priority, r.arrival_s, r.rid))

    def _grow(self, req: RefRequest, num_tokens: int) -> bool:
        need = cdiv(num_tokens, BLOCK) - req.blocks
        if need > self.free:
            return False
        req.blocks += max(need, 0)
        self.free -= max(need, 0)
        return True

    def schedule(self) -> tuple[list[tuple[int, int]], list[int]]:
        """`Scheduler.schedule` then `_update_after_schedule`: (scheduled (id, tokens) in order, preempted ids)."""
        budget, scheduled, preempted = self.budget, {}, []
        by_id = {}
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.placeholders > 0 and req.computed + 2 - req.placeholders >= req.prompt + req.max_tokens:
                i += 1
                continue
            num_new = min(req.num_tokens + req.placeholders - req.computed, budget, MAX_MODEL_LEN - 1 - req.computed)
            fits = True
            while not self._grow(req, req.computed + num_new):
                if self.policy == "priority":
                    victim = max(self.running, key=lambda r: (r.priority, r.arrival_s))
                    index = self.running.index(victim)
                    self.running.remove(victim)
                    if victim.rid in scheduled:
                        budget += scheduled.pop(victim.rid)
                    if index < i:
                        i -= 1
                else:
                    victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.rid)
                if victim is req:
                    fits = False
                    break
            if not fits:
                break
            scheduled[req.rid], by_id[req.rid] = num_new, req
            budget -= num_new
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                if cdiv(req.num_tokens, BLOCK) > self.free:  # scheduler_reserve_full_isl
                    break
                num_new = min(req.num_tokens, budget)
                assert self._grow(req, num_new)
                self.waiting.pop(0)
                self.running.append(req)
                req.running = True
                scheduled[req.rid], by_id[req.rid] = num_new, req
                budget -= num_new
        self.in_flight = []
        for rid, num_new in scheduled.items():
            req = by_id[rid]
            req.computed += num_new
            samples = req.computed >= req.num_tokens + req.placeholders
            req.placeholders += samples
            self.in_flight.append((req, samples))
        return list(scheduled.items()), preempted

    def process_output(self, step: list[tuple[RefRequest, bool]]) -> int:
        """`update_from_output` of a step planned earlier; returns the requests that finished."""
        num_finished = 0
        for req, samples in step:
            if req.finished or not samples:
                continue
            req.output += 1
            if req.running:
                req.placeholders -= 1
            if req.output == req.max_tokens:
                req.finished = True
                num_finished += 1
                (self.running if req.running else self.waiting).remove(req)
                self.free += req.blocks
                req.blocks = 0
        return num_finished


requests_st = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4), st.integers(1, 60), st.integers(1, 20)),
                       min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(requests_st, st.sampled_from(["fcfs", "priority"]), st.sampled_from([8, 16, 32, 64]), st.integers(1, 4),
       st.integers(6, 11))
# FCFS: B (output 1) finishes in step 0 and is still running when step 1 is planned; A's decode needs a block:
# `running.pop()` takes B, not A
@example([(0, 0, 16, 4), (0, 0, 16, 1)], "fcfs", 64, 4, 3)
# priority: F (priority 1, admitted first) has its last token in flight when A's decode needs a block; F is the
# victim and B, behind A, is still scheduled in that step (vLLM PR #49206)
@example([(1, 0, 16, 2), (0, 1, 16, 3), (0, 1, 16, 3)], "priority", 64, 4, 5)
def test_v1_async_steps_as_vllm_s_rules(specs, policy, budget, max_num_seqs, num_blocks):
    """Every step's scheduled (request, tokens) in order and its preemptions equal the reference's, from random
    arrivals (at whole steps), priorities and lengths in pools of 5 to 10 usable blocks, until all finish."""
    sched = make_scheduler("v1", PagedAllocator(num_blocks, BLOCK, enable_caching=False),
                           SchedulerLimits(max_num_seqs, budget, MAX_MODEL_LEN), waiting=make_request_queue(policy))
    sched.async_scheduling = True
    refs = [RefRequest(rid, float(step), priority, prompt, output)
            for rid, (priority, step, prompt, output) in enumerate(specs)]
    vllm = _VllmAsync(policy, num_blocks - 1, budget, max_num_seqs)
    now, num_done, num_ref_done = 0, 0, 0
    while num_done < len(refs):
        assert now < 2000, "no progress"
        for ref in refs:
            if ref.arrival_s == now:
                arrive(sched, ref.rid, ref.arrival_s, ref.prompt, ref.max_tokens, ref.priority)
                vllm.add(ref)
        plan = sched.schedule(float(now))
        in_flight = vllm.in_flight
        expected, preempted = vllm.schedule()  # planned before the output of the step in flight is processed
        num_ref_done += vllm.process_output(in_flight)
        assert ([(r.request_id, n) for r, n in plan.scheduled], [r.request_id for r in plan.preempted]) \
            == (expected, preempted), f"step {now}"
        num_done += len(sched.complete(plan, now + 1.0))
        sched.check_invariants()
        now += 1
    num_ref_done += vllm.process_output(vllm.in_flight)
    assert num_ref_done == len(refs) and not vllm.running and not vllm.waiting
