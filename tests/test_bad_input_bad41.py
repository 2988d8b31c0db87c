"""Bad input found by the bad41 sweep (every command over malformed inputs). Each is refused (the CLI: exit 2, one
line naming the field and the value, nothing written; the Python API: a `KvsimError`).

Found: `workload.trace.rate_scale` beside a rate process (`arrival.process: poisson`, `gamma` or `constant`, which
keep a trace's lengths at their own rate) was dropped without a word: `rate_scale: 1e-300` on a lengths table ran
at the Poisson rate, exit 0. Only `arrival.process: trace` divides the trace's timestamps by it
(`kvsim.workload.generate._arrivals`), as `start_s` is read only by the formats with timestamps (refused elsewhere).
`kvsim validate` of a measured folder whose first request's `arrival_time` lay 1e300 s after meta.json's `started_at`
blamed the time series ("timeseries.csv:3: t='2.0' is not after the row before it"), and one 1e12 s after shifted the
series in silence. `kvsim capacity --gpu-hourly-cost 1e308 -tp 8` printed `inf` USD per user-hour and per million
tokens, exit 0: the price was checked positive and finite, not its products (`kvsim plan` bounds its fleets' hourly
cost, sweep 30; capacity and the report's priced rows did not). An autoscaler with `sync_period_s: 0.001` (the
least it takes) under the default 300 s scale-down window scanned every sync of the window at each sync: 1,000
requests took 26 s, an hour's trace would not end; its window queues are held to that scan here. `kvsim plan --engine
kv_cache_dtype=fp8,fp8_e4m3` (or `auto,bfloat16` on a bfloat16 model) searched one engine twice. A ServeGen window's
rate of 1e300 was refused with a 303-digit count of draws on its one error line.
"""

from __future__ import annotations

import pytest

from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import make_scenario
from tests.conftest import one_line_exit_2
from tests.test_bad_input_sweep30 import TOY as PLAN_TOY

LENGTHS = "num_prefill_tokens,num_decode_tokens\n100,10\n200,20\n"


def _scenario(tmp_path, process: str, rate_scale: float) -> dict:
    (tmp_path / "t.csv").write_text(LENGTHS, encoding="utf-8")
    arrival = {"process": "trace"} if process == "trace" else {"process": process, "rate": 4.0}
    trace = {"format": "lengths" if process != "trace" else "mooncake",
             "path": "t.csv" if process != "trace" else "builtin:mooncake_conversation_head", "rate_scale": rate_scale}
    return {"name": "toy", "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 400},
            "workload": {"num_requests": 4, "arrival": arrival, "trace": trace},
            "latency": {"model": "constant", "step_s": 0.02}}


@pytest.mark.parametrize("process", ["poisson", "gamma", "constant"])
def test_rate_scale_beside_a_rate_process_is_refused(tmp_path, process):
    """The message follows the rule for a field its mode does not read (`Settings.refuse_unread`'s words)."""
    raw = _scenario(tmp_path, process, 0.5)
    if process == "gamma":
        raw["workload"]["arrival"]["cv"] = 2.0
    with pytest.raises(KvsimError) as error:
        make_scenario(raw, tmp_path)
    assert str(error.value) == (f"workload: trace.rate_scale=0.5: arrival.process={process} does not read it (only "
                                "trace, which replays the trace's timestamps); scale arrival.rate instead")


def test_rate_scale_where_it_is_read_or_left_at_its_default_passes(tmp_path):
    make_scenario(_scenario(tmp_path, "poisson", 1.0), tmp_path)  # the default, which a written scenario carries
    make_scenario(_scenario(tmp_path, "trace", 0.5), tmp_path)  # a replay divides its timestamps by it


def test_the_cli_refuses_it_and_writes_nothing(tmp_path):
    import yaml

    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(_scenario(tmp_path, "poisson", 1e-300)), encoding="utf-8")
    out = tmp_path / "out"
    assert one_line_exit_2(["run", str(scenario), "-o", str(out)]) == (
        "workload: trace.rate_scale=1e-300: arrival.process=poisson does not read it (only trace, which replays the "
        "trace's timestamps); scale arrival.rate instead")
    assert not out.exists()


