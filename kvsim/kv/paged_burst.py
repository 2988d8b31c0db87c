"""Decode bursts over paged KV: what `num_steps` rounds of one-token `allocate` calls would do.

A mixin of `PagedAllocator`, split out to keep modules small; see `kvsim.sched.burst`
for when the scheduler may use it and why the result equals step-by-step allocation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate, repeat
from typing import TYPE_CHECKING, Protocol

from kvsim.kv.prefix_cache import HashChainCache, PrefixCache

if TYPE_CHECKING:
    from kvsim.kv.block_pool import BlockPool
    from kvsim.kv.protocol import Occupancy
    from kvsim.workload.content import Content


class SeqBlocks(Protocol):
    """What a burst reads and writes of one sequence's table (`kvsim.kv.paged.SeqBlocks` is one)."""

    block_table: list[int]
    num_tokens: int
    final_num_tokens: int
    content: Content | None
    num_hashed_blocks: int
    reservable: int


class PagedBursts:
    """The `burst_*` methods of `KVAllocator` for `PagedAllocator` (uses its tables and counters)."""

    block_size: int
    enable_caching: bool
    pool: BlockPool
    prefix_cache: PrefixCache  # a `HashChainCache` when `supports_bursts` with caching on
    seqs: Mapping[int, SeqBlocks]
    block_fill: list[int]
    num_filled_slots: int
    _sum_written: int
    _sum_reservable: int
    _num_mapped_blocks: int
    v0_prefix_caching: bool

    if TYPE_CHECKING:
        @property
        def num_held_slots(self) -> int: ...
        @staticmethod
        def _v0_lookup_tokens(content: Content, num_tokens: int) -> int: ...

    def burst_fits(self, seq_ids: Sequence[int], num_steps: int) -> bool:
        """`burst_slots_needed` ≤ the free slots. No sequence takes more than ⌈num_steps / block_size⌉
        blocks in `num_steps` steps, so when the free blocks cover that for every sequence (nearly
        always, unless memory is short) the blocks need not be counted."""
        num_free = self.pool.num_free_blocks
        if len(seq_ids) * -(-num_steps // self.block_size) <= num_free:
            return True
        return self.burst_slots_needed(seq_ids, num_steps) <= num_free * self.block_size

    def burst_slots_needed(self, seq_ids: Sequence[int], num_steps: int) -> int:
        """New slots `num_steps` decode steps of every sequence take (new blocks, in slots)."""
        bs, seqs = self.block_size, self.seqs
        blocks = 0
        for seq_id in seq_ids:
            seq = seqs[seq_id]
            blocks += -(-(seq.num_tokens + num_steps) // bs) - len(seq.block_table)
        return blocks * bs

    def append_burst(self, seq_ids: Sequence[int], num_steps: int) -> Occupancy:
        """Exactly what `num_steps` steps of `allocate(seq, tokens + 1)` for each sequence in order do;
        returns what `burst_occupancy` would have said before (computed in the same pass).

        Blocks are handed out, and blocks that fill up are registered in the prefix cache, in
        (step, position) order, as the step-by-step calls would do it (the first block
        registered under a hash is the one lookups find). The caller has checked `burst_fits`.
        Sequences must own their partial last block (no fork sharing) and stay within their final
        length (asserted).
        The per-sequence update is `_mark_written`'s, inlined (hot: every sequence of every burst):

            step offset:      0   1   2 ... first            first + bs
            slot written:     w  w+1 ...    a block starts   the next one starts
                              └ the partial last block ┘

        A sequence with `w` tokens takes a new block at each step offset `first ≡ −w (mod bs)`
        below `num_steps`; the block taken at offset `off` ends the burst holding
        `min(bs, num_steps − off)` tokens. Its reservation `min(held, final)` changes only then:
        a burst's sequences hold no block ahead and share none (no speculation, one sample), so
        `reservable` is already `min(held, final)` (`_mark_written` sets it at every write).
        """
        bs, fill, caching = self.block_size, self.block_fill, self.enable_caching
        seqs = [self.seqs[s] for s in seq_ids]
        held_step, reservable_step = [0] * num_steps, [0] * num_steps
        events: list[tuple[int, int]] = []  # (step offset, position) of each block taken
        filling: list[tuple[SeqBlocks, int, int]] = []  # may fill a block to hash: (seq, tokens before, position)
        reservable_delta = 0
        for pos, seq in enumerate(seqs):
            written, final = seq.num_tokens, seq.final_num_tokens
            total = written + num_steps
            assert total <= final, "a burst never passes a sequence's final length"
            used = written % bs
            if used and used + num_steps <= bs:  # the burst stays in the partly filled last block
                fill[seq.block_table[-1]] = used + num_steps
            else:  # it takes blocks during the burst, the first at offset `first`
                if used:  # the partial last block is filled first
                    fill[seq.block_table[-1]] = bs
                first = bs - used if used else 0
                if num_steps <= bs:  # one block: `_take_blocks` inlined (hot)
                    held_step[first] += bs
                    held = len(seq.block_table) * bs
                    before = held if held < final else final
                    held += bs
                    reservable = held if held < final else final
                    reservable_step[first] += reservable - before
                    events.append((first, pos))
                else:
                    for off in _take_blocks(seq, num_steps, bs, held_step, reservable_step):
                        events.append((off, pos))
                    held = -(-total // bs) * bs
                    reservable = held if held < final else final
                reservable_delta += reservable - seq.reservable
                seq.reservable = reservable
            seq.num_tokens = total
            if caching and total // bs > seq.num_hashed_blocks and seq.content is not None:
                filling.append((seq, written, pos))
        occupancy = self._occupancy(held_step, reservable_step, len(seqs))  # from the totals before the burst
        events.sort()
        self._take_and_register(seqs, events, filling, num_steps)
        self._num_mapped_blocks += len(events)
        num_written = len(seqs) * num_steps
        self.num_filled_slots += num_written
        self._sum_written += num_written
        self._sum_reservable += reservable_delta
        return occupancy

    def _take_and_register(self, seqs: Sequence[SeqBlocks], takes: Sequence[tuple[int, int]],
                           filling: Sequence[tuple[SeqBlocks, int, int]], num_steps: int) -> None:
        """Hand out the burst's new blocks (`takes`: step offset, position) and register the hashes of the
        blocks that fill up (`filling`: sequence, tokens written before the burst, batch position, in batch
        order), with the outcome of doing both in one (step, position) order, a take before a registration
        in the same call (as the steps do), in one call to the pool and one to the cache.

        Takes never depend on registrations (those only touch blocks in use; a take pops plain free
        blocks, then evicts the oldest free cached ones), so all go first. Nor does the outcome of a
        registration depend on where the takes fall: a hash a take evicts was cached under that free
        block, so a registration ordered before the take caches its block as a duplicate that the
        eviction then leaves as the one found, and one ordered after it caches its block afresh
        (`HashChainCache.insert_keys`, `evict`): either way, after both, the registering block holds
        the hash, listed after the blocks that held it before and are still cached, as in step order.
        """
        bs, fill, pool = self.block_size, self.block_fill, self.pool
        for (off, pos), block_id in zip(takes, pool.get_new_blocks(len(takes)), strict=True):
            seqs[pos].block_table.append(block_id)
            fill[block_id] = bs if num_steps - off >= bs else num_steps - off
        if filling:
            self._register_filled(seqs, filling)

    def _register_filled(self, seqs: Sequence[SeqBlocks], filling: Sequence[tuple[SeqBlocks, int, int]]) -> None:
        """Register the hashes of the blocks the burst filled, in the order step-by-step writes would: by
        (step offset, batch position). Block `i` of a sequence that had written `w` tokens fills at step offset
        `(i + 1) · bs − w − 1`, so a sequence's blocks fill `bs` steps apart, and each block sorts by the one
        integer `offset · len(seqs) + position` (positions are below `len(seqs)`; no two blocks tie). The
        sequences' blocks, hashes and keys are gathered a run at a time (slices, a range), and one sort of
        the keys orders them (hot: every burst that fills a block with caching on)."""
        bs, num_seqs = self.block_size, len(seqs)
        keys: list[int] = []
        block_ids: list[int] = []
        hashes: list[int] = []
        for seq, before, pos in filling:
            assert seq.content is not None
            first, num_full = seq.num_hashed_blocks, min(seq.num_tokens, seq.content.num_tokens) // bs
            if num_full <= first:
                continue
            key = ((first + 1) * bs - before - 1) * num_seqs + pos
            keys.extend(range(key, key + (num_full - first) * bs * num_seqs, bs * num_seqs))
            block_ids.extend(seq.block_table[first:num_full])
            hashes.extend(seq.content.block_hashes(bs, num_full)[first:num_full])
            seq.num_hashed_blocks = num_full
        order = sorted(range(len(keys)), key=keys.__getitem__)
        keyed = self.prefix_cache  # blocks of several sequences registered in one order: by key
        assert isinstance(keyed, HashChainCache)
        keyed.insert_keys(map(block_ids.__getitem__, order), map(hashes.__getitem__, order))

    def burst_extends_prefix(self, seq_ids: Sequence[int], num_steps: int, content: Content | None,
                             num_tokens: int) -> bool:
        """Whether a burst registers the block hash at which `lookup_prefix(content, num_tokens)` stops (its first
        miss; False when the hit covers every block the lookup may).

        If not, that lookup finds at most what it finds now during and after the burst: the walk from block 0
        stops at that hash, which stays missing (a burst only adds its own hashes and evicts cached free
        blocks, which only shortens the hit). Hashes past it do not matter, nor hashes before it that a burst
        registers again after evicting their free block: the hit's length cannot grow, and a free hit block
        that the burst evicts (replaced or not) is one free block less, which it saves at most.
        """
        if not self.enable_caching or content is None:
            return False
        bs = self.block_size
        lookup_tokens = self._v0_lookup_tokens(content, num_tokens) if self.v0_prefix_caching else num_tokens
        # the scheduler has just asked this (`waiting_blocked`): the cache's memo answers
        num_hit = len(self.prefix_cache.match(content, lookup_tokens).block_ids)
        if num_hit >= (lookup_tokens - 1) // bs:
            return False
        miss = content.block_hashes(bs, num_hit + 1)[num_hit]
        for seq_id in seq_ids:
            seq = self.seqs[seq_id]
            if seq.content is None:
                continue
            num_full = min(seq.num_tokens + num_steps, seq.content.num_tokens) // bs
            num_hashed = seq.num_hashed_blocks
            if num_full > num_hashed and miss in seq.content.block_hashes(bs, num_full)[num_hashed:]:
                return True
        return False

    def burst_occupancy(self, seq_ids: Sequence[int], num_steps: int) -> Occupancy:
        """Held, filled and reserved slots after each of the next `num_steps` decode allocations.

        `seq_ids` must be every sequence on the GPU (the whole running batch). Inside a burst
        no sequence passes its final length, so a sequence's reservation `min(held, final)`
        changes only when it takes a block: the per-step totals follow from those events.
        """
        bs, seqs = self.block_size, self.seqs
        held_step, reservable_step = [0] * num_steps, [0] * num_steps
        for seq_id in seq_ids:
            seq = seqs[seq_id]
            assert seq.num_tokens + num_steps <= seq.final_num_tokens, "a burst never passes a sequence's final length"
            _take_blocks(seq, num_steps, bs, held_step, reservable_step)
        return self._occupancy(held_step, reservable_step, len(seq_ids))

    def _occupancy(self, held_step: list[int], reservable_step: list[int], num_seqs: int) -> Occupancy:
        """Held, filled and reserved slots after each step, from each step's new held and reservable
        slots and the totals now (before the burst): every step writes `num_seqs` tokens."""
        # running sums (exact: integers), each list starting with the total before the burst, dropped
        held_out = list(accumulate(held_step, initial=self.num_held_slots))
        filled_out = list(accumulate(repeat(num_seqs, len(held_step)), initial=self.num_filled_slots))
        # reserved = reservable − written, and every step writes `num_seqs` more tokens
        reserved_out = list(accumulate([new - num_seqs for new in reservable_step],
                                       initial=self._sum_reservable - self._sum_written))
        del held_out[0], filled_out[0], reserved_out[0]
        return held_out, filled_out, reserved_out


def _take_blocks(seq: SeqBlocks, num_steps: int, bs: int, held_step: list[int], reservable_step: list[int]) -> range:
    """The step offsets at which `seq` (before the burst) takes a block in the next `num_steps` decode
    steps: those with `num_tokens + offset ≡ 0 (mod bs)`. Adds each block's slots to `held_step` and
    the growth of its reservation `min(held, final)` to `reservable_step`, at that offset."""
    offsets = range(-seq.num_tokens % bs, num_steps, bs)
    held, final = len(seq.block_table) * bs, seq.final_num_tokens
    for off in offsets:
        held_step[off] += bs
        before = held if held < final else final
        held += bs
        reservable_step[off] += (held if held < final else final) - before
    return offsets
