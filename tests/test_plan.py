"""`kvsim plan`: the replica search agrees with brute force, and a search survives crashes.

The brute force below simulates every replica count and judges the SLOs from the per-request
table with numpy, not from the plan's own bookkeeping.
"""

import json
import math
import os
import signal

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.fleet.driver import simulate_fleet
from kvsim.model.errors import KvsimError
from kvsim.planning.bounds import GAP_PARTS
from kvsim.planning.plan import Candidate, make_plan_spec, plan
from kvsim.workload.scenario import make_scenario

runner = CliRunner()
SLO = {"ttft_s.p90": 0.3, "e2e_s.p99": 2.0}


def toy():
    # 20 ms per step whatever the batch; at most 8 running per replica; 64-token replies take
    # ≥ 1.3 s, so at 14 req/s one replica holds ~18 requests: it queues, and more replicas help.
    return make_scenario({
        "name": "toy", "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 400, "max_num_seqs": 8},
        "workload": {"num_requests": 100, "arrival": {"process": "poisson", "rate": 14.0},
                     "prompt_len": {"dist": "fixed", "value": 256}, "output_len": {"dist": "fixed", "value": 64}},
        "latency": {"model": "constant", "step_s": 0.02}, "seed": 5,
    })


def twenty_row_trace(tmp_path, num_requests):
    """The toy engine replaying `t.csv`, an Azure trace of 20 requests 0.1 s apart (10 req/s), 256 prompt and 64
    output tokens each, asking `num_requests` of it (a scenario's raw dict)."""
    rows = "".join(f"2023-11-16 18:17:{i // 10:02d}.{i % 10}00,256,64\n" for i in range(20))
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    base = toy().model_dump(mode="json")
    base["workload"] = {"num_requests": num_requests, "arrival": {"process": "trace"},
                        "trace": {"format": "azure", "path": "t.csv"}}
    return base


def meets(result):
    r = result.requests
    return (np.percentile(r["ttft_s"], 90) <= SLO["ttft_s.p90"]
            and np.percentile(r["e2e_s"], 99) <= SLO["e2e_s.p99"])


def test_plan_finds_the_replica_count_brute_force_finds(tmp_path):
    base = toy()
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8, "router": "least_outstanding",
                           "gpu_hourly_cost": {"h100-80gb": 2.0}})
    candidate = Candidate("h100-80gb", 1)
    brute = next(n for n in range(1, 9) if meets(simulate_fleet(candidate.scenario(base, n, spec.router))))
    assert brute > 1  # the toy needs a fleet, else the search is not exercised
    rows, simulated = plan(base, spec, tmp_path / "plan")
    assert rows[0]["replicas"] == brute and rows[0]["cost_per_hour"] == pytest.approx(2.0 * brute)
    assert rows[0]["headroom"] >= 0 and f"at {brute - 1} replicas" in rows[0]["limiting_factor"]
    assert simulated <= 2 * 3 + 1  # doubling to 8 then bisection: far fewer than 8 counts
    again, simulated_again = plan(base, spec, tmp_path / "plan")
    assert simulated_again == 0 and again == rows


TWO_GPUS = {"slo": SLO, "gpus": ["h100-80gb", "h200"], "max_replicas": 8}


@pytest.fixture(scope="module")
def two_gpu_plan(tmp_path_factory):
    """The uninterrupted plan of `toy()` over two GPU kinds: (its rows, the number of points it simulated), which
    the crash tests below compare with; computed once for the module (a plan is a function of its inputs)."""
    return plan(toy(), make_plan_spec(TWO_GPUS), tmp_path_factory.mktemp("two_gpu_plan") / "plan")


def test_an_interrupted_search_resumes_without_redoing_finished_points(tmp_path, two_gpu_plan):
    base = toy()
    spec = make_plan_spec(TWO_GPUS)
    full, total = two_gpu_plan

    def crash_after_two(finished, simulated, *_):
        if simulated == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        plan(base, spec, tmp_path / "cut", on_point=crash_after_two)
    assert len((tmp_path / "cut" / "points.jsonl").read_text().splitlines()) == 2
    with (tmp_path / "cut" / "points.jsonl").open("a") as f:
        f.write('{"hash": "torn')  # a line cut short by the crash is ignored
    rows, simulated = plan(base, spec, tmp_path / "cut")
    assert simulated == total - 2 and rows == full


