"""A speculative verify step in a step row: a decode sequence processing k + 1 tokens, not a prefill.

vLLM counts a request's tokens as prompt tokens until its prompt is done and as generation tokens after
(`IterationStats.update_from_output`, vllm/v1/metrics/stats.py); its attention backends that run drafts
as decodes classify a query of up to 1 + k tokens as a decode (`split_decodes_and_prefills` with
`reorder_batch_threshold` = 1 + num_speculative_tokens, vllm/v1/attention/backends/utils.py).
"""

import kvsim
from kvsim.kv import PagedAllocator
from kvsim.model.speculative_config import SpeculativeConfig
from kvsim.sched import SchedulerLimits, make_scheduler
from kvsim.sched.speculative import make_speculation
from tests.conftest import make_request


def rows(sched):
    """(prefill tokens, decode sequences, batched tokens) each step reports, stepping until idle."""
    out, now = [], 0.0
    while sched.has_work:
        plan = sched.schedule(now)
        out.append((plan.num_row_prefill_tokens, plan.num_row_decode_seqs, plan.num_tokens))
        now += 1.0
        sched.complete(plan, now)
    return out


def ngram(k, max_model_len=512, budget=256):
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=k, synthetic_acceptance_length=3.0)
    return make_scheduler("v1", PagedAllocator(64, 4, enable_caching=False), SchedulerLimits(16, budget, max_model_len),
                          speculation=make_speculation(config))


def test_a_verify_step_is_one_decode_sequence_of_k_plus_1_tokens():
    # Prompt 5, output 10, K = 3, 2 accepted per step: step 1 prefills 5 tokens (one prefill, no decode);
    # steps 2-4 each verify the last token + 3 drafts: one decode sequence, 4 tokens, no prefill tokens.
    sched = ngram(3)
    sched.add(make_request(0, 0.0, 5, 10))
    assert rows(sched) == [(5, 0, 5), (0, 1, 4), (0, 1, 4), (0, 1, 4)]


def test_a_verify_with_no_room_for_drafts_is_one_decode_not_two():
    # max_model_len 16, prompt 5 + output 11: steps 2-4 verify 1 + 3; step 5 has room for 0 drafts (16 - 2 - 14)
    # and computes its one token: still one decode sequence, counted once.
    sched = ngram(3, max_model_len=16)
    sched.add(make_request(0, 0.0, 5, 11))
    assert rows(sched) == [(5, 0, 5), (0, 1, 4), (0, 1, 4), (0, 1, 4), (0, 1, 1)]


def test_a_verify_beside_a_prefill_chunk_keeps_the_chunk_as_the_only_prefill():
    # Request 0 (prompt 5, output 10) and request 1 (prompt 6) arriving at 1.0, a 256-token budget: step 1 prefills
    # request 0 (5); step 2 verifies request 0 (1 + 3) and prefills request 1's 6 tokens: prefill 6, one decode.
    sched = ngram(3)
    sched.add(make_request(0, 0.0, 5, 10))
    plan = sched.schedule(0.0)
    sched.complete(plan, 1.0)
    sched.add(make_request(1, 1.0, 6, 10))
    plan = sched.schedule(1.0)
    assert (plan.num_row_prefill_tokens, plan.num_row_decode_seqs, plan.num_tokens) == (6, 1, 10)


def test_a_run_s_step_rows_count_every_prompt_token_once_as_prefill():
    # No prefix caching, no preemption, no chunk recomputed: Σ num_prefill_tokens over the rows is Σ prompt tokens,
    # and every token computed beyond the prompts is a decode's.
    config = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 0.6}
    result = kvsim.simulate(None, workload__num_requests=20, engine__enable_prefix_caching=False,
                            engine__speculative_config=config)
    steps, requests = result.steps, result.requests
    assert result.summary["num_preemptions"] == 0
    assert steps["num_prefill_tokens"].sum() == requests["prompt_tokens"].sum()
    assert (steps["num_decode_seqs"] <= steps["vllm:num_requests_running"]).all()
    assert ((steps["num_batched_tokens"] - steps["num_prefill_tokens"]) >= steps["num_decode_seqs"]).all()
