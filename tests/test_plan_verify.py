"""`kvsim plan` rows carry their evidence: the window, a 10× verification run, the floor and the price."""

import json

import pytest

from kvsim.planning.cost import gpu_price
from kvsim.planning.plan import make_plan_spec, plan
from kvsim.report.build import held_rate_per_s
from tests.test_plan import SLO, toy


@pytest.mark.parametrize("search", ["replicas", "rate"])
def test_rows_carry_window_evidence_a_long_verification_run_and_the_floor(tmp_path, search):
    first = {"probe_requests": 100} if search == "rate" else {}  # a replica search's probe: the toy's 100 requests
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8, "search": search,
                           "max_probe_requests": 400, **first})
    (row,) = plan(toy(), spec, tmp_path / "plan")[0]
    assert row["feasible"] and row["verdict"] == "stable"
    # the toy's workload has 100 requests; a rate-search probe 100, then 200 and 400 as it converges (capped there:
    # uncapped it went on to 800, and its long runs to 8,000 requests, which none of these checks needs)
    probe = 100
    assert spec.verify_factor == 10 and row["verify_num_requests"] >= spec.verify_factor * probe
    assert row["verified"] in (True, False) and row["verify_verdict"] in ("stable", "backlogged", "overloaded")
    assert "ttft_s.p90_ci" in row and "verify_ttft_s.p90" in row and "search_ttft_s.p90" in row
    if row["verified"]:  # the window columns are the run behind the answer: its long run
        assert row["ttft_s.p90"] == row["verify_ttft_s.p90"] and row["evidence_num_requests"] == row["verify_num_requests"]
    assert 1 <= row["lower_bound_replicas"] <= row["replicas"]
    assert row["replicas_over_bound"] == pytest.approx(row["replicas"] / row["lower_bound_replicas"], rel=1e-3)
    price = gpu_price("h100-80gb")  # no --gpu-hourly-cost: the shipped list price
    assert row["cost_per_hour"] == pytest.approx(row["num_gpus"] * price.usd_per_gpu_hour)
    assert row["price_source"] == price.source and "as of" in price.source


def test_tp_counts_in_gpus_and_cost(tmp_path):
    # a verification run as long as a probe (verify_factor 1, not 10): the counts hold whatever fleet it confirms,
    # in a quarter of the time
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "tensor_parallel_sizes": [2], "max_replicas": 8,
                           "gpu_hourly_cost": {"h100-80gb": 2.0}, "verify_factor": 1})
    (row,) = plan(toy(), spec, tmp_path / "plan")[0]
    assert row["num_gpus"] == 2 * row["replicas"] and row["cost_per_hour"] == pytest.approx(4.0 * row["replicas"])


def dd_fleet(num_requests: int):
    """D/D/c: evenly spaced arrivals at 40.2 req/s, round robin, constant 10 ms steps, 64-token prompts
    (one step, which also yields the first token), 20-token replies, at most 4 running per replica.
    Each step is planned when it starts (no async scheduling, which would hold a finished request's
    slot one step longer: `tests/test_steady_state.py` has that capacity)."""
    from kvsim.workload.scenario import make_scenario

    return make_scenario({
        "name": "ddc", "steps": "none", "router": {"policy": "round_robin"},
        "engine": {"max_num_seqs": 4, "max_model_len": 1024, "num_gpu_blocks_override": 20_000,
                   "async_scheduling": False},
        "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": num_requests, "arrival": {"process": "constant", "rate": 40.2},
                     "prompt_len": {"dist": "fixed", "value": 64}, "output_len": {"dist": "fixed", "value": 20}}})


