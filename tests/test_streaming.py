"""Bounded memory at any trace length: steps streamed to disk, columnar request records, lazy requests.

Each claim is checked against an independent second path: the streamed files against the rows an
in-memory run keeps, the lazy request stream against building every request and sorting the list
(the construction the workload module documents), the memory bound with tracemalloc.
"""

import tracemalloc

import numpy as np
import pandas as pd
import pytest
from conftest import sized

from kvsim.engine import recorder as recorder_module
from kvsim.engine.recorder import StepSampler
from kvsim.engine.simulate import simulate
from kvsim.fleet.driver import simulate_fleet
from kvsim.kv import SegmentContent
from kvsim.model.capacity import kv_bytes_per_block
from kvsim.model.config import load_gpu, load_model
from kvsim.results.budget import estimate_run_bytes
from kvsim.results.metrics import EngineCounters, StepTotals, summarize
from kvsim.results.step_writer import has_pyarrow
from kvsim.results.together import dp_group_steps, dp_interval_steps
from kvsim.workload import conversations
from kvsim.workload import generate as workload
from kvsim.workload.request import Request, RequestStatus
from kvsim.workload.scenario import load_scenario

FORMATS = ["csv", pytest.param("parquet", marks=pytest.mark.skipif(not has_pyarrow(), reason="needs pyarrow"))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_streamed_steps_equal_the_in_memory_rows_exactly(tmp_path, monkeypatch, fmt):
    """Chunks of 7 rows (so the file is written in many pieces, bursts split across chunks): the file holds
    exactly the rows an in-memory run keeps, the summary and requests table are the same."""
    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 7)
    spec = load_scenario(None, ["workload.num_requests=60"])
    memory = simulate(spec)
    streamed = simulate(spec, out_dir=tmp_path / "run", steps_format=fmt)
    assert streamed.step_columns is None and streamed.steps_path == (tmp_path / "run" / f"steps.{fmt}").resolve()
    assert len(memory.steps) == memory.summary["num_steps"] > 7 * 10
    pd.testing.assert_frame_equal(streamed.steps, memory.steps, check_exact=True)
    assert streamed.summary == memory.summary
    pd.testing.assert_frame_equal(streamed.requests, memory.requests, check_exact=True)
    memory.write(tmp_path / "written")  # the in-memory result written whole: the same requests.csv bytes
    assert (tmp_path / "run" / "requests.csv").read_bytes() == (tmp_path / "written" / "requests.csv").read_bytes()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        ".kvsim-output", "requests.csv", "scenario.yaml", f"steps.{fmt}", "summary.json"]


def test_burst_rows_kept_compact_land_in_their_places_across_chunks(monkeypatch):
    """Chunks of 7 rows: decode bursts' rows, kept compact until their chunk is flushed, interleave with
    single steps and straddle chunk boundaries; they equal what a step-by-step run records row by row."""
    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 7)
    spec = load_scenario(None, ["workload.num_requests=60"])
    bursts, step_by_step = simulate(spec), simulate(spec, bursts=False)
    assert len(bursts.steps) > 7 * 10
    pd.testing.assert_frame_equal(bursts.steps, step_by_step.steps, check_exact=True)


def test_streamed_csv_text_equals_pandas_whole_table(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 5)
    spec = load_scenario(None, ["workload.num_requests=30"])
    streamed = simulate(spec, out_dir=tmp_path / "run", steps_format="csv")
    expected = simulate(spec).steps.to_csv(index=False)
    assert (tmp_path / "run" / "steps.csv").read_text() == expected
    assert streamed.summary["num_steps"] == expected.count("\n") - 1


def test_sampled_and_none_stream_the_same_files_as_written_results(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder_module, "MAX_SAMPLED_STEPS", 9)
    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 4)
    spec = load_scenario(None, ["workload.num_requests=40", "steps=sampled"])
    streamed = simulate(spec, out_dir=tmp_path / "s", steps_format="csv")
    memory = simulate(spec)
    assert len(memory.steps) <= 9
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "s" / "steps.csv"), memory.steps, check_exact=True)
    none = simulate(spec, steps="none", out_dir=tmp_path / "n")
    assert not any(p.name.startswith("steps") for p in (tmp_path / "n").iterdir())
    assert none.summary == memory.summary == streamed.summary


