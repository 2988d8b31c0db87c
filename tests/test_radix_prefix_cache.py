"""SGLang's radix cache behind the prefix-cache seam, against vLLM's hash chain: same hits while nothing is
evicted, the expected difference when something is."""

import json

import pytest

import kvsim
from kvsim.kv import PagedAllocator, SegmentContent
from kvsim.kv.prefix_cache import HashChainCache
from kvsim.kv.protocol import PrefixHit
from kvsim.kv.radix_prefix_cache import RadixPrefixCache
from kvsim.model.errors import KvsimError

BS = 4


def allocator(kind):
    cache = RadixPrefixCache(7, BS) if kind == "radix" else HashChainCache(7, BS)
    return PagedAllocator(7, BS, prefix_cache=cache)  # blocks 1..6 usable (0 is the null block)


@pytest.mark.parametrize("kind", ["hash_chain", "radix"])
def test_the_same_hits_while_nothing_is_evicted(kind):
    alloc = allocator(kind)
    a = SegmentContent([("sys", 8), ("a", 5)])
    alloc.allocate(1, 12, 13, a)  # 3 full blocks: 1, 2, 3
    b = SegmentContent([("sys", 8), ("b", 5)])
    hit = alloc.lookup_prefix(b, 13)
    assert hit.num_tokens == 8 and hit.block_ids == (1, 2)  # the shared system prompt's two blocks
    alloc.allocate(2, 12, 13, b, hit)
    alloc.free(1)
    alloc.check_invariants()
    assert alloc.lookup_prefix(a, 13).block_ids == (1, 2, 3)  # a's own block stays cached while free
    alloc.free(2)
    alloc.check_invariants()


@pytest.mark.parametrize(("kind", "a_hit", "b_hit"), [("hash_chain", 0, 8), ("radix", 8, 0)])
def test_eviction_order_differs_lru_by_use_against_order_freed(kind, a_hit, b_hit):
    # A and B each cache 2 full blocks (A: 1, 2; B: 3, 4), A is freed before B, then A's prefix is looked
    # up (a request waiting for it). C needs 4 blocks: the 2 plain ones (5, 6), then 2 evicted.
    #   hash chain (vLLM's free queue): the first freed go first, A's last block first: 2, 1 -> A's prefix lost;
    #   radix (SGLang's LRU leaves): B's node was used least recently (A's lookup touched A's) -> 3, 4 go.
    alloc = allocator(kind)
    a, b = SegmentContent([("a", 9)]), SegmentContent([("b", 9)])
    alloc.allocate(1, 8, 9, a)
    alloc.allocate(2, 8, 9, b)
    assert alloc.seqs[1].block_table == [1, 2] and alloc.seqs[2].block_table == [3, 4]
    alloc.free(1)
    alloc.free(2)
    assert alloc.lookup_prefix(a, 9).num_tokens == 8
    alloc.allocate(3, 16, 16, SegmentContent([("c", 16)]))
    evicted = sorted(alloc.seqs[3].block_table[2:])
    assert evicted == ([1, 2] if kind == "hash_chain" else [3, 4])
    assert alloc.lookup_prefix(a, 9).num_tokens == a_hit
    assert alloc.lookup_prefix(b, 9).num_tokens == b_hit
    alloc.check_invariants()


def test_radix_evicts_whole_leaves_and_keeps_the_extra_blocks_as_spare():
    alloc = allocator("radix")
    alloc.allocate(1, 12, 13, SegmentContent([("x", 13)]))  # one leaf of 3 blocks: 1, 2, 3
    alloc.free(1)
    alloc.allocate(2, 16, 16, SegmentContent([("y", 16)]))  # 4 blocks: plain 4, 5, 6, then 1 evicted
    cache = alloc.prefix_cache
    assert isinstance(cache, RadixPrefixCache)
    # SGLang frees the whole node [1, 2, 3]: block 1 is used, 2 and 3 are free without content
    assert sorted(alloc.seqs[2].block_table) == [1, 4, 5, 6] and sorted(cache._spare) == [2, 3]
    assert alloc.lookup_prefix(SegmentContent([("x", 13)]), 13).num_tokens == 0
    assert alloc.pool.num_free_blocks == 2 and list(cache.evictable) == cache._spare and 2 in cache.evictable
    alloc.check_invariants()


MULTI_TURN = {"workload": {"num_requests": 120, "arrival": {"process": "poisson", "rate": 4},
                           "prompt_len": {"dist": "uniform", "low": 50, "high": 400},
                           "output_len": {"dist": "uniform", "low": 20, "high": 200},
                           "shared_prefix": {"tokens": 600, "fraction": 0.8, "num_prefixes": 3},
                           "multi_turn": {"turns": 4, "think_time_s": 2.0}}}


