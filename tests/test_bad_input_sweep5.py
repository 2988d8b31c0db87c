"""Bad input found by the fifth sweep: each exits 2 with one line naming the field and the value, and
writes nothing (or, from Python, raises `KvsimError`), never a traceback or a setting silently dropped."""

import csv
import gzip
import json
import os

import pytest
from conftest import one_line_exit_2
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()
PLAN = ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=2"]


@pytest.mark.parametrize(("command", "field"), [
    (["run", "{f}"], "scenario"),
    ([*PLAN, "--spec", "{f}"], "spec"),
    (["validate", "{f}"], "measured"),
    (["import-profile", "{f}", "--gpu", "h100-80gb"], "profile"),
])
def test_a_fifo_or_a_device_is_not_a_regular_file(tmp_path, monkeypatch, command, field):
    """A named pipe (or /dev/null) given as a file was "file not found" (or "no such file or folder"):
    it exists; what is wrong is that it is no regular file to read."""
    monkeypatch.chdir(tmp_path)
    fifo = tmp_path / "s.yaml"
    os.mkfifo(fifo)
    for path, kind in [(str(fifo), "a FIFO"), ("/dev/null", "a character device")]:
        message = one_line_exit_2([arg.replace("{f}", path) for arg in command] + ["-o", str(tmp_path / "out")])
        shown = f"{field}={path!r}" if field != "profile" else f"profile {path}"
        assert message == f"{shown}: not a regular file ({kind})"
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]


def test_a_scenario_through_a_symlink_loop_says_so(tmp_path):
    (tmp_path / "loop").symlink_to("loop")
    assert one_line_exit_2(["run", str(tmp_path / "loop"), "-o", str(tmp_path / "out")]) == (
        f"scenario={str(tmp_path / 'loop')!r}: cannot read (Too many levels of symbolic links)")


def test_a_spec_that_is_a_folder_says_so(tmp_path):
    assert one_line_exit_2([*PLAN, "--spec", str(tmp_path), "-o", str(tmp_path / "out")]) == (
        f"spec={str(tmp_path)!r}: is a directory, not a spec YAML file")


@pytest.mark.parametrize(("tier", "size", "sets"), [
    ("cpu", 1000, []),
    ("disk", 2 * 2**20 - 1, ["engine.kv_offload.cpu_bytes=1GiB", "engine.kv_offload.disk_bandwidth_bytes_per_s=5e9",
                             "engine.tensor_parallel_size=2"]),
])
def test_an_offload_tier_smaller_than_one_block_is_refused(tmp_path, tier, size, sets):
    """A tier of 1,000 bytes held 0 blocks: the run went on with no tier, as if none had been asked for.
    One block of Llama-3.1-8B (32 layers, 8 KV heads of 128, bf16 K and V) is 16 tokens × 32 × 2 × 8 × 128 × 2
    bytes = 2 MiB; at TP 2 each rank holds half of it, and the tier's block is both halves, 2 MiB again:
    one byte less holds none, exactly 2 MiB holds one and runs."""
    block = 16 * 32 * 2 * 8 * 128 * 2
    assert block == 2 * 2**20
    argv = ["run", "--set", "workload.num_requests=5"]
    for item in [*sets, f"engine.kv_offload.{tier}_bytes={size}"]:
        argv += ["--set", item]
    assert one_line_exit_2([*argv, "-o", str(tmp_path / "out")]) == (
        f"engine.kv_offload.{tier}_bytes={size:,}: smaller than one KV block ({block:,} bytes, all "
        "tensor-parallel ranks together), so the tier would hold none; give at least one block, or 0 for no tier")
    assert not (tmp_path / "out").exists()
    one_block = runner.invoke(app, [*argv, "--set", f"engine.kv_offload.{tier}_bytes={block}",
                                    "-o", str(tmp_path / "ok"), "--format", "json"])
    assert one_block.exit_code == 0, one_block.output


def test_an_offload_tier_of_0_bytes_is_still_no_tier(tmp_path):
    result = runner.invoke(app, ["run", "--set", "workload.num_requests=5", "--set", "engine.kv_offload.cpu_bytes=0",
                                 "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output


def test_plan_refuses_an_offload_size_under_one_block_before_it_plans(tmp_path):
    """`plan --offload-size 1KiB` searched the whole plan, wrote it, and only then sized a tier of no block
    (silently no tier before the run refused it, an error after the plan's files were written after). The
    refusal does not say "or 0 for no tier": the flag refuses 0 (sweep 22), no tier being in the grid anyway."""
    out = tmp_path / "out"
    assert one_line_exit_2([*PLAN, "--offload-size", "4GiB", "--offload-size", "1KiB", "-o", str(out)]) == (
        "--offload-size=1,024: smaller than one KV block (2,097,152 bytes, all tensor-parallel ranks together), so "
        "the tier would hold none; give at least one block")
    assert list(tmp_path.iterdir()) == []


def test_plan_refuses_to_size_a_tier_for_an_engine_without_one_before_it_plans(tmp_path):
    """A slab engine has no tier to size; `plan --offload-size` found it only after the whole plan had run and
    written. (Prefix caching off is sized: tests/test_offload_no_prefix_caching.py.)"""
    out = tmp_path / "out"
    assert one_line_exit_2([*PLAN, "--set", "engine.allocator=slab-max", "--offload-size", "4GiB", "-o",
                            str(out)]) == "--offload-size: sizing an offload tier needs engine.allocator=paged " \
        "(allocator=slab-max)"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"progress": 5}, "progress=5: expected a function (simulated_s, done, total) or None"),
    ({"check": "no"}, "check='no': expected True or False"),
])
def test_simulate_names_a_bad_keyword_argument(kwargs, message):
    """`progress=5` ran until the first progress call and raised a bare TypeError ('int' object is not
    callable); `check="no"` is truthy and ran every invariant check."""
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError) as error:
        kvsim.simulate(None, workload__num_requests=5, **kwargs)
    assert str(error.value) == message


