"""Bad input found by the twenty-fifth sweep. Each is refused (the CLI: exit 2, one line naming the field and the
value, nothing written; the Python API: a `KvsimError`), or said as it is.

Found: an xPyD split in other scripts' digits (`１P1D`) ran as 1P1D, and one of more digits than `int()` converts
said Python's conversion-limit advice; a plan of one request, of a burst arriving at one instant, or a rate
search whose first probe is one request, simulated every point and then stopped with an OverflowError traceback
(its floor at the infinite rate of no arrival span); `read_number` (every number flag, cell and JSON text) and
`--context-lengths` read other scripts' digits (`--slo ttft_s.p90=２`); JSON nested past the recursion limit was
a RecursionError traceback in four readers that called `json.loads` (an `-o` folder's marker, a plan's
points.jsonl, a study's JSON result, a measured run's recorded settings); the library's log warnings (a trace
shorter than `workload.num_requests`) were printed without the `kvsim: warning:` prefix; a bench JSON's tiny
`request_rate` drew arrivals that overflowed (OverflowError, ZeroDivisionError); class weights whose sum
overflows printed numpy's RuntimeWarning; an autoscaler syncing every 1 ms over arrivals 1e9 s apart never ended.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path

from kvsim.model.errors import KvsimError

PLAN = ["plan", "--gpu", "h100-80gb", "--slo", "ttft_s.p90=2", "--workers", "1"]


@pytest.mark.parametrize(("split", "message"), [
    ("\uff11P1D", "'\uff11P1D': expected xPyD"),  # `\d` took a fullwidth 1, which int() read as 1
    ("1\u0661P1D", "'1\u0661P1D': expected xPyD"),  # an Arabic-Indic 1
    ("1" * 5000 + "P1D", "more instances than kvsim builds (4,096)"),  # int() refuses over 4,300 digits
])
def test_an_xpyd_split_is_ascii_digits(tmp_path, split, message):
    """The other flags and files kvsim reads take ASCII digits alone (sweep 23); a count past `int()`'s digit
    limit said Python's advice to raise the limit (`sys.set_int_max_str_digits`)."""
    from kvsim.planning.spec import make_plan_spec

    with pytest.raises(KvsimError, match="^plan.xpyd=") as error:
        make_plan_spec({"slo": {"ttft_s.p90": 2}, "gpus": ["h100-80gb"], "xpyd": [split]})
    assert message in str(error.value) and "limit" not in str(error.value)
    out = tmp_path / "plan"
    line = one_line_exit_2([*PLAN, "--xpyd", split, "-o", str(out)])
    assert line.startswith("plan.xpyd=") and message in line and not out.exists()


def test_an_xpyd_split_in_ascii_digits_is_read():
    from kvsim.planning.spec import parse_split

    assert [parse_split(text) for text in ("1P1D", " 2p1d ", "0003P02D")] == [(1, 1), (2, 1), (3, 2)]


