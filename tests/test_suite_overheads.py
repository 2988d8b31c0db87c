"""The suite's own costs: what collecting the kernel tests imports, and which tests one xdist worker runs together."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import KERNEL_TESTS, scheduling_unit

REPO = Path(__file__).resolve().parents[1]


def test_collecting_the_kernel_tests_imports_no_torch():
    """Both xdist workers import every test module to collect it; the kernel tests' modules import torch, triton
    and the kernels only in their tests (tests/kernel_tests/conftest.py), ~1.6 CPU s a worker."""
    modules = sorted(p.relative_to(REPO).with_suffix("").as_posix().replace("/", ".")
                     for p in (REPO / KERNEL_TESTS).glob("*.py"))
    code = (f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'kernels'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tests.kernel_tests.test_paged_attention" in modules
    assert json.loads(done.stdout) == ["kernels", "kernels.grid"]  # the grids: the standard library only


def test_one_worker_runs_every_kernel_test_and_other_tests_go_one_by_one():
    kernel_ids = ["tests/kernel_tests/test_paged_attention.py::test_decode_matches_reference[splits1-float16-16]",
                  "tests/kernel_tests/test_calibrate_cli.py::test_calibrate_without_gpu_is_one_line_error"]
    assert {scheduling_unit(nodeid) for nodeid in kernel_ids} == {KERNEL_TESTS}
    single = "tests/test_clock.py::test_something"
    assert scheduling_unit(single) == single
