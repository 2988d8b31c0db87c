"""vLLM v0 shares every cached full block of a prompt on its own (vllm/core/block/prefix_caching_block.py,
`allocate_immutable_blocks`: one `_cached_blocks` lookup per block), where kvsim's `match` stops at the first
miss. The two agree while the cache is prefix-closed: a chain's block k + 1 cached only with its block k (hashes
chain on the prefix, so only a sequence holding block k can have filled block k + 1). kvsim keeps it so: every
holder of block k + 1 holds a block of hash k, a request frees its blocks tail-first to the LRU tail, and a hash
leaves the map only with its last (duplicate) block. Random admissions, growth and frees under eviction
pressure check that invariant directly: for every chain, the cached block indices are a prefix."""

import random

import pytest

from kvsim.kv.paged import PagedAllocator
from kvsim.workload.content import TokenContent

BS = 4


def assert_prefix_closed(alloc: PagedAllocator, contents: list[TokenContent]) -> None:
    cached = alloc.prefix_cache.cached
    for content in contents:
        hits = [h in cached for h in content.block_hashes(BS, content.num_tokens // BS)]
        first_miss = hits.index(False) if False in hits else len(hits)
        assert not any(hits[first_miss:]), f"block {hits.index(True, first_miss)} cached after a miss: {hits}"


@pytest.mark.parametrize("v0", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_no_cached_block_follows_an_evicted_one(seed, v0):
    rng = random.Random(seed)
    alloc = PagedAllocator(num_blocks=14, block_size=BS, v0_prefix_caching=v0)
    contents, live, next_id = [], {}, 0
    for _ in range(300):
        if live and (rng.random() < 0.4 or len(live) > 4):
            seq_id = rng.choice(sorted(live))
            if rng.random() < 0.5 or live[seq_id][1] >= live[seq_id][0].num_tokens:
                alloc.free(seq_id)
                del live[seq_id]
            else:  # decode one token (fills and caches a block every BS tokens)
                content, written = live[seq_id]
                if alloc.allocate(seq_id, written + 1) is not None:
                    live[seq_id] = (content, written + 1)
        else:  # a binary alphabet: prompts share prefixes of every length
            content = TokenContent([rng.randrange(2) for _ in range(rng.randrange(5, 28))])
            prompt = rng.randrange(1, content.num_tokens)
            hit = alloc.lookup_prefix(content, prompt)
            if alloc.allocate(next_id, prompt, content.num_tokens, content, hit) is not None:
                live[next_id] = (content, prompt)
                contents.append(content)
                alloc.mark_blocks_as_computed()
            next_id += 1
        alloc.pool.check_invariants()
        assert_prefix_closed(alloc, contents)
    assert alloc.prefix_cache.evictable or live  # the pool was under pressure
