"""How a model's KV cache is laid out in one pool, as vLLM v1 lays it out.

Each layer has a KV spec (vllm/v1/kv_cache_interface.py):

    full attention   page = 2 · block_size · max(1, kv_heads // tp) · head_dim · dtype  (FullAttentionSpec)
    MLA              page = block_size · (kv_lora_rank + qk_rope_head_dim) · dtype     (MLAAttentionSpec:
                     one latent, num_kv_heads = 1, no separate K and V, the same on every TP rank)
    sliding window   full's page; a request needs at most
                     cdiv(min(window − 1 + max_num_batched_tokens, max_model_len), bs) + 1 blocks
                     (SlidingWindowSpec.max_memory_usage_bytes)
    chunked local    full's page; at most cdiv(min(chunk + max_num_batched_tokens, max_model_len), bs)
                     blocks (ChunkedLocalAttentionSpec, Llama 4)

Layers are grouped as vLLM's hybrid KV cache manager groups them
(vllm/v1/core/kv_cache_utils.py, get_kv_cache_groups): one group of all layers when every layer
has the same spec; otherwise layers of each type are split into groups of `group_size` layers
(the smallest type's layer count, or the largest's when that is under 1.5× the smallest),
padding the last group of a type. Every group has its own block table per request, all groups
draw block ids from one shared pool, and one block id is one page in each of `group_size`
layer tensors, so

    bytes_per_block = page · group_size,    num_blocks = pool // page // group_size
    "maximum concurrency" = num_blocks / Σ_groups max_blocks_per_request(group)
                            (get_max_concurrency_for_kv_cache_config)

For a uniform full-attention model this is today's formula (one group of all layers).
`disable_hybrid_kv_cache_manager` turns sliding and chunked layers into full attention for
allocation (unify_hybrid_kv_cache_specs), as vLLM does, when the model mixes kinds; a model whose
every layer has one spec (Mistral-7B-v0.1: all sliding 4096) keeps it, as unify returns early then.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from kvsim.model.errors import KvsimError
from kvsim.model.units import ceil_div

if TYPE_CHECKING:
    from kvsim.model.engine_config import EngineConfig
    from kvsim.model.spec import ModelSpec

AttentionKind = Literal["full", "mla", "sliding_window", "chunked_local"]


@dataclass(frozen=True, slots=True)
class KVGroup:
    """One KV cache group: `num_layers` real layers of one kind sharing one block table per request."""

    kind: AttentionKind
    num_layers: int
    window_tokens: int | None = None  # the sliding window or the attention chunk

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens whose KV no layer of this group reads again.

        Sliding window: max(0, n − window + 1) (SlidingWindowManager.get_num_skipped_tokens);
        chunked local: the tokens before the current chunk, (n // chunk) · chunk
        (ChunkedLocalAttentionManager); full and MLA: none.
        """
        if self.kind == "sliding_window":
            assert self.window_tokens is not None
            return max(0, num_computed_tokens - self.window_tokens + 1)
        if self.kind == "chunked_local":
            assert self.window_tokens is not None
            return num_computed_tokens // self.window_tokens * self.window_tokens
        return 0

    def max_blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int, block_size: int) -> int:
        """Blocks of this group one request can hold at once (the spec's max_memory_usage_bytes / page)."""
        if self.kind == "sliding_window":
            assert self.window_tokens is not None
            tokens = min(self.window_tokens - 1 + max_num_batched_tokens, max_model_len)
            return ceil_div(tokens, block_size) + 1
        if self.kind == "chunked_local":
            assert self.window_tokens is not None
            return ceil_div(min(self.window_tokens + max_num_batched_tokens, max_model_len), block_size)
        return ceil_div(max_model_len, block_size)

    def live_block_range(self, num_tokens: int, block_size: int) -> tuple[int, int]:
        """Block indices [first, end) a sequence of `num_tokens` computed tokens still holds."""
        return self.num_skipped_tokens(num_tokens) // block_size, ceil_div(num_tokens, block_size)

    def prefill_block_range(self, num_tokens: int, max_num_batched_tokens: int, block_size: int) -> tuple[int, int]:
        """Block indices [first, end) a sequence of `num_tokens` holds while its prompt's last chunk is computed:
        the last `max_blocks_per_request` (with `num_tokens` for max_model_len) of its cdiv(num_tokens, bs)."""
        end = ceil_div(num_tokens, block_size)
        return end - min(end, self.max_blocks_per_request(num_tokens, max_num_batched_tokens, block_size)), end


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The groups of a model's layers and the bytes of their pages (per GPU)."""

    groups: tuple[KVGroup, ...]
    group_size: int  # layer tensors one block id spans (padding included)
    page_bytes: int  # one block of one layer
    block_size: int
    # a separate draft model's layers (`speculative_config.method: draft_model`), one page of its own shape each
    # behind every block id: in vLLM's one group (`UniformTypeKVCacheSpecs`) with the target's, not in `groups`
    draft_bytes_per_block: int = 0
    draft_num_layers: int = 0  # those layers: vLLM's group lists them after the target's (`layers_per_group`)

    @property
    def bytes_per_token_per_layer(self) -> int:
        return self.page_bytes // self.block_size

    @property
    def num_layers(self) -> int:
        return sum(g.num_layers for g in self.groups)

    @property
    def layers_per_group(self) -> int:
        """Layers one block id spans: `group_size` (padding included) and a draft model's layers, which vLLM's
        one group (`KVCacheGroupSpec.layer_names`) lists with the target's."""
        return self.group_size + self.draft_num_layers

    @property
    def bytes_per_block(self) -> int:
        """Memory behind one block id: a page in each of `group_size` layer tensors, and the draft model's."""
        return self.page_bytes * self.group_size + self.draft_bytes_per_block

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one token held by every layer (what a token costs while inside all windows)."""
        return self.bytes_per_token_per_layer * self.num_layers + self.draft_bytes_per_block // self.block_size

    def num_blocks(self, pool_bytes: int) -> int:
        return pool_bytes // self.bytes_per_block

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """vLLM's worst-case blocks per request: every group's maximum, summed."""
        return sum(g.max_blocks_per_request(max_model_len, max_num_batched_tokens, self.block_size)
                   for g in self.groups)

    def max_concurrency(self, num_blocks: int, max_model_len: int, max_num_batched_tokens: int,
                        scheduler: str = "v1") -> float:
        """vLLM's "Maximum concurrency for N tokens per request" as the engine `scheduler` names logs it.

        v1 (and kvsim's static baseline): whole blocks per request, `num_blocks / Σ_groups max blocks per
        request`, cdiv(max_model_len, block_size) for full attention (v1/core/kv_cache_utils.py,
        get_max_concurrency_for_kv_cache_config). v0: token slots over max_model_len, not rounded up to whole
        blocks, `num_blocks · block_size / max_model_len` (executor/executor_base.py, initialize_cache); so
        at max_model_len 4,100 and 10,000 blocks of 16, v1 logs 10,000 / 257 = 38.91x and v0 39.02x."""
        if scheduler == "v0":
            return num_blocks * self.block_size / max_model_len
        return num_blocks / self.blocks_per_request(max_model_len, max_num_batched_tokens)

    def live_blocks(self, num_tokens: int, hit_blocks: int = 0) -> int:
        """Blocks a sequence of `num_tokens` computed tokens holds, all groups together; those of its first
        `hit_blocks`, a prefix it shares with others (`kvsim.model.capacity.shared_full_blocks`), left out."""
        return sum(max(0, end - max(first, hit_blocks)) for first, end in (
            g.live_block_range(num_tokens, self.block_size) for g in self.groups))

    def _decode_lengths(self, num_tokens: int) -> range:
        return range(max(1, num_tokens - self.block_size + 1), num_tokens + 1)

    def decode_blocks(self, num_tokens: int, hit_blocks: int = 0) -> int:
        """The most blocks a sequence holds while it decodes its last block's worth of tokens, up to `num_tokens`
        (every length in (num_tokens − block_size, num_tokens]): a sliding window that does not start on a block
        boundary spans one block more than one that does (the `+ 1` of vLLM's SlidingWindowSpec
        .max_memory_usage_bytes), so a window of 1,024 tokens in blocks of 16 holds 65 blocks at every length but
        the aligned one (64); full attention holds its live blocks, cdiv(num_tokens, block_size). Those of a
        shared prefix's first `hit_blocks` are left out (`live_blocks`)."""
        return max(self.live_blocks(n, hit_blocks) for n in self._decode_lengths(num_tokens))

    def prefill_blocks(self, num_tokens: int, max_num_batched_tokens: int, hit_blocks: int = 0) -> int:
        """The most blocks a sequence of `num_tokens` holds while its prompt's last chunk is computed: per group,
        vLLM's worst case (`KVGroup.max_blocks_per_request`) with `num_tokens` for max_model_len, at most the
        sequence's own cdiv(num_tokens, block_size): a window group keeps window − 1 tokens before the chunk
        and the whole chunk (up to `max_num_batched_tokens`), dropping what slid out only after the step. With
        full attention only, the live blocks again. Those of a shared prefix's first `hit_blocks` left out."""
        return sum(max(0, end - max(first, hit_blocks)) for first, end in (
            g.prefill_block_range(num_tokens, max_num_batched_tokens, self.block_size) for g in self.groups))

    def shared_blocks(self, num_tokens: int, max_num_batched_tokens: int, hit_blocks: int) -> int:
        """The blocks of a prefix's first `hit_blocks` that sequences of `num_tokens` sharing it hold, each held
        once: per group, those from the first a sequence holds, prefilling or decoding (every such range ends
        past the prefix), up to `hit_blocks`. A sliding group whose window has moved past the prefix holds them
        only while a sequence prefills."""
        total = 0
        for g in self.groups:
            first = min([g.prefill_block_range(num_tokens, max_num_batched_tokens, self.block_size)[0]]
                        + [g.live_block_range(n, self.block_size)[0] for n in self._decode_lengths(num_tokens)])
            total += max(0, hit_blocks - first)
        return total

    @property
    def full_attention_advice(self) -> str:
        """How a refused windowed layout gets allocated as full attention, for the refusal to end with.

        A model mixing kinds: vLLM's flag. One whose layers all share a window, which the flag leaves
        sliding (`layer_kinds`): a config.json without the window, what vLLM's --disable-sliding-window
        serves (it also caps max_model_len at the window).
        """
        if len(self.groups) > 1:
            return "set engine.disable_hybrid_kv_cache_manager=true (every layer then allocated as full attention)"
        return ("give the model a config.json with sliding_window null (every layer slides, which "
                "engine.disable_hybrid_kv_cache_manager leaves as it is, as vLLM does)")

    def token_slots(self, num_blocks: int) -> int:
        """vLLM's "GPU KV cache size: N tokens": num_blocks // num_groups · block_size."""
        return num_blocks // len(self.groups) * self.block_size


def layer_kinds(model: ModelSpec, engine: EngineConfig,
                draft: ModelSpec | None = None) -> list[tuple[AttentionKind, int | None]]:
    """Each KV layer's (kind, window) as allocation sees it: the model's, then its drafter's (an EAGLE head's, or
    the `draft` model's own layers).

    A speculating engine's EAGLE head adds its decoder layer, of the target's full-attention shape (MLA for
    an MLA model), to the same pool (`SpeculativeConfig.num_draft_kv_layers`, `kvsim.model.drafter`: vLLM's
    `get_kv_cache_spec` covers every attention layer, the drafter's included). With the hybrid manager
    disabled, a pool of more than one (kind, window) is all full attention; one of a single kind keeps it
    (vllm/v1/core/kv_cache_utils.py, unify_hybrid_kv_cache_specs: it returns when `is_kv_cache_spec_uniform`),
    so an all-sliding model still frees blocks outside its window.
    """
    kinds: list[tuple[AttentionKind, int | None]] = []
    for layer_type in model.resolved_layer_types:
        if model.mla is not None:
            kinds.append(("mla", None))
        elif layer_type == "full_attention":
            kinds.append(("full", None))
        elif layer_type == "sliding_attention":
            kinds.append(("sliding_window", model.sliding_window))
        else:
            kinds.append(("chunked_local", model.attention_chunk_size))
    head_kind: AttentionKind = "mla" if model.mla is not None else "full"
    spec = engine.speculative_config
    kinds += [(head_kind, None)] * (spec.num_draft_kv_layers if spec is not None else 0)
    if draft is not None:  # a draft model's own layers, last (vLLM loads it after the target)
        kinds += layer_kinds(draft, engine.model_copy(update={"speculative_config": None,
                                                              "disable_hybrid_kv_cache_manager": False}))
    if engine.disable_hybrid_kv_cache_manager and len(set(kinds)) > 1:
        return [("full", None)] * len(kinds)
    return kinds


def page_bytes(model: ModelSpec, engine: EngineConfig, dtype_bytes: int) -> int:
    """One block of one layer; MLA's latent is not split by tensor parallelism."""
    if model.mla is not None:
        return engine.block_size * (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * dtype_bytes
    kv_heads_per_shard = max(1, model.num_kv_heads // engine.tensor_parallel_size)
    return 2 * engine.block_size * kv_heads_per_shard * model.head_dim * dtype_bytes


def kv_layout(model: ModelSpec, engine: EngineConfig, dtype_bytes: int, draft: ModelSpec | None = None) -> KVLayout:
    """Group the model's layers as vLLM's `get_kv_cache_groups` does.

    `draft`: the engine's draft model (`kvsim.model.drafter.draft_model`, loaded by the caller: the allocators
    import this module, and the pure core loads no configs). Its layers join a target of one full-attention (or
    MLA) kind in its one group, each with a page of the draft's shape (`KVLayout.draft_bytes_per_block`);
    beside windowed layers vLLM would unify page sizes by growing block sizes, which is refused.
    """
    kinds = layer_kinds(model, engine, draft)
    draft_bytes = draft_layers = 0
    if draft is not None:
        kinds, draft_kinds = kinds[:-draft.num_layers], kinds[-draft.num_layers:]
        if not set(kinds + draft_kinds) <= {("full", None), ("mla", None)}:
            assert engine.speculative_config is not None
            raise KvsimError(f"engine.speculative_config.model={engine.speculative_config.model}: a draft model "
                             f"beside {model.name} with sliding-window/chunked KV layers on either side makes KV "
                             "groups of different page sizes (vLLM grows block sizes to unify them): not modelled")
        draft_layers = draft.num_layers
        draft_bytes = draft_layers * page_bytes(draft, engine, dtype_bytes)
    counts = Counter(kinds)  # insertion order = first appearance, as vLLM's defaultdict
    if len(counts) == 1:
        (kind, window), n = next(iter(counts.items()))
        groups: tuple[KVGroup, ...] = (KVGroup(kind, n, window),)
        group_size = n
    else:
        group_size = min(counts.values())
        if max(counts.values()) < group_size * 1.5:
            group_size = max(counts.values())
        found = []
        for (kind, window), n in counts.items():
            num_groups = ceil_div(n, group_size)
            # layers[i::num_groups] go to the i-th group of this kind
            found += [KVGroup(kind, len(range(i, n, num_groups)), window) for i in range(num_groups)]
        groups = tuple(found)
    return KVLayout(groups, group_size, page_bytes(model, engine, dtype_bytes), engine.block_size, draft_bytes,
                    draft_layers)
