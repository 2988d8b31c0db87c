"""The prefix-cache seam: the hash chain's contract on hand-built blocks, and a second cache plugged in."""

from __future__ import annotations

import random

import kvsim
from kvsim.kv import PagedAllocator, SegmentContent
from kvsim.kv.block_pool import BlockPool
from kvsim.kv.lru_runs import LruRuns
from kvsim.kv.prefix_cache import HashChainCache
from kvsim.kv.protocol import PrefixHit
from kvsim.workload.scenario import load_scenario
from tests.test_metamorphic2 import traced, write_trace

BS = 4


def content(*segments):
    return SegmentContent(list(segments))


def test_match_full_blocks_from_the_first_stopping_at_a_miss_never_the_last_token():
    cache = HashChainCache(10, BS)
    a = content(("sys", 12), ("a", 4))  # 16 tokens: blocks 0..3
    cache.insert(a, [5, 6, 7, 8], 0, 4)
    assert cache.match(a, 16) == PrefixHit(12, (5, 6, 7))  # the block holding the last token is recomputed
    assert cache.match(a, 17) == PrefixHit(16, (5, 6, 7, 8))
    b = content(("sys", 8), ("b", 8))  # shares blocks 0 and 1 only
    assert cache.match(b, 16) == PrefixHit(8, (5, 6))
    c = content(("other", 4), ("sys", 12))  # block 0 differs: the chain breaks at once
    assert cache.match(c, 16) == PrefixHit(0, ())


def test_the_first_block_to_hold_content_stays_the_one_found():
    cache = HashChainCache(10, BS)
    a = content(("sys", 8))
    cache.insert(a, [1, 2], 0, 2)
    cache.insert(a, [3, 4], 0, 2)  # computed again at the same time by another request
    assert cache.match(a, 9).block_ids == (1, 2)
    # vLLM does not de-duplicate (BlockHashToBlockMap): blocks 3 and 4 are cached too, found once 1, 2 go
    assert cache.block_hashes[3] == cache.block_hashes[1] and cache.block_hashes[4] == cache.block_hashes[2]
    cache.check_invariants([1] * 10)


def test_a_duplicate_keeps_content_found_after_the_first_block_holding_it_is_evicted():
    # vLLM's BlockHashToBlockMap keeps every block cached under a hash and `get_one_block` returns the
    # first one left. Blocks 1, 2 hold the first 8 tokens of `a`; block 3 holds a's block 1 again (a request
    # that hit block 1 and recomputed block 2, its prompt's last). Freed in the order 2, 1, 3 (ref counts
    # 0) and evicted in that order: after block 2 goes, block 3 is found for a's block 1 (hit 8 tokens); after
    # block 1 goes, the chain breaks at block 0 (hit 0), whatever block 3 holds.
    pool = BlockPool(8, cache=HashChainCache(8, BS))
    cache = pool.cache
    assert isinstance(cache, HashChainCache)
    a = content(("sys", 8), ("q", 4))
    blocks = pool.get_new_blocks(3)
    assert blocks == [1, 2, 3]
    cache.insert(a, [1, 2], 0, 2)
    cache.insert(a, [1, 3], 1, 2)
    assert cache.match(a, 12) == PrefixHit(8, (1, 2))
    pool.free_blocks([2, 1, 3])
    assert list(cache.evictable) == [2, 1, 3]
    pool.get_new_blocks(4)  # the 4 plain blocks 4..7
    assert pool.get_new_blocks(1) == [2]  # evicts block 2: its hash stays found in block 3
    assert cache.match(a, 12) == PrefixHit(8, (1, 3))
    pool.check_invariants()
    assert pool.get_new_blocks(2) == [1, 3]
    assert cache.match(a, 12) == PrefixHit(0, ()) and not cache.cached and not cache.duplicates
    pool.check_invariants()


def test_eviction_order_is_the_order_blocks_were_freed_and_a_hit_takes_a_block_out():
    pool = BlockPool(8, cache=HashChainCache(8, BS))
    cache = pool.cache
    assert isinstance(cache, HashChainCache)
    first, second = pool.get_new_blocks(3), pool.get_new_blocks(2)
    assert (first, second) == ([1, 2, 3], [4, 5])
    x, y = content(("x", 12)), content(("y", 8))
    cache.insert(x, first, 0, 3)
    cache.insert(y, second, 0, 2)
    assert pool.free_blocks(first[::-1]) == [3, 2, 1]  # a request's blocks tail-first
    pool.free_blocks(second[::-1])
    assert pool.free_queue == [6, 7, 3, 2, 1, 5, 4]  # plain blocks at the head, cached ones LRU after
    assert list(cache.evictable) == [3, 2, 1, 5, 4] and pool.num_free_blocks == 7
    hit = cache.match(y, 9)
    pool.touch(hit.block_ids)  # a hit on free cached blocks pulls them out of the queue
    assert pool.free_queue == [6, 7, 3, 2, 1]
    assert pool.get_new_blocks(3) == [6, 7, 3]  # plain ones first, then the least recently freed cached one
    assert cache.match(x, 13) == PrefixHit(8, (1, 2))  # x's third block (block 3) was evicted: the chain ends
    assert cache.block_hashes[3] is None
    pool.check_invariants()