@pytest.mark.parametrize(("arrival_time", "after"), [(1e300, "1e+300"), (1e12, "9.98233e+11")])
def test_a_first_arrival_time_past_any_replayed_run_is_refused_naming_it(tmp_path, arrival_time, after):
    """requests.jsonl's wall-clock `arrival_time` places meta.json's per-second series (counted from `started_at`)
    on the request clock. A first arrival 1e300 s after started_at shifted every row to about -1e300 s, where
    t=1.0 and t=2.0 are one float, so the series was blamed ("timeseries.csv:3: t='2.0' is not after the row
    before it"); 1e12 (about 31,600 years after 2026) shifted it in silence, exit 0. The bound is the span
    kvsim replays, int64 nanoseconds (2**63 / 1e9 = 9.22337e+09 s); `after` is arrival_time − started_at's epoch
    second 1,767,225,600 (2026-01-01T00:00:00Z), which 1e300 swallows."""
    import json

    from test_validate import EPOCH, STARTED, write_run

    from kvsim.validation.measured import read_measured_dir

    assert (STARTED, EPOCH) == ("2026-01-01T00:00:00Z", 1_767_225_600)
    run = write_run(tmp_path)
    requests = run / "vllm" / "requests.jsonl"
    rows = [json.loads(line) for line in requests.read_text().splitlines()]
    rows[0]["arrival_time"] = arrival_time
    requests.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(KvsimError) as error:
        read_measured_dir(run)
    assert str(error.value) == (f"{requests}: request 'bench-0' arrival_time={arrival_time!r} is {after} s after "
                                "meta.json's started_at='2026-01-01T00:00:00Z', longer than a run kvsim replays "
                                "(9.22337e+09 s: int64 ns)")
    rows[0]["arrival_time"] = EPOCH + 2**63 / 1e9 - 1  # within the span: read (its series far from the requests)
    requests.write_text("".join(json.dumps(row) + "\n" for row in rows))
    read_measured_dir(run)


def test_a_price_whose_capacity_cost_overflows_a_float_is_refused():
    """llama-3.1-70b at TP 8: the first row's cost per user-hour is 1e308 × 8 GPUs / sequences, and 8e308 is past
    the largest float, 1.7976931348623157e308, whatever the sequences; 1e308 on one GPU is not (its figures print)."""
    import math
    import sys

    assert math.isinf(1e308 * 8) and sys.float_info.max == 1.7976931348623157e308
    line = one_line_exit_2(["capacity", "--model", "llama-3.1-70b", "-tp", "8", "--gpu-hourly-cost", "1e308",
                            "--context-lengths", "1024"])
    assert line.startswith("gpu_hourly_cost=1e+308: the USD for a concurrent user-hour at ")
    assert line.endswith(" sequences on 8 GPUs overflows a float (past 1.798e+308)")


def test_a_cost_per_million_tokens_past_a_float_is_refused_and_one_within_is_kept():
    """USD per million tokens = price × GPUs × 1e6 / (tokens/s × 3600): $1e306 an hour on one GPU at 1 token/s is
    1e312 / 3600 = 2.8e308, past the largest float (1.798e308); at 10 tokens/s 2.8e307, kept as computed."""
    from kvsim.planning.cost import GpuPrice, cost_per_million_output_tokens, cost_per_user_hour

    price = GpuPrice(1e306, "given (--gpu-hourly-cost)")
    with pytest.raises(KvsimError) as error:
        cost_per_million_output_tokens(price, 1, 1.0)
    assert str(error.value) == ("gpu_hourly_cost=1e+306: the USD for a million output tokens at 1 tokens/s on 1 GPU "
                                "overflows a float (past 1.798e+308)")
    assert cost_per_million_output_tokens(price, 1, 10.0) == 1e306 * 1 * (1e6 / (10.0 * 3600))
    assert cost_per_user_hour(price, 2, 4.0) == 1e306 * 2 / 4.0


class _ScanningAutoscaler:
    """The stabilisation as it read before bad41, a second implementation to hold the monotonic queues to: every
    sync's raw recommendation kept for the longer window, each window's lowest / highest found by a scan."""

    def __init__(self, spec):
        from kvsim.fleet.autoscaler import Autoscaler

        self.policy, self.spec, self.history = Autoscaler(spec), spec, []

    def recommend(self, now_s, num_current, metric):
        raw = self.policy.raw(num_current, metric)
        self.history.append((now_s, raw))
        horizon_s = max(self.spec.scale_up_window_s, self.spec.scale_down_window_s)
        self.history = [(t, r) for t, r in self.history if t >= now_s - horizon_s]
        stabilised = num_current
        if raw > num_current:
            stabilised = max(num_current, min(r for t, r in self.history if t >= now_s - self.spec.scale_up_window_s))
        elif raw < num_current:
            stabilised = min(num_current, max(r for t, r in self.history
                                              if t >= now_s - self.spec.scale_down_window_s))
        desired = self.policy._rate_limited(now_s, num_current, stabilised)  # the policies' bound, unchanged
        if desired != num_current:
            self.policy._changes.append((now_s, desired - num_current))
        return desired