@pytest.fixture(scope="module")
def ddc_plan(tmp_path_factory) -> tuple[str, str]:
    """`kvsim plan` of `dd_fleet(400)` at p90 TTFT <= 0.2 s on up to 8 round-robin replicas, run once for the two
    tests below (each ran it): the terminal's text and plan.json's, immutable (each test parses its own rows).
    Module-scoped, so one xdist worker runs this module's tests (tests/conftest.py)."""
    import yaml
    from typer.testing import CliRunner

    from kvsim.cli import app

    folder = tmp_path_factory.mktemp("ddc_plan")
    scenario = folder / "ddc.yaml"
    scenario.write_text(yaml.safe_dump(dd_fleet(400).model_dump(mode="json")))
    out = folder / "plan"
    result = CliRunner().invoke(app, ["plan", str(scenario), "--slo", "ttft_s.p90=0.2", "--gpu", "h100-80gb",
                                      "--max-replicas", "8", "--router", "round_robin", "--workers", "1",
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    return result.output, (out / "plan.json").read_text()


def test_a_fleet_the_short_probe_flatters_is_re_searched_in_long_runs(ddc_plan):
    """A replica holds a request in one of its 4 slots for 20 steps: capacity 4 / (20 · 10 ms) = 20 req/s.
    Two replicas get 20.1 req/s each, 0.5 % over: the backlog grows by 0.1 request a second, under the
    1 % trend tolerance, so only the waits tell. A request arriving t s into the run waits about
    0.1·t / 20 = t / 200 s. The window's p90 arrival sits at about 0.83 of the arrival span (window
    [0.2, 0.9) of it): with 400 requests (span 10 s) p90 TTFT ≈ 0.04 s + a step or two, within 0.2 s;
    with 4,000 (100 s) ≈ 0.41 s, over it. One replica (40.2 req/s on 20) is overloaded; three (13.4 each)
    never queue. So the probes choose 2, the 10× run refuses 2, and the next count, 3, holds. (The plan is the
    next test's, run once for both: `ddc_plan`.)"""
    (row,) = json.loads(ddc_plan[1])
    assert row["searched_replicas"] == 2 and row["replicas"] == 3 and row["verified"] is True
    assert row["verify_attempts"] == "2 failed, 3 held" and row["verify_num_requests"] == 4000
    # three replicas never queue: TTFT is the wait for the next step boundary (< 10 ms) plus one 10 ms step
    assert row["verify_ttft_s.p90"] <= 0.02 + 1e-9
    assert "in the long run at 2 replicas" in row["limiting_factor"]


def test_a_moved_answer_shows_its_own_runs_window_in_the_files_and_the_terminal(ddc_plan):
    """The same D/D/c fleet: the answer, 3 replicas, rests on its 4,000-request run (never queues: TTFT at most
    a step boundary plus one step, 0.02 s), not on the 400-request probe of 2 replicas that the long run
    refuted (waits of about t / 200 s at t s into the run, p90 arrival near 8.3 s: 0.04 s plus a step or two,
    within 0.03..0.2). The row's window columns, its headroom and the printed evidence line are the long
    run's; the probe's are `search_*`."""
    output, plan_json = ddc_plan
    (row,) = json.loads(plan_json)
    assert (row["searched_replicas"], row["replicas"]) == (2, 3)
    assert row["evidence_num_requests"] == row["verify_num_requests"] == 4000 and row["search_num_requests"] == 400
    assert row["ttft_s.p90"] == row["verify_ttft_s.p90"] <= 0.02 + 1e-9 and row["verdict"] == "stable"
    assert row["num_in_window"] == row["verify_num_in_window"] and row["window_s"] == row["verify_window_s"]
    assert 0.03 < row["search_ttft_s.p90"] <= 0.2 and row["search_verdict"] == "stable"
    assert row["headroom"] == pytest.approx(1 - row["ttft_s.p90"] / 0.2)
    line = next(text for text in output.splitlines() if text.startswith("evidence, "))
    assert line.startswith("evidence, h100-80gb tp1: 3 replicas, 4,000-request run: stable")
    assert f"ttft_s.p90 {row['ttft_s.p90']:.4g} (95 % CI {row['ttft_s.p90_ci']})" in line
    assert f"probe of 2 replicas (400 requests): ttft_s.p90 {row['search_ttft_s.p90']:.4g}" in line


@pytest.mark.parametrize("search", ["replicas", "rate"])
def test_cost_per_million_tokens_is_priced_at_the_steady_state_output_rate(tmp_path, search):
    """One replica, no queue: 400 evenly spaced arrivals at 40 req/s, 50-token replies, 10 ms a step whatever
    the batch, up to 64 running (a request holds a slot ~0.51 s, so ~21 run at once, under 64). In steady
    state the replica serves λ · O = 40 · 50 = 2,000 output tokens/s, so at $2 a GPU-hour a million output
    tokens cost 2 / (2,000 · 3,600) · 10^6 = $0.2778. The whole run's rate is lower: 400 · 50 tokens over
    first arrival → last finish, 399 / 40 + ~0.51 s = 10.49 s, is 1,907 tokens/s ($0.2913, 4.9 % more),
    because it counts the drain after the last arrival. The window (20 % of the 9.975 s span left out at
    the start, 10 % at the end: 6.98 s, 279 or 280 finishes) gives 2,000 within 0.4 %. The rate search with
    no long run (verify_factor 0) has only its one-replica probe at 1.1× the traffic (44 req/s, 2,200 tokens/s);
    the fleet serves all of the traffic: 2,000 tokens/s and the same price. It gave no price at all."""
    from kvsim.workload.scenario import make_scenario

    base = make_scenario({
        "name": "steady-tokens", "steps": "none",
        "engine": {"max_num_seqs": 64, "max_model_len": 1024, "num_gpu_blocks_override": 20_000,
                   "async_scheduling": False},
        "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": 400, "arrival": {"process": "constant", "rate": 40.0},
                     "prompt_len": {"dist": "fixed", "value": 64}, "output_len": {"dist": "fixed", "value": 50}}})
    spec = make_plan_spec({"slo": {"ttft_s.p90": 0.1}, "gpus": ["h100-80gb"], "max_replicas": 4, "search": search,
                           "verify_factor": 0, "gpu_hourly_cost": {"h100-80gb": 2.0}})
    (row,) = plan(base, spec, tmp_path / "plan")[0]
    assert row["replicas"] == 1 and row["cost_per_hour"] == pytest.approx(2.0)
    assert row["output_tokens_per_s"] == pytest.approx(40.0 * 50, rel=0.005)
    assert row["usd_per_million_output_tokens"] == pytest.approx(2.0 / (40.0 * 50 * 3600) * 1e6, rel=0.005)


def kv_fill(rate: float):
    """One 10 ms step whatever it carries, at most 8 running, 256-token prompts and 64-token replies, a pool of
    150 blocks of 16 tokens (149 usable: v1 keeps block 0 back), Poisson arrivals at `rate`."""
    from kvsim.workload.scenario import make_scenario

    return make_scenario({
        "name": "kvfill", "steps": "none", "seed": 3,
        "engine": {"max_num_seqs": 8, "max_model_len": 2048, "num_gpu_blocks_override": 150,
                   "async_scheduling": False},
        "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": 400, "arrival": {"process": "poisson", "rate": rate},
                     "prompt_len": {"dist": "fixed", "value": 256}, "output_len": {"dist": "fixed", "value": 64}}})


