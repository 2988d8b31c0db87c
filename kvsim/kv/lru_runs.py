"""The hash chain's evictable blocks in LRU order, kept as runs: one append per free, not one per block.

    runs (head first):  [7 3 9] [12 4 (9) 5] [9 2]        (9): a dead entry
                          ^ start                         next `take(4)`: 7 3 9 12

`extend(blocks)` appends a free's cached blocks as one run (the LRU tail); `take(n)` pops the `n`
oldest; `discard(block)` (a prefix hit on a free cached block) removes a block from anywhere in O(1)
by leaving its entry in place, dead, counted in `_dead` (block -> its dead entries). This is the order
of a dict with insertion order (an `OrderedDict`, vLLM's `FreeKVCacheBlockQueue` tail part): a freed
block joins at the tail, a hit leaves from anywhere, eviction pops the head. A block is discarded only
while its latest entry is live, and entries are only ever appended, so a block's dead entries all come
before its live one: the walk from the head skips as many entries of a block as `_dead` counts. Once
dead entries outnumber live ones (and `COMPACT_MIN_ENTRIES`), they are dropped (`_compact`, amortized
O(1) a discard), so a cache that is hit often but seldom evicts keeps O(live) entries.

`HashChainCache` (kvsim.kv.prefix_cache) owns one; the hashes stay in its `block_hashes`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import islice

COMPACT_MIN_ENTRIES = 4_096  # dead entries tolerated before a compaction is considered


class LruRuns:
    """Block ids, least recently appended first; `len` counts the live ones (module docstring)."""

    __slots__ = ("_runs", "_start", "_dead", "_num_live", "_num_dead")

    def __init__(self) -> None:
        self._runs: deque[list[int]] = deque()  # each non-empty past `_start` (the head run's first entry)
        self._start = 0
        self._dead: dict[int, int] = {}  # block -> how many of its entries in `_runs` are dead
        self._num_live = 0
        self._num_dead = 0

    def __len__(self) -> int:
        return self._num_live

    def __iter__(self) -> Iterator[int]:
        """The live blocks, the next `take` first."""
        dead = dict(self._dead)
        for index, run in enumerate(self._runs):
            for block_id in islice(run, self._start if index == 0 else 0, None):
                skip = dead.get(block_id)
                if skip:
                    dead[block_id] = skip - 1
                else:
                    yield block_id

    def __contains__(self, block_id: object) -> bool:
        return any(b == block_id for b in self)

    def extend(self, block_ids: list[int]) -> None:
        """Append `block_ids` (none live here now) at the tail, in order; the list is kept, not copied."""
        if block_ids:
            self._runs.append(block_ids)
            self._num_live += len(block_ids)

    def discard(self, block_id: int) -> None:
        """Remove a live block (its entry stays, dead)."""
        self._dead[block_id] = self._dead.get(block_id, 0) + 1
        self._num_live -= 1
        self._num_dead += 1
        if self._num_dead > COMPACT_MIN_ENTRIES and self._num_dead > self._num_live:
            self._compact()

    def take(self, num_blocks: int) -> list[int]:
        """Remove and return the `num_blocks` oldest live blocks, oldest first."""
        assert num_blocks <= self._num_live, f"evicting {num_blocks} blocks of {self._num_live} evictable"
        runs, dead = self._runs, self._dead
        if num_blocks == 1:  # a decode's next block (hot): the head entry, when it is live, as the loop below takes it
            run, start = runs[0], self._start
            block_id = run[start]
            if block_id not in dead:  # a block's dead entries come before its live one: with none, this is live
                start += 1
                if start == len(run):
                    runs.popleft()
                    start = 0
                self._start = start
                self._num_live -= 1
                return [block_id]
        taken = list[int]()
        while len(taken) < num_blocks:
            run, start = runs[0], self._start
            chunk = run[start:start + num_blocks - len(taken)]
            if not dead or dead.keys().isdisjoint(chunk):  # all live (hot: a slice, in C)
                taken += chunk
                start += len(chunk)
            else:  # a dead entry among them: one at a time
                while len(taken) < num_blocks and start < len(run):
                    block_id = run[start]
                    start += 1
                    skip = dead.get(block_id)
                    if skip is None:
                        taken.append(block_id)
                    else:
                        self._num_dead -= 1
                        if skip == 1:
                            del dead[block_id]
                        else:
                            dead[block_id] = skip - 1
            if start == len(run):
                runs.popleft()
                start = 0
            self._start = start
        self._num_live -= num_blocks
        return taken

    def _compact(self) -> None:
        """One run of the live blocks, in order; no dead entries."""
        live = list(self)
        self._runs.clear()
        self._start = 0
        self._dead.clear()
        self._num_dead = 0
        self._num_live = 0
        self.extend(live)

    def check_invariants(self) -> None:
        """The counts match the entries: every dead count has entries to skip, and no block is live twice."""
        assert all(self._dead.values()), "a zero dead count"
        num_entries = sum(map(len, self._runs)) - self._start
        assert num_entries == self._num_live + self._num_dead == self._num_live + sum(self._dead.values()), \
            "LRU entries miscounted"
        live = list(self)
        assert len(live) == self._num_live and len(set(live)) == len(live), "a block is evictable twice"
        assert not self._runs or self._start < len(self._runs[0]), "the head run is used up"