def test_radix_and_hash_chain_give_identical_runs_when_nothing_is_evicted():
    """Byte-level equality of the two caches' runs. (Their books are checked step by step in the memory-pressure
    test below and the property tests: the tree's full check after each of this run's 5,558 steps over a
    ~10,000-page tree alone took 30 s.)"""
    hash_chain = kvsim.simulate(MULTI_TURN)
    radix = kvsim.simulate(MULTI_TURN, engine__prefix_cache="radix")
    assert radix.summary["prefix_cache_hit_rate"] > 0.3
    assert {k: v for k, v in radix.summary.items() if k != "num_steps"} == \
        {k: v for k, v in hash_chain.summary.items() if k != "num_steps"}
    assert radix.requests.equals(hash_chain.requests)


def test_radix_under_memory_pressure_keeps_its_books_and_reports_hits():
    tight = {**MULTI_TURN, "engine": {"num_gpu_blocks_override": 300, "max_model_len": 4096}}
    radix = kvsim.simulate(tight, check=True, engine__prefix_cache="radix").summary
    hash_chain = kvsim.simulate(tight, check=True).summary
    assert radix["num_finished"] == hash_chain["num_finished"] == 120
    assert 0 < radix["prefix_cache_hit_rate"] < 1 and 0 < hash_chain["prefix_cache_hit_rate"] < 1


def test_radix_needs_the_paged_allocator():
    with pytest.raises(KvsimError, match="prefix_cache=radix needs allocator paged"):
        kvsim.simulate(None, engine__allocator="slab-max", engine__prefix_cache="radix")


@pytest.mark.parametrize("kind", ["hash_chain", "radix"])
def test_one_token_blocks_match_partial_blocks_as_sglang_page_size_one(kind):
    """SGLang with page_size 1 matches any token prefix (its `match_prefix` aligns only when page_size > 1);
    kvsim does the same with one-token blocks, where a page is a block and the pool allocates per token, as
    SGLang's token pool does, so no partial block needs a copy. A and B share their first 6 tokens (one
    6-token segment), then differ: with 4-token blocks B hits 4 tokens (one full block), with 1-token
    blocks all 6."""
    a, b = SegmentContent([("sys", 6), ("a", 4)]), SegmentContent([("sys", 6), ("b", 4)])
    for block_size, expected in ((4, 4), (1, 6)):
        num_blocks = 64
        cache = (RadixPrefixCache if kind == "radix" else HashChainCache)(num_blocks, block_size)
        alloc = PagedAllocator(num_blocks, block_size, prefix_cache=cache)
        alloc.allocate(1, 10, 10, a)
        assert alloc.lookup_prefix(b, 10).num_tokens == expected
        alloc.check_invariants()


@pytest.mark.parametrize("kind", ["hash_chain", "radix"])
def test_a_fork_sharing_blocks_cached_under_its_parents_content_caches_none_of_them_again(kind):
    """A sample forked after its parent wrote output blocks (n > 1 recomputed after a preemption: the parent
    recomputes prompt + output, then forks) shares blocks 1, 2 (prompt) and 3 (the parent's first output
    block), which its own content names by its own output segment. Writing on to 16 tokens fills block 4.
    Block 3 is the parent's page: the radix tree cached it twice (a broken tree) before; now, as the hash
    chain, which skips a block that already has a hash, the child's block 3 is not cached again, so its
    content hits the 2 prompt blocks (8 tokens) and the parent's all 3 (12)."""
    alloc = allocator(kind)
    parent = SegmentContent([("prompt", 8), ("out", 9)])
    child = SegmentContent([("prompt", 8), (("out", 1), 9)])
    alloc.allocate(1, 12, 16, parent)
    assert alloc.seqs[1].block_table == [1, 2, 3]
    alloc.fork(1, 2, child, 16)
    alloc.allocate(2, 16, 16, child)
    assert alloc.seqs[2].block_table == [1, 2, 3, 4]
    alloc.check_invariants()
    assert alloc.lookup_prefix(parent, 13).block_ids == (1, 2, 3)
    assert alloc.lookup_prefix(child, 17).block_ids == (1, 2)
    alloc.free(1)
    alloc.free(2)
    alloc.check_invariants()