def test_sampler_keeps_every_stride_th_step_and_the_last_without_knowing_the_total():
    """By hand: 23 steps fed in chunks of 3 with room for 5 rows: stride 1 → 2 → 4 → 8 as rows pile up;
    multiples of 8 below 23 are 0, 8, 16 (3 rows ≤ 5 − 1), multiples of 4 would be 6; plus the last, 22."""
    sampler = StepSampler(cap=5)
    index = np.arange(23)
    for start in range(0, 23, 3):
        part = index[start:start + 3]
        sampler.add({"time_s": part.astype(float), "n": part}, start)
    rows = sampler.rows()
    assert sampler.stride == 8
    assert list(rows["n"]) == [0, 8, 16, 22]
    assert list(rows["time_s"]) == [0.0, 8.0, 16.0, 22.0]


def _build_and_sort(scenario, max_model_len, rng):
    """The eager construction the workload module describes: every request built, then a stable sort."""
    w = scenario.workload
    records = workload._base_records(scenario, rng)
    arrivals = workload._arrivals(w, records, rng)
    prefix = w.shared_prefix
    n = len(records)
    with_prefix = rng.random(n) < prefix.fraction
    prefix_ids = rng.integers(0, prefix.num_prefixes, size=n)
    turns, think_s = w.multi_turn.turns, w.multi_turn.think_time_s
    specs, history = [], []
    for index in range(n):
        record = records[index]
        conv, turn = divmod(index, turns)
        if turn == 0:
            history = [(("system", int(prefix_ids[index])), prefix.tokens)] if with_prefix[index] else []
            conv_start = float(arrivals[conv * turns])
        prompt_segments = [*history, (("user", conv, turn), record.prompt_len)]
        prompt_len = sum(length for _, length in prompt_segments)
        room = max_model_len - prompt_len  # a prompt that alone reaches the limit keeps the output it asked
        output_len = max(1, record.output_len if room <= 0 else min(record.output_len, room))
        out_segment = (("reply", conv, turn), output_len)
        specs.append((conv_start + turn * think_s, prompt_len, output_len, (*prompt_segments, out_segment)))
        history = [*prompt_segments, out_segment]
    order = sorted(range(n), key=lambda i: specs[i][0])
    return [(rid, *specs[i]) for rid, i in enumerate(order)], order


def test_lazy_requests_equal_building_all_and_sorting():
    """Multi-turn conversations whose later turns arrive after other conversations start (think time ≫ the
    gap between conversations), with a shared system prompt: the lazy stream must equal the sorted list."""
    spec = load_scenario(None, ["workload.num_requests=300", "workload.multi_turn={turns: 4, think_time_s: 0.5}",
                                "workload.shared_prefix={tokens: 64, fraction: 0.5, num_prefixes: 3}",
                                "workload.arrival.rate=20"])
    expected, order = _build_and_sort(spec, 8192, np.random.default_rng(7))
    assert order != list(range(300))  # arrival order really differs from construction order
    got = list(workload.iter_requests(spec, 8192, np.random.default_rng(7)))
    assert [r.request_id for r in got] == list(range(300))
    assert [(r.request_id, r.arrival_s, r.prompt_len, r.output_len, r.content.segments) for r in got] == expected
    assert any(segments[0][0][0] == "system" for *_, segments in expected)


def test_requests_are_built_only_when_the_arrival_process_asks(monkeypatch):
    built = []

    def counting(*args, **kwargs):
        built.append(1)
        return Request(*args, **kwargs)

    monkeypatch.setattr(conversations, "Request", counting)  # every turn is built there (`TurnBuilder.request`)
    spec = load_scenario(None, ["workload.num_requests=1000"])
    stream = workload.iter_requests(spec, 8192, np.random.default_rng(0))
    assert not built  # every draw made, no request built yet
    first = next(stream)
    assert first.request_id == 0 and len(built) == 1
    assert isinstance(first.content, SegmentContent)


