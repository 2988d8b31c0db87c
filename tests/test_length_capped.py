"""Outputs cut at max_model_len are counted: vLLM stops such a request at max_model_len with finish_reason
"length" (its scheduler's `check_stop`, vllm/v1/core/sched/utils.py: `num_tokens >= max_model_len` →
FINISHED_LENGTH_CAPPED), so the tokens asked for beyond it are never generated."""

import kvsim
from kvsim.engine.simulate import simulate
from kvsim.workload.scenario import make_scenario

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


def test_v0_runs_a_prompt_that_fits_and_cuts_its_output_at_max_model_len():
    # vLLM v0 ignores a request for its prompt only (`_schedule_prefills`: more tokens than the prompt limit, or
    # `can_allocate` NEVER): a 1,000-token prompt at max_model_len 1,100 runs, and the OpenAI server's default
    # max_tokens, 1,100 - 1,000 = 100 (`_validate_input`), ends it: 100 tokens, 100 of the 200 asked cut.
    result = run(1000, 200, 1100, engine__scheduler="v0")
    assert result.summary["num_rejected"] == 0
    assert result.requests["output_tokens"].tolist() == [100] * 4
    assert result.requests["length_capped_tokens"].tolist() == [100] * 4


def test_v0_lets_a_request_go_when_its_output_outgrows_the_pool_bursts_or_not():
    # 5 blocks of 16 (v0: no null block), watermark int(0.2 * 5) = 1 block; a 40-token prompt (3 blocks) asking 40.
    # It runs (5 - 3 >= 1), decodes to position 64 (all 5 blocks), preempts itself at 65 with 26 tokens, and its 66
    # tokens need cdiv(66, 16) = 5 blocks, 5 - 5 < 1: NEVER, FINISHED_IGNORED with its 26 tokens (14 cut). Alone, its
    # let-go plans an empty step: the run ends there, with decode bursts as step by step.
    scenario = make_scenario({"engine": {"scheduler": "v0", "max_model_len": 80, "num_gpu_blocks_override": 5,
                                         "watermark": 0.2},
                              "workload": {"num_requests": 1, "prompt_len": {**FIXED, "value": 40},
                                           "output_len": {**FIXED, "value": 40}},
                              "latency": {"model": "constant"}, "steps": "none"})
    results = [simulate(scenario, bursts=bursts) for bursts in (True, False)]
    for result in results:
        assert (result.summary["num_finished"], result.summary["num_rejected"]) == (1, 0)
        assert result.requests["output_tokens"].tolist() == [26]
        assert result.requests["length_capped_tokens"].tolist() == [14]
        assert result.requests["num_preemptions"].tolist() == [1]
    assert results[0].requests.equals(results[1].requests)


def test_a_refused_request_is_not_counted_as_cut_though_its_row_keeps_the_cap():
    # v0 refuses a group of n = 2 samples beside max_num_seqs 1 (`num_samples > max_num_seqs`), after capping each
    # sample at 128 - 100 = 28 tokens (22 cut). A refused request generates nothing, so the summary counts the
    # finished ones only: round robin sends requests 0 and 2 to the max_num_seqs-1 replica (refused), 1 and 3 to
    # the other (served, 2 requests · 2 samples · 22 = 88 tokens cut). Counting every row gave 4 and 176.
    replicas = [{"count": 1, "engine": {"max_num_seqs": 1}}, {"count": 1, "engine": {"max_num_seqs": 2}}]
    result = run(100, 50, 128, n=2, engine__scheduler="v0", replicas=replicas)
    assert result.requests["status"].tolist() == ["rejected", "finished"] * 2
    assert result.requests["length_capped_tokens"].tolist() == [22] * 4
    assert result.summary["length_capped"] == {"num_requests": 2, "num_dropped_output_tokens": 2 * 2 * 22}
    assert [r.summary["length_capped"] for r in result.replicas] == [
        {"num_requests": 0, "num_dropped_output_tokens": 0}, {"num_requests": 2, "num_dropped_output_tokens": 88}]


def test_a_disaggregated_fleet_cuts_on_the_decode_instance_not_on_the_prefill_one():
    # The prefill instance is asked for one token (the proxy's max_tokens=1) and cuts none: its rows show 1 output
    # token and no cut; the decode instance generates 128 - 100 = 28 and cuts 22, each request once (its rows showed
    # the cut made when the requests were drawn, and its summary 4 requests and 88 tokens cut beside the decode's).
    replicas = [{"count": 1, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}]
    result = run(100, 50, 128, replicas=replicas, kv_transfer_config={"kv_link": "nvlink"})
    prefill, decode = result.replicas
    assert prefill.requests["output_tokens"].tolist() == [1] * 4 and "length_capped" not in prefill.summary
    assert "length_capped_tokens" not in prefill.requests
    assert decode.requests["output_tokens"].tolist() == [28] * 4
    assert decode.requests["length_capped_tokens"].tolist() == [22] * 4
    assert decode.summary["length_capped"] == result.summary["length_capped"] == {
        "num_requests": 4, "num_dropped_output_tokens": 4 * 22}
