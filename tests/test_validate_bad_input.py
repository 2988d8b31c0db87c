"""`kvsim validate` on malformed measured runs: every value it reads is checked where it is read.

Each case breaks one field of the tiny run of test_validate.py (or its bench JSON) the way a corrupt or
hand-edited file would; the reader must name the file, the field and the value (never a traceback, and
never a default silently used in place of the bad value), and the CLI must exit 2 writing nothing.
"""

import json
import math
import re
from pathlib import Path

import pytest
from test_validate import _patch_json, bench_json, write_run
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.model.errors import KvsimError
from kvsim.validation.compare import measured_phase_rates, series_tick_s
from kvsim.validation.measured import load_measured, read_llmservingsim, read_measured_dir
from kvsim.validation.recorded import recorded_settings


def _engine(**changes):
    def edit(run: Path) -> None:
        meta = json.loads((run / "vllm" / "meta.json").read_text())
        _patch_json(run / "vllm" / "meta.json", engine_kwargs={**meta["engine_kwargs"], **changes})
    return edit


def _requests(edit_rows):
    def edit(run: Path) -> None:
        path = run / "vllm" / "requests.jsonl"
        rows = edit_rows([json.loads(line) for line in path.read_text().splitlines()])
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return edit


def _file(name: str, text: str):
    def edit(run: Path) -> None:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
    return edit


SERIES = "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
PEER = "instance id,request id,model,input,output,arrival,end_time,latency,queuing_delay,TTFT,TPOT,ITL\n"
PEER_ROW = "0,0,m,16,5,{arrival},{end},0,{queuing},{ttft},0,[]\n"  # nanoseconds


def _peer(arrival="0", end="50000000", queuing="0", ttft="10000000", tokens="16,5"):
    return _file("outputs/sim.csv", PEER + PEER_ROW.format(arrival=arrival, end=end, queuing=queuing, ttft=ttft)
                 .replace("16,5", tokens))


