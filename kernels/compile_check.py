"""Compile every kernel ahead of time for a GPU target, without a GPU: `python -m kernels.compile_check`.

The interpreter tests check the arithmetic; this checks that Triton's real compiler accepts every
kernel for every KV dtype (fp8 included) on sm_90 (H100/H200), so a GPU session does not open
with a compile error, and reports per kernel, one line each:

    _decode_kernel *fp16 d=128 bs=16 tile=32 m=- split=False warps=4 sm_90: 100811 bytes of PTX,
        168 registers, 0 bytes of stack, 3 async copies

registers and the stack frame, where spilled registers go (`cuobjdump --dump-resource-usage`
on the cubin, shipped in Triton's wheel; Triton's own `n_spills` needs a GPU to load the
kernel), and the `cp.async` instructions in the PTX, which the software-pipelined loops of
decode and prefill issue (none means the loads stayed synchronous). Decode and prefill compile
at the smallest and largest block size and with a padded head_dim, with the constexprs and
warps the wrappers launch (their `*_meta`). Must run without TRITON_INTERPRET. Exit 0 on
success; exit 3 when this Triton cannot compile ahead of time (no AOT API or no ptxas).
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


def cases() -> list[tuple[Any, str, dict[str, Any]]]:
    """(kernel, KV pointer type, constexprs and launch options): the wrappers' own `*_meta`, Llama's
    head shape (head_dim 128, 4 query heads per KV head) at the smallest and largest block size for
    every KV dtype, head_dim 80 (padded to 128) for fp16, one and several decode splits."""
    from kernels import cache_write, decode, prefill

    out: list[tuple[Any, str, dict[str, Any]]] = []
    for kv in KV_TYPES:
        fp8 = kv == "*fp8e4nv"
        shapes = [(128, 16), (128, 128)] + {"*fp16": [(80, 32)], "*fp8e4nv": [(96, 64)]}.get(kv, [])
        for head_dim, bs in shapes:
            out += [(decode._decode_kernel, kv, decode.decode_meta(4, head_dim, bs, fp8, split))
                    for split in (False, True)]
            out.append((prefill._prefill_kernel, kv, prefill.prefill_meta(4, head_dim, bs, fp8)))
        # an fp8 cache is written through a uint8 view (see write_kv_cache)
        out.append((cache_write._write_kv_kernel, "*u8" if fp8 else kv, cache_write.write_meta(8, 128, 16, fp8)))
        out.append((decode._reduce_splits_kernel, kv, {"HEAD_DIM": 128, "HEAD_DIM_PAD": 128, "TILE": decode.DECODE_TILE,
                                                       "SPLITS_PAD": 4}))
    return out


SHAPE_FIELDS = (("d", "HEAD_DIM"), ("bs", "BLOCK_SIZE"), ("tile", "TILE"), ("m", "BLOCK_M"), ("split", "SPLIT"))


def async_copies(asm: dict[str, Any]) -> int:
    """Asynchronous global-to-shared copy instructions in the PTX (`cp.async`, including TMA's
    `cp.async.bulk`): what a software-pipelined loop issues on sm_80+; 0 when loads stayed synchronous."""
    return len(re.findall(r"^\s*(?:@%p\d+\s+)?cp\.async\.(?!wait|commit)", asm["ptx"], re.MULTILINE))


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
    target = GPUTarget("cuda", capability, 32)
    for fn, kv, constexprs in cases():
        options = {"num_warps": constexprs.pop("num_warps", 4)}
        types = {**POINTERS, "k_cache_ptr": kv, "v_cache_ptr": kv}
        signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in fn.arg_names}
        try:
            source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        except TypeError as error:  # before Triton 3.2 ASTSource took `constants`, keyed by index
            print(f"compile_check: Triton {triton.__version__}'s ASTSource differs ({error})", file=sys.stderr)
            return 3
        try:
            compiled = triton.compile(source, target=target, options=options)
        except (RuntimeError, FileNotFoundError) as error:
            if "ptxas" in str(error):
                print(f"compile_check: no ptxas ({error})", file=sys.stderr)
                return 3
            raise
        shape = " ".join(f"{key}={constexprs.get(name, '-')}" for key, name in SHAPE_FIELDS)
        print(f"{fn.__name__} {kv} {shape} warps={options['num_warps']} sm_{capability}: "
              f"{len(compiled.asm['ptx'])} bytes of PTX, {resource_usage(compiled.asm['cubin'])}, "
              f"{async_copies(compiled.asm)} async copies", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
