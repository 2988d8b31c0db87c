"""Bad input found by the twenty-third sweep. Each is refused (the CLI: exit 2, one line naming the field and the
value, nothing written; the Python API: a `KvsimError`), or said as it is.

Found: a `vllm bench serve` JSON whose `errors` was false, 0, "" or {} was read as "no request failed"; one whose
`e2els` (vLLM's older name of `latencies`) held a bad entry was refused naming `latencies`; inter-token gaps whose
sum overflows made an infinite E2E that `kvsim validate` tabulated as a measurement (inf and nan errors, exit 0); a
`queue_times` entry of 1e300 with `max_concurrency` overflowed writing the replay's workload (a traceback). YAML:
two `<<` in one mapping kept the second's keys, and `<<: [*a, *b]` gave a shared key b's value where YAML's merge
key gives a's (PyYAML 6.0.2). A sharegpt_tokens row's bad output_tok_ids was named input_tok_ids. Text read as a
number by `str.isdigit` then `int()` (a `--set` list index, an Azure TIMESTAMP's fraction, a ServeGen file's
client number, a Vidur shape, a measured request_id): `²` was a traceback, `１` read as 1. The notebooks' helpers:
`simulate_disagg` of a colocated scenario and `unbounded_hit_rate` of records without segments stopped on an
AssertionError, `studies.variant` of a path on an AttributeError, and `window_evidence` took a negative or NaN
warm-up fraction. `kvsim validate --set engine.tensor_parallel_size=2` on a run that recorded TP 1 replayed another
deployment (exit 0), and a meta.json whose started_at came after the first request shifted the series in silence.

Probed and found refused as the rule asks (not repeated here): `kvsim run --steps/--steps-format/--memory-limit`
combinations, `--speculative-config` and `--kv-transfer-config` JSON (types, unknown and duplicate keys, v0, slab,
offload with speculation, priority with v0), YAML anchors, duplicate keys, deep nesting, a billion-laughs file,
non-UTF-8 and UTF-16 bytes, a BOM, CRLF, tabs, two documents, tags; Mooncake, Azure, ShareGPT and sharegpt_tokens
files of 60,000 rows with one bad row near row 50,000, columns reordered, CRLF, a BOM, truncated or non-gzip `.gz`;
`kvsim plan --xpyd` on traffic whose decode instance stalls (held KV): a failed point, the plan completes.
"""

from __future__ import annotations

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path
from test_validate import bench_json

from kvsim.model.errors import KvsimError
from kvsim.validation.measured import load_measured


@pytest.mark.parametrize(("errors", "shown"), [(False, "False"), (0, "0"), ("", "''"), ({}, "{}"), ([], None)])
def test_bench_errors_that_is_no_list_of_one_per_request_is_refused(tmp_path, errors, shown):
    """`raw.get("errors") or [""] * n` read any false value as every request a success (the file's third request
    failed: it was then measured with a TTFT of 0)."""
    message = (f"errors={shown} is not a list" if shown is not None else "errors has 0 entries, input_lens has 3")
    with pytest.raises(KvsimError, match=f"b.json: {message}"):
        load_measured(bench_json(tmp_path / "b.json", errors=errors))


def test_bench_errors_absent_is_no_failure_recorded(tmp_path):
    run = load_measured(bench_json(tmp_path / "b.json", errors=None, output_lens=[5, 3, 1], ttfts=[0.01, 0.02, 0.03],
                                   latencies=[0.05, 0.06, 0.03]))
    assert run.requests.request_index.tolist() == [0, 1, 2]


def test_bench_e2els_is_named_as_the_file_names_it(tmp_path):
    """A file with vLLM's older `e2els` in place of `latencies`: its bad entry was named `latencies[1]`, a field the
    file does not have."""
    with pytest.raises(KvsimError, match=r"b.json: e2els\[1\]='x' is not a number$"):
        load_measured(bench_json(tmp_path / "b.json", latencies=None, e2els=[0.05, "x", 0.0]))
    with pytest.raises(KvsimError, match=r"b.json: e2els has 2 entries, input_lens has 3$"):
        load_measured(bench_json(tmp_path / "b.json", latencies=None, e2els=[0.05, 0.06]))


