"""Bad input found by the eighteenth sweep (output safety, the newer scenario sections at their edges, items left
from earlier notes). Each is refused with one line naming the field and the value (the CLI: exit 2, nothing
written; the Python API: a `KvsimError`).

Found: `RunResult.write(None)` was refused as `--output='None'`, the text 'None', a name never
given. A draft model too large for the GPU was refused as `model=TARGET: weights need ...`, the target's name
beside a sum that was mostly the draft's, so the message blamed a model that fits. The study scripts
(`benchmarks/study_autoscale.py`, `study_distserve.py`) wrote `--output` over any file (a user's notes), and an
`--output` that is a folder was an IsADirectoryError traceback after the whole study; a bad `--set` of
study_autoscale.py was a traceback. A full disk while `kvsim plan` stored a point was 'kvsim: error: No space left on
device', naming no output; one while it wrote its tables left this plan's plan.csv and plan.json beside the earlier
plan's plan.md; one while `kvsim validate` wrote its `sim/` run named kvsim's temporary folder as the output. A replica
group's engine refused while it was built (an offload tier under one block, speculation beside a slab allocator) was
named as a field of the scenario's own `engine`, without the group. `kvsim plan --offload-size 3TB` (past the host's
memory) was a pydantic ValidationError traceback. `kvsim.planning.sweep.run_many` on its own (a notebook's sweep) said
nothing of a trace shorter than `num_requests`. `kvsim import-profile ... -o profiles/` (or calibrate's) wrote a file
called `profiles`. A blank `kv_transfer_config.kv_connector` ran and was recorded as the connector."""

import errno
import json
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import benchmark_script, one_line_exit_2  # tests/ is on sys.path
from typer.testing import CliRunner

import kvsim
from kvsim.cli import app
from kvsim.model.errors import KvsimError
from kvsim.results.output_dir import output_directory

# Parameters (bf16: 2 B each) from the models' Hugging Face safetensors metadata, not from kvsim.
LLAMA_8B_PARAMS, LLAMA_70B_PARAMS = 8_030_261_248, 70_553_706_496
SMALL = {"steps": "none", "workload": {"num_requests": 2, "prompt_len": {"dist": "fixed", "value": 16},
                                       "output_len": {"dist": "fixed", "value": 4}}}


def test_a_draft_model_too_large_for_the_gpu_is_named_with_its_share_of_the_weights(tmp_path):
    draft = {"method": "draft_model", "model": "llama-3.1-70b", "num_speculative_tokens": 3, "acceptance_rates": 0.8}
    needed, draft_bytes = 2 * (LLAMA_8B_PARAMS + LLAMA_70B_PARAMS), 2 * LLAMA_70B_PARAMS
    expected = (f"model=llama-3.1-8b with engine.speculative_config (method=draft_model, model=llama-3.1-70b: "
                f"{draft_bytes:,} B of the weights): weights need {needed:,} B per GPU (tensor_parallel_size=1)")
    with pytest.raises(KvsimError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
        kvsim.simulate(SMALL, model="llama-3.1-8b", gpu="h100-80gb", engine__speculative_config=draft)
    line = one_line_exit_2(["run", "--set", "workload.num_requests=2", "--speculative-config",
                            '{"method": "draft_model", "model": "llama-3.1-70b", "num_speculative_tokens": 3, '
                            '"acceptance_rates": 0.8}', "-o", str(tmp_path / "out")])
    assert line.startswith(expected) and not (tmp_path / "out").exists()


def test_a_target_alone_too_large_is_still_named_alone():
    with pytest.raises(KvsimError, match=r"^model=llama-3.1-70b: weights need 141,107,412,992 B per GPU"):
        kvsim.simulate(SMALL, model="llama-3.1-70b", gpu="h100-80gb")


@pytest.mark.parametrize(("out_dir", "named"), [(None, "None"), (5, "5"), (["runs"], "['runs']")])
def test_a_result_written_to_something_that_is_not_a_path_is_named_as_given(tmp_path, monkeypatch, out_dir, named):
    """`RunResult.write(None)` was `--output='None'`: the text 'None', as if a folder of that name were refused."""
    monkeypatch.chdir(tmp_path)
    result = kvsim.simulate(SMALL)
    with pytest.raises(KvsimError, match=rf"^out_dir={re.escape(named)}: is not a path: name a folder;"):
        result.write(out_dir)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["study_distserve", "study_autoscale"])
