"""v1 priority scheduling against a naive second implementation of vLLM's rules (property test).

The reference below steps vLLM v1's `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py) under
`--scheduling-policy priority` on a bare block count, written from that code and not from kvsim's:

* RUNNING first, in `self.running` order, `min(remaining, token_budget)` tokens each; when
  `allocate_slots` fails, the victim is `max(self.running, key=lambda r: (r.priority, r.arrival_time))`
  (the first of equal keys); a victim already scheduled this step gives its tokens back to the budget
  and `req_index -= 1`; `_preempt_request` frees its blocks, resets `num_computed_tokens` to 0 and
  `prepend_request`s it, which a heap (`PriorityRequestQueue`) takes as `add_request`; the request
  that preempts itself ends the RUNNING loop.
* WAITING only in a step that preempted nothing, smallest (priority, arrival_time, request_id) first
  (`Request.__lt__`), until `len(self.running) == max_num_seqs`, the budget is spent or a request does not
  fit; kvsim's documented default admits a request only if all its tokens' blocks fit (DESIGN.md,
  "Scheduler (v1)"), so that is the reference's condition too, without prefix caching or a watermark.

Blocks: `cdiv(tokens, block_size)` a request, the pool's block 0 reserved (vLLM's null block).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvsim.kv import PagedAllocator
from kvsim.sched import SchedulerLimits, make_request_queue, make_scheduler
from tests.vllm_reference import arrive, cdiv

BLOCK = 16


@dataclass
class _Ref:
    rid: int
    arrival_s: float
    priority: int
    prompt: int
    output: int
    computed: int = 0
    sampled: int = 0
    blocks: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt + self.sampled


def _reference_step(running: list[_Ref], waiting: list[_Ref], free: list[int], budget: int,
                    max_num_seqs: int) -> tuple[list[tuple[int, int]], list[int]]:
    """One `schedule()` of vLLM's rules: (scheduled (id, tokens) in order, preempted ids)."""
    scheduled: dict[int, int] = {}
    preempted: list[int] = []
    i = 0
    while i < len(running) and budget > 0:
        req = running[i]
        num_new = min(req.tokens - req.computed, budget)
        fits = True
        while True:
            need = cdiv(req.computed + num_new, BLOCK) - req.blocks
            if need <= free[0]:
                req.blocks += need
                free[0] -= need
                break
            victim = max(running, key=lambda r: (r.priority, r.arrival_s))
            running.remove(victim)
            if victim.rid in scheduled:
                budget += scheduled.pop(victim.rid)
                i -= 1
            free[0] += victim.blocks
            victim.blocks = victim.computed = 0
            waiting.append(victim)
            preempted.append(victim.rid)
            if victim is req:
                fits = False
                break
        if not fits:
            break
        scheduled[req.rid] = num_new
        budget -= num_new
        i += 1
    if not preempted:
        while waiting and budget > 0 and len(running) < max_num_seqs:
            req = min(waiting, key=lambda r: (r.priority, r.arrival_s, r.rid))
            if cdiv(req.tokens, BLOCK) > free[0]:
                break
            num_new = min(req.tokens, budget)
            req.blocks = cdiv(num_new, BLOCK)
            free[0] -= req.blocks
            waiting.remove(req)
            running.append(req)
            scheduled[req.rid] = num_new
            budget -= num_new
    return list(scheduled.items()), preempted


def _reference_complete(running: list[_Ref], scheduled: list[tuple[int, int]], free: list[int]) -> None:
    by_id = {r.rid: r for r in running}
    for rid, num_new in scheduled:
        req = by_id[rid]
        req.computed += num_new
        if req.computed == req.tokens:  # sampled a token
            req.sampled += 1
            if req.sampled == req.output:
                running.remove(req)
                free[0] += req.blocks


requests_st = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4), st.integers(1, 60), st.integers(1, 20)),
                       min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(requests_st, st.sampled_from([8, 16, 32, 64]), st.integers(1, 4), st.integers(7, 10))
# a low-priority request admitted first, scheduled before the one that preempts it: refund and `req_index -= 1`
@example([(0, 2, 26, 8), (0, 2, 13, 6), (1, 0, 5, 13)], 8, 3, 7)
# equal keys: the victim is the first running request, already scheduled; its refund feeds the last one's chunk
@example([(0, 0, 36, 13), (0, 0, 24, 10), (0, 0, 25, 6), (0, 0, 26, 1)], 8, 4, 10)
def test_v1_priority_steps_as_vllm_s_rules(specs, budget, max_num_seqs, num_blocks):
    """Every step's scheduled (request, tokens) in order and its preemptions equal the reference's, from random
    arrivals (at whole steps), priorities and lengths in pools of 6 to 9 usable blocks, until all finish."""
    sched = make_scheduler("v1", PagedAllocator(num_blocks, BLOCK, enable_caching=False),
                           SchedulerLimits(max_num_seqs, budget, 128), waiting=make_request_queue("priority"))
    refs = [_Ref(rid, float(step), priority, prompt, output)
            for rid, (priority, step, prompt, output) in enumerate(specs)]
    running: list[_Ref] = []
    waiting: list[_Ref] = []
    free = [num_blocks - 1]
    now, num_done = 0, 0
    while num_done < len(refs):
        assert now < 2000, "no progress"
        for ref in refs:
            if ref.arrival_s == now:
                arrive(sched, ref.rid, ref.arrival_s, ref.prompt, ref.output, ref.priority)
                waiting.append(ref)
        plan = sched.schedule(float(now))
        expected, preempted = _reference_step(running, waiting, free, budget, max_num_seqs)
        assert [(r.request_id, n) for r, n in plan.scheduled] == expected
        assert [r.request_id for r in plan.preempted] == preempted
        num_done += len(sched.complete(plan, now + 1.0))
        _reference_complete(running, expected, free)
        sched.check_invariants()
        assert sched.alloc.pool.num_free_blocks == free[0]
        now += 1
