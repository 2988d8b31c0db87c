"""`kvsim calibrate` without a GPU: one line, exit 2, no file, in this process and in one of its own. It is here, not
in tests/test_cli_run.py or tests/test_bad_input.py, because it imports torch to ask for a GPU, in the worker that
runs it: here that is the worker that runs the kernel tests and imports torch anyway (conftest.py), not the other
one (~2 CPU s)."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kvsim.cli import app

RUNS_KERNELS = False  # asks torch for a GPU only: the CPU interpreter's limits do not apply (conftest.py)


def test_calibrate_without_gpu_is_one_line_error(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = CliRunner().invoke(app, ["calibrate", "--gpu", "h200", "-o", str(tmp_path / "p.csv")])
    assert result.exit_code == 2 and "no CUDA device" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "p.csv").exists()


def test_calibrate_without_a_gpu_is_one_line_at_exit_too(tmp_path):
    """In a process of its own: triton, imported before the CUDA check and left unused, printed nanobind's
    leak report (dozens of lines) after the one-line error as the interpreter exited; CliRunner never sees
    that. Now the check comes first."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    done = subprocess.run([sys.executable, "-m", "kvsim", "calibrate", "--gpu", "h200", "-o", str(tmp_path / "p.csv")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "kvsim: error: no CUDA device: calibration times kernels on a GPU (--dry-run prints the grid)"], done.stderr
    assert list(tmp_path.iterdir()) == []
