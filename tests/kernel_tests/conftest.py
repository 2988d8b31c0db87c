"""Kernel tests run on the CPU under Triton's interpreter unless a CUDA device is there.

Every test seeds torch with the run's seed (printed in pytest's header, `KVSIM_TEST_SEED` to
replay; see tests/conftest.py) plus a hash of its own id, so a test run alone draws the same
inputs as in the full run, and a failure names the seed that reproduces it.

torch and triton are imported when the first kernel test runs (`kernel_libraries`), not when pytest collects
this folder: both xdist workers collect every test, and the import costs ~1.6 CPU s, which the worker that runs
none of these tests (tests/conftest.py gives them all to one) no longer pays. Without torch or triton every test
here skips, as the folder did when this module imported them.
"""

import functools
import os
import zlib

import pytest

from tests.conftest import SEED_VARIABLE, run_seed


@pytest.fixture(scope="session")
def kernel_libraries():
    """(torch, triton), Triton's interpreter chosen first where no CUDA device is (triton reads
    TRITON_INTERPRET as it loads); a missing one skips the test."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    return torch, pytest.importorskip("triton")


@functools.cache
def interpreter_problem() -> str | None:
    """Why this Triton's CPU interpreter cannot run the kernels here, or None.

    Triton 3.6's interpreter turns a loop bound loaded from memory into an int with `int()` of a
    one-element array, which NumPy 2.4 refuses (3.8 squeezes it first); every kernel loops so.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return None
    import numpy
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def loop_over_a_loaded_bound(n_ptr, out_ptr):
        total = 0
        for _ in range(0, tl.load(n_ptr)):
            total += 1
        tl.store(out_ptr, total)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        loop_over_a_loaded_bound[(1,)](torch.full((1,), 3, dtype=torch.int32), out)
    except Exception as error:  # the interpreter's own failure, whatever its type
        return (f"Triton {triton.__version__}'s CPU interpreter fails with NumPy {numpy.__version__} "
                f"({type(error).__name__}: {str(error)[:120]}); use numpy<2.4, a newer Triton, or a GPU")
    return None if out.item() == 3 else f"Triton {triton.__version__}'s interpreter miscounts a loop"


@pytest.fixture(autouse=True)
def seeded(request: pytest.FixtureRequest, kernel_libraries) -> int:
    torch, _ = kernel_libraries
    problem = getattr(request.module, "RUNS_KERNELS", True) and interpreter_problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    seed = (run_seed() + zlib.crc32(request.node.nodeid.encode())) % 2**31
    torch.manual_seed(seed)
    request.node.user_properties.append((SEED_VARIABLE, run_seed()))
    return seed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed:
        report.sections.append(("random inputs", f"replay with {SEED_VARIABLE}={run_seed()}"))
    return report
