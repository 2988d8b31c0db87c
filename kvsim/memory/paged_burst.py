"""Decode bursts over paged KV: what `num_steps` rounds of one-token `allocate` calls would do.

A mixin of `PagedAllocator`, split out to keep modules small; see `kvsim.scheduler.burst`
for when the scheduler may use it and why the result equals step-by-step allocation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvsim.units import ceil_div

if TYPE_CHECKING:
    from kvsim.content import Content
    from kvsim.memory.block_pool import BlockPool
    from kvsim.memory.paged import SeqBlocks


class PagedBursts:
    """The `burst_*` methods of `KVAllocator` for `PagedAllocator` (uses its tables and counters)."""

    block_size: int
    enable_caching: bool
    pool: BlockPool
    seqs: dict[int, SeqBlocks]
    num_filled_slots: int
    _sum_written: int
    _sum_reservable: int

    if TYPE_CHECKING:
        @property
        def num_held_slots(self) -> int: ...

        def _mark_written(self, seq: SeqBlocks, num_tokens_total: int, hash_blocks: bool = True) -> None: ...

    def _burst_events(self, seq_ids: Sequence[int], num_steps: int) -> list[tuple[int, int]]:
        """(step offset, position) of each block `num_steps` decode steps take, in step-by-step order.

        Step offset `off` writes slot `written + off`; a block starts there when it is ≡ 0 mod bs.
        """
        bs = self.block_size
        events: list[tuple[int, int]] = []
        for pos, seq_id in enumerate(seq_ids):
            written = self.seqs[seq_id].num_tokens
            events.extend((off, pos) for off in range((-written) % bs, num_steps, bs))
        events.sort()
        return events

    def burst_slots_needed(self, seq_ids: Sequence[int], num_steps: int) -> int:
        bs = self.block_size
        return bs * sum(ceil_div(self.seqs[s].num_tokens + num_steps, bs) - len(self.seqs[s].block_table)
                        for s in seq_ids)

    def append_burst(self, seq_ids: Sequence[int], num_steps: int) -> None:
        """Exactly what `num_steps` steps of `allocate(seq, tokens + 1)` for each sequence in order do.

        Blocks are handed out, and blocks that fill up are registered in the prefix cache, in
        (step, position) order, as the step-by-step calls would do it (the first block
        registered under a hash is the one lookups find). The caller has checked
        `burst_slots_needed` against the free slots. Sequences must own their partial last
        block (no fork sharing).
        """
        events = self._burst_events(seq_ids, num_steps)
        seqs = [self.seqs[s] for s in seq_ids]
        fresh = self.pool.get_new_blocks(len(events))
        for (_, pos), block_id in zip(events, fresh, strict=True):
            seqs[pos].block_table.append(block_id)
        written = [seq.num_tokens for seq in seqs]
        for seq in seqs:
            self._mark_written(seq, seq.num_tokens + num_steps, hash_blocks=False)
        if self.enable_caching:
            self._hash_burst_blocks(seqs, written)

    def _hash_burst_blocks(self, seqs: Sequence[SeqBlocks], written_before: Sequence[int]) -> None:
        """Register the blocks a burst filled in the order step-by-step writes would have.

        Block `i` of a sequence that had written `w` tokens fills at step offset
        `(i + 1) · bs − w − 1`; ties between sequences go to the earlier position.
        """
        bs, pool = self.block_size, self.pool
        order: list[tuple[int, int, int]] = []
        hashes: list[list[int]] = []
        for pos, (seq, before) in enumerate(zip(seqs, written_before, strict=True)):
            num_full = min(seq.num_tokens, seq.content.num_tokens) // bs if seq.content is not None else 0
            hashes.append(seq.content.block_hashes(bs, num_full) if seq.content is not None else [])
            order.extend(((i + 1) * bs - before - 1, pos, i) for i in range(seq.num_hashed_blocks, num_full))
            seq.num_hashed_blocks = max(seq.num_hashed_blocks, num_full)
        order.sort()
        for _, pos, index in order:
            block_id = seqs[pos].block_table[index]
            if pool.block_hashes[block_id] is None:
                pool.cache_block(block_id, hashes[pos][index])

    def burst_extends_prefix(self, seq_ids: Sequence[int], num_steps: int, content: Content | None,
                             num_tokens: int) -> bool:
        """Whether a burst registers a block hash in the chain `lookup_prefix(content, num_tokens)` walks.

        If not, that lookup finds at most what it finds now during and after the burst: hits
        only end where a hash is missing, and a burst adds no hash of the chain (it may evict
        cached free blocks, which only shortens the hit).
        """
        if not self.enable_caching or content is None:
            return False
        bs = self.block_size
        new_hashes: set[int] = set()
        for seq_id in seq_ids:
            seq = self.seqs[seq_id]
            if seq.content is None:
                continue
            num_full = min(seq.num_tokens + num_steps, seq.content.num_tokens) // bs
            if num_full > seq.num_hashed_blocks:
                new_hashes.update(seq.content.block_hashes(bs, num_full)[seq.num_hashed_blocks:])
        if not new_hashes:
            return False
        max_blocks = (num_tokens - 1) // bs
        return not new_hashes.isdisjoint(content.block_hashes(bs, max_blocks))

    def burst_occupancy(self, seq_ids: Sequence[int], num_steps: int) -> tuple[list[int], list[int], list[int]]:
        """Held, filled and reserved slots after each of the next `num_steps` decode allocations.

        `seq_ids` must be every sequence on the GPU (the whole running batch). Inside a burst
        no sequence passes its final length, so a sequence's reservation `min(held, final)`
        changes only when it takes a block: the per-step totals follow from those events.
        """
        bs, n = self.block_size, len(seq_ids)
        held_step = [0] * num_steps
        reservable_step = [0] * num_steps
        for seq_id in seq_ids:
            seq = self.seqs[seq_id]
            written, final = seq.num_tokens, seq.final_num_tokens
            assert written + num_steps <= final, "a burst never passes a sequence's final length"
            held = len(seq.block_table) * bs
            for off in range((-written) % bs, num_steps, bs):
                held_step[off] += bs
                reservable_step[off] += min(held + bs, final) - min(held, final)
                held += bs
        held_out, filled_out, reserved_out = [], [], []
        held, reservable = self.num_held_slots, self._sum_reservable
        for j in range(num_steps):
            held += held_step[j]
            reservable += reservable_step[j]
            filled = self.num_filled_slots + n * (j + 1)
            held_out.append(held)
            filled_out.append(filled)
            reserved_out.append(reservable - (self._sum_written + n * (j + 1)))
        return held_out, filled_out, reserved_out
