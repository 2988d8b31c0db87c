"""One-token decodes over paged KV: `allocate(seq, written + 1)` without its general bookkeeping.

A mixin of `PagedAllocator` (the hot path of every decode step, split out to keep modules small): a decode
either writes into its sequence's own partly filled last block (`append_token`, which the scheduler asks
first) or, every `block_size`-th token, starts a new block (`_append_block`). Each does exactly what
`PagedAllocator.allocate` does in that case (`tests/test_paged_decode.py` drives both on one workload).
`forget_newest_hashes` takes back the hashes of the blocks its newest tokens filled, tokens vLLM had not seen yet
when it last cached (async scheduling's token in flight, accepted drafts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsim.kv.prefix_cache import HashChainCache
from kvsim.model.units import ceil_div

if TYPE_CHECKING:
    from kvsim.kv.block_pool import BlockPool
    from kvsim.kv.prefix_cache import PrefixCache
    from kvsim.workload.content import Content


@dataclass(slots=True)
class SeqBlocks:
    """One sequence's view of the cache: its block table and how many slots it has written."""

    block_table: list[int]
    num_tokens: int
    final_num_tokens: int
    content: Content | None
    num_hashed_blocks: int  # leading blocks whose content hash has been registered (or tried)
    reservable: int = 0  # slots this sequence holds for tokens it has or will have (see _own_reservable)


class PagedDecodes:
    """`append_token` of `KVAllocator` and `allocate`'s new-block decode, for `PagedAllocator` (its tables
    and counters)."""

    block_size: int
    enable_caching: bool
    pool: BlockPool
    prefix_cache: PrefixCache
    seqs: dict[int, SeqBlocks]
    block_fill: list[int]
    num_filled_slots: int
    _sum_written: int
    _sum_reservable: int
    _num_mapped_blocks: int

    if TYPE_CHECKING:
        def _mark_written(self, seq: SeqBlocks, num_tokens_total: int) -> None: ...
        def _hash_full_blocks(self, seq: SeqBlocks) -> None: ...

    def append_token(self, seq_id: int) -> bool:
        """`allocate(seq_id, written + 1)` when that token goes into the sequence's own partly
        filled last block (no new block, no copy, not past its final length); otherwise False,
        changing nothing, and the caller uses `allocate`. The hot path of every decode step:
        `_mark_written` inlined for one token in the last block."""
        seq = self.seqs.get(seq_id)
        if seq is None:
            return False
        bs, written, final = self.block_size, seq.num_tokens, seq.final_num_tokens
        used = written % bs
        if not used or written >= final:
            return False
        block_id = seq.block_table[written // bs]  # the partly filled block (not the last if held ahead)
        if self.pool.ref_counts[block_id] != 1:
            return False
        self.block_fill[block_id] = used + 1
        self.num_filled_slots += 1
        self._sum_written += 1
        seq.num_tokens = written + 1
        # `_mark_written`'s reservation, min(held, final), changes nothing here (neither moves) but for a sequence
        # that reserved only its written tokens (a forked child's, a swapped-in sharer's: `reservable` is one of
        # the two), whose reservation becomes its own: held > written (a partly filled block) and final > written
        if seq.reservable == written:
            held = len(seq.block_table) * bs
            reservable = held if held < final else final
            self._sum_reservable += reservable - written
            seq.reservable = reservable
        if used + 1 == bs and self.enable_caching and seq.content is not None:
            self._hash_full_blocks(seq)
        return True

    def _append_block(self, seq: SeqBlocks, reserve_slots: int) -> bool:
        """`allocate(seq, written + 1)` when the token starts a new block (every `block_size`-th decode) and the
        table holds no block past its full last one: `_blocks_needed` is 1 (nothing shared is written, no copy)
        and `_write` takes one block. False, changing nothing, when that block is not free past `reserve_slots`
        (`allocate`'s general path then says so)."""
        pool = self.pool
        if 1 + (ceil_div(reserve_slots, self.block_size) if reserve_slots else 0) > pool.num_free_blocks:
            return False
        seq.block_table.extend(pool.get_new_blocks(1))
        self._num_mapped_blocks += 1
        self._mark_written(seq, seq.num_tokens + 1)
        return True

    def forget_newest_hashes(self, seq_id: int, num_tokens: int) -> None:
        """`KVAllocator.forget_newest_hashes` (with the hash chain; a radix cache models SGLang, which has no
        such lag)."""
        seq = self.seqs[seq_id]
        first = (seq.num_tokens - num_tokens) // self.block_size  # the first block holding one of them
        if first >= seq.num_hashed_blocks or not isinstance(self.prefix_cache, HashChainCache):
            return
        for block_id in seq.block_table[first:seq.num_hashed_blocks]:
            self.prefix_cache.forget(block_id)
        seq.num_hashed_blocks = first
