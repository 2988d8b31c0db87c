import json
import os
from pathlib import Path

import pytest
import yaml
from conftest import one_line_exit_2
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.results.step_writer import has_pyarrow

runner = CliRunner()
STEPS_FILE = "steps.parquet" if has_pyarrow() else "steps.csv"  # `--steps-format auto`


def test_default_run_writes_results(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--set", "workload.num_requests=50", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "kvsim run" in result.stdout
    assert f"(requests.csv, scenario.yaml, {STEPS_FILE}, summary.json)" in " ".join(result.stdout.split())
    assert {p.name for p in out.iterdir()} == {"requests.csv", STEPS_FILE, "summary.json", "scenario.yaml",
                                               ".kvsim-output"}
    summary = json.loads((out / "summary.json").read_text())
    for key in ("num_requests", "num_finished", "num_rejected", "duration_s", "output_tokens_per_s",
                "requests_per_s", "ttft_s", "tpot_s", "e2e_s", "queue_s", "max_running", "mean_running",
                "num_preemptions", "kv_cache_usage_perc", "prefix_cache_hit_rate", "swapped_out_bytes", "waste"):
        assert key in summary
    assert set(summary["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    assert set(summary["waste"]) == {"token_state", "reserved", "internal_frag", "slack", "external_frag", "free"}


def test_json_format_and_set(tmp_path):
    result = runner.invoke(app, ["run", "scenarios/paper-paged.yaml", "--format", "json", "--set",
                                 "workload.num_requests=30", "--set", "engine.block_size=32", "-o",
                                 str(tmp_path / "x"), "--check"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["block_size"] == 32 and summary["num_requests"] == 30


@pytest.mark.parametrize(("yaml_text", "needle"), [
    ("model: llama-3.1-8b\nwrkload: {}\n", "wrkload: unknown key"),
    ("workload: {num_requests: many, prompt_len: {dist: fixed, value: 1}, output_len: {dist: fixed, value: 1}}\n",
     "workload.num_requests='many'"),
    ("workload: {arrival: {rate: -2}, prompt_len: {dist: fixed, value: 1}, output_len: {dist: fixed, value: 1}}\n",
     "workload.arrival.rate=-2"),
    ("workload: {trace: {format: azure, path: nowhere.csv}, arrival: {process: trace}}\n", "nowhere.csv"),
    ("engine: {block_size: 0}\nworkload: {prompt_len: {dist: fixed, value: 1}, output_len: {dist: fixed, value: 1}}\n",
     "engine.block_size=0"),
    ("model: gpt-17\nworkload: {prompt_len: {dist: fixed, value: 1}, output_len: {dist: fixed, value: 1}}\n",
     "gpt-17"),
    ("[1, 2\n", "not valid YAML"),
])
def test_bad_scenarios_one_line_error_no_output(tmp_path, yaml_text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(path), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_bad_set_override(tmp_path):
    result = runner.invoke(app, ["run", "--set", "engine.block_size", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "dotted.key=value" in result.stderr


def test_calibrate_dry_run_lists_the_grid_without_torch():
    """The quick grid's decode points are 3 batches × 2 contexts × 1 block size = 6; torch and triton are
    blocked from importing (a plain `./dev run` install has neither), and the grid still prints."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"
            "from kvsim.cli import app; app(['calibrate', '--gpu', 'h200', '--dry-run', '--quick'])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("kind,") and sum(line.startswith("decode") for line in lines) == 6


@pytest.mark.parametrize(("argv", "error"), [
    (["run", "--bogus"], "No such option: --bogus (see 'kvsim run --help')"),
    (["run", "--steps", "weird"], "'weird' is not one of 'none', 'sampled', 'all'"),
    (["run", "a.yaml", "b.yaml"], "unexpected extra argument(s) (b.yaml) (see 'kvsim run --help')"),
    (["nosuch"], "No such command 'nosuch'. (see 'kvsim --help')"),
    (["--bogus"], "No such option: --bogus (see 'kvsim --help')"),
    (["capacity", "--gpu"], "Option '--gpu' requires an argument"),
])
def test_a_usage_error_is_one_line_exit_2(tmp_path, monkeypatch, argv, error):
    """An option, command or choice click refuses is one line, as kvsim's own bad-input errors are, not
    click's usage banner, hint and error (four lines); nothing is written."""
    monkeypatch.chdir(tmp_path)
    assert error in one_line_exit_2(argv)
    assert not any(tmp_path.iterdir())


def test_a_bare_kvsim_still_prints_its_help():
    result = runner.invoke(app, [], prog_name="kvsim")
    assert result.exit_code == 2 and "Usage: kvsim [OPTIONS] COMMAND" in result.output and "run" in result.output


def test_unwritable_output_is_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = runner.invoke(app, ["run", "--set", "workload.num_requests=5", "-o", str(blocker / "out")])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


@pytest.mark.parametrize("where", ["/proc/kvsim-out", "read-only/out"])
def test_unwritable_output_is_refused_before_simulating(tmp_path, monkeypatch, where):
    """`-o /proc/x` (and a folder without write permission) is refused before the run, not after it."""
    import kvsim.engine.simulate

    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o555)
    if where.startswith("read-only") and os.access(read_only, os.W_OK):
        pytest.skip("running as root: permissions do not stop writing")

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated before checking the output")

    monkeypatch.setattr(kvsim.engine.simulate, "simulate", no_simulation)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", "--set", "workload.num_requests=5", "-o", where])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"kvsim: error: --output={where!r}: cannot write there (")
    assert list(read_only.iterdir()) == [] and not Path("/proc/kvsim-out").exists()


def test_run_a_fleet_writes_routes_and_per_replica_tables(tmp_path):
    scenario = tmp_path / "fleet.yaml"
    scenario.write_text(
        "workload: {num_requests: 12, arrival: {process: constant, rate: 6},"
        " prompt_len: {dist: fixed, value: 64}, output_len: {dist: fixed, value: 8}}\n"
        "replicas: 3\nrouter: {policy: round_robin}\n")
    result = runner.invoke(app, ["run", str(scenario), "-o", str(tmp_path / "out"), "--format", "json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["num_replicas"] == 3 and [r["num_requests"] for r in summary["per_replica"]] == [4, 4, 4]
    routes = (tmp_path / "out" / "routes.csv").read_text().splitlines()
    assert routes[0] == "request_id,arrival_s,replica,reason,matched_tokens" and len(routes) == 13
    bad = runner.invoke(app, ["run", str(scenario), "--set", "router.load_bound=0.5", "-o", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "load_bound" in bad.stderr and not (tmp_path / "b").exists()


def test_kv_cache_dtype_help_lists_every_accepted_value():
    """The help text is written by hand; every value the engine config accepts must appear in it."""
    from typing import get_args

    from kvsim.cli import KvDtypeOpt
    from kvsim.model.engine_config import KVCacheDtype
    help_text = get_args(KvDtypeOpt)[1].help
    assert [v for v in get_args(KVCacheDtype) if v not in help_text.split(", ")] == []


def test_ctrl_c_while_kvsim_imports_exits_130_with_one_line(tmp_path):
    """A Ctrl-C while the CLI's dependencies load: a stand-in `typer` raises KeyboardInterrupt on import."""
    import subprocess
    import sys
    import tomllib

    scripts = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kvsim"] == "kvsim.__main__:main"  # the console script runs the same guarded entry
    (tmp_path / "typer.py").write_text("raise KeyboardInterrupt\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    for argv in (["-m", "kvsim", "--help"], ["-c", "from kvsim.__main__ import main; main()", "--help"]):
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=120)
        assert (done.returncode, done.stdout, done.stderr) == (
            130, "", "kvsim: interrupted (kvsim --help) before it wrote any output; no file was changed\n")
    (tmp_path / "typer.py").unlink()  # the real typer: the same entry runs the CLI
    done = subprocess.run([sys.executable, "-m", "kvsim", "--help"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("Usage: ")


def test_version_alone_is_answered_without_the_cli():
    """`kvsim --version` (the entry, as the console script runs it) prints the line the CLI's own `--version`
    prints, without importing the CLI or its libraries; with anything more on the line the CLI answers."""
    import subprocess
    import sys

    from typer.testing import CliRunner

    from kvsim.cli import app

    cli = CliRunner().invoke(app, ["--version"])
    assert cli.exit_code == 0 and cli.output == "kvsim 0.1.0\n"  # kvsim/model/version.py's __version__
    code = ("import sys; from kvsim.__main__ import main; sys.argv = ['kvsim', *sys.argv[1:]]\n"
            "try:\n    main()\nfinally:\n"
            "    print(sorted(m for m in ('typer', 'kvsim.cli', 'pydantic', 'numpy', 'rich') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, cli.output + "[]\n", "")
    done = subprocess.run([sys.executable, "-c", code, "--version", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith(cli.output) and "'typer'" in done.stdout


@pytest.mark.parametrize("enabled", [True, False])
def test_the_cli_is_imported_with_the_collector_off_and_left_as_it_was(enabled):
    """The entry imports the CLI with no cyclic collection (its collection count stays) and its objects frozen
    after, the collector then on or off as the caller had it."""
    import subprocess
    import sys

    code = ("import gc, sys; from kvsim.__main__ import import_cli\n"
            f"gc.enable() if {enabled} else gc.disable(); gc.collect(); before = gc.get_stats()\n"
            "import_cli()\n"
            "print(gc.isenabled(), [s['collections'] for s in gc.get_stats()] == "
            "[s['collections'] for s in before], gc.get_freeze_count() > 10_000)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == [str(enabled), "True", "True"]


def test_cli_starts_openblas_with_one_thread_unless_the_user_chose():
    """The entry sets OPENBLAS_NUM_THREADS=1 before numpy loads, and leaves any BLAS thread choice alone."""
    import subprocess
    import sys

    from kvsim.__main__ import BLAS_THREAD_VARIABLES

    code = ("import os, sys; from kvsim.__main__ import single_blas_thread; single_blas_thread(); import numpy; "
            "print(os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')) if "
            "sys.platform == 'linux' else 1)")
    plain = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARIABLES}
    for extra, expected in (({}, "1 1"), ({"OMP_NUM_THREADS": "2"}, "None"), ({"OPENBLAS_NUM_THREADS": "3"}, "3")):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**plain, **extra},
                              timeout=120, check=True)
        assert done.stdout.split()[:len(expected.split())] == expected.split(), (extra, done.stdout)


def test_cli_loads_no_pydantic_plugins_unless_the_user_chose():
    """The entry sets PYDANTIC_DISABLE_PLUGINS=__all__ before pydantic loads, and leaves a user's value alone."""
    import subprocess
    import sys

    code = ("import os; from kvsim.__main__ import no_pydantic_plugins; no_pydantic_plugins(); "
            "from pydantic.plugin._loader import get_plugins; "
            "print(repr(os.environ.get('PYDANTIC_DISABLE_PLUGINS')), get_plugins() == ())")
    plain = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    for extra, expected in (({}, "'__all__' True"), ({"PYDANTIC_DISABLE_PLUGINS": ""}, "'' False")):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**plain, **extra},
                              timeout=120, check=True)
        assert done.stdout.strip() == expected, (extra, done.stdout, done.stderr)


def test_run_table_shows_names_as_given(tmp_path):
    """A scenario name is printed verbatim: rich read `:fire:` in it as an emoji code (printing a flame) and
    `[bold]` as markup (dropping it), so the table showed another name than the scenario's."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    name = "a:fire:b[bold]c"
    result = CliRunner().invoke(app, ["run", "--set", "workload.num_requests=2", "--set", f"name={name}",
                                      "-o", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert f"{name}: " in result.output, result.output


def test_max_num_seqs_flag_as_in_vllm(tmp_path):
    """`--max-num-seqs` (vLLM's engine argument) caps the batch of `run` and the concurrency `capacity` prices."""
    import json

    from typer.testing import CliRunner

    from kvsim.cli import app

    out = tmp_path / "r"
    result = CliRunner().invoke(app, ["run", "--max-num-seqs", "8", "--set", "workload.num_requests=40",
                                      "--set", "workload.arrival.rate=1000", "-o", str(out), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["max_running"] == 8  # 40 requests at once, 8 at a time
    assert "max_num_seqs: 8" in (out / "scenario.yaml").read_text()
    capped = CliRunner().invoke(app, ["capacity", "--max-num-seqs", "64", "--format", "json"])
    assert capped.exit_code == 0, capped.output
    rows = json.loads(capped.output)["rows"]
    assert all(r["concurrent_sequences"] == min(64, r["paged_max_seqs"]) for r in rows)


def test_the_written_scenario_runs_again_from_its_output_folder(tmp_path):
    """`scenario.yaml` in a run's folder reruns it: a trace named relative to the scenario file (here
    `traces/t.csv` beside `scenarios/`) is written as its absolute path, so the rerun reads the same
    requests and writes the same rows; relative, it named `runs/x/traces/t.csv`, which does not exist."""
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                               "2023-11-16 18:15:46.6805900,100,10\n2023-11-16 18:15:47.0,200,20\n")
    (tmp_path / "scenarios" / "s.yaml").write_text(
        "workload: {num_requests: 2, arrival: {process: trace}, trace: {format: azure, path: ../traces/t.csv}}\n")
    first, again = tmp_path / "runs" / "first", tmp_path / "runs" / "again"
    assert runner.invoke(app, ["run", str(tmp_path / "scenarios" / "s.yaml"), "-o", str(first)]).exit_code == 0
    written = (first / "scenario.yaml").read_text()
    assert f"path: {(tmp_path / 'traces' / 't.csv').resolve()}" in written
    result = runner.invoke(app, ["run", str(first / "scenario.yaml"), "-o", str(again)])
    assert result.exit_code == 0, result.output
    assert (first / "requests.csv").read_bytes() == (again / "requests.csv").read_bytes()


def test_a_written_scenario_runs_again_from_another_folder(tmp_path, monkeypatch):
    """A model and a GPU given as relative files are read from the working folder; the `scenario.yaml` a run
    writes names them absolutely (the draft model of speculative decoding too), so it runs again from
    anywhere with the same results. Presets stay names."""
    work = tmp_path / "work"
    (work / "hf").mkdir(parents=True)
    presets = Path(__file__).resolve().parents[1] / "kvsim" / "model" / "presets"
    (work / "hf" / "config.json").write_text((presets / "models" / "llama-3.1-8b.json").read_text())
    h100 = yaml.safe_load((presets / "gpus.yaml").read_text())["h100-80gb"]
    (work / "gpu.yaml").write_text(yaml.safe_dump(h100))
    monkeypatch.chdir(work)
    first = CliRunner().invoke(app, ["run", "--set", "model=hf/config.json", "--set", "gpu=gpu.yaml", "--set",
                                     "workload.num_requests=30", "--set", "steps=none", "--set",
                                     "engine.speculative_config={method: draft_model, model: hf/config.json, "
                                     "num_speculative_tokens: 2, acceptance_length: 2}", "-o", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    written = (tmp_path / "a" / "scenario.yaml").read_text()
    assert f"model: {work / 'hf' / 'config.json'}\n" in written and f"gpu: {work / 'gpu.yaml'}\n" in written
    assert f"    model: {work / 'hf' / 'config.json'}\n" in written  # the draft model
    monkeypatch.chdir(tmp_path)
    again = CliRunner().invoke(app, ["run", str(tmp_path / "a" / "scenario.yaml"), "-o", str(tmp_path / "b")])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "b" / "requests.csv").read_bytes() == (tmp_path / "a" / "requests.csv").read_bytes()


def test_a_run_leaves_the_garbage_collector_as_it_found_it(tmp_path, monkeypatch):
    """`kvsim run` freezes what exists and collects young objects less often while it simulates
    (`kvsim.cli.shared.run_collector`); an in-process caller gets its thresholds, freeze count and enabled
    state back, after a run and after a run refused mid-way (a memory limit checked when simulating starts)."""
    import gc
    from contextlib import contextmanager

    import kvsim.cli.shared as shared

    seen = []  # (young threshold, anything frozen) inside each run

    @contextmanager
    def spying():
        with shared.run_collector():
            seen.append((gc.get_threshold()[0], gc.get_freeze_count() > 0))
            yield

    monkeypatch.setattr("kvsim.cli.run_collector", spying)
    before = (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled())
    ok = runner.invoke(app, ["run", "--set", "workload.num_requests=5", "-o", str(tmp_path / "a"), "--format", "json"])
    assert ok.exit_code == 0, ok.output
    assert (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()) == before
    refused = runner.invoke(app, ["run", "--set", "workload.num_requests=5", "-o", str(tmp_path / "b"),
                                  "--memory-limit", "1KiB"])
    assert refused.exit_code == 2, refused.output
    assert (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()) == before
    assert seen == [(shared.RUN_YOUNG_COLLECTION, True)] * 2