def test_bench_gaps_whose_sum_overflows_are_refused(tmp_path):
    """Two finite gaps of 1e308 sum to inf: E2E inf passed `E2E >= TTFT`, and validate wrote a table with an E2E
    mean of inf and errors of nan % (exit 0), numpy's overflow warning on stderr."""
    path = bench_json(tmp_path / "b.json", latencies=None, itls=[[1e308, 1e308], [0.02, 0.02], []])
    with pytest.raises(KvsimError, match=r"b.json: request 0's E2E \(ttfts plus itls\) is inf s; not a physical"):
        load_measured(path)
    out = tmp_path / "o"
    assert "request 0's E2E (ttfts plus itls) is inf s" in one_line_exit_2(
        ["validate", str(path), "--gpu", "h100-80gb", "-o", str(out)])
    assert not out.exists()


def test_bench_wait_that_puts_an_arrival_beyond_the_replay_clock_is_refused(tmp_path):
    """A send less a wait of 1e300 s is an arrival 1e300 s before the others: the replay's workload file (int64 ns)
    overflowed converting it, a traceback after the output folder's checks."""
    path = bench_json(tmp_path / "b.json", max_concurrency=2, queue_times=[0.0, 1e300, 0.0])
    out = tmp_path / "o"
    assert one_line_exit_2(["validate", str(path), "--gpu", "h100-80gb", "-o", str(out)]).endswith(
        "b.json: queue_times[1]=1e+300 puts the request's arrival 1e+300 s before another's, longer than a run "
        "kvsim replays (9.22337e+09 s: int64 ns)")
    assert not out.exists()


def test_two_merge_keys_in_one_mapping_are_refused():
    """PyYAML merged both `<<` of a mapping, the second's keys over the first's: `{<<: *small, <<: *big}` ran with
    the second's value and never said the first's was dropped, the silent loss a key written twice is refused for."""
    import yaml

    from kvsim.model.yaml_io import load_yaml

    with pytest.raises(yaml.YAMLError, match=r"duplicate key '<<' \(lines 2 and 3\): give one merge key"):
        load_yaml("a: &a {max_num_seqs: 8}\nengine: {<<: *a,\n  <<: {max_num_seqs: 4}}\n")


def test_a_key_two_merged_mappings_give_is_refused():
    """YAML's merge key (yaml.org/type/merge.html): "Keys in mapping nodes earlier in the sequence override keys
    specified in later mapping nodes", so `<<: [*fast, *base]` is fast's max_num_seqs; PyYAML 6.0.2 gave base's
    (it skips a merged key seen before by `id()` of its text, and two equal keys written apart are two objects).
    Keys the mappings do not share, and a key written beside the `<<`, read as both YAMLs read them."""
    import yaml

    from kvsim.model.yaml_io import load_yaml

    text = "fast: &fast {max_num_seqs: 8}\nbase: &base {max_num_seqs: 4, block_size: 32}\nengine: {<<: [*fast, *base]}\n"
    with pytest.raises(yaml.YAMLError, match=r"key 'max_num_seqs' is in two mappings merged by one '<<' \(lines 1 "
                                             r"and 2\): YAML reads the first's value, PyYAML the last's"):
        load_yaml(text)
    with pytest.raises(yaml.YAMLError, match=r"key 'block_size' is in two mappings merged by one '<<' \(lines 1 "
                                             r"and 2\)"):  # a merged mapping's own merge is checked too
        load_yaml("b: &b {block_size: 16}\nc: &c {block_size: 32}\nengine: {<<: {<<: [*b, *c]}}\n")
    assert load_yaml("fast: &fast {max_num_seqs: 8}\nbase: &base {block_size: 32}\n"
                     "engine: {<<: [*fast, *base], block_size: 16}\n")["engine"] == {"max_num_seqs": 8, "block_size": 16}