@pytest.mark.parametrize("seed", range(6))
def test_the_autoscalers_window_queues_recommend_what_a_scan_of_every_sync_does(seed):
    """`sync_period_s: 0.001` under the default 300 s scale-down window scanned 300,000 syncs at each sync (1,000
    requests: 26 s, 40 s profiled; now 4.5 s): the queues keep only the syncs that can still be a window's extreme.
    Over 3,000 syncs with whole-second instants (so syncs fall exactly on a window's edge) and windows of 0 to 60 s,
    every recommendation equals the scan's."""
    import numpy as np

    from kvsim.fleet.autoscaler import Autoscaler
    from kvsim.workload.fleet_layout import AutoscalerConfig

    rng = np.random.default_rng(seed)
    spec = AutoscalerConfig(target=4, max_replicas=64, tolerance=0.05, sync_period_s=1,
                            scale_up_window_s=float(rng.integers(0, 30)), scale_down_window_s=float(rng.integers(0, 60)),
                            scale_up_pods=int(rng.integers(0, 6)), scale_up_period_s=float(rng.integers(1, 20)),
                            scale_down_percent=float(rng.choice([20, 50, 100])))
    fast, scan = Autoscaler(spec), _ScanningAutoscaler(spec)
    current, now_s, changed, load = 2, 0.0, 0, 4.0
    for _ in range(3000):
        now_s += float(rng.integers(1, 4))
        if rng.random() < 0.05:  # the load moves in spells, as a trace's does, so windows fill with either side
            load = float(rng.choice([0.0, 1.0, 2.0, 4.0, 8.0, 30.0]))
        metric = load * float(rng.random() + 0.5)
        desired = fast.recommend(now_s, current, metric)
        assert desired == scan.recommend(now_s, current, metric), (now_s, current, metric)
        changed += desired != current
        current = desired
    assert changed > 50  # the windows and the policies were exercised, not a fleet that never moved




@pytest.mark.parametrize(("values", "expected"), [
    ("fp8,fp8_e4m3", "kv_cache_dtype='fp8_e4m3' is given twice (as kv_cache_dtype='fp8', "),
    ("auto,bfloat16", "kv_cache_dtype='bfloat16' is given twice (as kv_cache_dtype='auto', ")])
def test_kv_cache_dtypes_vllm_reads_as_one_are_one_plan_candidate(tmp_path, values, expected):
    """vLLM's `kv_cache_dtype`: `auto` is the model's dtype (llama-3.1-8b's config: bfloat16) and `fp8` is
    `fp8_e4m3` (its CacheConfig help: "fp8 (=fp8_e4m3)"); each pair made two candidates of one engine, searched
    twice and ranked beside each other (their runs' summaries are equal but for the label). Two dtypes of
    different sizes stay two candidates."""
    (tmp_path / "toy.yaml").write_text(PLAN_TOY, encoding="utf-8")
    out = tmp_path / "plan"
    argv = ["plan", str(tmp_path / "toy.yaml"), "--workers", "1", "--slo", "ttft_s.p90=2", "--gpu", "h100-80gb",
            "-o", str(out), "--engine", f"kv_cache_dtype={values}"]
    assert one_line_exit_2(argv) == f"plan.engine: {expected}the same engine once its defaults are filled)"
    assert not out.exists()


def test_kv_cache_dtypes_vllm_tells_apart_are_two_candidates(tmp_path):
    """fp8_e5m2 is not fp8_e4m3, nor float16 bfloat16, in vLLM: kept, though kvsim prices each pair alike."""
    from kvsim.model.config import load_model
    from kvsim.planning.plan_checks import check_knob_repeats
    from kvsim.planning.spec import make_plan_spec
    from kvsim.workload.scenario import load_scenario

    (tmp_path / "toy.yaml").write_text(PLAN_TOY, encoding="utf-8")
    base = load_scenario(tmp_path / "toy.yaml")
    assert load_model(base.model).dtype == "bfloat16"
    check_knob_repeats(base, make_plan_spec({"slo": {"ttft_s.p90": 2}, "gpus": ["h100-80gb"],
                                             "engine": {"kv_cache_dtype": ["auto", "fp8", "fp8_e5m2", "float16"]}}))


def test_a_servegen_rate_past_an_int64_of_draws_is_counted_shortly(tmp_path):
    """A window's rate of 1e300 req/s over its 600 s would draw 6e302 requests: the error printed all 303 digits
    (`:,.0f`) on its one line; a count past 2**63 now reads 6e+302. sweep8's 1e9 (6e11 draws) keeps its digits."""
    from test_bad_input_sweep8 import _servegen

    assert one_line_exit_2(_servegen(tmp_path, "0,1e300,1\n")) == (
        f"{tmp_path}/sg/chunk-0-trace.csv:1: rate='1e300': the clients' rates would draw about 6e+302 requests over "
        "[start_s, start_s + duration_s), more than kvsim samples (10,000,000); is it requests per second?")
    assert not (tmp_path / "out").exists()
