"""The builder: a validated scenario resolved once into one engine's parts (allocator, scheduler, latency
model, limits) and the facts its summary reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.engine.recorder import StepRecorder
from kvsim.kv import GroupedPagedAllocator, KVAllocator, PagedAllocator, SlabAllocator
from kvsim.latency.base import ConstantLatency, LatencyModel
from kvsim.latency.roofline import RooflineLatency
from kvsim.model.capacity import (
    kv_bytes_per_block,
    kv_bytes_per_token,
    model_kv_layout,
    model_max_concurrency,
    num_gpu_blocks,
)
from kvsim.model.config import EngineConfig, load_gpu, load_model
from kvsim.model.errors import KvsimError
from kvsim.results.budget import check_run_memory
from kvsim.results.metrics import summarize
from kvsim.results.run_result import RunResult
from kvsim.sched import Scheduler, SchedulerLimits, make_scheduler
from kvsim.workload.scenario import Scenario

if TYPE_CHECKING:
    from kvsim.model.config import GPUSpec, ModelSpec



def make_allocator(model: ModelSpec, gpu: GPUSpec, engine: EngineConfig) -> KVAllocator:
    """The KV allocator of `engine.allocator`, sized by the capacity math (same bytes for all kinds).

    Paged pools keep vLLM's null block (`num_gpu_blocks − 1` usable blocks); slab pools, the
    paper's Orca, have none: all `num_gpu_blocks · block_size` slots (OPT-13B in 12 GiB: 15,728).
    """
    num_blocks = num_gpu_blocks(model, gpu, engine)
    if num_blocks < 2 and engine.allocator == "paged":
        raise KvsimError(f"num_gpu_blocks={num_blocks}: need at least 2 (one is vLLM's null block)")
    bytes_per_block = kv_bytes_per_block(model, engine)
    layout = model_kv_layout(model, engine)
    if any(g.kind in ("sliding_window", "chunked_local") for g in layout.groups):
        if engine.allocator != "paged" or engine.scheduler != "v1":
            raise KvsimError(f"model={model.name}: sliding-window/chunked KV groups need allocator=paged and "
                             "scheduler=v1 (vLLM's hybrid KV cache manager); or set "
                             "engine.disable_hybrid_kv_cache_manager=true")
        mnbt = engine.resolved_max_num_batched_tokens(engine.resolved_max_model_len(model), gpu)
        return GroupedPagedAllocator(num_blocks, layout, mnbt, engine.enable_prefix_caching, bytes_per_block)
    swap_bytes = int(engine.swap_space * 2**30)
    if engine.allocator == "paged":
        return PagedAllocator(num_blocks, engine.block_size, enable_caching=engine.enable_prefix_caching,
                              num_cpu_blocks=swap_bytes // bytes_per_block, bytes_per_block=bytes_per_block)
    bytes_per_token = kv_bytes_per_token(model, engine)
    return SlabAllocator(num_blocks * engine.block_size, engine.resolved_max_model_len(model),
                         policy=engine.allocator.removeprefix("slab-"),  # type: ignore[arg-type]
                         num_cpu_slots=swap_bytes // bytes_per_token, bytes_per_token=bytes_per_token,
                         placement=engine.slab_placement)


def make_latency(scenario: Scenario, model: ModelSpec, gpu: GPUSpec) -> LatencyModel:
    cfg = scenario.latency
    if cfg.model == "constant":
        return ConstantLatency(cfg.step_s, gpu.host_link_bandwidth_bytes_per_s)
    roofline = RooflineLatency(model, gpu, scenario.engine, cfg.overhead_s, cfg.overlap_swap)
    if cfg.model == "roofline":
        return roofline
    from kvsim.latency.calibrated import CalibratedLatency
    from kvsim.latency.profiles.loader import load_profile

    assert cfg.profile is not None
    profile = load_profile(scenario.resolve_path(cfg.profile), model, gpu, scenario.engine)
    return CalibratedLatency(profile, model, scenario.engine, roofline)


def make_limits(engine: EngineConfig, gpu: GPUSpec, max_model_len: int,
                allocator: KVAllocator) -> SchedulerLimits:
    watermark_slots = 0
    if engine.resolved_watermark:
        bs = engine.block_size
        watermark_slots = int(engine.resolved_watermark * allocator.num_total_slots / bs) * bs
    return SchedulerLimits(
        max_num_seqs=engine.resolved_max_num_seqs(gpu),
        max_num_batched_tokens=engine.resolved_max_num_batched_tokens(max_model_len, gpu),
        max_model_len=max_model_len,
        watermark_slots=watermark_slots,
        preemption_mode=engine.preemption_mode,
    )


@dataclass(frozen=True, slots=True)
class EngineParts:
    """One engine built from a scenario: its scheduler (with the KV allocator), latency model and facts."""

    scheduler: Scheduler
    latency: LatencyModel
    facts: dict[str, Any]


def build_engine(scenario: Scenario, rng: np.random.Generator, memory_limit_bytes: int | None = None,
                 steps_in_memory: bool = True) -> EngineParts:
    """The allocator, scheduler and latency model of `scenario`'s model, GPU and engine settings,
    once the run is known to fit in `memory_limit_bytes` (see `kvsim.results.budget`; `steps_in_memory`:
    the run keeps every step row in memory rather than streaming them or keeping a sample)."""
    model, gpu, engine = load_model(scenario.model), load_gpu(scenario.gpu), scenario.engine
    if scenario.gpu_link is not None:
        gpu = gpu.model_copy(update={"link": scenario.gpu_link})
    max_model_len = engine.resolved_max_model_len(model)
    engine.check_vllm_startup(max_model_len, gpu)
    check_run_memory(scenario, model, gpu, engine, num_gpu_blocks(model, gpu, engine),
                     kv_bytes_per_block(model, engine), memory_limit_bytes, steps_in_memory)
    allocator = make_allocator(model, gpu, engine)
    scheduler = make_scheduler(engine.scheduler, allocator, make_limits(engine, gpu, max_model_len, allocator), rng)
    latency = make_latency(scenario, model, gpu)
    num_blocks = num_gpu_blocks(model, gpu, engine)
    facts = {
        "scenario": scenario.name, "model": model.name, "gpu": gpu.name, "allocator": engine.allocator,
        "scheduler": engine.scheduler, "latency_model": latency.name, "seed": scenario.seed,
        "block_size": engine.block_size, "max_model_len": max_model_len, "num_gpu_blocks": num_blocks,
        "kv_cache_dtype": engine.kv_cache_dtype,
        "vllm_max_concurrency": model_max_concurrency(model, gpu, engine, num_blocks, max_model_len),
    }
    return EngineParts(scheduler, latency, facts)


def engine_result(scenario: Scenario, parts: EngineParts, recorder: StepRecorder, num_requests: int | None = None,
                  steps_path: Path | None = None) -> RunResult:
    """The finished engine's tables and summary, from its scheduler's `records` (every request it was
    given, `num_requests` if known) and its recorder's totals over every step. `steps_path`: where
    the recorder's writer put the rows (they are read from there on access)."""
    scheduler = parts.scheduler
    assert num_requests is None or len(scheduler.records) == num_requests, "a request went missing"
    assert scheduler.num_held_slots == 0, "KV still held after the run"
    recorder.finish()
    request_columns = scheduler.records.columns()
    summary = summarize(request_columns, recorder.totals, scheduler.counters(), parts.facts)
    rows = None if steps_path is not None and scenario.steps == "all" else recorder.kept_columns()
    return RunResult(scenario=scenario, request_columns=request_columns, step_columns=rows, summary=summary,
                     steps_path=steps_path)


