"""v1 speculative decoding in the scheduler against a naive second implementation of vLLM's rules (property test).

The reference (`tests.vllm_reference.VllmV1`) steps vLLM v1's synchronous `Scheduler`
(vllm/v1/core/sched/scheduler.py `schedule`, `_preempt_request`, `update_from_output`, `update_draft_token_ids`;
vllm/v1/core/kv_cache_manager.py `allocate_slots`) with K drafts a step and a fixed acceptance (`a` drafts of each
verify accepted), on a bare block count, written from that code and not from kvsim's:

* RUNNING first: `num_tokens_with_spec − num_computed_tokens` tokens (the last sampled token and its drafts),
  cut to the budget and to `max_model_len − 1 − num_computed_tokens`; `allocate_slots` needs the blocks of
  `min(num_computed_tokens + new + num_lookahead_tokens, max_model_len)` slots (`num_lookahead_tokens`: K for
  EAGLE and draft models, 0 for n-gram); the drafts scheduled are those the cut leaves; when the blocks are not
  there FCFS preempts `running.pop()` (priority: `max(running, key=(priority, arrival))`), which frees its blocks,
  zeroes its computed tokens and drops its drafts.
* WAITING in a step that preempted nothing: the whole prompt's blocks must be free (`scheduler_reserve_full_isl`),
  the first chunk's are taken, with no lookahead (`effective_lookahead_tokens` is 0 for a request with nothing
  computed).
* `update_from_output`: a verify of d drafts accepting a of them rolls `num_computed_tokens` back by d − a and
  appends a + 1 tokens (trimmed at `max_tokens`); blocks are kept. The drafter proposes K drafts after every step
  that is not a prefill chunk (`update_draft_token_ids` ignores a prefill chunk's).

Blocks: `cdiv(slots, block_size)` a request, the pool's block 0 reserved; no prefix caching.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvsim.kv import PagedAllocator
from kvsim.model.speculative_config import SpeculativeConfig
from kvsim.sched import SchedulerLimits, make_request_queue, make_scheduler
from kvsim.sched.speculative import make_speculation
from tests.vllm_reference import RefRequest, VllmV1, run_against_reference

BLOCK = 8




requests_st = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4), st.integers(1, 40), st.integers(1, 30)),
                       min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(requests_st, st.sampled_from(["fcfs", "priority"]), st.sampled_from(["eagle", "ngram"]), st.integers(1, 4),
       st.integers(0, 4), st.sampled_from([4, 8, 16, 64]), st.integers(1, 4), st.sampled_from([24, 48]),
       st.integers(0, 4), st.booleans())
# EAGLE, K = 3, every draft accepted, max_model_len 24: the drafts are cut to what the length leaves
@example([(0, 0, 17, 7)], "fcfs", "eagle", 3, 3, 64, 1, 24, 0, False)
# async, every draft rejected: vLLM plans each verify still counting the rejected drafts of the one in flight
@example([(0, 0, 4, 20)], "fcfs", "eagle", 3, 0, 64, 1, 24, 0, True)
# async, every draft accepted: the verify that ends a request by its drafts is followed by a discarded one
@example([(0, 0, 4, 5), (0, 2, 8, 3)], "fcfs", "eagle", 3, 3, 64, 4, 48, 0, True)
# async, priority: a finishing request's discarded verify does not fit and it is its own victim (found by hypothesis)
@example([(0, 0, 15, 7), (0, 0, 1, 1), (0, 0, 2, 4)], "priority", "eagle", 4, 1, 8, 2, 48, 0, True)
# async: a finishing request due a discarded verify is preempted before its turn by an earlier one's verify
@example([(0, 0, 1, 5), (0, 0, 3, 6), (0, 1, 1, 3)], "fcfs", "eagle", 4, 1, 16, 3, 48, 1, True)
# async, priority: a discarded verify scheduled earlier in the step is a later verify's victim (out of the plan)
@example([(0, 1, 24, 2), (1, 0, 1, 13), (1, 0, 5, 10), (1, 1, 1, 3)], "priority", "eagle", 4, 2, 64, 3, 48, 1, True)
def test_v1_speculative_steps_as_vllm_s_rules(specs, policy, method, k, accepted, budget, max_num_seqs,
                                              max_model_len, extra_blocks, async_scheduling):
    """Every step's scheduled (request, tokens) in order, its preemptions and the free blocks equal the reference's,
    from random arrivals (at whole steps), priorities and lengths, until all finish. With async scheduling the
    reference's `running` keeps a request until the output that ends it is processed, after the next plan, so a
    verify whose accepted drafts end it is followed by one more verify (its skip rule sees only the one sure token),
    which kvsim plans for the finishing request (`V1Scheduler._wasted_verifies`)."""
    num_accepted = min(accepted, k)
    config = SpeculativeConfig(method=method, num_speculative_tokens=k,
                               acceptance_rates=(1.0,) * num_accepted + (0.0,) * (k - num_accepted))
    num_blocks = max_model_len // BLOCK + 1 + extra_blocks  # vLLM's startup check: one request of max_model_len fits
    sched = make_scheduler("v1", PagedAllocator(num_blocks, BLOCK, enable_caching=False),
                           SchedulerLimits(max_num_seqs, budget, max_model_len), waiting=make_request_queue(policy),
                           speculation=make_speculation(config))
    sched.async_scheduling = async_scheduling
    refs = [RefRequest(rid, float(step), priority, prompt, min(output, max_model_len - prompt))
            for rid, (priority, step, prompt, output) in enumerate(specs) if prompt < max_model_len]
    vllm = VllmV1(policy, num_blocks - 1, budget, max_num_seqs, max_model_len, k, config.num_lookahead_tokens,
                  num_accepted, async_scheduling, BLOCK)
    run_against_reference(sched, vllm, refs)
