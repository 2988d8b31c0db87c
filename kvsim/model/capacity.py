"""Closed-form KV capacity: the arithmetic a planner does before any simulation.

All functions are pure. Sizes are per tensor-parallel shard (one GPU), as vLLM sizes them.

    bytes_per_token = 2 (K and V) · num_layers · max(1, num_kv_heads // tp) · head_dim · dtype_bytes
    bytes_per_block = bytes_per_token · block_size
    kv_pool_bytes   = memory · gpu_memory_utilization − weights − activation peak − non-torch
    num_gpu_blocks  = floor(kv_pool_bytes / bytes_per_block)

With an EAGLE or EAGLE-3 drafter (`engine.speculative_config`) `num_layers` counts the head's decoder layer
too and `weights` the head's (`kvsim.model.drafter`), as vLLM v1 sizes the pool it shares with the target; a
draft model's layers add a page of their own shape to every block and its weights to `weights`.

The table `kvsim capacity` prints from these is `kvsim.model.capacity_plan`'s. The simulation (`kvsim run`)
shows how far real lengths sit from these worst cases.
"""

from __future__ import annotations

import math
from fractions import Fraction

from kvsim.model.config import GPUSpec
from kvsim.model.drafter import draft_model, drafter_weights_bytes
from kvsim.model.engine_config import EngineConfig
from kvsim.model.errors import KvsimError
from kvsim.model.kv_layout import KVLayout, kv_layout
from kvsim.model.spec import DTYPE_BYTES, ModelSpec
from kvsim.model.units import ceil_div
from kvsim.model.weights import weights_bytes

GIB = 2**30


def kv_dtype_bytes(model: ModelSpec, engine: EngineConfig) -> int:
    """Bytes of one KV element: the model's dtype for `auto`, 1 for any fp8 flavour."""
    return engine.kv_dtype_bytes_override or model.dtype_bytes


def model_kv_layout(model: ModelSpec, engine: EngineConfig) -> KVLayout:
    """The model's KV groups and page bytes on one GPU (`kvsim.model.kv_layout`)."""
    return kv_layout(model, engine, kv_dtype_bytes(model, engine), draft_model(model, engine.speculative_config))


def kv_bytes_per_token(model: ModelSpec, engine: EngineConfig) -> int:
    """KV bytes of one token in every layer: `2 · layers · max(1, kv_heads // tp) · head_dim · dtype_bytes`.

    OPT-13B fp16: 2 · 40 · 40 · 128 · 2 = 819,200 B (800 KiB); Llama-3.1-8B bf16:
    2 · 32 · 8 · 128 · 2 = 131,072 B (128 KiB). MLA: `layers · (kv_lora_rank + qk_rope_head_dim)
    · dtype_bytes`, whatever the TP. Sliding-window layers hold a token only while it is in
    their window (`kvsim.model.kv_layout`).
    """
    return model_kv_layout(model, engine).bytes_per_token


def kv_bytes_per_block(model: ModelSpec, engine: EngineConfig) -> int:
    """Memory behind one block id: `bytes_per_token · block_size` for a model with one KV group;
    a page in each of `group_size` layers for a hybrid model (`KVLayout.bytes_per_block`)."""
    return model_kv_layout(model, engine).bytes_per_block


def engine_weights_bytes(model: ModelSpec, engine: EngineConfig) -> int:
    """`weights_bytes` on one GPU of the engine, plus its drafter's (`drafter_weights_bytes`: an EAGLE head or a
    draft model, loaded before the KV pool is sized). With data parallelism an MoE model's experts are
    spread over tp · dp GPUs, as whole experts with `enable_expert_parallel` (every engine's pool is
    sized by the GPU holding the most, ⌈E / (tp · dp)⌉: the others hold at most one expert less per
    MoE layer), as tensor-parallel shards without it (vLLM's MoE layers then form one TP group of
    dp · tp GPUs: docs, data_parallel_deployment); the other weights are copied in every DP engine."""
    return weights_bytes(model, engine.tensor_parallel_size, engine.data_parallel_size,
                         whole_experts=engine.enable_expert_parallel) \
        + drafter_weights_bytes(model, engine.speculative_config, engine.tensor_parallel_size)