def test_a_repeated_match_answers_as_a_fresh_walk_after_inserts_and_evictions():
    """`match` returns its last answer again while it stands: a waiting head looked up again sees the
    block its walk missed once another request caches it, and loses a hit block once it is evicted;
    other content's inserts leave it as it was. Each answer is checked against a cache that never
    matched before (no remembered answer)."""
    pool = BlockPool(8, cache=HashChainCache(8, BS))
    cache = pool.cache
    assert isinstance(cache, HashChainCache)
    head = content(("sys", 8), ("q", 8))  # 16 tokens: at most blocks 0..2 can hit

    def fresh(c, num_tokens):
        other = HashChainCache(8, BS)
        other.cached.update(cache.cached)
        return other.match(c, num_tokens)

    blocks = pool.get_new_blocks(2)
    cache.insert(content(("sys", 8)), blocks, 0, 2)
    assert cache.match(head, 16) == fresh(head, 16) == PrefixHit(8, (1, 2))  # stops at block 2 (q's first)
    cache.insert(content(("other", 4)), pool.get_new_blocks(1), 0, 1)  # not the missing hash: same answer
    assert cache.match(head, 16) == fresh(head, 16) == PrefixHit(8, (1, 2))
    cache.insert(head, [*blocks, *pool.get_new_blocks(2)], 0, 4)  # now the missing block is cached
    assert cache.match(head, 16) == fresh(head, 16) == PrefixHit(12, (1, 2, 4))
    assert cache.match(head, 13) == fresh(head, 13) == PrefixHit(12, (1, 2, 4))  # another length: walked again
    pool.free_blocks([5, 4, 2, 1])  # evictable, oldest first: 5, 4, 2, 1 (block 3, "other", stays held)
    assert cache.match(head, 16) == PrefixHit(12, (1, 2, 4))  # free cached blocks still hit
    assert pool.get_new_blocks(4) == [6, 7, 5, 4]  # plain blocks first, then evicts 5 and head's block 4
    assert cache.match(head, 16) == fresh(head, 16) == PrefixHit(8, (1, 2))


class PlainCache:
    """A second implementation behind the seam: it never keeps content (as with caching off)."""

    evictable: tuple[int, ...] = ()

    def match(self, content, num_tokens):
        return PrefixHit(0, ())

    def insert(self, content, block_table, first_block, num_full_blocks):
        return None

    def lock(self, block_id):
        return False

    def unlock(self, block_ids):
        return block_ids

    def evict(self, num_blocks):
        assert num_blocks == 0
        return []

    def check_invariants(self, ref_counts):
        return None


def test_a_cache_passed_to_the_allocator_is_the_one_used_and_bursts_need_the_hash_chain():
    alloc = PagedAllocator(11, BS, enable_caching=True, prefix_cache=PlainCache())
    assert not alloc.supports_bursts
    a = content(("sys", 8), ("a", 4))
    assert alloc.allocate(0, 12, 12, a)
    alloc.free(0)
    assert alloc.lookup_prefix(a, 12) == PrefixHit(0, ())
    default = PagedAllocator(11, BS, enable_caching=True)
    assert default.supports_bursts and isinstance(default.prefix_cache, HashChainCache)
    assert default.allocate(0, 12, 12, a)
    default.free(0)
    assert default.lookup_prefix(a, 12) == PrefixHit(8, (1, 2))  # blocks 1..3 held it; the last is recomputed
    alloc.check_invariants()
    default.check_invariants()


def test_v0s_hit_rate_counts_blocks_as_vllm_v0_and_v1s_tokens(tmp_path):
    """vLLM v0's hit rate (`PrefixCachingBlockAllocator.get_prefix_cache_hit_rate`) is cached full blocks over
    full blocks allocated; v1's is hit tokens over prompt tokens. Three prompts, far apart, of 40 token ids
    (16-token blocks: 2 full blocks each): A; A again; A's first 20 ids then 20 of its own. v0: blocks queried
    2 + 2 + 2, hit 0 + 2 + 1: 3/6. Tokens (both schedulers: v0 computes from its hit, v1 never hits the last
    token's block, which here is partial): queried 120, hit 0 + 32 + 16: 48/120. kvsim's v0 reported the
    token rate, 0.4 for vLLM v0's 0.5."""
    prompt = list(range(1, 41))
    rows = [{"arrival_time_ns": int(i * 5e9), "input_toks": 40, "output_toks": 5, "input_tok_ids": ids}
            for i, ids in enumerate([prompt, prompt, prompt[:20] + list(range(1000, 1020))])]
    path = write_trace(tmp_path / "three.jsonl", rows)
    v0 = kvsim.simulate(traced(path, {"scheduler": "v0", "enable_prefix_caching": True})).summary
    v1 = kvsim.simulate(traced(path)).summary
    for summary in (v0, v1):
        assert (summary["num_prefix_cache_query_tokens"], summary["num_prefix_cache_hit_tokens"]) == (120, 48)
    assert (v0["num_prefix_cache_query_blocks"], v0["num_prefix_cache_hit_blocks"]) == (6, 3)
    assert v0["prefix_cache_hit_rate"] == 0.5
    assert v1["prefix_cache_hit_rate"] == 0.4 and "num_prefix_cache_query_blocks" not in v1


