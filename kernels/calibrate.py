"""GPU calibration harness: time the paged-attention kernels and the model's GEMMs into a profile.

    measure(shapes, grid, gpu_name, output)       # on a CUDA device; `kvsim calibrate` calls this

What it measures (one transformer layer each, medians from `triton.testing.do_bench`):

    decode    batch × context grid, the model's head shape, each block size; block tables are
              random draws from a KV pool several times larger than L2, so reads miss the cache
    prefill   chunk lengths × cached lengths, batch 1 (the chunked-prefill case)
    gemm      qkv, o, gate_up, down and lm_head at the token counts a step can have
    copy      device-to-device copy bandwidth (the ceiling decode attention aims at)

The rows follow `kvsim.latency.base.PROFILE_COLUMNS`; `kvsim.latency.calibrated` interpolates them. The
decode grid is complete (every batch × context), which the bilinear interpolation needs.
This module needs only torch, triton and the standard library (plus kvsim.latency.base's schema).
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton

from kernels.grid import KERNELS_COMMIT_ENV, Grid, LayerShapes, plan
from kernels.paged_attention import FP8_DTYPE, paged_attention_decode, paged_attention_prefill
from kvsim.latency.base import PROFILE_COLUMNS
from kvsim.results.output_checks import FILE_TAG
from kvsim.results.output_dir import output_file

L2_BYTES = 64 * 2**20  # H100/H200 have 50-60 MB; pools are sized well past it
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def do_bench_s(fn: Callable[[], object]) -> float:
    """Median seconds of `fn` (triton.testing.do_bench works in milliseconds)."""
    return triton.testing.do_bench(fn, return_mode="median") / 1e3


class _KVPool:
    """One random K/V pool per block size, reused by every attention point, sized past L2."""

    def __init__(self, shapes: LayerShapes, block_size: int, max_tokens: int, device: str, max_bytes: int) -> None:
        kv_dtype = FP8_DTYPE if shapes.kv_dtype == "fp8" else DTYPES[shapes.dtype]
        elem = torch.empty((), dtype=kv_dtype).element_size()
        self.bytes_per_token = 2 * shapes.num_kv_heads * shapes.head_dim * elem  # K and V
        wanted = max(triton.cdiv(max_tokens, block_size), triton.cdiv(4 * L2_BYTES, self.bytes_per_token * block_size))
        cap = max(1, max_bytes // (self.bytes_per_token * block_size))
        self.num_blocks = min(wanted, cap)
        shape = (self.num_blocks, block_size, shapes.num_kv_heads, shapes.head_dim)
        self.k = torch.randn(shape, device=device).to(kv_dtype)
        self.v = torch.randn(shape, device=device).to(kv_dtype)
        self.block_size = block_size

    def tables(self, batch: int, context: int) -> torch.Tensor:
        """Random block tables (with replacement only when the pool is smaller than the request)."""
        per_seq = triton.cdiv(context, self.block_size)
        needed = batch * per_seq
        if needed <= self.num_blocks:
            ids = torch.randperm(self.num_blocks, device=self.k.device)[:needed]
        else:
            ids = torch.randint(0, self.num_blocks, (needed,), device=self.k.device)
        return ids.to(torch.int32).reshape(batch, per_seq)


def measure(shapes: LayerShapes, grid: Grid, gpu_name: str, output: Path, device: str = "cuda",
            timer: Callable[[Callable[[], object]], float] = do_bench_s, max_kv_bytes: int = 48 * 2**30,
            progress: Callable[[int, int], None] | None = None) -> Path:
    """Measure every point of `plan(shapes, grid)` and write the profile CSV to `output`."""
    act = DTYPES[shapes.dtype]
    rows = []
    points = plan(shapes, grid)
    pools: dict[int, _KVPool] = {}
    for index, point in enumerate(points):
        row: dict[str, Any] = dict.fromkeys(PROFILE_COLUMNS, "")
        row.update(point)
        kind = point["kind"]
        if kind in ("decode", "prefill"):
            bs = int(point["block_size"])
            if bs not in pools:
                pools.clear()  # points come block size by block size: free the last pool before the next
                longest = max(max(grid.batches) * max(grid.contexts),
                              max(grid.prefill_query_lens) + max(grid.prefill_cached_lens))
                pools[bs] = _KVPool(shapes, bs, longest, device, max_kv_bytes)
            pool = pools[bs]
            batch, ctx = int(point["batch"]), int(point["context_len"])
            tables = pool.tables(batch, ctx)
            lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
            if kind == "decode":
                q = torch.randn(batch, shapes.num_heads, shapes.head_dim, device=device).to(act)
                row["time_s"] = timer(partial(paged_attention_decode, q, pool.k, pool.v, tables, lens,
                                              max_context=ctx))
                row["flops"] = 4 * batch * ctx * shapes.num_heads * shapes.head_dim
            else:
                qlen = int(point["query_len"])
                q = torch.randn(qlen, shapes.num_heads, shapes.head_dim, device=device).to(act)
                starts = torch.tensor([0, qlen], dtype=torch.int32, device=device)
                row["time_s"] = timer(partial(paged_attention_prefill, q, pool.k, pool.v, tables, lens, starts, qlen))
                row["flops"] = 4 * qlen * (ctx - qlen + (qlen + 1) / 2) * shapes.num_heads * shapes.head_dim
            row["bytes"] = batch * ctx * pool.bytes_per_token
            row.update(num_heads=shapes.num_heads, num_kv_heads=shapes.num_kv_heads, head_dim=shapes.head_dim,
                       dtype=shapes.kv_cache_dtype)
        elif kind == "gemm":
            t, k, n = int(point["num_tokens"]), int(point["k"]), int(point["n"])
            x = torch.randn(t, k, device=device).to(act)
            w = torch.randn(k, n, device=device).to(act)
            row["time_s"] = timer(partial(torch.matmul, x, w))
            row.update(flops=2 * t * k * n, bytes=(t * k + k * n + t * n) * x.element_size(), dtype=shapes.dtype)
        else:
            numel = (2**30 if device == "cuda" else 2**20) // 4
            src = torch.randn(numel, device=device)
            dst = torch.empty_like(src)
            row["time_s"] = timer(partial(dst.copy_, src))
            row["bytes"] = 2 * numel * 4
        rows.append(row)
        if progress is not None:
            progress(index + 1, len(points))
    return write_profile(output, rows, _metadata(gpu_name, shapes, grid, device))


def _metadata(gpu_name: str, shapes: LayerShapes, grid: Grid, device: str) -> dict[str, str]:
    """What the profile was measured with: model, shapes, TP, KV dtype, block sizes, device, driver,
    library versions and the kernels' code (git commit and a hash of the sources)."""
    name = torch.cuda.get_device_name() if device == "cuda" else f"{platform.processor() or 'cpu'} (interpreter)"
    return {
        "gpu": gpu_name, "device_name": name, "driver": _driver_version(), "cuda": str(torch.version.cuda),
        "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": shapes.model, "tensor_parallel_size": str(shapes.tensor_parallel_size),
        "kv_cache_dtype": shapes.kv_cache_dtype, "block_sizes": ",".join(map(str, grid.block_sizes)),
        "kernels_commit": kernels_commit(), "kernels_source_sha256": kernels_source_hash(),
        "shapes": str(asdict(shapes)), "grid": str(asdict(grid)),
    }


def _driver_version() -> str:
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no nvidia-smi)"
    return found.stdout.strip().splitlines()[0] if found.returncode == 0 and found.stdout.strip() else "unknown"


def kernels_commit() -> str:
    """The git commit the kernels came from: `KERNELS_COMMIT_ENV` when set (a copied tree has no .git),
    else `git rev-parse HEAD` with `-dirty` when kernels/ has changes, else 'unknown'."""
    if os.environ.get(KERNELS_COMMIT_ENV):
        return os.environ[KERNELS_COMMIT_ENV]
    here = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=here, capture_output=True, text=True,
                               timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def kernels_source_hash() -> str:
    """sha256 of kernels/*.py (names and contents, sorted): identifies the code even without git."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def write_profile(output: Path, rows: list[dict[str, Any]], meta: dict[str, str]) -> Path:
    """Write `# key: value` metadata, then the CSV, through `kvsim.results.output_dir.output_file`: a new
    file or one kvsim wrote (its first line is `# generator: kvsim calibrate`), replaced when complete."""
    with output_file(output) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        f.write(f"{FILE_TAG} calibrate\n")
        for key, value in meta.items():
            f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, fieldnames=PROFILE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return output
