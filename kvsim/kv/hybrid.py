"""Paged KV allocation for models with several KV groups (sliding window, chunked local, hybrid).

vLLM's hybrid KV cache manager (vllm/v1/core/kv_cache_coordinator.py over
vllm/v1/core/single_type_kv_cache_manager.py): every KV group of the layout (`kvsim.model.kv_layout`)
keeps its own block table per sequence, and all groups draw block ids from one `BlockPool`.

    sequence A, gpt-oss (window 128, block 16), 300 tokens computed
        sliding group  [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 31, 32, 40, 41, 44, 47, 50, 53, 55]
        full group     [2, 3, 5, 6, 9, ...                                              ]

* Before a sequence grows, the blocks no layer of a group reads again are freed and replaced
  by the null block 0 (`remove_skipped_blocks`): for a sliding window W the first
  (n − W + 1) // block_size blocks, for chunked local attention those before the current
  chunk; n is the tokens computed so far. Freed blocks keep their hash (they can still be hit).
* Prefix caching as `HybridKVCacheCoordinator.find_longest_cache_hit`: a full-attention type
  hits the longest cached prefix; a sliding type needs cdiv(W − 1, bs) consecutive cached blocks
  ending at the hit (the blocks before are null); a chunked type needs the cached blocks from its
  current chunk's start. The hit is the longest length every type accepts (iterated to a fixed
  point). A block hits for a type only if every group of that type has it cached.
* Blocks of one request are freed group by group, each tail-first.
* Admission (scheduler v1) asks for the whole prompt's blocks, kvsim's default for every allocator
  (DESIGN §3), when the prompt is no longer than the shortest window or attention chunk: no group
  frees a block before such a prompt is all computed (a sliding layer skips max(0, computed −
  window + 1) tokens, a chunked one the chunks before the current one), so every group holds all its
  blocks at once, as a full-attention layer does, and admission is exactly the paged allocator's.
  A longer prompt never holds all its blocks in the windowed groups at once, and what it holds at its
  peak depends on the chunks later budgets give it, so there it asks for its first chunk only, as
  vLLM v1's scheduler calls `allocate_slots(request, num_new_tokens)` with the chunk the token budget
  allows for every model (`admits_by_chunk_above_tokens`): a prompt longer than the pool could hold
  in every group at once is served a chunk at a time while its windows free blocks behind it, and
  may be preempted when the next chunk does not fit. What can never be served is more than the
  request's peak (`region_slots`): vLLM's startup bound (`blocks_per_request`) at the request's own
  length, each group capped at the blocks the sequence has.
* `allocate` is all-or-nothing. Parallel sampling (fork) and swap are not supported (vLLM v1
  has neither for hybrid models); decode bursts are off (`supports_bursts`).

Slot counts are block ids × block_size, as for `PagedAllocator`: a token costs one slot per
group while its group still holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvsim.kv.block_pool import NULL_BLOCK_ID, BlockPool, PoolSlots
from kvsim.kv.prefix_cache import HashChainCache
from kvsim.kv.protocol import ALLOCATED, NO_HIT, Allocation, Occupancy, PrefixHit
from kvsim.model.kv_layout import KVGroup, KVLayout
from kvsim.model.units import ceil_div
from kvsim.workload.content import Content


@dataclass(slots=True)
class GroupedSeq:
    """One sequence: a block table per KV group (null block 0 where KV was dropped)."""

    tables: list[list[int]]
    num_tokens: int
    final_num_tokens: int
    content: Content | None
    num_hashed_blocks: int

    @property
    def block_table(self) -> list[int]:
        """Every real block the sequence holds, all groups together."""
        return [b for table in self.tables for b in table if b != NULL_BLOCK_ID]


class GroupedPagedAllocator(PoolSlots):
    """Block tables per KV group over one GPU pool, as vLLM's hybrid KV cache manager keeps them.

    Implements `kvsim.kv.protocol.KVAllocator` (without fork, swap or bursts).
    """

    num_slack_slots = 0
    num_copy_on_writes = 0
    shares_blocks = True  # not used: fork is refused
    supports_bursts = False
    cpu_pool = None

    def __init__(self, num_blocks: int, layout: KVLayout, max_num_batched_tokens: int,
                 enable_caching: bool = True, bytes_per_block: int = 0) -> None:
        # one hash chain for every group, each group's blocks keyed apart (`_key`)
        self.prefix_cache = HashChainCache(num_blocks, layout.block_size)
        self.pool = BlockPool(num_blocks, null_block=True, cache=self.prefix_cache)
        self.layout = layout
        self.groups = layout.groups
        self.block_size = layout.block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        windows = [g.window_tokens for g in self.groups if g.window_tokens is not None]
        # the module docstring's admission: whole prompts up to the shortest window, first chunks beyond
        self.admits_by_chunk_above_tokens: int | None = min(windows) if windows else None
        self.enable_caching = enable_caching
        self.bytes_per_block = bytes_per_block
        self.seqs: dict[int, GroupedSeq] = {}
        self.swapped: dict[int, GroupedSeq] = {}
        self.block_fill = [0] * num_blocks
        self.num_filled_slots = 0
        self._num_mapped_blocks = 0  # Σ real (non-null) entries over every sequence's tables

    # ------------------------------------------------------------------ sizes
    @property
    def num_reserved_slots(self) -> int:
        """Future slots of each group's last block, up to the sequence's final length."""
        bs, n = self.block_size, len(self.groups)
        return sum(n * max(0, min(len(s.tables[0]) * bs, s.final_num_tokens) - s.num_tokens)
                   for s in self.seqs.values())

    @property
    def num_mapped_slots(self) -> int:
        # Σ len(block_table), kept as blocks enter and leave the tables (read at every recorded step)
        return self._num_mapped_blocks * self.block_size

    def region_slots(self, final_num_tokens: int, prompt_len: int | None = None) -> int:
        """The most slots one sequence of `final_num_tokens` tokens holds at once: per group vLLM's per-request
        maximum with `final_num_tokens` for max_model_len, at most the sequence's own cdiv(final_num_tokens,
        block_size) blocks (`KVLayout.prefill_blocks`). vLLM's bound adds a block for a window that starts
        mid-block; a sequence no longer than its window never slides, so it holds its blocks and no more (a
        106-token request in a window of 4,096 tokens and blocks of 32 holds 4 blocks, not 5)."""
        return self.layout.prefill_blocks(final_num_tokens, self.max_num_batched_tokens) * self.block_size

    def request_slots(self, prompt_len: int, final_num_tokens: int, num_samples: int) -> int:
        """One sequence per request (v1 runs each parallel sample as a request of its own; beams are refused)."""
        return num_samples * self.region_slots(final_num_tokens)

    def never_fits_reason(self, final_num_tokens: int, prompt_len: int | None = None) -> str | None:
        """Nothing beyond the scheduler's own check (`region_slots` against the pool): admission is per chunk."""
        return None

    # ------------------------------------------------------------ prefix cache
    def _key(self, block_hash: int, group: int) -> int:
        return hash((block_hash, group))

    def _cached(self, block_hash: int, group_ids: Sequence[int]) -> list[int] | None:
        found = [self.prefix_cache.lookup(self._key(block_hash, g)) for g in group_ids]
        return None if any(b is None for b in found) else found  # type: ignore[return-value]

    def _type_hit(self, group: KVGroup, group_ids: Sequence[int], hashes: list[int],
                  max_blocks: int) -> list[list[int]]:
        """Tables (nulls for skipped positions) of the longest hit this type accepts within `max_blocks`."""
        tables: list[list[int]] = [[] for _ in group_ids]
        if group.kind == "sliding_window":
            assert group.window_tokens is not None
            needed = ceil_div(group.window_tokens - 1, self.block_size)
            run: list[list[int]] = []
            for i in range(max_blocks - 1, -1, -1):  # right to left, as SlidingWindowManager
                found = self._cached(hashes[i], group_ids)
                run = [] if found is None else [found, *run]
                if len(run) >= needed or (i == 0 and run):
                    return [[NULL_BLOCK_ID] * i + [r[g] for r in run] for g in range(len(group_ids))]
            return tables
        start = 0
        if group.kind == "chunked_local":
            assert group.window_tokens is not None
            start = min(max_blocks, max_blocks * self.block_size // group.window_tokens * group.window_tokens
                        // self.block_size)
            tables = [[NULL_BLOCK_ID] * start for _ in group_ids]
        for i in range(start, max_blocks):
            found = self._cached(hashes[i], group_ids)
            if found is None:
                break
            for g, block_id in enumerate(found):
                tables[g].append(block_id)
        return tables

    def mark_blocks_as_computed(self) -> None:
        """Nothing to mark: hybrid groups run under v1 only, whose hits count blocks as computed once
        they are allocated (vLLM v1's `allocate_slots` caches them before the step runs)."""

    def lookup_prefix(self, content: Content | None, num_tokens: int) -> PrefixHit:
        """The longest hit every attention type accepts, never covering the last token.

        `block_ids` holds the groups' tables one after another (k entries each, nulls included).
        """
        if not self.enable_caching or content is None:
            return NO_HIT
        max_blocks = (num_tokens - 1) // self.block_size
        hashes = content.block_hashes(self.block_size, max_blocks)
        by_type: dict[tuple[str, int | None], list[int]] = {}
        for g, group in enumerate(self.groups):
            by_type.setdefault((group.kind, group.window_tokens), []).append(g)
        tables: dict[int, list[int]] = {}
        while True:  # shrink to a length every type accepts
            for group_ids in by_type.values():
                found = self._type_hit(self.groups[group_ids[0]], group_ids, hashes, max_blocks)
                tables.update(zip(group_ids, found, strict=True))
            length = min(len(t) for t in tables.values())
            if length == max_blocks:
                break
            max_blocks = length
        flat = tuple(b for g in range(len(self.groups)) for b in tables[g][:max_blocks])
        return PrefixHit(max_blocks * self.block_size, flat) if max_blocks else NO_HIT

    # ------------------------------------------------------------- allocation
    def _skipped_blocks(self, group: KVGroup, num_computed_tokens: int) -> int:
        return group.num_skipped_tokens(num_computed_tokens) // self.block_size

    def _plan(self, seq: GroupedSeq | None, num_tokens_total: int, hit: PrefixHit) -> tuple[int, int]:
        """(blocks to take from the free queue, blocks the skip frees first) for this allocation."""
        new_len = ceil_div(num_tokens_total, self.block_size)
        refs = self.pool.ref_counts
        if seq is None:
            k = hit.num_tokens // self.block_size
            revived = sum(1 for b in hit.block_ids if b != NULL_BLOCK_ID and refs[b] == 0)
            return revived + len(self.groups) * max(0, new_len - k), 0
        take = freed = 0
        for g, table in enumerate(seq.tables):
            # the skipped blocks still held: those after the table's leading nulls (`remove_skipped_blocks`)
            i = min(self._skipped_blocks(self.groups[g], seq.num_tokens), len(table)) - 1
            while i >= 0 and (b := table[i]) != NULL_BLOCK_ID:
                freed += refs[b] == 1
                i -= 1
            take += max(0, new_len - len(table))
        return take, freed

    def can_allocate(self, seq_id: int, num_tokens_total: int, final_num_tokens: int | None = None,
                     hit: PrefixHit = NO_HIT, reserve_slots: int = 0, num_samples: int = 1,
                     prompt_len: int | None = None) -> bool:
        take, freed = self._plan(self.seqs.get(seq_id), num_tokens_total, hit)
        return take == 0 or take + ceil_div(reserve_slots, self.block_size) <= self.pool.num_free_blocks + freed

    def slots_needed(self, seq_ids: Sequence[int], num_tokens_total: int) -> int:
        raise AssertionError("no sequence forks: the builder refuses samples and beams with these groups")

    def allocate(self, seq_id: int, num_tokens_total: int, final_num_tokens: int | None = None,
                 content: Content | None = None, hit: PrefixHit = NO_HIT, reserve_slots: int = 0) -> Allocation | None:
        """Free what the window left behind, then hold `num_tokens_total` tokens in every group."""
        if not self.can_allocate(seq_id, num_tokens_total, final_num_tokens, hit, reserve_slots):
            return None
        seq = self.seqs.get(seq_id)
        if seq is None:
            seq = self._start(seq_id, final_num_tokens or num_tokens_total, content, hit)
        else:
            self.remove_skipped_blocks(seq)
        if num_tokens_total > seq.num_tokens:
            self._write(seq, num_tokens_total)
        return ALLOCATED

    def append_token(self, seq_id: int) -> bool:
        """No separate fast path: every token goes through `allocate`. Only a speed gap (v1's plain-decode loop
        stops at once and its general path decodes each request, `_schedule_plain_decodes`): `allocate` is the
        exact path, and also drops the blocks a sliding window or chunk has left (`remove_skipped_blocks`, as
        vLLM's `KVCacheManager.allocate_slots` does each step), which a fast path here would have to do too."""
        return False

    def hold(self, seq_id: int, num_slots: int) -> bool:
        """Speculative decoding runs on the paged allocator only (the builder refuses it here)."""
        raise AssertionError("hold: speculative decoding needs the paged allocator")

    def _start(self, seq_id: int, final_num_tokens: int, content: Content | None, hit: PrefixHit) -> GroupedSeq:
        k = hit.num_tokens // self.block_size
        tables = [list(hit.block_ids[g * k:(g + 1) * k]) for g in range(len(self.groups))]
        real = [b for b in hit.block_ids if b != NULL_BLOCK_ID]
        self.num_filled_slots += sum(self.block_fill[b] for b in set(real) if self.pool.ref_counts[b] == 0)
        self.pool.touch(real)
        self._num_mapped_blocks += len(real)
        seq = GroupedSeq(tables, hit.num_tokens, final_num_tokens, content, k)
        self.seqs[seq_id] = seq
        return seq

    def remove_skipped_blocks(self, seq: GroupedSeq) -> None:
        """Replace the blocks no layer of a group reads again by the null block, and free them
        (each group's tail-first, as SlidingWindowManager.remove_skipped_blocks). A table's nulls are
        always its leading entries (a hit's tables start with theirs, `_type_hit`), which `_plan` counts on."""
        refs = self.pool.ref_counts
        for g, table in enumerate(seq.tables):
            skip = self._skipped_blocks(self.groups[g], seq.num_tokens)
            dropped = []
            for i in range(skip - 1, -1, -1):
                if table[i] == NULL_BLOCK_ID:
                    break  # everything before was dropped earlier
                dropped.append(table[i])
                table[i] = NULL_BLOCK_ID
            self.num_filled_slots -= sum(self.block_fill[b] for b in dropped if refs[b] == 1)
            self._num_mapped_blocks -= len(dropped)
            self.pool.free_blocks(dropped)

    def _write(self, seq: GroupedSeq, num_tokens_total: int) -> None:
        bs = self.block_size
        new_len = ceil_div(num_tokens_total, bs)
        for table in seq.tables:
            if new_len > len(table):
                fresh = self.pool.get_new_blocks(new_len - len(table))
                for block_id in fresh:
                    self.block_fill[block_id] = 0  # its last owner's fill was subtracted when freed
                table.extend(fresh)
                self._num_mapped_blocks += len(fresh)
            for index in range(seq.num_tokens // bs, new_len):
                block_id = table[index]
                if block_id == NULL_BLOCK_ID:
                    continue
                fill = min(bs, num_tokens_total - index * bs)
                self.num_filled_slots += fill - self.block_fill[block_id]
                self.block_fill[block_id] = fill
        seq.num_tokens = num_tokens_total
        seq.final_num_tokens = max(seq.final_num_tokens, num_tokens_total)
        if self.enable_caching and seq.content is not None:
            self._hash_full_blocks(seq)

    def _hash_full_blocks(self, seq: GroupedSeq) -> None:
        assert seq.content is not None
        num_full = min(seq.num_tokens, seq.content.num_tokens) // self.block_size
        if num_full <= seq.num_hashed_blocks:
            return
        hashes = seq.content.block_hashes(self.block_size, num_full)
        for g, table in enumerate(seq.tables):
            for index in range(seq.num_hashed_blocks, num_full):
                block_id = table[index]
                if block_id != NULL_BLOCK_ID and self.prefix_cache.block_hashes[block_id] is None:
                    self.prefix_cache.insert_keys((block_id,), (self._key(hashes[index], g),))
        seq.num_hashed_blocks = num_full

    # ---------------------------------------------------------- fork and free
    def reserve(self, seq_id: int, final_num_tokens: int, prompt_len: int | None = None) -> bool:
        return True

    def holds(self, seq_id: int) -> bool:
        return seq_id in self.seqs

    def fork(self, parent_id: int, child_id: int, child_content: Content | None = None,
             child_final_num_tokens: int | None = None) -> None:
        self.slots_needed([parent_id], 0)

    def forget_newest_hashes(self, seq_id: int, num_tokens: int) -> None:
        """`KVAllocator.forget_newest_hashes`, in every group (a group's null block holds no hash)."""
        seq = self.seqs[seq_id]
        first = (seq.num_tokens - num_tokens) // self.block_size
        if first >= seq.num_hashed_blocks:
            return
        for table in seq.tables:
            for block_id in table[first:seq.num_hashed_blocks]:
                if block_id != NULL_BLOCK_ID:
                    self.prefix_cache.forget(block_id)
        seq.num_hashed_blocks = first

    def free(self, seq_id: int) -> None:
        """Release a sequence's blocks, group by group, each tail-first."""
        seq = self.seqs.pop(seq_id)
        refs = self.pool.ref_counts
        for table in seq.tables:
            real = [b for b in reversed(table) if b != NULL_BLOCK_ID]
            self.num_filled_slots -= sum(self.block_fill[b] for b in real if refs[b] == 1)
            self._num_mapped_blocks -= len(real)
            self.pool.free_blocks(real)

    # Unreachable by construction (scheduler v1 only, bursts off); kept so that every allocator
    # answers the scheduler's calls.
    def swap_out(self, seq_ids: Sequence[int]) -> None:
        return None

    def can_swap_in(self, seq_ids: Sequence[int], reserve_slots: int = 0) -> bool:
        return False

    def swap_in(self, seq_ids: Sequence[int], reserve_slots: int = 0) -> None:
        return None

    def swap_in_growth_slots(self, seq_ids: Sequence[int]) -> int:
        raise AssertionError("nothing is ever swapped out")

    def burst_fits(self, seq_ids: Sequence[int], num_steps: int) -> bool:
        raise AssertionError("supports_bursts is False")

    def append_burst(self, seq_ids: Sequence[int], num_steps: int) -> Occupancy:
        raise AssertionError("supports_bursts is False")

    def burst_extends_prefix(self, seq_ids: Sequence[int], num_steps: int, content: Content | None,
                             num_tokens: int) -> bool:
        raise AssertionError("supports_bursts is False")

    def burst_occupancy(self, seq_ids: Sequence[int], num_steps: int) -> Occupancy:
        raise AssertionError("supports_bursts is False")

    def state_key(self) -> tuple[Any, ...] | None:
        """`KVAllocator.state_key`: every sequence's tables (GPU, then swapped), every block's fill, the pool's."""
        pool = self.pool.state_key()
        if pool is None:
            return None
        tables = tuple((seq_id, tuple(map(tuple, s.tables)), s.num_tokens, s.final_num_tokens, s.content,
                        s.num_hashed_blocks) for seqs in (self.seqs, self.swapped) for seq_id, s in seqs.items())
        return pool, len(self.seqs), tables, tuple(self.block_fill)

    # ------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        """Blocks conserved; ref counts equal table references; live blocks are those the window covers."""
        bs = self.block_size
        self.pool.check_invariants()
        refs = [0] * self.pool.num_blocks
        for seq in self.seqs.values():
            for g, table in enumerate(seq.tables):
                assert len(table) == ceil_div(seq.num_tokens, bs), "table length != cdiv(tokens, bs)"
                first, _ = self.groups[g].live_block_range(seq.num_tokens, bs)
                for index, block_id in enumerate(table):
                    if block_id == NULL_BLOCK_ID:
                        assert index < first, f"null block inside group {g}'s window"
                        assert index == 0 or table[index - 1] == NULL_BLOCK_ID, f"group {g}: a null after a block"
                        continue
                    refs[block_id] += 1
                    assert self.block_fill[block_id] == min(bs, seq.num_tokens - index * bs)
        for block_id in range(1, self.pool.num_blocks):
            assert refs[block_id] == self.pool.ref_counts[block_id], f"block {block_id} ref_count mismatch"
        assert self.num_filled_slots == sum(self.block_fill[b] for b, r in enumerate(refs) if r)
        assert self._num_mapped_blocks == sum(len(s.block_table) for s in self.seqs.values()), "mapped blocks"