def test_killing_a_dask_worker_mid_search_loses_no_finished_point(tmp_path, two_gpu_plan):
    distributed = pytest.importorskip("dask.distributed")
    base = toy()
    spec = make_plan_spec(TWO_GPUS)
    expected, total = two_gpu_plan
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
        pids = client.run(os.getpid)
        killed = []

        def kill_one(finished, simulated, *_):
            if not killed:
                victim = sorted(pids)[0]
                os.kill(pids[victim], signal.SIGKILL)
                killed.append(victim)

        rows, simulated = plan(base, spec, tmp_path / "dask", client=client, on_point=kill_one)
    assert killed and simulated == total and rows == expected
    lines = [json.loads(line) for line in (tmp_path / "dask" / "points.jsonl").read_text().splitlines()]
    assert len(lines) == total == len({line["hash"] for line in lines})
    rows, simulated = plan(base, spec, tmp_path / "dask")
    assert simulated == 0 and rows == expected


def test_bad_plan_input_is_one_line_naming_the_field(tmp_path):
    with pytest.raises(KvsimError, match="ttft.p90"):
        make_plan_spec({"slo": {"ttft.p90": 1.0}, "gpus": ["h100-80gb"]})
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "engine": {"max_num_seqs": [0]}})
    with pytest.raises(KvsimError, match="max_num_seqs"):
        plan(toy(), spec, tmp_path / "plan")
    assert not (tmp_path / "plan").exists()  # refused before its folder is made
    result = runner.invoke(app, ["plan", "--slo", "ttft_s.p90=fast", "--gpu", "h100-80gb", "--workers", "1",
                                 "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "ttft_s.p90" in result.stderr and "Traceback" not in result.output


def test_plan_command_writes_the_ranked_table_and_figure(tmp_path):
    scenario = tmp_path / "toy.yaml"
    scenario.write_text(json.dumps(toy().model_dump(mode="json")))
    out = tmp_path / "plan"
    result = runner.invoke(app, ["plan", str(scenario), "--slo", "ttft_s.p90=0.3", "--slo", "e2e_s.p99=2",
                                 "--gpu", "h100-80gb", "--engine", "max_num_seqs=4,8", "--max-replicas", "8",
                                 "--gpu-hourly-cost", "h100-80gb=2", "--workers", "1", "-o", str(out),
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["max_num_seqs"] for r in rows] and all(r["feasible"] for r in rows)
    assert rows[0]["cost_per_hour"] <= rows[1]["cost_per_hour"]
    for name in ("plan.csv", "plan.json", "plan.md", "pareto.png", "points.jsonl"):
        assert (out / name).stat().st_size > 0
    for r in rows:  # the gap's parts, from the run behind the answer, add up to the replicas chosen
        assert sum(r[f"gap_{k}"] for k in GAP_PARTS) == pytest.approx(r["replicas"])
        # one floor, the long run's: the lower bound is its count, and idle replicas are never fewer than none
        assert r["lower_bound_replicas"] == max(1, math.ceil(max(r["gap_compute_floor"], r["gap_kv_floor"])))
        assert r["gap_idle"] >= 0
        assert r["gap_breakdown"].startswith(f"{r['replicas']} replicas = compute floor ")


def test_rate_search_sizes_the_fleet_that_a_brute_force_rate_sweep_sizes(tmp_path):
    """One replica at 14·f req/s for f on a 1 % grid, judged from its requests with numpy: the
    highest passing f gives ceil(1.1 / f) replicas (10 % capacity headroom); the plan's bisection
    on f must land on the same count."""
    base = toy()
    grid = [round(0.25 + 0.01 * i, 2) for i in range(21)]
    passes = []
    for f in grid:
        raw = base.model_dump(mode="json")
        raw["workload"]["arrival"]["rate"] = 14.0 * f
        passes.append(meets(simulate_fleet(make_scenario({**raw, "replicas": 1}))))
    first_fail = passes.index(False)
    assert first_fail > 0 and not any(passes[first_fail:])  # monotone on the grid, and the grid brackets it
    expected = math.ceil(1.1 / grid[first_fail - 1])
    assert expected == math.ceil(1.1 / grid[first_fail]) > 1  # not on a boundary between two counts
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8, "search": "rate",
                           "capacity_headroom": 0.1, "rel_tol": 0.02, "gpu_hourly_cost": {"h100-80gb": 3.0}})
    rows, simulated = plan(base, spec, tmp_path / "plan")
    row = rows[0]
    assert row["replicas"] == expected and row["cost_per_hour"] == pytest.approx(3.0 * expected)
    assert row["headroom"] >= 0 and row["capacity_headroom"] >= 0.1
    assert "per replica" in row["limiting_factor"]
    # every point is a probe of the converging search (the run doubled until f moved < 2 %) or a 10x long run:
    # the chosen fleet's, then one replica fewer on 1.1x the traffic, which fails (the count is the fewest)
    assert row["verify_attempts"] == f"{expected} held, {expected - 1} failed*"
    assert simulated == row["num_probes"] + 2 and (row["converged"] or row["capped"])
    again, simulated_again = plan(base, spec, tmp_path / "plan")
    assert simulated_again == 0 and again == rows


def test_rate_search_refuses_a_fleet_no_replica_count_can_serve(tmp_path):
    # A TTFT SLO just over one step time (20 ms): a request arriving mid-step waits for that step to end, so at
    # any load the p90 is near two steps; no load is light enough, and no fleet meets it. (Below one step, the
    # floor refuses it before any search: `tests/test_metamorphic11.py`.)
    spec = make_plan_spec({"slo": {"ttft_s.p90": 0.021}, "gpus": ["h100-80gb"], "max_replicas": 4, "search": "rate"})
    rows, _ = plan(toy(), spec, tmp_path / "plan")
    assert rows[0]["feasible"] is False and rows[0]["replicas"] is None
    assert "over 4 replicas" in rows[0]["limiting_factor"]


def test_rate_search_lengthens_a_probe_too_short_to_judge_instead_of_failing_it():
    """A probe whose window is too short says nothing about its fraction (`kvsim.planning.window`): the
    same fraction must be run again with twice the requests. The rate search kept each probe's whole
    metrics, whose verdict sits under `evidence`, so it counted every too-short probe as a failure and
    halved the fraction (lab-2 at 20 req/s on L4s: 1, 0.5, 0.25, 0.125 'failed' at 400 requests)."""
    from kvsim.planning.plan_rate import RateSearch

    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8, "search": "rate",
                           "probe_requests": 100})
    search = RateSearch(Candidate("h100-80gb", 1), toy(), spec)
    first = search.next_scenario()
    assert first.workload.num_requests == 100 and first.workload.arrival.rate == pytest.approx(14.0)
    search.observe({"evidence": {"verdict": "too short"}})
    again = search.next_scenario()
    assert again.workload.num_requests == 200 and again.workload.arrival.rate == pytest.approx(14.0)