FOLDER_CASES = {
    # meta.json's engine arguments: a value of the wrong JSON type, not read as 1 or as "on"
    "max_num_seqs true": (_engine(max_num_seqs=True), r"meta.json: engine_kwargs.max_num_seqs=True is not an integer"),
    "tp a string": (_engine(tensor_parallel_size="2"), r"engine_kwargs.tensor_parallel_size='2' is not an integer"),
    "dp not a number": (_engine(data_parallel_size="x"), r"engine_kwargs.data_parallel_size='x' is not an integer"),
    "ep 'false'": (_engine(enable_expert_parallel="false"),
                   r"engine_kwargs.enable_expert_parallel='false' is not true or false"),
    "utilization true": (_engine(gpu_memory_utilization=True), r"gpu_memory_utilization=True is not a number"),
    "eager 'true'": (_engine(enforce_eager="true"), r"engine_kwargs.enforce_eager='true' is not true or false"),
    "kv dtype a number": (_engine(kv_cache_dtype=8), r"engine_kwargs.kv_cache_dtype=8 is not a string"),
    "started_at naive": (lambda run: _patch_json(run / "vllm" / "meta.json", started_at="2026-01-01T00:00:00"),
                         r"started_at='2026-01-01T00:00:00' has no time zone"),
    # meta.json's num_requests (the requests the benchmark sent): the run has 2 rows
    "num_requests below the rows": (lambda run: _patch_json(run / "vllm" / "meta.json", num_requests=1),
                                    r"meta.json: num_requests=1 but requests.jsonl records 2 requests: not this run's"),
    "num_requests a string": (lambda run: _patch_json(run / "vllm" / "meta.json", num_requests="2"),
                              r"meta.json: num_requests='2' is not a whole number of requests >= 1"),
    "vllm_version a number": (lambda run: _patch_json(run / "vllm" / "meta.json", vllm_version=0.19),
                              r"meta.json: vllm_version=0.19 is not text"),
    # values that were skipped in silence: a section that is no object (its pool with it), a tick that is no number
    # or not the series' own, a started_at with no arrival_time to align the series by (it was never parsed)
    "cache_config a string": (lambda run: _patch_json(run / "vllm" / "meta.json", cache_config="x"),
                              r"meta.json: cache_config='x' is not an object"),
    "tick_seconds a string": (lambda run: _patch_json(run / "vllm" / "meta.json", tick_seconds="x"),
                              r"meta.json: tick_seconds='x' is not a positive number of seconds"),
    "tick_seconds not the rows'": (
        lambda run: (_patch_json(run / "vllm" / "meta.json", tick_seconds=1.0),
                     _file("vllm/timeseries.csv", SERIES + "1.0,48,8,0,0,0\n3.0,0,0,0,0,0\n5.0,0,0,0,0,0\n")(run)),
        r"meta.json: tick_seconds=1.0, but timeseries.csv's rows are 2 s apart: one of the two is not this run's"),
    # rows 0.1 us apart: kvsim bins its rates by the rows' gap (since 2b68d87), which rounded to 0 s: np.bincount's
    # ValueError, a traceback after the replay had run
    "rows under a millisecond apart": (_file("vllm/timeseries.csv", SERIES + "1.0,48,8,1,0,0\n1.0000001,0,0,0,0,0\n"
                                             "1.0000002,0,0,0,0,0\n"),
                                       r"timeseries.csv: t: its rows are 0 s apart \(the median gap, to the "
                                       r"microsecond\), under 0.001 s: t counts seconds"),
    "started_at unaligned and bad": (
        lambda run: (_patch_json(run / "vllm" / "meta.json", started_at="yesterday"),
                     _requests(lambda rows: [{k: v for k, v in r.items() if k != "arrival_time"} for r in rows])(run)),
        r"meta.json: started_at='yesterday' is not an ISO timestamp"),
    # requests.jsonl
    "fractional tokens": (_requests(lambda rows: [rows[0], {**rows[1], "input_toks": 32.7}]),
                          r"requests.jsonl:2: input_toks=32.7 is not a positive whole number of tokens"),
    "request twice": (_requests(lambda rows: [rows[0], rows[0]]),
                      r"request 'bench-0' is workload line 1 again"),
    "arrival_time true": (_requests(lambda rows: [{**r, "arrival_time": True} for r in rows]),
                          r"requests.jsonl:1: arrival_time=True is not a number"),
    # timeseries.csv
    "running nan": (_file("vllm/timeseries.csv", SERIES + "1.0,48,8,nan,0,0\n"),
                    r"timeseries.csv:2: running='nan' is not a finite number >= 0"),
    "waiting negative": (_file("vllm/timeseries.csv", SERIES + "1.0,48,8,1,-2,0\n"),
                         r"timeseries.csv:2: waiting='-2' is not a finite number >= 0"),
    "kv above 100": (_file("vllm/timeseries.csv", SERIES + "1.0,48,8,1,0,250\n"),
                     r"kv_cache_pct='250' is not a finite number in \[0, 100\]"),
    "t backwards": (_file("vllm/timeseries.csv", SERIES + "2.0,0,0,0,0,0\n1.0,48,8,1,0,0\n"),
                    r"timeseries.csv:3: t='1.0' is not after the row before it"),
    "t repeated": (_file("vllm/timeseries.csv", SERIES + "1.0,0,0,0,0,0\n1.0,48,8,1,0,0\n"),
                   r"timeseries.csv:3: t='1.0' is not after"),
    # config.json (LLMServingSim's cluster config)
    "config a list": (_file("config.json", "[]"), r"config.json: expected a JSON object"),
    "nodes a number": (_file("config.json", '{"nodes": 5}'), r"config.json: nodes=5 is not a list of objects"),
    "instances a string": (_file("config.json", '{"nodes": [{"instances": "ab"}]}'),
                           r"nodes\[0\].instances='ab' is not a list of objects"),
    "hardware a number": (_file("config.json", '{"nodes": [{"instances": [{"hardware": 5}]}]}'),
                          r"nodes\[0\].instances\[0\].hardware=5 is not a name"),
    # outputs/sim.csv (the peer's prediction)
    "peer without rows": (_file("outputs/sim.csv", PEER), r"sim.csv: no requests"),
    "peer TTFT nan": (_peer(ttft="nan"), r"sim.csv:2: arrival='0', TTFT='nan', end_time='50000000': not finite"),
    "peer TTFT negative": (_peer(ttft="-5"), r"sim.csv:2: TTFT='-5': negative"),
    "peer ends early": (_peer(arrival="60000000"), r"sim.csv:2: .*end_time='50000000': an end before the first token"),
    "peer queues past TTFT": (_peer(queuing="20000000"), r"queuing_delay='20000000', TTFT='10000000'"),
    "peer without output": (_peer(tokens="16,0"), r"sim.csv:2: input='16', output='0': fewer than one token"),
}


