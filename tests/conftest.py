"""Shared helpers: tiny worlds with hand-made requests and a constant-latency engine; the random seed.

Tests that draw random inputs (the kernel tests) seed from `KVSIM_TEST_SEED`. A run without it
draws a fresh seed (fresh inputs find more) and prints it in the header; set the variable to
replay a run. It is set here, before xdist starts its workers, so every worker sees the same seed.

Data: the validation subset the accuracy and validation tests need ships in the repository
(`VALIDATION_SET`); tests that read the team's `../shared` folder get it from the `shared` (or
`traces`) fixture, which skips them, with the reason, where it is absent. `KVSIM_SHARED=none`
puts `../shared` out of reach, as on a bare clone (`.ci/run` reruns those tests that way:
`-m shared`); `KVSIM_SHARED=PATH` reads it from elsewhere. No test builds a `../shared` path
of its own (tests/test_bare_clone.py checks).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import secrets
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kvsim.engine.loop import run_engine
from kvsim.kv import PagedAllocator, SegmentContent, SlabAllocator
from kvsim.latency.base import ConstantLatency
from kvsim.model.engine_config import make_engine
from kvsim.sched import SchedulerLimits, make_scheduler
from kvsim.workload.request import Request

REPO = Path(__file__).resolve().parents[1]
VALIDATION_SET = REPO / "benchmarks" / "validation_set"
SHARED_VARIABLE = "KVSIM_SHARED"
FULL_SIZE = os.environ.get("KVSIM_FULL_TESTS") == "1"


def sized(small, full):
    """The instance size of a `slow` test: `small` in `./dev test` (and CI), `full` with KVSIM_FULL_TESTS=1.

    Both sizes run the same assertions; the small one keeps the whole suite under five minutes
    on two cores, the full one (`KVSIM_FULL_TESTS=1 ./dev test -m slow`) is the original scale.
    """
    return full if FULL_SIZE else small


SEED_VARIABLE = "KVSIM_TEST_SEED"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "shared: reads ../shared; skips where it is absent or KVSIM_SHARED=none")
    seed = os.environ.setdefault(SEED_VARIABLE, str(secrets.randbelow(2**31)))
    if not seed.isdigit():
        raise pytest.UsageError(f"{SEED_VARIABLE} must be a non-negative integer, got {seed!r}")


def pytest_report_header(config: pytest.Config) -> list[str]:
    root = shared_root()
    return [f"random inputs: {SEED_VARIABLE}={run_seed()} (set it to replay this run)",
            f"../shared: {root if root else 'out of reach (tests that need it skip)'} ({SHARED_VARIABLE}=none hides it)"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that read ../shared (through the fixtures below) carry the `shared` mark; `slow` tests go
    first (see `pytest_xdist_make_scheduler`)."""
    for item in items:
        if {"shared", "traces"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.shared)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: else collection order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """The two xdist workers of `./dev test` take the next test whenever one is free, `slow` tests first
    (`pytest_collection_modifyitems`), so that the run ends on short tests rather than with one worker
    idle while the other finishes a long one; the tests of a module with a module-scoped fixture go to
    one worker together, so that the fixture is computed once, and so do the kernel tests (`KERNEL_TESTS`), so
    that one worker imports torch and triton (~1.6 CPU s), not both (tests/kernel_tests/conftest.py). (xdist's own `--dist loadgroup` does not
    group under pytest 9, whose node ids it can no longer suffix.) Another `--dist` is xdist's own.

    xdist queues the units by their number of tests (`--loadscope-reorder`, its default): those grouped
    modules go first, largest first, then the single tests, `slow` ones first. Measured (two full runs, CI=true,
    two workers, Dec 2026): the two workers ended 1.0 s and 2.6 s apart, within 2.1 s of half the summed
    test time; replaying those runs' durations, `--dist worksteal`, the queue without the reorder and an order
    by measured duration end within 2 s of this order (the reorder-less queue 9 s later once), so there is no
    idle tail to cut."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneTestOrOneModule(LoadScopeScheduling):
        # xdist's own schedulers (`--dist loadfile`, `loadgroup`) are LoadScopeScheduling with this one method
        # overridden; were it renamed, the default (a module or class per unit) would schedule instead
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_unit(nodeid)

    return OneTestOrOneModule(config, log)


KERNEL_TESTS = "tests/kernel_tests/"
"""The folder whose tests one xdist worker runs together (`pytest_xdist_make_scheduler`)."""


def scheduling_unit(nodeid: str) -> str:
    """The unit of tests an xdist worker takes as one (`pytest_xdist_make_scheduler`): the kernel tests' folder,
    a module with a module-scoped fixture, or else the test itself."""
    path = nodeid.split("::")[0]
    if path.startswith(KERNEL_TESTS):
        return KERNEL_TESTS
    return path if _has_module_fixture(path) else nodeid


@functools.cache
def _has_module_fixture(path: str) -> bool:
    """Whether the test module at `path` (relative to the rootdir) declares a module-scoped fixture."""
    source = REPO / path
    return source.is_file() and re.search(r"scope=[\"']module[\"']", source.read_text(encoding="utf-8")) is not None


def shared_root() -> Path | None:
    """The team's shared data folder, or None where it is absent or `KVSIM_SHARED=none`."""
    value = os.environ.get(SHARED_VARIABLE, "")
    if value == "none":
        return None
    root = Path(value) if value else REPO.parent / "shared"
    return root if root.is_dir() else None


