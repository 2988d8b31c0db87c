"""Bad input found by the fifth sweep: each exits 2 with one line naming the field and the value, and
writes nothing (or, from Python, raises `KvsimError`), never a traceback or a setting silently dropped."""

import os

import pytest
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()
PLAN = ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=2"]


def _one_line_exit_2(argv: list[str]) -> str:
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), result.stderr
    return lines[0].removeprefix("kvsim: error: ")


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
        message = _one_line_exit_2([arg.replace("{f}", path) for arg in command] + ["-o", str(tmp_path / "out")])
        shown = f"{field}={path!r}" if field != "profile" else f"profile {path}"
        assert message == f"{shown}: not a regular file ({kind})"
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]


def test_a_scenario_through_a_symlink_loop_says_so(tmp_path):
    (tmp_path / "loop").symlink_to("loop")
    assert _one_line_exit_2(["run", str(tmp_path / "loop"), "-o", str(tmp_path / "out")]) == (
        f"scenario={str(tmp_path / 'loop')!r}: cannot read (Too many levels of symbolic links)")


def test_a_spec_that_is_a_folder_says_so(tmp_path):
    assert _one_line_exit_2([*PLAN, "--spec", str(tmp_path), "-o", str(tmp_path / "out")]) == (
        f"spec={str(tmp_path)!r}: is a directory, not a spec YAML file")