@pytest.mark.parametrize("case", FOLDER_CASES)
def test_measured_folder_bad_value_is_named(tmp_path, case):
    edit, message = FOLDER_CASES[case]
    run_dir = write_run(tmp_path)
    edit(run_dir)
    with pytest.raises(KvsimError, match=message):
        read_measured_dir(run_dir)


@pytest.mark.parametrize(("value", "shown"), [(0, "0"), (-5, "-5"), ("1000", "'1000'"), (True, "True"),
                                              (12.5, "12.5"), ([1], r"\[1\]"), (math.inf, "inf"),
                                              (math.nan, "nan")])
def test_recorded_pool_that_is_not_a_block_count_is_named(tmp_path, value, shown):
    run_dir = write_run(tmp_path)
    _patch_json(run_dir / "vllm" / "meta.json", num_gpu_blocks=value)
    with pytest.raises(KvsimError, match=rf"meta.json: num_gpu_blocks={shown} is not a whole number of blocks"):
        recorded_settings(run_dir)


@pytest.mark.parametrize(("changes", "message"), [
    ({"gpu_name": 5}, r"meta.json: gpu_name=5 is not a GPU name"),
    ({"engine_kwargs": {"num_gpu_blocks": 0}}, r"num_gpu_blocks=0 is not a whole number"),
])
def test_recorded_gpu_and_pool_are_checked(tmp_path, changes, message):
    run_dir = write_run(tmp_path)
    _patch_json(run_dir / "vllm" / "meta.json", **changes)
    with pytest.raises(KvsimError, match=message):
        recorded_settings(run_dir)


def test_bench_metadata_true_for_an_engine_argument_is_named(tmp_path):
    with pytest.raises(KvsimError, match=r"b.json: max_num_seqs=True is not a number or a name"):
        recorded_settings(bench_json(tmp_path / "b.json", max_num_seqs=True))


def test_phase_rate_cell_that_is_not_a_number_is_named(tmp_path):
    run_dir = write_run(tmp_path)
    (run_dir / "vllm" / "timeseries.csv").write_text(SERIES + "1.0,48,x,0,0,0\n")
    with pytest.raises(KvsimError, match=r"timeseries.csv:2: gen_throughput='x' is not a number"):
        measured_phase_rates(run_dir)


BENCH_CASES = {
    "errors a number": ({"errors": 5}, r"errors=5 is not a list"),
    "errors not strings": ({"errors": [1, "", ""]}, r"errors must hold one string per request"),
    "latencies short": ({"latencies": [0.05, 0.06]}, r"latencies has 2 entries, input_lens has 3"),
    "start_times a string": ({"start_times": "x"}, r"start_times='x' is not a list"),
    "input_lens a dict": ({"input_lens": {"a": 1}}, r"input_lens=\{'a': 1\} is not a list"),
    "negative output": ({"output_lens": [5, -3, 0]}, r"output_lens\[1\]=-3 is not a whole number of tokens >= 0"),
    "fractional prompt": ({"input_lens": [16.5, 32, 8]}, r"input_lens\[0\]=16.5 is not a whole number of tokens"),
    "gap not a number": ({"itls": [["x"] * 4, [0.02, 0.02], []]}, r"itls\[0\]\[0\]='x' is not a number"),
    "gaps not a list": ({"itls": [5, [0.02, 0.02], []]}, r"itls must hold one list of gaps per request"),
    "burstiness zero": ({"start_times": None, "burstiness": 0}, r"burstiness=0 is not a positive number"),
    "burstiness a string": ({"start_times": None, "burstiness": "x"}, r"burstiness='x' is not a positive number"),
    "rate true": ({"start_times": None, "request_rate": True}, r"request_rate=True is not a positive number"),
    "rate nan": ({"start_times": None, "request_rate": float("nan")}, r"request_rate=nan is not a positive number"),
}