def test_two_merge_keys_in_a_scenario_exit_2_and_write_nothing(tmp_path):
    path, out = tmp_path / "s.yaml", tmp_path / "o"
    path.write_text("workload: {<<: {num_requests: 3}, <<: {num_requests: 4}, prompt_len: {dist: fixed, value: 10},"
                    " output_len: {dist: fixed, value: 5}}\n")
    assert one_line_exit_2(["run", str(path), "-o", str(out)]) == (
        f"scenario {path}: not valid YAML: duplicate key '<<' (lines 1 and 1): give one merge key, a list of mappings "
        "to merge several (<<: [*a, *b])")
    assert not out.exists()


@pytest.mark.parametrize(("output_ids", "shown"), [(None, "None"), (5, "5"), ("1 2", "'1 2'")])
def test_sharegpt_tokens_output_ids_that_are_no_list_are_named(tmp_path, output_ids, shown):
    """A row whose output_tok_ids was null or a number was refused as "input_tok_ids must list input_toks token
    ids", naming the field that was right."""
    import json

    from kvsim.workload.traces import read_sharegpt_tokens

    path = tmp_path / "t.jsonl"
    rows = [{"arrival_time_ns": 0, "input_toks": 3, "output_toks": 2, "input_tok_ids": [1, 2, 3],
             "output_tok_ids": [4, 5]}, {"arrival_time_ns": 1, "input_toks": 3, "output_toks": 2,
                                         "input_tok_ids": [1, 2, 3], "output_tok_ids": output_ids}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(KvsimError, match=rf"t.jsonl:2: output_tok_ids={shown} is not a list of token ids$"):
        read_sharegpt_tokens(path)


def _requests_with_id(tmp_path, request_id):
    import json

    from test_validate import write_run

    run = write_run(tmp_path)
    path = run / "vllm" / "requests.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["request_id"] = request_id
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run


@pytest.mark.parametrize("request_id", ["bench-\u00b2", "bench-\u0660", "bench-\uff10"])
def test_a_request_number_in_digits_other_than_ascii_is_no_number(tmp_path, request_id):
    """`str.isdigit` took a superscript two for a number, which `int()` refuses (a bare ValueError, a traceback);
    an Arabic-Indic or fullwidth zero `int()` read as 0, so the second row was refused as workload line 1 again.
    vLLM numbers `bench-N` in ASCII: the row's position is its number then, as for any id without one."""
    from kvsim.validation.measured import read_measured_dir

    assert read_measured_dir(_requests_with_id(tmp_path, request_id)).requests.request_index.tolist() == [0, 1]


def test_a_request_number_longer_than_any_workload_is_refused(tmp_path):
    """`int()` of 5,000 digits raised Python's bare ValueError (over 4,300 digits), a traceback of validate."""
    from kvsim.validation.measured import read_measured_dir

    run = _requests_with_id(tmp_path, "bench-" + "1" * 5000)
    with pytest.raises(KvsimError, match=r"requests.jsonl: request_id='bench-1111[^:]*: a request number of 5,000 "
                                         r"digits, past any workload's lines$"):
        read_measured_dir(run)
    assert read_measured_dir(_requests_with_id(tmp_path / "b", "bench-" + "0" * 30 + "1")).requests.request_index \
        .tolist() == [0, 1]


@pytest.mark.parametrize(("index", "message"), [
    ("\u00b2", "got '\u00b2'"),  # passed str.isdigit, int() refused it: a traceback
    ("\uff11", "got '\uff11'"),  # int() read a fullwidth 1 as the decoder group
    ("1" * 5000, "got '1111"),  # int() refuses over 4,300 digits: a traceback
])
def test_a_set_list_index_is_ascii_digits(tmp_path, index, message):
    out = tmp_path / "o"
    line = one_line_exit_2(["run", "scenarios/disagg-1p1d.yaml", "--set", f"replicas.{index}.count=2", "-o", str(out)])
    assert "replicas is a list of 2: index an entry by its number, 0 to 1 (" + message in line and not out.exists()


@pytest.mark.parametrize("fraction", ["\u00b2", "\uff11", "\u0661Z"])
def test_an_azure_timestamp_fraction_is_ascii_digits(tmp_path, fraction):
    """`str.isdigit` passed `.²`, which `int()` then refused (a traceback); a fullwidth or Arabic-Indic digit (the
    zone form's `\\d` held it) was read as 0.1 s."""
    from kvsim.model.errors import shown
    from kvsim.workload.traces import read_azure

    stamp = f"2023-11-16 18:15:47.{fraction}"
    path = tmp_path / "a.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,374,44\n{stamp},374,44\n",
                    encoding="utf-8")
    with pytest.raises(KvsimError, match=f"a.csv:3: TIMESTAMP={shown(stamp)} is not a timestamp$"):
        read_azure(path)


