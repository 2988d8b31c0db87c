"""Metric and scheduling semantics that must match vLLM's, each on a world small enough to check by hand."""

from pathlib import Path

import pytest

from kvsim.engine.simulate import simulate
from kvsim.results.metrics import VLLM_REQUEST_METRICS
from kvsim.workload.request import RequestStatus
from kvsim.workload.scenario import load_scenario
from tests.conftest import make_request, run, tiny_world

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def test_preempted_readmissions_are_not_prefix_cache_hits():
    """Two requests of 40 + 60 tokens (cdiv(99, 16) = 7 blocks each) in 10 usable blocks: the later one is
    preempted; its re-admission finds its own cached blocks. No two requests share a prefix, so vLLM's
    `prefix_cache_hits` stays 0 and the re-hit is counted under `preempted_hits` (vllm/v1/metrics/stats.py)."""
    s = tiny_world(num_blocks=11, max_num_batched_tokens=128)
    reqs = [make_request(i, 0.0, prompt=40, output=60) for i in range(2)]
    run(s, reqs)
    assert s.num_preemptions >= 1
    assert s.prefix_stats.num_hit_tokens == 0
    assert s.prefix_stats.num_query_tokens == 80  # each request's first admission: its 40 prompt tokens
    assert s.prefix_stats.num_preempted_hit_tokens > 0  # the victim re-hit its own full blocks


@pytest.mark.parametrize("scheduler", ["v1", "v0"])
def test_no_shared_prefix_workload_reports_zero_hits_under_preemption(scheduler):
    """No two requests share a prefix: vLLM v1's hit rate (tokens of first admissions) is 0. vLLM v0's
    (`CacheMetricData`: full blocks of every allocation, re-admissions included) counts a recomputed
    request's re-hit of its own cached blocks, so there it is the re-admissions' hit blocks over all queried."""
    scenario = load_scenario(SCENARIOS / "preemption-recompute.yaml",
                             ["workload.num_requests=60", "engine.enable_prefix_caching=true",
                              f"engine.scheduler={scheduler}"])
    summary = simulate(scenario).summary
    assert summary["num_preemptions"] > 0
    assert summary["num_prefix_cache_hit_tokens"] == 0
    assert summary["num_prefix_cache_preempted_query_tokens"] > 0
    if scheduler == "v1":
        assert summary["prefix_cache_hit_rate"] == 0.0 and "num_prefix_cache_hit_blocks" not in summary
    else:
        assert 0 < summary["num_prefix_cache_hit_blocks"] < summary["num_prefix_cache_query_blocks"]
        assert summary["prefix_cache_hit_rate"] == (summary["num_prefix_cache_hit_blocks"]
                                                    / summary["num_prefix_cache_query_blocks"])


@pytest.mark.parametrize("policy, running", [("v0", 1), ("v1", 4)])
def test_max_num_seqs_counts_sequences_not_requests(policy, running):
    """n = 4 samples under max_num_seqs = 4: one request at a time (4 sequences), never 4 requests. v0 runs
    it as one request of 4 sequences; v1 as 4 child requests of one each (vLLM v1's fan-out), so the
    engine's running count is 4."""
    s = tiny_world(policy=policy, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=256)
    reqs = [make_request(i, 0.0, prompt=16, output=4, n=4) for i in range(3)]
    rec = run(s, reqs)
    assert max(list(rec.frame()["vllm:num_requests_running"])) == running
    # requests run back to back: each waits for the previous one to finish
    assert reqs[1].first_scheduled_s >= reqs[0].finish_s and reqs[2].first_scheduled_s >= reqs[1].finish_s


def test_v1_watermark_never_refuses_a_request_that_fits_alone():
    """A request needing all 10 usable blocks (160 slots): v1 runs it alone despite a 2-block watermark. vLLM v0
    admits it for its prompt (7 blocks: 10 − 7 ≥ 2), lets it grow to all 10 blocks (KV of 145 tokens: a new
    block at 112, 128 and 144), preempts it at 145, where no block is free for the append, and ignores it on
    readmission (cdiv(146, 16) = 10 blocks, 10 − 10 < 2: `can_allocate` NEVER): it ends with its 46 tokens, 15 of
    the 61 asked cut (finish reason "length")."""
    for policy, capped in (("v1", 0), ("v0", 15)):
        s = tiny_world(policy=policy, num_blocks=11, max_model_len=256, max_num_batched_tokens=256,
                       watermark_slots=32)
        req = make_request(0, 0.0, prompt=100, output=61)  # kv_len 160 = 10 blocks
        run(s, [req])
        assert req.status is RequestStatus.FINISHED and req.num_length_capped_tokens == capped, policy


