"""Disaggregated prefill/decode (`kvsim.fleet.disagg`): timelines derived by hand, contention, conservation.

Hand-derived numbers: Llama-3.1-8B stores 2 · 32 layers · 8 kv heads · 128 · 2 B = 131,072 B of KV per
token (TP 1). A 100-token prompt fills ceil(100 / 16) = 7 blocks, and connectors move whole blocks:
7 · 16 · 131,072 = 14,680,064 B. Every step of the constant latency model takes STEP_S.
"""

import math

import pytest

from kvsim.fleet.disagg import simulate_disagg
from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import make_scenario

STEP_S = 0.01
BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
PROMPT_BYTES = 7 * 16 * BYTES_PER_TOKEN  # 100 tokens -> 7 whole blocks
BANDWIDTH = 1e9  # B/s per GPU
LINK_LATENCY_S = 1e-3


def scenario(num_prefill=1, num_decode=1, num_requests=1, rate=1.0, prompt=100, output=5, extra=None,
             decode_engine=None):
    raw = {
        "name": "pd", "model": "llama-3.1-8b", "gpu": "h100-80gb",
        "engine": {"max_model_len": 2048},
        "workload": {"num_requests": num_requests, "arrival": {"process": "constant", "rate": rate},
                     "prompt_len": {"dist": "fixed", "value": prompt}, "output_len": {"dist": "fixed", "value": output}},
        "latency": {"model": "constant", "step_s": STEP_S},
        "kv_transfer_config": {"kv_link": "rdma", "kv_link_bandwidth_bytes_per_s": BANDWIDTH,
                               "kv_link_latency_s": LINK_LATENCY_S,
                               "prefill_router": {"policy": "round_robin"}},
        "replicas": [{"count": num_prefill, "name": "p", "kv_role": "kv_producer"},
                     {"count": num_decode, "name": "d", "kv_role": "kv_consumer", "engine": decode_engine or {}}],
    }
    for key, value in (extra or {}).items():
        raw[key] = value
    return make_scenario(raw)


def test_one_request_ttft_is_prefill_plus_transfer_plus_first_decode_step():
    result = simulate_disagg(scenario(), check=True)
    req = result.requests.iloc[0]
    transfer_s = LINK_LATENCY_S + PROMPT_BYTES / BANDWIDTH  # 0.015680064 s, the link alone
    # P: one step computes the prompt and samples (discarded) token 1; D idle: reserves at once;
    # D's first step recomputes the last prompt token and samples the client's first token.
    assert req["status"] == "finished"
    assert req["ttft_s"] == pytest.approx(STEP_S + transfer_s + STEP_S, rel=1e-12)
    # then 4 more decode steps for output tokens 2..5
    assert req["e2e_s"] == pytest.approx(STEP_S + transfer_s + 5 * STEP_S, rel=1e-12)
    t = result.tables["transfers"].iloc[0]
    assert t["num_bytes"] == PROMPT_BYTES
    assert t["end_s"] - t["start_s"] == pytest.approx(transfer_s, rel=1e-12)
    assert t["start_s"] == t["handoff_s"]  # an idle decode instance reserves at the hand-off
    pools = result.summary["disaggregation"]["pools"]
    assert pools["prefill"]["num_instances"] == 1 and pools["decode"]["num_instances"] == 1
    assert result.summary["disaggregation"]["bytes_moved"] == PROMPT_BYTES


def test_decode_reserves_no_transfer_while_its_running_batch_is_full():
    """vLLM's decode scheduler reserves a remote request's blocks in its waiting loop, which stops once
    `len(running) == max_num_seqs`. D runs one sequence at a time; A arrives at 0, B at 0.02 (constant 50/s).
    A: P steps [0, 0.01], transfer [0.01, 0.01 + T], then 5 D steps: finished at 0.01 + T + 0.05.
    B: P steps [0.02, 0.03] and hands off while D runs A, so its transfer waits for A's end, the first
    boundary with room: [0.06 + T, 0.06 + 2T], then one D step: TTFT = 0.06 + 2T + 0.01 − 0.02 (before,
    its transfer ran beside A's decode and B's TTFT was A's end + one step − 0.02 = 0.05 + T)."""
    transfer_s = LINK_LATENCY_S + PROMPT_BYTES / BANDWIDTH
    result = simulate_disagg(scenario(num_requests=2, rate=50.0, decode_engine={"max_num_seqs": 1}), check=True)
    a, b = result.requests.sort_values("request_id").itertuples()
    assert a.ttft_s == pytest.approx(STEP_S + transfer_s + STEP_S, rel=1e-9)
    transfers = result.tables["transfers"].sort_values("request_id")
    assert list(transfers["start_s"]) == pytest.approx([0.01, 0.06 + transfer_s], rel=1e-9)
    assert b.ttft_s == pytest.approx(0.06 + 2 * transfer_s + STEP_S - 0.02, rel=1e-9)