def run_seed() -> int:
    """The run's seed (see the module docstring)."""
    return int(os.environ[SEED_VARIABLE])


def make_request(rid: int, arrival_s: float, prompt: int, output: int, n: int = 1, prefix: int = 0) -> Request:
    segments = [("sys", prefix)] if prefix else []
    segments += [(("user", rid), prompt - prefix), (("reply", rid), output)]
    return Request(rid, arrival_s, prompt, output, content=SegmentContent(segments), num_samples=n)


def tiny_world(policy="v1", allocator="paged", num_blocks=11, block_size=16, max_num_seqs=8,
               max_num_batched_tokens=64, max_model_len=128, caching=True, preemption_mode=None,
               num_cpu_blocks=0, watermark_slots=0):
    if allocator == "paged":
        alloc = PagedAllocator(num_blocks, block_size, enable_caching=caching, num_cpu_blocks=num_cpu_blocks,
                               bytes_per_block=1000)
    else:
        alloc = SlabAllocator((num_blocks - 1) * block_size, max_model_len, allocator.removeprefix("slab-"),
                              num_cpu_slots=num_cpu_blocks * block_size, bytes_per_token=1000 // block_size)
    can_swap = make_engine(scheduler=policy, preemption_mode=preemption_mode).can_swap
    limits = SchedulerLimits(max_num_seqs, max_num_batched_tokens, max_model_len, watermark_slots, preemption_mode,
                             can_swap)
    return make_scheduler(policy, alloc, limits)


def plan_steps(sched, arrivals, num_steps):
    """Plan and complete `num_steps` steps one second apart, the requests of `arrivals[k]` added before plan k; each
    plan's (scheduled (id, tokens), preempted ids, block tables by request id, free queue)."""
    alloc, seen = sched.alloc, []
    for k in range(num_steps):
        for req in arrivals.get(k, []):
            assert sched.add(req)
        plan = sched.schedule(float(k))
        tables = {seq_id // 256: list(seq.block_table) for seq_id, seq in alloc.seqs.items()}
        seen.append(([(r.request_id, n) for r, n in plan.scheduled], [r.request_id for r in plan.preempted],
                     tables, alloc.pool.free_queue))
        sched.complete(plan, k + 1.0)
        sched.check_invariants()
    return seen


def run(scheduler, requests, step_s=0.01, link=float("inf"), bursts=True):
    return run_engine(scheduler, ConstantLatency(step_s, link), requests, check=True, bursts=bursts)


@pytest.fixture
def shared() -> Path:
    """`../shared`; the test skips where it is absent (a bare clone) or hidden (`KVSIM_SHARED=none`)."""
    root = shared_root()
    if root is None:
        pytest.skip(f"needs ../shared (absent, or {SHARED_VARIABLE}=none)")
    return root


@pytest.fixture
def traces(shared: Path) -> Path:
    if not (shared / "traces").is_dir():
        pytest.skip("../shared/traces not present")
    return shared / "traces"


def one_line_exit_2(argv: list[str]) -> str:
    """Run the CLI on `argv` and return its one error line less the `kvsim: error: ` prefix, asserting
    exit 2 and nothing else on stderr (the project's rule for bad input)."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, argv, prog_name="kvsim")
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), result.stderr
    return lines[0].removeprefix("kvsim: error: ")


def benchmark_script(name: str) -> ModuleType:
    """Import `benchmarks/NAME.py` as a module, fresh, as `python benchmarks/NAME.py` would load it: its folder on
    `sys.path` while it loads, so its imports of sibling scripts (`result_file`, `bench_simulator`) resolve, and the
    module in `sys.modules` under NAME (dataclasses look their module up there)."""
    folder = str(REPO / "benchmarks")
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    script = sys.modules[name] = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(script)
    finally:
        sys.path.remove(folder)
    return script
