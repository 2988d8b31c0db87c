"""How much memory a run will need, checked before anything is allocated.

A run holds its per-request records, the KV allocator's per-block bookkeeping (GPU pool and CPU
swap pool, the latter built only where a preemption can swap: `capacity.swap_bytes`) and, when it
keeps every step in memory, its per-step rows. The estimate is a floor, built from costs measured
with tracemalloc on CPython 3.11 and a lower bound on the steps (every step decodes at most
`max_num_seqs` sequences, so a run takes at least total output tokens / `max_num_seqs` steps). A
run whose floor exceeds the limit cannot succeed, so it is refused with both numbers instead of
ending in MemoryError (or the kernel's OOM killer) after allocating.

Memory per request is small and columnar: `Request` objects exist only while in flight
(`kvsim.workload.generate.iter_requests` builds them at arrival, `kvsim.results.records` keeps a row of
numbers when they end), so a request costs its row of records, its drawn lengths and its
row in the final requests table (measured: about 190 bytes a request at 2k–20k requests).
Steps cost nothing that grows with the run when they stream to disk (`kvsim run`,
`kvsim.fleet.run.simulate_scenario(out_dir=...)`) or are sampled or dropped (`steps: sampled | none`:
at most 100,000 rows); an in-memory `steps: all` run keeps 20 columns of 8 bytes a step.

A fleet or data-parallel group (`check_engines_memory`) holds its requests once and, per
engine, its blocks and a fixed cost (scheduler, latency model, recorder: measured ≈ 108 KB apart
from the blocks), so 4,096 replicas are refused up front, not after minutes of building them.

The limit defaults to the machine's physical memory (or the cgroup's, if smaller);
`kvsim run --memory-limit` or `simulate(..., memory_limit_bytes=...)` overrides it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.model.capacity import kv_bytes_per_block, num_gpu_blocks, swap_bytes
from kvsim.model.config import load_gpu, load_model
from kvsim.model.errors import KvsimError, expect_count

if TYPE_CHECKING:
    from kvsim.model.config import GPUSpec
    from kvsim.model.engine_config import EngineConfig
    from kvsim.model.spec import ModelSpec
    from kvsim.workload.draws import LengthDist
    from kvsim.workload.scenario import Scenario

# Measured fits (tracemalloc, CPython 3.11; see the module docstring), floors not exact costs.
REQUEST_BYTES = 160   # a request's columnar record, drawn lengths and requests-table row (measured ≈ 190)
# A paged block as its pool builds it (`BlockPool`, `HashChainCache`, `PagedAllocator`): ref count, hash slot and
# free-queue entry, 3 list slots of 8 B, a GPU block's fill count a fourth, plus the free entry's int of 28 B
# (CPython's int below 2**30) for ids past 256 (0-256 are CPython's shared small ints): `blocks_floor_bytes`, a floor
# from the objects' sizes. tracemalloc measured 53.4 B a GPU block at 600 blocks, 60.9 at 2,048 and 63.8 at 27,816
# (the floor: 48.0, 56.5, 59.7) and 55 a CPU block; a flat 40 B a block said a fleet of 4,096 default replicas
# needs at least 4.6 GiB where it held 7.4 GB (6.7 GiB now). Slab pools keep extents per sequence, nothing per block.
LIST_SLOT_BYTES = 8
INT_BYTES = 28
NUM_SMALL_INTS = 257  # ids 0..256: CPython's cached ints, no object of their own
STEP_BYTES = 160      # one step row kept in memory: 20 columns of 8 bytes (0 when steps stream to disk)
ENGINE_BYTES = 100_000  # one engine of a fleet apart from its blocks (measured ≈ 108 KB)
GIB = 2**30
MIB = 2**20
KIB = 2**10


def machine_memory_bytes() -> int:
    """Physical memory, or the cgroup v2 limit when one is set and smaller."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text(encoding="utf-8").strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def blocks_floor_bytes(num_blocks: int, gpu: bool = True) -> int:
    """The least memory a paged pool of `num_blocks` holds for its per-block bookkeeping (see `LIST_SLOT_BYTES`):
    a list slot per block for each of 3 lists (4 for a GPU pool, whose blocks count their tokens) and an int object
    per block id past CPython's small ints."""
    return num_blocks * (4 if gpu else 3) * LIST_SLOT_BYTES + max(0, num_blocks - NUM_SMALL_INTS) * INT_BYTES


