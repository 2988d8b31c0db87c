"""`kvsim plan`'s verification on a finite trace: a 10x run cannot take more requests than the trace holds.

A timestamped trace's run takes at most its rows (`kvsim.workload.generate.most_requests`). Where the search's
probe already took them all, the long run at the searched count would be that probe again, to the same figures:
the plan does not run it, and says the verification is the search's run of the whole trace. The Azure hour's
`docs/autoscaling.md` example (19,366 requests) re-ran its search's run and printed "re-run with 10x the requests".
"""

import json

from kvsim.cli.plan_command import print_plan
from kvsim.planning.plan import make_plan_spec, plan
from kvsim.workload.scenario import make_scenario

NUM_ROWS = 200


def trace_fleet(tmp_path, num_requests: int):
    """A 200-row Mooncake trace, one request every 100 ms (10 req/s), 64-token prompts (one prefill step, which
    yields the first token) and 20-token replies, constant 10 ms steps, at most 4 running: one replica serves
    4 / (20 x 10 ms) = 20 req/s, so at 10 req/s about 2 are in flight and no request waits: TTFT about one step,
    far under the 0.5 s SLO, and one replica is the answer (the search starts at 1)."""
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 64, "output_length": 20,
                                        "hash_ids": [i]}) + "\n" for i in range(NUM_ROWS)))
    return make_scenario({
        "name": "trace", "steps": "none",
        "engine": {"max_num_seqs": 4, "max_model_len": 1024, "num_gpu_blocks_override": 20_000,
                   "async_scheduling": False},
        "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": num_requests, "arrival": {"process": "trace"},
                     "trace": {"format": "mooncake", "path": str(path)}}})


SPEC = {"slo": {"ttft_s.p90": 0.5}, "gpus": ["h100-80gb"], "max_replicas": 4}


def test_a_trace_the_search_took_whole_is_not_re_run_and_the_plan_says_so(tmp_path, capsys):
    """The probe asks for the trace's 200 rows; 10x would be 2,000, of which the trace holds the same 200: the
    one probe (1 replica) is the only point, and the verify_* columns are that probe's."""
    rows, simulated = plan(trace_fleet(tmp_path, NUM_ROWS), make_plan_spec(SPEC), tmp_path / "plan")
    (row,) = rows
    assert simulated == 1 and row["replicas"] == 1 and row["searched_replicas"] == 1
    assert row["verify_run"] == "search" and row["verified"] is True and row["verify_attempts"] == "1 held"
    assert row["verify_num_requests"] == row["evidence_num_requests"] == row["search_num_requests"] == NUM_ROWS
    assert row["verify_verdict"] == row["search_verdict"] == "stable"
    assert row["verify_ttft_s.p90"] == row["search_ttft_s.p90"] == row["ttft_s.p90"] <= 0.5
    print_plan(rows, "trace", tmp_path / "plan", simulated, make_plan_spec(SPEC).verify_factor, "10 req/s")
    out = capsys.readouterr().out
    assert (f"verification, {row['candidate']}: not re-run: the trace holds 200 requests and the search's run took "
            "them all, so verify_* is that run (window stable, every SLO met)") in out
    assert "re-run with 10x the requests (at most a trace's whole; not re-run where the search took it all" in out


def test_a_trace_longer_than_the_probe_is_verified_on_its_whole(tmp_path, capsys):
    """A 100-request probe of the 200-row trace: the long run asks for min(10 x 100, 200) = 200, more than the
    probe saw, so it is run: two points, verify_run "long", its 200 requests the row's evidence. That is 2x the
    probe, not the 10x the footer states: the terminal says so beside the answer (the Azure hour searched on
    3,000-request probes was verified on its 19,366 requests, 6.5x, under a bare "re-run with 10x the requests")."""
    spec = make_plan_spec(SPEC)
    rows, simulated = plan(trace_fleet(tmp_path, 100), spec, tmp_path / "plan")
    (row,) = rows
    assert simulated == 2 and row["replicas"] == 1 and row["verify_run"] == "long" and row["verified"] is True
    assert row["verify_num_requests"] == row["evidence_num_requests"] == NUM_ROWS and row["search_num_requests"] == 100
    print_plan(rows, "trace", tmp_path / "plan", simulated, spec.verify_factor, "10 req/s")
    out = capsys.readouterr().out
    assert row["requests_per_probe"] == 100
    assert (f"verification, {row['candidate']}: the long run took the trace's whole, 200 requests, 2x the search's "
            "100-request probes, not 10x: the trace holds no more;") in out
    assert "re-run with 10x the requests (at most a trace's whole;" in out