@pytest.mark.parametrize("case", BENCH_CASES)
def test_bench_json_bad_value_is_named(tmp_path, case):
    changes, message = BENCH_CASES[case]
    with pytest.raises(KvsimError, match=message):
        load_measured(bench_json(tmp_path / "b.json", **changes))


def test_peer_file_with_a_good_row_still_reads(tmp_path):
    _peer()(tmp_path)
    peer = read_llmservingsim(tmp_path / "outputs" / "sim.csv")
    assert peer is not None and peer.ttft_s.tolist() == pytest.approx([0.01])


CLI_CASES = {  # one per family, through the command line
    "engine argument": (FOLDER_CASES["max_num_seqs true"][0], [], "engine_kwargs.max_num_seqs=True"),
    "recorded pool": (lambda run: _patch_json(run / "vllm" / "meta.json", num_gpu_blocks=-5), [], "num_gpu_blocks=-5"),
    "request twice": (FOLDER_CASES["request twice"][0], [], "is workload line 1 again"),
    "series": (FOLDER_CASES["t backwards"][0], [], "t='1.0' is not after"),
    "phase rates": (_file("vllm/timeseries.csv", SERIES + "1.0,48,x,0,0,0\n"), [], "gen_throughput='x'"),
    "series ticks under a millisecond": (FOLDER_CASES["rows under a millisecond apart"][0], [],
                                         "its rows are 0 s apart"),
    "config": (FOLDER_CASES["nodes a number"][0], [], "nodes=5 is not a list of objects"),
    "peer": (FOLDER_CASES["peer TTFT negative"][0], [], "TTFT='-5': negative"),
    "profile without calibrated": (lambda run: None, ["--profile", "p"], "only --latency calibrated reads a profile"),
}


@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, case):
    edit, flags, message = CLI_CASES[case]
    run_dir = write_run(tmp_path)
    edit(run_dir)
    result = CliRunner().invoke(app, ["validate", str(run_dir), "--gpu", "h100-80gb", "-o", str(tmp_path / "o"),
                                      *flags])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert re.search(re.escape(message), result.output), result.output
    assert not (tmp_path / "o").exists()