def test_a_servegen_file_numbered_in_other_digits_is_no_client(tmp_path):
    """`chunk-²-trace.csv` passed `str.isdigit` and `int()` refused it: a traceback of any run of the folder."""
    from kvsim.workload.servegen import read_servegen

    (tmp_path / "chunk-\u00b2-trace.csv").write_text("")
    with pytest.raises(KvsimError, match="servegen needs at least one client"):
        read_servegen(tmp_path, None, 0.0, 600.0, None)


@pytest.mark.parametrize("heads", ["\u00b2", "\uff13\uff12"])
def test_a_vidur_shape_is_ascii_digits(tmp_path, heads):
    """n_head `²` passed `str.isdigit` and `int()` refused it (a traceback of import-profile); a fullwidth `３２`
    was read as 32 and kept as that text in the profile's metadata."""
    from test_bad_input_sweep21 import TIMES, _import, _vidur

    path = _vidur(tmp_path, [f"{heads},32,4096,11008,32000,True,1,1,{TIMES}"])
    assert _import(path, tmp_path) == f"profile F: n_head={heads!r} must be a positive whole number"


def test_simulate_disagg_of_a_scenario_without_kv_transfer_config_is_refused():
    """The notebooks' fleet API: simulate_fleet names a disaggregated scenario it does not run; simulate_disagg
    given a colocated one stopped on an AssertionError in its checks."""
    import kvsim
    from kvsim.fleet.disagg import simulate_disagg

    with pytest.raises(KvsimError, match=r"^kv_transfer_config: not set, so no disaggregated fleet; use kvsim\.simulate"):
        simulate_disagg(kvsim.load_scenario(None, {"workload.num_requests": 2}))


@pytest.mark.parametrize("base", ["scenarios/lab-1-max-len-8192.yaml", {"seed": 1}, None])
def test_a_study_variant_of_no_scenario_is_refused(base):
    """`kvsim.report.studies.variant` (the notebooks' what-if helper) given a path or a dict: an AttributeError."""
    from kvsim.report.studies import variant

    with pytest.raises(KvsimError, match=r"^base=.*: expected a Scenario \(kvsim\.load_scenario"):
        variant(base, "engine.block_size=32")


def test_unbounded_hit_rate_of_records_without_segments_is_refused():
    """Records of a trace with lengths alone (Azure's) have no block identities: an AssertionError."""
    from kvsim.report.fleet_study import unbounded_hit_rate
    from kvsim.workload.traces import TraceRecord

    records = [TraceRecord(0.0, 10, 5, (("a", 10),)), TraceRecord(1.0, 10, 5)]
    with pytest.raises(KvsimError, match=r"^records\[1\]: no segments"):
        unbounded_hit_rate(records, 100)
    assert unbounded_hit_rate(records[:1] * 2, 100) == 0.5  # the second's one segment the first had: 10 of 20


