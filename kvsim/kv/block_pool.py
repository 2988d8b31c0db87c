"""Physical KV blocks: ref counts, the free queue (eviction order) and the prefix-cache map.

This is mechanism only (vLLM v1's `BlockPool`); which blocks a sequence uses is policy and
lives in `paged.py`.

    free queue (head = next to reuse)                         tail (reused last)
    ┌───────────────────────────┬─────────────────────────────────────────────┐
    │ freed blocks with no hash │ freed cached blocks, least recently freed → │
    └───────────────────────────┴─────────────────────────────────────────────┘

* A block is *in use* when `ref_count > 0`, otherwise it is in the free queue.
* A freed block with a content hash goes to the tail (LRU: its content may be hit again);
  one without a hash goes to the head (nothing to keep).
* Eviction is lazy: a cached block stays findable by hash while free, and is dropped from
  the hash map only when `get_new_blocks` pops it for reuse.
* A prefix hit on a free cached block (`touch`) pulls it out of the queue in O(1).
* With `null_block=True`, block 0 is reserved (vLLM's null block) and never handed out.

Blocks enter the queue only at the head (no hash) or at the tail (hashed), and a block's hash
changes only while it is in use, so the queue is always its unhashed blocks followed by its
hashed ones. It is kept as those two parts: a stack (a list whose end is the head, so freeing
a sequence's blocks is one `extend`) and an ordered dict (the LRU part).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

NULL_BLOCK_ID = 0


class BlockPool:
    """`num_blocks` physical blocks; `num_usable_blocks` excludes the null block."""

    __slots__ = ("num_blocks", "null_block", "ref_counts", "block_hashes", "_unhashed", "_hashed", "cached")

    def __init__(self, num_blocks: int, null_block: bool = True) -> None:
        assert num_blocks > int(null_block), "a pool needs at least one usable block"
        self.num_blocks = num_blocks
        self.null_block = null_block
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[int | None] = [None] * num_blocks
        first = 1 if null_block else 0
        # the free queue's head part: free blocks without a hash, the head at the end (block `first` first)
        self._unhashed: list[int] = list(range(num_blocks - 1, first - 1, -1))
        # its tail part: free hashed blocks -> their hash, least recently freed first; OrderedDict as an
        # O(1) doubly linked list: popitem(last=False) pops the oldest, pop(key) removes from the middle
        self._hashed: OrderedDict[int, int] = OrderedDict()
        self.cached: dict[int, int] = {}  # content hash -> block id

    @property
    def free_queue(self) -> list[int]:
        """The free blocks in eviction order (head first: the next handed out)."""
        return [*reversed(self._unhashed), *self._hashed]

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - int(self.null_block)

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_count 0, cached or not: all can be handed out."""
        return len(self._unhashed) + len(self._hashed)

    @property
    def usage(self) -> float:
        """vLLM's `kv_cache_usage_perc`: 1 − free / usable (cached-but-free counts as free)."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def get_new_blocks(self, n: int) -> list[int]:
        """Pop `n` blocks from the head, evicting their cached content; each gets ref_count 1.

        The caller checks `num_free_blocks >= n` first ("can't" is decided before, not here).
        """
        assert n <= self.num_free_blocks, f"asked for {n} blocks, {self.num_free_blocks} free"
        unhashed, ref_counts = self._unhashed, self.ref_counts
        num_unhashed = min(n, len(unhashed))
        popped = unhashed[len(unhashed) - num_unhashed:]
        popped.reverse()
        del unhashed[len(unhashed) - num_unhashed:]
        for block_id in popped:
            ref_counts[block_id] = 1
        if num_unhashed < n:  # then the least recently freed hashed blocks, evicted
            popitem, block_hashes, cached = self._hashed.popitem, self.block_hashes, self.cached
            append = popped.append
            for _ in range(n - num_unhashed):
                block_id, block_hash = popitem(False)
                del cached[block_hash]  # a free hashed block is the one its hash maps to (`cache_new_blocks`)
                block_hashes[block_id] = None
                ref_counts[block_id] = 1
                append(block_id)
        return popped

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take one more reference to each block (a prefix hit or a fork)."""
        for block_id in block_ids:
            if self.ref_counts[block_id] == 0:
                if block_id in self._hashed:
                    del self._hashed[block_id]
                else:
                    self._unhashed.remove(block_id)
            self.ref_counts[block_id] += 1

    def free_blocks(self, ordered_block_ids: Sequence[int]) -> list[int]:
        """Drop one reference from each block (each listed once), in the given order (callers pass
        tail-first); returns the blocks whose count reached zero, in that order.

        Those join the free queue: at the tail if cached, at the head if not (while nothing is
        cached, no block carries a hash: they all go to the head at once).
        """
        ref_counts, shared = self.ref_counts, False
        for block_id in ordered_block_ids:
            count = ref_counts[block_id] - 1
            ref_counts[block_id] = count
            if count:
                assert count > 0, f"block {block_id} freed too often"
                shared = True
        freed = [b for b in ordered_block_ids if not ref_counts[b]] if shared else list(ordered_block_ids)
        if not self.cached:
            self._unhashed.extend(freed)
            return freed
        block_hashes, unhashed, hashed = self.block_hashes, self._unhashed.append, self._hashed
        for block_id in freed:
            if (block_hash := block_hashes[block_id]) is None:
                unhashed(block_id)
            else:
                hashed[block_id] = block_hash
        return freed

    def cache_block(self, block_id: int, block_hash: int) -> None:
        """Record a full block's content hash so that later requests can hit it.

        If another block already holds the same content (two requests computed it at the
        same time), the first stays the one found by lookups and this one is not cached.
        """
        assert self.block_hashes[block_id] is None
        self.cache_new_blocks((block_id,), (block_hash,))

    def cache_new_blocks(self, block_ids: Iterable[int], block_hashes: Iterable[int]) -> None:
        """`cache_block` for each pair, in order, skipping blocks that already carry a hash."""
        own, setdefault, ref_counts = self.block_hashes, self.cached.setdefault, self.ref_counts
        for block_id, block_hash in zip(block_ids, block_hashes, strict=True):
            # the block is uncached, so the hash maps to it only if this call maps it
            if own[block_id] is None and setdefault(block_hash, block_id) == block_id:
                assert ref_counts[block_id] > 0
                own[block_id] = block_hash

    def lookup(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def check_invariants(self) -> None:
        """Blocks are conserved and the queue, counts and hash map agree."""
        first = 1 if self.null_block else 0
        in_use = sum(1 for b in range(first, self.num_blocks) if self.ref_counts[b] > 0)
        free_queue = self.free_queue
        assert in_use + len(free_queue) == self.num_usable_blocks, "blocks not conserved"
        assert len(set(free_queue)) == len(free_queue), "a block is in the free queue twice"
        for block_id in free_queue:
            assert self.ref_counts[block_id] == 0, f"free block {block_id} has references"
        for block_id in self._unhashed:
            assert self.block_hashes[block_id] is None, f"hashed block {block_id} in the free queue's head part"
        assert NULL_BLOCK_ID not in free_queue or not self.null_block
        for block_id, block_hash in self._hashed.items():
            assert self.block_hashes[block_id] == block_hash, f"free queue's hash stale at block {block_id}"
        for block_hash, block_id in self.cached.items():
            assert self.block_hashes[block_id] == block_hash, f"hash map stale at block {block_id}"
        assert sum(h is not None for h in self.block_hashes) == len(self.cached)


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
