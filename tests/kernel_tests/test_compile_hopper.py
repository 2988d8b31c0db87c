"""The kernels compile for sm_90 (H100/H200) ahead of time, without spilling: see kernels/compile_check.py."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNS_KERNELS = False  # compiles only: the CPU interpreter's limits do not apply (conftest.py)


def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "kernels.compile_check"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    if result.returncode == 3:
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    # 4 kernels (decode twice: one split and four) x 3 KV dtypes, plus decode and prefill at block size 128
    # for fp16 and fp8
    assert len(lines) == 5 * 3 + 2 * 2
    stacks = [int(m[1]) for line in lines if (m := re.search(r"(\d+) bytes of stack", line))]
    if stacks:  # cuobjdump ships in Triton's wheel; a stack frame here means spilled registers
        assert len(stacks) == len(lines)
        assert stacks == [0] * len(lines), "\n".join(line for line in lines if not line.endswith(" 0 bytes of stack"))
