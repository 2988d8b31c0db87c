"""`kvsim plan --xpyd`: disaggregated splits judged like colocated fleets and ranked with them by cost.

Hand derivation on the toy of `tests/test_plan.py` (every step 20 ms whatever it carries, at most 8
sequences per instance, 256-token prompts, 64-token replies, 14 req/s): a colocated replica spends 64
steps on a request (the prompt and the first token in one step, then 63 decode steps), 8 at a time,
so it serves at most 8 / (64 · 0.02 s) = 6.25 req/s. A decode instance of a split spends the same 64
steps (it recomputes the last prompt token to sample the client's first token, then 63 more), so its
ceiling is also 6.25 req/s, and the prefill instance adds a GPU that serves no decode. Hence:
  * 1P2D's decode pool serves at most 12.5 req/s < 14 offered (served/offered ≤ 0.89 < 0.95): overloaded
    (1P1D and 2P1D at most 6.25 req/s);
  * a split needs at least as many decode instances as the colocated answer needs replicas, plus a
    prefill instance: every feasible split uses more GPUs, so colocated ranks first;
  * cost = GPUs × the given $2/GPU-hour, GPUs = instances × TP; $/M tokens = cost / (tokens/s · 3600) · 10⁶.
"""

import json

import pytest
from test_plan import SLO, toy  # tests/ is on sys.path
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.planning.plan import make_plan_spec, plan, rank
from kvsim.workload.scenario import make_scenario

runner = CliRunner()


def test_splits_rank_beside_colocated_fleets_by_cost(tmp_path):
    """1P3D given, and `auto`: the colocated answer is 3 replicas (test_plan's brute force), so auto adds
    every split of at most 3 instances, 1P1D, 1P2D and 2P1D, whose decode pools serve at most 6.25,
    12.5 and 6.25 req/s < 14 offered: all overloaded."""
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8, "verify_factor": 2,
                           "gpu_hourly_cost": {"h100-80gb": 2.0}, "xpyd": ["1P3D", "auto"]})
    rows, _ = plan(toy(), spec, tmp_path / "plan")
    by_topology = {row["topology"]: row for row in rows}
    assert set(by_topology) == {"colocated", "1P3D", "1P1D", "1P2D", "2P1D"}
    colocated = by_topology["colocated"]
    assert rows[0]["topology"] == "colocated" and colocated["feasible"] and colocated["replicas"] == 3
    for split in ("1P1D", "1P2D", "2P1D"):
        assert not by_topology[split]["feasible"] and by_topology[split]["verdict"] == "overloaded"
        assert by_topology[split]["limiting_factor"].endswith(f"at {split}")
    for row in rows:
        if row["feasible"]:
            instances = row["prefill_instances"] + row["decode_instances"] if row["topology"] != "colocated" \
                else row["replicas"]
            assert row["num_gpus"] == instances * row["tensor_parallel_size"]
            assert row["cost_per_hour"] == pytest.approx(2.0 * row["num_gpus"])
            assert row["usd_per_million_output_tokens"] == pytest.approx(
                row["cost_per_hour"] / (row["output_tokens_per_s"] * 3600) * 1e6)
            if row["topology"] != "colocated":
                assert row["decode_instances"] >= colocated["replicas"]
                assert row["num_gpus"] >= colocated["num_gpus"] + 1
    feasible = [row for row in rows if row["feasible"]]
    assert [row["cost_per_hour"] for row in feasible] == sorted(row["cost_per_hour"] for row in feasible)
    assert all(not row["feasible"] for row in rows[len(feasible):])  # infeasible rows come last
    again, simulated_again = plan(toy(), spec, tmp_path / "plan")
    assert simulated_again == 0 and again == rows


def test_rank_orders_by_cost_then_gpus_then_cost_per_token():
    def row(name, feasible, cost, gpus, per_token=None, room=0.1):
        return {"candidate": name, "feasible": feasible, "cost_per_hour": cost, "num_gpus": gpus,
                "usd_per_million_output_tokens": per_token, "headroom": room}
    ranked = rank([row("none", False, None, None, room=-1.0), row("dear", True, 9.0, 3, 1.0),
                   row("cheap-slow", True, 4.0, 2, 2.0), row("cheap-fast", True, 4.0, 2, 1.5),
                   row("unpriced", True, None, 1)])
    assert [r["candidate"] for r in ranked] == ["cheap-fast", "cheap-slow", "dear", "unpriced", "none"]
    assert [r["rank"] for r in ranked] == [1, 2, 3, 4, 5]


