"""Paged-attention kernels on a GPU against the measured copy bandwidth, bf16 peak and contiguous SDPA.

    python benchmarks/bench_kernels.py [--quick] [--output-dir benchmarks/results]

Llama-3.1-8B's head shape (32 query heads, 8 KV heads, head_dim 128, bf16 KV). For each point the
paged kernel reads block tables drawn at random from a pool far larger than L2, and
`torch.nn.functional.scaled_dot_product_attention` runs on the same KV gathered contiguous (the
gather is not timed; `enable_gqa`, causal lower-right for a prefill chunk after a cached
prefix). Medians of `triton.testing.do_bench`.

    decode    batch x context x block size: KV bytes read / time, as a fraction of a
              device-to-device copy measured in the same run
    prefill   query length x cached length (batch 1) x block size: attention FLOP/s as a
              fraction of the bf16 dense peak (BF16_PEAK_FLOPS)

Writes `kernels.json` and `kernels.md` (the two tables) into `--output-dir`, each new or this bench's earlier result
(the JSON object of its keys; that JSON's tables), else refused before it runs. Needs a CUDA device; exits 2 otherwise.
`benchmarks/kernels_dry_run.py` reads the grids below to estimate the run's time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
BF16_PEAK_FLOPS = 790e12  # H200 bf16 dense, the figure issue 24 compares prefill with
POOL_BYTES = 4 * 2**30  # K + V pool at least this big, so random blocks miss the 50-60 MB L2
DECODE_GRID = {"block_sizes": (16, 32, 128), "batches": (1, 8, 32, 64, 128, 256), "contexts": (1024, 4096, 16384)}
PREFILL_GRID = {"block_sizes": (16, 32), "query_lens": (512, 2048), "cached_lens": (0, 4096)}
RESULT_KEYS = frozenset({"benchmark", "device", "torch", "triton", "copy_bytes_per_s", "bf16_peak_flops", "heads",
                         "kv_heads", "head_dim", "dtype", "results"})
QUICK = {"decode": {"block_sizes": (16,), "batches": (1, 32, 128), "contexts": (4096,)},
         "prefill": {"block_sizes": (16,), "query_lens": (1024,), "cached_lens": (0,)}}


def points(quick: bool = False) -> list[dict[str, Any]]:
    """Every measurement, decode then prefill, grouped by block size."""
    dec, pre = (QUICK["decode"], QUICK["prefill"]) if quick else (DECODE_GRID, PREFILL_GRID)
    out: list[dict[str, Any]] = [{"kind": "decode", "block_size": bs, "batch": b, "context_len": c}
                                 for bs in dec["block_sizes"] for b in dec["batches"] for c in dec["contexts"]]
    out += [{"kind": "prefill", "block_size": bs, "batch": 1, "query_len": q, "context_len": p + q}
            for bs in pre["block_sizes"] for q in pre["query_lens"] for p in pre["cached_lens"]]
    return out


def kv_bytes(batch: int, context: int, elem: int = 2) -> int:
    return 2 * batch * context * KV_HEADS * HEAD_DIM * elem  # K and V


def prefill_flops(query_len: int, context_len: int) -> float:
    """QK^T and PV of a causal chunk after context_len - query_len cached tokens (2 FLOPs a MAC)."""
    return 4 * query_len * (context_len - query_len + (query_len + 1) / 2) * HEADS * HEAD_DIM


def measure_point(point: dict[str, Any], timer, device: str, pool_bytes: int) -> dict[str, Any]:
    """Time the paged kernel and contiguous SDPA on one point's shapes; seconds and rates."""
    import torch
    import triton

    from kernels.paged_attention import paged_attention_decode, paged_attention_prefill

    dtype, bs = torch.bfloat16, point["block_size"]
    batch, ctx = point["batch"], point["context_len"]
    per_seq = triton.cdiv(ctx, bs)
    pool_blocks = max(batch * per_seq, pool_bytes // kv_bytes(1, bs))
    k = torch.randn(pool_blocks, bs, KV_HEADS, HEAD_DIM, device=device, dtype=dtype)
    v = torch.randn_like(k)
    tables = torch.randperm(pool_blocks, device=device)[: batch * per_seq].to(torch.int32).reshape(batch, per_seq)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)

    def contiguous(cache):  # [batch, kv_heads, ctx, dim]
        dense = cache[tables.long()].reshape(batch, per_seq * bs, KV_HEADS, HEAD_DIM)[:, :ctx]
        return dense.transpose(1, 2).contiguous()

    sdpa = partial(torch.nn.functional.scaled_dot_product_attention, enable_gqa=True)
    row = dict(point)
    if point["kind"] == "decode":
        q = torch.randn(batch, HEADS, HEAD_DIM, device=device, dtype=dtype)
        row["paged_s"] = timer(partial(paged_attention_decode, q, k, v, tables, lens, max_context=ctx))
        row["sdpa_s"] = timer(partial(sdpa, q[:, :, None, :], contiguous(k), contiguous(v)))
        row["bytes"] = kv_bytes(batch, ctx)
    else:
        from torch.nn.attention.bias import causal_lower_right

        qlen = point["query_len"]
        q = torch.randn(qlen, HEADS, HEAD_DIM, device=device, dtype=dtype)
        starts = torch.tensor([0, qlen], dtype=torch.int32, device=device)
        row["paged_s"] = timer(partial(paged_attention_prefill, q, k, v, tables, lens, starts, qlen))
        mask = causal_lower_right(qlen, ctx)  # query i sees keys <= ctx - qlen + i
        row["sdpa_s"] = timer(partial(sdpa, q.transpose(0, 1)[None], contiguous(k), contiguous(v), attn_mask=mask))
        row["flops"] = prefill_flops(qlen, ctx)
    return row


