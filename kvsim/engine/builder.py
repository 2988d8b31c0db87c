"""The builder: a validated scenario resolved once into one immutable engine specification, then built.

    scenario ──resolve_engine──▶ EngineSpec ──build_engine──▶ EngineParts (allocator in a scheduler, latency)
              (model, GPU, limits, KV layout,   (runtime state, built from the spec alone)
               pool size, bytes per block: once)

`resolve_engine` is the one place the model and GPU are loaded and the capacity math runs
for an engine: everything downstream (allocator, scheduler limits, latency model, the summary's
facts, the workload's length cap) reads the spec and re-derives nothing. It raises `KvsimError`
naming the field for what vLLM would refuse at startup.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.engine.recorder import StepRecorder
from kvsim.kv import GroupedPagedAllocator, KVAllocator, PagedAllocator, SlabAllocator
from kvsim.kv.link import LinkSpec
from kvsim.kv.offload_connector import OffloadConnector, TierSpec
from kvsim.kv.radix_prefix_cache import RadixPrefixCache
from kvsim.latency.base import ConstantLatency, LatencyModel
from kvsim.latency.cudagraph import CudaGraphPadding, engine_padding
from kvsim.latency.roofline import RooflineLatency, attended_windows
from kvsim.latency.speculative import speculative_latency
from kvsim.model.capacity import model_kv_layout, num_gpu_blocks, swap_bytes
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import EngineConfig
from kvsim.model.errors import KvsimError
from kvsim.results.budget import check_run_memory
from kvsim.results.metrics import summarize
from kvsim.results.run_result import RunResult
from kvsim.sched import Scheduler, SchedulerLimits, make_request_queue, make_scheduler
from kvsim.sched.speculative import make_speculation
from kvsim.workload.scenario import Scenario

if TYPE_CHECKING:
    from kvsim.model.config import GPUSpec, ModelSpec
    from kvsim.model.kv_layout import KVLayout


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine of a scenario, resolved once (`resolve_engine`); immutable.

    `scenario` is the validated scenario it came from (its workload source, latency choice,
    seed and `steps`); `gpu` has the scenario's `gpu_link` applied. `num_gpu_blocks` is the
    pool's block ids (vLLM's null block included), `num_kv_slots` the slots an allocator can
    hand out (v1 paged pools keep block 0 back: `(num_gpu_blocks − 1) · block_size`; vLLM v0's block
    manager and slab pools, the paper's Orca, have no null block: `EngineConfig.num_null_blocks`).
    `num_cpu_blocks`/`num_cpu_slots`: the swap space. `cudagraph_padding`: the CUDA-graph capture sizes the
    engine's steps pad to (`engine_padding`: None without graphs), resolved with the limits, whatever the latency
    model prices: a budget that no capture size of 1 + K tokens fits is what vLLM refuses to start with.
    """

    scenario: Scenario
    model: ModelSpec
    gpu: GPUSpec
    engine: EngineConfig
    max_model_len: int
    kv_layout: KVLayout
    num_gpu_blocks: int
    bytes_per_block: int
    bytes_per_token: int
    num_kv_slots: int
    num_cpu_blocks: int
    num_cpu_slots: int
    limits: SchedulerLimits
    async_scheduling: bool  # `EngineConfig.resolved_async_scheduling`
    cudagraph_padding: CudaGraphPadding | None

    @property
    def kv_cache_size_tokens(self) -> int:
        """vLLM's startup "GPU KV cache size: N tokens": the pool's blocks (null block included) divided among its
        KV cache groups, times block_size (`KVLayout.token_slots`; a Gemma 3 pool's among 7 groups)."""
        return self.kv_layout.token_slots(self.num_gpu_blocks)

    @property
    def vllm_max_concurrency(self) -> float:
        """vLLM's startup "maximum concurrency": every request at `max_model_len`, in the formula of the
        scheduler version the engine models (`KVLayout.max_concurrency`: v1 rounds up to whole blocks, v0 not)."""
        return self.kv_layout.max_concurrency(self.num_gpu_blocks, self.max_model_len,
                                              self.limits.max_num_batched_tokens, self.engine.scheduler)


