"""`kvsim plan` with a candidate whose engine does not fit its GPU: ranked infeasible with the reason, the others
planned; a plan none of whose candidates fits is refused in one line, as a one-candidate plan always was.

By hand: the toy is Llama-3.1-8B (`tests/test_plan.py`), 32 layers × 8 KV heads × 128 head_dim × 2 tensors × 2 B =
128 KiB a token, 2 MiB a 16-token block; its weights, 8,030,261,248 parameters × 2 B, are 14.96 GiB. An H100-80GB
holds 79.65 GiB, so a `num_gpu_blocks_override` pool fits beside the weights up to (79.65 − 14.96) GiB ÷ 2 MiB ≈
33,100 blocks: 400 blocks (0.78 GiB) fit, 40,000 (78.125 GiB) and 50,000 (97.66 GiB) do not.
"""

import json

from test_plan import toy  # tests/ is on sys.path
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.planning.plan import make_plan_spec, plan
from kvsim.workload.scenario import make_scenario

runner = CliRunner()


def light():
    """The toy at 1 req/s, 80 requests: far below one replica's 6.25 req/s (`tests/test_plan_xpyd.py`), and enough
    for one probe's window (50 requests)."""
    raw = toy().model_dump(mode="json")
    raw["workload"].update(num_requests=80, arrival={"process": "poisson", "rate": 1.0})
    return make_scenario(raw)


def test_a_knob_value_that_does_not_fit_its_gpu_is_ranked_infeasible_and_the_others_planned(tmp_path):
    """It refused the whole plan: `kvsim: error: num_gpu_blocks_override=40000: a KV pool of ... exceeds
    h100-80gb's 79.65 GiB`, so one grid value too large (or one GPU too small for the model) planned nothing."""
    spec = make_plan_spec({"slo": {"e2e_s.p99": 5}, "gpus": ["h100-80gb"], "max_replicas": 1, "verify_factor": 0,
                           "engine": {"num_gpu_blocks_override": [40_000, 400]}})
    rows, simulated = plan(light(), spec, tmp_path / "plan")
    fits, unfit = rows
    assert fits["candidate"] == "h100-80gb tp1 num_gpu_blocks_override=400" and fits["rank"] == 1
    assert fits["feasible"] and fits["replicas"] == 1 and simulated >= 1  # planned: one replica serves 1 req/s
    assert unfit["candidate"] == "h100-80gb tp1 num_gpu_blocks_override=40000" and unfit["rank"] == 2
    assert not unfit["feasible"] and not unfit["memory_limited"]
    assert unfit["replicas"] is unfit["num_gpus"] is unfit["cost_per_hour"] is unfit["headroom"] is None
    assert unfit["lower_bound_replicas"] is None and not unfit["gap_breakdown"]  # no engine to floor
    why = unfit["limiting_factor"]
    assert why.startswith("does not fit its GPU: num_gpu_blocks_override=40000: a KV pool of 78.1"), why
    assert why.endswith("GiB plus 14.96 GiB of weights exceeds h100-80gb's 79.65 GiB"), why


def test_a_plan_none_of_whose_candidates_fits_is_refused_in_one_line(tmp_path):
    """Nothing to plan: the first candidate's refusal, exit 2, nothing written (as with one candidate before)."""
    scenario = tmp_path / "light.yaml"
    scenario.write_text(json.dumps(light().model_dump(mode="json")))
    out = tmp_path / "plan"
    result = runner.invoke(app, ["plan", str(scenario), "--slo", "e2e_s.p99=5", "--gpu", "h100-80gb", "--engine",
                                 "num_gpu_blocks_override=40000,50000", "--workers", "1", "-o", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: num_gpu_blocks_override=40000: a KV pool of 78.1")
    assert not out.exists()


def test_a_split_of_a_v0_grid_value_is_ranked_infeasible_and_the_v1_split_and_colocated_ones_planned(tmp_path):
    """`--engine scheduler=v1,v0 --xpyd 1P1D` refused the whole plan (`--xpyd 1P1D: engine.scheduler=v0: a
    prefill/decode split needs engine.scheduler=v1`). By hand: 1 req/s is far below one instance's 6.25 req/s, so
    each colocated engine is one replica (1 GPU) and the v1 1P1D two instances (2 GPUs), all feasible; vLLM's KV
    connectors run on its v1 engine only, so the v0 1P1D is infeasible with that reason and simulates nothing."""
    spec = make_plan_spec({"slo": {"e2e_s.p99": 5}, "gpus": ["h100-80gb"], "max_replicas": 2, "verify_factor": 0,
                           "engine": {"scheduler": ["v1", "v0"]}, "xpyd": ["1P1D"]})
    rows, _ = plan(light(), spec, tmp_path / "plan")
    by_name = {(row["scheduler"], row["topology"]): row for row in rows}
    assert set(by_name) == {("v1", "colocated"), ("v0", "colocated"), ("v1", "1P1D"), ("v0", "1P1D")}
    for name, num_gpus in ((("v1", "colocated"), 1), (("v0", "colocated"), 1), (("v1", "1P1D"), 2)):
        assert by_name[name]["feasible"] and by_name[name]["num_gpus"] == num_gpus, by_name[name]
    unsplit = by_name[("v0", "1P1D")]
    assert not unsplit["feasible"] and unsplit["rank"] == 4 and unsplit["num_gpus"] is None
    assert unsplit["limiting_factor"] == ("cannot be split: engine.scheduler=v0: a prefill/decode split needs "
                                          "engine.scheduler=v1 (vLLM v1's KV connectors)")


def test_xpyd_auto_beside_a_v0_grid_value_plans(tmp_path):
    """`--engine scheduler=v1,v0 --xpyd auto` was refused as the v0 shape's 1P1D; now it plans: at 1 req/s each
    shape's colocated answer is one replica, so auto adds no split (a split has at least 2 instances)."""
    spec = make_plan_spec({"slo": {"e2e_s.p99": 5}, "gpus": ["h100-80gb"], "max_replicas": 2, "verify_factor": 0,
                           "engine": {"scheduler": ["v1", "v0"]}, "xpyd": ["auto"]})
    rows, _ = plan(light(), spec, tmp_path / "plan")
    assert sorted((row["scheduler"], row["topology"], row["replicas"]) for row in rows) == [
        ("v0", "colocated", 1), ("v1", "colocated", 1)]
