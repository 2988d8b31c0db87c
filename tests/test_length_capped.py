"""Outputs cut at max_model_len are counted: vLLM stops such a request at max_model_len with finish_reason
"length" (its scheduler's `check_stop`, vllm/v1/core/sched/utils.py: `num_tokens >= max_model_len` →
FINISHED_LENGTH_CAPPED), so the tokens asked for beyond it are never generated."""

import kvsim

FIXED = {"dist": "fixed"}


def run(prompt, output, max_model_len, n=1, **overrides):
    return kvsim.simulate(None, workload__num_requests=4, workload__n=n,
                          workload__prompt_len={**FIXED, "value": prompt},
                          workload__output_len={**FIXED, "value": output},
                          engine__max_model_len=max_model_len, **overrides)


def test_four_requests_cut_from_50_to_28_output_tokens_drop_22_each():
    # prompt 100 + output 50 > 128: each request generates 128 - 100 = 28 tokens and drops 50 - 28 = 22.
    result = run(100, 50, 128)
    assert result.requests["output_tokens"].tolist() == [28] * 4
    assert result.requests["length_capped_tokens"].tolist() == [22] * 4
    assert result.summary["length_capped"] == {"num_requests": 4, "num_dropped_output_tokens": 4 * 22}


def test_parallel_samples_each_drop_their_tokens():
    # n = 2: both samples of each request stop at 28 tokens: 4 requests, 4 · 2 · 22 tokens dropped.
    result = run(100, 50, 128, n=2)
    assert result.summary["length_capped"] == {"num_requests": 4, "num_dropped_output_tokens": 4 * 2 * 22}


def test_a_run_that_cuts_nothing_has_neither_key_nor_column():
    # prompt 100 + output 28 = 128 exactly: nothing is cut; the files stay as a run without cuts always wrote them.
    result = run(100, 28, 128)
    assert "length_capped" not in result.summary and "length_capped_tokens" not in result.requests


def test_a_prompt_over_the_limit_is_rejected_not_counted_as_cut():
    result = run(200, 50, 128)
    assert result.summary["num_rejected"] == 4 and "length_capped" not in result.summary


def test_a_fleet_counts_the_cuts_of_the_replica_that_served_each_request():
    # Round robin over a 128-token replica and a 256-token one: requests 0 and 2 go to the first (28 tokens,
    # 22 dropped), 1 and 3 to the second (all 50 fit).
    replicas = [{"count": 1, "engine": {"max_model_len": 128}}, {"count": 1, "engine": {"max_model_len": 256}}]
    result = kvsim.simulate(None, workload__num_requests=4, workload__prompt_len={**FIXED, "value": 100},
                            workload__output_len={**FIXED, "value": 50}, replicas=replicas)
    by_id = result.requests.sort_values("request_id")
    assert by_id["output_tokens"].tolist() == [28, 50, 28, 50]
    assert result.summary["length_capped"] == {"num_requests": 2, "num_dropped_output_tokens": 2 * 22}