def test_an_overloaded_fleet_that_preempts_is_over_capacity_not_short_of_kv(tmp_path):
    """At 16 req/s the floor binds on compute: a request costs 256 · 0.01 / 8192 + 64 · 0.01 / 8 = 0.0803 s
    of a replica (a full 8,192-token chunk, a full 8-sequence decode step), 16 · 0.0803 = 1.285 replicas,
    against the KV floor's 16 · 0.01 · 63 · (256 + 32) / (149 · 16) = 1.218. One replica serves at most 8
    requests per 64 steps (each holds a slot from its prefill step to its 64th token): 12.5 req/s, under
    0.95 · 16, so it is overloaded; its 8 full slots then grow to 8 · 20 = 160 blocks > 149, so it preempts.
    Two replicas (8 req/s each) keep up. The label at one replica must not blame KV memory."""
    spec = make_plan_spec({"slo": {"ttft_s.p90": 0.5}, "gpus": ["h100-80gb"], "max_replicas": 4})
    (row,) = plan(kv_fill(16.0), spec, tmp_path / "plan")[0]
    assert row["replicas"] == 2 and row["bound_binds"] == "compute" and row["lower_bound_replicas"] == 2
    assert row["limiting_factor"].startswith("is overloaded at 1 replica: over capacity (preempting")
    assert "KV memory" not in row["limiting_factor"]


@pytest.mark.parametrize(("verdict", "num_preemptions", "label"), [
    ("stable", 5, "KV memory (preempting while it keeps up)"),
    ("stable", 0, "compute (queueing)"),
    ("overloaded", 5, "over capacity (preempting: an overloaded batch fills the KV whatever binds)"),
    ("backlogged", 5, "over capacity (preempting: an overloaded batch fills the KV whatever binds)"),
    ("overloaded", 0, "over capacity (queueing)"),
])
def test_the_shortage_named_follows_whether_the_run_kept_up(verdict, num_preemptions, label):
    from kvsim.planning.slo import shortage

    assert shortage({"verdict": verdict}, num_preemptions) == label