def resolve_engine(scenario: Scenario) -> EngineSpec:
    """Load the model and GPU, check what vLLM checks at startup and size the KV pool, once."""
    model, gpu, engine = load_model(scenario.model), load_gpu(scenario.gpu), scenario.engine
    _check_v0_priorities(scenario)
    if scenario.gpu_link is not None:
        gpu = gpu.model_copy(update={"link": scenario.gpu_link})
    max_model_len = engine.resolved_max_model_len(model)
    engine.check_vllm_startup(max_model_len, gpu)
    layout = model_kv_layout(model, engine)
    num_blocks = num_gpu_blocks(model, gpu, engine, layout=layout, max_model_len=max_model_len)
    bs = engine.block_size
    num_kv_slots = (num_blocks - engine.num_null_blocks) * bs
    cpu_swap_bytes = swap_bytes(engine)
    watermark_slots = int(engine.resolved_watermark * num_kv_slots / bs) * bs if engine.resolved_watermark else 0
    limits = SchedulerLimits(
        max_num_seqs=engine.resolved_max_num_seqs(gpu),
        max_num_batched_tokens=engine.resolved_max_num_batched_tokens(max_model_len, gpu),
        max_model_len=max_model_len,
        watermark_slots=watermark_slots,
        preemption_mode=engine.preemption_mode,
        can_swap=engine.can_swap,
        swap_space_gib=engine.swap_space,
    )
    # vLLM refuses to start without a capture size for a speculative step: refused here, not only by the latency
    # models that pad (a constant one priced such an engine, a run vLLM never serves)
    padding = engine_padding(engine, limits.max_num_seqs, limits.max_num_batched_tokens)
    return EngineSpec(scenario, model, gpu, engine, max_model_len, layout, num_blocks, layout.bytes_per_block,
                      layout.bytes_per_token, num_kv_slots, cpu_swap_bytes // layout.bytes_per_block,
                      cpu_swap_bytes // layout.bytes_per_token, limits, engine.resolved_async_scheduling, padding)


def _check_v0_priorities(scenario: Scenario) -> None:
    """Refuse request priorities vLLM v0 would reject: its `LLMEngine.add_request` raises "Got priority N but
    Priority scheduling is not enabled." for every request of a nonzero priority unless the policy is `priority`
    (vllm/engine/llm_engine.py), which kvsim does not model for v0 (`EngineConfig`); so a v0 engine serves only
    priority 0. vLLM v1 accepts any priority under FCFS and ignores it (`kvsim.workload.traffic.PriorityMix`).
    A trace's priority column is refused whatever it holds: its values are read with the workload, after this."""
    if scenario.engine.scheduler != "v0":
        return
    trace, mix = scenario.workload.trace, scenario.workload.priority
    if trace is not None and trace.priority_column is not None:
        raise KvsimError(f"workload.trace.priority_column={trace.priority_column!r}: scheduler v0 rejects every "
                         "request of a nonzero priority under fcfs (vLLM's LLMEngine.add_request) and its priority "
                         "policy is not modelled; drop the column, or set engine.scheduler=v1")
    for i, cls in enumerate(mix.classes if mix is not None else ()):
        if cls.priority != 0:
            raise KvsimError(f"workload.priority.classes.{i}.priority={cls.priority}: scheduler v0 rejects every "
                             "request of a nonzero priority under fcfs (vLLM's LLMEngine.add_request) and its "
                             "priority policy is not modelled; give priority 0, or set engine.scheduler=v1")


def make_allocator(spec: EngineSpec) -> KVAllocator:
    """The KV allocator of `engine.allocator`, sized by the spec (same bytes for all kinds).

    Paged pools under v1 keep vLLM's null block (`num_gpu_blocks − 1` usable blocks); v0's paged pools
    and slab pools, the paper's Orca, have none: all `num_gpu_blocks · block_size` slots (OPT-13B in
    12 GiB: 15,728).
    """
    engine, num_blocks = spec.engine, spec.num_gpu_blocks
    if num_blocks < 2 and engine.num_null_blocks:
        raise KvsimError(f"num_gpu_blocks={num_blocks}: need at least 2 (one is vLLM's null block)")
    allocator: KVAllocator
    if any(g.kind in ("sliding_window", "chunked_local") for g in spec.kv_layout.groups):
        if engine.prefix_cache == "radix":
            raise KvsimError(f"engine.prefix_cache=radix: model={spec.model.name} has sliding-window/chunked KV "
                             "groups, which kvsim caches with the hash chain only")
        if engine.allocator != "paged" or engine.scheduler != "v1":
            raise KvsimError(f"model={spec.model.name}: sliding-window/chunked KV groups need allocator=paged and "
                             f"scheduler=v1 (vLLM's hybrid KV cache manager); or "
                             f"{spec.kv_layout.full_attention_advice}")
        beam_width = spec.scenario.workload.beam_width  # v1 runs n > 1 samples as requests of their own, unforked
        if beam_width is not None:  # refused here, not when the first beam forks
            raise KvsimError(f"workload.beam_width={beam_width}: model={spec.model.name} has sliding-window/"
                             "chunked KV groups, whose pool kvsim does not fork into beams; "
                             f"{spec.kv_layout.full_attention_advice}")
        allocator = GroupedPagedAllocator(num_blocks, spec.kv_layout, spec.limits.max_num_batched_tokens,
                                          engine.enable_prefix_caching, spec.bytes_per_block)
    elif engine.allocator == "paged":
        # caching off, no cache: a radix tree would do per-block work for nothing and keep decode bursts off
        caches_radix = engine.prefix_cache == "radix" and engine.enable_prefix_caching
        cache = RadixPrefixCache(num_blocks, engine.block_size) if caches_radix else None
        allocator = PagedAllocator(num_blocks, engine.block_size, enable_caching=engine.enable_prefix_caching,
                                   num_cpu_blocks=spec.num_cpu_blocks, bytes_per_block=spec.bytes_per_block,
                                   prefix_cache=cache, null_block=bool(engine.num_null_blocks),
                                   v0_prefix_caching=engine.scheduler == "v0")
    else:
        allocator = SlabAllocator(num_blocks * engine.block_size, spec.max_model_len,
                                  policy=engine.allocator.removeprefix("slab-"),  # type: ignore[arg-type]
                                  num_cpu_slots=spec.num_cpu_slots, bytes_per_token=spec.bytes_per_token,
                                  placement=engine.slab_placement)
    assert allocator.num_total_slots == spec.num_kv_slots, "the spec's slot count is the allocator's"
    return allocator


def offload_block_bytes(spec: EngineSpec) -> int:
    """The bytes one KV block takes in an offload tier: every tensor-parallel rank's shard of it."""
    return spec.bytes_per_block * spec.engine.tensor_parallel_size


def make_offload(spec: EngineSpec) -> OffloadConnector | None:
    """The offload tiers of `engine.kv_offload` (`kvsim.kv.offload_connector`), or None when it has no tier
    of at least one block (so a tier of size 0 is exactly no tier). A block takes the shard bytes of every TP
    rank; loads and stores move at the host link's bandwidth per rank (each rank has its own), the disk
    tier's reads and writes (demotions from the CPU tier) at the drive's bandwidth."""
    config, engine = spec.engine.kv_offload, spec.engine
    if config is None:
        return None
    tp = engine.tensor_parallel_size
    block_bytes = offload_block_bytes(spec)
    num_cpu, num_disk = config.num_blocks("cpu", block_bytes), config.num_blocks("disk", block_bytes)
    if num_cpu * block_bytes > config.host_memory_bytes:
        raise KvsimError(f"engine.kv_offload.num_cpu_blocks={num_cpu}: {num_cpu * block_bytes} bytes, larger than "
                         f"host_memory_bytes={config.host_memory_bytes}")
    if num_disk and not num_cpu:
        raise KvsimError(f"engine.kv_offload: a disk tier ({num_disk} blocks) needs a CPU tier above "
                         "it (cpu_bytes or num_cpu_blocks of at least one block): LMCache's local disk sits "
                         "below its CPU cache")
    if not num_cpu:
        return None
    bandwidth = (config.bandwidth_bytes_per_s or spec.gpu.host_link_bandwidth_bytes_per_s) * tp
    tiers = [TierSpec("cpu", num_cpu, LinkSpec(bandwidth))]
    if num_disk:
        assert config.disk_bandwidth_bytes_per_s is not None
        disk_link = LinkSpec(config.disk_bandwidth_bytes_per_s)  # the drive's, for reads and for writes
        tiers.append(TierSpec("disk", num_disk, disk_link, disk_link))
    return OffloadConnector(tiers, LinkSpec(bandwidth), engine.block_size, block_bytes, config.offload_prompt_only)


def make_latency(spec: EngineSpec) -> LatencyModel:
    """The scenario's latency model (`latency.model`) for the spec's model, GPU and engine, with the
    drafter's cost on top under speculative decoding (`kvsim.latency.speculative`)."""
    target = _target_latency(spec)
    if spec.engine.speculative_config is None:
        return target
    return speculative_latency(target, spec.model, spec.gpu, spec.engine)


def _target_latency(spec: EngineSpec) -> LatencyModel:
    scenario, model, gpu = spec.scenario, spec.model, spec.gpu
    cfg = scenario.latency
    if cfg.model == "constant":
        return ConstantLatency(cfg.step_s, gpu.host_link_bandwidth_bytes_per_s)
    roofline = RooflineLatency(model, gpu, spec.engine, cfg.overhead_s, cfg.overlap_swap, layout=spec.kv_layout,
                               overlap_cpu=spec.async_scheduling, padding=spec.cudagraph_padding)
    if cfg.model == "roofline":
        return roofline
    from kvsim.latency.calibrated import CalibratedLatency
    from kvsim.latency.profiles.loader import load_profile

    assert cfg.profile is not None
    profile = load_profile(scenario.resolve_path(cfg.profile, "latency.profile"), model, gpu, spec.engine)
    return CalibratedLatency(profile, model, spec.engine, roofline)


@dataclass(frozen=True, slots=True)
class EngineParts:
    """One engine built from its spec: its scheduler (with the KV allocator), latency model and facts."""

    spec: EngineSpec
    scheduler: Scheduler
    latency: LatencyModel
    facts: dict[str, Any]


def build_engine(scenario: Scenario, rng: np.random.Generator, memory_limit_bytes: int | None = None,
                 steps_in_memory: bool = True) -> EngineParts:
    """The allocator, scheduler and latency model of `scenario`'s engine (`resolve_engine`), once the run
    is known to fit in `memory_limit_bytes` (see `kvsim.results.budget`; `steps_in_memory`: the run
    keeps every step row in memory rather than streaming them or keeping a sample)."""
    spec = resolve_engine(scenario)
    check_run_memory(scenario, spec.model, spec.gpu, spec.engine, spec.num_gpu_blocks, spec.bytes_per_block,
                     memory_limit_bytes, steps_in_memory)
    return assemble_engine(spec, rng)


def check_engine(scenario: Scenario) -> None:
    """Raise the `KvsimError` that building `scenario`'s engine would (`build_engine`: a tier under one
    block, a setting the allocator refuses, a calibrated profile that cannot be read), without its memory
    check: for callers that check memory their own way before they write anything (`kvsim plan`)."""
    assemble_engine(resolve_engine(scenario), np.random.default_rng(0))


def assemble_engine(spec: EngineSpec, rng: np.random.Generator) -> EngineParts:
    """The allocator, scheduler and latency model of a resolved engine (`build_engine` less its memory check)."""
    scenario = spec.scenario
    allocator, speculation = make_allocator(spec), None
    if spec.engine.speculative_config is not None:
        if type(allocator) is not PagedAllocator:
            raise KvsimError(f"engine.speculative_config: needs the paged allocator over full attention (got "
                             f"allocator={spec.engine.allocator}, model {spec.model.name})")
        speculation = make_speculation(spec.engine.speculative_config)
    scheduler = make_scheduler(spec.engine.scheduler, allocator, spec.limits, rng,
                               make_request_queue(spec.engine.scheduling_policy), speculation)
    scheduler.async_scheduling = spec.async_scheduling
    scheduler.decode_windows = attended_windows(spec.model, spec.engine, spec.kv_layout)
    if type(allocator) is PagedAllocator:  # full attention only: the hybrid allocator keys blocks per group
        scheduler.offload = make_offload(spec)
    elif spec.engine.kv_offload is not None:
        raise KvsimError(f"engine.kv_offload: needs the paged allocator over full attention (model {spec.model.name} "
                         f"has sliding-window/chunked groups; {spec.kv_layout.full_attention_advice})")
    latency = make_latency(spec)
    engine = spec.engine
    facts = {
        "scenario": scenario.name, "model": spec.model.name, "gpu": spec.gpu.name, "allocator": engine.allocator,
        "scheduler": engine.scheduler, "latency_model": latency.name, "seed": scenario.seed,
        "block_size": engine.block_size, "max_model_len": spec.max_model_len, "num_gpu_blocks": spec.num_gpu_blocks,
        "kv_cache_dtype": engine.kv_cache_dtype, "vllm_max_concurrency": spec.vllm_max_concurrency,
    }
    if spec.async_scheduling:  # only when on: a synchronous run's summary is as it always was
        facts["async_scheduling"] = True
    return EngineParts(spec, scheduler, latency, facts)


def finished_requests(parts: EngineParts, recorder: StepRecorder, num_requests: int | None = None,
                      ) -> dict[str, np.ndarray]:
    """The finished engine's requests table (its scheduler's `records`: every request it was given, `num_requests`
    if known, and no KV still held), its `recorder` finished (a data-parallel rank's: its group's)."""
    scheduler = parts.scheduler
    assert num_requests is None or len(scheduler.records) == num_requests, "a request went missing"
    assert scheduler.num_held_slots == 0, "KV still held after the run"
    recorder.finish()
    return scheduler.records.columns()


def engine_result(scenario: Scenario, parts: EngineParts, recorder: StepRecorder, num_requests: int | None = None,
                  steps_path: Path | None = None) -> RunResult:
    """The finished engine's tables and summary, from its `finished_requests` and its recorder's totals over
    every step. `steps_path`: where the recorder's writer put the rows (they are read from there on access)."""
    scheduler = parts.scheduler
    request_columns = finished_requests(parts, recorder, num_requests)
    counters = scheduler.counters()
    summary = summarize(request_columns, recorder.totals, counters, parts.facts)
    if scheduler.offload is not None:
        summary["kv_offload"] = scheduler.offload.summary(summary["duration_s"], recorder.totals.end_s)
    rows = None if steps_path is not None and scenario.steps == "all" else recorder.kept_columns()
    return RunResult(scenario=scenario, request_columns=request_columns, step_columns=rows, summary=summary,
                     steps_path=steps_path, totals=recorder.totals,
                     counters=counters)