def test_decode_tp_sets_bytes_and_link_width():
    """TP 2 on D: 4 kv heads per rank, so the same bytes in all; two per-GPU links, so half the drain time."""
    result = simulate_disagg(scenario(decode_engine={"tensor_parallel_size": 2}))
    t = result.tables["transfers"].iloc[0]
    assert t["num_bytes"] == PROMPT_BYTES
    assert t["end_s"] - t["start_s"] == pytest.approx(LINK_LATENCY_S + PROMPT_BYTES / (2 * BANDWIDTH), rel=1e-12)


def test_two_equal_transfers_on_one_link_take_twice_as_long():
    """2P1D, two requests 1 ns apart prefill side by side and reach D together: they share D's link."""
    result = simulate_disagg(scenario(num_prefill=2, num_requests=2, rate=1e9))
    assert list(result.tables["transfers"]["prefill_replica"]) == [0, 1]
    drain_s = (result.tables["transfers"]["end_s"] - result.tables["transfers"]["start_s"] - LINK_LATENCY_S).to_numpy()
    alone_s = PROMPT_BYTES / BANDWIDTH
    assert drain_s == pytest.approx([2 * alone_s, 2 * alone_s], rel=1e-6)


def test_conservation_across_pools_under_memory_pressure():
    """A small decode pool: transfers wait for blocks, decodes preempt; every request ends exactly once
    and every allocator balances (`check` runs check_invariants after every step; the run ends with no
    block held anywhere, asserted inside simulate_disagg)."""
    spec = scenario(num_prefill=2, num_decode=2, num_requests=60, rate=200.0, prompt=300, output=40,
                    extra={"engine": {"max_model_len": 1024, "num_gpu_blocks_override": 65}})
    result = simulate_disagg(spec, check=True)
    ids = sorted(result.requests["request_id"])
    assert ids == list(range(60))
    assert set(result.requests["status"]) <= {"finished", "rejected"}
    assert (result.requests["status"] == "finished").sum() == len(result.tables["transfers"])
    assert result.summary["disaggregation"]["transfer_wait_s"]["p99"] > 0  # waited for blocks
    assert result.summary["num_finished"] + result.summary["num_rejected"] == 60


def test_a_request_decode_can_never_hold_is_rejected_once():
    spec = scenario(decode_engine={"num_gpu_blocks_override": 5, "max_model_len": 64})  # D holds 4 blocks
    result = simulate_disagg(spec)
    assert list(result.requests["status"]) == ["rejected"]
    assert result.summary["num_rejected"] == 1 and len(result.tables["transfers"]) == 0


def test_a_rejected_rows_prefix_hit_tokens_are_those_of_its_first_admission():
    """docs/metrics.md: `prefix_hit_tokens` = prompt tokens the prefix cache gave the request at its first
    admission. A turn the decode instance refuses was admitted by the prefill instance, which computed its prompt
    (its prefill was spent): its row keeps the hits it had there, as its `first_scheduled_s` keeps that admission,
    and the rows sum to the fleet's `num_prefix_cache_hit_tokens` as they do on one engine. A request refused on
    arrival was never admitted: 0. By hand: both prompts start with the same 64-token prefix (4 blocks of 16);
    the first request fills the cache, the second hits all 4 blocks (its prompt goes on past them): 64."""
    spec = scenario(num_requests=2, decode_engine={"num_gpu_blocks_override": 5, "max_model_len": 64})
    raw = spec.model_dump(mode="json")
    raw["engine"]["enable_prefix_caching"] = True
    raw["workload"]["shared_prefix"] = {"tokens": 64, "fraction": 1.0}
    result = simulate_disagg(make_scenario(raw))
    rows = result.requests.sort_values("request_id")
    assert list(rows["status"]) == ["rejected", "rejected"]
    assert list(rows["prefix_hit_tokens"]) == [0, 64]
    assert rows["first_scheduled_s"].notna().all()  # both were admitted by the prefill instance
    assert rows["prefix_hit_tokens"].sum() == result.summary["num_prefix_cache_hit_tokens"]
    raw["engine"]["max_model_len"] = 128  # now the prefill instance refuses them on arrival (prompts of 164)
    refused = simulate_disagg(make_scenario(raw)).requests
    assert list(refused["prefix_hit_tokens"]) == [0, 0] and refused["first_scheduled_s"].isna().all()


def test_bursts_are_exact_in_a_disaggregated_fleet():
    raw = scenario(num_prefill=2, num_decode=2, num_requests=80, rate=30.0).model_dump(mode="json")
    raw["latency"] = {"model": "roofline"}
    raw["workload"]["prompt_len"] = {"dist": "lognormal", "mean": 600, "p99": 2000}
    raw["workload"]["output_len"] = {"dist": "lognormal", "mean": 120, "p99": 600}
    spec = make_scenario(raw)
    on, off = simulate_disagg(spec), simulate_disagg(spec, bursts=False)
    assert on.requests.equals(off.requests)
    assert on.tables["transfers"].equals(off.tables["transfers"])
    assert on.summary == off.summary


