"""Compile every kernel ahead of time for a GPU target, without a GPU: `python -m kernels.compile_check`.

The interpreter tests check the arithmetic; this checks that Triton's real compiler accepts every
kernel for every KV dtype (fp8 included) on sm_90 (H100/H200), so a GPU session does not open
with a compile error, and reports what each compiled kernel uses: registers and the stack frame,
where spilled registers go (`cuobjdump --dump-resource-usage` on the cubin; Triton's own
`n_spills` needs a GPU to load the kernel). Decode and prefill are also compiled at the largest
block size with head_dim 128, where whole-block tiles once spilled. Must run without
TRITON_INTERPRET. Exit 0 and one line per kernel on success; exit 3 when this Triton cannot
compile ahead of time (no AOT API or no ptxas).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import triton

POINTERS = {"out_ptr": "*fp16", "part_out_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32",
            "q_ptr": "*fp16", "key_ptr": "*fp16", "value_ptr": "*fp16", "block_tables_ptr": "*i32",
            "context_lens_ptr": "*i32", "query_start_ptr": "*i32", "slot_mapping_ptr": "*i64",
            "scale": "fp32", "k_scale": "fp32", "v_scale": "fp32"}
KV_TYPES = ("*fp16", "*bf16", "*fp8e4nv")


def cases(pa: Any) -> list[tuple[Any, str, dict[str, Any]]]:
    """(kernel, KV pointer type, constexprs and options): every kernel at block size 16, decode and prefill
    also at 128, with the warps the wrappers launch."""
    out = []
    for kv in KV_TYPES:
        fp8 = kv == "*fp8e4nv"
        block_sizes = (16, 128) if kv != "*bf16" else (16,)
        for bs in block_sizes:
            out += [(pa._decode_kernel, kv, {"QUERY_GROUP": 4, "GROUP_PAD": 16, "HEAD_DIM": 128, "BLOCK_SIZE": bs,
                                             "TILE": min(bs, pa.DECODE_TILE), "NUM_SPLITS": splits, "IS_FP8": fp8,
                                             "DOT_FP32": False}) for splits in ((1, 4) if bs == 16 else (1,))]
            out.append((pa._prefill_kernel, kv, {"QUERY_GROUP": 4, "HEAD_DIM": 128, "BLOCK_SIZE": bs,
                                                 "TILE": min(bs, pa.PREFILL_TILE), "BLOCK_M": 16, "IS_FP8": fp8,
                                                 "DOT_FP32": False,
                                                 "num_warps": pa.prefill_num_warps(min(bs, pa.PREFILL_TILE), fp8)}))
        out += [
            # an fp8 cache is written through a uint8 view (see write_kv_cache)
            (pa._write_kv_kernel, "*u8" if fp8 else kv, {"HEAD_DIM": 128, "BLOCK_SIZE": 16, "HEADS_PAD": 8,
                                                         "IS_FP8": fp8}),
            (pa._reduce_splits_kernel, kv, {"HEAD_DIM": 128, "NUM_SPLITS": 4, "SPLITS_PAD": 4}),
        ]
    return out


def resource_usage(cubin: bytes) -> str:
    """'N registers, S bytes of stack' from cuobjdump (shipped inside Triton's wheel), or why not."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return "resource usage n/a (no cuobjdump in this Triton)"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        report = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", report)
    return f"{found[1]} registers, {found[2]} bytes of stack" if found else "resource usage n/a"


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
    for fn, kv, constexprs in cases(pa):
        options = {"num_warps": constexprs.pop("num_warps", 4)}
        types = {**POINTERS, "k_cache_ptr": kv, "v_cache_ptr": kv}
        signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in fn.arg_names}
        try:
            compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=target,
                                      options=options)
        except (RuntimeError, FileNotFoundError) as error:
            if "ptxas" in str(error):
                print(f"compile_check: no ptxas ({error})", file=sys.stderr)
                return 3
            raise
        shape = (f"bs={constexprs.get('BLOCK_SIZE', '-')} tile={constexprs.get('TILE', '-')} "
                 f"warps={options['num_warps']}")
        print(f"{fn.__name__} {kv} {shape} sm_{capability}: {len(compiled.asm['ptx'])} bytes of PTX, "
              f"{resource_usage(compiled.asm['cubin'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
