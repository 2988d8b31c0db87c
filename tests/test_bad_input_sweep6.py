"""Bad input found by the sixth sweep: each exits 2 with one line naming the field and the value, and
writes nothing, never a traceback, a setting silently dropped or a folder left behind."""

import pytest
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()
PLAN = ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=2", "--set", "workload.num_requests=20"]


def _one_line_exit_2(argv: list[str]) -> str:
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), result.stderr
    return lines[0].removeprefix("kvsim: error: ")


def test_a_plan_spec_knob_with_no_values_is_refused(tmp_path):
    """`engine: {max_num_seqs: []}` made the candidate grid (a product over the knobs) empty: the memory
    check then raised a bare `ValueError: min() arg is an empty sequence`."""
    (tmp_path / "spec.yaml").write_text("engine: {max_num_seqs: []}\n")
    assert _one_line_exit_2([*PLAN, "--spec", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "out")]) == (
        "plan.engine: max_num_seqs=[]: give at least one value for a knob (or leave it out)")
    assert [p.name for p in tmp_path.iterdir()] == ["spec.yaml"]
