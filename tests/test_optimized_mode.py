"""Running under `python -O` (asserts stripped) changes no result.

An `assert` whose expression allocates or reserves KV would be skipped under -O and leave the books
short; the schedulers keep every side effect outside their asserts. Each scheduler family runs once
with and once without -O and the summaries must be byte-identical.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _summary(tmp_path: Path, name: str, optimize: bool, args: list[str]) -> bytes:
    """`kvsim run`'s summary.json: under `python -O` in a process of its own, else in this one (asserts kept), which
    spares a second interpreter's start."""
    out = tmp_path / name
    argv = ["run", *args, "-o", str(out), "--format", "json"]
    if optimize:
        subprocess.run([sys.executable, "-O", "-m", "kvsim", *argv], check=True, cwd=REPO, capture_output=True)
    else:
        from typer.testing import CliRunner

        from kvsim.cli import app

        assert __debug__  # this interpreter keeps its asserts
        with contextlib.chdir(REPO):  # the same arguments, read from the same folder
            result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
    return (out / "summary.json").read_bytes()


@pytest.mark.parametrize("args", [
    ["scenarios/preemption-swap.yaml", "--set", "workload.num_requests=120"],          # v0, swap
    ["scenarios/paper-slab-pow2.yaml", "--set", "workload.num_requests=120"],          # v0, slab reserve
    ["--set", "engine.scheduler=static", "--set", "workload.num_requests=60"],         # static batches
    ["scenarios/mooncake-conv-replay.yaml", "--set", "workload.num_requests=150",      # v1, offload loads
     "--set", "engine.kv_offload={cpu_bytes: 64GiB}", "--set", "engine.num_gpu_blocks_override=3000",
     "--set", "engine.max_model_len=32768"],
], ids=["v0-swap", "v0-slab", "static", "v1-offload"])
def test_asserts_have_no_side_effects(tmp_path: Path, args: list[str]) -> None:
    assert _summary(tmp_path, "plain", False, args) == _summary(tmp_path, "optimized", True, args)
