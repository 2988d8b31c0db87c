"""Paged KV allocation (PagedAttention): a block table per sequence over a shared `BlockPool`.

    sequence A  block_table [7, 3, 9]      tokens 0..15 | 16..31 | 32..36 (5 of 16 used)
    sequence B  block_table [7, 3, 4]      (forked from A, or hit A's cached prefix)
    physical    block 7: ref_count 2, block 3: ref_count 2, block 9: 1, block 4: 1

Contract:
* Blocks are allocated only when a sequence crosses a block boundary (on demand).
* `allocate` is all-or-nothing: when it returns False nothing has changed.
* Prefix caching (`enable_caching`): each full block is registered in the pool's prefix
  cache (`kvsim.kv.prefix_cache`; the hash chain by default) as soon as it fills;
  `lookup_prefix` asks it for the longest cached prefix, which never covers the block
  holding a prompt's last token (its logits must be recomputed).
* vLLM v0's prefix caching (`v0_prefix_caching`; vllm/core/block/prefix_caching_block.py): a hit covers every
  full block of the prompt, the last token's included (`allocate_immutable_blocks`), and skips the computed
  ones, at most all tokens but the last (the scheduler keeps one uncached token). A block a new sequence
  fills is cached at once (a sequence admitted later in the same step shares its memory) but computed only
  once the step's batch is built (`mark_blocks_as_computed`); until then a hit counts its tokens as
  uncomputed (`PrefixHit.num_uncomputed_tokens`). Without it (v1) a hit block counts as computed as soon as
  it is allocated, and a hit never covers the last token's block. v0 looks each full block up on its own
  (`allocate_immutable_block`) where `match` stops at the first miss: the same blocks, as the cache stays
  prefix-closed (`kvsim.kv.prefix_cache`), which v0's `find_cached_blocks_prefix` assumes too (its bisect).
  Not modelled: v0's evictor orders by a sequence's last scheduled time, stamped on all its blocks when it is
  freed (`LastAccessBlocksTracker`), so a shared block stamped older by a holder left unscheduled before it
  was freed can go before the chain's next block; v0 would then share that next block alone (one block less
  in use than here; its computed prefix stops at the gap either way). Nor v0's deepest first across one stamp.
* Copy-on-write: writing into a block with `ref_count > 1` (only a partial last block
  shared by `fork` can be) first copies it to a new block; each copy is counted.
* Swap moves whole sequences' blocks to a CPU `BlockPool` and back, all-or-nothing.
* `hold` gives a sequence blocks beyond what it has written (speculative decoding's verify and
  lookahead slots); only single sequences speculate, so forks never hold ahead.
* Waste counters (`num_filled_slots`, `num_reserved_slots`) are kept incrementally and
  re-derived from scratch by `check_invariants`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from typing import Any

from kvsim.kv.block_pool import BlockPool, PoolSlots
from kvsim.kv.block_tables import growth_blocks, table_references
from kvsim.kv.paged_burst import PagedBursts
from kvsim.kv.paged_decode import PagedDecodes, SeqBlocks
from kvsim.kv.paged_swap import PagedSwaps
from kvsim.kv.prefix_cache import HashChainCache, PrefixCache
from kvsim.kv.protocol import ALLOCATED, NO_HIT, Allocation, PrefixHit
from kvsim.model.units import ceil_div
from kvsim.workload.content import Content


class PagedAllocator(PoolSlots, PagedDecodes, PagedBursts, PagedSwaps):
    """Block tables over a GPU pool (and a CPU pool for swap); the policy half of vLLM's KV manager.

    Implements `kvsim.kv.protocol.KVAllocator`; the one-token decode paths live in `paged_decode.py`, the
    decode-burst methods in `paged_burst.py`, swap in `paged_swap.py`.
    `prefix_cache`: the GPU pool's prefix cache (default a `HashChainCache`); decode bursts need the
    hash chain's key-level inserts, so with another cache and caching on they are off (`supports_bursts`).
    """

    shares_blocks = True  # fork shares; slabs instead reserve each child's region at admission

    num_slack_slots = 0  # blocks are never rounded beyond what a sequence asks for
    admits_by_chunk_above_tokens: int | None = None  # kvsim's v1 admission checks the whole prompt (DESIGN §3)

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        null_block: bool = True,
        num_cpu_blocks: int = 0,
        bytes_per_block: int = 0,
        prefix_cache: PrefixCache | None = None,
        v0_prefix_caching: bool = False,
    ) -> None:
        self.prefix_cache = prefix_cache if prefix_cache is not None else HashChainCache(num_blocks, block_size)
        self.supports_bursts = not enable_caching or isinstance(self.prefix_cache, HashChainCache)
        self.pool = BlockPool(num_blocks, null_block=null_block, cache=self.prefix_cache)
        self.cpu_pool = BlockPool(num_cpu_blocks, null_block=False, block_size=block_size) if num_cpu_blocks else None
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.bytes_per_block = bytes_per_block
        self.seqs: dict[int, SeqBlocks] = {}
        self.swapped: dict[int, SeqBlocks] = {}
        self.block_fill = [0] * num_blocks  # tokens stored in each GPU block
        self.num_filled_slots = 0  # Σ fill over GPU blocks with ref_count > 0
        self._sum_written = 0  # Σ num_tokens over GPU sequences
        self._sum_reservable = 0  # Σ seq.reservable over GPU sequences
        self._num_mapped_blocks = 0  # Σ len(block_table) over GPU sequences
        self.num_copy_on_writes = 0
        self.v0_prefix_caching = v0_prefix_caching
        self.uncomputed_blocks: set[int] = set()  # new blocks of sequences started since `mark_blocks_as_computed`
        # the last hit `_blocks_needed` counted (held: an immutable object, its id not reused), the pool's
        # `num_ref_count_changes` then, and how many of its blocks were free: it stands while no ref count changes
        self._free_hits: tuple[PrefixHit, int, int] | None = None

    # ------------------------------------------------------------------ sizes
    @property
    def num_reserved_slots(self) -> int:
        """Held slots that the owning sequence will still fill (its last block's future tokens)."""
        return self._sum_reservable - self._sum_written

    @property
    def num_mapped_slots(self) -> int:
        return self._num_mapped_blocks * self.block_size

    def region_slots(self, final_num_tokens: int, prompt_len: int | None = None) -> int:
        return ceil_div(final_num_tokens, self.block_size) * self.block_size

    def never_fits_reason(self, final_num_tokens: int, prompt_len: int | None = None) -> str | None:
        """Any free block serves any sequence: only the pool's size limits it (checked by the caller)."""
        return None

    def request_slots(self, prompt_len: int, final_num_tokens: int, num_samples: int) -> int:
        """Samples share the prompt's full blocks (forked after the prefill); each owns the rest."""
        bs = self.block_size
        per_seq = ceil_div(final_num_tokens, bs)
        shared = prompt_len // bs if num_samples > 1 else 0
        return (per_seq + (num_samples - 1) * (per_seq - shared)) * bs

    # ------------------------------------------------------------ prefix cache
    def lookup_prefix(self, content: Content | None, num_tokens: int) -> PrefixHit:
        """Longest run of cached full blocks from block 0, never covering the last token (`PrefixCache.match`);
        with `v0_prefix_caching`, v0's hit and its computed part (module docstring). The scheduler counts
        queries and hits (vLLM's prefix-cache metrics) when it admits."""
        if not self.enable_caching or content is None:
            return NO_HIT
        if not self.v0_prefix_caching:
            return self.prefix_cache.match(content, num_tokens)
        hit = self.prefix_cache.match(content, self._v0_lookup_tokens(content, num_tokens))
        # `find_cached_blocks_prefix`: the computed blocks are a prefix of the cached ones
        uncomputed = self.uncomputed_blocks
        num_computed = next((i for i, b in enumerate(hit.block_ids) if b in uncomputed), len(hit.block_ids))
        num_computed_tokens = min(num_computed * self.block_size, num_tokens - 1)
        return PrefixHit(hit.num_tokens, hit.block_ids, hit.num_tokens - num_computed_tokens) \
            if num_computed_tokens < hit.num_tokens else hit

    @staticmethod
    def _v0_lookup_tokens(content: Content, num_tokens: int) -> int:
        """What v0 asks `PrefixCache.match` for so that the last token's full block is covered too."""
        return min(num_tokens, content.num_tokens) + 1

    def mark_blocks_as_computed(self) -> None:
        self.uncomputed_blocks.clear()

    # ------------------------------------------------------------- allocation
    def _blocks_needed(self, seq: SeqBlocks | None, num_tokens_total: int, hit: PrefixHit) -> int:
        """Free blocks `allocate` would consume: new blocks, a copy-on-write, free cached hits."""
        if seq is not None and num_tokens_total <= len(seq.block_table) * self.block_size and (
                seq.num_tokens % self.block_size == 0 or self.pool.ref_counts[seq.block_table[-1]] == 1):
            return 0  # the common decode case: room left in an unshared last block
        if seq is not None:
            return growth_blocks([seq], [num_tokens_total], self.block_size, self.pool.ref_counts.__getitem__)
        pool, memo = self.pool, self._free_hits
        if memo is not None and memo[0] is hit and memo[1] == pool.num_ref_count_changes:
            free_hits = memo[2]  # a blocked queue head asks again at every step, mostly with nothing moved
        else:
            ref_counts = pool.ref_counts
            free_hits = [ref_counts[b] for b in hit.block_ids].count(0)  # leave the free queue
            self._free_hits = (hit, pool.num_ref_count_changes, free_hits)
        return free_hits + max(0, ceil_div(num_tokens_total, self.block_size) - len(hit.block_ids))

    def slots_needed(self, seq_ids: Sequence[int], num_tokens_total: int) -> int:
        """Free slots that growing every sequence of a group to `num_tokens_total` takes."""
        seqs = [self.seqs[s] for s in seq_ids]
        refs = self.pool.ref_counts
        return growth_blocks(seqs, [num_tokens_total] * len(seqs), self.block_size,
                                   refs.__getitem__) * self.block_size

    def can_allocate(self, seq_id: int, num_tokens_total: int, final_num_tokens: int | None = None,
                     hit: PrefixHit = NO_HIT, reserve_slots: int = 0, num_samples: int = 1,
                     prompt_len: int | None = None) -> bool:
        """Whether `allocate` would succeed while leaving `reserve_slots` free (v0's watermark).

        Samples fork from the first sequence later, so `num_samples` needs nothing now.
        """
        needed = self._blocks_needed(self.seqs.get(seq_id), num_tokens_total, hit)
        return needed == 0 or needed + ceil_div(reserve_slots, self.block_size) <= self.pool.num_free_blocks

    def allocate(
        self,
        seq_id: int,
        num_tokens_total: int,
        final_num_tokens: int | None = None,
        content: Content | None = None,
        hit: PrefixHit = NO_HIT,
        reserve_slots: int = 0,
    ) -> Allocation | None:
        """Make the sequence hold slots for `num_tokens_total` tokens and mark them written.

        A new sequence starts from `hit` (its cached prefix blocks); `final_num_tokens` (its
        prompt + output length) is needed only to classify free slots as reserved vs internal
        fragmentation; with `v0_prefix_caching` its blocks past the hit are uncomputed (another sequence's
        hit on them skips none of their tokens) until `mark_blocks_as_computed`. Returns None, changing
        nothing, when the blocks are not there.
        """
        seq = self.seqs.get(seq_id)
        if seq is not None and num_tokens_total == seq.num_tokens + 1:
            if self.append_token(seq_id):
                return ALLOCATED
            if seq.num_tokens == len(seq.block_table) * self.block_size and self._append_block(seq, reserve_slots):
                return ALLOCATED
        needed = self._blocks_needed(seq, num_tokens_total, hit)
        if needed and needed + ceil_div(reserve_slots, self.block_size) > self.pool.num_free_blocks:
            return None
        new = seq is None
        if seq is None:
            seq = self._start(seq_id, final_num_tokens or num_tokens_total, content, hit)
        copied = num_tokens_total > seq.num_tokens and self._write(seq, num_tokens_total)
        if new and self.v0_prefix_caching:
            self.uncomputed_blocks.update(seq.block_table[len(hit.block_ids):])
        return Allocation(num_copied_blocks=1) if copied else ALLOCATED

    def _start(self, seq_id: int, final_num_tokens: int, content: Content | None, hit: PrefixHit) -> SeqBlocks:
        pool, ref_counts, fill = self.pool, self.pool.ref_counts, self.block_fill
        for block_id in hit.block_ids:
            if ref_counts[block_id] == 0:
                self.num_filled_slots += fill[block_id]
        pool.touch(hit.block_ids[::-1])  # deepest first: see `RadixPrefixCache.lock`
        seq = SeqBlocks(list(hit.block_ids), hit.num_tokens, final_num_tokens, content, len(hit.block_ids))
        self.seqs[seq_id] = seq
        self._sum_written += seq.num_tokens
        self._num_mapped_blocks += len(seq.block_table)
        self._set_reservable(seq, self._own_reservable(seq))
        return seq

    def _own_reservable(self, seq: SeqBlocks) -> int:
        """`min(held slots, final length)`: what the sequence holds and will fill."""
        return min(len(seq.block_table) * self.block_size, seq.final_num_tokens)

    def _set_reservable(self, seq: SeqBlocks, value: int) -> None:
        self._sum_reservable += value - seq.reservable
        seq.reservable = value

    def _write(self, seq: SeqBlocks, num_tokens_total: int) -> bool:
        """Write up to `num_tokens_total`; True if a shared last block was copied first."""
        pool, table = self.pool, seq.block_table
        copied = bool(seq.num_tokens % self.block_size) and pool.ref_counts[table[-1]] > 1
        if copied:
            self._copy_on_write(seq)
        new_len = ceil_div(num_tokens_total, self.block_size)
        if new_len > len(table):
            self._num_mapped_blocks += new_len - len(table)
            table.extend(pool.get_new_blocks(new_len - len(table)))
        self._mark_written(seq, num_tokens_total)
        return copied

    def _mark_written(self, seq: SeqBlocks, num_tokens_total: int) -> None:
        """Record tokens written up to `num_tokens_total` into blocks the table already holds.

        The one-token case is `append_token`, the burst case `append_burst` (both inline this).
        """
        bs, ref_counts, fill, table = self.block_size, self.pool.ref_counts, self.block_fill, seq.block_table
        written = seq.num_tokens
        if num_tokens_total > seq.final_num_tokens:
            seq.final_num_tokens = num_tokens_total  # outgrew its estimate
        last = (num_tokens_total - 1) // bs  # the block the last written token is in (blocks past it: held ahead)
        written_blocks = table[written // bs:last + 1]  # the partly filled block, if any, and the newly written ones
        if written_blocks:
            # only the partly filled block can be shared (a fork's: `_write` copies it first); the others are
            # new or held ahead (`get_new_blocks` gives them ref_count 1, and forks never hold ahead)
            assert ref_counts[written_blocks[0]] == 1, "writing a shared block"
            for block_id in written_blocks:
                fill[block_id] = bs
            fill[table[last]] = num_tokens_total - last * bs
        delta = num_tokens_total - written
        self.num_filled_slots += delta
        self._sum_written += delta
        seq.num_tokens = num_tokens_total
        held = len(table) * bs
        reservable = held if held < seq.final_num_tokens else seq.final_num_tokens
        self._sum_reservable += reservable - seq.reservable
        seq.reservable = reservable
        if self.enable_caching and seq.content is not None \
                and num_tokens_total // bs > seq.num_hashed_blocks:
            self._hash_full_blocks(seq)

    def hold(self, seq_id: int, num_slots: int) -> bool:
        """Make a running sequence hold blocks for `num_slots` slots without writing them: the slots a
        speculative verify step writes and may reject, and EAGLE's lookahead (vLLM's `allocate_slots`
        with `num_lookahead_tokens`). Blocks past the written tokens stay in the table ("held ahead")
        until the sequence writes into them or is freed, so rejected drafts' slots are reused.
        All or nothing: False (nothing changed) when the free blocks are too few."""
        seq = self.seqs[seq_id]
        extra = ceil_div(num_slots, self.block_size) - len(seq.block_table)
        if extra <= 0:
            return True
        if extra > self.pool.num_free_blocks:
            return False
        fresh = self.pool.get_new_blocks(extra)
        for block_id in fresh:
            self.block_fill[block_id] = 0
        seq.block_table.extend(fresh)
        self._num_mapped_blocks += extra
        self._set_reservable(seq, self._own_reservable(seq))
        return True

    def _copy_on_write(self, seq: SeqBlocks) -> None:
        """Give `seq` a private copy of its shared, partially filled last block."""
        shared = seq.block_table[-1]
        (copy,) = self.pool.get_new_blocks(1)
        self.block_fill[copy] = self.block_fill[shared]
        self.num_filled_slots += self.block_fill[copy]
        self.pool.free_blocks([shared])  # still referenced by the other sharers
        seq.block_table[-1] = copy
        self.num_copy_on_writes += 1

    def _hash_full_blocks(self, seq: SeqBlocks) -> None:
        content = seq.content
        assert content is not None
        num_full = min(seq.num_tokens, content.num_tokens) // self.block_size
        if num_full <= seq.num_hashed_blocks:
            return
        swaps = self.prefix_cache.insert(content, seq.block_table, seq.num_hashed_blocks, num_full)
        if swaps:  # the cache holds the table's leading blocks in others: take those, then insert again
            self._take_cached(seq, swaps)
            self.prefix_cache.insert(content, seq.block_table, seq.num_hashed_blocks, num_full)
        seq.num_hashed_blocks = num_full

    def _take_cached(self, seq: SeqBlocks, swaps: list[tuple[int, int]]) -> None:
        """Point `seq`'s table at the cache's copies of its full blocks, (index, cached block) pairs, freeing its
        own (`PrefixCache.insert`): a reference taken as a hit takes one, one dropped as `free` drops it."""
        pool, table, fill = self.pool, seq.block_table, self.block_fill
        for index, cached in swaps:
            if pool.ref_counts[cached] == 0:
                self.num_filled_slots += fill[cached]
            pool.touch([cached])
            own, table[index] = table[index], cached
            self.num_filled_slots -= sum(fill[block_id] for block_id in pool.free_blocks([own]))

    # ---------------------------------------------------------- fork and free
    def holds(self, seq_id: int) -> bool:
        return seq_id in self.seqs or seq_id in self.swapped

    def reserve(self, seq_id: int, final_num_tokens: int, prompt_len: int | None = None) -> bool:
        """Nothing to reserve ahead with paging (a forked child shares its parent's blocks)."""
        return True

    def fork(self, parent_id: int, child_id: int, child_content: Content | None = None,
             child_final_num_tokens: int | None = None) -> None:
        """The child shares all of the parent's blocks (parallel sampling, beam search); its content is
        `child_content`, else the parent's tokens written so far and its own after them (`Content.branch`,
        named `("fork", child_id, tokens written)`: a beam re-forked from a survivor shares the survivor's
        tokens, not the next one it samples)."""
        parent = self.seqs[parent_id]
        assert child_id not in self.seqs and child_id not in self.swapped
        self.pool.touch(parent.block_table)
        final = child_final_num_tokens or parent.final_num_tokens
        if child_content is None and parent.content is not None:
            child_content = parent.content.branch(parent.num_tokens, ("fork", child_id, parent.num_tokens))
        child = SeqBlocks(list(parent.block_table), parent.num_tokens, final, child_content,
                          parent.num_hashed_blocks)
        self.seqs[child_id] = child
        self._sum_written += child.num_tokens
        self._num_mapped_blocks += len(child.block_table)
        # The shared partial last block's future slots are the parent's until a copy-on-write.
        self._set_reservable(child, child.num_tokens)

    def free(self, seq_id: int) -> None:
        """Release a sequence's blocks tail-first (its last blocks are evicted first)."""
        if seq_id in self.swapped:
            seq = self.swapped.pop(seq_id)
            assert self.cpu_pool is not None
            self.cpu_pool.free_blocks(seq.block_table[::-1])
            return
        seq = self.seqs.pop(seq_id)
        self._release_gpu(seq)

    def _release_gpu(self, seq: SeqBlocks) -> None:
        ordered = seq.block_table[::-1]  # a table holds each block once
        freed = self.pool.free_blocks(ordered)
        if ordered[:len(freed)] == freed:  # the table's last blocks (hot: those still shared are a hit, its first)
            # block i holds min(bs, max(0, num_tokens − i·bs)) tokens (`check_invariants`): the blocks from
            # index `num_kept` on hold what the sequence wrote past its first `num_kept` blocks
            num_kept = len(ordered) - len(freed)
            self.num_filled_slots -= max(0, seq.num_tokens - num_kept * self.block_size)
        else:
            self.num_filled_slots -= sum(map(self.block_fill.__getitem__, freed))
        self._sum_written -= seq.num_tokens
        self._num_mapped_blocks -= len(seq.block_table)
        self._set_reservable(seq, 0)

    def state_key(self) -> tuple[Any, ...] | None:
        """`KVAllocator.state_key`: the tables (GPU, then swapped), every block's fill and the pools' state."""
        pool, cpu = self.pool.state_key(), self.cpu_pool.state_key() if self.cpu_pool is not None else ()
        if pool is None or cpu is None:
            return None
        tables = tuple((seq_id, tuple(s.block_table), s.num_tokens, s.final_num_tokens, s.content, s.num_hashed_blocks,
                        s.reservable) for seqs in (self.seqs, self.swapped) for seq_id, s in seqs.items())
        return pool, cpu, len(self.seqs), tables, tuple(self.block_fill), tuple(sorted(self.uncomputed_blocks))

    # ------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        """Blocks conserved; ref counts equal table references; counters match a recount."""
        bs, fill = self.block_size, self.block_fill
        self.pool.check_invariants()
        for seq in self.seqs.values():
            table = seq.block_table
            assert len(table) >= ceil_div(seq.num_tokens, bs), "table shorter than cdiv(tokens, bs)"
            assert len(set(table)) == len(table)
            # block i holds min(bs, max(0, num_tokens - i·bs)) tokens: full blocks, the partial one, 0 held ahead
            full, partial = divmod(seq.num_tokens, bs)
            last = [partial] if partial else []
            expected = [bs] * full + last + [0] * (len(table) - full - len(last))
            fills = list(map(fill.__getitem__, table))
            assert fills == expected, \
                f"block {next(b for b, f, e in zip(table, fills, expected, strict=True) if f != e)} fill mismatch"
        refs = table_references([seq.block_table for seq in self.seqs.values()], self.pool.num_blocks)
        first, ref_counts = int(self.pool.null_block), self.pool.ref_counts
        assert refs[first:] == ref_counts[first:], \
            f"block {next(b for b in range(first, len(refs)) if refs[b] != ref_counts[b])} ref_count mismatch"
        assert self.num_filled_slots == sum(compress(fill, refs))
        assert self._sum_written == sum(s.num_tokens for s in self.seqs.values())
        assert self._num_mapped_blocks == sum(len(s.block_table) for s in self.seqs.values())
        assert self._sum_reservable == sum(s.reservable for s in self.seqs.values())
        if not self.enable_caching:  # nothing is hashed: no block is cached, held or free (a freed one keeps nothing)
            assert not self.pool.cache.evictable and not any(s.num_hashed_blocks for s in self.seqs.values())
        for seq in self.seqs.values():
            assert seq.reservable in (self._own_reservable(seq), seq.num_tokens), "reservation out of range"
        if self.cpu_pool is not None:
            self.cpu_pool.check_invariants()
            cpu_refs = [0] * self.cpu_pool.num_blocks
            for seq in self.swapped.values():
                for block_id in seq.block_table:
                    cpu_refs[block_id] += 1
            assert cpu_refs == self.cpu_pool.ref_counts, "cpu ref_count mismatch"
        else:
            assert not self.swapped
