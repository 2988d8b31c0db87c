"""Bad input found by the sixth sweep: each exits 2 with one line naming the field and the value, and
writes nothing, never a traceback, a setting silently dropped or a folder left behind."""

import json

import pytest
from conftest import one_line_exit_2
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()
PLAN = ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=2", "--set", "workload.num_requests=20"]


def _refused_trace_run(tmp_path, name: str, trace: str, fmt: str, arrival: str | None, extra: str,
                       num_requests: int) -> str:
    """`kvsim run` of a scenario replaying `trace` (written as `name`; arrivals from `arrival`, else Poisson at
    5 req/s), refused: its one error line, with no output folder left."""
    (tmp_path / name).write_text(trace)
    (tmp_path / "s.yaml").write_text(f"workload: {{num_requests: {num_requests}, arrival: "
                                     f"{arrival or '{process: poisson, rate: 5}'}, trace: {{format: {fmt}, "
                                     f"path: {name}{extra}}}}}\nsteps: none\n")
    message = one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    return message


def test_a_plan_spec_knob_with_no_values_is_refused(tmp_path):
    """`engine: {max_num_seqs: []}` made the candidate grid (a product over the knobs) empty: the memory
    check then raised a bare `ValueError: min() arg is an empty sequence`."""
    (tmp_path / "spec.yaml").write_text("engine: {max_num_seqs: []}\n")
    assert one_line_exit_2([*PLAN, "--spec", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "out")]) == (
        "plan.engine: max_num_seqs=[]: give at least one value for a knob (or leave it out)")
    assert [p.name for p in tmp_path.iterdir()] == ["spec.yaml"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--set", "engine.kv_offload.cpu_bytes=1000"],
     "engine.kv_offload.cpu_bytes=1,000: smaller than one KV block (2,097,152 bytes, all tensor-parallel ranks "
     "together), so the tier would hold none; give at least one block, or 0 for no tier"),
    (["--set", "model=gemma-3-27b", "--engine", "prefix_cache=radix"],
     "engine.prefix_cache=radix: model=gemma-3-27b has sliding-window/chunked KV groups, which kvsim caches with "
     "the hash chain only"),
    (["--set", "latency.model=calibrated", "--set", "latency.profile={d}/nope.csv"],
     "latency.profile='{d}/nope.csv': file not found: {d}/nope.csv"),
], ids=["offload-tier-under-a-block", "radix-on-sliding-window", "calibrated-profile-missing"])
def test_plan_refuses_an_engine_it_cannot_build_before_it_makes_its_folder(tmp_path, flags, message):
    """What only building the engine refuses was found once the plan ran its first point: the plan folder
    had been claimed by then and was left behind with its marker alone."""
    flags = [flag.replace("{d}", str(tmp_path)) for flag in flags]
    assert one_line_exit_2([*PLAN, *flags, "-o", str(tmp_path / "out")]) == message.replace("{d}", str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def _bench(tmp_path, **changes) -> str:
    """`vllm bench serve --save-result --save-detailed` JSON of two requests, fields changed by `changes`."""
    raw = {"model_id": "meta-llama/Llama-3.1-8B", "input_lens": [16, 32], "output_lens": [5, 3],
           "ttfts": [0.01, 0.02], "itls": [[0.01] * 4, [0.02, 0.02]], "latencies": [0.05, 0.06],
           "start_times": [1000.0, 1000.015], **changes}
    (tmp_path / "b.json").write_text(json.dumps(raw))
    return str(tmp_path / "b.json")


def _measured(tmp_path, second_queued_ts: float) -> str:
    """A measured-run folder (validation layout) of two requests, the second queued at `second_queued_ts`."""
    meta = {"model": "meta-llama/Llama-3.1-8B", "dataset_path": "w.jsonl",
            "engine_kwargs": {"model": "meta-llama/Llama-3.1-8B", "max_num_seqs": 4}}
    (tmp_path / "m" / "vllm").mkdir(parents=True)
    (tmp_path / "m" / "vllm" / "meta.json").write_text(json.dumps(meta))
    rows = [{"request_id": f"bench-{i}", "input_toks": 16, "output_toks": 5, "queued_ts": t,
             "first_token_ts": t + 0.01, "last_token_ts": t + 0.05} for i, t in enumerate((100.0, second_queued_ts))]
    (tmp_path / "m" / "vllm" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "m" / "w.jsonl").write_text(json.dumps({"input_toks": 16, "output_toks": 5, "arrival_time_ns": 0})
                                            + "\n" + json.dumps({"input_toks": 16, "output_toks": 5,
                                                                 "arrival_time_ns": 1}) + "\n")
    return str(tmp_path / "m")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("input_lens", [1e300, 32], "input_lens[0]=1e+300 is more tokens than kvsim counts (9,007,199,254,740,992)"),
    ("output_lens", [5, 2.0**60], "output_lens[1]=1.15292e+18 is more tokens than kvsim counts (9,007,199,254,740,992)"),
])
def test_a_bench_token_count_beyond_what_kvsim_counts_is_named(tmp_path, key, value, message):
    """`input_lens: [1e300, ...]` was cast to int64's minimum (a RuntimeWarning on stderr), then refused as
    `input_toks=-9223372036854775808` of a temporary workload file the user never wrote."""
    path = _bench(tmp_path, **{key: value})
    argv = ["validate", path, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "-o", str(tmp_path / "out")]
    assert one_line_exit_2(argv) == f"{path}: {message}"
    assert not (tmp_path / "out").exists()