def _mean_length(dist: LengthDist | None) -> float:
    """The distribution's mean where it is known without reading data; 1 otherwise (a floor)."""
    if dist is None:
        return 1.0
    if dist.dist == "fixed":
        return float(dist.value)
    if dist.dist == "uniform":
        return (dist.low + dist.high) / 2
    if dist.dist == "lognormal":
        return float(dist.mean)
    return 1.0


def _num_requests(scenario: Scenario) -> int:
    """Requests the run will build: `num_requests`, or fewer when a trace file cannot hold that many
    (a record takes at least 8 bytes of the file)."""
    w = scenario.workload
    if w.trace is None or w.trace.format == "servegen" or w.trace.path.startswith("builtin:"):
        return w.num_requests
    path = Path(scenario.base_dir) / w.trace.path
    if path.is_file() and w.trace.format != "lengths":
        return min(w.num_requests, path.stat().st_size // 8 + 1)
    return w.num_requests


def estimate_run_bytes(scenario: Scenario, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig,
                       num_gpu_blocks: int, bytes_per_block: int, steps_in_memory: bool = True) -> dict[str, int]:
    """The floor of a run's memory, by part: `requests`, `kv_blocks`, `steps` (bytes). `kv_blocks` counts a paged
    pool's GPU blocks and its CPU swap blocks (`capacity.swap_bytes`) at `blocks_floor_bytes`; a slab pool's is 0.

    `steps_in_memory`: the run keeps every step row in memory (`steps: all` without streaming
    to disk); otherwise the steps part is 0 (bounded: one chunk, or the sample).
    """
    w = scenario.workload
    num_requests = _num_requests(scenario)
    num_seqs = num_requests * (w.beam_width or w.n)
    paged = engine.allocator == "paged"
    num_cpu_blocks = swap_bytes(engine) // max(1, bytes_per_block) if paged else 0
    min_steps = num_seqs * _mean_length(w.output_len) / engine.resolved_max_num_seqs(gpu)
    return {
        "requests": num_requests * REQUEST_BYTES,
        "kv_blocks": blocks_floor_bytes(num_gpu_blocks) + blocks_floor_bytes(num_cpu_blocks, gpu=False) if paged else 0,
        "steps": int(min_steps * STEP_BYTES) if steps_in_memory else 0,
    }


def check_run_memory(scenario: Scenario, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig,
                     num_gpu_blocks: int, bytes_per_block: int, limit_bytes: int | None = None,
                     steps_in_memory: bool = True) -> None:
    """Raise `KvsimError` with the estimate and the limit when the run cannot fit in memory."""
    parts = estimate_run_bytes(scenario, model, gpu, engine, num_gpu_blocks, bytes_per_block, steps_in_memory)
    _refuse_over_limit(parts, limit_bytes, "run", {
        "requests": f"workload.num_requests={scenario.workload.num_requests}",
        "steps": f"workload.num_requests={scenario.workload.num_requests}",
        "kv_blocks": f"num_gpu_blocks={num_gpu_blocks}" + (f", engine.swap_space={engine.swap_space}"
                                                           if engine.can_swap else "")})


def check_engines_memory(scenario: Scenario, engines: list[tuple[Scenario, int]], limit_bytes: int | None = None,
                         steps_in_memory: bool = True, size_field: str | None = None) -> None:
    """Raise `KvsimError` when `scenario`'s fleet or data-parallel group cannot fit: `engines` gives
    (single-engine scenario, number of such engines) per group. Its requests count once; every
    engine its blocks and fixed cost; the steps' floor is still total output / `max_num_seqs` (the
    engines' rows together). Checked before any engine is built. `size_field` names the setting behind
    the engine count when it is not `replicas` or `engine.data_parallel_size` (an autoscaler's maximum)."""
    parts = estimate_engines_bytes(engines, steps_in_memory)
    fleet = scenario.replicas is not None
    if size_field is not None:
        size = size_field
    elif isinstance(scenario.replicas, list):  # groups: their counts, not their whole settings
        groups = [f"{g.count} x {g.name or g.kv_role or f'group {i}'}" for i, g in enumerate(scenario.replicas)]
        size = f"replicas=[{', '.join(groups)}]"
    else:
        size = f"replicas={scenario.replicas}" if fleet else \
            f"engine.data_parallel_size={scenario.engine.data_parallel_size}"
    _refuse_over_limit(parts, limit_bytes, "fleet" if fleet else "data-parallel group", {
        "requests": f"workload.num_requests={scenario.workload.num_requests}",
        "steps": f"workload.num_requests={scenario.workload.num_requests}", "kv_blocks": size, "engines": size})


def estimate_engines_bytes(engines: list[tuple[Scenario, int]], steps_in_memory: bool = True) -> dict[str, int]:
    """The floor of a fleet's or data-parallel group's memory, by part (`requests`, `kv_blocks`, `engines`,
    `steps`, bytes): `engines` gives (single-engine scenario, number of such engines) per group."""
    parts = {"requests": 0, "kv_blocks": 0, "engines": 0, "steps": 0}
    for spec, count in engines:
        model, gpu = load_model(spec.model), load_gpu(spec.gpu)
        one = estimate_run_bytes(spec, model, gpu, spec.engine, num_gpu_blocks(model, gpu, spec.engine),
                                 kv_bytes_per_block(model, spec.engine), steps_in_memory)
        parts["kv_blocks"] += count * one["kv_blocks"]
        parts["engines"] += count * ENGINE_BYTES
        parts["requests"], parts["steps"] = max(parts["requests"], one["requests"]), max(parts["steps"], one["steps"])
    return parts


def _refuse_over_limit(parts: dict[str, int], limit_bytes: int | None, what: str, fields: dict[str, str]) -> None:
    """The refusal both checks give: the field behind the largest part, every part, and the limit. A limit that is
    no whole number of bytes, 1 or more, is refused naming it (`simulate_scenario(memory_limit_bytes="8GiB")` was a
    TypeError, NaN ran without a limit, and -1 was refused as the run being too large for it)."""
    limit = machine_memory_bytes() if limit_bytes is None else expect_count(
        limit_bytes, "memory_limit_bytes", 1, "a whole number of bytes, 1 or more (None: the machine's memory)")
    needed = sum(parts.values())
    if needed > limit:
        unit, _ = size_unit(limit)
        detail = ", ".join(f"{k} {in_unit_of(v, limit)}" for k, v in parts.items())
        raise KvsimError(
            f"{fields[max(parts, key=parts.__getitem__)]}: this {what} needs at least {in_unit_of(needed, limit)} "
            f"{unit} of memory ({unit} by part: {detail}), more than the limit of {in_unit_of(limit, limit)} {unit}; "
            "make it smaller or raise --memory-limit")


def size_unit(limit_bytes: int) -> tuple[str, int]:
    """The unit a memory limit and the sizes set against it are written in: GiB from 1 GiB up, MiB from
    1 MiB up, KiB from 1 KiB up, else bytes (so that a small limit does not read as 0.0)."""
    if limit_bytes >= GIB:
        return "GiB", GIB
    if limit_bytes >= MIB:
        return "MiB", MIB
    return ("KiB", KIB) if limit_bytes >= KIB else ("B", 1)


def in_unit_of(num_bytes: int, limit_bytes: int) -> str:
    """`num_bytes` as a number in the unit of `size_unit(limit_bytes)` (one decimal; whole bytes)."""
    unit, scale = size_unit(limit_bytes)
    return f"{num_bytes:,}" if scale == 1 else f"{num_bytes / scale:,.1f}"