def mlp_width(model: ModelSpec) -> int:
    """Intermediate values one token's MLP produces: `intermediate_size` for a dense layer;
    `top_k · expert_intermediate + shared` for an MoE layer (the fused-MoE kernel's buffers)."""
    if model.moe is None:
        return model.intermediate_size
    moe = model.moe
    width = moe.num_experts_per_tok * moe.expert_intermediate_size + moe.shared_expert_intermediate_size
    dense = model.intermediate_size if moe.num_moe_layers < model.num_layers else 0
    return max(width, dense)


def activation_peak_bytes(model: ModelSpec, gpu: GPUSpec, engine: EngineConfig, max_model_len: int) -> int:
    """Peak activation memory of vLLM's profiling forward pass (an estimate).

    Assumption: vLLM profiles one forward of `max_num_batched_tokens` tokens (T); the peak is
    inside one layer's MLP, where the gate/up output (2 · I / tp), the activated product
    (I / tp; I = `mlp_width`, the top-k experts' widths for an MoE layer) and about four
    hidden-sized buffers (residual, norm output, attention output, projections: 4 · H) are
    live at once, plus fp32 logits for the sampled positions (min(T, max_num_seqs) · vocab · 4 B):

        T · (3 · I / tp + 4 · H) · dtype_bytes + min(T, max_num_seqs) · vocab · 4
    """
    tokens = engine.resolved_max_num_batched_tokens(max_model_len, gpu)
    tp = engine.tensor_parallel_size
    per_token = (3 * mlp_width(model) // tp + 4 * model.hidden_size) * model.dtype_bytes
    logits = min(tokens, engine.resolved_max_num_seqs(gpu)) * model.vocab_size * DTYPE_BYTES["float32"]
    return tokens * per_token + logits


def check_parallel(model: ModelSpec, engine: EngineConfig) -> None:
    """Tensor parallelism vLLM can shard: the heads split evenly over the GPUs.

    vllm/config/model.py `verify_with_parallel_config`: attention heads divisible by TP;
    vllm/model_executor/layers/linear.py `QKVParallelLinear`: KV heads divisible by TP, or TP
    divisible by the KV heads (each KV head then replicated on TP / kv_heads GPUs).
    """
    tp, heads, kv_heads = engine.tensor_parallel_size, model.num_attention_heads, model.num_kv_heads
    if heads % tp:
        raise KvsimError(f"tensor_parallel_size={tp}: must divide {model.name}'s {heads} attention heads")
    if (kv_heads % tp) if kv_heads >= tp else (tp % kv_heads):
        raise KvsimError(f"tensor_parallel_size={tp}: {model.name}'s {kv_heads} KV heads cannot be split "
                         "or replicated evenly over it")


def kv_pool_bytes(model: ModelSpec, gpu: GPUSpec, engine: EngineConfig, *, layout: KVLayout | None = None,
                  max_model_len: int | None = None) -> int:
    """Bytes of the KV cache on one GPU: the estimate below, `kv_cache_memory_bytes`, or
    `num_gpu_blocks_override · bytes_per_block` (so the pool always matches the blocks used).
    `layout` and `max_model_len`: the engine's `model_kv_layout` and `resolved_max_model_len` where
    the caller has them already (`kvsim.engine.builder.resolve_engine`); derived here otherwise.

    Raises `KvsimError` saying how many bytes are missing when the weights (per shard) do
    not fit in `memory · gpu_memory_utilization`, nothing is left for KV after them, or a
    given pool does not fit in the GPU's memory beside the weights. A `kv_cache_memory_bytes` pool is sized
    without `gpu_memory_utilization`, as vLLM's `Worker.determine_available_memory` returns it before any
    budget ("This does not respect the gpu_memory_utilization config"): weights over that budget are then
    refused only where they exceed the GPU's memory (named by the model, the pool being none of it), or they and
    the pool do.
    """
    check_parallel(model, engine)
    budget = int(gpu.memory_bytes * engine.gpu_memory_utilization)
    weights = engine_weights_bytes(model, engine)
    # a given pool is sized before any budget: the weights must then fit the GPU's memory alone
    limit, at = ((budget, f" at gpu_memory_utilization={engine.gpu_memory_utilization}")
                 if engine.kv_cache_memory_bytes is None else (gpu.memory_bytes, ""))
    if weights > limit:
        spec, drafter = engine.speculative_config, weights - engine_weights_bytes(model, engine.model_copy(
            update={"speculative_config": None}))  # a drafter too large was blamed on the target alone
        whose = f"model={model.name}" if not drafter or spec is None else (
            f"model={model.name} with engine.speculative_config (method={spec.method}"
            f"{'' if spec.model is None else f', model={spec.model}'}: {drafter:,} B of the weights)")
        raise KvsimError(
            f"{whose}: weights need {weights:,} B per GPU (tensor_parallel_size="
            f"{engine.tensor_parallel_size}) but {gpu.name}{at} gives {limit:,} B; {weights - limit:,} B missing"
        )
    given = None
    if engine.num_gpu_blocks_override is not None:
        given = ("num_gpu_blocks_override", engine.num_gpu_blocks_override,
                 engine.num_gpu_blocks_override
                 * (layout if layout is not None else model_kv_layout(model, engine)).bytes_per_block)
    elif engine.kv_cache_memory_bytes is not None:
        given = ("kv_cache_memory_bytes", engine.kv_cache_memory_bytes, engine.kv_cache_memory_bytes)
    if given is not None:
        name, value, pool_bytes = given
        if pool_bytes + weights > gpu.memory_bytes:
            raise KvsimError(f"{name}={value}: a KV pool of {pool_bytes / GIB:,.2f} GiB plus {weights / GIB:,.2f} "
                             f"GiB of weights exceeds {gpu.name}'s {gpu.memory_bytes / GIB:,.2f} GiB")
        return pool_bytes
    if max_model_len is None:
        max_model_len = engine.resolved_max_model_len(model)
    activations = activation_peak_bytes(model, gpu, engine, max_model_len)
    pool = budget - weights - activations - engine.non_torch_memory_bytes
    if pool <= 0:  # the weights fit (above): the field behind the larger of the other two parts is named
        tokens = engine.resolved_max_num_batched_tokens(max_model_len, gpu)
        field = (f"engine.max_num_batched_tokens={tokens}" if activations >= engine.non_torch_memory_bytes
                 else f"engine.non_torch_memory_bytes={engine.non_torch_memory_bytes}")
        raise KvsimError(
            f"{field}: no memory left for KV cache of {model.name} on {gpu.name} (weights {weights:,} B + "
            f"activations of a {tokens:,}-token forward {activations:,} B + non-torch "
            f"{engine.non_torch_memory_bytes:,} B exceed the budget of {budget:,} B by {-pool:,} B)"
        )
    return pool


def num_gpu_blocks(model: ModelSpec, gpu: GPUSpec, engine: EngineConfig, *, layout: KVLayout | None = None,
                   max_model_len: int | None = None) -> int:
    """`floor(kv_pool_bytes / bytes_per_block)` (`num_gpu_blocks_override` when given); `layout` and
    `max_model_len` as for `kv_pool_bytes`.

    Like vLLM's startup check (vllm/v1/core/kv_cache_utils.py `get_kv_cache_configs`, which folds
    `num_gpu_blocks_override` into the memory it checks), a pool that cannot hold one request of
    `max_model_len` tokens is an error: vLLM refuses to start. The blocks counted are those a request can
    hold, less v1's null block (`EngineConfig.num_null_blocks`), as vLLM plans since PR #47272 ("Reserve the
    null block BlockPool permanently holds back", August 2026); before it a pool of exactly `max_model_len`'s
    blocks started and then served no request that long (0 tok/s); v0's check counts every block
    (`raise_if_cache_size_invalid`).
    """
    if layout is None:
        layout = model_kv_layout(model, engine)
    pool = kv_pool_bytes(model, gpu, engine, layout=layout, max_model_len=max_model_len)  # checks the weights fit
    per_block = layout.bytes_per_block
    blocks = layout.num_blocks(pool)
    if blocks == 0:  # named by the setting that sized the pool
        given = (f"engine.kv_cache_memory_bytes={engine.kv_cache_memory_bytes:,}"
                 if engine.kv_cache_memory_bytes is not None and engine.num_gpu_blocks_override is None
                 else f"engine.gpu_memory_utilization={engine.gpu_memory_utilization}")
        raise KvsimError(f"{given}: a KV pool of {pool:,} B holds no block of {per_block:,} B")
    if max_model_len is None:
        max_model_len = engine.resolved_max_model_len(model)
    needed = layout.blocks_per_request(max_model_len, engine.resolved_max_num_batched_tokens(max_model_len, gpu))
    if blocks - engine.num_null_blocks < needed:
        null = ", one of them v1's null block, which no request holds" if blocks >= needed else ""
        raise KvsimError(f"max_model_len={max_model_len}: one request needs {needed * per_block / GIB:.2f} GiB of "
                         f"KV cache, the pool holds {pool / GIB:.2f} GiB ({blocks:,} "
                         f"{'block' if blocks == 1 else 'blocks'}{null}); decrease "
                         "max_model_len or give the KV cache more memory")
    return blocks


def vllm_max_concurrency(num_blocks: int, max_model_len: int, block_size: int, scheduler: str = "v1") -> float:
    """vLLM's startup log line "Maximum concurrency for N tokens per request", every request assumed to
    reach max_model_len: v1's `num_blocks / cdiv(max_model_len, block_size)`, v0's
    `num_blocks · block_size / max_model_len` (`KVLayout.max_concurrency`).
    """
    if scheduler == "v0":
        return num_blocks * block_size / max_model_len
    return num_blocks / ceil_div(max_model_len, block_size)


def model_max_concurrency(model: ModelSpec, gpu: GPUSpec, engine: EngineConfig, num_blocks: int,
                          max_model_len: int) -> float:
    """vLLM's "maximum concurrency" for any model, as `engine.scheduler`'s vLLM logs it: v1's
    `num_blocks / Σ_groups max blocks per request`, v0's `num_blocks · block_size / max_model_len`
    (`KVLayout.max_concurrency`); `vllm_max_concurrency` when the model has one full-attention group."""
    mnbt = engine.resolved_max_num_batched_tokens(max_model_len, gpu)
    return model_kv_layout(model, engine).max_concurrency(num_blocks, max_model_len, mnbt, engine.scheduler)


def paged_seqs(layout: KVLayout, num_blocks: int, context_len: int, max_num_batched_tokens: int, *,
               num_null_blocks: int, hit_blocks: int = 0) -> Fraction:
    """Sequences of `context_len` tokens resident at once with paging, every KV group counted, before rounding
    down (`paged_max_seqs` rounds; the report's formula fits a constant to it as it is). Each is admitted as the
    others decode: the last one admitted holds `prefill = layout.prefill_blocks(ctx, mnbt)` while its prompt is
    computed, each other one `decode = layout.decode_blocks(ctx)`, so over `usable = num_blocks − null` blocks
    (`num_null_blocks`: those no sequence can hold, `EngineConfig.num_null_blocks`, vLLM v1's block 0)

        1 + (usable − shared − prefill) / decode        (0 when one prefill does not fit)

    `hit_blocks`: the first blocks of every sequence, a prefix they all share (`shared_full_blocks`): `shared =
    layout.shared_blocks(...)` of them are held once, and `prefill` and `decode` count each sequence's own
    blocks beyond them (with none shared, shared = 0). With full attention only, prefill = decode =
    cdiv(ctx, bs) − hit and this is `(usable − hit) / (cdiv(ctx, bs) − hit)`:
    10,000 blocks of 16 tokens at 4,096 tokens, v1: 9,999 / 256 = 39.06. A sliding window's prompt holds every
    block of its last chunk until the step ends (gemma-3-27b at 8,192 tokens, 15,409 usable blocks: 7 groups ×
    512 while prefilling, 512 + 6 × 65 = 902 decoding: 1 + 11,825 / 902 = 14.11 sequences, where 15,409 / 896,
    its live blocks at exactly 8,192 tokens, said 17.2, and 15,409 / cdiv(8,192, 16) = 30.1, as if every layer
    were full attention)."""
    usable = num_blocks - num_null_blocks
    shared = layout.shared_blocks(context_len, max_num_batched_tokens, hit_blocks) if hit_blocks else 0
    decode = layout.decode_blocks(context_len, hit_blocks)
    prefill = layout.prefill_blocks(context_len, max_num_batched_tokens, hit_blocks)
    return 1 + Fraction(usable - shared - prefill, decode) if usable >= shared + prefill else Fraction(0)


def paged_max_seqs(layout: KVLayout, num_blocks: int, context_len: int, max_num_batched_tokens: int, *,
                   num_null_blocks: int, hit_blocks: int = 0) -> int:
    """Whole sequences of `context_len` tokens that fit with paging: `paged_seqs` rounded down, so
    `floor((num_blocks − null) / cdiv(ctx, bs))` with full attention only and nothing shared (10,000 blocks of 16
    tokens at 4,096 tokens: 9,999 // 256 = 39; 10,240 blocks: 39 in v1, 10,239 usable, 40 in v0)."""
    return math.floor(paged_seqs(layout, num_blocks, context_len, max_num_batched_tokens,
                                 num_null_blocks=num_null_blocks, hit_blocks=hit_blocks))


def slab_max_seqs(num_token_slots: int, max_model_len: int) -> int:
    """Sequences that fit when each reserves a contiguous `max_model_len` slab, whatever its length."""
    return num_token_slots // max_model_len


def shared_prefix_blocks(
    num_sequences: int, context_len: int, shared_prefix_tokens: int, block_size: int
) -> tuple[int, int]:
    """Blocks for N sequences of `context_len` tokens whose first P tokens are identical.

    Returns (without sharing, with sharing). Only the prefix's full blocks a prefix hit can cover are
    shared (`shared_full_blocks`, stored once); each sequence keeps its own copy of the rest, including
    the partial block where the prefix ends:

        without = N · cdiv(ctx, bs)
        with    = S + N · (cdiv(ctx, bs) − S),   S = shared_full_blocks(ctx, P, bs)
    """
    assert shared_prefix_tokens <= context_len
    per_seq = ceil_div(context_len, block_size)
    shared = shared_full_blocks(context_len, shared_prefix_tokens, block_size)
    return num_sequences * per_seq, shared + num_sequences * (per_seq - shared)


def shared_full_blocks(context_len: int, prefix_tokens: int, block_size: int) -> int:
    """Blocks of a `context_len`-token sequence a prefix hit on its first `prefix_tokens` tokens covers:
    `min(P, ctx − 1) // bs`. Only full blocks hit, and a hit stops one token short of the sequence (vLLM v1's
    `max_cache_hit_length = num_tokens − 1`: the last token's logits are computed), so a sequence that is
    all prefix, ending on a block boundary, recomputes and holds its own last block (64 tokens of a 64-token
    prefix, blocks of 16: 3 shared blocks, 1 its own)."""
    return min(prefix_tokens, context_len - 1) // block_size


def swap_bytes(engine: EngineConfig) -> int:
    """The CPU swap space a preemption can use, in bytes: `swap_space` GiB where preemption can swap
    (`EngineConfig.can_swap`: vLLM v0 outside preemption_mode=recompute), else 0 (v1 and static never swap: no
    pool is built that nothing uses)."""
    return int(engine.swap_space * 2**30) if engine.can_swap else 0