def test_rate_search_reports_the_rate_its_probe_offered_one_replica(tmp_path):
    """Seed 0's first 100 arrivals offer 11.8 req/s of the 14 asked for; the probes run longer and offer
    about 14 · f. `rate_per_replica` was f times the base's 11.8, 10-20 % under what the replica sustained.
    Expected here: the passing probe's own arrivals, (n − 1) / span of the first n requests at 14 req/s
    (numpy over the generated instants), times f (arrivals 1/f further apart); f = (1 + spare) / replicas."""
    from kvsim.workload.generate import build_requests

    raw = toy().model_dump(mode="json")
    raw["seed"] = 0
    base = make_scenario(raw)
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8, "search": "rate",
                           "verify_factor": 0})
    (row,) = plan(base, spec, tmp_path / "plan")[0]
    assert row["feasible"]
    fraction = (1 + row["capacity_headroom"]) / row["replicas"]

    def own_rate(num_requests):
        probe = make_scenario({**raw, "workload": {**raw["workload"], "num_requests": num_requests}})
        arrivals = np.array([r.arrival_s for r in build_requests(probe, 2048, np.random.default_rng(0))])
        return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])

    assert own_rate(100) < 12.0  # the base's own sample is sparse: f times it is not what a probe offers
    expected = fraction * own_rate(row["requests_per_probe"])
    assert row["rate_per_replica"] == pytest.approx(expected, rel=1e-9)
    assert abs(row["rate_per_replica"] / (fraction * own_rate(100)) - 1) > 0.05


