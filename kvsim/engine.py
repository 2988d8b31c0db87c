"""The simulation: the only module that knows about time (SimPy).

Two processes share one `simpy.Environment`:

    arrivals:  for each request: wait until its arrival → scheduler.add → wake the engine
    engine:    loop: if idle, wait on the wake event (no polling)
                     plan = scheduler.schedule(now)
                     yield timeout(latency.step_time(plan))
                     scheduler.complete(plan, now)

`simulate(scenario)` builds the allocator, scheduler, latency model and workload from a
validated `Scenario` and returns a `RunResult` (DataFrames + summary). Same scenario and
seed → identical results: the only randomness is one `numpy.random.Generator(seed)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import simpy

from kvsim.capacity import (
    kv_bytes_per_block,
    kv_bytes_per_token,
    model_kv_layout,
    model_max_concurrency,
    num_gpu_blocks,
)
from kvsim.config import EngineConfig, load_gpu, load_model
from kvsim.errors import KvsimError
from kvsim.latency import ConstantLatency, LatencyModel, StepPlan, burst_step_times
from kvsim.memory import PagedAllocator, SlabAllocator
from kvsim.metrics import StepRecorder, requests_frame, summarize
from kvsim.request import Request
from kvsim.results import RunResult
from kvsim.roofline import RooflineLatency
from kvsim.scenario import Scenario
from kvsim.scheduler import Scheduler, SchedulerLimits, make_scheduler
from kvsim.workload import build_requests

if TYPE_CHECKING:
    from kvsim.config import GPUSpec, ModelSpec

ProgressFn = Callable[[float, int, int], None]  # (simulated seconds, requests done, requests total)
PROGRESS_EVERY_STEPS = 2000


def make_allocator(model: ModelSpec, gpu: GPUSpec, engine: EngineConfig) -> PagedAllocator | SlabAllocator:
    """The KV allocator of `engine.allocator`, sized by the capacity math (same bytes for all kinds).

    Paged pools keep vLLM's null block (`num_gpu_blocks − 1` usable blocks); slab pools, the
    paper's Orca, have none: all `num_gpu_blocks · block_size` slots (OPT-13B in 12 GiB: 15,728).
    """
    layout = model_kv_layout(model, engine)
    if any(g.kind in ("sliding_window", "chunked_local") for g in layout.groups):
        raise KvsimError(f"model={model.name}: simulating sliding-window/chunked KV groups is not supported yet; "
                         "set engine.disable_hybrid_kv_cache_manager=true to allocate them as full attention")
    num_blocks = num_gpu_blocks(model, gpu, engine)
    if num_blocks < 2 and engine.allocator == "paged":
        raise KvsimError(f"num_gpu_blocks={num_blocks}: need at least 2 (one is vLLM's null block)")
    bytes_per_block = kv_bytes_per_block(model, engine)
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
    from kvsim.calibration import CalibratedLatency
    from kvsim.profiles import load_profile

    assert cfg.profile is not None
    profile = load_profile(scenario.resolve_path(cfg.profile), model, gpu, scenario.engine)
    return CalibratedLatency(profile, model, scenario.engine, roofline)


def make_limits(engine: EngineConfig, gpu: GPUSpec, max_model_len: int,
                allocator: PagedAllocator | SlabAllocator) -> SchedulerLimits:
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


def delay_until(now: float, t: float) -> float:
    """The smallest float delay with `now + delay >= t`: `t - now` can fall an ulp short, and a
    request must never be seen before it arrives."""
    delay = t - now
    while now + delay < t:
        delay = math.nextafter(delay, math.inf)
    return delay


def plan_burst(scheduler: Scheduler, latency: LatencyModel, now: float,
               next_arrival_s: float) -> tuple[list[Request], list[float]] | None:
    """A run of pure-decode steps that the step-by-step loop would take unchanged, if any.

    It includes only steps that start before the next arrival (a step never sees a request
    that arrives while it runs), ends at the first request's last token, and stays within the
    free KV memory, so no admission, preemption or early finish can happen inside it.
    """
    batch = scheduler.burst_batch()
    if batch is None:
        return None
    max_steps = min(req.output_len - req.num_output_tokens for req in batch)
    n = len(batch)
    contexts = [req.num_computed_tokens + 1 for req in batch]
    total = sum(contexts)  # what StepPlan.add would sum for n one-token decodes (attention work included)
    first = StepPlan(num_tokens=n, num_seqs=n, num_decode_seqs=n, num_sampled=n, sum_context_tokens=total,
                     sum_decode_context_tokens=total, max_context_tokens=max(contexts), attention_work=float(total))
    durations: list[float] = []
    start = now
    for d in burst_step_times(latency, first):
        if start >= next_arrival_s or len(durations) == max_steps:
            break
        durations.append(d)
        start += d
    seq_ids = [req.seq_ids[0] for req in batch]
    while durations and scheduler.alloc.burst_slots_needed(seq_ids, len(durations)) > scheduler.alloc.num_free_slots:
        durations = durations[: len(durations) // 2]
    return (batch, durations) if durations else None


def run_engine(scheduler: Scheduler, latency: LatencyModel, requests: list[Request], check: bool = False,
               progress: ProgressFn | None = None, bursts: bool = True) -> StepRecorder:
    """Run arrivals and the step loop to completion; every request ends finished or rejected.

    `bursts=True` runs stretches of pure decode several steps at a time (`plan_burst`);
    results are identical to `bursts=False`, which plans every step.
    """
    env = simpy.Environment()
    recorder = StepRecorder()
    state = {"wake": env.event(), "arrived": 0}

    def arrivals():
        for req in requests:
            if req.arrival_s > env.now:
                yield env.timeout(delay_until(env.now, req.arrival_s))
            scheduler.add(req)
            state["arrived"] += 1
            if not state["wake"].triggered:
                state["wake"].succeed()

    def engine_loop():
        steps, next_progress = 0, PROGRESS_EVERY_STEPS
        while True:
            if not scheduler.has_work:
                if state["arrived"] == len(requests):
                    return
                yield state["wake"]
                state["wake"] = env.event()
                continue
            arrived = state["arrived"]
            next_arrival = requests[arrived].arrival_s if arrived < len(requests) else float("inf")
            burst = plan_burst(scheduler, latency, env.now, next_arrival) if bursts else None
            if burst is not None:
                batch, durations = burst
                recorder.record_burst(env.now, durations, scheduler, batch)
                for d in durations:  # one timeout per step keeps env.now bit-identical to step-by-step
                    yield env.timeout(d)
                scheduler.apply_burst(batch, len(durations), env.now)
                if check:
                    scheduler.alloc.check_invariants()
                steps += len(durations)
                continue
            copies_before = scheduler.alloc.num_copy_on_writes
            plan = scheduler.schedule(env.now)
            plan.num_copied_blocks = scheduler.alloc.num_copy_on_writes - copies_before
            if plan.is_empty:
                if plan.preempted:
                    continue  # preemptions freed memory; plan again at the same instant
                if state["arrived"] == len(requests):
                    raise RuntimeError(f"scheduler stalled at t={env.now:.3f}s with "
                                       f"{len(scheduler.waiting)} waiting and nothing runnable")
                yield state["wake"]
                state["wake"] = env.event()
                continue
            duration = latency.step_time(plan)
            recorder.record(env.now, duration, plan, scheduler)
            yield env.timeout(duration)
            scheduler.complete(plan, env.now)
            if check:
                scheduler.alloc.check_invariants()
            steps += 1
            if progress is not None and steps >= next_progress:
                next_progress += PROGRESS_EVERY_STEPS
                progress(env.now, len(scheduler.finished) + len(scheduler.rejected), len(requests))

    env.process(arrivals())
    env.run(until=env.process(engine_loop()))
    if progress is not None:
        progress(env.now, len(requests), len(requests))
    return recorder


def simulate(scenario: Scenario, check: bool = False, progress: ProgressFn | None = None,
             bursts: bool = True) -> RunResult:
    """Simulate a scenario end to end. `check=True` runs `check_invariants()` after every step."""
    model, gpu, engine = load_model(scenario.model), load_gpu(scenario.gpu), scenario.engine
    if scenario.gpu_link is not None:
        gpu = gpu.model_copy(update={"link": scenario.gpu_link})
    max_model_len = engine.resolved_max_model_len(model)
    allocator = make_allocator(model, gpu, engine)
    rng = np.random.default_rng(scenario.seed)  # the run's only source of randomness
    requests = build_requests(scenario, max_model_len, rng)
    scheduler = make_scheduler(engine.scheduler, allocator, make_limits(engine, gpu, max_model_len, allocator), rng)
    latency = make_latency(scenario, model, gpu)
    recorder = run_engine(scheduler, latency, requests, check=check, progress=progress, bursts=bursts)
    assert len(scheduler.finished) + len(scheduler.rejected) == len(requests), "a request went missing"
    assert allocator.num_held_slots == 0, "KV still held after the run"
    requests_df = requests_frame(requests)
    steps_df = recorder.frame()
    num_blocks = num_gpu_blocks(model, gpu, engine)
    extra = {
        "scenario": scenario.name, "model": model.name, "gpu": gpu.name, "allocator": engine.allocator,
        "scheduler": engine.scheduler, "latency_model": latency.name, "seed": scenario.seed,
        "block_size": engine.block_size, "max_model_len": max_model_len, "num_gpu_blocks": num_blocks,
        "kv_cache_dtype": engine.kv_cache_dtype,
        "vllm_max_concurrency": model_max_concurrency(model, gpu, engine, num_blocks, max_model_len),
    }
    summary = summarize(requests_df, steps_df, scheduler, extra)
    return RunResult(scenario=scenario, requests=requests_df, steps=steps_df, summary=summary)