def test_the_terminal_says_what_share_of_the_traffic_a_feasible_fleet_never_serves(capsys, tmp_path):
    """Requests over max_model_len are counted apart from the SLOs: lab-2 with prompts of mean 1,000 tokens
    refused 37 % of its requests while the table and 'chosen:' read as the whole traffic served."""
    from kvsim.cli.plan_command import print_plan

    row = {"rank": 1, "candidate": "l4 tp1", "topology": "colocated", "feasible": True, "memory_limited": False,
           "replicas": 6, "num_gpus": 6, "cost_per_hour": 4.68, "price_source": "given", "rejected_fraction": 0.375}
    print_plan([row], "lab", tmp_path, 0, 10, "10 req/s")
    out = capsys.readouterr().out
    assert "refused, l4 tp1: 37.5% of the requests can never be served" in out
    print_plan([{**row, "rejected_fraction": 0.0}], "lab", tmp_path, 0, 10, "10 req/s")
    assert "refused" not in capsys.readouterr().out



@pytest.mark.parametrize(("verify_factor", "said"), [
    (2, "verify_* columns: each chosen fleet re-run with 2x the requests, one replica more while that long run fails"),
    (0, "verify_* columns: none: verify_factor is 0, no chosen fleet re-run"),
])
def test_the_terminal_states_the_verify_factor_the_plan_ran(capsys, tmp_path, verify_factor, said):
    """The last line said 'each chosen fleet re-run with 10x the requests' whatever the spec's `verify_factor`:
    with 2 the long runs took 2x a probe's requests, with 0 none ran (`PlanSpec.verify_factor`)."""
    from kvsim.cli.plan_command import print_plan

    row = {"rank": 1, "candidate": "l4 tp1", "topology": "colocated", "feasible": False, "memory_limited": False,
           "price_source": "given"}
    print_plan([row], "lab", tmp_path, 0, verify_factor, "10 req/s")
    assert capsys.readouterr().out.rstrip().endswith(said)

def single_slot_fleet(name: str, num_requests: int, rate_per_s: float, output_tokens: int):
    """Single-slot replicas behind round robin, each request `output_tokens` steps of 10 ms (its prefill step yields
    the first token; 10: S = 0.1 s), Poisson arrivals: M/D/c with equal service times (`tests/test_steady_state.py`)."""
    from kvsim.workload.scenario import make_scenario

    return make_scenario({
        "name": name, "steps": "none", "router": {"policy": "round_robin"},
        "engine": {"max_num_seqs": 1, "max_model_len": 1024, "num_gpu_blocks_override": 20_000},
        "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": rate_per_s},
                     "prompt_len": {"dist": "fixed", "value": 64},
                     "output_len": {"dist": "fixed", "value": output_tokens}}})