def _burst(tmp_path, timestamps_ms):
    """A scenario replaying a Mooncake trace of 100-token requests at `timestamps_ms`."""
    rows = [{"timestamp": t, "input_length": 100, "output_length": 10, "hash_ids": [i]}
            for i, t in enumerate(timestamps_ms)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    (tmp_path / "s.yaml").write_text(
        f"name: burst\nworkload:\n  num_requests: {len(rows)}\n  arrival: {{process: trace}}\n"
        "  trace: {format: mooncake, path: t.jsonl}\n", encoding="utf-8")
    return tmp_path / "s.yaml"


@pytest.mark.parametrize("search", ["replicas", "rate"])
def test_a_plan_of_one_request_is_refused_before_it_simulates(tmp_path, search):
    """The offered rate is (requests − 1) / (last arrival − first): with one request there is no span, so the
    traffic's floor was infinite replicas, `math.ceil(inf)` an OverflowError after the search had run 7 points
    (and found no steady-state window at any count, since a window needs 2 arrivals)."""
    out = tmp_path / "plan"
    line = one_line_exit_2([*PLAN, "--set", "workload.num_requests=1", "--search", search, "-o", str(out)])
    assert line == ("workload.num_requests=1: one request offers no rate to size a fleet for; give at least 2 "
                    "requests that arrive at different times")
    assert not out.exists()


def test_a_rate_search_whose_first_probe_is_one_request_is_refused(tmp_path):
    """A rate search's first probe is the traffic's first `probe_requests`: with 1, the same OverflowError."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("slo: {ttft_s.p90: 2}\ngpus: [h100-80gb]\nsearch: rate\nprobe_requests: 1\n", encoding="utf-8")
    out = tmp_path / "plan"
    line = one_line_exit_2(["plan", "--spec", str(spec), "--workers", "1", "--set", "workload.num_requests=20",
                            "-o", str(out)])
    assert line.startswith("plan.probe_requests=1: one request offers no rate to size a fleet for")
    assert not out.exists()


def test_a_plan_of_a_burst_at_one_instant_is_refused(tmp_path):
    """Four requests at 0 ms: (4 − 1) / 0 s is no rate either."""
    out = tmp_path / "plan"
    line = one_line_exit_2([*PLAN, str(_burst(tmp_path, [0, 0, 0, 0])), "-o", str(out)])
    assert line == ("workload.num_requests=4: 4 requests arriving at one instant offer no rate to size a fleet for; "
                    "give at least 2 requests that arrive at different times")
    assert not out.exists()


def test_traffic_with_a_span_passes_the_rate_check(tmp_path):
    """Two of the four arrive 1 ms apart: a span of 1 ms, a rate of 3 / 0.001 s, and the check passes."""
    from kvsim.planning.plan_checks import check_traffic_rate
    from kvsim.planning.plan_rate import offered_rate_per_s
    from kvsim.planning.spec import make_plan_spec
    from kvsim.workload.scenario import load_scenario

    base = load_scenario(_burst(tmp_path, [0, 0, 0, 1]))
    assert offered_rate_per_s(base) == pytest.approx(3 / 0.001)
    check_traffic_rate(base, make_plan_spec({"slo": {"ttft_s.p90": 2}, "gpus": ["h100-80gb"]}))


def _rate_search(probe_requests):
    from kvsim.planning.spec import make_plan_spec

    return make_plan_spec({"slo": {"ttft_s.p90": 2}, "gpus": ["h100-80gb"], "search": "rate",
                           "probe_requests": probe_requests})


def test_a_rate_search_whose_first_probe_is_a_burst_followed_by_arrivals_passes_the_rate_check(tmp_path):
    """A trace opening with 4 requests at t=0, then one every 200 ms (review 27): the rate search's first probe
    (its first 4) spans no time, so its window is empty and it is judged too short (`window_evidence`: 0
    requests in a window of 0 s), which runs it again with 8 requests (`SteadyRateSearch.observe`), spanning
    0.8 s: a rate (`kvsim plan` then answers). It was refused (`plan.probe_requests=4`)."""
    from kvsim.planning.plan_checks import check_traffic_rate
    from kvsim.workload.scenario import load_scenario

    check_traffic_rate(load_scenario(_burst(tmp_path, [0, 0, 0, 0, 200, 400, 600, 800])), _rate_search(4))


def test_a_rate_search_whose_every_probe_is_a_burst_is_refused(tmp_path):
    """Its probes double up to the traffic's 8 requests, all at 0 ms: still no rate."""
    from kvsim.planning.plan_checks import check_traffic_rate
    from kvsim.workload.scenario import load_scenario

    with pytest.raises(KvsimError, match=r"^workload.num_requests=8: 8 requests arriving at one instant offer no rate"):
        check_traffic_rate(load_scenario(_burst(tmp_path, [0] * 8)), _rate_search(4))


@pytest.mark.parametrize("text", ["\uff13", "\u0661.5", "2\u2003"])
def test_a_number_read_from_text_is_ascii(text):
    """`read_number` (every flag, cell and JSON text kvsim reads a number from) was float()/int(): a fullwidth
    3 read as 3.0, an Arabic-Indic 1 as 1, an em space stripped; `ascii_int` and the trace readers' integers
    refuse those (sweep 23)."""
    from kvsim.model.units import read_number

    with pytest.raises(ValueError, match="is no number in ASCII digits"):
        read_number(text, float)
    assert read_number(" 2.5 ", float) == 2.5 and read_number("-3", int) == -3  # ASCII as before


@pytest.mark.parametrize(("argv", "message"), [
    ([*PLAN[:3], "--slo", "ttft_s.p90=\uff12", "--workers", "1"], "--slo ttft_s.p90='\uff12': expected seconds"),
    ([*PLAN, "--gpu-hourly-cost", "h100-80gb=\uff13"], "--gpu-hourly-cost h100-80gb='\uff13': expected a price per hour"),
    (["capacity", "--context-lengths", "1024,\uff12\uff10\uff14\uff18"],
     "--context-lengths='1024,\uff12\uff10\uff14\uff18': expected comma-separated integers"),
])
def test_a_number_flag_in_other_digits_is_refused(tmp_path, argv, message):
    """`--slo ttft_s.p90=２` planned for a 2 s TTFT, `--context-lengths １０２４` showed a row of 1024 tokens."""
    out = tmp_path / "o"
    assert one_line_exit_2([*argv, *(["-o", str(out)] if argv[0] == "plan" else [])]) == message
    assert not out.exists()


def test_a_trace_time_in_other_digits_is_refused(tmp_path):
    """A Mooncake timestamp given as JSON text is read as a number (lax, as the scenario's own numbers): `"１０"`
    was 10 ms."""
    from kvsim.workload.traces import read_mooncake

    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": "\uff11\uff10", "input_length": 10, "output_length": 2, "hash_ids": [1]}\n',
                    encoding="utf-8")
    with pytest.raises(KvsimError, match="t.jsonl:1: timestamp='\uff11\uff10' is not a number$"):
        read_mooncake(path)


