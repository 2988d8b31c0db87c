"""A radix tree of KV pages with SGLang's `RadixCache` semantics (python/sglang/srt/mem_cache/radix_cache.py).

    root (lock_ref 1, never evicted)
     ├── [p0 p1 p2]            lock_ref 1   (a running request matched p0..p4)
     │    ├── [p3 p4]          lock_ref 1
     │    └── [p9]             lock_ref 0   evictable leaf
     └── [q0]                  lock_ref 0   evictable leaf

* A key is a sequence of *page keys*, one per `page_size` tokens: SGLang's page-aligned token key
  (`key[: len(key) // page_size * page_size]`) grouped into pages, so page i's key stands for its
  `page_size` tokens (`page_keys` groups token ids that way). A node holds a run of pages and one
  value per page (a KV block id: the cache owns the values stored in it).
* `match_prefix` walks from the root and returns the values of the longest cached prefix and the
  node it ends at, splitting a node whose run the match ends inside (no data is duplicated). It
  refreshes the access time of every node on the path.
* `insert` adds a key's pages with their values and returns how many leading pages were already
  cached: the caller frees its own values for those (the tree keeps the first copy, as SGLang's
  `cache_finished_req` frees the duplicates).
* `inc_lock_ref(node)` / `dec_lock_ref(node)` add / drop one lock on every node from `node` up to
  (not including) the root while a request uses that prefix; a locked node is *protected*, an
  unlocked one *evictable*. Sizes are in tokens (pages × `page_size`), as SGLang counts them.
  A lock is attached to one page of `node`: its last by default (SGLang's, where a request locks
  the node its match ended at); `page=` attaches it to an earlier one, so that splitting the node
  later leaves the lock above the cut with the pages it protects (`lock_ref` = locks on the node's
  own pages + its children's `lock_ref`). `where(value)` finds the node and page holding a value.
* `evict(num_tokens)` removes unlocked leaves, least recently used first (SGLang's default
  `LRUStrategy`), a parent that becomes an unlocked leaf joining the candidates, until at least
  `num_tokens` tokens are freed or nothing evictable is left; it returns the freed values.

Time is a logical clock (one tick per match or insert), not `time.monotonic()`, so runs are
deterministic; ties in access time go to the older node (lower id).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any


def page_keys(token_ids: Sequence[Hashable], page_size: int) -> list[tuple[Hashable, ...]]:
    """Token ids as page keys: the page-aligned prefix cut into `page_size`-token tuples."""
    num_pages = len(token_ids) // page_size
    return [tuple(token_ids[i * page_size:(i + 1) * page_size]) for i in range(num_pages)]


@dataclass(slots=True, eq=False)
class TreeNode:
    """A run of pages: `key[i]` is page i's key, `value[i]` its value; `lock_ref` counts the locks
    held on this node or below it."""

    node_id: int
    key: list[Hashable]
    value: list[int]
    parent: TreeNode | None
    children: dict[Hashable, TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    page_locks: list[int] = field(default_factory=list)  # locks attached to each page (see `inc_lock_ref`)


@dataclass(frozen=True, slots=True)
class MatchResult:
    """The values of the longest cached prefix (one per page) and the node it ends at."""

    values: list[int]
    last_node: TreeNode


class RadixCache:
    """SGLang's radix prefix cache over page keys (see the module docstring for the contract)."""

    __slots__ = ("page_size", "root", "evictable_leaves", "_evictable_pages", "_protected_pages", "_clock",
                 "_next_id", "_where")

    def __init__(self, page_size: int) -> None:
        assert page_size > 0
        self.page_size = page_size
        self._next_id = 0
        self._where: dict[int, TreeNode] = {}  # value -> the node holding it
        self.root = self._new_node([], [], None)
        self.root.lock_ref = 1  # as SGLang: the root is never evictable
        self.evictable_leaves: set[TreeNode] = set()
        self._evictable_pages = 0
        self._protected_pages = 0
        self._clock = 0

    # ------------------------------------------------------------------ sizes
    @property
    def evictable_size(self) -> int:
        """Tokens in unlocked nodes (SGLang's `evictable_size()`)."""
        return self._evictable_pages * self.page_size

    @property
    def protected_size(self) -> int:
        """Tokens in locked nodes (SGLang's `protected_size()`)."""
        return self._protected_pages * self.page_size

    def total_size(self) -> int:
        """Tokens stored in the tree."""
        return sum(len(node.key) for node in self._nodes()) * self.page_size

    # ----------------------------------------------------------------- lookup
    def match_prefix(self, key: Sequence[Hashable]) -> MatchResult:
        """The longest cached prefix of `key` (page keys); splits the node the match ends inside."""
        node, _, values, _ = self._walk(key, self._tick())
        return MatchResult(values, node)

    def insert(self, key: Sequence[Hashable], values: Sequence[int]) -> int:
        """Add `key`'s pages with `values` (one per page); returns the number of leading pages that
        were already cached (their `values` stay the caller's to free)."""
        assert len(key) == len(values), "one value per page"
        now = self._tick()
        node, start, _, _ = self._walk(key, now)
        if start < len(key):
            self._add_leaf(node, key[start:], values[start:], now)
        return start

    def insert_if_cached_as(self, key: Sequence[Hashable], values: Sequence[int]) -> int | None:
        """`match_prefix(key)`, then, when the cached prefix holds `values`' leading values and the tree holds
        none of the others, `insert(key, values)`: the same effects as those two calls (two clock ticks, the
        path's access times, the split, the new leaf), in one walk. Returns `insert`'s count, or None (nothing
        inserted) when the tree holds the prefix in other values, or one of the values past it under another
        key (a value is one page of one node: a forked sequence shares pages its parent cached under the
        parent's keys, and may name them by keys of its own)."""
        assert len(key) == len(values), "one value per page"
        node, start, cached, path = self._walk(key, self._tick())
        if list(values[:len(cached)]) != cached or any(value in self._where for value in values[start:]):
            return None
        now = self._tick()  # `insert`'s walk: the same nodes (the lower part of a split is not on it)
        for visited in path:
            visited.last_access = now
        if start < len(key):
            self._add_leaf(node, key[start:], values[start:], now)
        return start

    def cached_values(self, key: Sequence[Hashable]) -> list[int]:
        """The values of the longest cached prefix of `key`, as `match_prefix` finds them, changing nothing
        (no access time, no split, no clock tick)."""
        node, start, values = self.root, 0, []
        while start < len(key) and key[start] in node.children:
            node = node.children[key[start]]
            matched = _common_length(node.key, key, start) if len(node.key) > 1 else 1
            values.extend(node.value[:matched])
            start += matched
            if matched < len(node.key):
                break
        return values

    def _walk(self, key: Sequence[Hashable], now: int) -> tuple[TreeNode, int, list[int], list[TreeNode]]:
        """Follow `key` from the root, marking each node on the way accessed at `now` and splitting the node
        a match ends inside (its upper part is the last on the path): (the last node, the pages matched,
        their values, the path from the root). The one walk of `match_prefix` and `insert` (SGLang's)."""
        node = self.root
        node.last_access = now
        path, values, start = [node], [], 0
        while start < len(key) and key[start] in node.children:
            child = node.children[key[start]]
            child.last_access = now
            matched = _common_length(child.key, key, start) if len(child.key) > 1 else 1
            split = matched < len(child.key)
            if split:
                child = self.split(child, matched)
            values.extend(child.value)
            node = child
            path.append(node)
            start += matched
            if split:
                break
        return node, start, values, path

    def _add_leaf(self, parent: TreeNode, key: Sequence[Hashable], values: Sequence[int], now: int) -> None:
        """A new evictable leaf below `parent` holding the pages `key` (values `values`), accessed at `now`."""
        leaf = self._new_node(list(key), list(values), parent)
        leaf.last_access = now
        parent.children[key[0]] = leaf
        self._evictable_pages += len(leaf.key)
        self._update_leaf_status(parent)
        self._update_leaf_status(leaf)

    def where(self, value: int) -> tuple[TreeNode, int] | None:
        """The node holding `value` and its page index there, or None if the tree does not hold it."""
        node = self._where.get(value)
        return None if node is None else (node, node.value.index(value))

    # ---------------------------------------------------------------- locking
    def inc_lock_ref(self, node: TreeNode, page: int = -1) -> int:
        """Lock the path from `node` to the root, the lock attached to `node`'s page `page` (its last
        by default); returns the change in evictable tokens (≤ 0). Locking the root (an empty match)
        does nothing, as in SGLang."""
        if node is self.root:
            return 0
        node.page_locks[page] += 1
        delta = 0
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable_pages -= len(node.key)
                self._protected_pages += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            self._update_leaf_status(node)
            assert node.parent is not None
            node = node.parent
        return delta * self.page_size

    def dec_lock_ref(self, node: TreeNode, page: int = -1) -> int:
        """Drop a lock `inc_lock_ref(node, page)` took; returns the change in evictable tokens (≥ 0)."""
        if node is self.root:
            return 0
        assert node.page_locks[page] > 0, f"node {node.node_id}: page {page} is not locked"
        node.page_locks[page] -= 1
        delta = 0
        while node is not self.root:
            assert node.lock_ref > 0, f"node {node.node_id} unlocked more often than locked"
            if node.lock_ref == 1:
                self._evictable_pages += len(node.key)
                self._protected_pages -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            self._update_leaf_status(node)
            assert node.parent is not None, "the node belongs to another tree"
            node = node.parent
        return delta * self.page_size

    # --------------------------------------------------------------- eviction
    def evict(self, num_tokens: int) -> list[int]:
        """Free unlocked leaves, least recently used first, until `num_tokens` tokens are freed or
        none is left; returns the freed values (the caller returns them to its pool)."""
        heap = [(leaf.last_access, leaf.node_id, leaf) for leaf in self.evictable_leaves]
        heapq.heapify(heap)
        freed: list[int] = []
        while len(freed) * self.page_size < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            freed.extend(leaf.value)
            parent = self._delete_leaf(leaf)
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return freed

    # ---------------------------------------------------------------- helpers
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _new_node(self, key: list[Hashable], value: list[int], parent: TreeNode | None) -> TreeNode:
        node = TreeNode(self._next_id, key, value, parent, page_locks=[0] * len(key))
        self._next_id += 1
        for v in value:
            self._where[v] = node
        return node

    def split(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut `child`'s run after `split_len` pages (as a match ending there does). The new upper node
        (returned) holds every lock
        `child` counted; the lower part keeps those not attached to the pages that moved up (SGLang's
        locks sit on a node's last page, so with them the lower part keeps all: its `lock_ref`)."""
        parent = child.parent
        assert parent is not None and 0 < split_len < len(child.key)
        upper = self._new_node(child.key[:split_len], child.value[:split_len], parent)
        upper.lock_ref, upper.last_access = child.lock_ref, child.last_access
        upper.page_locks = child.page_locks[:split_len]
        child.key, child.value = child.key[split_len:], child.value[split_len:]
        child.page_locks = child.page_locks[split_len:]
        child.parent = upper
        upper.children[child.key[0]] = child
        parent.children[upper.key[0]] = upper
        moved = sum(upper.page_locks)
        if moved:  # those locks no longer pass through `child`
            child.lock_ref -= moved
            if child.lock_ref == 0:
                self._protected_pages -= len(child.key)
                self._evictable_pages += len(child.key)
                self._update_leaf_status(child)
        return upper  # not a leaf (it has `child`)

    def _delete_leaf(self, leaf: TreeNode) -> TreeNode:
        parent = leaf.parent
        assert parent is not None and not leaf.children and leaf.lock_ref == 0
        removed = parent.children.pop(leaf.key[0])
        assert removed is leaf
        for v in leaf.value:
            del self._where[v]
        self._evictable_pages -= len(leaf.key)
        self.evictable_leaves.discard(leaf)
        self._update_leaf_status(parent)
        return parent

    def _update_leaf_status(self, node: TreeNode) -> None:
        if node.lock_ref == 0 and not node.children and node is not self.root:
            self.evictable_leaves.add(node)
        else:
            self.evictable_leaves.discard(node)

    def state_key(self) -> tuple[tuple[Any, ...], ...]:
        """Everything of the tree a later call reads, hashable: each node (but the root) with its parent, pages,
        values and page locks, and its place in the two orders eviction reads (least recently used first, ties
        to the older node), as ranks: the logical clock and the node ids only grow, so a later tick or a new node
        comes after every node here whatever their values, and two trees equal in these ranks act alike from
        then on (`kvsim.sched.livelock` compares states this way). The root is never evicted: its access time is
        left out."""
        nodes = sorted(self._nodes(), key=lambda node: node.node_id)
        id_rank = {node.node_id: rank for rank, node in enumerate(nodes)}
        access_rank = {t: rank for rank, t in enumerate(sorted({node.last_access for node in nodes}))}
        id_rank[self.root.node_id] = -1
        return tuple((id_rank[node.parent.node_id if node.parent is not None else self.root.node_id],
                      tuple(node.key), tuple(node.value), tuple(node.page_locks), access_rank[node.last_access])
                     for node in nodes)

    def _nodes(self) -> list[TreeNode]:
        """Every node but the root, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    # ------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        """The tree's books balance: links, one value per page, lock counts, sizes, leaf set."""
        assert self.root.lock_ref == 1 and not self.root.key
        nodes = self._nodes()
        evictable = protected = 0
        leaves = set()
        seen_values: set[int] = set()
        for node in nodes:
            parent = node.parent
            assert parent is not None and parent.children.get(node.key[0]) is node, f"node {node.node_id} unlinked"
            assert node.key and len(node.key) == len(node.value), f"node {node.node_id}: keys and values differ"
            assert seen_values.isdisjoint(node.value), f"node {node.node_id}: a value is stored twice"
            seen_values.update(node.value)
            for first, child in node.children.items():
                assert child.key[0] == first and child.parent is node
            # a node counts the locks on its own pages and every lock on its children (they passed through it)
            assert len(node.page_locks) == len(node.key) and min(node.page_locks) >= 0
            assert node.lock_ref == sum(node.page_locks) + sum(c.lock_ref for c in node.children.values())
            assert all(self._where[v] is node for v in node.value), f"node {node.node_id}: value map stale"
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
                if not node.children:
                    leaves.add(node)
        assert evictable == self._evictable_pages, "evictable size drifted"
        assert protected == self._protected_pages, "protected size drifted"
        assert leaves == self.evictable_leaves, "evictable leaf set drifted"
        assert all(leaf.lock_ref == 0 for leaf in self.evictable_leaves), "a locked node is evictable"
        assert len(self._where) == len(seen_values), "value map holds values the tree does not"


def _common_length(node_key: Sequence[Hashable], key: Sequence[Hashable], start: int) -> int:
    """Pages `node_key` shares with `key[start:]` from their first page (equal: the child was found by it)."""
    limit = min(len(node_key), len(key) - start)
    if limit == len(node_key) and type(key) is type(node_key) and key[start:start + limit] == node_key:
        return limit  # the whole run matches (the usual case): one comparison in C instead of a loop
    i = 1
    while i < limit and node_key[i] == key[start + i]:
        i += 1
    return i