@pytest.mark.parametrize(("fmt", "arrival", "text", "message"), [
    ("azure", "{process: trace}", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,12,3\n"
     "2023-11-16 18:17:04.1,1,2,3\n", "t.csv:3: 4 fields, more than the header's 3 (extra: '3')"),
    ("lengths", "{process: poisson, rate: 5}", "num_prefill_tokens,num_decode_tokens\n10,5\n10,5,7,8\n",
     "t.csv:3: 4 fields, more than the header's 2 (extra: '7,8')"),
])
def test_a_trace_row_longer_than_its_header_is_refused(tmp_path, fmt, arrival, text, message):
    """`1,2,3` under a 3-column header (a stray comma, a value split in two) was read as 1 and 2, the rest
    dropped without a word, as `csv.DictReader` keys extra fields by None; the profile readers already
    refused such rows (`first_ragged`)."""
    (tmp_path / "t.csv").write_text(text)
    (tmp_path / "s.yaml").write_text(f"workload: {{num_requests: 2, arrival: {arrival}, "
                                     f"trace: {{format: {fmt}, path: t.csv}}}}\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        f"{tmp_path}/{message}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["bom", "gz"])
def test_a_vllm_sharegpt_json_reads_as_the_other_traces_do(tmp_path, how):
    """`kvsim.workload.files`: every reader skips a byte-order mark and reads `x.json` from `x.json.gz`. The
    vLLM ShareGPT reader used `Path.read_text`: a mark was "not JSON (Unexpected UTF-8 BOM)", and the
    scenario's `path: t.json` found `t.json.gz` and then read its bytes as text ("not UTF-8 text")."""
    text = json.dumps([{"conversations": [{"value": "x" * 400}, {"value": "y" * 80}]}] * 3)
    if how == "bom":
        (tmp_path / "t.json").write_text("\ufeff" + text, encoding="utf-8")
    else:
        (tmp_path / "t.json.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 3, arrival: {process: poisson, rate: 5}, "
                                     "trace: {format: vllm_sharegpt, path: t.json}}\nsteps: none\n")
    result = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_finished"] == 3
    with (tmp_path / "out" / "requests.csv").open() as f:
        assert [(row["prompt_tokens"], row["output_tokens"]) for row in csv.DictReader(f)] == [("100", "20")] * 3


@pytest.mark.parametrize(("sets", "shown"), [
    (["replicas=2"], "replicas=2, no groups"),
    (["replicas=[{count: 1, kv_role: kv_producer}]"], "kv_roles ['kv_producer']"),
])
def test_a_disaggregated_fleet_without_pools_names_what_replicas_is(tmp_path, sets, shown):
    """`--kv-transfer-config '{}' --set replicas=2` said "(replicas=[])": the roles of no groups, not the
    count the user gave."""
    argv = ["run", "--kv-transfer-config", "{}", "-o", str(tmp_path / "out")]
    for item in sets:
        argv += ["--set", item]
    role = "kv_producer" if sets == ["replicas=2"] else "kv_consumer"
    assert one_line_exit_2(argv) == f"kv_transfer_config: no replica group with kv_role={role} ({shown})"


@pytest.mark.parametrize(("entry", "kwargs", "message"), [
    ("kvsim.engine.simulate:simulate", {"bursts": "no"}, "bursts='no': expected True or False"),
    ("kvsim.engine.simulate:simulate", {"check": 1}, "check=1: expected True or False"),
    ("kvsim.fleet.driver:simulate_fleet", {"bursts": 1}, "bursts=1: expected True or False"),
    ("kvsim.fleet.disagg:simulate_disagg", {"bursts": 1}, "bursts=1: expected True or False"),
    ("kvsim.fleet.autoscaled:simulate_autoscaled", {"bursts": 1}, "bursts=1: expected True or False"),
])
def test_the_run_functions_name_a_flag_that_is_not_true_or_false(entry, kwargs, message):
    """`bursts="no"` (truthy) ran decode bursts and the engine's `simulate(check=1)` every invariant check, without
    a word, where `kvsim.simulate` and the fleet functions refuse `check="no"` (the test above)."""
    import importlib

    from kvsim.model.errors import KvsimError
    from kvsim.workload.scenario import resolve_scenario

    module, name = entry.split(":")
    with pytest.raises(KvsimError) as error:
        getattr(importlib.import_module(module), name)(resolve_scenario(None, {"workload.num_requests": 5}), **kwargs)
    assert str(error.value) == message


def test_build_report_names_a_progress_that_is_no_function(tmp_path):
    """`build_report(..., progress=1)` (the notebook's report API) was a TypeError traceback ('int' object is not
    callable) at its first study; now one line naming it, before any study runs or any folder is made."""
    from kvsim.model.errors import KvsimError
    from kvsim.report.build import build_report
    from kvsim.workload.scenario import resolve_scenario

    with pytest.raises(KvsimError) as error:
        build_report(resolve_scenario(None, {}), tmp_path / "report", progress=1)
    assert str(error.value) == ("progress=1: expected a function (study, num_studies, name, runs_done, "
                                "runs_submitted) or None")
    assert list(tmp_path.iterdir()) == []
