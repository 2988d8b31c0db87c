"""Metamorphic relations: pairs of scenarios that must give identical (or exactly related) results.

Each pair differs in a setting that, by its definition or vLLM's, cannot change what is simulated: a fleet
of one replica, one data-parallel rank, one priority for every request, one-turn conversations, a trace or a
GPU given as a file. The expected result is the other run of the pair, not a number copied from the code.
The runs are small but not trivial: 120 requests on a 300-block pool with a shared system prompt, so the
prefix cache hits and requests are preempted (both asserted).
"""

import json
import re

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import kvsim
from kvsim.cli import app
from kvsim.model.config import PRESETS_DIR
from kvsim.model.errors import KvsimError
from kvsim.results.step_writer import has_pyarrow

SMALL = {
    "model": "llama-3.1-8b", "gpu": "h100-80gb",
    "engine": {"max_model_len": 4096, "num_gpu_blocks_override": 300},
    "workload": {"num_requests": 120, "arrival": {"process": "poisson", "rate": 12.0},
                 "prompt_len": {"dist": "lognormal", "mean": 300, "p99": 1500},
                 "output_len": {"dist": "lognormal", "mean": 200, "p99": 800},
                 "shared_prefix": {"tokens": 512, "fraction": 0.6, "num_prefixes": 3}},
}
TIME_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s")


def scenario(seed=0, **workload):
    return {**SMALL, "seed": seed, "workload": {**SMALL["workload"], **workload}}


def same_run(a, b, drop=()):
    """Requests (less `a`'s own columns `drop`) and summary identical, as `summary.json` writes them."""
    assert a.requests.drop(columns=list(drop)).equals(b.requests)
    assert json.dumps(a.summary) == json.dumps(b.summary)


@pytest.fixture(scope="module", params=[0, 1])
def single(request):
    result = kvsim.simulate(scenario(seed=request.param))
    assert result.summary["num_preemptions"] > 0 and result.summary["prefix_cache_hit_rate"] > 0.2
    return result


@pytest.mark.parametrize("policy", ["round_robin", "least_outstanding", "least_kv", "affinity"])
def test_a_fleet_of_one_is_the_single_engine_whatever_the_router(single, policy):
    """A fleet's summary has its own shape; every key it shares with the engine's is equal, and its one
    replica's section is the engine's (but for its name, `NAME/r0`)."""
    fleet = kvsim.simulate({**scenario(seed=single.scenario.seed), "replicas": 1, "router": {"policy": policy}})
    assert set(fleet.requests["replica"]) == {0}
    assert fleet.requests.drop(columns=["replica"]).equals(single.requests)
    shared = set(fleet.summary) & set(single.summary)
    assert {"ttft_s", "num_preemptions", "prefix_cache_hit_rate", "duration_s"} <= shared
    assert {k: fleet.summary[k] for k in shared} == {k: single.summary[k] for k in shared}
    replica = fleet.replicas[0]
    assert replica.requests.equals(single.requests)
    assert {**replica.summary, "scenario": single.summary["scenario"]} == single.summary


@pytest.mark.parametrize("setting", [
    {"engine": {"data_parallel_size": 1}},  # one rank is the engine (no `dp_rank` column either)
    {"engine": {"scheduling_policy": "priority"}},  # every request at priority 0: (priority, arrival) is arrival
    {"workload": {"priority": {"classes": [{"name": "only", "priority": 3, "weight": 1}]}},
     "engine": {"scheduling_policy": "priority"}},
    {"workload": {"multi_turn": {"turns": 1}}},  # a one-turn conversation is a request
    {"workload": {"multi_turn": {"turns": 1, "timing": "after_reply"}}},  # no turn waits for a reply
], ids=["dp1", "priority", "priority-one-class", "one-turn-open", "one-turn-after-reply"])
def test_a_setting_that_cannot_matter_changes_nothing(single, setting):
    raw = scenario(seed=single.scenario.seed, **setting.get("workload", {}))
    raw["engine"] = {**raw["engine"], **setting.get("engine", {})}
    result = kvsim.simulate(raw)
    drop = []
    if "priority" in raw["workload"]:  # the class mix adds its column and per-class summary
        assert set(result.requests["priority"]) == {3} and list(result.summary["by_priority"]) == ["3"]
        result.summary.pop("by_priority")
        drop.append("priority")
    same_run(result, single, drop)


def test_priority_fcfs_equivalence_holds_under_multi_turn_replies():
    """The same with conversations whose turns wait for their replies (a request's turns arrive late)."""
    turns = {"multi_turn": {"turns": 3, "think_time_s": 2.0, "timing": "after_reply"}}
    fcfs = kvsim.simulate(scenario(**turns))
    assert fcfs.summary["num_preemptions"] > 0
    same_run(kvsim.simulate(scenario(**turns), engine__scheduling_policy="priority"), fcfs)


