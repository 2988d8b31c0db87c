"""SGLang's radix cache behind the prefix-cache seam: `RadixCache` over a vLLM-style block pool.

    pool block = one radix page (page_size = block_size), keyed by its chained content hash
    a block with references  -> one lock on its page (`RadixCache.inc_lock_ref(node, page)`)
    a free block in the tree -> evictable; `evict` takes least recently *used* leaves first

Where it differs from the hash chain (`kvsim.kv.prefix_cache.HashChainCache`), for the same hits
while nothing is evicted:

* eviction order: SGLang's LRU over unlocked leaves, by the last match or insert that touched a
  node, so a prefix that was looked up (a request waiting for it) or that other conversations
  extend stays; vLLM's free queue evicts in the order blocks were freed, a request's last block
  first, whatever was looked up since;
* granularity: SGLang evicts whole leaf nodes (a run of pages), so an eviction can free more
  blocks than asked; those are kept here as plain free blocks (`_spare`) and reused first;
* a sequence whose leading blocks the tree holds in other blocks (two requests computed the same
  content at once; EAGLE recomputes a hit's last block, `kvsim.sched.admission.Admission.lookup`) is
  pointed at the tree's blocks and its own are freed (`insert` returns the pairs; the allocator
  swaps them), as SGLang's insert frees a request's duplicate KV and points the request at the
  tree's; its blocks past them are then cached below, as SGLang's are: a node's blocks must be held
  by whoever holds its descendants. It kept its own, and cached none of its blocks past them, so
  no later request hit them (an EAGLE request's later blocks never: hits far below the hash
  chain's with nothing evicted). A sequence that shares blocks the tree holds under other content
  (a sample forked from its parent after a preemption's recompute shares the parent's output
  blocks, which its own content names apart) caches nothing: a block is one page of one node.

Pages are blocks here: a match covers whole blocks, as SGLang's does with page_size = block size.
SGLang's default page_size 1 (token-granular matches over a per-token pool) is `block_size = 1`:
no partial block exists, so none needs a copy; a 16-token block gives up the matches that end
inside a block (docs/policies.md, "Partial-block matches").
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from kvsim.kv.protocol import PrefixHit
from kvsim.kv.radix_cache import RadixCache, TreeNode
from kvsim.workload.content import Content


class _Evictable(Collection[int]):
    """The cache's evictable blocks (spare ones, then the tree's free ones) as one live collection:
    `len` is O(1); iteration follows the order `RadixPrefixCache.evict` would take them."""

    __slots__ = ("_cache",)

    def __init__(self, cache: RadixPrefixCache) -> None:
        self._cache = cache

    def __len__(self) -> int:
        return len(self._cache._spare) + self._cache._num_free_cached

    def __contains__(self, block_id: object) -> bool:
        """Spare, or in the tree with no lock on its page (no reference)."""
        if not isinstance(block_id, int):
            return False
        where = self._cache.tree.where(block_id)
        return block_id in self._cache._spare or (where is not None and where[0].page_locks[where[1]] == 0)

    def __iter__(self) -> Iterator[int]:
        """Spare blocks, then whole LRU leaves (a parent once all its children are gone), as `evict`."""
        cache = self._cache
        yield from cache._spare
        tree = cache.tree
        heap = [(leaf.last_access, leaf.node_id, leaf) for leaf in tree.evictable_leaves]
        heapq.heapify(heap)
        gone: set[int] = set()
        while heap:
            _, _, node = heapq.heappop(heap)
            yield from node.value
            gone.add(node.node_id)
            parent = node.parent
            if parent is not None and parent is not tree.root and parent.lock_ref == 0 \
                    and all(c.node_id in gone for c in parent.children.values()):
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))


class RadixPrefixCache:
    """`kvsim.kv.prefix_cache.PrefixCache` over SGLang's `RadixCache` (see the module docstring)."""

    __slots__ = ("block_size", "tree", "_spare", "_num_free_cached", "evictable")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.tree = RadixCache(block_size)
        self._spare: list[int] = []  # evicted with their node beyond what `evict` was asked for: plain, free
        self._num_free_cached = 0  # blocks in the tree with no reference
        self.evictable = _Evictable(self)  # `PrefixCache.evictable`: its len, and eviction order

    def match(self, content: Content, num_tokens: int) -> PrefixHit:
        """SGLang's `match_prefix` on the full blocks before the last token (it splits the node the
        match ends in and refreshes the access time of the path, as SGLang's does)."""
        keys = content.block_hashes(self.block_size, (num_tokens - 1) // self.block_size)
        values = self.tree.match_prefix(keys).values
        return PrefixHit(len(values) * self.block_size, tuple(values))

    def cached_prefix(self, content: Content, num_blocks: int) -> list[int]:
        """`PrefixCache.cached_prefix`: `RadixCache.cached_values`, no access time refreshed, no node split."""
        return self.tree.cached_values(content.block_hashes(self.block_size, num_blocks))

    def insert(self, content: Content, block_table: Sequence[int], first_block: int,
               num_full_blocks: int) -> list[tuple[int, int]]:
        """SGLang's insert of the table's full blocks, each new one locked (it is in use). When the tree
        holds the table's leading blocks in other blocks, nothing is inserted and those are returned as
        (index, cached block) pairs for the allocator to swap in (see the module docstring)."""
        keys = content.block_hashes(self.block_size, num_full_blocks)
        table = block_table[:num_full_blocks]
        start = self.tree.insert_if_cached_as(keys, table)
        if start is None:
            cached = self.tree.cached_values(keys)
            return [(i, block) for i, (own, block) in enumerate(zip(table, cached, strict=False)) if own != block]
        for block_id in block_table[start:num_full_blocks]:  # in use: each holds a lock on its page
            where = self.tree.where(block_id)
            assert where is not None
            self.tree.inc_lock_ref(*where)
        return []

    def lock(self, block_id: int) -> bool:
        """A hit takes a free cached block: a lock on its page. The pool locks a hit deepest block first
        (`PagedAllocator._start`), so unlocked pages after this one in its node mean the hit ends inside
        the node (`_cut_after_locks`)."""
        where = self.tree.where(block_id)
        if where is None:
            return False
        self.tree.inc_lock_ref(*where)
        self._cut_after_locks(where[0])
        self._num_free_cached -= 1
        return True

    def unlock(self, block_ids: list[int]) -> list[int]:
        plain, nodes = [], {}
        for block_id in block_ids:
            where = self.tree.where(block_id)
            if where is None:
                plain.append(block_id)
            else:
                self.tree.dec_lock_ref(*where)
                self._num_free_cached += 1
                nodes[where[0].node_id] = where[0]
        for node in nodes.values():
            self._cut_after_locks(node)
        return plain

    def _cut_after_locks(self, node: TreeNode) -> None:
        """Cut `node` after its last locked page when free pages follow it.

        The blocks in use along a path are a prefix of it, so a node's locked pages are a prefix of its run;
        they end inside the run only where a hit was trimmed after its match cut the path there (EAGLE gives a
        hit's last block back, `kvsim.sched.admission.Admission.lookup`): when that hit is locked, or when the
        sequence that held the pages past it frees them. SGLang locks whole nodes, and a free page in a
        locked node could never be evicted: the node is cut where the trimmed hit ends, as a match ending
        there would have cut it."""
        locks = node.page_locks
        last = next((i for i in range(len(locks) - 1, -1, -1) if locks[i]), -1)
        if 0 <= last < len(locks) - 1:
            self.tree.split(node, last + 1)

    def evict(self, num_blocks: int) -> list[int]:
        """Spare blocks first, then SGLang's eviction of whole LRU leaves; what it frees beyond
        `num_blocks` becomes spare."""
        if len(self._spare) < num_blocks:
            freed = self.tree.evict((num_blocks - len(self._spare)) * self.block_size)
            self._num_free_cached -= len(freed)
            self._spare.extend(freed)
        assert len(self._spare) >= num_blocks, "asked to evict more than is evictable"
        taken, self._spare = self._spare[:num_blocks], self._spare[num_blocks:]
        return taken

    def state_key(self) -> tuple[Any, ...]:
        """`PrefixCache.state_key`: the tree (`RadixCache.state_key`: its access order too, which the pool's free
        queue holds only for the free blocks, where a locked node's place decides once it is freed) and the spare
        blocks in the order `evict` takes them. It was None, so a livelock check never fired with this cache: a
        request preempting itself for ever ran until the clock's end (`tests/test_livelock.py`)."""
        return self.tree.state_key(), tuple(self._spare), self._num_free_cached

    def check_invariants(self, ref_counts: Sequence[int]) -> None:
        """The tree balances; each block in it holds one lock per reference state (1 if in use);
        its free blocks are exactly the evictable ones; spare blocks are free and outside it."""
        self.tree.check_invariants()
        free_cached = 0
        stack: list[TreeNode] = list(self.tree.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for block_id, locks in zip(node.value, node.page_locks, strict=True):
                assert locks == (1 if ref_counts[block_id] else 0), f"block {block_id}: {locks} locks"
                free_cached += not ref_counts[block_id]
        assert free_cached == self._num_free_cached, "free cached count drifted"
        assert free_cached * self.block_size == self.tree.evictable_size, "a free block is protected"
        for block_id in self._spare:
            assert ref_counts[block_id] == 0 and self.tree.where(block_id) is None
