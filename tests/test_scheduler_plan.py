"""The v1 planner's step accounting against a naive re-derivation from vLLM v1's rules.

Every token goes through the one general planner; these tests rebuild the expected step by hand
from the definitions (not from `StepPlan.add`). Logits rows follow vLLM v1's model runner: one at
every scheduled request's last token, a partial prefill chunk's included (`GPUModelRunner.
_prepare_inputs`: `logits_indices = query_start_loc[1:] - 1`, the partial requests' tokens sampled
"for simplicity" and discarded); v0 takes rows only for sequences that sample (`do_sample`,
vllm/model_executor/sampling_metadata.py: `sample_len = ... if do_sample else 0`).
"""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.latency.step_plan import StepPlan
from tests.conftest import make_request, tiny_world


def naive_plan(states, budget):
    """Expected counters for v1 serving running requests (past, num_tokens) in order within `budget`."""
    expected = dict(num_tokens=0, num_seqs=0, num_prefill_tokens=0, num_decode_seqs=0, num_logits_rows=0,
                    sum_context_tokens=0, sum_decode_context_tokens=0, max_context_tokens=0)
    for past, num_tokens in states:
        if budget == 0:
            break
        new = min(num_tokens - past, budget)
        budget -= new
        context = past + new
        expected["num_tokens"] += new
        expected["num_seqs"] += 1
        is_decode = new == 1 and past > 0
        expected["num_decode_seqs"] += is_decode
        expected["sum_decode_context_tokens"] += context if is_decode else 0
        expected["num_prefill_tokens"] += 0 if is_decode else new
        expected["num_logits_rows"] += 1  # vLLM v1: a row per scheduled request, caught up or not
        expected["sum_context_tokens"] += context
        expected["max_context_tokens"] = max(expected["max_context_tokens"], context)
    return expected


def observed(plan):
    return {k: getattr(plan, k) for k in ("num_tokens", "num_seqs", "num_prefill_tokens", "num_decode_seqs",
                                          "num_logits_rows", "sum_context_tokens", "sum_decode_context_tokens",
                                          "max_context_tokens")}


def test_one_token_prefill_chunk_takes_a_logits_row_in_v1():
    """A decode and a prompt cut to one token by the budget: two logits rows in vLLM v1 (one per scheduled
    request; the chunk's token is discarded), though only the decode samples a token kept."""
    s = tiny_world(max_num_batched_tokens=64, num_blocks=40)
    decoding, prefilling = make_request(0, 0.0, 10, 5), make_request(1, 0.0, 60, 5)
    for r in (decoding, prefilling):
        s.add(r)
    s.complete(s.schedule(0.0), 0.01)  # 10 + 54 tokens: request 0 samples its first token
    s.limits = replace(s.limits, max_num_batched_tokens=2)
    plan = s.schedule(0.01)
    assert [n for _, n in plan.scheduled] == [1, 1]
    assert plan.num_logits_rows == 2  # `logits_indices = query_start_loc[1:] - 1`: one per request
    assert plan.num_decode_seqs == 2  # one query token after cached ones costs what a decode costs


@settings(max_examples=100, deadline=None)
@given(prompts=st.lists(st.tuples(st.integers(1, 80), st.integers(2, 30)), min_size=1, max_size=8),
       warmup_budgets=st.lists(st.integers(1, 100), max_size=6), budget=st.integers(1, 200))
def test_v1_plan_matches_naive_rules(prompts, warmup_budgets, budget):
    s = tiny_world(max_num_batched_tokens=100, num_blocks=200, max_model_len=128)
    for rid, (prompt, output) in enumerate(prompts):
        s.add(make_request(rid, 0.0, prompt, output))
    now = 0.0
    for warm in warmup_budgets:  # random progress: partial prefills, decodes, finished requests
        s.limits = replace(s.limits, max_num_batched_tokens=warm)
        now += 0.01
        s.complete(s.schedule(now), now)
    s.limits = replace(s.limits, max_num_batched_tokens=budget)
    states = [(r.num_computed_tokens, r.num_tokens) for r in s.running]
    plan = s.schedule(now)
    assert not plan.preempted  # the pool is large enough for everything
    got = observed(plan)
    want = naive_plan(states, budget)
    for _req, new in plan.scheduled[len(states):]:  # fresh admissions after the running ones: whole-prompt chunks
        want["num_tokens"] += new
        want["num_seqs"] += 1
        want["num_prefill_tokens"] += new
        want["num_logits_rows"] += 1
        want["sum_context_tokens"] += new
        want["max_context_tokens"] = max(want["max_context_tokens"], new)
    assert got == want


def test_a_partial_prefill_chunk_alone_takes_one_logits_row_in_v1_and_none_in_v0():
    """The regression: a step holding only a partial prefill chunk (32 of a 100-token prompt) priced no LM
    head or sampler. vLLM v1 computes and samples its row (`logits_indices = query_start_loc[1:] - 1`), then
    drops the token (`discard_request_mask`); v0 selects no row for a chunk that does not finish its prompt
    (`do_sample` False: `sample_len = 0`). Both schedulers account the same chunk."""
    s = tiny_world(max_num_batched_tokens=32, num_blocks=20)
    s.add(make_request(0, 0.0, 100, 5))
    plan = s.schedule(0.0)
    assert [(req.request_id, n) for req, n in plan.scheduled] == [(0, 32)]
    assert (plan.num_prefill_tokens, plan.num_logits_rows) == (32, 1)
    for policy, rows in (("v1", 1), ("v0", 0)):
        chunk = StepPlan(scheduled=[(make_request(1, 0.0, 100, 5), 32)])  # nothing computed yet
        tiny_world(policy).account(chunk)
        assert (chunk.num_prefill_tokens, chunk.num_logits_rows) == (32, rows)
    finishing = StepPlan(scheduled=[(make_request(2, 0.0, 32, 5), 32)])  # a chunk that ends its prompt samples
    tiny_world("v0").account(finishing)
    assert finishing.num_logits_rows == 1