def test_a_bench_run_spanning_more_than_int64_nanoseconds_is_refused(tmp_path):
    """`start_times: [0, 1e300]` crashed with `OverflowError: cannot convert float infinity to integer` where the
    replayed workload's arrival_time_ns was written."""
    path = _bench(tmp_path, start_times=[0.0, 1e300])
    argv = ["validate", path, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "-o", str(tmp_path / "out")]
    assert one_line_exit_2(argv) == (f"{path}: start_times[1]=1e+300 is 1e+300 s after the first request, longer "
                                      "than a run kvsim replays (9.22337e+09 s: int64 ns)")
    assert not (tmp_path / "out").exists()


def test_a_measured_run_spanning_more_than_int64_nanoseconds_is_refused(tmp_path):
    run = _measured(tmp_path, 1e300)
    assert one_line_exit_2(["validate", run, "--gpu", "h100-80gb", "-o", str(tmp_path / "out")]) == (
        f"{run}/vllm/requests.jsonl: request 'bench-1' queued_ts=1e+300 is 1e+300 s after the first request, longer "
        "than a run kvsim replays (9.22337e+09 s: int64 ns)")
    assert not (tmp_path / "out").exists()


def test_capacity_refuses_a_token_budget_vllm_refuses_at_startup(tmp_path):
    """`capacity --max-num-batched-tokens 1` printed a concurrency table (and prices) for an engine vLLM will
    not start, which `kvsim run --set engine.max_num_batched_tokens=1` refuses with vLLM's reason."""
    message = ("engine.max_num_batched_tokens=1: vLLM refuses this: max_num_batched_tokens (1) must be greater "
               "than or equal to max_num_seqs (1024)")
    assert one_line_exit_2(["capacity", "--max-num-batched-tokens", "1"]) == message
    assert one_line_exit_2(["run", "--set", "engine.max_num_batched_tokens=1", "--set", "workload.num_requests=3",
                             "--format", "json", "-o", str(tmp_path / "out")]) == message
    assert not (tmp_path / "out").exists()
    result = runner.invoke(app, ["capacity", "--max-num-batched-tokens", "1024", "--format", "json"])
    assert result.exit_code == 0, result.output


MOONCAKE_ROWS = "".join(f'{{"timestamp": {t}, "input_length": 60, "output_length": 3, "hash_ids": [{t}]}}\n'
                        for t in (0, 5000))