def test_a_rate_search_answer_is_the_fleet_that_held_not_the_linear_bound(tmp_path):
    """Single-slot replicas behind round robin (each request 10 steps of 10 ms: S = 0.1 s), Poisson arrivals at
    30 req/s, p90 TTFT <= 0.25 s, capacity_headroom 0.1. Round robin with equal service times is M/D/c's
    first-come order (`tests/test_steady_state.py`), and the naive M/D/c queue (bisected offline on 200,000
    arrivals) meets the SLO up to 6.35 req/s on one replica, 25.7 on three, 35.7 on four: the one-replica search
    implies ceil(1.1 · 30 / 6.35) = ceil(5.2) = 6 replicas, but four hold 1.1 · 30 = 33 req/s (M/D/4 at rho
    0.825: p90 TTFT 0.147 s) and three cannot (capacity 30 < 33: overloaded). The answer was 6 (4 GPUs more);
    the fleet's long runs now step down while they hold: 4, with 3 failed. Without long runs (verify_factor 0)
    the row says its count is the linear bound. Long runs of 3x the longest probe (6,000 requests: probes of
    500 to 2,000 find one replica's rate as 1,000 to 4,000 did, 6.18 against 6.17 req/s, the same 6 replicas)
    suffice to judge both counts: three is 10 % over its capacity (3 req/s of backlog over a ~130 s window,
    ~380 requests, against a margin of ~2 · √4,200 ≈ 130), four 0.1 s inside the SLO. The plan
    without long runs reads the probes from the first plan's folder (a point is a function of its scenario) and
    simulates nothing.

    Run as the same queues in a tenth of the time: 1-token requests (S = one 10 ms step) at 300 req/s. The seed's
    arrivals are the 30 req/s ones scaled by 1/10, so every wait is a tenth, TTFT = wait ÷ 10 + 0.01 s, and the
    SLO is (0.25 − 0.01) ÷ 10 + 0.01 = 0.034 s: each probe and long run passes or fails as its 10-token twin
    (checked: the same 24 runs, probes, verify attempts, idle and output rate; the twin's TTFT p90 0.14830 s,
    here 0.023830 = (0.14830 − 0.01) ÷ 10 + 0.01), for 55 % of the CPU. The figures below are the 10-token ones
    carried over: rates × 10, the TTFT p90 and its tolerance as a tenth of the wait."""
    base = single_slot_fleet("pool", 500, 300.0, output_tokens=1)
    settings = {"slo": {"ttft_s.p90": 0.034}, "gpus": ["h100-80gb"], "max_replicas": 8, "search": "rate",
                "router": "round_robin", "probe_requests": 500, "max_probe_requests": 2000}
    (row,) = plan(base, make_plan_spec({**settings, "verify_factor": 3}), tmp_path / "plan")[0]
    assert row["searched_replicas"] >= 5 and row["replicas"] == 4 and row["verified"] is True
    assert row["verify_attempts"].endswith("4 held*, 3 failed*") and row["capacity_headroom"] == 0.1
    assert row["verify_ttft_s.p90"] == pytest.approx((0.147 - 0.01) / 10 + 0.01, abs=0.003)
    assert row["ttft_s.p90"] == row["verify_ttft_s.p90"]
    assert "4 replicas held 1.1× the traffic" in row["limiting_factor"]
    # floor and gap are that long run's, on 1.1× the traffic, at the rate λ it served: a request is priced at
    # w_min = 64 · τ/8192 + 1 · τ/1 (a full chunk, a one-sequence step for its token) and takes exactly 1 step of
    # τ, so the replicas step λ · 0.01 on average (compute floor + batching) and idle is the rest of the 4
    w_min = 64 * 0.01 / 8192 + 1 * 0.01
    rate = row["gap_compute_floor"] / w_min
    assert rate == pytest.approx(330.0, rel=0.04)  # 1.1 × 300 req/s (6,000 Poisson arrivals: ±1.3 % a deviation)
    assert row["gap_compute_floor"] + row["gap_batching"] == pytest.approx(rate * 0.01)
    assert row["gap_idle"] == pytest.approx(4 - rate * 0.01) and row["lower_bound_replicas"] == 4
    # the fleet serves the traffic, 300 req/s × 1 output token = 300 tokens/s (the long run behind the answer
    # served 1.1× that: 330, which priced each token 1/1.1 of its cost); ~4,200 window arrivals (6,000 requests less
    # the first 20 % and last 10 %): ~1.5 % noise
    assert row["output_tokens_per_s"] == pytest.approx(300, rel=0.05)
    if row["usd_per_million_output_tokens"] is not None:
        assert row["usd_per_million_output_tokens"] == pytest.approx(
            row["cost_per_hour"] / (row["output_tokens_per_s"] * 3600) * 1e6)
    # the Pareto figure's rate is what the four were seen to hold: 1.1 × 300 req/s over the long run's window, not
    # 4 × one replica's ~62 req/s (~247, under the traffic itself), which it plotted before
    assert held_rate_per_s(row) == pytest.approx(330.0, rel=0.04)
    assert row["replicas"] * row["rate_per_replica"] < 300
    (row,), simulated = plan(base, make_plan_spec({**settings, "verify_factor": 0}), tmp_path / "plan")
    assert simulated == 0
    assert row["replicas"] == row["searched_replicas"] >= 5 and "a linear bound" in row["limiting_factor"]
    # no fleet ran: the linear bound, the count times the one replica's window rate, ceil(1.1 / f) · f · 300 >= 330
    assert row["evidence_replicas"] == 1
    assert held_rate_per_s(row) == pytest.approx(row["replicas"] * row["num_in_window"] / row["window_s"])
    assert held_rate_per_s(row) >= 330 * 0.95