@pytest.mark.parametrize("theirs", [b"my notes\n", b'{"slo": 1}\n', b"[]\n", None])
def test_a_study_refuses_an_output_it_did_not_write_before_it_runs(tmp_path, monkeypatch, capsys, name, theirs):
    """`--output notes.json` replaced the user's file, and `--output FOLDER` was an IsADirectoryError traceback, both
    after the whole study (minutes of runs): each is now refused in one line, exit 2, before any run."""
    study = benchmark_script(name)
    out = tmp_path / "out.json"
    if theirs is None:
        out.mkdir()
    else:
        out.write_bytes(theirs)
    ran = []
    monkeypatch.setattr(study, "goodput" if name == "study_distserve" else "load_scenario",
                        lambda *args: ran.append(args))
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--output", str(out)])
    with pytest.raises(SystemExit) as stop:
        study.main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and not ran
    assert lines[0].startswith(f"{name}.py: error: --output={str(out)!r}: exists and is not a ")
    assert out.is_dir() if theirs is None else out.read_bytes() == theirs


def test_a_study_replaces_its_own_earlier_result(tmp_path, monkeypatch):
    study = benchmark_script("study_distserve")
    out = tmp_path / "distserve.json"
    out.write_bytes(study.RESULTS.read_bytes())  # the tracked result: this study's keys
    monkeypatch.setattr(study, "goodput", lambda requests, setup, high: 2.0)
    monkeypatch.setattr(sys, "argv", ["study_distserve.py", "--requests", "7", "--output", str(out)])
    study.main()
    assert json.loads(out.read_text())["requests_per_rate"] == 7 and [p.name for p in tmp_path.iterdir()] == [out.name]


def test_a_bad_override_of_the_autoscaling_study_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["study_autoscale.py", "--set", "engine.bogus=1", "--output",
                                      str(tmp_path / "a.json")])
    with pytest.raises(SystemExit) as stop:
        benchmark_script("study_autoscale").main()
    assert stop.value.code == 2 and capsys.readouterr().err == "study_autoscale.py: error: engine.bogus: unknown key\n"
    assert list(tmp_path.iterdir()) == []


ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
PLAN = ["plan", "--slo", "ttft_s.p90=2", "--gpu", "h100-80gb", "--max-replicas", "2", "--workers", "1", "-o"]


def small_plan(tmp_path, out):
    scenario = tmp_path / "small.json"
    scenario.write_text(json.dumps({**SMALL, "workload": {**SMALL["workload"], "num_requests": 20}}))
    return [PLAN[0], str(scenario), *PLAN[1:], str(out)]


def test_a_full_disk_while_a_plan_stores_its_points_names_the_output(tmp_path, monkeypatch):
    """`os.write` on a full disk names no file: the plan said only 'kvsim: error: No space left on device'."""
    def full(fd):
        raise ENOSPC

    monkeypatch.setattr(os, "fsync", full)  # only the point store syncs; the same errno as its write
    out = tmp_path / "p"
    assert one_line_exit_2(small_plan(tmp_path, out)) == (
        f"--output={str(out)!r}: cannot write there (No space left on device)")


def test_a_full_disk_while_a_plan_writes_its_tables_leaves_the_earlier_plan_whole(tmp_path, monkeypatch):
    """plan.csv, plan.json and plan.md were each written and renamed in turn: a disk that filled at plan.md left this
    plan's plan.csv and plan.json beside the earlier plan's plan.md, named by no error but 'No space left'."""
    out = tmp_path / "p"
    assert CliRunner().invoke(app, small_plan(tmp_path, out)).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(*args, **kwargs):
        raise ENOSPC

    monkeypatch.setattr("kvsim.report.build.pareto_figure", full)
    assert one_line_exit_2([*small_plan(tmp_path, out), "--max-replicas", "3"]) == (
        f"--output={str(out)!r}: cannot write there (No space left on device)")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "points.jsonl"} == {
        name: data for name, data in before.items() if name != "points.jsonl"}