def test_a_fleet_mixing_v0_and_v1_replicas_gives_the_token_rate_of_all():
    """Round robin over a v0 replica (prefix caching on) and a v1 one; four prompts, 1 s apart, of a shared
    32-token prefix and 8 tokens of their own (16-token blocks). Each replica serves two: the second hits the
    prefix's 2 blocks. Tokens, on either replica: queried 40 + 40, hit 0 + 32; the fleet's 64 / 160 = 0.4. v0's
    blocks: queried 2 + 2 (40 // 16), hit 0 + 2: 0.5, which is the v0 replica's rate, not the fleet's (a v1
    replica counts no block): the fleet reported 0.5."""
    sets = ["model=llama-3.1-8b", "gpu=h100-80gb", "engine={max_model_len: 1024, block_size: 16}",
            "workload={num_requests: 4, arrival: {process: constant, rate: 1}, prompt_len: {dist: fixed, value: 8}, "
            "output_len: {dist: fixed, value: 4}, shared_prefix: {tokens: 32}}",
            "replicas=[{count: 1, engine: {scheduler: v0, enable_prefix_caching: true}}, "
            "{count: 1, engine: {scheduler: v1}}]", "router={policy: round_robin}",
            "latency={model: constant, step_s: 0.01}"]
    result = kvsim.simulate(load_scenario(None, sets))
    v0, v1 = (run.summary for run in result.replicas)
    assert (v0["prefix_cache_hit_rate"], v1["prefix_cache_hit_rate"]) == (0.5, 0.4)
    summary = result.summary
    assert (summary["num_prefix_cache_query_tokens"], summary["num_prefix_cache_hit_tokens"]) == (160, 64)
    assert summary["prefix_cache_hit_rate"] == 0.4 and "num_prefix_cache_query_blocks" not in summary
    # both replicas v0: the fleet's rate is v0's, blocks 2 + 2 on each, hit 0 + 2 on each: 4 / 8
    sets[4] = "replicas=[{count: 2, engine: {scheduler: v0, enable_prefix_caching: true}}]"
    summary = kvsim.simulate(load_scenario(None, sets)).summary
    assert (summary["num_prefix_cache_query_blocks"], summary["num_prefix_cache_hit_blocks"]) == (8, 4)
    assert summary["prefix_cache_hit_rate"] == 0.5


def test_unlock_splits_hashed_from_plain_blocks_in_the_order_given():
    """`HashChainCache.unlock` against the one-loop split it replaces: the blocks holding a hash join the LRU in
    the order given, the others are returned in the order given. 300-block frees (a long prompt's table,
    tail-first) with no plain block, the partial tail block alone (first), one plain block elsewhere, and
    random mixes."""
    rng = random.Random(35)
    num_blocks = 1_000
    cache = HashChainCache(num_blocks, BS)
    block_ids = list(range(num_blocks))
    for block_id in block_ids[:600]:  # blocks 0..599 hold a hash, 600..999 none
        cache.block_hashes[block_id] = (block_id + 7) << 40
        cache.cached[(block_id + 7) << 40] = block_id
    hashed_ids, plain_ids = block_ids[:600], block_ids[600:]
    frees = [rng.sample(hashed_ids, 300), [plain_ids[0], *rng.sample(hashed_ids, 299)],
             [*rng.sample(hashed_ids[:300], 150), plain_ids[1], *rng.sample(hashed_ids[300:], 149)],
             [plain_ids[2]], [plain_ids[3], plain_ids[4]]]
    frees += [rng.sample(block_ids, rng.randint(1, 300)) for _ in range(40)]
    for freed in frees:
        cache.evictable = LruRuns()
        expected_hashed = [b for b in freed if cache.block_hashes[b] is not None]
        expected_plain = [b for b in freed if cache.block_hashes[b] is None]
        assert cache.unlock(list(freed)) == expected_plain
        assert list(cache.evictable) == expected_hashed