def test_the_pooled_note_says_the_count_below_failed_only_where_it_ran():
    """A rate search stepped down from 6 to 3 replicas whose next long run (2) would not fit the memory limit has
    no failed count below: the note said '2 did not'; from 6 to 4 with 3 failed it says so."""
    from kvsim.planning.plan_rate import pooled_note

    assert pooled_note(3, 6, 1.1, below_failed=False) == (
        "; 3 replicas held 1.1× the traffic in a long run (the fleet pools its queues); one replica's rate implied 6")
    assert pooled_note(4, 6, 1.1, below_failed=True) == (
        "; 4 replicas held 1.1× the traffic in a long run (the fleet pools its queues), 3 did not; one replica's "
        "rate implied 6")


def test_a_rate_search_never_steps_down_to_the_one_replica_its_search_refuted(tmp_path):
    """Single-slot replicas (S = 0.1 s) at 8 req/s, p90 TTFT <= 0.25 s, capacity_headroom 0.1: one replica meets
    the SLO up to 6.35 req/s (M/D/1, `test_a_rate_search_answer_is_the_fleet_that_held_not_the_linear_bound`), so
    the search implies ceil(1.1 · 8 / 6.35) = 2, and 2 hold 8 req/s (M/D/2 at rho 0.4). One replica on 8.8 req/s is
    the fleet the search itself probed and refuted (some fraction <= 1.1 failed, else it would answer 1): its long
    run, as long as the 2-replica one, could only fail, and was made (the default scenario's `plan --search rate`:
    227 s, then 365 s with it). The answer is 2, from one long run. Run, as the test above, as the same queues in
    a tenth of the time: 1-token requests at 80 req/s, p90 TTFT <= 0.034 s (checked: the same 10 runs, 9 probes,
    '2 held', idle 1.2096 in both; verify TTFT p90 0.052271 s with 10 tokens, 0.014227 with 1; half the CPU)."""
    base = single_slot_fleet("pair", 500, 80.0, output_tokens=1)
    spec = make_plan_spec({"slo": {"ttft_s.p90": 0.034}, "gpus": ["h100-80gb"], "max_replicas": 4, "search": "rate",
                           "router": "round_robin", "probe_requests": 500, "max_probe_requests": 1000,
                           "verify_factor": 2})
    (row,) = plan(base, spec, tmp_path / "plan")[0]
    assert row["searched_replicas"] == row["replicas"] == 2 and row["verify_attempts"] == "2 held"


@pytest.mark.parametrize(("searched", "topology", "size", "fleet", "probe"), [
    (1, "colocated", 1, "1 replica", "probe of 1 replica"), (None, "1P1D", 2, "1P1D (2 instances)", "probe of 1P1D")])
def test_evidence_line_names_the_searchs_probe(searched, topology, size, fleet, probe):
    """`kvsim plan --xpyd 1P1D` on the default traffic at 5 req/s answers 1 H100 colocated and a 1P1D split, each from
    a 1,000-request probe held on a 10,000-request run; their lines said `the search's probe of 1 replicas` and, for
    the split, whose size is fixed and never searched (`searched_replicas` null), `probe of None replicas`.
    Hand-built rows of those shapes (the line reads only these fields) must name the probe as it was run, and the
    split's fleet as its two instances (its `replicas` column), not "2 replicas"."""
    from kvsim.cli.plan_command import evidence_line

    row = {"candidate": "h100-80gb tp1", "topology": topology, "replicas": size, "searched_replicas": searched,
           "evidence_num_requests": 10_000, "search_num_requests": 1_000, "verdict": "stable",
           "num_in_window": 6_924, "window_s": 1_383.0, "served_over_offered": 1.0}
    line = evidence_line(row)
    assert line.startswith(f"evidence, h100-80gb tp1: {fleet}, 10,000-request run: stable"), line
    assert f"the search's {probe} (1,000 requests)" in line, line


