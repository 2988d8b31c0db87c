"""vLLM's engine arguments: `EngineConfig` (same names and defaults as vLLM's `EngineArgs`) and `make_engine`.

Everything a user types for the engine passes through here once, at the boundary; the rest of kvsim trusts the
frozen `EngineConfig`. A bad value raises `KvsimError` naming the field and value. Models and GPUs load in
`kvsim.model.config`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ModelWrapValidatorHandler, ValidationError, field_validator, model_validator

from kvsim.model.batch_defaults import batch_defaults
from kvsim.model.config import GPUSpec, load_model, model_file
from kvsim.model.errors import KvsimError, from_validation_error
from kvsim.model.offload_config import KVOffloadConfig
from kvsim.model.sizes import MAX_BYTES, Bytes, BytesOrZero, MaxModelLen, Tokens
from kvsim.model.spec import DTYPE_BYTES, ModelSpec, Settings
from kvsim.model.speculative_config import SpeculativeConfig

KVCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "float16", "bfloat16"]

VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vllm/config/cache.py `BlockSize`
MAX_ENGINES = 4096
"""The most engines kvsim runs side by side: a data-parallel group's ranks (`data_parallel_size`), as a fleet's
replicas (`replicas`, a group's `count`). Each is built (its scheduler, its KV pool); a DP size of 10**11 was
priced by `kvsim capacity` as that many GPUs serving (the largest GPU clusters hold about 10**5)."""
SWAP_SPACE_GIB = 4.0  # vLLM's default --swap-space (vllm/config/cache.py)


class EngineConfig(Settings):
    """vLLM's engine arguments (same names and defaults) plus kvsim's choice of allocator/scheduler.

    `max_model_len=None` means the model's `max_position_embeddings`, as in vLLM. It and
    `max_num_batched_tokens` take vLLM's human-readable counts too (`32k`, `32K`: `kvsim.model.sizes.Tokens`).
    `max_num_seqs=None` and `max_num_batched_tokens=None` take vLLM's usage-context defaults for the GPU
    (`resolved_max_num_seqs`, `resolved_max_num_batched_tokens`).
    `non_torch_memory_bytes` is kvsim's estimate of what vLLM's profiler measures outside PyTorch's allocator
    (CUDA context, NCCL, CUDA graphs); 1 GiB is typical for one GPU.
    `watermark` is v0's fraction of blocks kept free at admission (v1 uses none).
    `slab_placement` places slab regions with a buddy allocator (the paper's Orca: regions rounded up to a power
    of two) or first-fit (exact sizes).
    `data_parallel_size` engines each hold a full copy of the non-expert weights and their own KV pool; with
    `enable_expert_parallel` the experts are split over tp · dp GPUs instead of tp (vLLM's EP).
    `disable_hybrid_kv_cache_manager` allocates sliding-window and chunked layers like full attention in a
    model that mixes them with others, as vLLM's flag does (a model whose every layer slides keeps its window).
    `scheduling_policy` orders the waiting queue (vLLM's `--scheduling-policy`: `fcfs`, or
    `priority`: smallest (priority, arrival) first, the lowest-priority running request preempted);
    `speculative_config` is vLLM's `--speculative-config` (`kvsim.model.speculative_config`).
    `kv_offload` adds CPU/disk tiers below the GPU's KV cache, with prefix caching on or off
    (`KVOffloadConfig`, `kvsim.kv.offload_connector`).
    `enable_prefix_caching` defaults to on for v1 and off for v0, as vLLM's engines do. `prefix_cache` picks the
    paged pool's prefix cache: vLLM's `hash_chain` or SGLang's `radix` tree (`kvsim.kv.radix_prefix_cache`).
    `async_scheduling` is vLLM's `--async-scheduling` (`None`: vLLM's default, `resolved_async_scheduling`): each
    step is planned while the previous one runs (`kvsim.sched.async_steps`). `enforce_eager` turns off the CUDA
    graphs whose batch padding a v1 step is priced with, as vLLM's flag does (`kvsim.latency.cudagraph`).
    """

    block_size: int = Field(default=16, gt=0)
    max_model_len: MaxModelLen | None = None
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)

    @field_validator("gpu_memory_utilization", mode="before")
    @classmethod
    def _a_fraction_not_a_percentage(cls, value: Any) -> Any:
        """`95` is a percentage given where vLLM takes the fraction 0.95: say so."""
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 10 <= value <= 100:
            raise ValueError(f"must be a fraction in (0, 1] (did you mean {value / 100:g}?)")
        return value
    kv_cache_dtype: KVCacheDtype = "auto"
    kv_cache_memory_bytes: Bytes | None = None
    # a block holds at least a byte: no pool has more blocks than MAX_BYTES (10**400 was an OverflowError where the
    # pool was shown in GiB)
    num_gpu_blocks_override: int | None = Field(default=None, gt=0, le=MAX_BYTES)
    tensor_parallel_size: int = Field(default=1, gt=0)
    data_parallel_size: int = Field(default=1, gt=0, le=MAX_ENGINES)
    enable_expert_parallel: bool = False
    disable_hybrid_kv_cache_manager: bool = False
    max_num_seqs: int | None = Field(default=None, gt=0, description="sequences, not requests (n=4 counts 4)")
    max_num_batched_tokens: Tokens | None = None
    usage_context: Literal["openai_api_server", "llm_class"] = "openai_api_server"
    enable_prefix_caching: bool = True
    swap_space: float = Field(default=SWAP_SPACE_GIB, ge=0, le=2**20, description="GiB of CPU swap per GPU (at "
                              "most 1 PiB: as bytes, 1e308 GiB would overflow)")
    preemption_mode: Literal["recompute", "swap"] | None = None
    # vLLM does not configure this: it measures it at startup. vllm/v1/worker/gpu_worker.py
    # `determine_available_memory` runs `profile_run()` inside vllm/utils/mem_utils.py
    # `memory_profiling` and subtracts `non_torch_increase` (device memory growth outside
    # PyTorch's allocator: CUDA context, NCCL buffers, cuBLAS workspace) with the weights and
    # the torch activation peak from the utilization budget. No measured value is shipped with
    # kvsim; 1 GiB is an estimate for one GPU (an assumption, not a fit). Override it with the
    # non-torch figure of vLLM's memory-profiling log line when you have one.
    non_torch_memory_bytes: BytesOrZero = 2**30
    allocator: Literal["paged", "slab-max", "slab-pow2", "slab-oracle"] = "paged"
    slab_placement: Literal["buddy", "first-fit"] = "buddy"
    scheduler: Literal["v1", "v0", "static"] = "v1"
    watermark: float | None = Field(default=None, ge=0, lt=1)
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    prefix_cache: Literal["hash_chain", "radix"] = "hash_chain"
    speculative_config: SpeculativeConfig | None = None
    kv_offload: KVOffloadConfig | None = Field(default=None, exclude_if=lambda config: config is None)
    async_scheduling: bool | None = Field(default=None, exclude_if=lambda value: value is None)
    enforce_eager: bool = Field(default=False, exclude_if=lambda value: not value)  # written only when set

    @model_validator(mode="wrap")
    @classmethod
    def _v0_leaves_prefix_caching_off(cls, data: Any, handler: ModelWrapValidatorHandler[EngineConfig]) -> Any:
        """vLLM's default for `enable_prefix_caching` is None (vllm/engine/arg_utils.py, `EngineArgs`): only
        `_set_default_args_v1` turns it on, so V0 caches no prefix unless asked; as v1's, no setting given."""
        defaulted = isinstance(data, dict) and data.get("scheduler") == "v0" and "enable_prefix_caching" not in data
        engine = handler({**data, "enable_prefix_caching": False} if defaulted else data)
        engine.model_fields_set.difference_update({"enable_prefix_caching"} if defaulted else ())
        return engine

    @model_validator(mode="after")
    def _radix_needs_paged(self) -> EngineConfig:
        if self.prefix_cache == "radix" and self.allocator != "paged":
            raise ValueError(f"prefix_cache=radix needs allocator paged (got {self.allocator})")
        return self

    @model_validator(mode="after")
    def _offload_needs_hashed_blocks(self) -> EngineConfig:
        """The tiers hold hashed blocks of vLLM v1's paged hash chain (the connector's world). GPU prefix caching
        may be off, as `vllm serve --no-enable-prefix-caching` with an offloading connector runs: vLLM still hashes
        every request's blocks when a KV connector is set (`request_block_hasher` in vllm/v1/engine/core.py), so
        the tiers store and load them while the GPU pool caches nothing (`kvsim.kv.offload_connector`). The GPU's
        prefix cache must then be the hash chain only where there is one: with caching off no prefix cache is built
        (`kvsim.engine.builder.make_allocator`), so `prefix_cache: radix` is unread (`unread_settings` says it) and
        the engine is the hash chain's; it was refused as if the tiers needed it."""
        if self.kv_offload is not None:
            for name, value, needed in (("allocator", self.allocator, "paged"), ("scheduler", self.scheduler, "v1")):
                if value != needed:
                    raise ValueError(f"kv_offload needs {name}={needed} (got {value})")
            if self.prefix_cache != "hash_chain" and self.enable_prefix_caching:
                raise ValueError(f"kv_offload with enable_prefix_caching needs prefix_cache=hash_chain (got "
                                 f"{self.prefix_cache}): the tiers hold the hash chain's blocks")
            if self.speculative_config is not None:
                raise ValueError("kv_offload with speculative_config: not modelled together")
        return self

    @model_validator(mode="after")
    def _priority_needs_v1(self) -> EngineConfig:
        if self.scheduling_policy == "priority" and self.scheduler != "v1":
            raise ValueError(f"scheduling_policy=priority needs scheduler v1 (got {self.scheduler}): vLLM v0's "
                             "priority policy also preempts running requests for waiting ones, not modelled")
        return self

    @field_validator("speculative_config")
    @classmethod
    def _draft_model_loads(cls, spec: SpeculativeConfig | None) -> SpeculativeConfig | None:
        """A draft model kvsim cannot load was found only once the run priced its first draft (`model='nope'`,
        naming the scenario's own field), and `kvsim capacity` never looked: it is loaded here. Only
        `draft_model` reads it (an EAGLE head's cost follows the target's shape)."""
        if spec is None or spec.method != "draft_model" or spec.model is None:
            return spec
        try:
            model_file(spec.model)
        except KvsimError as error:  # neither a preset nor a file: the message names the value
            raise ValueError(str(error)) from None
        try:
            load_model(spec.model)
        except KvsimError as error:  # a file that is no model config: its own reason
            raise ValueError(f"model={spec.model!r}: {error}") from None
        return spec

    @model_validator(mode="after")
    def _speculation_needs_v1(self) -> EngineConfig:
        if self.speculative_config is not None and self.scheduler != "v1":
            raise ValueError(f"speculative_config needs scheduler v1 (got {self.scheduler}): vLLM speculates in "
                             "its v1 engine only")
        return self

    @model_validator(mode="after")
    def _data_parallel_needs_v1(self) -> EngineConfig:
        """vLLM's data parallelism (its DP engine cores, load balancer and coordinator, `DPEngineCoreProc` for an
        MoE's lockstep ranks) is its v1 engine's: V0 has none (vllm-project/vllm issue 16978, a maintainer: "data
        parallelism is only implemented for V1"). A v0 or static `data_parallel_size: 2` ran as v1's DP group."""
        if self.data_parallel_size > 1 and self.scheduler != "v1":
            raise ValueError(f"data_parallel_size={self.data_parallel_size} needs scheduler v1 (got {self.scheduler}): "
                             "vLLM runs data-parallel ranks in its v1 engine only; for independent engines give "
                             "replicas (a fleet)")
        return self

    @model_validator(mode="after")
    def _async_needs_v1(self) -> EngineConfig:
        if self.async_scheduling and self.scheduler != "v1":
            raise ValueError(f"async_scheduling=true needs scheduler v1 (got {self.scheduler}): vLLM schedules "
                             "asynchronously in its v1 engine only")
        return self

    @model_validator(mode="after")
    def _async_refuses_ngram(self) -> EngineConfig:
        """vLLM refuses an explicit `async_scheduling=true` beside CPU n-gram drafting (vllm/config/vllm.py,
        `VllmConfig.__post_init__`: `method` is neither an EAGLE/MTP type nor `ngram_gpu`, a ValueError), where
        its default (`None`) falls back to synchronous steps with a warning (`resolved_async_scheduling`)."""
        spec = self.speculative_config
        if self.async_scheduling and spec is not None and spec.method == "ngram":
            raise ValueError("async_scheduling=true with speculative_config.method=ngram: vLLM drafts n-grams on "
                             "the CPU from the sampled tokens and refuses to schedule them asynchronously")
        return self

    @property
    def resolved_async_scheduling(self) -> bool:
        """`async_scheduling`, or vLLM's default: on for the v1 engine (PR #27614, late 2025; vLLM turns it
        off for options it does not support, vllm/config/vllm.py), with speculative decoding only for
        EAGLE drafts (PR #31998: ngram and draft models stay synchronous)."""
        if self.async_scheduling is not None:
            return self.async_scheduling
        spec = self.speculative_config
        return self.scheduler == "v1" and (spec is None or spec.method in ("eagle", "eagle3"))

    def unread_settings(self, model: ModelSpec | None = None) -> dict[str, str]:
        """Settings this engine never reads, by field, each with its warning line: a `slab_placement` other than
        the default beside the paged allocator, `prefix_cache: radix` with caching off, `enable_prefix_caching: true`
        given (in `model_fields_set`: v1's default is no setting) beside a slab allocator, a `swap_space` other than
        the default where no preemption swaps (vLLM v1 ignores it), (given the `model` it serves)
        `enable_expert_parallel` on a model without experts, an EAGLE drafter's `model` (kvsim prices one layer of
        the target's shape), a `gpu_memory_utilization` other than the default beside `kv_cache_memory_bytes`, and
        `enforce_eager: true` on the v0 or static scheduler (kvsim pads v1's steps only,
        `kvsim.latency.cudagraph.engine_padding`). A run warns rather than refuses: the report's studies vary the
        allocator and caching, and read them."""
        unread = {}
        if model is not None and self.enable_expert_parallel and model.moe is None:
            unread["enable_expert_parallel"] = (f"engine.enable_expert_parallel=true is unread: {model.name} is "
                                                "dense, with no experts to place")
        spec = self.speculative_config
        if spec is not None and spec.model is not None and spec.method in ("eagle", "eagle3"):
            unread["speculative_config"] = (f"engine.speculative_config.model={spec.model!r} is unread: the "
                                            f"{spec.method} head is priced as one decoder layer of the target's shape")
        # the default placement is never "given": a written scenario.yaml spells out every field (model_fields_set)
        if self.slab_placement != "buddy" and self.allocator == "paged":
            unread["slab_placement"] = (f"engine.slab_placement={self.slab_placement} is unread: the paged "
                                        "allocator places no slabs")
        if (self.allocator != "paged" and self.enable_prefix_caching
                and "enable_prefix_caching" in self.model_fields_set):
            unread["enable_prefix_caching"] = (f"engine.enable_prefix_caching=true is unread: allocator "
                                               f"{self.allocator} reserves a slab per request and caches no prefix")
        if self.prefix_cache == "radix" and not self.enable_prefix_caching:
            unread["prefix_cache"] = ("engine.prefix_cache=radix is unread: enable_prefix_caching is false, so no "
                                      "prefix is cached")
        if self.kv_cache_memory_bytes is not None and \
                self.gpu_memory_utilization != type(self).model_fields["gpu_memory_utilization"].default:
            unread["gpu_memory_utilization"] = (f"engine.gpu_memory_utilization={self.gpu_memory_utilization:g} is "
                                                "unread: kv_cache_memory_bytes sizes the KV pool, as in vLLM")
        if self.swap_space != SWAP_SPACE_GIB and self.never_swaps is not None:
            unread["swap_space"] = f"engine.swap_space={self.swap_space:g} is unread: {self.never_swaps}"
        if self.enforce_eager and self.scheduler != "v1":
            unread["enforce_eager"] = ("engine.enforce_eager=true is unread: kvsim pads steps to CUDA-graph sizes "
                                       f"for scheduler v1 only (got {self.scheduler})")
        return unread

    @model_validator(mode="after")
    def _block_size_vllm_accepts(self) -> EngineConfig:
        if self.block_size not in VLLM_BLOCK_SIZES:  # vllm/config/cache.py: BlockSize = Literal[...]
            raise ValueError(f"block_size={self.block_size}: vLLM accepts {', '.join(map(str, VLLM_BLOCK_SIZES))}")
        return self

    @model_validator(mode="after")
    def _swap_needs_v0(self) -> EngineConfig:
        if self.preemption_mode == "swap" and self.scheduler != "v0":
            raise ValueError(f"preemption_mode=swap needs scheduler v0 ({self.scheduler} preempts by recompute, "
                             "as vLLM v1 does)")
        return self

    def resolved_max_model_len(self, model: ModelSpec) -> int:
        """`max_model_len`, defaulting to the model's; longer than the model allows is an error."""
        if self.max_model_len is None:
            return model.max_position_embeddings
        if self.max_model_len > model.max_position_embeddings:
            raise KvsimError(f"max_model_len={self.max_model_len}: exceeds {model.name}'s "
                             f"max_position_embeddings={model.max_position_embeddings}")
        return self.max_model_len

    def resolved_max_num_seqs(self, gpu: GPUSpec) -> int:
        """`max_num_seqs`, or vLLM's default: for v1 the usage context's and GPU's (see `batch_defaults`), for
        v0 256 on every GPU (vllm/engine/arg_utils.py, `EngineArgs._set_default_args_v0`)."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        if self.scheduler == "v0":
            return 256
        return batch_defaults(gpu.memory_bytes, gpu.name, self.usage_context)[1]

    def resolved_max_num_batched_tokens(self, max_model_len: int, gpu: GPUSpec) -> int:
        """`max_num_batched_tokens`, or vLLM's default: the usage-context default for the GPU with
        chunked prefill (scheduler v1), `max(max_model_len, 2048)` without it (v0, static)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if self.scheduler == "v1":
            return batch_defaults(gpu.memory_bytes, gpu.name, self.usage_context)[0]
        return max(max_model_len, 2048)

    def check_vllm_startup(self, max_model_len: int, gpu: GPUSpec) -> None:
        """Refuse what vLLM refuses at startup, with vLLM's reason (vllm/config/scheduler.py,
        `SchedulerConfig.verify_max_model_len`): without chunked prefill (kvsim's v0 and static) a prompt
        must fit in one step's token budget, and every step must hold one token of each of `max_num_seqs`."""
        tokens, seqs = self.resolved_max_num_batched_tokens(max_model_len, gpu), self.resolved_max_num_seqs(gpu)
        if self.speculative_config is not None:
            self.speculative_config.check_max_model_len(max_model_len)
        if tokens < max_model_len and self.scheduler != "v1":
            raise KvsimError(
                f"engine.max_num_batched_tokens={tokens}: vLLM refuses this without chunked prefill "
                f"(scheduler {self.scheduler}): max_num_batched_tokens ({tokens}) is smaller than max_model_len "
                f"({max_model_len}); increase max_num_batched_tokens or decrease max_model_len")
        if tokens < seqs:
            raise KvsimError(
                f"engine.max_num_batched_tokens={tokens}: vLLM refuses this: max_num_batched_tokens ({tokens}) "
                f"must be greater than or equal to max_num_seqs ({seqs})")

    @property
    def num_null_blocks(self) -> int:
        """Blocks of the pool no sequence can hold: vLLM v1's null block (block 0 of its `BlockPool`) in a paged
        pool. vLLM v0's block manager hands out every one of `num_gpu_blocks` (vllm/core/block/
        cpu_gpu_block_allocator.py, `CpuGpuBlockAllocator.create`), and slab pools, the paper's Orca, have none.
        The static scheduler is a batching policy, no vLLM engine's: it runs over v1's paged pool, null block
        included, so that it differs from v1 by its batching alone."""
        return 1 if self.allocator == "paged" and self.scheduler != "v0" else 0

    @property
    def has_offload_tier(self) -> bool:
        """Whether `kv_offload` gives a CPU tier (a size of 0 bytes or 0 blocks is no tier: `make_offload`), where
        a prompt finds the prefix blocks an earlier one stored, with prefix caching on or off."""
        offload = self.kv_offload
        return offload is not None and bool(offload.cpu_bytes or offload.num_cpu_blocks)

    @property
    def can_swap(self) -> bool:
        """Whether a preemption can swap KV out to the CPU (into `swap_space`): in vLLM v0 only, not under
        preemption_mode=recompute (v1 and static preempt by recompute). Unset, v0 swaps only a request of several
        sequences (`V0Scheduler.use_swap`); the pool (`capacity.swap_bytes`) exists wherever this holds."""
        return self.scheduler == "v0" and self.preemption_mode != "recompute"

    @property
    def never_swaps(self) -> str | None:
        """Why no preemption of this engine swaps (`can_swap` false: "scheduler v1 never swaps"); None where one
        may, for a warning that a swap setting is unread."""
        if self.can_swap:
            return None
        return f"{'preemption_mode=recompute' if self.scheduler == 'v0' else f'scheduler {self.scheduler}'} never swaps"

    @property
    def resolved_watermark(self) -> float:
        return self.watermark if self.watermark is not None else 0.01 if self.scheduler == "v0" else 0.0

    @property
    def kv_dtype_bytes_override(self) -> int | None:
        """Bytes per KV element when the dtype is explicit; None for `auto` (the model's dtype)."""
        return None if self.kv_cache_dtype == "auto" else DTYPE_BYTES[self.kv_cache_dtype]


def make_engine(prefix: str = "", **fields: Any) -> EngineConfig:
    """Validate engine fields (dropping those left as None) with one-line errors, each field named under `prefix`
    (`kvsim capacity` gives "engine", so that its `engine.data_parallel_size=0` reads as `kvsim run`'s)."""
    try:
        return EngineConfig(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as error:
        raise from_validation_error(error, prefix=prefix, model=EngineConfig) from None
