"""Physical KV blocks: ref counts and the free queue (eviction order), over a prefix cache.

This is mechanism only (vLLM v1's `BlockPool`); which blocks a sequence uses is policy and
lives in `paged.py`; which free blocks keep content, and which of them to evict first, is the
prefix cache's (`kvsim.kv.prefix_cache`: the hash chain by default).

    free queue (head = next to reuse)                         tail (reused last)
    ┌───────────────────────────┬─────────────────────────────────────────────┐
    │ freed blocks with no hash │ the cache's evictable blocks, LRU →         │
    └───────────────────────────┴─────────────────────────────────────────────┘

* A block is *in use* when `ref_count > 0`, otherwise it is in the free queue.
* A freed block holding cached content goes to the cache's evictable tail (LRU: its content
  may be hit again); one without goes to the head (nothing to keep), the first of one free's
  list at the head: vLLM v1's `BlockPool.free_blocks` (vllm/v1/core/block_pool.py, at c59cb79)
  puts a free's blocks without hash at the head by `FreeKVCacheBlockQueue.prepend_n`, which keeps
  their order (its first block becomes the head; vllm/v1/core/kv_cache_utils.py), and the others
  at the tail by `append_n`. Callers free a table tail-first (`SingleTypeKVCacheManager.free`
  passes `reversed(req_blocks)`), so a table's last plain block is reused first. The split is
  vLLM PR #42656 (merged May 2026; before it every freed block went to the tail, bar the sliding
  window's skipped blocks, prepended since #43447); with caching off every freed block is
  prepended (#51482, undoing #48017's appends). vLLM v0 gives the same
  order: `BlockTable.free` frees front to back and `NaiveBlockAllocator._free_block_id` does
  `appendleft` (vllm/core/block/naive_block.py), so the table's last block ends at the head; its
  prefix-caching allocator hands out those hashless blocks before any evictable cached one. The
  CPU swap pool (no cache: every block is plain) follows the same rule.
* Eviction is lazy: a cached block stays findable while free, and its content is dropped
  only when `get_new_blocks` takes it for reuse (`PrefixCache.evict`).
* A prefix hit on a free cached block (`touch`) pulls it out of the queue in O(1).
* With `null_block=True`, block 0 is reserved (vLLM's null block) and never handed out.

Blocks enter the queue only at the head (no content) or at the cache's tail, and a block's
content changes only while it is in use, so the queue is always its plain blocks followed by
the evictable ones. The head part is a stack (a list whose end is the head, so freeing a
sequence's blocks is one `extend`, of the list reversed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any

from kvsim.kv.prefix_cache import HashChainCache, PrefixCache

NULL_BLOCK_ID = 0


class BlockPool:
    """`num_blocks` physical blocks; `num_usable_blocks` excludes the null block.

    `cache`: the prefix cache over these blocks (default: an empty `HashChainCache` of
    `block_size`; a pool nobody caches in, as the CPU swap pool, simply never inserts).
    """

    __slots__ = ("num_blocks", "null_block", "num_usable_blocks", "ref_counts", "cache", "num_ref_count_changes",
                 "_unhashed", "_evictable")

    def __init__(self, num_blocks: int, null_block: bool = True, cache: PrefixCache | None = None,
                 block_size: int = 16) -> None:
        assert num_blocks > int(null_block), "a pool needs at least one usable block"
        self.num_blocks = num_blocks
        self.null_block = null_block
        # fixed for the pool's life; a plain attribute, not a property: read at every step (usage, held slots)
        self.num_usable_blocks = num_blocks - int(null_block)
        self.ref_counts = [0] * num_blocks
        self.cache: PrefixCache = cache if cache is not None else HashChainCache(num_blocks, block_size)
        self._evictable = self.cache.evictable  # the queue's tail part, the cache's (read for its length)
        # calls that changed ref counts (`get_new_blocks`, `touch`, `free_blocks`): while it stands, so do they all
        self.num_ref_count_changes = 0
        first = 1 if null_block else 0
        # the free queue's head part: free blocks without cached content, the head at the end (block `first` first)
        self._unhashed: list[int] = list(range(num_blocks - 1, first - 1, -1))

    @property
    def free_queue(self) -> list[int]:
        """The free blocks in eviction order (head first: the next handed out)."""
        return [*reversed(self._unhashed), *self._evictable]

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_count 0, cached or not: all can be handed out."""
        return len(self._unhashed) + len(self._evictable)

    @property
    def usage(self) -> float:
        """vLLM's `kv_cache_usage_perc`: 1 − free / usable (cached-but-free counts as free)."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def get_new_blocks(self, n: int) -> list[int]:
        """Pop `n` blocks from the head, evicting cached content last; each gets ref_count 1.

        The caller checks `num_free_blocks >= n` first ("can't" is decided before, not here).
        """
        assert n <= self.num_free_blocks, f"asked for {n} blocks, {self.num_free_blocks} free"
        unhashed, ref_counts = self._unhashed, self.ref_counts
        num_unhashed = min(n, len(unhashed))
        popped = unhashed[len(unhashed) - num_unhashed:]
        popped.reverse()
        del unhashed[len(unhashed) - num_unhashed:]
        if num_unhashed < n:  # then the cache's evictable blocks, their content forgotten
            popped.extend(self.cache.evict(n - num_unhashed))
        for block_id in popped:
            ref_counts[block_id] = 1
        self.num_ref_count_changes += 1
        return popped

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take one more reference to each block (a prefix hit or a fork)."""
        lock, ref_counts = self.cache.lock, self.ref_counts
        self.num_ref_count_changes += 1
        for block_id in block_ids:
            if ref_counts[block_id] == 0 and not lock(block_id):
                self._unhashed.remove(block_id)
            ref_counts[block_id] += 1

    def free_blocks(self, ordered_block_ids: Sequence[int]) -> list[int]:
        """Drop one reference from each block (each listed once), in the given order (callers pass
        tail-first); returns the blocks whose count reached zero, in that order.

        Those join the free queue: the cache keeps those holding content (`PrefixCache.unlock`,
        at its tail), the others go to the head in the given order, the first of them the new head
        (vLLM's `prepend_n`).
        """
        ref_counts, kept = self.ref_counts, []
        self.num_ref_count_changes += 1
        for block_id in ordered_block_ids:
            count = ref_counts[block_id] - 1
            ref_counts[block_id] = count
            if count:
                assert count > 0, f"block {block_id} freed too often"
                kept.append(block_id)
        num_freed = len(ordered_block_ids) - len(kept)
        # still shared: mostly a table's prefix hit, its leading blocks, listed last; then the freed are the rest,
        # a slice (hot: every block of every finished request), else picked out one by one
        if ordered_block_ids[num_freed:] == kept:
            freed = list(ordered_block_ids[:num_freed])
        else:
            freed = [b for b in ordered_block_ids if not ref_counts[b]]
        self._unhashed.extend(reversed(self.cache.unlock(freed)))  # the stack's end is the head
        return freed

    def state_key(self) -> tuple[Any, ...] | None:
        """The ref counts, the free queue in order and the cache's state (`PrefixCache.state_key`; None: it cannot
        say), hashable: what `KVAllocator.state_key` takes of a pool."""
        cache = self.cache.state_key()
        return None if cache is None else (tuple(self.ref_counts), tuple(self.free_queue), cache)

    def check_invariants(self) -> None:
        """Blocks are conserved and the queue, counts and the cache agree."""
        # A recount, in C-level loops (map, sum, any: it runs at every step of a checked run); a failed
        # check finds the block to name only then.
        first, ref_counts = (1 if self.null_block else 0), self.ref_counts
        if min(ref_counts, default=0) >= 0:  # blocks whose ref_count > 0 are those not 0 (counted faster)
            in_use = len(ref_counts) - first - (ref_counts.count(0) - (first and not ref_counts[0]))
        else:  # a count below 0 (`free_blocks` asserts none) is not in use, and is caught below
            in_use = sum(map((0).__lt__, islice(ref_counts, first, None)))
        free_queue = self.free_queue
        assert in_use + len(free_queue) == self.num_usable_blocks, "blocks not conserved"
        assert len(set(free_queue)) == len(free_queue), "a block is in the free queue twice"
        assert not any(map(ref_counts.__getitem__, free_queue)), \
            f"free block {next(b for b in free_queue if ref_counts[b])} has references"
        assert NULL_BLOCK_ID not in free_queue or not self.null_block
        self.cache.check_invariants(ref_counts)


class PoolSlots:
    """Slot counts of an allocator over one `BlockPool` (`self.pool`, `self.block_size`):
    a slot is one token's place in one block id."""

    pool: BlockPool
    block_size: int

    @property
    def num_total_slots(self) -> int:
        return self.pool.num_usable_blocks * self.block_size

    @property
    def num_held_slots(self) -> int:
        return (self.pool.num_usable_blocks - self.pool.num_free_blocks) * self.block_size

    @property
    def num_free_slots(self) -> int:
        return self.pool.num_free_blocks * self.block_size

    @property
    def usage(self) -> float:
        return self.pool.usage

    def external_fragmentation_slots(self, next_request_slots: int | None) -> int:
        """Zero by construction: any free block can serve any sequence."""
        return 0