@pytest.mark.parametrize(("fmt", "trace", "extra", "message"), [
    ("mooncake", MOONCAKE_ROWS, "clients: [3]", "clients=[3]: format=mooncake does not read it (only servegen)"),
    ("mooncake", MOONCAKE_ROWS, "duration_s: 1", "duration_s=1.0: format=mooncake does not read it (only servegen)"),
    ("lengths", "num_prefill_tokens,num_decode_tokens\n10,5\n", "start_s: 10",
     "start_s=10.0: format=lengths does not read it (only azure, mooncake, sharegpt_tokens, servegen)"),
])
def test_a_trace_field_its_format_does_not_read_is_refused(tmp_path, fmt, trace, extra, message):
    """`clients` and `duration_s` are ServeGen's (which clients, over how long), `start_s` skips rows by their
    timestamps: given for a format that does not read them, the run went on as if they were not there (a
    Mooncake replay with `duration_s: 1` still served the request at 5 s). A written scenario carries every
    default, and still runs."""
    arrival = "{process: trace}" if fmt == "mooncake" else "{process: poisson, rate: 5}"
    assert _refused_trace_run(tmp_path, "t", trace, fmt, arrival, f", {extra}", 2) == f"workload.trace: {message}"
    (tmp_path / "s.yaml").write_text(f"workload: {{num_requests: 2, arrival: {arrival}, trace: {{format: {fmt}, "
                                     "path: t}}\nsteps: none\n")
    first = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"), "--format", "json"])
    assert first.exit_code == 0, first.output
    written = tmp_path / "written.yaml"  # beside the trace: the scenario names it by a relative path
    written.write_text((tmp_path / "out" / "scenario.yaml").read_text())
    assert "duration_s: 600.0" in written.read_text() and "start_s: 0.0" in written.read_text()
    again = runner.invoke(app, ["run", str(written), "-o", str(tmp_path / "again"), "--format", "json"])
    assert again.exit_code == 0, again.output


