"""Decode paged-attention bandwidth on a GPU: achieved bytes/s vs device copy and vs torch SDPA.

    python benchmarks/bench_kernels.py [--quick] [--output-dir benchmarks/results]

For each batch × context × block size (Llama-3.1-8B's head shape: 32 query heads, 8 KV heads,
head_dim 128, bf16 KV), times `paged_attention_decode` with block tables drawn at random from
a pool far larger than L2, and `torch.nn.functional.scaled_dot_product_attention` on the same
KV gathered contiguous (the gather is not timed). Achieved bandwidth = KV bytes read / time,
compared with a device-to-device copy measured in the same run. Writes `kernels.json` and
`kernels.md`. Needs a CUDA device; exits 2 with a message otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output-dir", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    try:
        import torch
        import triton
    except ImportError as error:
        sys.exit(f"bench_kernels: needs torch and triton ({error.name} missing)")
    if not torch.cuda.is_available():
        print("bench_kernels: needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels.paged_attention import paged_attention_decode

    bench = triton.testing.do_bench
    dev, dtype = "cuda", torch.bfloat16
    src = torch.empty(2**30 // 2, dtype=dtype, device=dev)
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() * 2 / (bench(partial(dst.copy_, src), return_mode="median") / 1e3)
    del src, dst
    batches = (1, 32, 128) if args.quick else (1, 8, 32, 64, 128, 256)
    contexts = (4096,) if args.quick else (1024, 4096, 16384)
    block_sizes = (16,) if args.quick else (16, 32, 128)
    results = []
    for bs in block_sizes:
        for batch in batches:
            for ctx in contexts:
                per_seq = triton.cdiv(ctx, bs)
                pool_blocks = max(batch * per_seq, 4 * 2**30 // (bs * KV_HEADS * HEAD_DIM * 2 * 2))
                k = torch.randn(pool_blocks, bs, KV_HEADS, HEAD_DIM, device=dev, dtype=dtype)
                v = torch.randn_like(k)
                tables = torch.randperm(pool_blocks, device=dev)[: batch * per_seq].to(torch.int32)
                tables = tables.reshape(batch, per_seq)
                lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
                q = torch.randn(batch, HEADS, HEAD_DIM, device=dev, dtype=dtype)
                t_paged = bench(partial(paged_attention_decode, q, k, v, tables, lens, max_context=ctx),
                                return_mode="median") / 1e3
                kc = k[tables.long()].reshape(batch, per_seq * bs, KV_HEADS, HEAD_DIM)[:, :ctx].transpose(1, 2)
                vc = v[tables.long()].reshape(batch, per_seq * bs, KV_HEADS, HEAD_DIM)[:, :ctx].transpose(1, 2)
                kc, vc = kc.contiguous(), vc.contiguous()
                qs = q[:, :, None, :]
                t_sdpa = bench(partial(torch.nn.functional.scaled_dot_product_attention, qs, kc, vc, enable_gqa=True),
                               return_mode="median") / 1e3
                kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * 2
                results.append({
                    "block_size": bs, "batch": batch, "context_len": ctx, "kv_bytes": kv_bytes,
                    "paged_s": t_paged, "sdpa_s": t_sdpa, "paged_bytes_per_s": kv_bytes / t_paged,
                    "sdpa_bytes_per_s": kv_bytes / t_sdpa, "paged_fraction_of_copy": kv_bytes / t_paged / copy_bw,
                })
                del k, v, kc, vc
                torch.cuda.empty_cache()
    out = {"benchmark": "paged_attention_decode", "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__, "copy_bytes_per_s": copy_bw,
           "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "dtype": "bfloat16", "results": results}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "kernels.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"Decode paged attention on {out['device']} (copy {copy_bw / 1e12:.2f} TB/s)", "",
             "| block | batch | context | paged TB/s | % of copy | SDPA (contiguous) TB/s |",
             "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['block_size']} | {r['batch']} | {r['context_len']} | {r['paged_bytes_per_s'] / 1e12:.2f} | "
              f"{100 * r['paged_fraction_of_copy']:.0f} % | {r['sdpa_bytes_per_s'] / 1e12:.2f} |" for r in results]
    (args.output_dir / "kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