@pytest.mark.parametrize(("warmup", "tail", "message"), [
    (-0.5, 0.1, r"warmup_fraction=-0\.5: expected a fraction"),  # widened the window into the warm-up
    (float("nan"), 0.1, r"warmup_fraction=nan: expected"),  # a window of NaN seconds
    (0.2, 1.0, r"tail_fraction=1\.0: expected"),
    (0.2, "0.1", r"tail_fraction='0\.1': expected"),
    (0.6, 0.4, r"warmup_fraction=0\.6, tail_fraction=0\.4: leave no window$"),
])
def test_window_evidence_fractions_are_checked(warmup, tail, message):
    """`window_evidence` (the notebooks' steady-state judge): a negative warm-up fraction moved the window's start
    before the first arrival, judging the fill-up as steady state; NaN made every window bound NaN."""
    from kvsim.planning.window import window_evidence

    with pytest.raises(KvsimError, match=f"^{message}"):
        window_evidence({}, warmup_fraction=warmup, tail_fraction=tail)
    one = {"arrival_s": [0.0], "finish_s": [1.0], "status": ["finished"]}
    assert window_evidence(one, warmup_fraction=0, tail_fraction=0.0)["verdict"] == "no servable requests"


@pytest.mark.parametrize("override", ["engine.tensor_parallel_size=2", "engine.max_num_seqs=8",
                                      "engine={max_num_batched_tokens: 128}", "engine={max_num_batched_tokens: 64}"])
def test_validate_set_of_an_engine_argument_the_run_recorded_is_refused(tmp_path, override):
    """test_validate's run recorded TP 1, max_num_seqs 4 and max_num_batched_tokens 64 (its meta.json): a `--set`
    to other values replayed another deployment, exit 0, its errors tabulated as kvsim's on the measured run; so did
    a whole `engine` section, which drops the recorded settings it does not repeat."""
    from test_validate import write_run

    out = tmp_path / "o"
    line = one_line_exit_2(["validate", str(write_run(tmp_path)), "--gpu", "h100-80gb", "--set", override,
                            "-o", str(out)])
    assert line.startswith(f"--set '{override}': the measured run recorded engine.") and line.endswith(
        "a replay runs the engine that ran (--set only what the run did not record)") and not out.exists()


def test_validate_set_of_an_engine_argument_as_recorded_or_unrecorded_is_read(tmp_path):
    """The run recorded max_num_seqs 4 and no max_model_len (vLLM's default): both `--set`s replay (the second the
    way test_validate's own replays set it)."""
    from test_validate import CONSTANT, write_run

    from kvsim.validation.compare import validate

    result = validate(load_measured(write_run(tmp_path)), gpu="h100-80gb",
                      overrides=[*CONSTANT, "engine.max_num_seqs=4", "engine.max_model_len=1024"])
    assert (result.scenario.engine.max_num_seqs, result.scenario.engine.max_model_len) == (4, 1024)


@pytest.mark.parametrize(("started_at", "late_s"), [("2026-01-01T01:00:00.5Z", "3600"), ("9999-12-31T23:59:59Z", "2.5")])
def test_a_measured_run_started_after_its_first_request_is_refused(tmp_path, started_at, late_s):
    """meta.json's started_at aligns the per-second series with the requests (the shipped runs' first request
    arrives 0.065 s after it); one after the first arrival shifted the series by that much, exit 0."""
    import json

    from test_validate import STARTED, write_run

    from kvsim.validation.measured import read_measured_dir

    assert STARTED == "2026-01-01T00:00:00Z"  # write_run's first request arrives 0.5 s after it
    run = write_run(tmp_path)
    meta = json.loads((run / "vllm" / "meta.json").read_text())
    (run / "vllm" / "meta.json").write_text(json.dumps({**meta, "started_at": started_at}))
    with pytest.raises(KvsimError, match=rf"meta.json: started_at='{started_at}' is {late_s}\S* s after the first "
                                         r"request's arrival_time \(.*requests.jsonl\): a run starts before"):
        read_measured_dir(run)