def markdown(result: dict[str, Any]) -> str:
    copy = result["copy_bytes_per_s"]
    lines = [f"Paged attention on {result['device']} (torch {result['torch']}, Triton {result['triton']}): "
             f"measured copy {copy / 1e12:.2f} TB/s, bf16 peak {BF16_PEAK_FLOPS / 1e12:.0f} TFLOP/s", "",
             "Decode: KV bytes read per second, as a fraction of the measured copy bandwidth", "",
             "| block | batch | context | paged TB/s | paged / copy | contiguous SDPA TB/s | SDPA / copy | "
             "paged / SDPA |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in (r for r in result["results"] if r["kind"] == "decode"):
        paged, ref = r["bytes"] / r["paged_s"], r["bytes"] / r["sdpa_s"]
        lines.append(f"| {r['block_size']} | {r['batch']} | {r['context_len']} | {paged / 1e12:.2f} | "
                     f"{paged / copy:.0%} | {ref / 1e12:.2f} | {ref / copy:.0%} | {paged / ref:.2f} |")
    lines += ["", "Prefill (batch 1): attention FLOP/s as a fraction of the bf16 dense peak", "",
              "| block | query | cached | paged TFLOP/s | paged / peak | contiguous SDPA TFLOP/s | SDPA / peak | "
              "paged / SDPA |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in (r for r in result["results"] if r["kind"] == "prefill"):
        paged, ref = r["flops"] / r["paged_s"], r["flops"] / r["sdpa_s"]
        lines.append(f"| {r['block_size']} | {r['query_len']} | {r['context_len'] - r['query_len']} | "
                     f"{paged / 1e12:.1f} | {paged / BF16_PEAK_FLOPS:.0%} | {ref / 1e12:.1f} | "
                     f"{ref / BF16_PEAK_FLOPS:.0%} | {paged / ref:.2f} |")
    return "\n".join(lines) + "\n"


def run(grid: list[dict[str, Any]], timer, device: str, pool_bytes: int, copy_bytes: int) -> dict[str, Any]:
    """Measure the copy bandwidth, then every point; the result `kernels.json` holds."""
    import torch
    import triton

    src = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    copy_bw = 2 * copy_bytes / timer(partial(dst.copy_, src))  # read + write
    del src, dst
    results = []
    for point in grid:
        results.append(measure_point(point, timer, device, pool_bytes))
        if device == "cuda":
            torch.cuda.empty_cache()
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
    return {"benchmark": "paged_attention", "device": name, "torch": torch.__version__, "triton": triton.__version__,
            "copy_bytes_per_s": copy_bw, "bf16_peak_flops": BF16_PEAK_FLOPS, "heads": HEADS, "kv_heads": KV_HEADS,
            "head_dim": HEAD_DIM, "dtype": "bfloat16", "results": results}


def check_outputs(folder: Path) -> None:
    """Exit 2 with one line unless `kernels.json` in `folder` is new or an earlier result of this bench, and
    `kernels.md` new or the tables of that earlier result (`--output-dir ~/notes` replaced a user's two files)."""
    from result_file import check_result_file, one_line

    from kvsim.model.errors import KvsimError

    check_result_file("bench_kernels.py", folder / "kernels.json", RESULT_KEYS)
    table, earlier = folder / "kernels.md", folder / "kernels.json"
    if not (table.exists() or table.is_symlink()):
        return
    with one_line("bench_kernels.py"):
        if not _tables_of(table, earlier):
            raise KvsimError(f"--output-dir={str(folder)!r}: kernels.md exists and is not the tables of the "
                             "kernels.json beside it; this bench only replaces its own results (choose a new folder)")


def _tables_of(table: Path, earlier: Path) -> bool:
    """Whether `table` is a plain file holding `markdown` of the result in `earlier` (read only up to the size
    `check_output_file` reads of a JSON result: a stranger's large file is not read whole)."""
    from kvsim.model.yaml_io import load_json
    from kvsim.results.output_checks import MAX_JSON_RESULT_BYTES

    if table.is_symlink() or not table.is_file() or not earlier.is_file():
        return False
    if table.stat().st_size > MAX_JSON_RESULT_BYTES:
        return False
    try:
        return table.read_text(encoding="utf-8", errors="replace") == markdown(
            load_json(earlier.read_text(encoding="utf-8")))  # json.loads: text nested too deeply was a RecursionError
    except (ValueError, KeyError, TypeError, ZeroDivisionError):  # an earlier result of our keys, not our values
        return False


def write_outputs(folder: Path, result: dict[str, Any]) -> str:
    """Check both files again (they may have changed while the bench ran), write `kernels.json` and then
    `kernels.md`, each replaced in one rename and with the permissions the umask gives a new file (mkstemp's
    are 0600: kernels.md was the owner's alone, beside a kernels.json anyone could read); returns the tables."""
    from result_file import write_result_file

    from kvsim.results.output_dir import current_umask

    check_outputs(folder)
    write_result_file("bench_kernels.py", folder / "kernels.json", RESULT_KEYS, result)
    table = markdown(result)
    fd, name = tempfile.mkstemp(prefix=".kernels.md.", dir=folder)
    try:
        os.chmod(name, 0o666 & ~current_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(table)
        os.replace(name, folder / "kernels.md")
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output-dir", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    check_outputs(args.output_dir)  # before it runs, not after
    try:
        import torch
        import triton
    except ImportError as error:
        sys.exit(f"bench_kernels: needs torch and triton ({error.name} missing)")
    if not torch.cuda.is_available():
        print("bench_kernels: needs a CUDA device", file=sys.stderr)
        sys.exit(2)

    def timer(fn):
        return triton.testing.do_bench(fn, return_mode="median") / 1e3

    result = run(points(args.quick), timer, "cuda", POOL_BYTES, 2**30)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    print(write_outputs(args.output_dir, result))


if __name__ == "__main__":
    main()