def test_evidence_line_of_a_split_ranked_beside_a_rate_search():
    """`kvsim plan --search rate --xpyd 2P1D` (a 20-request priority-class scenario, `--slo e2e_s.mean@3=5`) wrote
    plan.csv and then died printing a TypeError: one table gives every row every column, so the split's row held
    `evidence_traffic_scale` and `evidence_replicas` as None (its run is the split itself on the traffic itself,
    not a rate search's scaled one-replica run), and the line formatted None. The row as plan.json held it: the
    line names the split's 3 instances and the traffic unscaled."""
    from kvsim.cli.plan_command import evidence_line

    row = {"candidate": "h200 tp1 2P1D", "topology": "2P1D", "replicas": 3, "searched_replicas": None,
           "capacity_headroom": None, "evidence_replicas": None, "evidence_traffic_scale": None,
           "evidence_num_requests": 80, "search_num_requests": 80, "verdict": "stable", "num_in_window": 61,
           "window_s": 6.0, "served_over_offered": 1.0, "e2e_s.mean@3": 0.29}
    assert evidence_line(row) == ("evidence, h200 tp1 2P1D: 2P1D (3 instances), 80-request run: stable over its "
                                  "window (61 requests in 6 s, served/offered 1.000); e2e_s.mean@3 0.29")


def _one_per_second(stay_s):
    """100 requests arriving at t = 0, 1, ..., 99 s, each scheduled on arrival (the waiting queue never grows) and
    finishing `stay_s(t)` later: a requests table as `window_evidence` reads one."""
    import numpy as np

    arrival = np.arange(100.0)
    finish = arrival + np.array([stay_s(t) for t in arrival])
    nan = np.full(100, np.nan)
    return {"arrival_s": arrival, "first_scheduled_s": arrival, "finish_s": finish, "status": np.array(["finished"] * 100),
            "num_preemptions": np.zeros(100, int), "output_tokens": np.ones(100, int), "num_samples": np.ones(100, int),
            "ttft_s": nan, "tpot_s": nan, "e2e_s": finish - arrival, "queue_s": np.zeros(100)}


def test_a_long_run_that_served_under_95_percent_of_its_arrivals_fails_whatever_its_waiting_queue_did():
    """By hand: the span is 99 s and the median stay 2 s, so the window is [19.8, 89.1) (20 % warm-up, 10 % tail),
    70 arrivals (t = 20..89). Staying 2 s each, the requests of t = 18..87 finish in it: served ÷ offered 70/70.
    When the requests from t = 70 on stay 30 s (the running set grows, as an overloaded batch engine's does while
    it admits everything), only t = 18..69 finish in it: 52/70 = 0.743, which is 1 − (B(b) − B(a)) ÷ N with
    backlogs B(19.8) = 20 − 18 = 2 and B(89.1) = 90 − 70 = 20. The waiting queue never grew: the window's verdict
    is *stable* (a probe's shortfall is let through unless its queue outgrew a stable queue's margin), but a long
    run that served under 1 − THROUGHPUT_TOL of its arrivals is overloaded, and a verification refuses it."""
    from kvsim.planning.slo import probe_passes
    from kvsim.planning.verify import Verification, long_run_evidence
    from kvsim.planning.window import window_evidence

    steady = window_evidence(_one_per_second(lambda t: 2.0))
    assert (steady["window_start_s"], steady["window_s"], steady["num_in_window"]) == pytest.approx((19.8, 69.3, 70))
    assert steady["verdict"] == "stable" and steady["served_over_offered"] == 1.0
    assert long_run_evidence(steady) is steady  # kept up: nothing to change
    growing = window_evidence(_one_per_second(lambda t: 2.0 if t < 70 else 30.0))
    assert growing["verdict"] == "stable" and growing["early_overload"]["waiting_growth"] == 0
    assert growing["served_over_offered"] == pytest.approx(52 / 70) == pytest.approx(1 - (20 - 2) / 70)
    judged = long_run_evidence(growing)
    assert judged["verdict"] == "overloaded" and judged["long_run_shortfall"] and growing["verdict"] == "stable"
    spec = make_plan_spec({"slo": {"e2e_s.p90": 60}, "gpus": ["h100-80gb"]})
    assert probe_passes(growing, spec.slo)  # as a probe it passes: stable, p90 E2E 30 s within 60 s
    verify = Verification(None, spec, None)  # observe reads neither candidate nor memory
    verify._count = 3  # as next_scenario leaves it
    verify.observe({"evidence": growing, "num_preemptions": 0})
    assert verify.held is False and verify.replicas(3) is None
    assert verify.columns()["verify_verdict"] == "overloaded" and verify.columns()["verify_attempts"] == "3 failed"
