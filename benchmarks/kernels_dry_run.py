"""Dry run of benchmarks/gpu_session.sh on a CPU: count what each stage does, estimate its time on an H200.

    python benchmarks/kernels_dry_run.py [--budget-s 480]

Exits 1 when the estimate exceeds the budget (8 minutes: a device call may run 10, and the
machine's start and the transfers come out of the same allowance). Standard library only, plus
pytest to count the kernel tests. The model, per stage:

    each timed call   do_bench: 1 first call, 5 to estimate, then warmup (25 ms) and repetitions
                      (100 ms) of (kernel + its 256 MiB L2 flush, at least LAUNCH_S each):
                      6 * t + max(0.125 s, 2 * t)
    kernel times      bytes / (ACHIEVED * 4.3 TB/s measured copy), FLOPs / (ACHIEVED * 790 TFLOP/s)
    allocations       K/V pools drawn with randn (fp32, then cast): 5 passes over their bytes
    compiles          COMPILE_S per Triton specialization, an upper bound on how many each stage makes
    kernel tests      TEST_S per collected test (compiles dominate: small shapes, a few new
                      specializations each) plus the compile report the folder also runs

Rates are the H200's (HBM 4.8 TB/s datasheet, about 4.3 TB/s measured copy, ~790 TFLOP/s bf16
dense); ACHIEVED is the pessimistic fraction the kernels are assumed to reach, so the estimate
errs long.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import bench_kernels  # noqa: E402  (its grids; torch is imported only to measure)

from kernels.grid import DEFAULT_GRID, LayerShapes, plan  # noqa: E402

COPY_BYTES_PER_S = 4.3e12
BF16_FLOPS = 790e12
ACHIEVED = 0.5
LAUNCH_S = 20e-6
FLUSH_S = 2**28 / COPY_BYTES_PER_S  # do_bench zeroes 256 MiB before each call
COMPILE_S = 1.5  # 0.5 s per kernel measured by compile_check on a 2-core CPU host; 3x for safety
TEST_S = 1.5
SETUP_S = 20.0  # environment, dependency install, Python and torch imports, CUDA context
CALIBRATE_COMPILES = 40  # decode (2 block sizes x split or not x stride divisibility), reduce, prefill
BENCH_COMPILES = 24
COMPILE_CASES = 30  # lines of `python -m kernels.compile_check`
# Llama-3.1-8B at TP 1, the model gpu_session.sh calibrates (kvsim's preset)
LLAMA_8B = LayerShapes(num_heads=32, num_kv_heads=8, head_dim=128, hidden_size=4096, intermediate_size=14336,
                       vocab_size=128256, gated_mlp=True, dtype="bfloat16", kv_dtype="auto", model="Llama-3.1-8B")


def timed_call_s(kernel_s: float) -> float:
    t = max(kernel_s, LAUNCH_S) + FLUSH_S
    return 6 * t + max(0.125, 2 * t)


def kernel_s(num_bytes: float = 0.0, flops: float = 0.0) -> float:
    return max(num_bytes / (ACHIEVED * COPY_BYTES_PER_S), flops / (ACHIEVED * BF16_FLOPS))


def calibrate_s(shapes: LayerShapes = LLAMA_8B) -> tuple[int, float]:
    """(points, seconds) of `kvsim calibrate` over DEFAULT_GRID (what gpu_session.sh runs)."""
    kv_per_token = 2 * shapes.num_kv_heads * shapes.head_dim * 2
    total, points = 0.0, plan(shapes, DEFAULT_GRID)
    for p in points:
        if p["kind"] == "decode":
            total += timed_call_s(kernel_s(p["batch"] * p["context_len"] * kv_per_token))
        elif p["kind"] == "prefill":
            q, ctx = p["query_len"], p["context_len"]
            flops = 4 * q * (ctx - q + (q + 1) / 2) * shapes.num_heads * shapes.head_dim
            total += timed_call_s(kernel_s(ctx * kv_per_token, flops))
        elif p["kind"] == "gemm":
            t, k, n = p["num_tokens"], p["k"], p["n"]
            total += timed_call_s(kernel_s((t * k + k * n + t * n) * 2, 2 * t * k * n))
        else:
            total += timed_call_s(kernel_s(2**31))
    longest = max(max(DEFAULT_GRID.batches) * max(DEFAULT_GRID.contexts),
                  max(DEFAULT_GRID.prefill_query_lens) + max(DEFAULT_GRID.prefill_cached_lens))
    pool_bytes = min(longest * kv_per_token, 48 * 2**30)
    total += len(DEFAULT_GRID.block_sizes) * 5 * pool_bytes / COPY_BYTES_PER_S
    return len(points), total + CALIBRATE_COMPILES * COMPILE_S


def bench_s() -> tuple[int, float]:
    """(points, seconds) of benchmarks/bench_kernels.py: two timed calls a point, a fresh pool each."""
    total = timed_call_s(kernel_s(2 * 2**30))  # the copy
    grid = bench_kernels.points()
    for p in grid:
        kv = bench_kernels.kv_bytes(p["batch"], p["context_len"])
        flops = bench_kernels.prefill_flops(p["query_len"], p["context_len"]) if p["kind"] == "prefill" else 0.0
        total += 2 * timed_call_s(kernel_s(kv, flops))
        total += 5 * max(kv, bench_kernels.POOL_BYTES) / COPY_BYTES_PER_S + 3 * kv / COPY_BYTES_PER_S  # pool, gather
    return len(grid), total + BENCH_COMPILES * COMPILE_S


def kernel_tests() -> int:
    """Tests pytest collects in tests/kernel_tests (on the CPU, as on the GPU machine)."""
    found = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-o",
                            "addopts=", "tests/kernel_tests"], cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "TRITON_INTERPRET": "1"})
    count = sum(1 for line in found.stdout.splitlines() if "::" in line)
    assert found.returncode == 0 and count, found.stdout[-2000:] + found.stderr[-2000:]
    return count


def estimate() -> list[tuple[str, str, float]]:
    """(stage, what it does, seconds) in gpu_session.sh's order."""
    calibration_points, calibration = calibrate_s()
    bench_points, bench = bench_s()
    tests = kernel_tests()
    return [
        ("setup", "environment, dependencies", SETUP_S),
        ("compile-sm90", f"{COMPILE_CASES} kernels compiled for sm_90", COMPILE_CASES * COMPILE_S),
        ("calibrate", f"{calibration_points} points, block sizes {DEFAULT_GRID.block_sizes}", calibration),
        ("bench-kernels", f"{bench_points} points, paged and contiguous SDPA each", bench),
        ("kernel-tests", f"{tests} tests (the compile report again, from Triton's cache)", tests * TEST_S + 10.0),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=480.0)
    args = parser.parse_args()
    stages = estimate()
    for name, what, seconds in stages:
        print(f"{name:14s} {seconds:6.0f} s  {what}")
    total = sum(s for _, _, s in stages)
    verdict = "fits" if total <= args.budget_s else "does NOT fit"
    print(f"{'total':14s} {total:6.0f} s  {verdict} in {args.budget_s:.0f} s")
    return 0 if total <= args.budget_s else 1


if __name__ == "__main__":
    sys.exit(main())