def test_probes_too_short_at_max_probe_requests_say_the_run_was_not_judged(tmp_path):
    """20 requests a probe is under the window's 50-request minimum (`kvsim.planning.window`) at any replica count,
    and max_probe_requests=20 forbids the doubling: no count is judged (1, 2, 4 replicas are tried, max_replicas=4),
    and the row says so, not that the GPU cannot serve the traffic."""
    base = toy().model_dump(mode="json")
    base["workload"]["num_requests"] = 20
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 4, "max_probe_requests": 20})
    rows, simulated = plan(make_scenario(base), spec, tmp_path / "plan")
    assert simulated == 3 and not rows[0]["feasible"]
    assert rows[0]["limiting_factor"] == ("could not be judged: its 20-request probes were too short up to 4 replicas; "
                                          "raise max_probe_requests (now 20)")


def test_probes_too_short_on_a_trace_shorter_than_asked_blame_the_trace_not_the_cap(tmp_path):
    """A 20-row trace, 40 requests asked a probe: every probe runs the trace's 20 (under the window's 50-request
    minimum), and no longer probe can run more, so raising max_probe_requests (50: the doubling to 80 is over it)
    would change nothing. The row said "its 40-request probes ... raise max_probe_requests (now 50)"."""
    base = twenty_row_trace(tmp_path, num_requests=40)
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 2, "max_probe_requests": 50})
    rows, simulated = plan(make_scenario(base, tmp_path), spec, tmp_path / "out")
    assert simulated == 2 and not rows[0]["feasible"]  # 1 and 2 replicas, neither judged
    assert rows[0]["limiting_factor"] == ("could not be judged: its probes ran only 20 requests (40 asked: the trace "
                                          "holds no more) and were too short up to 2 replicas")


def test_an_slo_missed_at_every_count_shows_how_little_doubling_the_fleet_moved_it(tmp_path):
    """Prompts of 256 tokens in chunks of at most 64 (max_num_batched_tokens), 20 ms steps, synchronous scheduling:
    every first token comes after at least ceil(256 / 64) = 4 steps, 0.08 s, at any fleet size (prefix caching on,
    so the proved floor is one step and p90 TTFT <= 0.07 s is searched, not refused). Doubling 1, 2, 4, 8 replicas
    misses at each (1 and 2 overloaded, 4 and 8 stable); the row said only "misses ttft_s.p90 even at 8 replicas",
    as if 16 might do. It now gives the value at the two largest counts, both stable, each >= 0.08 s by the
    argument above."""
    import re

    raw = toy().model_dump(mode="json")
    raw["engine"].update(max_num_batched_tokens=64, async_scheduling=False)
    spec = make_plan_spec({"slo": {"ttft_s.p90": 0.07}, "gpus": ["h100-80gb"], "max_replicas": 8})
    (row,), _ = plan(make_scenario(raw), spec, tmp_path / "plan")
    found = re.fullmatch(r"misses ttft_s\.p90 even at 8 replicas \(both stable: ttft_s\.p90 ([0-9.]+) s at 4, "
                         r"([0-9.]+) s at 8 replicas, limit 0\.07 s\)", row["limiting_factor"])
    assert found, row["limiting_factor"]
    assert float(found[2]) == pytest.approx(row["ttft_s.p90"], rel=1e-3)
    assert min(float(found[1]), float(found[2])) >= 4 * 0.02