def test_validate_names_a_workload_flag_it_cannot_use(tmp_path):
    """`--workload nope.jsonl` was "PATH: No such file or directory" (a folder: "Is a directory"), naming no
    flag; beside a `vllm bench serve` JSON, which lists its own requests, `--workload` was ignored."""
    run = _measured(tmp_path, 100.5)
    argv = ["validate", run, "--gpu", "h100-80gb", "-o", str(tmp_path / "out"), "--workload"]
    assert one_line_exit_2([*argv, str(tmp_path / "nope.jsonl")]) == (
        f"workload={str(tmp_path / 'nope.jsonl')!r}: file not found")
    assert one_line_exit_2([*argv, run]) == f"workload={run!r}: is a directory, not a workload JSONL file"
    bench = _bench(tmp_path)
    assert one_line_exit_2(["validate", bench, "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "-o",
                             str(tmp_path / "out"), "--workload", f"{run}/w.jsonl"]) == (
        f"workload={run + '/w.jsonl'!r}: replaces the workload a measured folder's meta.json names; {bench} is a "
        "vllm bench serve JSON, which lists its own requests")
    assert not (tmp_path / "out").exists()
    result = runner.invoke(app, [*argv, f"{run}/w.jsonl", "--format", "json", "--no-figures"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("fmt", "row", "message"), [
    ("mooncake", '{{"timestamp": {t}, "input_length": 60, "output_length": 3, "hash_ids": [1]}}',
     "timestamp=-5 is negative: a trace's times count from its start"),
    ("sharegpt_tokens", '{{"arrival_time_ns": {t}, "input_toks": 2, "output_toks": 1}}',
     "arrival_time_ns=-5 is negative: a trace's times count from its start"),
])
def test_a_negative_trace_time_is_refused(tmp_path, fmt, row, message):
    """Rows whose time was before 0 were dropped as if before `start_s` (0): of a Mooncake trace at -5 ms
    and 0 ms, `num_requests: 2` served one request without a word (all negative: "start_s=0.0: no request
    ... arrives after it", naming a field the user never set)."""
    (tmp_path / "t.jsonl").write_text("\n".join(row.format(t=t) for t in (-5, 0)) + "\n")
    (tmp_path / "s.yaml").write_text(f"workload: {{num_requests: 2, arrival: {{process: trace}}, "
                                     f"trace: {{format: {fmt}, path: t.jsonl}}}}\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        f"{tmp_path}/t.jsonl:1: {message}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("item", "message"), [
    ("model=opt-13b", "a replay's model is --model (held against the run's model), not a --set"),
    ("gpu=a100-80gb", "a replay's gpu is --gpu (held against the run's GPU), not a --set"),
    ("workload.num_requests=1", "a replay's workload is the measured run's requests (--workload replaces a "
                                "measured folder's), not a --set"),
    ("replicas=2", "a replay's replicas is one engine, as the measured run's (its data-parallel ranks from its "
                   "engine arguments), not a --set"),
    # kept no steps: the table compared running 0 and waiting 0 with the measured series (-100 %) as results
    ("steps=none", "a replay's steps is all (its running, waiting and KV usage are compared from every step), "
                   "not a --set"),
])
def test_validate_refuses_a_set_of_what_the_run_fixes(tmp_path, item, message):
    """`--model opt-13b` against a Llama run is refused (the third sweep), but `--set model=opt-13b` replayed
    OPT-13B against it without a word; `--set workload.num_requests=1` compared one replayed request with the
    run's two; `--set replicas=2` was told to "use kvsim.fleet.driver.simulate_fleet", a function of kvsim's."""
    run = _measured(tmp_path, 100.5)
    assert one_line_exit_2(["validate", run, "--gpu", "h100-80gb", "--set", item, "-o", str(tmp_path / "out")]) == (
        f"--set {item!r}: {message}")
    assert not (tmp_path / "out").exists()


def test_validate_takes_a_set_of_an_engine_field_the_run_did_not_record(tmp_path):
    """Beside the refusals above (once for all of them: a replay, without its figures): an engine field
    the run did not record may be set (one it recorded may not: tests/test_bad_input_sweep23.py)."""
    run = _measured(tmp_path, 100.5)
    result = runner.invoke(app, ["validate", run, "--gpu", "h100-80gb", "--set", "engine.max_num_batched_tokens=2048",
                                 "-o", str(tmp_path / "out"), "--format", "json", "--no-figures"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("groups", "message"), [
    ("[{count: 1, name: a}, {count: 1, name: a}]", "replicas: two groups are named 'a'; a group's name labels its "
                                                   "replicas"),
    ("[{count: 1, model: ''}]", "replicas.0.model='': String should have at "
                                "least 1 character"),
    ("[{count: 1, gpu: ''}]", "replicas.0.gpu='': String should have at least 1 "
                              "character"),
])
def test_replica_groups_that_cannot_be_told_apart_are_refused(tmp_path, groups, message):
    """Two groups named `a` both named their replicas `default/a-0`: replicas.csv had two rows of that name;
    a group's `model: ''` (or `gpu: ''`) was taken as not given, so it ran the scenario's model."""
    argv = ["run", "--set", "workload.num_requests=4", "--set", f"replicas={groups}", "-o", str(tmp_path / "out")]
    assert one_line_exit_2(argv) == message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("trace", "message"), [
    ('{"timestamp": 0, "input_length": "x", "output_length": 3, "hash_ids": [1]}\n',
     "{d}/t.jsonl:1: input_length='x' is not an integer"),
    (None, "workload.trace.path='t.jsonl': file not found: {d}/t.jsonl"),
], ids=["bad-row", "missing"])
def test_plan_reads_its_traffic_before_it_makes_its_folder(tmp_path, trace, message):
    """The base scenario's trace was first read by the first point's run: a missing file or a bad row was
    refused after the plan folder had been claimed, which was left behind with only its marker."""
    if trace is not None:
        (tmp_path / "t.jsonl").write_text(trace)
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 1, arrival: {process: trace}, "
                                     "trace: {format: mooncake, path: t.jsonl}}\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert one_line_exit_2([*PLAN[:1], str(tmp_path / "s.yaml"), *PLAN[1:-2], "-o", str(tmp_path / "out")]) == (
        message.replace("{d}", str(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_scenario_may_not_set_the_folder_its_paths_start_from(tmp_path):
    """`base_dir` is the field kvsim fills with the scenario file's folder: `base_dir: /data` in a file (or
    `--set base_dir=...`) was accepted and replaced without a word, so the trace was still looked up beside
    the file."""
    (tmp_path / "s.yaml").write_text("base_dir: /data\nworkload: {num_requests: 2, prompt_len: {dist: fixed, value: 8}, "
                                     "output_len: {dist: fixed, value: 4}}\n")
    message = "unknown key (kvsim resolves a scenario's relative paths from the folder of its file)"
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        f"base_dir='/data': {message}")
    assert one_line_exit_2(["run", "--set", "base_dir=/x", "-o", str(tmp_path / "out")]) == f"base_dir='/x': {message}"
    assert not (tmp_path / "out").exists()


def test_a_lognormal_sigma_whose_square_overflows_is_refused(tmp_path):
    """`prompt_len: {dist: lognormal, mean: 100, sigma: 1e300}` crashed drawing the lengths (`OverflowError:
    (34, 'Numerical result out of range')` from sigma ** 2); the widest sigma whose square is a float still runs."""
    def argv(sigma: str, out: str) -> list[str]:
        return ["run", "--set", "workload.num_requests=5", "--set", "steps=none", "--set",
                f"workload.prompt_len={{dist: lognormal, mean: 100, sigma: {sigma}}}", "-o", str(tmp_path / out)]

    assert one_line_exit_2(argv("1e300", "out")) == (
        "workload.prompt_len.lognormal: sigma=1e+300: too wide to draw from (sigma² overflows a float; a sigma of "
        "10 already puts the p99 e^23 times above the median)")
    assert not (tmp_path / "out").exists()
    widest = runner.invoke(app, [*argv("1.3e154", "ok"), "--format", "json"])
    assert widest.exit_code == 0, widest.output


@pytest.mark.parametrize(("fmt", "table", "extra", "message"), [
    ("azure", "timestamp,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,12,3\n", "",
     "no column 'TIMESTAMP' (the header has 'timestamp,ContextTokens,GeneratedTokens'; expected TIMESTAMP, "
     "ContextTokens, GeneratedTokens)"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,12,3\n", ", priority_column: prio",
     "no column 'prio' (the header has 'TIMESTAMP,ContextTokens,GeneratedTokens'; expected TIMESTAMP, ContextTokens, "
     "GeneratedTokens, prio)"),
    ("lengths", "prompt,output\n0,2\n", "",
     "no column 'num_prefill_tokens' (the header has 'prompt,output'; expected num_prefill_tokens, num_decode_tokens)"),
])
def test_a_csv_trace_without_a_column_it_needs_says_so(tmp_path, fmt, table, extra, message):
    """A header without a column kvsim reads gave each row that column as None: `num_prefill_tokens=None is not
    an integer` for a table whose first row held 0 (and `TIMESTAMP=None is not a timestamp` for a header that
    spelt it `timestamp`), a value the file does not have."""
    assert _refused_trace_run(tmp_path, "t.csv", table, fmt, "{process: trace}" if fmt == "azure" else None,
                              extra, 1) == f"{tmp_path}/t.csv: {message}"


@pytest.mark.parametrize(("override", "flags", "message"), [
    ("gpu=h200", [], "--set 'gpu=h200': the plan's candidates set gpu (h100-80gb); give it with --gpu"),
    ("engine.max_num_seqs=64", ["--engine", "max_num_seqs=128,256"],
     "--set 'engine.max_num_seqs=64': the plan's candidates set engine.max_num_seqs (128, 256); give it with "
     "--engine max_num_seqs=..."),
    ("engine.tensor_parallel_size=2", ["--tensor-parallel-size", "1"],
     "--set 'engine.tensor_parallel_size=2': the plan's candidates set engine.tensor_parallel_size (1); give it with "
     "--tensor-parallel-size"),
])
def test_plan_refuses_a_set_its_candidates_replace(tmp_path, override, flags, message):
    """`Candidate.scenario` sets the GPU, the TP size and the knobs the plan varies: a --set of another value
    was replaced without a word (`plan --gpu h100-80gb --set gpu=h200` planned H100s)."""
    out = tmp_path / "out"
    assert one_line_exit_2([*PLAN, "--set", override, *flags, "-o", str(out)]).startswith(message)
    assert not out.exists()


def test_a_split_larger_than_max_replicas_is_refused(tmp_path):
    """40P40D is 80 instances: it ran past --max-replicas 8, where the colocated search stops."""
    out = tmp_path / "out"
    assert one_line_exit_2([*PLAN, "--xpyd", "40P40D", "--max-replicas", "8", "-o", str(out)]) == (
        "plan: xpyd=40P40D: 80 instances, more than max_replicas=8")
    assert not out.exists()