DEEP = "[" * 100_000 + "]" * 100_000  # deeper than the interpreter's recursion limit: json.loads raises RecursionError


def test_an_output_marker_nested_too_deeply_is_no_marker(tmp_path):
    """`-o FOLDER` reads FOLDER/.kvsim-output to tell kvsim's own output: a stranger's file of that name nested
    past the recursion limit was a RecursionError traceback (json.loads), where any other non-JSON is 'no marker'."""
    out = tmp_path / "o"
    out.mkdir()
    (out / ".kvsim-output").write_text(DEEP, encoding="utf-8")
    line = one_line_exit_2(["run", "--set", "workload.num_requests=2", "-o", str(out)])
    assert "exists and has no .kvsim-output marker" in line
    assert sorted(p.name for p in out.iterdir()) == [".kvsim-output"]


def test_a_json_result_nested_too_deeply_is_not_replaced(tmp_path):
    """A study's `--output FILE.json` is replaced only when it is a JSON object of the result's keys."""
    from kvsim.model.errors import OutputError
    from kvsim.results.output_checks import check_output_file

    path = tmp_path / "r.json"
    path.write_text(DEEP, encoding="utf-8")
    with pytest.raises(OutputError, match="exists and is not a JSON object of this result's keys"):
        check_output_file(path, frozenset({"rows"}))


def test_a_points_line_nested_too_deeply_is_skipped_as_any_torn_line(tmp_path):
    """`kvsim plan` resumes from points.jsonl, skipping a line that is no whole point: a line nested past the
    recursion limit stopped the plan with a RecursionError traceback."""
    from kvsim.planning.search import PointStore

    path = tmp_path / "points.jsonl"
    path.write_text(DEEP + '\n{"hash": "a", "format": 0, "metrics": {"x": 1}}\n', encoding="utf-8")
    assert PointStore(path).points == {"a": {"x": 1}}


def test_a_recorded_meta_json_nested_too_deeply_records_nothing(tmp_path):
    """`recorded_settings` reads what a measured run recorded; an unreadable file is reported by the reader."""
    from kvsim.validation.recorded import recorded_settings

    path = tmp_path / "bench.json"
    path.write_text(DEEP, encoding="utf-8")
    assert recorded_settings(path) == {}