def test_cli_bench_bad_input_exits_2_and_writes_nothing(tmp_path):
    path = bench_json(tmp_path / "b.json", latencies=[0.05])
    result = CliRunner().invoke(app, ["validate", str(path), "--gpu", "h100-80gb", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "latencies has 1 entries, input_lens has 3" in result.output, result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("meta", "notes"), [
    ({}, []),  # the tiny run's engine_kwargs: all read (model, ENGINE_KEYS)
    ({"num_requests": 2, "engine_kwargs": {"seed": 42, "dtype": "bfloat16"}}, []),  # as the shared runs record
    ({"engine_kwargs": {"enable_chunked_prefill": False, "swap_space": 8, "dtype": "float32"}},
     ["meta.json's engine_kwargs enable_chunked_prefill=False, swap_space=8, dtype='float32': not replayed (the "
      "replay runs kvsim's defaults there; --set an engine field where kvsim has one)"]),
    ({"num_requests": 5}, ["meta.json's num_requests=5 but requests.jsonl records 2: the 3 not recorded (failed, "
                           "or lost) loaded the server and are not replayed"]),
    ({"vllm_version": "0.19.0"}, []),  # the release the replay follows (the shared runs'), and any after it
    ({"vllm_version": "0.20.1"}, []),
    ({"vllm_version": "0.10.1.1"}, ["meta.json's vllm_version='0.10.1.1': the replay follows vLLM 0.19's defaults "
                                    "where engine_kwargs gives none (asynchronous scheduling, since late 2025; "
                                    "CUDA-graph padding); record engine_kwargs.async_scheduling and enforce_eager as "
                                    "that version ran them"]),  # read in silence before: replayed as a 0.19
    # keys no reader takes, at the top level and in cache_config (kvsim reads its num_gpu_blocks alone)
    ({"gpu_type": "NVIDIA H100 80GB HBM3", "cache_config": {"num_gpu_blocks": 900, "cache_dtype": "fp8"},
      "dataset_hash": "05e4", "tick_seconds": 1.0},
     ["meta.json's gpu_type='NVIDIA H100 80GB HBM3', cache_config.cache_dtype='fp8': not read (the replay follows "
      "engine_kwargs and its defaults there; --set an engine field, or --gpu, where one applies)"]),
])
def test_what_meta_json_says_that_the_replay_cannot_follow_is_noted(tmp_path, meta, notes):
    """engine_kwargs the replay does not read and a num_requests above the recorded rows were ignored without a
    word: vLLM ran with those arguments, and the requests it was sent but that left no row loaded the server. The
    tiny run records 2 requests; each note names the keys and values, or both counts and their difference."""
    run_dir = write_run(tmp_path)
    path = run_dir / "vllm" / "meta.json"
    kwargs = meta.pop("engine_kwargs", {})
    _patch_json(path, **meta, engine_kwargs={**json.loads(path.read_text())["engine_kwargs"], **kwargs})
    assert [n for n in read_measured_dir(run_dir).notes if n.startswith("meta.json's")] == notes


@pytest.mark.parametrize("arrival_times", [True, False])
def test_a_started_at_of_null_is_not_recorded_not_refused(tmp_path, arrival_times):
    """`"started_at": null` is a harness's "not recorded", as null is for every other meta.json value (num_requests,
    vllm_version, tick_seconds, an engine_kwargs entry): the series is then taken to start at the first arrival and
    the note says so. It was refused, 'started_at=None is not an ISO timestamp', even where the requests carry no
    arrival_time to align by (read since 61761e7 whenever the key is present). By hand: unaligned, the series' one
    row keeps its t of 1.0 s (aligned by the tiny run's started_at it reads 0.5 s: test_validate.py)."""
    run_dir = write_run(tmp_path)
    _patch_json(run_dir / "vllm" / "meta.json", started_at=None)
    if not arrival_times:
        _requests(lambda rows: [{k: v for k, v in r.items() if k != "arrival_time"} for r in rows])(run_dir)
    run = read_measured_dir(run_dir)
    assert run.timeseries is not None and run.timeseries.t_s.tolist() == [1.0]
    assert any(n.startswith("timeseries.csv is taken to start at the first arrival") for n in run.notes)


def test_a_series_read_a_few_milliseconds_late_each_tick_is_its_tick_seconds(tmp_path):
    """vLLM's server logs its rates after `asyncio.sleep(VLLM_LOG_STATS_INTERVAL)` plus the log call, on the event loop
    that streams the responses, so a series logged or polled each second runs a little late every tick: rows 1.005 s
    apart beside `tick_seconds: 1.0` were refused ('rows are 1.005 s apart: one of the two is not this run's'; the
    check held 0.1 %). They read, binned by their own gap (1.005 s, by hand: t = 1.005 k); rows 2 s apart beside
    1.0 are still refused (FOLDER_CASES)."""
    run_dir = write_run(tmp_path)
    _patch_json(run_dir / "vllm" / "meta.json", tick_seconds=1.0)
    _file("vllm/timeseries.csv", SERIES + "1.005,48,8,1,0,0\n2.010,0,0,0,0,0\n3.015,0,0,0,0,0\n")(run_dir)
    run = read_measured_dir(run_dir)
    assert series_tick_s(run.timeseries) == 1.005
