"""The hash chain's LRU kept as runs (`kvsim.kv.lru_runs.LruRuns`) evicts exactly as the insertion-ordered dict
it replaced, vLLM's free-queue order (a freed block to the tail, a hit's block out from anywhere, evictions from
the head).

Two references, written independently of the runs: an `OrderedDict` driven by the same random operations, and
`DictLruCache`, the hash chain with the dict it kept before (its `lock`, `unlock` and `evict` as they were at
5123391), under a paged allocator given thousands of requests sharing prefixes under eviction pressure: every
hit, block table and the whole free queue must agree after every operation.
"""

import random
from collections import OrderedDict
from itertools import islice

import pytest

from kvsim.kv import lru_runs
from kvsim.kv.lru_runs import LruRuns
from kvsim.kv.paged import PagedAllocator
from kvsim.kv.prefix_cache import HashChainCache
from kvsim.workload.content import SegmentContent


@pytest.mark.parametrize("single", [0.0, 0.8])
@pytest.mark.parametrize("compact_min", [0, 8, lru_runs.COMPACT_MIN_ENTRIES])
def test_runs_follow_an_ordered_dict(monkeypatch, compact_min, single):
    """`single`: the share of evictions that take one block (a decode's next block: `take`'s fast path, which
    must skip to the loop when the head entry is dead)."""
    monkeypatch.setattr(lru_runs, "COMPACT_MIN_ENTRIES", compact_min)
    rng = random.Random(compact_min)
    num_single_past_dead = 0
    runs, model, free = LruRuns(), OrderedDict[int, None](), list(range(200))
    for _ in range(3_000):
        op = rng.random()
        if op < 0.35 and free:  # a free: a run of blocks to the tail
            rng.shuffle(free)
            size = rng.randrange(1, 12)
            run, free = free[:size], free[size:]
            runs.extend(list(run))
            model.update(dict.fromkeys(run))
        elif op < 0.7 and model:  # a hit on a free cached block, anywhere in the queue
            block_id = rng.choice(list(model))
            runs.discard(block_id)
            del model[block_id]
            free.append(block_id)
        elif model:  # evictions from the head
            n = 1 if single and rng.random() < single else rng.randrange(1, len(model) + 1)
            num_single_past_dead += n == 1 and runs._runs[0][runs._start] in runs._dead
            expected = list(islice(model, n))
            assert runs.take(n) == expected
            for block_id in expected:
                del model[block_id]
            free.extend(expected)
        assert len(runs) == len(model)
        assert list(runs) == list(model)
        runs.check_invariants()
    if single:
        assert num_single_past_dead > 20  # one-block takes met a dead head entry (the fast path's fallback)
    if compact_min <= 8:
        assert runs._num_dead <= max(compact_min, runs._num_live)  # compactions kept the dead entries bounded


class CountingCache(HashChainCache):
    """The hash chain (with `LruRuns`), counting the blocks it evicts."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.num_evicted = 0

    def evict(self, num_blocks):
        self.num_evicted += num_blocks
        return super().evict(num_blocks)


class DictLruCache(HashChainCache):
    """The hash chain with its LRU as an insertion-ordered dict (block -> hash), as it was before `LruRuns`."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.evictable = {}

    def lock(self, block_id):
        if block_id in self.evictable:
            del self.evictable[block_id]
            return True
        return False

    def unlock(self, block_ids):
        plain = []
        for block_id in block_ids:
            if (block_hash := self.block_hashes[block_id]) is None:
                plain.append(block_id)
            else:
                self.evictable[block_id] = block_hash
        return plain

    def evict(self, num_blocks):
        evicted = list(islice(self.evictable, num_blocks))
        for block_id in evicted:
            block_hash = self.evictable.pop(block_id)
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
        self._memo = None
        return evicted

    def check_invariants(self, ref_counts):
        pass


def test_a_paged_run_evicts_as_with_the_dict():
    """2,000 requests (contents of 1-6 shared 64-token segments plus a tail of their own; a third of them
    one of the last 8 contents again, the prompt up to 40 tokens short of it, 1-40 output tokens), up to 24
    running, over 300 blocks of 16 tokens: the prefix cache hits, evicts and keeps duplicates (two
    sequences decoding into the same content's blocks)."""
    rng = random.Random(7)
    block_size, num_blocks = 16, 300
    fast = PagedAllocator(num_blocks, block_size, prefix_cache=CountingCache(num_blocks, block_size))
    slow = PagedAllocator(num_blocks, block_size, prefix_cache=DictLruCache(num_blocks, block_size))
    live: dict[int, list[int]] = {}  # seq id -> [tokens written, final tokens]
    recent: list[SegmentContent] = []
    num_hits = num_with_duplicates = 0
    for seq_id in range(2_000):
        while live and (len(live) >= 24 or rng.random() < 0.5):  # grow or finish running sequences
            victim = rng.choice(sorted(live))
            written, final = live[victim]
            if written >= final or rng.random() < 0.2:
                fast.free(victim)
                slow.free(victim)
                del live[victim]
            else:
                results = [a.allocate(victim, written + 1) for a in (fast, slow)]
                assert results[0] == results[1]
                if results[0] is not None:
                    live[victim][0] += 1
            assert fast.pool.free_queue == slow.pool.free_queue
        if recent and rng.random() < 0.3:  # a content running now: its decodes fill the same blocks (duplicates)
            content = rng.choice(recent)
        else:
            segments = [(("seg", rng.randrange(12)), 64) for _ in range(rng.randrange(1, 7))]
            content = SegmentContent([*segments, (("own", seq_id), rng.randrange(1, 80))])
            recent = [*recent[-7:], content]
        prompt = rng.randrange(max(1, content.num_tokens - 40), content.num_tokens + 1)
        hits = [a.lookup_prefix(content, prompt) for a in (fast, slow)]
        assert hits[0] == hits[1]
        num_hits += bool(hits[0].block_ids)
        final = prompt + rng.randrange(1, 40)
        results = [a.allocate(seq_id, prompt, final, content, hit) for a, hit in zip((fast, slow), hits, strict=True)]
        assert results[0] == results[1]
        if results[0] is not None:
            live[seq_id] = [prompt, final]
            assert fast.seqs[seq_id].block_table == slow.seqs[seq_id].block_table
        assert fast.pool.free_queue == slow.pool.free_queue
        assert fast.prefix_cache.cached == slow.prefix_cache.cached
        assert fast.prefix_cache.duplicates == slow.prefix_cache.duplicates
        num_with_duplicates += bool(fast.prefix_cache.duplicates)
        if seq_id % 100 == 0:
            fast.check_invariants()
    # hits, evictions (of more blocks than the pool has) and duplicate hashes all happened
    assert num_hits > 500 and fast.prefix_cache.num_evicted > 10 * num_blocks and num_with_duplicates > 100
