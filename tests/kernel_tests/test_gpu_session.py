"""The GPU session's plan, checked on the CPU: its dry run fits in 8 minutes, its stages agree with the
grids, and the benchmark's measurement code runs (tiny shapes, the interpreter, a stand-in timer)."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_kernels  # noqa: E402

from kernels.grid import DEFAULT_GRID  # noqa: E402


def test_dry_run_estimates_the_session_under_8_minutes():
    result = subprocess.run([sys.executable, "benchmarks/kernels_dry_run.py"], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    stages = dict(re.findall(r"^(\S+)\s+(\d+) s ", result.stdout, re.MULTILINE))
    assert set(stages) == {"setup", "compile-sm90", "calibrate", "bench-kernels", "kernel-tests", "total"}
    assert int(stages["total"]) <= 480
    assert "255 points, block sizes (16, 32)" in result.stdout  # Llama-3.1-8B: 2 x (72 + 20) + 70 GEMMs + copy


def test_session_calibrates_the_grid_the_dry_run_counts():
    script = (REPO / "benchmarks" / "gpu_session.sh").read_text()
    sizes = ",".join(map(str, DEFAULT_GRID.block_sizes))
    assert f"--block-sizes {sizes}" in script and {16, 32} <= set(DEFAULT_GRID.block_sizes)
    assert "python3 -m zipfile -e" in script  # the wheels install without pip


def test_benchmark_measures_decode_and_prefill_against_contiguous_sdpa(monkeypatch):
    monkeypatch.setattr(bench_kernels, "HEADS", 4)
    monkeypatch.setattr(bench_kernels, "KV_HEADS", 2)
    monkeypatch.setattr(bench_kernels, "HEAD_DIM", 32)
    calls = []

    def timer(fn):
        fn()  # the kernels under the interpreter, SDPA on the CPU
        calls.append(1)
        return 1e-3 * len(calls)

    grid = [{"kind": "decode", "block_size": 16, "batch": 2, "context_len": 40},
            {"kind": "prefill", "block_size": 32, "batch": 1, "query_len": 20, "context_len": 50}]
    result = bench_kernels.run(grid, timer, "cpu", 2**16, 2**12)
    assert len(calls) == 1 + 2 * len(grid)  # the copy, then paged and contiguous per point
    table = bench_kernels.markdown(result)
    assert "| 16 | 2 | 40 | " in table and "| 32 | 20 | 30 | " in table
    assert result["results"][1]["flops"] == bench_kernels.prefill_flops(20, 50)