def test_a_near_miss_is_not_rerun_long_on_a_trace_the_search_took_whole(tmp_path):
    """1 replica missed p90 TTFT <= 0.5 s within noise (0.6 s, 95 % CI 0.4-0.8: its low end under the limit), 2
    met it: the near miss is rerun as long as a verification run, min(10 x probe, 200 rows). With 200-request
    probes that is 200 again, the probe itself: no rerun. With 100-request probes it is a 200-request run."""
    from kvsim.planning.replica_search import ReplicaSearch
    from kvsim.planning.spec import Candidate

    def evidence(p90: float, low: float, high: float) -> dict:
        return {"evidence": {"verdict": "stable", "ttft_s": {"p90": p90, "p90_ci": (low, high)}}}

    for probe, rerun in ((NUM_ROWS, None), (100, NUM_ROWS)):
        search = ReplicaSearch(Candidate("h100-80gb", 1), trace_fleet(tmp_path, probe), make_plan_spec(SPEC))
        search.results = {1: evidence(0.6, 0.4, 0.8), 2: evidence(0.1, 0.05, 0.2)}
        near = search._near_miss(search._traffic(probe))
        assert (None if near is None else (near[0], near[1].workload.num_requests)) == (
            None if rerun is None else (1, rerun))


def test_a_split_on_a_trace_the_search_took_whole_is_verified_by_that_run(tmp_path, capsys):
    """1P1D beside the colocated fleet on the whole 200-row trace. By hand: arrivals 0, 0.1, ..., 19.9 s; the window
    leaves out the first 20 % and the last 10 % of that span, [3.98 s, 17.91 s), 13.93 s holding the arrivals
    k = 40..179, 140 requests. A split's first token is at least a prefill step (10 ms), the KV's transfer over the
    default RDMA link (64 tokens × 128 KiB = 8,388,608 B at 50 GB/s + 20 µs = 0.188 ms) and the decode instance's
    step that samples it (10 ms): 20.188 ms; at most one decode step in progress more, 30.188 ms (a decode instance
    serves 4 / (20 × 10 ms) = 20 req/s, twice the traffic, so nothing queues longer). The split's one run took the
    whole trace (10× would be the same 200 rows): it is the verification, not re-run (two points in all, one per
    candidate), and its row's evidence, search and verify columns are that one run's."""
    spec = make_plan_spec({**SPEC, "xpyd": ["1P1D"]})
    rows, simulated = plan(trace_fleet(tmp_path, NUM_ROWS), spec, tmp_path / "plan")
    split = next(row for row in rows if row["topology"] == "1P1D")
    assert simulated == 2 and split["feasible"] and split["replicas"] == 2
    assert split["verify_run"] == "search" and split["verify_attempts"] == "2 held" and split["verified"] is True
    assert (split["verify_num_requests"] == split["evidence_num_requests"] == split["search_num_requests"]
            == split["requests_per_probe"] == NUM_ROWS)
    for column in ("verdict", "window_s", "num_in_window", "served_over_offered", "backlog_trend", "ttft_s.p90",
                   "ttft_s.p90_ci"):
        assert split[column] == split[f"search_{column}"] == split[f"verify_{column}"], column
    assert split["verdict"] == "stable" and split["num_in_window"] == 140
    assert abs(split["window_s"] - 13.93) < 1e-9
    assert 0.020188 - 1e-6 <= split["ttft_s.p90"] <= 0.030188 + 1e-6
    print_plan(rows, "trace", tmp_path / "plan", simulated, spec.verify_factor, "10 req/s")
    out = capsys.readouterr().out
    assert "evidence, h100-80gb tp1 1P1D: 1P1D (2 instances), 200-request run: stable over its window (140 " in out
    assert ("verification, h100-80gb tp1 1P1D: not re-run: the trace holds 200 requests and the search's run took "
            "them all, so verify_* is that run (window stable, every SLO met)") in out


def test_the_capped_line_counts_the_probes_not_a_near_miss_rerun():
    """Llama-3.1-70B TP8 on A100s over Mooncake's 12,031-row hour: 6,000-request probes, the count 19 a near miss
    rerun long, so its `search_num_requests` is that 12,031-request run, the long run's too. Against it the line read
    "1x the search's 12,031-request probe"; against the probes it is 12,031 / 6,000 = 2.01x. A long run of a
    trace that held 10x (60,000 of 6,000) prints no such line, nor does the search's own run of a whole trace."""
    from kvsim.cli.plan_command import trace_capped, trace_capped_line

    row = {"candidate": "a100-80gb tp8", "verify_run": "long", "verify_num_requests": 12031,
           "requests_per_probe": 6000, "search_num_requests": 12031}
    assert trace_capped(row, 10)
    assert trace_capped_line(row, 10).startswith(
        "verification, a100-80gb tp8: the long run took the trace's whole, 12,031 requests, 2.01x the search's "
        "6,000-request probes, not 10x")
    assert not trace_capped({**row, "verify_num_requests": 60000}, 10)
    assert not trace_capped({**row, "verify_run": "search"}, 10)