def test_finished_requests_are_not_kept_by_the_run():
    """When the run ends no Request is alive: the scheduler keeps columnar records, not the Request objects
    (the old `finished` list), and the workload is a stream, not a list."""
    import gc

    def live_requests():
        gc.collect()
        return sum(type(o) is Request for o in gc.get_objects())

    before = live_requests()
    alive_at_end = []

    def progress(now_s, done, total):  # the last call comes when the run has ended, inside `simulate`
        if done == total:  # counting the heap's objects is slow: only once every request has ended
            alive_at_end.append(live_requests() - before)

    result = simulate(load_scenario(None, ["workload.num_requests=80"]), progress=progress)
    assert alive_at_end[-1] == 0
    assert (result.requests["status"] == RequestStatus.FINISHED.value).sum() == 80
    assert list(result.requests["request_id"]) == list(range(80))


def _peak_bytes(num_requests, out_dir):
    spec = load_scenario(None, [f"workload.num_requests={num_requests}", "workload.prompt_len={dist: fixed, value: 24}",
                                "workload.output_len={dist: fixed, value: 4}", "workload.arrival.rate=1000",
                                "latency={model: constant, step_s: 0.002}", "engine.num_gpu_blocks_override=513"])  # 512 + v1's null block: 8,192 tokens
    tracemalloc.start()
    try:
        result = simulate(spec, out_dir=out_dir, steps_format="csv")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    model, gpu = load_model(spec.model), load_gpu(spec.gpu)
    floor = estimate_run_bytes(spec, model, gpu, spec.engine, result.summary["num_gpu_blocks"],
                               kv_bytes_per_block(model, spec.engine), steps_in_memory=False)
    return peak, result.summary["num_steps"], sum(floor.values())


@pytest.mark.slow
def test_peak_memory_of_a_steps_all_run_grows_far_less_than_its_requests(tmp_path, monkeypatch):
    """Ten times the requests (and steps, every one streamed to steps.csv): the traced peak must grow far
    less than tenfold. Before streaming, a run kept every Request (≈1 KB each with its content) and every
    step row: its peak grew 4.7× from 2k to 20k requests, about 970 bytes a request. Now the per-request
    cost is the columnar records and drawn lengths (≈ 200 B), and steps cost one chunk whatever their number."""
    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 512)
    small, large = sized((1000, 10_000), (2000, 20_000))
    _peak_bytes(50, tmp_path / "warm")  # imports and caches first, outside the measurement
    peak_small, steps_small, floor_small = _peak_bytes(small, tmp_path / "small")
    peak_large, steps_large, floor_large = _peak_bytes(large, tmp_path / "large")
    assert steps_large > 8 * steps_small > 8 * 512  # many chunks streamed in both runs
    assert floor_small <= peak_small and floor_large <= peak_large  # kvsim.results.budget's estimate stays a floor
    # Ratio 5x (it was 2.5x): writing without pandas and compact burst rows shrank the fixed part of the
    # peak (1k requests: 2.1 -> 0.95 MB; 10k: 5.2 -> 3.4 MB), so the ratio rose to ~3.5 while the growth per
    # request fell (343 -> 268 B). The per-request bound below (vs ~970 B before streaming) is the sharp check.
    assert peak_large < 5 * peak_small, (peak_small, peak_large)
    assert (peak_large - peak_small) / (large - small) < 400, (peak_small, peak_large)


def test_a_data_parallel_run_writes_the_same_steps_file(tmp_path):
    spec = load_scenario(None, ["workload.num_requests=30", "engine.data_parallel_size=2"])
    result = simulate(spec, out_dir=tmp_path / "dp", steps_format="csv")
    assert result.summary["data_parallel_size"] == 2
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "dp" / "steps.csv"), result.steps, check_exact=True)