@pytest.mark.parametrize("what", ["poisson", "gamma", "multi-turn", "trace", "fleet", "dp2", "v0", "closed-loop"])
def test_doubling_every_rate_halves_every_time_exactly(what):
    """Time rescaled by 1/2: arrival rate (or a trace's rate_scale) doubled, the constant step time and the
    think time halved. Arrivals are exponential (gamma) draws times 1/rate and their running sums, step ends
    sums of step times: halving is exact in binary floating point, so every decision is the same and every
    time is exactly half (not just close)."""
    def run(scale):
        raw = scenario(seed=2)
        raw["latency"] = {"model": "constant", "step_s": 0.01 / scale}
        workload = raw["workload"]
        workload["arrival"] = {"process": "poisson", "rate": 12.0 * scale}
        if what == "gamma":
            workload["arrival"] = {"process": "gamma", "rate": 12.0 * scale, "cv": 2.0}
        elif what == "multi-turn":
            workload["multi_turn"] = {"turns": 3, "think_time_s": 4.0 / scale, "timing": "after_reply"}
            workload["arrival"]["rate"] = 6.0 * scale
        elif what == "trace":
            for key in ("prompt_len", "output_len", "shared_prefix"):
                del workload[key]
            workload["arrival"] = {"process": "trace"}
            workload["trace"] = {"format": "azure", "path": "builtin:azure_conv", "rate_scale": float(scale)}
        elif what == "fleet":
            raw.update(replicas=2, router={"policy": "affinity"})
        elif what == "dp2":
            raw["engine"] = {**raw["engine"], "data_parallel_size": 2}
        elif what == "v0":
            raw["engine"] = {**raw["engine"], "scheduler": "v0"}
        elif what == "closed-loop":
            workload["max_concurrency"] = 5
        return kvsim.simulate(raw)

    slow, fast = run(1), run(2)
    times = [c for c in slow.requests.columns if c in TIME_COLUMNS or c == "client_queue_s"]
    np.testing.assert_array_equal(fast.requests[times].to_numpy(), slow.requests[times].to_numpy() / 2)
    others = [c for c in slow.requests.columns if c not in times]
    assert fast.requests[others].equals(slow.requests[others])
    for key in ("num_finished", "num_preemptions", "num_prefix_cache_hit_tokens", "num_rejected"):
        assert fast.summary[key] == slow.summary[key]
    assert fast.summary["duration_s"] == slow.summary["duration_s"] / 2
    assert fast.summary["ttft_s"] == {stat: value / 2 for stat, value in slow.summary["ttft_s"].items()}


def test_a_preset_given_as_a_file_is_the_preset(tmp_path, single):
    """A GPU file holding the preset's fields under the preset's name is the preset (a file of another name
    gets the default roofline fractions of its memory type, not the preset's fitted ones:
    `kvsim.latency.efficiency.efficiency_for`); the model's config.json copied into a folder is the preset
    but for the summary's `model`, named by the folder."""
    gpus = yaml.safe_load((PRESETS_DIR / "gpus.yaml").read_text())
    (tmp_path / "h100-80gb.yaml").write_text(yaml.safe_dump(gpus["h100-80gb"]))
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text((PRESETS_DIR / "models" / "llama-3.1-8b.json").read_text())
    seed = single.scenario.seed
    same_run(kvsim.simulate({**scenario(seed=seed), "gpu": str(tmp_path / "h100-80gb.yaml")}), single)
    by_path = kvsim.simulate({**scenario(seed=seed), "model": str(tmp_path / "llama" / "config.json")})
    assert by_path.requests.equals(single.requests)
    assert by_path.summary == {**single.summary, "model": "llama"}


@pytest.mark.skipif(not has_pyarrow(), reason="steps.parquet needs pyarrow")
@pytest.mark.parametrize("kind", ["autoscaled", "disaggregated"])
def test_every_kind_of_run_writes_the_steps_format_asked_for(tmp_path, kind):
    """`kvsim run --steps-format parquet` on an autoscaled or disaggregated fleet wrote steps.csv: those runs
    are written after they end (`RunResult.write`), which wrote CSV whatever was asked. Both files now hold
    the same rows and dtypes, and every other file is the same bytes."""
    import pandas as pd

    raw = {**scenario(num_requests=40), "name": kind}
    if kind == "autoscaled":
        raw.update(replicas=1, router={"policy": "least_outstanding"},
                   autoscaler={"min_replicas": 1, "max_replicas": 2, "target": 2, "startup_s": 1, "sync_period_s": 1})
    else:
        raw.update(replicas=[{"count": 1, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}],
                   kv_transfer_config={"kv_connector": "NixlConnector"}, router=None)
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(raw))
    runner = CliRunner()
    for fmt in ("csv", "parquet"):
        result = runner.invoke(app, ["run", str(path), "--steps-format", fmt, "-o", str(tmp_path / fmt)])
        assert result.exit_code == 0, result.output
    as_csv, as_parquet = tmp_path / "csv", tmp_path / "parquet"
    assert not (as_parquet / "steps.csv").exists()
    steps = pd.read_csv(as_csv / "steps.csv")
    assert len(steps) > 0 and steps.equals(pd.read_parquet(as_parquet / "steps.parquet"))
    for name in {p.name for p in as_csv.iterdir()} - {"steps.csv", ".kvsim-output"}:
        assert (as_csv / name).read_bytes() == (as_parquet / name).read_bytes(), name


@pytest.mark.parametrize("fleet", [{"replicas": 1, "engine": {"data_parallel_size": 2}},
                                   {"replicas": [{"count": 1}, {"count": 1, "engine": {"data_parallel_size": 2}}]}])
def test_a_replica_given_a_data_parallel_size_is_refused(fleet):
    """A fleet of one DP-2 engine ran as one engine (every request on one pool, the summary's GPUs 1): the
    relation "a fleet of one is the engine" failed because the fleet dropped the other rank without a word."""
    raw = {**scenario(), "replicas": fleet["replicas"]}
    raw["engine"] = {**raw["engine"], **fleet.get("engine", {})}
    group = "" if isinstance(fleet["replicas"], int) else "replicas[1]: "
    with pytest.raises(KvsimError, match=rf"^{re.escape(group)}engine.data_parallel_size=2: a fleet's replicas are single engines"):
        kvsim.simulate(raw)
