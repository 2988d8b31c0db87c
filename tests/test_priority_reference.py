"""v1 priority scheduling against a naive second implementation of vLLM's rules (property test).

The reference (`tests.vllm_reference.VllmV1`, synchronous, no drafts) steps vLLM v1's `Scheduler.schedule`
(vllm/v1/core/sched/scheduler.py) under `--scheduling-policy priority` on a bare block count, written from that
code and not from kvsim's:

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

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvsim.kv import PagedAllocator
from kvsim.sched import SchedulerLimits, make_request_queue, make_scheduler
from tests.vllm_reference import RefRequest, VllmV1, run_against_reference

BLOCK = 16
MAX_MODEL_LEN = 128  # above every request drawn (60 + 20 tokens): no length cap in play

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
                           SchedulerLimits(max_num_seqs, budget, MAX_MODEL_LEN), waiting=make_request_queue("priority"))
    refs = [RefRequest(rid, float(step), priority, prompt, output)
            for rid, (priority, step, prompt, output) in enumerate(specs)]
    vllm = VllmV1("priority", num_blocks - 1, budget, max_num_seqs, MAX_MODEL_LEN, 0, 0, 0, False, BLOCK)
    run_against_reference(sched, vllm, refs)