def test_per_request_tpot_has_vllms_per_request_name():
    assert VLLM_REQUEST_METRICS["tpot_s"] == "vllm:request_time_per_output_token_seconds"


def test_inter_token_latency_is_per_token():
    """vLLM observes ITL once per generated token, so its mean weights requests by their output lengths."""
    scenario = load_scenario(None, ["workload.num_requests=20"])
    result = simulate(scenario)
    done = result.requests[result.requests.status == "finished"]
    gaps = (done.output_tokens - 1).sum()
    expected = (done.finish_s - done.first_token_s).sum() / gaps
    assert abs(result.summary["inter_token_latency_s"]["mean"] - expected) < 1e-12


def test_a_recomputed_duplicate_block_keeps_the_prefix_found_after_the_original_is_evicted():
    """vLLM caches a block whose content is already cached under another block (BlockHashToBlockMap does not
    de-duplicate) and finds it once the first is evicted. Blocks of 4, usable blocks 1..6.

    A (8 tokens of P + 4 of a) holds blocks 1, 2, 3, all cached; it ends: they are freed tail-first (3, 2, 1).
    B's prompt is P's 8 tokens: at most (8 - 1) // 4 = 1 block can hit, so B takes block 1 and recomputes P's
    second block in the next free plain block, 4, which vLLM caches as a duplicate of block 2. C (16 unique
    tokens) takes the plain blocks 5, 6, then evicts 3 and 2. D (P + 4 of d) looks up 2 blocks: 1 and, now
    that block 2 is gone, 4: 8 tokens (kvsim, which cached only the first block holding content, found 4)."""
    from kvsim.kv import PagedAllocator, PrefixHit
    from kvsim.workload.content import SegmentContent

    alloc = PagedAllocator(num_blocks=7, block_size=4, enable_caching=True)
    a = SegmentContent([("P", 8), ("a", 4)])
    assert alloc.allocate(1, 12, 12, a)
    assert alloc.seqs[1].block_table == [1, 2, 3]
    alloc.free(1)
    b = SegmentContent([("P", 8), ("b", 4)])
    hit = alloc.lookup_prefix(b, 8)
    assert hit == PrefixHit(4, (1,))
    assert alloc.allocate(2, 8, 12, b, hit)
    assert alloc.seqs[2].block_table == [1, 4]
    assert alloc.allocate(3, 16, 16, SegmentContent([("c", 16)]))
    assert alloc.seqs[3].block_table == [5, 6, 3, 2]
    alloc.check_invariants()
    assert alloc.lookup_prefix(SegmentContent([("P", 8), ("d", 4)]), 12) == PrefixHit(8, (1, 4))
    # B ends: its blocks are both cached (4 as P's second block), so both join the LRU tail, 4 first
    alloc.free(2)
    assert alloc.pool.free_queue == [4, 1]
    alloc.check_invariants()


def test_without_prefix_caching_nothing_is_counted_as_queried():
    """vLLM's KVCacheManager looks nothing up and records no prefix-cache query when prefix caching is off
    (get_computed_blocks returns before its stats; newer: record_prefix_cache_stats skips a request that did
    no lookup), so vllm:prefix_cache_queries_total stays 0. Same two requests, caching on: 40 + 40 queried."""
    for caching, queried in ((False, 0), (True, 80)):
        s = tiny_world(num_blocks=32, max_num_batched_tokens=128, caching=caching)
        run(s, [make_request(i, 0.0, prompt=40, output=4) for i in range(2)])
        assert s.prefix_stats.num_query_tokens == queried and s.prefix_stats.num_hit_tokens == 0
    s = tiny_world(allocator="slab-max", num_blocks=32, max_num_batched_tokens=128)  # slabs: no prefix cache
    run(s, [make_request(i, 0.0, prompt=40, output=4) for i in range(2)])
    assert s.prefix_stats.num_query_tokens == 0
