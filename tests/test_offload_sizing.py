"""The offload sizing answer (`kvsim.planning.offload_sizing`): prices derived by hand, the answers picked
from the grid as defined, and `kvsim plan --offload-size` writing them."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.cli.plan_command import offload_line
from kvsim.planning.offload_sizing import (
    hurts_table,
    pays_table,
    prefill_s,
    size_offload,
    sizing_base,
    ttft_slo,
    variant,
)
from kvsim.planning.spec import make_plan_spec
from kvsim.workload.scenario import make_scenario

STEP_S = 0.01
GiB = 2**30
BLOCK_BYTES = 16 * 131072  # Llama-3.1-8B, TP 1: 128 KiB per token, 16 tokens per block


def toy(num_requests=60, rate=4.0, latency=None, max_model_len=8192):
    """Multi-turn conversations on a 1,500-block GPU pool (the shape of tests/test_offload_scenario.py)."""
    return make_scenario({
        "name": "mt", "model": "llama-3.1-8b", "gpu": "h200",
        "engine": {"max_model_len": max_model_len, "num_gpu_blocks_override": 1500, "max_num_seqs": 16,
                   "max_num_batched_tokens": 2048},
        "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": rate},
                     "prompt_len": {"dist": "fixed", "value": 1000}, "output_len": {"dist": "fixed", "value": 50},
                     "multi_turn": {"turns": 4, "think_time_s": 5.0}},
        "latency": latency or {"model": "roofline"}, "seed": 3})


def test_recompute_and_load_are_priced_by_hand():
    base = toy(latency={"model": "constant", "step_s": STEP_S})
    assert prefill_s(base, 5000) == pytest.approx(3 * STEP_S)  # chunks of 2048: 2048, 2048, 904
    hurts = hurts_table(base, [4096, 100_000], [64e9, 1e9]).set_index("bandwidth_bytes_per_s")
    assert set(hurts["prefix_tokens"]) == {4096}  # longer than max_model_len: left out
    fast, slow = hurts.loc[64e9], hurts.loc[1e9]
    assert fast["bytes_per_rank"] == 256 * BLOCK_BYTES  # 4096 tokens: 256 whole blocks
    assert fast["load_s"] == pytest.approx(256 * BLOCK_BYTES / 64e9)  # 8.4 ms
    assert fast["recompute_s"] == pytest.approx(2 * STEP_S) and fast["load_is_faster"]
    assert slow["load_s"] == pytest.approx(256 * BLOCK_BYTES / 1e9) and not slow["load_is_faster"]  # 0.54 s
    assert slow["break_even_bandwidth_bytes_per_s"] == pytest.approx(256 * BLOCK_BYTES / (2 * STEP_S))


def test_pays_is_a_five_percent_cut_of_ttft_p90():
    points = pd.DataFrame([
        {"load": 0.5, "cpu_bytes": 0, "ttft_p90_s": 1.0, "mean_running": 2.0},
        {"load": 0.5, "cpu_bytes": GiB, "ttft_p90_s": 0.96, "mean_running": 2.0},  # 4 % lower: no
        {"load": 1.0, "cpu_bytes": 0, "ttft_p90_s": 2.0, "mean_running": 5.0},
        {"load": 1.0, "cpu_bytes": GiB, "ttft_p90_s": 1.9, "mean_running": 4.0}])  # 5 % lower: pays
    pays = pays_table(points, GiB)
    assert list(pays["pays"]) == [False, True]
    assert list(pays["ttft_p90_ratio"]) == pytest.approx([0.96, 0.95])


def test_variant_scales_the_load_and_sets_the_tier():
    base = toy()
    v = variant(base, 8 * GiB, load=2.0, bandwidth_bytes_per_s=32e9)
    assert v.workload.arrival.rate == 8.0
    assert v.engine.kv_offload.cpu_bytes == 8 * GiB and v.engine.kv_offload.bandwidth_bytes_per_s == 32e9
    assert variant(base, 0).engine.kv_offload is None


def test_size_offload_picks_the_smallest_size_meeting_each_target():
    sizing = size_offload(toy(), [1 * GiB, 8 * GiB], target_hit_rate=0.3, ttft_slo_s=10.0, workers=1)
    points = sizing.points.set_index("cpu_bytes")
    assert list(points.index) == [0, GiB, 8 * GiB]  # no tier is always in the grid
    assert points.loc[0, "recompute_avoided_tokens"] == 0
    meets = [size for size in points.index if points.loc[size, "hit_rate_all_tiers"] >= 0.3]
    assert sizing.size_for_hit_rate_bytes == (min(meets) if meets else None)
    assert points.loc[8 * GiB, "hit_rate_all_tiers"] > points.loc[0, "hit_rate_all_tiers"]
    assert sizing.size_for_ttft_bytes == 0  # a 10 s SLO: met without a tier
    assert "without a tier" in offload_line(sizing) and "\n" not in offload_line(sizing)


def test_ttft_slo_from_a_plans_slos():
    assert ttft_slo({"e2e_s.p99": 5.0, "ttft_s.p50": 0.5}) == (0.5, "p50")
    assert ttft_slo({"e2e_s.p99": 5.0}) == (None, "p90")


def test_the_plan_sizes_the_tier_for_its_cheapest_feasible_colocated_fleet():
    spec = make_plan_spec({"slo": {"ttft_s.p90": 2}, "gpus": ["h200", "h100-80gb"], "engine": {"max_num_seqs": [16, 32]},
                           "router": "least_kv"})
    rows = [{"topology": "1P1D", "feasible": True, "replicas": 2},  # a split: not what a tier is sized for
            {"topology": "colocated", "feasible": False, "replicas": None},
            {"topology": "colocated", "feasible": True, "replicas": 3, "gpu": "h100-80gb", "tensor_parallel_size": 1,
             "max_num_seqs": 32},
            {"topology": "colocated", "feasible": True, "replicas": 2, "gpu": "h200", "tensor_parallel_size": 1,
             "max_num_seqs": 16}]  # ranked below: not it
    base = toy()
    fleet, label = sizing_base(base, spec, rows)
    assert label == "h100-80gb tp1 max_num_seqs=32 x3"
    assert (fleet.gpu, fleet.replicas, fleet.engine.max_num_seqs, fleet.router.policy) == ("h100-80gb", 3, 32, "least_kv")
    assert fleet.workload == base.workload  # the whole traffic, on the fleet
    assert sizing_base(base, spec, rows[:2]) == (base, "the scenario as given (no feasible colocated answer)")


def test_plan_with_offload_size_writes_the_sizing(tmp_path):
    scenario = tmp_path / "toy.yaml"
    scenario.write_text(json.dumps(toy(num_requests=30).model_dump(mode="json")))
    out = tmp_path / "plan"
    result = runner().invoke(app, ["plan", str(scenario), "--slo", "ttft_s.p90=2", "--gpu", "h200",
                                   "--max-replicas", "1", "--workers", "1", "--offload-size", "4GiB", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads((out / "plan.json").read_text())
    assert plan[0]["feasible"] and plan[0]["replicas"] == 1  # the plan's answer: one h200
    assert "offload (h200 tp1 x1):" in result.stdout  # the tier is sized for that answer's replicas
    answer = json.loads((out / "offload_sizing.json").read_text())
    assert answer["ttft_slo_s"] == 2 and answer["largest_bytes"] == 4 * GiB and answer["sized_for"] == "h200 tp1 x1"
    points = pd.read_csv(out / "offload_points.csv")
    assert sorted(set(points["load"])) == [0.5, 1.0, 2.0] and sorted(set(points["cpu_bytes"])) == [0, 4 * GiB]
    bad = runner().invoke(app, ["plan", str(scenario), "--slo", "ttft_s.p90=2", "--gpu", "h200", "--workers", "1",
                                "--offload-size", "lots", "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "--offload-size='lots'" in bad.stderr and not (tmp_path / "bad").exists()
    twice = runner().invoke(app, ["plan", str(scenario), "--slo", "ttft_s.p90=2", "--gpu", "h200", "--workers", "1",
                                  "--offload-size", "4GiB", "--offload-size", "4294967296", "-o", str(tmp_path / "b2")])
    assert twice.exit_code == 2 and "--offload-size: 4,294,967,296 bytes is given twice" in twice.stderr
    assert len(twice.stderr.strip().splitlines()) == 1 and not (tmp_path / "b2").exists()


def runner():
    return CliRunner()


def test_pays_is_not_judged_at_a_load_where_a_run_served_no_request():
    """Every prompt refused (over max_model_len) leaves a run no TTFT: p90 None. `pays` was a TypeError traceback
    (float * None); there is nothing to compare, so pays and the ratio are empty, and such a load pays nowhere."""
    points = pd.DataFrame([
        {"load": 1.0, "cpu_bytes": 0, "ttft_p90_s": None, "mean_running": 0.0},
        {"load": 1.0, "cpu_bytes": GiB, "ttft_p90_s": None, "mean_running": 0.0},
        {"load": 2.0, "cpu_bytes": 0, "ttft_p90_s": 2.0, "mean_running": 5.0},
        {"load": 2.0, "cpu_bytes": GiB, "ttft_p90_s": 1.0, "mean_running": 4.0}])  # halved: pays
    pays = pays_table(points, GiB)
    assert list(pays["pays"]) == [None, True]
    assert pd.isna(pays["ttft_p90_ratio"].iloc[0]) and pays["ttft_p90_ratio"].iloc[1] == pytest.approx(0.5)


def test_a_scenario_whose_every_prompt_is_refused_is_sized_without_a_traceback():
    """The toy's 1,000-token prompts at max_model_len 512: vLLM refuses each, so no run at any size serves one.
    No size meets the TTFT SLO (no TTFT), the tier pays at no load; it was a TypeError traceback."""
    sizing = size_offload(toy(num_requests=4, max_model_len=512), [GiB], ttft_slo_s=10.0, workers=1)
    assert list(sizing.points["num_finished"]) == [0, 0]
    assert sizing.size_for_ttft_bytes is None and sizing.pays_from_load is None
    assert list(sizing.pays["pays"]) == [None]


@pytest.mark.parametrize(("ttft_slo_s", "size", "said"), [
    (None, None, "offload (h100-80gb tp1 x2): no TTFT SLO to size a tier for; the largest tier (1 GiB) cuts"),
    (2.0, None, "offload (h100-80gb tp1 x2): TTFT p90 <= 2.0 s not met by any size tried; the largest tier (1 GiB)"),
    (2.0, GiB, "offload (h100-80gb tp1 x2): TTFT p90 <= 2.0 s met from a CPU tier of 1 GiB a replica; the largest"),
])
def test_the_offload_line_says_when_no_ttft_slo_was_sized_for(ttft_slo_s, size, said):
    """`kvsim plan --slo tpot_s.p90=1 --offload-size 1GiB` (no TTFT SLO: `ttft_slo` gives None, and no size is
    sought) printed 'no TTFT SLO not met by any size tried', as if an SLO had been missed."""
    from types import SimpleNamespace

    facts = {"ttft_percentile": "p90", "ttft_slo_s": ttft_slo_s, "largest_bytes": GiB, "sized_for": "h100-80gb tp1 x2"}
    sizing = SimpleNamespace(facts=facts, size_for_ttft_bytes=size, pays_from_load=None)
    assert offload_line(sizing).startswith(said)


def test_recompute_prices_a_logits_row_per_chunk_under_v1_only():
    """vLLM v1 takes a logits row at every scheduled request, a partial chunk's too (`logits_indices =
    query_start_loc[1:] - 1`); v0 only at the chunk that ends the prompt. 5,000 tokens in chunks of 2,048:
    v1's recompute costs v0's pricing of the same chunks plus two rows of LM head and sampler, one per
    partial chunk (the 2,048 and 2,048 before the last 904)."""
    from kvsim.engine.builder import make_latency, resolve_engine
    from kvsim.latency.roofline import RooflineLatency
    from kvsim.latency.step_plan import StepPlan

    base = toy()
    latency = make_latency(resolve_engine(base))
    assert isinstance(latency, RooflineLatency)
    last_row_only = 0.0
    for past, chunk in ((0, 2048), (2048, 2048), (4096, 904)):
        plan = StepPlan()
        plan.add(chunk, past, 1, logits_row=past + chunk == 5000)
        last_row_only += latency.step_time(plan)
    one_row = latency.lm_head_s(1) + latency.sampler_s(1)
    assert one_row > 1e-4  # the LM head's 1.05 GB weight read at one row
    assert prefill_s(base, 5000) == pytest.approx(last_row_only + 2 * one_row, rel=1e-12)
