"""Compile every kernel ahead of time for a GPU target, without a GPU: `python -m kernels.compile_check`.

The interpreter tests check the arithmetic; this checks that Triton's real compiler accepts every
kernel for every KV dtype (fp8 included) on sm_90 (H100/H200), so a GPU session does not open
with a compile error. Must run without TRITON_INTERPRET. Exit 0 and one line per kernel on
success; exit 3 when this Triton cannot compile ahead of time (no AOT API or no ptxas).
"""

from __future__ import annotations

import os
import sys

import triton

POINTERS = {"out_ptr": "*fp16", "part_out_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32",
            "q_ptr": "*fp16", "key_ptr": "*fp16", "value_ptr": "*fp16", "block_tables_ptr": "*i32",
            "context_lens_ptr": "*i32", "query_start_ptr": "*i32", "slot_mapping_ptr": "*i64",
            "scale": "fp32", "k_scale": "fp32", "v_scale": "fp32"}


def main(capability: int = 90) -> int:
    assert os.environ.get("TRITON_INTERPRET") != "1", "run without TRITON_INTERPRET"
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        print("compile_check: this Triton has no ahead-of-time compile API", file=sys.stderr)
        return 3
    from kernels import paged_attention as pa

    target = GPUTarget("cuda", capability, 32)
    for kv in ("*fp16", "*bf16", "*fp8e4nv"):
        fp8 = kv == "*fp8e4nv"
        cases = [(pa._decode_kernel, {"QUERY_GROUP": 4, "GROUP_PAD": 16, "HEAD_DIM": 128, "BLOCK_SIZE": 16,
                                      "NUM_SPLITS": splits, "IS_FP8": fp8, "DOT_FP32": False}) for splits in (1, 4)]
        cases += [
            (pa._prefill_kernel, {"QUERY_GROUP": 4, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "BLOCK_M": 16, "IS_FP8": fp8,
                                  "DOT_FP32": False}),
            (pa._write_kv_kernel, {"HEAD_DIM": 128, "BLOCK_SIZE": 16, "HEADS_PAD": 8, "IS_FP8": fp8}),
            (pa._reduce_splits_kernel, {"HEAD_DIM": 128, "NUM_SPLITS": 4, "SPLITS_PAD": 4}),
        ]
        for fn, constexprs in cases:
            types = {**POINTERS, "k_cache_ptr": kv, "v_cache_ptr": kv}
            signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in fn.arg_names}
            try:
                compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=target)
            except (RuntimeError, FileNotFoundError) as error:
                if "ptxas" in str(error):
                    print(f"compile_check: no ptxas ({error})", file=sys.stderr)
                    return 3
                raise
            print(f"{fn.__name__} {kv} sm_{capability}: {len(compiled.asm['ptx'])} bytes of PTX")
    return 0


if __name__ == "__main__":
    sys.exit(main())