def test_a_write_inside_an_output_that_fails_names_the_output_not_its_temporary_folder(tmp_path):
    """`kvsim validate` writes its `sim/` run inside its own temporary folder: a full disk there was
    `--output='.../.v.kvsim-PID-XXXX/sim': cannot write there`, a name the user never gave nor will find."""
    out = tmp_path / "v"
    with pytest.raises(KvsimError) as refused, output_directory(out, "validation") as tmp, \
            output_directory(tmp / "sim", "run"):
        raise ENOSPC
    assert str(refused.value) == f"out_dir={str(out)!r}: cannot write there (No space left on device)"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("groups", "named"), [
    ([{"count": 1}, {"count": 2, "engine": {"kv_offload": {"cpu_bytes": 1000}}}],
     "replicas[1]: engine.kv_offload.cpu_bytes=1,000: smaller than one KV block"),
    ([{"count": 1}, {"count": 1, "engine": {"allocator": "slab-max", "speculative_config": {
        "method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 0.8}}}],
     "replicas[1]: engine.speculative_config: needs the paged allocator"),
])
def test_a_replica_groups_engine_that_cannot_be_built_is_named_by_its_group(tmp_path, groups, named):
    """Refusals raised while building an engine (its offload tier, its allocator) named a field of the scenario's
    own `engine`, which did not hold it; the other settings of a group were already named `replicas[G]`."""
    with pytest.raises(KvsimError, match="^" + re.escape(named)):
        kvsim.simulate(SMALL, replicas=groups)
    scenario = tmp_path / "fleet.json"
    scenario.write_text(json.dumps({**SMALL, "replicas": groups}))
    assert one_line_exit_2(["run", str(scenario), "-o", str(tmp_path / "out")]).startswith(named)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.json"]


def test_an_offload_size_past_the_hosts_memory_is_one_line_naming_the_flag(tmp_path):
    """`kvsim plan --offload-size 3TB` was a pydantic ValidationError traceback: the tier it sizes must fit in the
    host's memory, by default a DGX H100 node's 2 TB (2 · 10^12 bytes, NVIDIA's datasheet)."""
    out = tmp_path / "p"
    line = one_line_exit_2([*small_plan(tmp_path, out), "--offload-size", "3TB"])
    assert line.startswith("--offload-size: cpu_bytes=3000000000000: larger than host_memory_bytes=2000000000000")
    assert not out.exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_many_runs_on_their_own_say_a_short_trace_once(tmp_path, monkeypatch, caplog, workers):
    """`kvsim.planning.sweep.run_many` (the notebooks' sweep) said nothing of a trace shorter than `num_requests`:
    each of its runs had 2 of the 5 requests asked, without a word. It says it once, as `kvsim.simulate` does."""
    import logging

    from kvsim.planning.sweep import run_many
    from kvsim.workload.scenario import load_scenario

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:00:00.000000,100,10\n2023-11-16 18:00:00.500000,100,10\n")
    (tmp_path / "s.yaml").write_text("steps: none\nworkload: {num_requests: 5, arrival: {process: trace}, "
                                     "trace: {format: azure, path: t.csv}}\n")
    scenarios = [load_scenario("s.yaml", [f"seed={seed}"]) for seed in range(3)]
    with caplog.at_level(logging.WARNING):
        results = run_many(scenarios, workers=workers)
    assert [r.summary["num_requests"] for r in results] == [2, 2, 2]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "workload.num_requests=5: t.csv holds 2 requests from start_s=0; the run has those 2"]


@pytest.mark.parametrize("output", ["profiles/", "profiles/."])
def test_a_profile_output_that_names_a_folder_is_refused(tmp_path, monkeypatch, output):
    """`kvsim import-profile ... -o profiles/` wrote a file called `profiles`: the slash says a folder was meant."""
    from test_profiles import write_bundle

    monkeypatch.chdir(tmp_path)
    bundle = write_bundle(tmp_path / "bundle")
    assert one_line_exit_2(["import-profile", str(bundle), "--model", "llama-3.1-8b", "--gpu", "rtx-pro-6000",
                            "-o", output]) == (f"--output={output!r}: names a folder (it ends in '/'), not a file: "
                                               "give the file's name; kvsim only replaces output it wrote itself "
                                               "(choose a new path)")
    assert not (tmp_path / "profiles").exists()


@pytest.mark.parametrize("connector", ["", "   ", "Nixl\nConnector"])
def test_a_blank_kv_connector_is_refused(tmp_path, connector):
    """`kv_connector` is recorded only (the summary's `kv_connector`), and vLLM finds no connector of a blank name;
    `--kv-transfer-config '{"kv_connector": ""}'` ran and recorded ''."""
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "disagg-1p1d.yaml"
    line = one_line_exit_2(["run", str(scenario), "--set", "workload.num_requests=2",
                            "--kv-transfer-config", json.dumps({"kv_connector": connector}),
                            "-o", str(tmp_path / "out")])
    assert line.startswith(f"kv_transfer_config.kv_connector={connector!r}: ")
    assert not (tmp_path / "out").exists()