def test_rank_takes_costs_equal_to_four_significant_digits_as_ties_then_fewer_gpus_then_the_name():
    """3 GPUs at $2.30 and 2 at $3.45 both cost $6.90 an hour (in floats 6.8999999999999995 and 6.9: the three
    ranked first); equal cost and GPUs with $/Mtok equal but for its last bits (0.27780000000000005 against
    0.2778) fall to headroom, then to the name (the noise decided: "b" first)."""
    def row(name, cost, gpus, per_token=0.5, room=0.1):
        return {"candidate": name, "feasible": True, "cost_per_hour": cost, "num_gpus": gpus,
                "usd_per_million_output_tokens": per_token, "headroom": room}
    assert 3 * 2.30 < 2 * 3.45  # the noise this is about
    ranked = rank([row("three", 3 * 2.30, 3), row("two", 2 * 3.45, 2)])
    assert [r["candidate"] for r in ranked] == ["two", "three"]
    noisy = 0.2778 + 5e-17
    assert noisy > 0.2778
    ranked = rank([row("a", 4.0, 2, noisy), row("b", 4.0, 2, 0.2778)])
    assert [r["candidate"] for r in ranked] == ["a", "b"]
    ranked = rank([row("a", 4.0, 2, noisy), row("b", 4.0, 2, 0.2778, room=0.2)])
    assert [r["candidate"] for r in ranked] == ["b", "a"]  # more headroom before the name
    ranked = rank([row("a", 4.0, 2, 0.2779), row("b", 4.0, 2, 0.2778)])
    assert [r["candidate"] for r in ranked] == ["b", "a"]  # $0.0001 a million tokens apart: an order


def test_rank_orders_tiny_costs_by_their_relative_difference():
    """At a tiny hourly price ($0.0001 a GPU-hour, one GPU each) $/Mtok of 0.00006 and 0.00014 are under $0.0001
    apart, yet one is more than twice the other: the cheaper per token ranks first, though headroom and name
    both favour the dearer "a". Costs equal to 4 significant digits (0.00012341 and 0.00012344, both 0.0001234)
    still tie and fall to headroom."""
    def row(name, per_token, room):
        return {"candidate": name, "feasible": True, "cost_per_hour": 0.0001, "num_gpus": 1,
                "usd_per_million_output_tokens": per_token, "headroom": room}
    ranked = rank([row("a", 0.00014, 0.5), row("b", 0.00006, 0.1)])
    assert [r["candidate"] for r in ranked] == ["b", "a"]
    ranked = rank([row("a", 0.00012344, 0.5), row("b", 0.00012341, 0.1)])
    assert [r["candidate"] for r in ranked] == ["a", "b"]  # a tie on cost: more headroom first


def test_rank_ties_one_hourly_cost_summed_two_ways_above_100_dollars():
    """3 GPUs at $33.35 and 15 at $6.67 both cost $100.05 an hour (in floats 100.05000000000001 and 100.05): a tie,
    so fewer GPUs rank first. Rounded straight to 4 significant digits the noise straddled the half-way point,
    100.1 against 100.0, and the 15-GPU fleet ranked first as the cheaper; the printed costs differed too."""
    from kvsim.planning.cost import usd_rounded

    def row(name, gpus, price):
        return {"candidate": name, "feasible": True, "cost_per_hour": gpus * price, "num_gpus": gpus,
                "usd_per_million_output_tokens": 1.0, "headroom": 0.1}
    assert [r["candidate"] for r in rank([row("many", 15, 6.67), row("few", 3, 33.35)])] == ["few", "many"]
    assert usd_rounded(3 * 33.35) == usd_rounded(15 * 6.67) == usd_rounded(100.05)


