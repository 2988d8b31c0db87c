"""The output writer never touches what kvsim did not write, and an interrupt never loses a run.

Every refusal test plants files first and checks afterwards that each one is still there,
byte for byte; the kill tests interrupt a writer at random instants and check that the path
holds either the complete earlier output or the complete new one.
"""

import contextlib
import json
import os
import random
import signal
import stat
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.model.errors import KvsimError
from kvsim.results import output_dir
from kvsim.results.output_checks import FILE_TAG, MARKER_NAME, check_output_dir, safe_component
from kvsim.results.output_dir import output_directory, output_file
from kvsim.results.step_writer import has_pyarrow

runner = CliRunner()
RUN = ["run", "--set", "workload.num_requests=5"]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file below `root` and its bytes (folders as None)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A fake home holding a user's files, with the working directory two levels inside it."""
    home = tmp_path / "home"
    cwd = home / "project" / "work"
    cwd.mkdir(parents=True)
    for folder in (home, home / "project", cwd):
        (folder / "precious.txt").write_text(f"user data in {folder.name}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))  # matplotlib caches fonts under HOME
    monkeypatch.chdir(cwd)
    return home


@pytest.mark.parametrize("target", [".", "..", "../..", "~", "./", "work/..", "/", "~/project"])
@pytest.mark.parametrize("command", ["run", "report"])
def test_protected_paths_are_refused_and_left_alone(world, target, command):
    before = snapshot(world)
    args = RUN if command == "run" else ["report", "--quick"]
    result = runner.invoke(app, [*args, "-o", target])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and target in lines[0] and "kvsim only replaces output it wrote itself" in lines[0]
    assert snapshot(world) == before


def test_folder_of_strangers_files_is_refused(world):
    folder = world / "project" / "work" / "results"
    folder.mkdir()
    (folder / "thesis.tex").write_text("months of work\n")
    before = snapshot(world)
    for extra in ([], ["--format", "json"]):
        result = runner.invoke(app, [*RUN, *extra, "-o", "results"])
        assert result.exit_code == 2 and f"has no {MARKER_NAME} marker" in result.stderr
    assert snapshot(world) == before


def test_empty_folder_and_file_are_refused(world):
    (world / "empty").mkdir()
    (world / "afile").write_text("x")
    before = snapshot(world)
    for target, why in (("~/empty", "has no .kvsim-output marker"), ("~/afile", "is not a folder")):
        result = runner.invoke(app, [*RUN, "-o", target])
        assert result.exit_code == 2 and why in result.stderr
    assert snapshot(world) == before


def test_symlink_to_a_kvsim_run_is_refused(world):
    assert runner.invoke(app, [*RUN, "-o", "~/real"]).exit_code == 0
    (world / "link").symlink_to(world / "real")
    before = snapshot(world)
    result = runner.invoke(app, [*RUN, "-o", "~/link"])
    assert result.exit_code == 2 and "symbolic link" in result.stderr
    assert snapshot(world) == before


def test_user_file_added_to_a_run_blocks_replacing_it(world):
    out = world / "run1"
    assert runner.invoke(app, [*RUN, "-o", str(out)]).exit_code == 0
    (out / "notes.md").write_text("my analysis\n")
    before = snapshot(world)
    result = runner.invoke(app, [*RUN, "-o", str(out)])
    assert result.exit_code == 2 and "'notes.md', which kvsim did not write" in result.stderr
    assert snapshot(world) == before


def test_rerun_replaces_its_own_output_and_leaves_nothing_beside_it(world):
    out = world / "runs" / "a"
    assert runner.invoke(app, [*RUN, "-o", str(out)]).exit_code == 0
    first = (out / "summary.json").read_text()
    result = runner.invoke(app, ["run", "--set", "workload.num_requests=7", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 7 != json.loads(first)["num_requests"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["a"]  # no temporary folders left
    marker = json.loads((out / MARKER_NAME).read_text())
    assert marker["kind"] == "run"
    steps_file = "steps.parquet" if has_pyarrow() else "steps.csv"  # `kvsim run --steps-format auto`
    assert sorted(marker["files"]) == ["requests.csv", "scenario.yaml", steps_file, "summary.json"]


def _sha(name):  # the suffix a cleaned name takes: the first 8 hex digits of its SHA-256 (Python's own hashlib)
    import hashlib

    return hashlib.sha256(name.encode()).hexdigest()[:8]


@pytest.mark.parametrize(("name", "expected"), [
    (".", f"scenario-{_sha('.')}"), ("..", f"scenario-{_sha('..')}"), ("../../etc", f"etc-{_sha('../../etc')}"),
    ("a/b", f"a_b-{_sha('a/b')}"), ("~", f"scenario-{_sha('~')}"), ("", "scenario"),
    (".hidden", f"hidden-{_sha('.hidden')}"), ("lab 1: 8k", f"lab_1_8k-{_sha('lab 1: 8k')}"),
    ("ok-name_1.2", "ok-name_1.2"), ("lab-1-max-len-8192", "lab-1-max-len-8192"),
])
def test_scenario_names_become_one_safe_component(name, expected):
    assert safe_component(name) == expected


def test_short_names_that_clean_alike_get_folders_of_their_own(world):
    """`a/b`, `a b` and `a_b` all cleaned to `a_b` (and `.x`, `_x`, `x` to `x`): three scenarios shared one default
    folder, each run replacing the last one's output. A name that is a safe component already keeps it; the
    others end in their own digest. Three runs of 2, 3 and 4 requests leave three folders."""
    names = ["a/b", "a b", "a_b"]
    assert len({safe_component(name) for name in names}) == 3 and safe_component("a_b") == "a_b"
    assert len({safe_component(name) for name in (".x", "_x", "x")}) == 3
    for name, num_requests in zip(names, (2, 3, 4), strict=True):
        result = runner.invoke(app, ["run", "--set", f"name={name}", "--set", f"workload.num_requests={num_requests}"])
        assert result.exit_code == 0, result.output
    runs = world / "project" / "work" / "runs"
    found = {folder.name: json.loads((folder / "summary.json").read_text())["num_requests"] for folder in runs.iterdir()}
    assert found == {"a_b": 4, f"a_b-{_sha('a/b')}": 2, f"a_b-{_sha('a b')}": 3}


def test_long_names_alike_in_their_first_100_characters_get_folders_of_their_own():
    """A default folder's name is cut to 100 characters: two scenario names alike in those were cut to one folder,
    and the second run replaced the first one's output. A name of 100 characters or fewer is kept whole."""
    first, second = "x" * 100 + "aaa", "x" * 100 + "bbb"
    a, b = safe_component(first), safe_component(second)
    assert a != b and len(a) <= 100 and len(b) <= 100
    assert a.startswith("x" * 80) and b.startswith("x" * 80)  # still the name a user recognises
    assert safe_component(first) == a  # a rerun of the same scenario replaces its own output, as before
    assert safe_component("y" * 100) == "y" * 100


def test_a_second_long_named_run_leaves_the_first_ones_output(world):
    first, second = "x" * 100 + "aaa", "x" * 100 + "bbb"
    for name, num_requests in ((first, 3), (second, 4)):
        result = runner.invoke(app, ["run", "--set", f"name={name}", "--set", f"workload.num_requests={num_requests}"])
        assert result.exit_code == 0, result.output
    runs = world / "project" / "work" / "runs"
    summaries = sorted(json.loads((folder / "summary.json").read_text())["num_requests"] for folder in runs.iterdir())
    assert summaries == [3, 4]


@pytest.mark.parametrize("name", [".", "..", "../escape", "/abs"])
def test_scenario_name_cannot_steer_the_default_output(world, name):
    scenario = world / "s.yaml"
    scenario.write_text(f"name: {json.dumps(name)}\nworkload: {{num_requests: 3, prompt_len: {{dist: fixed, value: 8}}, "
                        "output_len: {dist: fixed, value: 4}}\n")
    before = snapshot(world)
    result = runner.invoke(app, ["run", str(scenario)])
    assert result.exit_code == 0, result.output
    runs = world / "project" / "work" / "runs"
    assert len(list(runs.iterdir())) == 1 and (next(runs.iterdir()) / "summary.json").is_file()
    after = snapshot(world)
    assert {k: v for k, v in after.items() if not k.startswith("project/work/runs")} == before


def test_folders_and_files_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        with output_directory(tmp_path / "deep" / "out", "run") as tmp:
            (tmp / "a.csv").write_text("x\n")
    finally:
        os.umask(old)
    out = tmp_path / "deep" / "out"
    for path, mode in ((tmp_path / "deep", 0o750), (out, 0o750), (out / "a.csv", 0o640), (out / MARKER_NAME, 0o640)):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path


def test_failure_inside_leaves_the_old_output(tmp_path):
    out = tmp_path / "out"
    with output_directory(out, "run") as tmp:
        (tmp / "a.csv").write_text("old\n")
    with pytest.raises(RuntimeError), output_directory(out, "run") as tmp:
        (tmp / "a.csv").write_text("new\n")
        raise RuntimeError("simulated crash while writing")
    assert (out / "a.csv").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_output_file_replaces_only_its_own_files(tmp_path):
    mine, theirs = tmp_path / "p.csv", tmp_path / "q.csv"
    theirs.write_text("kind,time_s\nsomeone else's\n")
    for _ in range(2):  # new, then replaced
        with output_file(mine) as tmp:
            tmp.write_text(f"{FILE_TAG} test\nrow\n")
    assert mine.read_text() == f"{FILE_TAG} test\nrow\n"
    with pytest.raises(KvsimError, match="does not start with"), output_file(theirs) as tmp:
        tmp.write_text(f"{FILE_TAG}\n")
    assert theirs.read_text() == "kind,time_s\nsomeone else's\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv", "q.csv"]


def test_calibrate_refuses_a_strangers_file_before_measuring(tmp_path):
    theirs = tmp_path / "h200.csv"
    theirs.write_text("my own measurements\n")
    result = runner.invoke(app, ["calibrate", "--gpu", "h200", "-o", str(theirs), "--quick"])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "does not start with '# generator: kvsim'" in result.stderr
    assert theirs.read_text() == "my own measurements\n"


# ---------------------------------------------------------------- interrupts at random instants

def _write_run(out: Path, tag: str, num_files: int, size: int) -> None:
    with output_directory(out, "run") as tmp:
        for i in range(num_files):
            (tmp / f"f{i}.csv").write_text(f"{tag}\n" + "x" * size)


def _complete(out: Path) -> str:
    """The tag of the complete run at `out`; fails if anything is missing or mixed."""
    marker = json.loads((out / MARKER_NAME).read_text())
    tags = {(out / name).read_text().split("\n", 1)[0] for name in marker["files"]}
    assert len(marker["files"]) == 20 and len(tags) == 1, (marker, tags)
    assert sorted(p.name for p in out.iterdir()) == sorted([*marker["files"], MARKER_NAME])
    return tags.pop()


def _fork_writer(out: Path, tag: str, two_renames: bool) -> int:
    """Fork a process that writes a 20-file run tagged `tag` at `out` and exits; its pid.

    SIGINT stays blocked across the fork until the child has its own handler: an early signal
    must not run the inherited one (pytest-xdist's worker reports it to the controller)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pid = os.fork()
    if pid == 0:  # the writer; never returns into pytest
        code = 1
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            if two_renames:
                output_dir._renameat2 = lambda src, dst, flags: False
            _write_run(out, tag, 20, 20_000)
            code = 0
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return pid


def test_kill_at_a_random_instant_leaves_old_or_new_output(tmp_path):
    """Fork a writer that replaces a complete run, kill it (SIGINT or SIGKILL) after a random
    delay spanning the whole write, and check what is at the path; repeated 40 times. Every
    third writer swaps by two renames (filesystems without RENAME_EXCHANGE) and gets SIGINT,
    which that path holds off between its renames (SIGKILL cannot be held off). The write's
    length is timed on forked writers left to finish (a fork pays for copy-on-write pages that
    an in-process write does not), and the delays then follow the machine: a kill that came after the
    write ended shortens the next ones, a kill that came before lengthens them, so they keep spanning
    the write when the machine's load changes (a load spike during the timing made every kill land
    late once)."""
    out = tmp_path / "out"
    _write_run(out, "gen0", 20, 20_000)
    duration_s = 0.0
    for calibration in ("cal0", "cal1"):
        started = time.perf_counter()
        os.waitpid(_fork_writer(out, calibration, two_renames=False), 0)
        duration_s = max(duration_s, time.perf_counter() - started)
        assert _complete(out) == calibration
    rng = random.Random(1234)
    seen = {"old": 0, "new": 0}
    current = "cal1"
    for trial in range(40):
        tag = f"gen{trial + 2}"
        two_renames = trial % 3 == 0
        sig = signal.SIGINT if two_renames else rng.choice([signal.SIGINT, signal.SIGKILL])
        pid = _fork_writer(out, tag, two_renames)
        time.sleep(rng.uniform(0, 2 * duration_s))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        os.waitpid(pid, 0)
        found = _complete(out)
        assert found in (current, tag), (trial, found, current, tag)
        seen["new" if found == tag else "old"] += 1
        duration_s *= 0.8 if found == tag else 1.25
        current = found
    _write_run(out, "final", 20, 10)  # a later write clears what killed writers left behind
    assert _complete(out) == "final"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert seen["old"] and seen["new"], seen  # the delays did span the write


def test_cli_interrupted_by_sigint_keeps_the_earlier_run(tmp_path):
    """The real command in a subprocess, interrupted while it simulates and writes."""
    import subprocess
    import sys

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "kvsim", "run", "--set", "workload.num_requests=2000", "-o", str(out)]
    assert subprocess.run([*cmd[:-4], "--set", "workload.num_requests=5", "-o", str(out)],
                          capture_output=True).returncode == 0
    before = snapshot(out)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    after = snapshot(out)
    # Either the earlier run untouched, or the new one complete: it was swapped in before the signal (the
    # command may still have been printing its summary then, so its exit code says interrupted).
    if proc.returncode == 0 or after != before:
        assert set(after) == set(before) and json.loads(after["summary.json"])["num_requests"] == 2000
        assert after["requests.csv"].count(b"\n") == 2001
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_check_output_dir_accepts_new_and_own_paths(tmp_path):
    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    with output_directory(tmp_path / "own", "report") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "fig.png").write_bytes(b"png")
    assert check_output_dir(tmp_path / "own") == tmp_path / "own"
