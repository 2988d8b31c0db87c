"""The kernels compile for sm_90 (H100/H200) ahead of time: no spills, pipelined loads, registers the
split heuristic assumes. See kernels/compile_check.py for the report's format."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNS_KERNELS = False  # compiles only: the CPU interpreter's limits do not apply (conftest.py)
LINE = re.compile(r"^(?P<kernel>_\w+_kernel) (?P<kv>\S+) .*warps=(?P<warps>\d+) sm_90: \d+ bytes of PTX, "
                  r"(?:(?P<registers>\d+) registers, (?P<stack>\d+) bytes of stack|resource usage n/a[^,]*), "
                  r"(?P<async>\d+) async copies$")


@pytest.fixture(scope="module")
def report() -> list[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "kernels.compile_check"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    if result.returncode == 3:
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), "\n".join(line for line, m in zip(lines, parsed, strict=True) if not m)
    return [m.groupdict() for m in parsed if m]


def test_every_kernel_compiles_for_sm90(report):
    # per KV dtype: decode (one split and several) and prefill at head_dim 128 with block sizes 16 and 128,
    # plus a padded head_dim for fp16 (80) and fp8 (96); the cache write and the split reduction
    assert len(report) == (3 * 3 + 2) + (2 * 3 + 2) + (3 * 3 + 2)
    assert {r["kv"] for r in report} == {"*fp16", "*bf16", "*fp8e4nv", "*u8"}


def test_no_kernel_spills_registers(report):
    if any(r["stack"] is None for r in report):
        pytest.skip("this Triton ships no cuobjdump: registers and stack unknown")
    spilled = [r for r in report if int(r["stack"]) > 0]
    assert not spilled, spilled


def test_decode_stays_in_the_register_budget_the_split_count_assumes(report):
    from kernels.decode import DECODE_REGISTERS

    decode = [r for r in report if r["kernel"] == "_decode_kernel"]
    if any(r["registers"] is None for r in decode):
        pytest.skip("this Triton ships no cuobjdump: registers unknown")
    over = [r for r in decode if int(r["registers"]) > DECODE_REGISTERS[int(r["warps"])]]
    assert not over, over


def test_attention_loops_are_pipelined_with_async_copies(report):
    attention = [r for r in report if r["kernel"] in ("_decode_kernel", "_prefill_kernel")]
    assert attention and all(int(r["async"]) > 0 for r in attention), [r for r in attention if r["async"] == "0"]
