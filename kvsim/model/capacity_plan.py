"""What `kvsim capacity` reports: the concurrency table of one model, GPU and engine (`plan_capacity`), built from
the closed forms of `kvsim.model.capacity` (the pool, its blocks, the sequences that fit), with fp8 KV, drafts
and a shared prefix beside them, and the KV of each attention type.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from kvsim.model.capacity import (
    activation_peak_bytes,
    engine_weights_bytes,
    kv_pool_bytes,
    model_kv_layout,
    num_gpu_blocks,
    paged_max_seqs,
    shared_full_blocks,
    slab_max_seqs,
)
from kvsim.model.config import GPUSpec
from kvsim.model.engine_config import EngineConfig
from kvsim.model.errors import KvsimError
from kvsim.model.kv_layout import KVLayout
from kvsim.model.spec import ModelSpec
from kvsim.model.weights import active_params_per_token


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """One context length: how many sequences of that length fit (0 if above max_model_len).

    `blocks_per_seq` is what a sequence of about that many tokens holds in every KV group together while it
    decodes (`KVLayout.decode_blocks`); sliding-window and chunked groups hold only the blocks their window still
    covers. `prefill_blocks_per_seq` (models with such groups only) is what it holds while its prompt's last
    chunk is computed (`KVLayout.prefill_blocks`); `paged_max_seqs` counts the sequences resident when each is
    admitted beside the others (`paged_max_seqs`).
    """

    context_len: int
    blocks_per_seq: int
    paged_max_seqs: int
    slab_max_seqs: int
    paged_max_seqs_fp8: int
    shared_prefix_max_seqs: int | None = None
    blocks_per_seq_with_drafts: int | None = None  # with engine.speculative_config: + K drafts + lookahead
    paged_max_seqs_with_drafts: int | None = None
    shared_prefix_blocks_without_sharing: int | None = None
    shared_prefix_blocks_with_sharing: int | None = None
    prefill_blocks_per_seq: int | None = None


@dataclass(frozen=True, slots=True)
class KVTypeRow:
    """The KV of one attention type: layers, groups, and what one request at max_model_len holds."""

    attention: str
    num_layers: int
    num_groups: int
    window_tokens: int | None
    bytes_per_token_per_layer: int
    max_blocks_per_request: int
    max_bytes_per_request: int


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """Everything `kvsim capacity` reports, for one model, GPU and engine configuration."""

    model: str
    model_type: str
    gpu: str
    kv_cache_dtype: str
    block_size: int
    max_model_len: int
    bytes_per_token: int
    bytes_per_block: int
    num_kv_groups: int
    layers_per_kv_group: int
    num_params: int
    active_params_per_token: int
    weights_bytes: int
    activation_peak_bytes: int
    kv_pool_bytes: int
    num_gpu_blocks: int
    num_token_slots: int
    max_concurrency: float
    num_gpu_blocks_fp8: int
    max_concurrency_fp8: float
    shared_prefix_tokens: int
    num_sequences: int
    kv_types: list[KVTypeRow] = field(default_factory=list)
    rows: list[CapacityRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_type_rows(layout: KVLayout, max_model_len: int, max_num_batched_tokens: int) -> list[KVTypeRow]:
    """Per attention type: its groups summed (padding layers are counted in `group_size`, not here). A draft
    model's layers count in the one group they share with the target (`kv_layout` allows no other), whose
    `bytes_per_token_per_layer` stays the target's page (`max_bytes_per_request` holds the draft's pages too)."""
    rows: dict[str, KVTypeRow] = {}
    assert not layout.draft_num_layers or len(layout.groups) == 1
    for g in layout.groups:
        blocks = g.max_blocks_per_request(max_model_len, max_num_batched_tokens, layout.block_size)
        old = rows.get(g.kind)
        rows[g.kind] = KVTypeRow(
            attention=g.kind,
            num_layers=g.num_layers + layout.draft_num_layers + (old.num_layers if old else 0),
            num_groups=1 + (old.num_groups if old else 0),
            window_tokens=g.window_tokens,
            bytes_per_token_per_layer=layout.bytes_per_token_per_layer,
            max_blocks_per_request=blocks + (old.max_blocks_per_request if old else 0),
            max_bytes_per_request=blocks * layout.bytes_per_block + (old.max_bytes_per_request if old else 0),
        )
    return list(rows.values())


def _hit_blocks(layout: KVLayout, ctx: int, prefix_tokens: int, drops_last_hit_block: bool) -> int:
    """The first blocks of a sequence of `ctx` tokens a prefix hit on its first P tokens covers
    (`shared_full_blocks`); with EAGLE (`drops_last_hit_block`) the hit gives its last block back, which each
    sequence recomputes into a block of its own."""
    hit_blocks = shared_full_blocks(ctx, prefix_tokens, layout.block_size)
    return hit_blocks - 1 if drops_last_hit_block and hit_blocks else hit_blocks


def plan_capacity(
    model: ModelSpec,
    gpu: GPUSpec,
    engine: EngineConfig,
    context_lengths: list[int],
    shared_prefix_tokens: int = 0,
    num_sequences: int = 0,
) -> CapacityPlan:
    """The concurrency table and the headline numbers, including fp8 KV and prefix sharing.

    The fp8 column re-sizes the pool with `kv_cache_dtype=fp8` (same memory, half the bytes
    per block for 16-bit models; `num_gpu_blocks_override` pins the block count for both).
    With `engine.speculative_config` (K drafts), a sequence of that length also holds the K drafts its
    verify step computes and vLLM's `num_lookahead_tokens` (K for EAGLE and draft models, 0 for n-gram),
    capped at max_model_len, as vLLM v1's `allocate_slots` reserves them: `*_with_drafts` columns.
    Shared-prefix columns (when P > 0) assume `num_sequences` sequences of each context
    length sharing the first P tokens (`shared_prefix_blocks`), and the most such sequences
    that fit: `paged_max_seqs` with the prefix's hit blocks (`shared_full_blocks`) held once, counted as every
    other column is (each group's blocks, the last sequence prefilling beside the others decoding), so
    `floor((num_blocks − null − shared) / own)` with full attention only. With `engine.speculative_config`
    they are speculating sequences, as the simulated engine runs them: each holds its drafts and lookahead
    (as `*_with_drafts`), and EAGLE's prefix hit gives its last block back (vLLM's `use_eagle`), one shared
    block fewer and one more of each sequence's own. Every count of sequences
    leaves out the null block vLLM v1 keeps back from its pool (`EngineConfig.num_null_blocks`), as the
    simulated engine does; `num_gpu_blocks`, the token slots and vLLM's "maximum concurrency" count it,
    as vLLM's startup lines do.
    """
    if any(c <= 0 for c in context_lengths):
        raise KvsimError(f"context_lengths={context_lengths}: every length must be positive")
    if shared_prefix_tokens < 0 or num_sequences < 0:
        raise KvsimError(
            f"shared_prefix_tokens={shared_prefix_tokens}, num_sequences={num_sequences}: must be >= 0"
        )
    if shared_prefix_tokens and num_sequences == 0:
        raise KvsimError(f"num_sequences=0: must be > 0 to share a prefix of {shared_prefix_tokens} tokens")
    bs = engine.block_size
    max_model_len = engine.resolved_max_model_len(model)
    engine.check_vllm_startup(max_model_len, gpu)  # a table for an engine vLLM refuses to start describes none
    if shared_prefix_tokens and not any(shared_prefix_tokens <= c <= max_model_len for c in context_lengths):
        raise KvsimError(f"shared_prefix_tokens={shared_prefix_tokens}: no context length in {context_lengths} "
                         f"holds it within max_model_len {max_model_len}, so no row could show the sharing")
    mnbt = engine.resolved_max_num_batched_tokens(max_model_len, gpu)
    layout = model_kv_layout(model, engine)
    blocks = num_gpu_blocks(model, gpu, engine)
    fp8 = engine.model_copy(update={"kv_cache_dtype": "fp8"})
    blocks_fp8 = num_gpu_blocks(model, gpu, fp8)
    slots = layout.token_slots(blocks)
    fit = partial(paged_max_seqs, layout, max_num_batched_tokens=mnbt, num_null_blocks=engine.num_null_blocks)
    spec = engine.speculative_config
    extra = 0 if spec is None else spec.num_speculative_tokens + spec.num_lookahead_tokens
    windowed = any(g.window_tokens is not None for g in layout.groups)
    rows = []
    for ctx in sorted(set(context_lengths)):
        servable = ctx <= max_model_len
        per_seq, prefill = layout.decode_blocks(ctx), layout.prefill_blocks(ctx, mnbt)
        held = min(ctx + extra, max_model_len) if servable else ctx + extra  # with drafts: vLLM caps them there
        row: dict[str, Any] = {
            "context_len": ctx,
            "blocks_per_seq": per_seq,
            "paged_max_seqs": fit(blocks, ctx) if servable else 0,
            "slab_max_seqs": slab_max_seqs(slots, max_model_len) if servable else 0,
            "paged_max_seqs_fp8": fit(blocks_fp8, ctx) if servable else 0,  # fp8 changes pages, not groups
        }
        if windowed:
            row["prefill_blocks_per_seq"] = prefill
        if spec is not None:  # a verify step holds K drafts and vLLM's lookahead more
            capped = min(ctx + extra, max_model_len)
            row |= {"blocks_per_seq_with_drafts": layout.decode_blocks(capped),
                    "paged_max_seqs_with_drafts": fit(blocks, capped) if servable else 0}
        if shared_prefix_tokens and ctx >= shared_prefix_tokens:
            hit = _hit_blocks(layout, ctx, shared_prefix_tokens, spec is not None and spec.drops_last_hit_block)
            live, own = layout.live_blocks(held), layout.live_blocks(held, hit)
            row |= {
                "shared_prefix_max_seqs": fit(blocks, held, hit_blocks=hit) if servable else 0,
                "shared_prefix_blocks_without_sharing": num_sequences * live,
                "shared_prefix_blocks_with_sharing": live - own + num_sequences * own,
            }
        rows.append(CapacityRow(**row))
    assert model.num_params is not None
    return CapacityPlan(
        model=model.name,
        model_type=model.model_type,
        gpu=gpu.name,
        kv_cache_dtype=engine.kv_cache_dtype,
        block_size=bs,
        max_model_len=max_model_len,
        bytes_per_token=layout.bytes_per_token,
        bytes_per_block=layout.bytes_per_block,
        num_kv_groups=len(layout.groups),
        layers_per_kv_group=layout.layers_per_group,
        num_params=model.num_params,
        active_params_per_token=active_params_per_token(model),
        weights_bytes=engine_weights_bytes(model, engine),
        activation_peak_bytes=activation_peak_bytes(model, gpu, engine, max_model_len),
        kv_pool_bytes=kv_pool_bytes(model, gpu, engine),
        num_gpu_blocks=blocks,
        num_token_slots=slots,
        max_concurrency=layout.max_concurrency(blocks, max_model_len, mnbt, engine.scheduler),
        num_gpu_blocks_fp8=blocks_fp8,
        max_concurrency_fp8=model_kv_layout(model, fp8).max_concurrency(blocks_fp8, max_model_len, mnbt,
                                                                        engine.scheduler),
        shared_prefix_tokens=shared_prefix_tokens,
        num_sequences=num_sequences,
        kv_types=kv_type_rows(layout, max_model_len, mnbt),
        rows=rows,
    )
