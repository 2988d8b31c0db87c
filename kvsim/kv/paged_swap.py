"""Swap of paged KV to a CPU pool and back (vLLM v0's swap preemption), all or nothing.

A mixin of `PagedAllocator` (split out to keep modules small). `swap_out` moves a group's distinct blocks to the
CPU pool once each (the paper's `BlockSpaceManagerV1`; docs/architecture.md says how vLLM v0's later manager
differs), leaving room there for each sequence's next token (v0's `_can_swap`); `swap_in` brings them back to new
GPU blocks, but a full block whose content a GPU block in use caches (a prefix a running request shares), which
it shares by reference, as vLLM v0's prefix-caching allocator does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvsim.kv.block_tables import distinct_blocks, growth_blocks, repeated_blocks
from kvsim.kv.protocol import SwapResult
from kvsim.model.units import ceil_div

if TYPE_CHECKING:
    from kvsim.kv.block_pool import BlockPool
    from kvsim.kv.paged_decode import SeqBlocks
    from kvsim.kv.prefix_cache import PrefixCache


class PagedSwaps:
    """`swap_out`, `swap_in` and their counts for `PagedAllocator` (its tables, pools and counters)."""

    block_size: int
    enable_caching: bool
    bytes_per_block: int
    pool: BlockPool
    cpu_pool: BlockPool | None
    prefix_cache: PrefixCache
    seqs: dict[int, SeqBlocks]
    swapped: dict[int, SeqBlocks]
    block_fill: list[int]
    num_filled_slots: int
    _sum_written: int
    _num_mapped_blocks: int

    if TYPE_CHECKING:
        def _release_gpu(self, seq: SeqBlocks) -> None: ...
        def _set_reservable(self, seq: SeqBlocks, value: int) -> None: ...
        def _own_reservable(self, seq: SeqBlocks) -> int: ...
        def _hash_full_blocks(self, seq: SeqBlocks) -> None: ...

    def swap_out(self, seq_ids: Sequence[int]) -> SwapResult | None:
        """Move a group's blocks to CPU with room for each next token (v0's `_can_swap`); else None, nothing changed."""
        if self.cpu_pool is None:
            return None
        seqs = [self.seqs[s] for s in seq_ids]
        unique = distinct_blocks([s.block_table for s in seqs])
        needed = len(unique) + growth_blocks(seqs, [s.num_tokens + 1 for s in seqs], self.block_size,
                                             self.pool.ref_counts.__getitem__)
        if needed > self.cpu_pool.num_free_blocks:
            return None
        mapping = dict(zip(unique, self.cpu_pool.get_new_blocks(len(unique)), strict=True))
        for seq_id, seq in zip(seq_ids, seqs, strict=True):
            del self.seqs[seq_id]
            self._release_gpu(seq)
            seq.block_table = [mapping[b] for b in seq.block_table]
            seq.num_hashed_blocks = 0
            self.swapped[seq_id] = seq
        self.cpu_pool.touch(repeated_blocks([s.block_table for s in seqs]))
        return SwapResult(len(unique), len(unique) * self.bytes_per_block)

    def swap_in_growth_slots(self, seq_ids: Sequence[int]) -> int:
        """Slots the swapped group needs, once back, for each sequence's next token.

        A sequence whose last block is full needs a new block; k sequences sharing a partial
        last block need k − 1 copies (the last writer keeps the original).
        """
        assert self.cpu_pool is not None
        seqs = [self.swapped[s] for s in seq_ids]
        return growth_blocks(seqs, [s.num_tokens + 1 for s in seqs], self.block_size,
                                   self.cpu_pool.ref_counts.__getitem__) * self.block_size

    def swapped_slots(self, seq_ids: Sequence[int]) -> int:
        """Slots of the distinct blocks a swapped group holds on the CPU that swapping it in takes: all but those
        whose content a GPU block in use holds, taken by reference (`_held_on_gpu`)."""
        seqs = [self.swapped[s] for s in seq_ids]
        held = self._held_on_gpu(seqs)
        return sum(b not in held for b in distinct_blocks([s.block_table for s in seqs])) * self.block_size

    def swapped_held_references(self, seq_ids: Sequence[int]) -> int:
        """How many entries of the swapped group's tables name a block whose content a GPU block in use holds
        (`_held_on_gpu`), each sequence's counted apart: what vLLM v0's `_can_swap` count leaves out."""
        seqs = [self.swapped[s] for s in seq_ids]
        held = self._held_on_gpu(seqs)
        return sum(b in held for seq in seqs for b in seq.block_table)

    def _held_on_gpu(self, seqs: Sequence[SeqBlocks]) -> dict[int, int]:
        """CPU block -> the GPU block in use (ref_count > 0, another sequence's: a shared prefix) that caches its
        content, over the swapped `seqs`' full blocks. vLLM v0's prefix-caching allocator swaps such a block in by
        reference (`PrefixCachingBlockAllocator.swap_in`: `allocate_immutable_block` finds the hash) and its
        `get_num_full_blocks_touched` leaves it out of the blocks a swap-in needs; a cached block with no
        reference (in its evictor) still counts, as here (kvsim's swap-in takes a new block, `_take_cached`).
        Empty without caching."""
        held: dict[int, int] = {}
        if not self.enable_caching:
            return held
        ref_counts, bs = self.pool.ref_counts, self.block_size
        for seq in seqs:
            if seq.content is None:
                continue
            num_full = min(seq.num_tokens, seq.content.num_tokens) // bs
            for cpu_block, gpu_block in zip(seq.block_table, self.prefix_cache.cached_prefix(seq.content, num_full),
                                              strict=False):
                if ref_counts[gpu_block]:
                    assert held.setdefault(cpu_block, gpu_block) == gpu_block, "one content per block"
        return held

    def can_swap_in(self, seq_ids: Sequence[int], reserve_slots: int = 0) -> bool:
        return self._fits(self.swapped_slots(seq_ids), reserve_slots)

    def _fits(self, num_slots: int, reserve_slots: int) -> bool:
        """Whether the GPU pool's free blocks hold `num_slots` swapped in and `reserve_slots` more."""
        return ceil_div(num_slots + reserve_slots, self.block_size) <= self.pool.num_free_blocks

    def swap_in(self, seq_ids: Sequence[int], reserve_slots: int = 0) -> SwapResult | None:
        """Bring a swapped group back to new GPU blocks, but those whose content a GPU block in use holds, which
        it shares (`_held_on_gpu`); None (nothing changed) if they don't fit. Every block is moved (vLLM v0
        copies a held one too, over the same content)."""
        assert self.cpu_pool is not None
        seqs = [self.swapped[s] for s in seq_ids]
        unique = distinct_blocks([s.block_table for s in seqs])
        held = self._held_on_gpu(seqs)  # once: `can_swap_in`'s count is the moved blocks' slots
        moved = [b for b in unique if b not in held]
        if not self._fits(len(moved) * self.block_size, reserve_slots):
            return None
        fresh = self.pool.get_new_blocks(len(moved))
        mapping = {**dict(zip(moved, fresh, strict=True)), **held}
        self.pool.touch(dict.fromkeys(held.values()))  # each held block's first reference; repeats below
        last_blocks: set[int] = set()
        for seq_id, seq in zip(seq_ids, seqs, strict=True):
            self.cpu_pool.free_blocks(seq.block_table[::-1])
            seq.block_table = [mapping[b] for b in seq.block_table]
            del self.swapped[seq_id]
            self.seqs[seq_id] = seq
            for index, block_id in enumerate(seq.block_table):
                self.block_fill[block_id] = min(self.block_size, seq.num_tokens - index * self.block_size)
            self._sum_written += seq.num_tokens
            self._num_mapped_blocks += len(seq.block_table)
            shares_last = bool(seq.block_table) and seq.block_table[-1] in last_blocks
            self._set_reservable(seq, seq.num_tokens if shares_last else self._own_reservable(seq))
            last_blocks.update(seq.block_table[-1:])
        self.pool.touch(repeated_blocks([s.block_table for s in seqs]))
        self.num_filled_slots += sum(self.block_fill[b] for b in fresh)
        for seq in seqs:
            if self.enable_caching and seq.content is not None:
                self._hash_full_blocks(seq)
        return SwapResult(len(unique), len(unique) * self.bytes_per_block)
