"""v1 async scheduling (vLLM's default) against a naive second implementation of vLLM's rules (property test).

The reference (`tests.vllm_reference.VllmV1`, no drafts) is vLLM v1's `AsyncScheduler`
(vllm/v1/core/sched/scheduler.py `Scheduler.schedule`, `_preempt_request`, `update_from_output`;
vllm/v1/core/sched/async_scheduler.py), written from that code and not from kvsim's, on a bare block count, in
vLLM's own order of events: step k + 1 is planned *before* step k's output is processed (vllm/v1/engine/core.py
`step_with_batch_queue`), so a request that step k is still computing holds output placeholders when step k + 1 is
planned. kvsim plans step k + 1 after completing step k (`kvsim.sched.async_steps`); the two must plan the same
steps. The rules the reference follows:

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
from tests.vllm_reference import RefRequest, VllmV1, run_against_reference

BLOCK = 16
MAX_MODEL_LEN = 80  # 5 blocks: every request fits the smallest pool alone, as vLLM's startup check demands




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
    vllm = VllmV1(policy, num_blocks - 1, budget, max_num_seqs, MAX_MODEL_LEN, 0, 0, 0, True, BLOCK)
    run_against_reference(sched, vllm, refs)