def test_a_split_whose_probes_stay_too_short_says_it_was_not_judged(tmp_path):
    """1P3D's decode pool serves up to 18.75 req/s > 14 offered, so nothing outgrows; 20 requests a probe are under
    the window's 50 and max_probe_requests=20 forbids the doubling: neither the split nor the colocated fleet
    (1, 2, 4 replicas) is judged, and both rows say so."""
    raw = toy().model_dump(mode="json")
    raw["workload"]["num_requests"] = 20
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 4, "max_probe_requests": 20,
                           "xpyd": ["1P3D"]})
    rows, _ = plan(make_scenario(raw), spec, tmp_path / "plan")
    why = {row["topology"]: row["limiting_factor"] for row in rows}
    advice = "; raise max_probe_requests (now 20)"
    assert why == {"1P3D": "could not be judged: its 20-request probes were too short at 1P3D" + advice,
                   "colocated": "could not be judged: its 20-request probes were too short up to 4 replicas" + advice}


def test_plan_command_counts_tp_in_a_split_and_prints_the_choice(tmp_path):
    raw = toy().model_dump(mode="json")
    raw["workload"].update(num_requests=60, arrival={"process": "poisson", "rate": 1.0})
    scenario = tmp_path / "light.yaml"
    scenario.write_text(json.dumps(raw))
    args = ["plan", str(scenario), "--slo", "e2e_s.p99=5", "--gpu", "h100-80gb", "-tp", "2", "--xpyd", "1P1D",
            "--kv-transfer-config", '{"kv_link": "nvlink"}', "--gpu-hourly-cost", "h100-80gb=2",
            "--max-replicas", "2", "--workers", "1", "-o", str(tmp_path / "plan")]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {row["topology"]: row for row in json.loads(result.stdout)}
    # 1 req/s is far below one instance's 6.25 req/s: one TP-2 replica (2 GPUs) and 1P1D (2 x 2 GPUs) both serve
    assert rows["colocated"]["num_gpus"] == 2 and rows["colocated"]["cost_per_hour"] == pytest.approx(4.0)
    assert rows["1P1D"]["num_gpus"] == 4 and rows["1P1D"]["cost_per_hour"] == pytest.approx(8.0)
    assert rows["colocated"]["rank"] == 1 and rows["1P1D"]["rank"] == 2
    table = runner.invoke(app, args)  # resumes from points.jsonl
    assert table.exit_code == 0, table.output
    assert "chosen: h100-80gb tp2 x1 (colocated): 2 GPUs, $4/hour, $" in table.stdout  # the table's cell: 4


@pytest.mark.parametrize(("flags", "said"), [
    (["--set", "engine.scheduler=v0", "--xpyd", "1P1D,2P1D"],
     "--xpyd 1P1D,2P1D: engine.scheduler=v0: a prefill/decode split needs engine.scheduler=v1"),
    (["--set", "engine.scheduler=v0", "--engine", "max_num_seqs=8,4", "--xpyd", "auto"],  # checked as 1P1D
     "--xpyd auto: engine.scheduler=v0: a prefill/decode split needs engine.scheduler=v1"),
    (["--set", "engine.allocator=slab-max", "--xpyd", "1P1D"],
     "--xpyd 1P1D: engine.allocator=slab-max: a prefill/decode split needs engine.allocator=paged")])
def test_a_split_of_a_v0_or_slab_engine_is_refused_naming_the_flag_and_the_engine_field(tmp_path, flags, said):
    """vLLM's KV connectors are its v1 engine's, over the paged pool: a plan whose splits would run another engine
    is refused in one line naming `--xpyd` as given and the engine field with its value (exit 2, nothing written),
    where no split of the plan can be split (beside a v1 value, the v0 splits are ranked infeasible instead:
    `tests/test_plan_unfit.py`).
    It said `replicas (toy/h100-80gb_tp1_1P1D/x2/prefill-0, kv_producer): engine.allocator=paged,
    engine.scheduler=v0: ...`, a name the plan made up for the split's first instance."""
    scenario = tmp_path / "toy.yaml"
    scenario.write_text(json.dumps(toy().model_dump(mode="json")))
    out = tmp_path / "plan"
    result = runner.invoke(app, ["plan", str(scenario), "--slo", "ttft_s.p90=2", "--gpu", "h100-80gb", *flags,
                                 "--workers", "1", "-o", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvsim: error: {said} (vLLM v1's KV connectors)"), lines
    assert "prefill-0" not in result.output and not out.exists()