def test_a_probe_that_took_the_whole_trace_is_not_doubled(tmp_path):
    """A 20-row trace, 20 requests asked a probe (exactly its rows, as `scenarios/mooncake-conv-replay.yaml` asks
    its 1,500): every probe is under the window's 50-request minimum, too short. Doubling to 40 would run the same
    20 rows again, to the same figures: it ran them (3 points: 1 replica at 20, again at "40", 2 replicas at "40")
    and the row said `requests_per_probe` 40 of a trace of 20. By hand: 1 and 2 replicas once each at 20, the
    answer unjudged and the trace named, not max_probe_requests."""
    base = twenty_row_trace(tmp_path, num_requests=20)
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 2, "max_probe_requests": 50})
    rows, simulated = plan(make_scenario(base, tmp_path), spec, tmp_path / "out")
    assert simulated == 2 and not rows[0]["feasible"] and rows[0]["requests_per_probe"] == 20
    assert rows[0]["limiting_factor"] == ("could not be judged: its probes ran the trace's whole, 20 requests, and "
                                          "were too short up to 2 replicas")


def test_a_rate_search_on_a_trace_shorter_than_asked_blames_the_trace(tmp_path):
    """The rate search's unjudged row names the requests its probe was asked (40: probe_requests) beside those it
    ran (the trace's 20), as the replica search's does (`failing_probe`: the short search's level, not the run)."""
    import re

    base = twenty_row_trace(tmp_path, num_requests=40)
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 2, "max_probe_requests": 50,
                           "search": "rate", "probe_requests": 40})
    rows, _ = plan(make_scenario(base, tmp_path), spec, tmp_path / "out")
    assert not rows[0]["feasible"]
    assert re.fullmatch(r"could not be judged: its probes ran only 20 requests \(40 asked: the trace holds no more\) "
                        r"and were too short at [0-9.]+ req/s per replica", rows[0]["limiting_factor"])


def test_a_rate_search_probe_that_took_the_whole_trace_is_not_doubled(tmp_path):
    """The rate search's rule is the replica search's (`Verification.holds_more`): a 20-row trace, 20 requests a
    probe (its rows exactly), room to double to 40 (max_probe_requests 50). Each probe is under the window's
    50-request minimum, too short; doubling would run the same 20 rows again (it did: `requests_per_probe` 40 of a
    trace of 20, and 5 points). By hand: one level of 20 requests, the fraction halving from 1 while its probes
    fail, 1, 0.5, 0.25, 0.125, the last under the search's floor of spare / max_replicas = 1.1 / 8 (ends it): 4
    points, the row unjudged with the trace's whole named, not max_probe_requests."""
    base = twenty_row_trace(tmp_path, num_requests=20)
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8, "max_probe_requests": 50,
                           "search": "rate", "probe_requests": 20})
    rows, simulated = plan(make_scenario(base, tmp_path), spec, tmp_path / "out")
    assert simulated == 4 and not rows[0]["feasible"] and rows[0]["requests_per_probe"] == 20
    assert rows[0]["limiting_factor"] == ("could not be judged: its probes ran the trace's whole, 20 requests, and "
                                          "were too short at 1.25 req/s per replica")


def test_a_rate_search_whose_probes_stay_too_short_says_the_run_was_not_judged(tmp_path):
    """The rate search counts a probe still too short at its longest (20 requests, under the window's 50, and
    max_probe_requests=20 forbids the doubling) as failed: the row said "over 4 replicas; is too short at R req/s
    per replica: over capacity (queueing)", claims no run made. It says it could not be judged, as the replica
    search does."""
    import re

    base = toy().model_dump(mode="json")
    base["workload"]["num_requests"] = 20
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 4, "max_probe_requests": 20,
                           "search": "rate", "probe_requests": 20})
    rows, _ = plan(make_scenario(base), spec, tmp_path / "plan")
    assert not rows[0]["feasible"] and rows[0]["verdict"] == "too short"
    assert re.fullmatch(r"could not be judged: its 20-request probes were too short at [0-9.]+ req/s per replica; "
                        r"raise max_probe_requests \(now 20\)", rows[0]["limiting_factor"]), rows[0]["limiting_factor"]
