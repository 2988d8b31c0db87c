"""`kvsim calibrate` without a GPU: one line, exit 2, no file. It is here, not in tests/test_cli_run.py, because it
imports torch to ask for a GPU, in the worker that runs it: here that is the worker that runs the kernel tests and
imports torch anyway (conftest.py)."""

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