def regrouped(steps, model):
    """A DP group's steps as the deployment's: lockstep steps (MoE) or the intervals between independent
    engines' step starts and ends (dense), from the whole table at once; and the engine steps counted."""
    if model == "qwen3-30b-a3b":
        return dp_group_steps(steps, 2), steps["time_s"].nunique()
    cut, rest = dp_interval_steps(steps)
    assert rest.empty
    return dp_group_steps(cut, 2), len(steps)


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "llama-3.1-8b"], ids=["moe-lockstep", "dense-independent"])
def test_chunked_data_parallel_steps_are_the_whole_tables_and_its_totals(tmp_path, monkeypatch, model):
    """Rows handed on 128 at a time (whole lockstep steps each; independent engines' steps cut across
    chunks), a preempting DP group: the streamed file and the in-memory rows are one table in (time_s,
    dp_rank) order, and the summary's step figures are those of the deployment's steps regrouped from that
    whole table at once (preemption counts carried across chunks: at 128 rows, 37 chunks, a count not carried
    fails this; at 256 it no longer did)."""
    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 128)
    spec = load_scenario(None, [f"model={model}", "workload.num_requests=120", "engine.data_parallel_size=2",
                                "workload.arrival.rate=200", "engine.max_model_len=1024",
                                "engine.num_gpu_blocks_override=160"])
    memory = simulate(spec)
    steps = memory.steps
    assert len(steps) > 10 * 128 and memory.summary["num_preemptions"] > 0
    assert steps.equals(steps.sort_values(["time_s", "dp_rank"]))
    group, num_steps = regrouped(steps, model)
    expected = StepTotals.of(group)
    assert memory.summary["num_steps"] == num_steps
    assert memory.summary["max_running"] == expected.max_running
    whole = summarize(memory.request_columns, expected, EngineCounters(num_preemptions=1), {})
    for key in ("duration_s", "mean_running", "sharing_saving"):
        assert memory.summary[key] == pytest.approx(whole[key], rel=1e-12)
    assert memory.summary["saturated"]["preemptions_per_s"] == pytest.approx(whole["saturated"]["preemptions_per_s"])
    assert memory.summary["waste"] == pytest.approx(whole["waste"], rel=1e-12)
    for fmt in ("csv", "parquet") if has_pyarrow() else ("csv",):
        streamed = simulate(spec, out_dir=tmp_path / fmt, steps_format=fmt)
        assert streamed.steps_path == tmp_path / fmt / f"steps.{fmt}" and streamed.step_columns is None
        pd.testing.assert_frame_equal(streamed.steps, steps, check_exact=True)
        assert streamed.summary == memory.summary
    sampled = simulate(spec, steps="sampled")
    assert sampled.summary == memory.summary and len(sampled.steps) == len(steps)  # under the cap: every row


def _dp_peak_bytes(num_requests, out_dir):
    spec = load_scenario(None, [f"workload.num_requests={num_requests}", "workload.prompt_len={dist: fixed, value: 24}",
                                "workload.output_len={dist: fixed, value: 32}", "workload.arrival.rate=400",
                                "latency={model: constant, step_s: 0.002}", "engine.num_gpu_blocks_override=513",
                                "engine.data_parallel_size=2"])
    tracemalloc.start()
    try:
        result = simulate(spec, out_dir=out_dir, steps_format="csv")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, len(pd.read_csv(out_dir / "steps.csv", usecols=["time_s"])), result.summary["num_steps"]


@pytest.mark.slow
def test_peak_memory_of_a_data_parallel_steps_all_run_grows_far_less_than_its_requests(tmp_path, monkeypatch):
    """The same bound for a lockstep DP group of 2 (every rank's row streamed to steps.csv): ten times the
    requests. Kept in memory and regrouped after the run (concatenated, sorted, pivoted), its rows (about
    2.5 rows of 160 B a request here) grew the peak by about 2.5 kB a request (7.8x from 1k to 10k
    requests); streamed a chunk of whole lockstep steps at a time, what grows is the requests' columns
    (about 0.3 kB a request, 3.4x from 1k to 10k). At 250 / 2,500 requests (768 and 6,403 rows: one chunk
    flushed in the small run, twelve in the large) the growth is 0.28 kB a request, as at 500 / 5,000, and 1.5x;
    the rows kept unflushed grow it by 3.5 kB a request, 6.1x (December 2026)."""
    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 512)
    small, large = sized((250, 2500), (2000, 20_000))
    _dp_peak_bytes(50, tmp_path / "warm")
    peak_small, rows_small, steps_small = _dp_peak_bytes(small, tmp_path / "small")
    peak_large, rows_large, steps_large = _dp_peak_bytes(large, tmp_path / "large")
    assert rows_large > 8 * rows_small > 8 * 512 and steps_large > 8 * steps_small  # many chunks in both runs
    assert peak_large < 5 * peak_small, (peak_small, peak_large)
    assert (peak_large - peak_small) / (large - small) < 600, (peak_small, peak_large)


