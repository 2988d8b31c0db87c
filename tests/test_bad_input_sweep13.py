"""Bad input found by the thirteenth sweep (folders left by a failed write, a scenario copied or read from JSON in
Python, a path set on the built-in scenario, instants past the clock's microseconds, a GPU file's roofline fractions,
a profile's skew fit, numbers with underscores in an environment variable, a bundle and a ServeGen dataset, an
autoscaler's ratios past a float, a rate search finer than a float, integers and sizes past int64): each exits 2
with one line naming the field and the value, and writes nothing, never a traceback, a hang, or a value read as
another without a word."""

import pytest
from conftest import one_line_exit_2

RUN = ["run", "--set", "workload.num_requests=3", "--set", "steps=none"]


def _files(folder):
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


@pytest.mark.parametrize("output", [None, "a/b/run"])
def test_a_run_refused_mid_way_leaves_no_folder_it_made(tmp_path, monkeypatch, output):
    """A run stopped after its output folder was opened (a bad trace row is read there) removed its temporary
    folder but left the folders it had made above it: `-o a/b/run` left `a/b/`, the default `runs/default`
    an empty `runs/`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,10,10\n"
                                    "2023-11-16 18:17:04.1,10,x\n")
    (tmp_path / "s.yaml").write_text("workload:\n  num_requests: 5\n  arrival: {process: trace}\n"
                                     "  trace: {format: azure, path: t.csv}\n")
    argv = ["run", "s.yaml", *([] if output is None else ["-o", output])]
    assert one_line_exit_2(argv) == "t.csv:3: GeneratedTokens='x' is not an integer"
    assert _files(tmp_path) == ["s.yaml", "t.csv"]


def test_a_run_over_its_memory_limit_leaves_no_runs_folder(tmp_path, monkeypatch):
    """The memory estimate is checked as the run starts, inside its output folder: `runs/` stayed."""
    monkeypatch.chdir(tmp_path)
    message = one_line_exit_2([*RUN, "--memory-limit", "1B"])
    assert message.endswith("more than the limit of 1 B; make it smaller or raise --memory-limit")
    assert _files(tmp_path) == []


def test_a_failed_write_keeps_the_folders_that_were_there(tmp_path, monkeypatch):
    """Only the folders the failed run made are removed: an existing (empty) parent stays."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    one_line_exit_2([*RUN, "--memory-limit", "1B", "-o", "runs/deep/er"])
    assert _files(tmp_path) == ["runs"]


@pytest.mark.parametrize(("update", "message"), [
    ({"seed": -5}, "seed=-5: Input should be greater than or equal to 0"),
    ({"replicas": 0}, "replicas=0: expected 1..4096"),
    ({"bogus": 1}, "bogus: unknown key"),
    ({"engine": {"block_size": 7}}, "engine: block_size=7: vLLM accepts 1, 8, 16, 32, 64, 128, 256"),
])
def test_a_scenario_copied_with_a_bad_update_is_refused_in_one_line(update, message):
    """`model_copy(update=...)`, a notebook's way to a variant of a frozen scenario, set the update unchecked
    (pydantic's): seed=-5 ran into numpy's ValueError mid-run, replicas=0 into a ZeroDivisionError, an engine
    given as a dict into an AttributeError, and an unknown key ran without a word."""
    import kvsim
    from kvsim.model.errors import KvsimError

    base = kvsim.load_scenario(None, {"workload.num_requests": 3})
    with pytest.raises(KvsimError) as caught:
        base.model_copy(update=update)
    assert str(caught.value) == message


def test_a_scenario_copied_with_a_good_update_is_the_scenario_given_those_fields():
    """The update is validated as the fields of a new scenario are: an engine given as a dict becomes the
    EngineConfig it describes, and the fields given stay the ones given (`model_fields_set`)."""
    import kvsim
    from kvsim.model.engine_config import EngineConfig

    base = kvsim.load_scenario(None, {"workload.num_requests": 3})
    copied = base.model_copy(update={"engine": {"block_size": 32}, "seed": 4})
    assert copied.engine == EngineConfig(block_size=32) and copied.seed == 4
    assert copied.workload == base.workload and copied.base_dir == base.base_dir
    assert copied.model_fields_set == base.model_fields_set | {"engine", "seed"}
    assert copied.engine.model_copy(update={"block_size": 64}).block_size == 64