def test_ttft_counts_what_the_client_sees():
    """The client's TTFT (decode side) exceeds the prefill instance's own by the transfer at least."""
    result = simulate_disagg(scenario(num_requests=20, rate=5.0))
    prefill_ttft = result.summary["per_replica"][0]["ttft_p90_s"]
    assert result.summary["ttft_s"]["p90"] >= prefill_ttft + LINK_LATENCY_S + PROMPT_BYTES / BANDWIDTH
    assert not math.isnan(result.summary["disaggregation"]["transfer_s"]["mean"])


def test_cli_kv_transfer_config_flag_writes_the_pool_files(tmp_path):
    """`kvsim run --kv-transfer-config JSON` (vLLM's flag) on groups with kv_role: transfers.csv and pools.csv."""
    import yaml
    from typer.testing import CliRunner

    from kvsim.cli import app

    raw = scenario(num_requests=5, rate=10.0).model_dump(mode="json")
    del raw["kv_transfer_config"]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(tmp_path / "s.yaml"), "-o", str(out), "--format", "json",
                                      "--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_link": "pcie"}'])
    assert result.exit_code == 0, result.output
    assert {"transfers.csv", "pools.csv", "requests.csv", "summary.json"} <= {p.name for p in out.iterdir()}
    summary = yaml.safe_load((out / "summary.json").read_text())
    assert summary["disaggregation"]["kv_link"] == "pcie" and summary["num_finished"] == 5


def test_a_hybrid_model_is_refused_in_one_line_naming_the_flag_that_runs_it():
    # gpt-oss-20b alternates sliding-window and full layers: the refusal said "engine.allocator=paged,
    # engine.scheduler=v1: disaggregation needs paged and v1", which they were. With the hybrid manager off
    # (vLLM's flag, as vLLM runs a connector without hybrid support) every layer is full attention: 2 · 24
    # layers · 8 kv heads · 64 · 2 B = 49,152 B a token, 7 blocks of 16 for 100 tokens, and the one request's
    # TTFT is P's step + the transfer + D's step, as for Llama above.
    model = {"model": "gpt-oss-20b", "engine": {"max_model_len": 2048}}
    with pytest.raises(KvsimError) as refused:
        simulate_disagg(scenario(extra=model))
    message = str(refused.value)
    assert "\n" not in message and "model=gpt-oss-20b has sliding-window" in message
    assert "engine.disable_hybrid_kv_cache_manager=true" in message
    hybrid_off = {"model": "gpt-oss-20b", "engine": {"max_model_len": 2048, "disable_hybrid_kv_cache_manager": True}}
    req = simulate_disagg(scenario(extra=hybrid_off), check=True).requests.iloc[0]
    transfer_s = LINK_LATENCY_S + 7 * 16 * 2 * 24 * 8 * 64 * 2 / BANDWIDTH
    assert req["status"] == "finished" and req["ttft_s"] == pytest.approx(STEP_S + transfer_s + STEP_S, rel=1e-12)


def test_parallel_sampling_is_refused_in_one_line_saying_why():
    """vLLM's P/D hands the decode instance one request's kv_transfer_params, while the prefill instance fans
    n > 1 out into n requests: kvsim refuses n > 1 and says so, as it said only "single-sequence requests"."""
    workload = {"num_requests": 1, "n": 2, "arrival": {"process": "constant", "rate": 1.0},
                "prompt_len": {"dist": "fixed", "value": 100}, "output_len": {"dist": "fixed", "value": 5}}
    with pytest.raises(KvsimError) as refused:
        simulate_disagg(scenario(extra={"workload": workload}))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("workload.n=2: vLLM's prefill/decode disaggregation")
    assert "kv_transfer_params" in message


def test_the_summary_names_the_pools_routers_that_routed():
    """A disaggregated fleet routes with each pool's router; the fleet's own `router` must be left at its
    default (the scenario refuses another), so the summary (and the printed headline) named round_robin,
    which routed nothing. Which routers routed is read off the routes independently: round robin's reason
    is "turn" and least-KV's "least_kv" (`kvsim.fleet.router.Route.reason`)."""
    spec = scenario(num_prefill=2, num_decode=2, num_requests=8, rate=50.0,
                    extra={"kv_transfer_config": {"kv_link": "rdma", "prefill_router": {"policy": "round_robin"},
                                                  "decode_router": {"policy": "least_kv"}}})
    result = simulate_disagg(spec)
    assert result.summary["router"] == "round_robin (prefill), least_kv (decode)"
    assert result.summary["route_reasons"] == {"least_kv": 8, "turn": 8}