def _fleet_peak_bytes(num_requests, out_dir):
    spec = load_scenario(None, [f"workload.num_requests={num_requests}", "workload.prompt_len={dist: fixed, value: 24}",
                                "workload.output_len={dist: fixed, value: 32}", "workload.arrival.rate=400",
                                "latency={model: constant, step_s: 0.002}", "engine.num_gpu_blocks_override=513",
                                "replicas=8", "router.policy=least_outstanding"])
    tracemalloc.start()
    try:
        result = simulate_fleet(spec, out_dir=out_dir, steps_format="csv")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, sum(r.summary["num_steps"] for r in result.replicas)


@pytest.mark.slow
def test_peak_memory_of_a_fleets_steps_all_run_grows_far_less_than_its_requests(tmp_path, monkeypatch):
    """The same bound for a fleet of 8 (every step of every replica streamed to steps.csv): ten times the
    requests. Kept in memory, a fleet's steps (about 30 rows of 160 B a request here, then concatenated
    into one table) made its peak grow by about 5.5 kB a request (7.4x from 1k to 10k requests); streamed,
    what grows is the requests' and routes' columns (about 0.7 kB a request with the fleet table)."""
    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 512)
    # at 350 / 3,500 requests (4,123 and 35,968 steps): 2.9x, 0.88 kB a request (500 / 5,000: 3.6x, 0.86 kB); with
    # every row kept in memory, 5.3x and 1.9 kB (December 2026)
    small, large = sized((350, 3500), (2000, 20_000))
    _fleet_peak_bytes(50, tmp_path / "warm")
    peak_small, steps_small = _fleet_peak_bytes(small, tmp_path / "small")
    peak_large, steps_large = _fleet_peak_bytes(large, tmp_path / "large")
    assert steps_large > 8 * steps_small > 8 * 8 * 512  # many chunks streamed by every replica
    assert peak_large < 5 * peak_small, (peak_small, peak_large)
    assert (peak_large - peak_small) / (large - small) < 1200, (peak_small, peak_large)


def test_a_streamed_fleet_writes_the_rows_an_in_memory_fleet_keeps(tmp_path, monkeypatch):
    """Streamed per replica in chunks, then concatenated in replica order: the file holds exactly the rows
    (and `replica` column) of the in-memory result, and the other files are the ones `write` makes."""
    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 64)
    spec = load_scenario(None, ["workload.num_requests=120", "replicas=3", "router.policy=least_kv"])
    memory = simulate_fleet(spec)
    for fmt in ("csv", "parquet") if has_pyarrow() else ("csv",):
        streamed = simulate_fleet(spec, out_dir=tmp_path / fmt, steps_format=fmt)
        assert streamed.steps_path == tmp_path / fmt / f"steps.{fmt}"
        pd.testing.assert_frame_equal(streamed.steps, memory.steps, check_exact=True)
        assert streamed.summary == memory.summary
        assert not [p for p in (tmp_path / fmt).iterdir() if p.name.startswith(".steps")]
    memory.write(tmp_path / "written")
    for name in ("requests.csv", "routes.csv", "replicas.csv", "summary.json", "steps.csv"):
        assert (tmp_path / "written" / name).read_bytes() == (tmp_path / "csv" / name).read_bytes(), name


def test_a_run_under_a_profiler_that_reads_frame_locals_completes(monkeypatch):
    """Profilers and debuggers (pyinstrument, pdb) read `frame.f_locals`, which keeps a snapshot of a
    function's locals alive after the function `del`s them. The step buffers must not depend on their numpy
    views being gone when a chunk is flushed (an `array` exporting its buffer cannot be resized: a
    `kvsim report` under pyinstrument failed with BufferError). The hook snapshots the caller's locals at
    every comprehension call, as a sampling profiler may at any instant; the rows equal a plain run's."""
    import sys

    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 7)
    spec = load_scenario(None, ["workload.num_requests=20"])
    plain = simulate(spec)

    def snapshot(frame, event, arg):
        if event == "call" and frame.f_code.co_name.startswith("<") and frame.f_back is not None:
            frame.f_back.f_locals  # noqa: B018 -- the read is the point: it pins the caller's locals
    sys.setprofile(snapshot)
    try:
        profiled = simulate(spec)
    finally:
        sys.setprofile(None)
    pd.testing.assert_frame_equal(profiled.steps, plain.steps, check_exact=True)
    assert profiled.summary == plain.summary