def test_a_short_trace_is_said_as_a_kvsim_warning_line(tmp_path, monkeypatch):
    """docs/commands.md: an input that changes what runs is said "in one `kvsim: warning: ...` line on stderr". A trace of 2
    rows under `workload.num_requests: 5` was said bare (`workload.num_requests=5: ...`): the library logs it, and
    with no handler configured Python's last-resort handler printed the message alone. Only while a command runs:
    the handler is gone after it."""
    import logging

    from typer.testing import CliRunner

    from kvsim.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,100,10\n"
                                    "2023-11-16 18:00:00.5,100,10\n", encoding="utf-8")
    (tmp_path / "s.yaml").write_text("steps: none\nworkload: {num_requests: 5, arrival: {process: trace}, "
                                     "trace: {format: azure, path: t.csv}}\n", encoding="utf-8")
    handlers = list(logging.getLogger("kvsim").handlers)
    result = CliRunner().invoke(app, ["run", "s.yaml", "-o", "out", "--format", "json"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stderr.splitlines() == [
        "kvsim: warning: workload.num_requests=5: t.csv holds 2 requests from start_s=0; the run has those 2"]
    assert logging.getLogger("kvsim").handlers == handlers


def _bench(tmp_path, **fields):
    """A `vllm bench serve --save-detailed` result of 3 requests without start_times (arrivals drawn)."""
    raw = {"model_id": "meta-llama/Llama-3.1-8B", "input_lens": [100] * 3, "output_lens": [10] * 3,
           "ttfts": [0.05] * 3, "itls": [[0.01] * 9] * 3, **fields}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


@pytest.mark.parametrize(("rate", "burstiness"), [(1e-300, 1.0), (1e-300, 1e-300)])
def test_a_bench_rate_whose_drawn_arrivals_overflow_is_refused(tmp_path, rate, burstiness):
    """Without start_times the arrivals are drawn at the file's request_rate: gaps of 1 / 1e-300 s summed past any
    clock (an OverflowError converting them to the replayed workload's int64 ns, a traceback mid-validate), and
    a rate and a burstiness of 1e-300 each made the gamma's scale 1 / (1e-300 · 1e-300) = 1 / 0: a
    ZeroDivisionError. `start_times` that far apart are refused as longer than a run kvsim replays already."""
    out = tmp_path / "v"
    line = one_line_exit_2(["validate", str(_bench(tmp_path, request_rate=rate, burstiness=burstiness)),
                            "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "-o", str(out)])
    assert line.endswith(f"bench.json: request_rate={rate!r}, burstiness={burstiness!r}: the arrivals drawn at that "
                         "rate run past 9.22337e+09 s, longer than a run kvsim replays (int64 ns)")
    assert not out.exists()


def test_a_bench_rate_within_the_clock_draws_its_arrivals(tmp_path):
    """At 2 req/s the 3 arrivals start at 0 and run forward, finite."""

    from kvsim.validation.bench import read_vllm_bench

    arrivals = np.array([r.arrival_s for r in read_vllm_bench(_bench(tmp_path, request_rate=2.0)).records])
    assert arrivals[0] == 0.0 and np.isfinite(arrivals).all() and (np.diff(arrivals) >= 0).all()


def test_class_weights_whose_sum_overflows_are_drawn_without_a_numpy_warning():
    """Weights of 1e308 sum to inf, and `_priorities` scales them down (they are shares): the test of that sum
    printed numpy's two-line RuntimeWarning ('overflow encountered in reduce') on a run's stderr. Equal weights
    draw each class about half the time: 200 requests, a binomial(200, 1/2) count within 100 ± 30 (4.2 sigma)."""
    import warnings

    from kvsim.workload.generate import build_requests
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario(None, ["workload.num_requests=200", "workload.priority={classes: [{name: a, priority: 0, "
                                    "weight: 1e308}, {name: b, priority: 1, weight: 1e308}]}"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        requests = build_requests(scenario, 8192, np.random.default_rng(scenario.seed))
    assert 70 <= sum(r.priority == 0 for r in requests) <= 130 and {r.priority for r in requests} == {0, 1}


def test_an_autoscaler_syncing_over_a_span_of_too_many_periods_is_refused(tmp_path):
    """Three requests at 1e-9 req/s arrive some 1e9 s apart; the autoscaler syncs every 1 ms from t = 0 until the
    last has arrived and finished, a row of the scaling table each time: about 10**12 syncs, a run that did not
    end (killed after 120 s) while its table grew."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text("steps: none\nworkload: {num_requests: 3, arrival: {process: poisson, rate: 1.0e-9}, "
                        "prompt_len: {dist: fixed, value: 100}, output_len: {dist: fixed, value: 10}}\nreplicas: 1\n"
                        "router: {policy: least_outstanding}\nautoscaler: {max_replicas: 2, sync_period_s: 0.001}\n"
                        "engine: {max_model_len: 256, num_gpu_blocks_override: 32}\n",
                        encoding="utf-8")
    out = tmp_path / "o"
    line = one_line_exit_2(["run", str(scenario), "-o", str(out)])
    assert line.startswith("autoscaler.sync_period_s=0.001: the arrivals span ") and "more than 10,000,000" in line
    assert not out.exists()


def test_the_sync_bound_is_ten_million_periods():
    from kvsim.fleet.autoscaled import check_syncs
    from kvsim.workload.fleet_layout import AutoscalerConfig

    spec = AutoscalerConfig(sync_period_s=2.0)
    check_syncs(spec, 2.0 * 10**7)  # 10**7 syncs: kept
    with pytest.raises(KvsimError, match=r"^autoscaler.sync_period_s=2: the arrivals span 2\.00001e\+07 s, 1e\+07 "):
        check_syncs(spec, 2.0 * 10**7 + 100)


def _servegen(tmp_path, rate, cv):
    """A ServeGen folder of one client: one 600-s window at `rate` req/s and gaps of CV `cv`, 100 + 10 tokens."""
    (tmp_path / "chunk-0-trace.csv").write_text(f"0,{rate},{cv},,0,0\n", encoding="utf-8")
    (tmp_path / "chunk-0-dataset.json").write_text('{"0": {"input_tokens": "{100: 1.0}", "output_tokens": '
                                                   '"{10: 1.0}"}}', encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(("cv", "draws"), [("1e100", "2.2e+197"), ("2e4", "3.12e+07"), ("1e200", "inf")])
def test_a_servegen_cv_whose_gaps_never_cross_a_window_is_refused(tmp_path, cv, draws):
    """Gaps are gamma with shape 1/cv²: at a CV of 1e100 (shape 1e-200) each gap is 0, so the window's loop never
    reached its end (a run killed after 60 s); at 1e200 cv ** 2 overflowed (an OverflowError traceback). The draws
    end by the first gap longer than the 600-s window: 1/(k·E1(z)), z = 600·k, by hand 1e200 / (−γ − ln 6e-198)
    = 1e200 / 453.5 at a CV of 1e100, 4e8 / (−γ − ln 1.5e-6) = 4e8 / 12.83 at 2e4 (review 27)."""
    from kvsim.workload.servegen import read_servegen

    with pytest.raises(KvsimError, match=rf"chunk-0-trace.csv:1: cv='{cv}': gaps that vary this much take up to "
                                         rf"about {re.escape(draws)} draws to cross a window, more than kvsim "
                                         r"samples \(10,000,000\)$"):
        read_servegen(_servegen(tmp_path, 1, cv), np.random.default_rng(0), 0.0, 600.0, None)


def test_a_servegen_cv_of_5000_over_a_window_short_beside_its_gamma_scale_is_not_refused():
    """At 1 req/s a CV of 5,000 has gaps of scale θ = cv²/rate = 2.5e7 s: a 600-s window ends by the first gap over
    600 s, about 1/(k·E1(600/θ)) = 2.5e7 / (−γ − ln 2.4e-5 + 2.4e-5) = 2.5e7 / 10.06026 ≈ 2.49 million draws (a
    simulation of 20 windows drew 2.7 ± 0.6 million), under kvsim's 10 million. The long-window count, (cv² − 1)/2
    = 12.5 million, refused it (review 27)."""
    from kvsim.workload.servegen import SERVEGEN_MAX_DRAWS, gamma_draws_to_cross

    assert gamma_draws_to_cross(1.0, 5000.0, 600.0) == pytest.approx(2.5e7 / 10.06026, rel=1e-5)
    assert gamma_draws_to_cross(1.0, 5000.0, 600.0) < SERVEGEN_MAX_DRAWS
    assert gamma_draws_to_cross(1.0, 10.0, 600.0) == 600 + 99 / 2  # a window long beside θ = 100 s: renewal's count


def test_a_servegen_cv_s_draws_add_up_over_the_windows(tmp_path, monkeypatch):
    """With the per-row bound alone, windows of a CV of 5,000 (2.49 million draws each) passed one by one while a
    day of them drew 360 million (review 27). At a bound of 10,000 and a CV of 100 at 1 req/s (z = 0.06,
    E1(0.06) = −γ − ln 0.06 + 0.06 − 0.06²/4 + 0.06³/18 = 2.2953: 1/(1e-4 · 2.2953) = 4,357 draws a window, the
    rate's 600 of them included), two windows draw 8,713 and the third would reach 13,070: refused there."""
    from kvsim.workload import servegen

    folder = _servegen(tmp_path, 1, 100)
    (folder / "chunk-0-trace.csv").write_text("".join(f"{600 * k},1,100,,0,0\n" for k in range(3)), encoding="utf-8")
    monkeypatch.setattr(servegen, "SERVEGEN_MAX_DRAWS", 10_000)
    with pytest.raises(KvsimError, match=r"chunk-0-trace.csv:3: cv='100': gaps that vary this much take up to about "
                                         r"4\.36e\+03 draws to cross a window, 1\.31e\+04 with the windows before it"):
        servegen.read_servegen(folder, np.random.default_rng(0), 0.0, 1800.0, None)
    assert len(servegen.read_servegen(folder, np.random.default_rng(0), 0.0, 1200.0, None)) > 0  # two windows


def test_gamma_draws_to_cross_matches_a_naive_draw_of_the_gaps():
    """A naive second implementation: draw gamma gaps (shape 1/300², scale 300² s) from a window's start until they
    pass 600 s, 100 windows. The estimate bounds the mean from above (the draws end by the first gap over the
    window) and is near it (z = 600/90,000: the other gaps add little); the long-window count, 45,000, is 2.4x
    the mean."""
    from kvsim.workload.servegen import gamma_draws_to_cross

    rng, cv, span_s = np.random.default_rng(7), 300.0, 600.0
    estimate = gamma_draws_to_cross(1.0, cv, span_s)
    draws = []
    for _ in range(100):
        num_drawn, t = 0, 0.0
        while True:
            ends = t + np.cumsum(rng.gamma(1 / cv**2, cv**2, size=int(estimate)))
            crossed = int(np.searchsorted(ends, span_s))
            if crossed < len(ends):
                draws.append(num_drawn + crossed + 1)
                break
            num_drawn, t = num_drawn + len(ends), float(ends[-1])
    mean, standard_error = np.mean(draws), np.std(draws) / np.sqrt(len(draws))
    assert 0.8 * estimate < mean < estimate + 3 * standard_error


def test_a_servegen_cv_of_ten_and_a_rate_too_small_to_scale_still_draw(tmp_path):
    """A CV of 10 draws about 600 + 49.5 gaps over the window, the count's standard deviation about
    10 · √600 ≈ 245 (the renewal central limit: CV · √(rate · span)), so within 5 sigma of that. A rate of
    1e-320 times a shape of 1e-6 underflows to 0 (a ZeroDivisionError for the gamma's scale), and 1e-310 times
    it makes the scale inf (NaN gaps: a loop without end): no arrival, which is what such a rate draws."""
    from kvsim.workload.servegen import read_servegen

    records = read_servegen(_servegen(tmp_path, 1, 10), np.random.default_rng(0), 0.0, 600.0, None)
    assert 0 < len(records) < 650 + 5 * 245 and all(0 <= r.arrival_s < 600 for r in records)
    for rate in ("1e-320", "1e-310"):  # 1e-310 · 1e-6: a scale of inf, gaps of NaN at that shape (no end)
        with pytest.raises(KvsimError, match="no ServeGen request arrives"):
            read_servegen(_servegen(tmp_path, rate, 1000), np.random.default_rng(0), 0.0, 600.0, None)
