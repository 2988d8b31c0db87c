"""The prefix cache: which blocks hold content a later request can reuse, and which to evict first.

One component behind a small interface (`PrefixCache`), so that vLLM's hash chain
(`HashChainCache`, the first implementation) and a radix tree (SGLang's RadixCache) are
interchangeable. The `BlockPool` keeps the mechanism (ref counts, the plain free list) and
asks its cache about the blocks that hold content; the allocators ask it for hits.

    BlockPool free queue     plain free blocks (no content)  │  the cache's evictable blocks
    (head = next reused)     head part, a stack              │  `evict` order: LRU, least recently freed first

Contract (every implementation):

* `match(content, num_tokens)` is the longest cached prefix of **full blocks** from block 0,
  never covering the last token (its logits must be computed: a full hit still recomputes the
  last block). A hit of k blocks means the first k · block_size tokens are exactly the
  content's, so a request may start from them (`PrefixHit.block_ids`, in order). `match`
  changes nothing: the caller takes the blocks (`BlockPool.touch`) only when it admits.
* `insert(content, block_table, first_block, num_full_blocks)`: blocks
  `block_table[first_block:num_full_blocks]` now hold the content's full blocks of those
  indices (in use, ref_count > 0). Content already cached under another block stays found
  there (the first block to hold it wins). Whether this block is kept as well is the
  implementation's: the hash chain caches it as a duplicate, found once the blocks cached before
  it are evicted (vLLM's `BlockHashToBlockMap` does not de-duplicate, so that block tables stay
  append-only), and returns nothing; the radix tree (SGLang's holds one copy of a prefix) caches
  nothing of a table whose leading blocks it holds under other ids, and returns those (index in the
  table, its cached block) pairs: the allocator points the table at the cached blocks, frees its
  own (SGLang's insert frees a request's duplicate KV for the tree's) and inserts again.
* Reference counting lives in the pool; the cache hears the transitions of blocks it
  holds content for: `unlock(blocks)` when blocks lose their last reference (they become
  evictable at the LRU tail, in the order given; the pool frees a request's blocks tail-first,
  so its prefix's first blocks are evicted last, as vLLM's free queue) and returns the
  blocks it holds no content for, in the order given (the pool's plain free list gets those, the
  first the new head: vLLM's `prepend_n`); `lock(block)` when a
  free block gains a reference (a hit), True if it was one of its evictable blocks.
* The cached content is prefix-closed: a chain's block k + 1 is cached only while its block k is (every
  holder of block k + 1 holds a block of hash k, and frees it after; a hash leaves only with its last
  block), so the walk from block 0 finds every cached block of a content (`tests/test_prefix_closed.py`).
* `evict(n)`: the `n` next evictable blocks, content forgotten (lazy eviction: a free cached
  block stays hittable until it is evicted for reuse). The pool evicts only when its plain
  free list is empty, so `num_free_blocks` counts evictable blocks as free, as vLLM's
  `kv_cache_usage_perc` does.
* `evictable`: the evictable blocks, iterated in eviction order (the next evicted first); one
  object for the cache's life, so the pool reads its `len` without a call into the cache.

Pure Python; no kvsim imports but the content and hit types.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_not
from typing import Any, Protocol, cast

from kvsim.kv.lru_runs import LruRuns
from kvsim.kv.protocol import PrefixHit
from kvsim.workload.content import Content


class PrefixCache(Protocol):
    """What the block pool and the paged allocators use of a prefix cache (see the module docstring)."""

    def match(self, content: Content, num_tokens: int) -> PrefixHit: ...
    def cached_prefix(self, content: Content, num_blocks: int) -> list[int]:
        """The blocks holding the longest cached prefix of the content's first `num_blocks` full blocks, changing
        nothing (no access time, split or memo): what is cached, asked without a lookup."""
    def insert(self, content: Content, block_table: Sequence[int], first_block: int,
               num_full_blocks: int) -> list[tuple[int, int]]: ...
    def lock(self, block_id: int) -> bool: ...
    def unlock(self, block_ids: list[int]) -> list[int]: ...
    def evict(self, num_blocks: int) -> list[int]: ...
    @property
    def evictable(self) -> Collection[int]: ...
    def state_key(self) -> tuple[Any, ...] | None:
        """Its content as a hashable value, its eviction order aside (the pool's free queue holds it); None where it
        cannot say (`KVAllocator.state_key`)."""
    def check_invariants(self, ref_counts: Sequence[int]) -> None:
        """Raise AssertionError unless its books balance against the pool's ref counts."""


class HashChainCache:
    """vLLM v1's prefix cache: each full block keyed by its chained content hash.

    `cached` maps a hash to the block found for it; `duplicates` a hash to the other blocks holding it,
    in the order they were cached (the next found when `cached`'s is evicted, as vLLM's
    `BlockHashToBlockMap.get_one_block` takes the first left); `block_hashes[b]` is block b's hash (None:
    it holds no cached content); `evictable` is the LRU of free cached blocks (`LruRuns`: each `unlock`'s
    cached blocks appended as one run, a hit's block dropped from anywhere in O(1), `evict` taking from the
    head). A free block holds a hash exactly when it is evictable, so `lock` asks `block_hashes`. Besides
    `PrefixCache`, it speaks in keys (`lookup`, `insert_keys`): the hybrid allocator keys each group's blocks
    apart, and decode bursts register blocks of several sequences in one interleaved order.
    """

    __slots__ = ("block_size", "block_hashes", "cached", "duplicates", "evictable", "_memo", "_memo_miss",
                 "_memo_blocks")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.block_hashes: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # content hash -> block id
        self.duplicates: dict[int, list[int]] = {}  # content hash -> further blocks holding it, oldest first
        self.evictable = LruRuns()  # the free cached blocks, least recently freed first
        # The last `match`, kept while its answer stands (a blocked waiting head is looked up again every
        # step until it fits): (content, num_tokens, hit), the hash its walk stopped at (None: no miss) and
        # the hit's blocks. `insert_keys` of that missing hash or `evict` of a hit block drops it.
        self._memo: tuple[Content, int, PrefixHit] | None = None
        self._memo_miss: int | None = None
        self._memo_blocks: frozenset[int] = frozenset()

    def match(self, content: Content, num_tokens: int) -> PrefixHit:
        """Walk the content's chained hashes from block 0; stop at the first miss.

        The walk's answer changes only when its missing hash is cached or one of its hit blocks is
        evicted (the map changes nowhere else), so the last answer is returned again until then.
        """
        memo = self._memo
        if memo is not None and memo[0] is content and memo[1] == num_tokens:
            return memo[2]
        bs = self.block_size
        max_blocks = (num_tokens - 1) // bs
        hits, lookup, miss = [], self.cached.get, None  # bound once: a call per prompt block
        for block_hash in content.block_hashes(bs, max_blocks):
            block_id = lookup(block_hash)
            if block_id is None:
                miss = block_hash
                break
            hits.append(block_id)
        hit = PrefixHit(len(hits) * bs, tuple(hits))
        self._memo, self._memo_miss, self._memo_blocks = (content, num_tokens, hit), miss, frozenset(hits)
        return hit

    def cached_prefix(self, content: Content, num_blocks: int) -> list[int]:
        """`PrefixCache.cached_prefix`: the blocks `match` finds for those blocks, its memo kept."""
        blocks, lookup = [], self.cached.get
        for block_hash in content.block_hashes(self.block_size, num_blocks):
            block_id = lookup(block_hash)
            if block_id is None:
                break
            blocks.append(block_id)
        return blocks

    def insert(self, content: Content, block_table: Sequence[int], first_block: int,
               num_full_blocks: int) -> list[tuple[int, int]]:
        """Cache the blocks (`insert_keys`); a duplicate is kept, so no table needs another block."""
        hashes = content.block_hashes(self.block_size, num_full_blocks)
        self.insert_keys(block_table[first_block:num_full_blocks], hashes[first_block:num_full_blocks])
        return []

    def insert_keys(self, block_ids: Iterable[int], keys: Iterable[int]) -> None:
        """Cache each block under its key, in order, skipping blocks that already carry one; a key already
        cached under another block keeps that one as the block lookups find, and this one is a duplicate."""
        own, setdefault = self.block_hashes, self.cached.setdefault
        for block_id, key in zip(block_ids, keys, strict=True):
            if own[block_id] is not None:
                continue
            own[block_id] = key
            if setdefault(key, block_id) != block_id:
                self.duplicates.setdefault(key, []).append(block_id)
        # the last match's walk would now go further (its missing hash was not cached while its memo stood)
        if self._memo_miss is not None and self._memo_miss in self.cached:
            self._memo = None

    def lookup(self, key: int) -> int | None:
        return self.cached.get(key)

    def lock(self, block_id: int) -> bool:
        """The pool calls this for a free block only, and a free block holding a hash is an evictable one."""
        if self.block_hashes[block_id] is None:
            return False
        self.evictable.discard(block_id)
        return True

    def unlock(self, block_ids: list[int]) -> list[int]:
        """The blocks that hold a hash join the LRU; the others (mostly none, or a freed table's partial last
        block, listed first as the pool frees tail-first) are returned. Picked by comprehensions, the plain ones
        by a second only when the first did not settle them (~40 instructions a block fewer than one loop with
        two appends: each append is a method call)."""
        if not self.cached:  # nothing cached: no block carries a hash
            return block_ids
        block_hashes = self.block_hashes
        hashed = [block_id for block_id in block_ids if block_hashes[block_id] is not None]
        if len(hashed) == len(block_ids):
            plain = []
        elif len(hashed) + 1 == len(block_ids) and block_hashes[block_ids[0]] is None:
            plain = block_ids[:1]
        else:
            plain = [block_id for block_id in block_ids if block_hashes[block_id] is None]
        self.evictable.extend(hashed)
        return plain

    def evict(self, num_blocks: int) -> list[int]:
        cached, duplicates, own = self.cached, self.duplicates, self.block_hashes
        block_hashes = cast("list[int]", own)  # the same list, read: an evictable block holds a hash
        evicted = self.evictable.take(num_blocks)  # the oldest first
        if not duplicates:  # each hash is held by one block (nearly always): it leaves with its block
            for block_id in evicted:
                del cached[block_hashes[block_id]]
                own[block_id] = None
        else:
            for block_id in evicted:
                self._uncache(block_id, block_hashes[block_id])
        if self._memo is not None and not self._memo_blocks.isdisjoint(evicted):
            self._memo = None  # the last match hit a block that is gone
        return evicted

    def forget(self, block_id: int) -> None:
        """Take a held block's hash out of the cache: lookups stop finding it there, and freed it is a plain
        block (the free queue's head). For a block vLLM would not have cached yet
        (`KVAllocator.forget_newest_hashes`)."""
        block_hash = self.block_hashes[block_id]
        if block_hash is None:
            return
        self._uncache(block_id, block_hash)
        if block_id in self._memo_blocks:
            self._memo = None  # the last match hit it

    def _uncache(self, block_id: int, block_hash: int) -> None:
        """Drop `block_id` from the blocks holding `block_hash`; the hash stays found while another holds it."""
        others = self.duplicates.get(block_hash)
        if others is None:
            del self.cached[block_hash]
        else:
            if self.cached[block_hash] == block_id:
                self.cached[block_hash] = others.pop(0)
            else:
                others.remove(block_id)
            if not others:
                del self.duplicates[block_hash]
        self.block_hashes[block_id] = None

    def state_key(self) -> tuple[Any, ...]:
        """`PrefixCache.state_key`: each block's hash and the blocks found for each (its memos are caches of
        answers that stand: no state)."""
        return (tuple(self.block_hashes), tuple(self.cached.items()),
                tuple((key, tuple(blocks)) for key, blocks in self.duplicates.items()))

    def check_invariants(self, ref_counts: Sequence[int]) -> None:
        # the per-block checks in C-level loops (map, any, list ==; a checked run calls this at every step),
        # the block to name found only when one fails
        hash_of, evictable, cached = self.block_hashes.__getitem__, list(self.evictable), self.cached
        self.evictable.check_invariants()
        assert not any(map(ref_counts.__getitem__, evictable)), \
            f"evictable block {next(b for b in evictable if ref_counts[b])} has references"
        assert None not in map(hash_of, evictable), \
            f"evictable block {next(b for b in evictable if hash_of(b) is None)} holds no hash"
        assert list(map(hash_of, cached.values())) == list(cached), \
            f"hash map stale at block {next(b for h, b in cached.items() if hash_of(b) != h)}"
        for block_hash, others in self.duplicates.items():
            assert others and block_hash in self.cached, "a duplicate without the block its hash maps to"
            for block_id in others:
                assert self.block_hashes[block_id] == block_hash, f"duplicate block {block_id}'s hash stale"
            assert len(set(others)) == len(others) and self.cached[block_hash] not in others
        num_duplicates = sum(map(len, self.duplicates.values()))
        hashes = self.block_hashes
        assert len(hashes) - hashes.count(None) == len(self.cached) + num_duplicates
        # the cached blocks (a hash) with ref_count 0
        free_cached = list(compress(ref_counts, map(is_not, hashes, repeat(None)))).count(0)
        assert free_cached == len(self.evictable), "a free cached block is not evictable"


@dataclass(slots=True)
class PrefixCacheStats:
    """vLLM's prefix-cache counters, in tokens (`PrefixCacheStats.record`, vllm/v1/metrics/stats.py):
    queries and hits of first admissions; re-admissions after a recompute preemption, which re-hit
    their own blocks, are counted apart. kvsim records a request once, when it is admitted.

    vLLM v0 counts blocks instead (`record_blocks`), the hit rate it logs: `num_query_blocks`,
    `num_hit_blocks`, every admission's, re-admissions included."""

    num_query_tokens: int = 0
    num_hit_tokens: int = 0
    num_preempted_query_tokens: int = 0
    num_preempted_hit_tokens: int = 0
    num_query_blocks: int = 0
    num_hit_blocks: int = 0

    def record(self, num_tokens: int, num_hit_tokens: int, preempted: bool) -> None:
        if preempted:
            self.num_preempted_query_tokens += num_tokens
            self.num_preempted_hit_tokens += num_hit_tokens
        else:
            self.num_query_tokens += num_tokens
            self.num_hit_tokens += num_hit_tokens

    def record_blocks(self, num_full_blocks: int, num_hit_blocks: int) -> None:
        """vLLM v0's `CacheMetricData` (vllm/core/block/prefix_caching_block.py): an allocation queries each
        full block of the tokens it allocates (`allocate_immutable_block`, one `query` each) and hits those the
        cache holds, computed yet or not; `get_prefix_cache_hit_rate` is hits / queries over the run."""
        self.num_query_blocks += num_full_blocks
        self.num_hit_blocks += num_hit_blocks