@pytest.mark.parametrize(("text", "message"), [
    ('{"workload": 1}', "workload=1: a section, not one value: set its fields (num_requests, arrival, prompt_len, "
                        "output_len, shared_prefix, multi_turn, ...), e.g. workload.num_requests=..."),
    ("{", "scenario JSON: not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
          "(char 1))"),
    ('{"seed": 1, "seed": 2}', "scenario JSON: not valid JSON (duplicate key 'seed': give each key once: line 1 "
                               "column 13 (char 12))"),
])
def test_a_scenario_read_from_json_in_python_refuses_a_field_in_one_line(text, message):
    """`Scenario.model_validate_json` raised pydantic's multi-line ValidationError where `model_validate` raises
    one KvsimError line, and kept the last of a key given twice, which every JSON kvsim reads refuses."""
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError) as caught:
        kvsim.Scenario.model_validate_json(text)
    assert str(caught.value) == message
    fields = '{"workload": {"prompt_len": {"dist": "fixed", "value": 5}, "output_len": {"dist": "fixed", "value": 5}}}'
    assert kvsim.Scenario.model_validate_json(fields).workload.prompt_len.value == 5


AZURE_TWO_ROWS = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,10,10\n2023-11-16 18:17:04.1,10,5\n"


def test_a_path_set_on_the_built_in_scenario_is_read_from_the_working_folder(tmp_path, monkeypatch):
    """Without a scenario file, `--set workload.trace.path=t.csv` was looked for beside the built-in default
    scenario, in kvsim's installed package (`file not found: .../kvsim/workload/data/t.csv`), where a dict
    scenario's relative paths are the working folder's; the run now reads the file here (its two rows)."""
    import json

    from typer.testing import CliRunner

    from kvsim.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(AZURE_TWO_ROWS)
    argv = ["run", "--set", "steps=none", "--set", "workload.trace={format: azure, path: t.csv}",
            "--set", "workload.arrival={process: trace}", "--set", "workload.prompt_len=null",
            "--set", "workload.output_len=null", "-o", "out", "--format", "json"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_requests"] == 2
    assert "path: " + str(tmp_path / "t.csv") in (tmp_path / "out" / "scenario.yaml").read_text()
    assert one_line_exit_2(["run", "--set", "latency={model: calibrated, profile: nope.csv}"]) == (
        "latency.profile='nope.csv': file not found: nope.csv")


def test_an_autoscaler_of_more_engines_than_kvsim_builds_is_refused_naming_max_replicas(tmp_path):
    """`autoscaler.max_replicas` had no bound where `replicas` has 4,096 (MAX_ENGINES): the fleet is built at
    its largest, so 10**9 was refused only by the memory estimate, and not at all under a large --memory-limit."""
    argv = [*RUN, "--set", "replicas=1", "--set", "router.policy=least_outstanding",
            "--set", "autoscaler.max_replicas=4097", "-o", str(tmp_path / "out")]
    assert one_line_exit_2(argv) == "autoscaler.max_replicas=4097: Input should be less than or equal to 4096"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("settings", "message"), [
    # constant gaps of 1 / 1e-10 = 1e10 s: request 1 (0-based) at 1e10 s, past 2**32 = 4.29e9 s
    (["workload.arrival={process: constant, rate: 1e-10}"], "workload.arrival.rate=1e-10: request 1 of 3 would arrive "
     "at 1e+10 s (past 4.29497e+09 s, about 136 years, where the clock keeps no microsecond); give a larger rate or "
     "fewer requests"),
    # turn 2 of the first conversation, one think time of 5e9 s after its first at 0 s
    (["workload.multi_turn={turns: 2, think_time_s: 5e9}"], "workload.multi_turn.think_time_s=5e+09: turn 2 of a "
     "conversation would be sent at 5e+09 s (past 4.29497e+09 s, about 136 years, where the clock keeps no "
     "microsecond), 1 think times after its first; give a shorter think time"),
])
def test_an_instant_where_the_clock_keeps_no_microsecond_is_refused(tmp_path, settings, message):
    """Only an instant past the largest float (inf) was refused: a request at 1e10 s ran on a clock whose float
    keeps 2 us there, and at 1e297 s (a Mooncake timestamp of 1e300 ms) every step took no time (TTFT 0)."""
    out = tmp_path / "out"
    argv = [*RUN, "--set", "workload.num_requests=3", *[a for s in settings for a in ("--set", s)], "-o", str(out)]
    assert one_line_exit_2(argv) == message
    assert not out.exists()