@pytest.mark.parametrize("free_first", [True, False])
def test_a_hit_trimmed_inside_a_node_is_recomputed_into_the_trees_block(free_first):
    """EAGLE gives a hit's last block back (`Scheduler.lookup`): B's match covers A's node [1, 2] (the shared
    8 tokens), and B takes block 1 only. SGLang locks whole nodes, so a free block 2 left in the locked node
    [1, 2] could never be evicted: the pool counted it free and its free queue did not ("blocks not
    conserved" with --check). The node is cut where the trimmed hit ends, [1] -> [2], whether block 2 was
    already free when B took its hit (`free_first`) or is freed by A after. B then recomputes block 2's
    tokens into block 3, which the tree holds as block 2: as SGLang's insert frees a request's duplicate KV
    and points it at the tree's, B's table takes block 2 and block 3 is freed, and B's block past it (4) is
    cached below block 2. B kept block 3 and cached nothing past it, so no later request could hit block 4
    (with EAGLE, no request hit anything past a shared prefix its predecessor had hit). With 6 usable
    blocks, B holding 1, 2, 4, 5, and 3 and 6 plain, C's 2 blocks take those; A's prompt still hits 1, 2."""
    alloc = allocator("radix")
    a, b = SegmentContent([("sys", 9), ("a", 4)]), SegmentContent([("sys", 9), ("b", 4)])
    alloc.allocate(1, 8, 13, a)
    assert alloc.seqs[1].block_table == [1, 2]
    if free_first:
        alloc.free(1)
    hit = alloc.lookup_prefix(b, 13)
    assert hit.block_ids == (1, 2)
    alloc.allocate(2, 13, 13, b, PrefixHit(4, hit.block_ids[:-1]))
    assert alloc.seqs[2].block_table == [1, 2, 4, 5]
    if not free_first:
        alloc.free(1)
    alloc.check_invariants()
    assert alloc.pool.num_free_blocks == 2 and not alloc.prefix_cache.evictable
    assert alloc.lookup_prefix(SegmentContent([("sys", 9), ("b", 4), ("c", 4)]), 17).block_ids == (1, 2, 4)
    alloc.allocate(3, 8, 8, SegmentContent([("c", 8)]))
    assert sorted(alloc.seqs[3].block_table) == [3, 6]
    assert alloc.lookup_prefix(a, 13).block_ids == (1, 2)
    alloc.check_invariants()


def test_eagle_over_the_radix_cache_runs_as_over_the_hash_chain_when_nothing_is_evicted():
    """A shared system prompt under EAGLE (every hit trimmed by a block) kept the radix cache's books broken
    (`--check` failed); with a pool nothing is evicted from, the two caches must give the same run."""
    raw = {"engine": {"max_model_len": 1024, "num_gpu_blocks_override": 2000,
                      "speculative_config": {"method": "eagle", "num_speculative_tokens": 3,
                                             "acceptance_rates": 0.7}},
           "workload": {"num_requests": 12, "arrival": {"process": "poisson", "rate": 2},
                        "prompt_len": {"dist": "uniform", "low": 20, "high": 200},
                        "output_len": {"dist": "uniform", "low": 20, "high": 60},
                        "shared_prefix": {"tokens": 70, "num_prefixes": 2}},
           "latency": {"model": "constant"}}
    hash_chain, radix = _over_both_caches(raw)
    assert hash_chain.summary["num_prefix_cache_hit_tokens"] > 0
    assert radix.requests.equals(hash_chain.requests)


@pytest.mark.parametrize("engine", [{}, {"scheduler": "v0", "preemption_mode": "recompute"}], ids=["v1", "v0"])
def test_caching_off_the_radix_cache_is_no_cache(engine):
    """With prefix caching off vLLM caches nothing, whichever cache would hold it: a run over the radix cache is
    the hash chain's, step for step, under pressure (preemptions), with a shared prompt and forked samples (whose
    shared blocks each cache would otherwise hear of). It did no less per-block work than a cache in use, and
    kept decode bursts off (`PagedAllocator.supports_bursts`): ~3x the hash chain's time."""
    raw = {"engine": {"max_model_len": 1024, "num_gpu_blocks_override": 120, "enable_prefix_caching": False,
                      **engine}, "latency": {"model": "constant"},
           "workload": {"num_requests": 40, "n": 2, "arrival": {"process": "poisson", "rate": 8},
                        "prompt_len": {"dist": "uniform", "low": 50, "high": 300},
                        "output_len": {"dist": "uniform", "low": 20, "high": 200},
                        "shared_prefix": {"tokens": 64, "num_prefixes": 2}}}
    hash_chain, radix = _over_both_caches(raw)
    assert hash_chain.summary["num_preemptions"] > 0 and hash_chain.summary["num_prefix_cache_hit_tokens"] == 0
    assert radix.requests.equals(hash_chain.requests) and radix.steps.equals(hash_chain.steps)
    assert json.dumps(radix.summary) == json.dumps(hash_chain.summary)
    assert PagedAllocator(7, BS, enable_caching=False, prefix_cache=RadixPrefixCache(7, BS)).supports_bursts


def _over_both_caches(raw: dict) -> tuple[kvsim.RunResult, kvsim.RunResult]:
    """`raw` run over the hash chain and over the radix cache, each with its books checked every step."""
    return kvsim.simulate(raw, check=True), kvsim.simulate(raw, check=True, engine__prefix_cache="radix")