def test_a_trace_timestamp_where_the_clock_keeps_no_microsecond_is_refused(tmp_path):
    """The second row's 1e13 ms is 1e10 s after the first's 0 ms."""
    (tmp_path / "t.jsonl").write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
        '{"timestamp": 1e13, "input_length": 10, "output_length": 5, "hash_ids": [2]}\n')
    out = tmp_path / "out"
    argv = [*RUN, "--set", "workload.num_requests=2",  # the trace's 2 rows: no warning of a short trace before it
            "--set", f"workload.trace={{format: mooncake, path: {tmp_path / 't.jsonl'}}}",
            "--set", "workload.arrival={process: trace}", "--set", "workload.prompt_len=null",
            "--set", "workload.output_len=null", "-o", str(out)]
    assert one_line_exit_2(argv) == (
        "workload.trace.rate_scale=1: request 1 of 2 would arrive at 1e+10 s (past 4.29497e+09 s, about 136 years, "
        "where the clock keeps no microsecond); give a larger rate or fewer requests")
    assert not out.exists()


def test_a_request_sent_just_before_the_bound_runs(tmp_path):
    """1 / 2.5e-10 = 4e9 s, under 2**32 s: request 1 arrives there, and its TTFT is request 0's (one 10-token
    prompt on an idle engine each, the second 126 years later: the same step)."""
    import json

    from typer.testing import CliRunner

    from kvsim.cli import app

    argv = ["run", "--set", "workload.num_requests=2", "--set", "workload.arrival={process: constant, rate: 2.5e-10}",
            "--set", "workload.prompt_len={dist: fixed, value: 10}", "--set", "workload.output_len={dist: fixed, value: 2}",
            "--set", "engine.enable_prefix_caching=false", "--set", "steps=none", "-o", str(tmp_path / "out"),
            "--format", "json"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["num_finished"] == 2 and summary["duration_s"] >= 4e9
    ttft = summary["ttft_s"]
    assert ttft["p99"] == pytest.approx(ttft["p50"], rel=1e-3)


GPU_FILE = ("memory_bytes: 80GiB\nhbm_bandwidth_bytes_per_s: 3.35e12\nfp16_flops: 989e12\n"
            "host_link_bandwidth_bytes_per_s: 64e9\nefficiency: {efficiency}\n")


@pytest.mark.parametrize(("efficiency", "problem"), [
    ("{prefill_flops: 0}", "prefill_flops=0: expected a positive fraction of the datasheet rate"),  # ZeroDivisionError
    ("{gemm_flops: -1}", "gemm_flops=-1: expected a positive fraction of the datasheet rate"),  # ran, negative times
    ("{decode_bandwidth: x}", "decode_bandwidth='x': expected a positive fraction of the datasheet rate"),  # TypeError
    ("{gemm_flops: true}", "gemm_flops=True: expected a positive fraction of the datasheet rate"),
    ("{cpu_fixed_s: -1}", "cpu_fixed_s=-1: expected seconds, 0 to 3600"),
    ("{token_op_speed_by_class: [1]}", "token_op_speed_by_class=[1]: expected a list of 3 positive numbers (or none)"),
    ("{gemm_flops_by_regime: [0.5]}", "gemm_flops_by_regime=[0.5]: expected a list of 5 positive numbers (or none)"),
    ("{token_op_l2_share: 2}", "token_op_l2_share=2: expected a share, 0 to 1"),
    ("{source: 5}", "source=5: expected text"),
])
def test_a_gpu_files_roofline_fractions_are_checked(tmp_path, efficiency, problem):
    """A GPU file's `efficiency` mapping reached the roofline unchecked: a zero divided (ZeroDivisionError), text
    or a short list failed mid-run (TypeError, IndexError), a negative fraction or cost ran on negative times."""
    gpu = tmp_path / "mygpu.yaml"
    gpu.write_text(GPU_FILE.format(efficiency=efficiency))
    out = tmp_path / "out"
    assert one_line_exit_2([*RUN, "--set", f"gpu={gpu}", "-o", str(out)]) == f"gpu mygpu: efficiency.{problem}"
    assert not out.exists()


def test_a_gpu_files_good_roofline_fractions_run(tmp_path):
    """Lists of the right length, a fraction over 1 (the mixed decode's is 1.48 in the fits) and a source pass."""
    gpu = tmp_path / "mygpu.yaml"
    gpu.write_text(GPU_FILE.format(efficiency="{gemm_flops_by_regime: [0.5, 0.5, 0.5, 0.6, 0.7], "
                                              "token_op_speed_by_class: [1.2, 1.4, 2.9], mixed_decode_bandwidth: 1.5, "
                                              "cpu_fixed_s: 0, source: mine}"))
    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, [*RUN, "--set", f"gpu={gpu}", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output


def test_the_no_worker_timeout_refuses_an_underscore(monkeypatch):
    """KVSIM_DASK_NO_WORKERS_TIMEOUT_S read `1_0` as 10 s (float()), where sweep 12 refuses a number written with
    an underscore everywhere else kvsim reads one."""
    from kvsim.model.errors import KvsimError
    from kvsim.planning.search import NO_WORKERS_TIMEOUT_ENV, no_workers_timeout_s

    monkeypatch.setenv(NO_WORKERS_TIMEOUT_ENV, "1_0")
    with pytest.raises(KvsimError) as caught:
        no_workers_timeout_s()
    assert str(caught.value) == f"{NO_WORKERS_TIMEOUT_ENV}='1_0': expected a positive number of seconds"
    monkeypatch.setenv(NO_WORKERS_TIMEOUT_ENV, "10")
    assert no_workers_timeout_s() == 10.0


@pytest.mark.parametrize(("old", "new", "message"), [
    ("alpha_default: 0.05", "alpha_default: .nan", "skew_fit.per_tp.1.alpha_default=nan is not a finite number"),
    ("alpha_default: 0.05", "alpha_default: .inf", "skew_fit.per_tp.1.alpha_default=inf is not a finite number"),
    ("alpha_default: 0.05", "alpha_default: 1_0", "skew_fit.per_tp.1.alpha_default='1_0' is not a finite number"),
    ("kv_big_bins: [0, 1024, 1000000000]", "kv_big_bins: [0, 1000000000, 1024]",
     "skew_fit.bucket_axes.kv_big_bins=[0.0, 1000000000.0, 1024.0]: expected finite numbers, increasing (label i's "
     "bucket is (bins[i], bins[i + 1]])"),
])
def test_a_bundles_skew_fit_is_checked(tmp_path, old, new, message):
    """A NaN (or inf) alpha_default priced every step outside the measured buckets at NaN (inf) seconds, `1_0` was
    read as 10, and bins out of order gave a label another's upper edge (pandas' cut, which made the fit, refuses
    them), all without a word."""
    from test_skew import LLAMA, RTX, TP1, load_profile, skew_bundle

    from kvsim.model.errors import KvsimError

    root = skew_bundle(tmp_path / "bf16")
    meta = root / "meta.yaml"
    assert old in meta.read_text()
    meta.write_text(meta.read_text().replace(old, new))
    with pytest.raises(KvsimError) as caught:
        load_profile(root, LLAMA, RTX, TP1)
    assert str(caught.value) == f"profile {meta}: {message}"


@pytest.mark.parametrize(("meta", "message"), [
    ({"attention_skew_alpha_default": "nan"}, "attention_skew_alpha_default='nan' is not a finite number"),
    ({"attention_skew_edges": "batch=2,nan;skew_share=1;decode_context_len=1;context_len=1"},
     "attention_skew_edges='batch=2,nan;skew_share=1;decode_context_len=1;context_len=1' is not axis=number,...;..."),
])
def test_a_kvsim_profiles_skew_metadata_is_checked(meta, message):
    """The same in kvsim's own CSV's metadata, read by `SkewCorrection`."""
    from kvsim.latency.skew import DEFAULT_KEY, EDGES_KEY, SkewCorrection
    from kvsim.model.errors import KvsimError

    fields = {EDGES_KEY: "batch=2,4;skew_share=0.5,1;decode_context_len=1024;context_len=0", DEFAULT_KEY: "0.05",
              **meta}
    with pytest.raises(KvsimError) as caught:
        SkewCorrection([], fields, "p.csv")
    assert str(caught.value) == f"profile p.csv: {message}"


@pytest.mark.parametrize(("old", "new"), [("tp_degrees: [1]", "tp_degrees: [1_0]"),
                                          ("num_attention_heads: 32", "num_attention_heads: 3_2")])
def test_a_bundles_counts_refuse_an_underscore(tmp_path, old, new):
    """YAML keeps `1_0` as text (sweep 12) and the bundle's counts read it with float(): a TP degree of 10, and
    the metadata's heads (the override times that degree) 32 · 10, without a word."""
    from test_profiles import write_bundle
    from test_skew import LLAMA, RTX, TP1, load_profile

    from kvsim.model.errors import KvsimError

    root = tmp_path / "bf16"
    write_bundle(root)
    meta = root / "meta.yaml"
    assert old in meta.read_text()
    meta.write_text(meta.read_text().replace(old, new))
    with pytest.raises(KvsimError) as caught:
        load_profile(root, LLAMA, RTX, TP1)
    assert str(caught.value) == (f"profile {meta}: tp_degrees must list integers and engine_effective.hf_overrides "
                                 "map shape names to integers")


def test_an_autoscaler_target_as_small_as_a_float_scales_to_max_replicas():
    """desired = ceil(current · metric / target), clamped to max_replicas: with target 5e-324 (the smallest
    float) any waiting request makes the ratio inf, and ceil(inf) was an OverflowError mid-run; the HPA's
    clamp gives max_replicas (and no metric, min_replicas)."""
    from kvsim.fleet.autoscaler import Autoscaler
    from kvsim.workload.fleet_layout import AutoscalerConfig

    scaler = Autoscaler(AutoscalerConfig(target=5e-324, max_replicas=4))
    assert scaler.raw(num_current=1, metric_per_replica=2.0) == 4
    assert scaler.raw(num_current=3, metric_per_replica=0.0) == 1


def test_a_scale_up_percent_as_large_as_a_float_lets_the_fleet_grow_at_once():
    """The percent policy allows ceil(start · (1 + percent / 100)) replicas: with 1.7e308 % over 200 replicas that
    was inf, an OverflowError; the limit is past any desired count, so the fleet grows to what it wants."""
    from kvsim.fleet.autoscaler import Autoscaler
    from kvsim.workload.fleet_layout import AutoscalerConfig

    scaler = Autoscaler(AutoscalerConfig(scale_up_percent=1.7e308, max_replicas=4096))
    assert scaler.recommend(0.0, num_current=200, metric_per_replica=1e6) == 4096


@pytest.mark.parametrize(("windows", "message"), [
    ({"1_0": 1}, "window '1_0' is not a finite start time (s)"),
    ({"0": 1, "0.0": 2}, "window '0.0' starts at 0 s, as an earlier window does"),
])
def test_a_servegen_datasets_windows_are_read_as_numbers_once(tmp_path, windows, message):
    """The dataset's window keys were read with float(): `1_0` as the window from 10 s, and `0` beside `0.0` as
    one window whose lengths the second replaced, each without a word."""
    import json

    (tmp_path / "sg").mkdir()
    (tmp_path / "sg" / "chunk-0-trace.csv").write_text("0,1,1\n")
    (tmp_path / "sg" / "chunk-0-dataset.json").write_text(json.dumps(
        {key: {"input_tokens": f"{{{100 * n}: 1.0}}", "output_tokens": "{10: 1.0}"} for key, n in windows.items()}))
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 5, arrival: {process: trace}, "
                                     "trace: {format: servegen, path: sg}}\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        f"{tmp_path}/sg/chunk-0-dataset.json: {message}")
    assert not (tmp_path / "out").exists()


def test_a_rate_search_tolerance_finer_than_a_float_is_refused(tmp_path):
    """`rel_tol: 1e-300` bisected until failed <= passed · (1 + 1e-300) = passed: two distinct floats never are,
    so the plan probed forever; a tolerance of 1e-9 still ends (the search itself, by a rule that passes up to
    3.7 req/s)."""
    from kvsim.planning.steady_state import SteadyRateSearch

    (tmp_path / "spec.yaml").write_text("slo: {ttft_s.p90: 2}\ngpus: [h100-80gb]\nsearch: rate\nrel_tol: 1.0e-300\n")
    assert one_line_exit_2(["plan", "--spec", str(tmp_path / "spec.yaml"), "--workers", "1", "-o",
                            str(tmp_path / "out")]) == "plan.rel_tol=1e-300: Input should be greater than or equal to 0.000000001"
    assert not (tmp_path / "out").exists()
    search = SteadyRateSearch(1.0, 100, max_requests=400, rel_tol=1e-9, first_tol=1e-9)
    for _ in range(1000):
        probe = search.next_probe()
        if probe is None:
            break
        search.observe(probe[0] <= 3.7, None)
    assert search.next_probe() is None and search.rate == pytest.approx(3.7, rel=1e-9)


BIG = 10**400  # past the largest float (1.8e308)


@pytest.mark.parametrize("field", ["engine.kv_cache_memory_bytes", "engine.non_torch_memory_bytes",
                                   "engine.kv_offload.cpu_bytes"])
def test_a_size_past_int64_is_refused_in_one_short_line(tmp_path, field):
    """A size of 10**400 B was an OverflowError traceback (float() of the int in parse_size, or the GiB it was
    shown in), or a refusal whose line carried all 400 digits."""
    out = tmp_path / "out"
    message = one_line_exit_2([*RUN, "--set", f"{field}={BIG}", "-o", str(out)])
    assert message == f"{field}=1{'0' * 56}...: Input should be less than or equal to 9223372036854775807"
    assert not out.exists()


def test_a_size_flag_past_int64_is_refused_naming_the_flag(tmp_path):
    out = tmp_path / "out"
    assert one_line_exit_2([*RUN, "--memory-limit", "9223372036854775808", "-o", str(out)]) == (
        "--memory-limit='9223372036854775808': expected a size such as 64GiB, 500MB or 4096 (at most "
        "9,223,372,036,854,775,807 B)")
    assert one_line_exit_2([*RUN, "--memory-limit", str(BIG), "-o", str(out)]).startswith(
        f"--memory-limit='1{'0' * 55}...: expected a size")  # the text's repr, cut to 60 characters
    assert not out.exists()


@pytest.mark.parametrize("field", ["engine.num_gpu_blocks_override", "workload.num_requests"])
def test_a_count_past_int64_is_refused_in_one_line(tmp_path, field):
    """10**400 blocks was an OverflowError where the pool was shown in GiB, 10**400 requests one in the run's
    memory estimate (an int past the largest float times a float)."""
    out = tmp_path / "out"
    assert one_line_exit_2([*RUN[:1], "--set", "steps=none", "--set", f"{field}={BIG}", "-o", str(out)]) == (
        f"{field}=1{'0' * 56}...: Input should be less than or equal to 9223372036854775807")
    assert not out.exists()
