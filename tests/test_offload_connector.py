"""The offload tier wired into the engine (`kvsim.kv.offload_connector`, `Scheduler.start_load`): timelines
derived by hand, bandwidth sharing, conservation, size 0 = no tier.

Tiny world: a GPU pool of 8 usable blocks of 16 tokens, a CPU tier of 100 blocks, each block
1,000,000 B, the GPU<->CPU link 4e8 B/s each way (one block takes 2.5 ms), every step STEP_S = 10 ms.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.engine.loop import run_engine
from kvsim.kv import PagedAllocator, TokenContent
from kvsim.kv.link import LinkSpec
from kvsim.kv.offload_connector import OffloadConnector, TierSpec
from kvsim.latency.base import ConstantLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.sched import SchedulerLimits, make_scheduler
from kvsim.workload.request import Request

STEP_S = 0.01
BLOCK_BYTES = 1_000_000
BANDWIDTH = 4e8
BLOCK_S = BLOCK_BYTES / BANDWIDTH  # 2.5 ms per block


def connector(num_cpu_blocks=100, disk=None, prompt_only=True):
    tiers = [TierSpec("cpu", num_cpu_blocks, LinkSpec(BANDWIDTH))]
    if disk is not None:
        tiers.append(TierSpec("disk", disk[0], LinkSpec(disk[1]), LinkSpec(disk[1])))
    return OffloadConnector(tiers, LinkSpec(BANDWIDTH), 16, BLOCK_BYTES, offload_prompt_only=prompt_only)


def run(requests, offload, num_blocks=9, budget=16):
    alloc = PagedAllocator(num_blocks, 16)
    scheduler = make_scheduler("v1", alloc, SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=budget,
                                                            max_model_len=1024))
    scheduler.offload = offload
    run_engine(scheduler, ConstantLatency(STEP_S), requests, check=True)
    return scheduler, scheduler.records.columns()


def req(request_id, arrival_s, tokens, output_len=1):
    return Request(request_id, arrival_s, len(tokens), output_len, TokenContent(tokens))


def evicted_then_reused(offload):
    """A (64 tokens) at 0; B (128 other tokens) at 1 s takes all 8 GPU blocks, evicting A's 4 cached ones;
    C at 2 s: A's 64 tokens + 16 new ones."""
    a, b = list(range(64)), list(range(1000, 1128))
    return run([req(0, 0.0, a), req(1, 1.0, b), req(2, 2.0, a + list(range(5000, 5016)))], offload)


def test_prefix_evicted_to_cpu_loads_instead_of_recomputing():
    scheduler, rows = evicted_then_reused(connector())
    # C: GPU miss (evicted), CPU hit of blocks 0..3 (the 4 full blocks before its last token). It waits for
    # the load (4 blocks over the idle link: 4 · 2.5 ms), then one step prefills its 16 new tokens and samples.
    assert rows["ttft_s"][2] == pytest.approx(4 * BLOCK_S + STEP_S, rel=1e-12)
    assert rows["prefix_hit_tokens"][2] == 64  # counted as cached, not prefilled
    assert rows["queue_s"][2] == pytest.approx(4 * BLOCK_S, rel=1e-12)  # scheduled once loaded
    summary = scheduler.offload.summary(3.0, end_s=3.0)
    assert summary["recompute_avoided_tokens"] == 64
    assert summary["bytes_loaded"] == 4 * BLOCK_BYTES
    assert summary["tiers"]["cpu"]["num_hit_blocks"] == 4
    assert summary["load_s_mean"] == pytest.approx(4 * BLOCK_S, rel=1e-12)
    # write-through: A's 4 blocks, B's 8, C's block 4 (its fifth, the 16 new tokens) = 13 blocks stored
    assert summary["bytes_stored"] == 13 * BLOCK_BYTES
    # the GPU's own prefix cache missed: its counters saw C's query, no hit
    assert scheduler.prefix_stats.num_hit_tokens == 0
    assert scheduler.prefix_stats.num_query_tokens == 64 + 128 + 80


def test_a_block_aligned_prompt_loads_its_last_block_and_recomputes_one_token():
    """C repeats A's 64 tokens exactly (4 full blocks). vLLM asks the tier for all num_tokens // 16 = 4 blocks
    (`get_num_new_matched_tokens`) and, the load covering every token, recomputes the last one alone
    (`_update_waiting_for_remote_kv`: num_computed_tokens = 64 − 1): 4 blocks over the idle link, then one
    1-token step. (Asking only for the 3 blocks before the last token would load 3 and prefill 16.)"""
    a, b = list(range(64)), list(range(1000, 1128))
    scheduler, rows = run([req(0, 0.0, a), req(1, 1.0, b), req(2, 2.0, a)], connector())
    assert rows["ttft_s"][2] == pytest.approx(4 * BLOCK_S + STEP_S, rel=1e-12)
    assert rows["queue_s"][2] == pytest.approx(4 * BLOCK_S, rel=1e-12)
    assert rows["prefix_hit_tokens"][2] == 63
    summary = scheduler.offload.summary(3.0, end_s=3.0)
    assert summary["tiers"]["cpu"]["num_hit_blocks"] == 4 and summary["bytes_loaded"] == 4 * BLOCK_BYTES
    assert summary["bytes_stored"] == 12 * BLOCK_BYTES  # A's 4 and B's 8; C's 4 are held already


def test_the_cpu_tier_evicts_a_prefix_tail_first_and_a_queried_request_s_blocks_last():
    """vLLM's LRU offload manager is touched (the first block most recently) after each store that wrote a
    request's blocks (`_get_reqs_to_store`) and on each lookup of a request (`get_num_new_matched_tokens`).
    CPU tier of 8 blocks. A (64 tokens) prefills 16 a step, storing one block a step and touching its prefix:
    a3 a2 a1 a0 (LRU first); D (64 others) likewise: a3 a2 a1 a0 d3 d2 d1 d0, full. A2 = A's 64 + 16 new: its
    query touches a0..a3 (d3 d2 d1 d0 a3 a2 a1 a0); its block a4 evicts d3, then the touch gives
    d2 d1 d0 a4 a3 a2 a1 a0. (Without the touches a0, A's head, would have gone first.)"""
    a, d, new = list(range(64)), list(range(1000, 1064)), list(range(5000, 5016))
    scheduler, _ = run([req(0, 0.0, a), req(1, 0.5, d), req(2, 1.0, a + new)], connector(num_cpu_blocks=8))
    ah, dh = TokenContent(a + new).block_hashes(16, 5), TokenContent(d).block_hashes(16, 4)
    expected = [dh[2], dh[1], dh[0], ah[4], ah[3], ah[2], ah[1], ah[0]]
    assert scheduler.offload.cache.tiers[0].hashes_lru_first() == expected


def test_without_offload_the_prefix_is_recomputed():
    _, rows = evicted_then_reused(None)
    assert rows["ttft_s"][2] == pytest.approx(5 * STEP_S, rel=1e-12)  # 80 tokens at 16 per step
    assert rows["prefix_hit_tokens"][2] == 0


def test_a_load_slower_than_its_recompute_hurts():
    slow = 1e7  # B/s (a slow disk or a shared, throttled link): a block takes 0.1 s, ten steps' worth
    offload = OffloadConnector([TierSpec("cpu", 100, LinkSpec(slow))], LinkSpec(BANDWIDTH), 16, BLOCK_BYTES)
    _, rows = evicted_then_reused(offload)
    assert rows["ttft_s"][2] == pytest.approx(4 * BLOCK_BYTES / slow + STEP_S, rel=1e-12)  # 0.41 s > 0.05 s
    assert rows["ttft_s"][2] > 5 * STEP_S


def test_two_concurrent_loads_share_the_bandwidth():
    a1, a2 = list(range(64)), list(range(100, 164))
    b = list(range(1000, 1256))  # 16 blocks: evicts everything cached
    requests = [req(0, 0.0, a1), req(1, 0.0, a2), req(2, 1.0, b),
                req(3, 2.0, a1 + list(range(5000, 5016))), req(4, 2.0, a2 + list(range(6000, 6016)))]
    scheduler, rows = run(requests, connector(), num_blocks=17, budget=64)
    # both loads (4 blocks each) start at 2 s and drain together at half the bandwidth: both end at
    # 2 + 2 · 4 · 2.5 ms; one step then prefills both (16 + 16 tokens within the 64-token budget).
    for i in (3, 4):
        assert rows["ttft_s"][i] == pytest.approx(2 * 4 * BLOCK_S + STEP_S, rel=1e-12)
        assert rows["prefix_hit_tokens"][i] == 64
    assert scheduler.offload.summary(3.0, end_s=3.0)["num_loads"] == 2


def test_a_load_served_by_two_tiers_waits_for_both():
    """A CPU tier of 4 blocks demotes its evictions to a disk tier (read at 1e8 B/s): C's 4 blocks are
    on disk (A's, demoted when B's 8 were stored), so it waits for 4 blocks over the disk's link."""
    disk_bw = 1e8
    scheduler, rows = evicted_then_reused(connector(num_cpu_blocks=4, disk=(100, disk_bw)))
    hits = scheduler.offload.summary(3.0, end_s=3.0)["tiers"]
    assert hits["disk"]["num_hit_blocks"] == 4 and hits["cpu"]["num_hit_blocks"] == 0
    assert rows["ttft_s"][2] == pytest.approx(4 * BLOCK_BYTES / disk_bw + STEP_S, rel=1e-12)


def test_a_demotion_to_disk_is_written_over_the_disk_link_before_it_can_hit():
    """CPU tier of 4 blocks, disk written at 1e8 B/s (one block: 10 ms). A's 4 blocks stored at 0 (ready at
    10 ms); B's 4 at 20 ms evict them: one 4-block write to disk, alone until 30 ms (1e6 B drained), when C's
    2 blocks (stored at 30 ms, B ready by then) evict B's last two (vLLM touches a request's blocks after
    storing them, its first most recently: a prefix's tail goes first), a 2-block write sharing the link: both
    drain at 5e7 B/s, C's demotion (2e6 B) ends at 70 ms, then A's last 1e6 B alone by 80 ms. B's first two
    stay on the CPU throughout; its last two hit on disk from 70 ms."""
    offload = connector(num_cpu_blocks=4, disk=(100, 1e8))
    a, b, c = (TokenContent(list(range(k, k + 64))) for k in (0, 1000, 2000))
    offload.store([(a.block_hashes(16, 4), 0)], 0.0)
    offload.store([(b.block_hashes(16, 4), 0)], 0.02)
    offload.store([(c.block_hashes(16, 2), 0)], 0.03)
    offload.check_invariants()
    eps = 1e-9
    for now, a_hits, b_hits in ((0.07 - eps, 0, 2), (0.07 + eps, 0, 4), (0.08 - eps, 0, 4), (0.08 + eps, 4, 4)):
        offload.advance(now)
        assert offload.lookup(a, 0, 4) == a_hits and offload.lookup(b, 0, 4) == b_hits, now
        offload.check_invariants()
    disk = offload.summary(0.1, end_s=0.1)["tiers"]["disk"]
    assert disk["bytes_stored"] == 6 * BLOCK_BYTES and disk["num_stored_blocks"] == 6
    assert disk["store_link_busy_fraction"] == pytest.approx(6 * BLOCK_BYTES / 1e8 / 0.1, rel=1e-12)


def test_the_store_link_busy_fraction_is_the_union_of_its_draining_intervals_within_the_run():
    """One block takes 2.5 ms alone. A's 2 blocks stored at 0 drain until 5 ms; idle; B's 4 at 20 ms drain alone
    until C's 4 join at 25 ms (B has 2 left), then both at half speed: B ends at 35 ms, C (2 left) alone by 40 ms.
    Busy: [0, 5] and [20, 40] ms. A run ending at 30 ms saw 5 + 10 ms of it: 0.5 of 30 ms (the bytes written,
    10 blocks = 25 ms of link time, ÷ 30 ms would say 0.83; a 10-block write at 0 in a 10 ms run, 2.5)."""
    offload = connector()
    a, b, c = (TokenContent(list(range(k, k + 64))) for k in (0, 1000, 2000))
    offload.store([(a.block_hashes(16, 2), 0)], 0.0)
    offload.store([(b.block_hashes(16, 4), 0)], 0.02)
    offload.store([(c.block_hashes(16, 4), 0)], 0.025)
    summary = offload.summary(0.03, end_s=0.03)
    assert summary["store_link_busy_fraction"] == pytest.approx(0.015 / 0.03, rel=1e-12)
    assert summary["tiers"]["cpu"]["store_link_busy_fraction"] == summary["store_link_busy_fraction"]
    assert summary["bytes_stored"] == 10 * BLOCK_BYTES  # the writes started, ended or not
    late = connector()
    late.store([(TokenContent(list(range(160))).block_hashes(16, 10), 0)], 0.0)
    assert late.summary(0.01, end_s=0.01)["store_link_busy_fraction"] == pytest.approx(1.0, rel=1e-12)


def test_store_not_finished_is_not_hit():
    """A block is hittable only once its store transfer has ended."""
    offload = connector()
    content = TokenContent(list(range(64)))
    offload.store([(content.block_hashes(16, 4), 0)], 0.0)  # 4 blocks: ends at 4 · 2.5 ms
    offload.advance(4 * BLOCK_S / 2)
    assert offload.lookup(content, 0, 4) == 0
    offload.advance(4 * BLOCK_S)
    assert offload.lookup(content, 0, 4) == 4


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["store", "load", "advance"]), st.integers(0, 7), st.integers(1, 6)),
                max_size=40))
def test_random_operations_keep_every_tier_balanced(ops):
    """Conservation per tier: every slot ever reserved is held or was evicted; pins = loads in flight."""
    offload = connector(num_cpu_blocks=6, disk=(5, 2e8))
    contents = [TokenContent(list(range(1000 * i, 1000 * i + 16 * 6))) for i in range(8)]
    now, loading = 0.0, set()
    for kind, which, num_blocks in ops:
        content = contents[which]
        if kind == "store":
            offload.store([(content.block_hashes(16, num_blocks), 0)], now)
        elif kind == "load" and which not in loading and (hit := offload.lookup(content, 0, num_blocks)):
            offload.start_load(which, content, 0, hit, now)
            loading.add(which)
        else:
            now += BLOCK_S * num_blocks
            loading -= set(offload.take_ready(now))
        offload.check_invariants()
        for tier in offload.cache.tiers:
            storing = sum(1 for h in tier.hashes_lru_first() if not tier.holds(h))
            assert tier.num_stored_blocks + storing == tier.num_held + tier.num_evicted_blocks
            assert tier.num_held <= tier.num_blocks
        assert loading == offload.loading_ids


def test_loads_ending_in_one_step_rejoin_the_queue_in_queue_order():
    """vLLM keeps a request waiting for its KV in the waiting queue and admits the ready ones in queue order.
    D (2 CPU blocks + 16 new tokens) and E (1 block + 16 new) arrive together at 0.995 s, while R (no
    content, so nothing of it is stored) decodes a token a step. At the 1.0 s step both start their loads
    (D first, the queue's head): sharing the link, E's one block ends at 1.005, D's two at 1.0075; both
    are ready when the step ends at 1.01. The budget (16, R takes 1) then admits one chunk: D's, queue
    order, though E's load ended first; E is admitted a step later."""
    d, e, new = list(range(32)), list(range(100, 116)), list(range(5000, 5016))
    offload = connector()
    offload.store([(TokenContent(d).block_hashes(16, 2), 0), (TokenContent(e).block_hashes(16, 1), 0)], 0.0)
    requests = [Request(0, 0.0, 16, 300), req(1, 0.995, d + new), req(2, 0.995, e + new)]
    _, rows = run(requests, offload, num_blocks=30)
    assert rows["queue_s"][1] == pytest.approx(1.01 - 0.995, abs=1e-9)
    assert rows["queue_s"][2] == pytest.approx(1.02 - 0.995, abs=1e-9)


def test_a_request_whose_hit_another_is_loading_waits_for_that_load_and_hits_the_gpu_cache():
    """vLLM does not load a block twice: with GPU prefix caching on, `OffloadingConnectorScheduler.
    get_num_new_matched_tokens` (vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py) returns
    None for a request whose hit blocks are in `_blocks_being_loaded` ("hit blocks are being loaded, delay
    request"), `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py) skips it and goes on admitting, and once
    the load has ended (`_update_waiting_for_remote_kv` caches the loaded blocks) it hits them in the GPU cache.
    A (64 tokens) at 0; B (256 other tokens) at 1 s evicts A's 4 GPU blocks from the 16; C and D at 2 s, each
    A's 64 tokens + 16 new ones. Step at 2 s: C's CPU hit (a0..a3) starts loading; D's hit is the same 4 blocks,
    being loaded: D waits. 2.01 s (4 blocks over the idle link, 4 · 2.5 ms): C rejoins holding them and is
    admitted; D's GPU lookup hits C's 4 blocks (no load); one step prefills both 16-token suffixes (32 of the
    64-token budget): TTFT 4 · 2.5 ms + 10 ms each, one load of 4 blocks. (Loading D's copy too, the two loads
    would share the link and both end at 2 · 4 · 2.5 ms.)"""
    a, b = list(range(64)), list(range(1000, 1256))
    requests = [req(0, 0.0, a), req(1, 1.0, b), req(2, 2.0, a + list(range(5000, 5016))),
                req(3, 2.0, a + list(range(6000, 6016)))]
    scheduler, rows = run(requests, connector(), num_blocks=17, budget=64)
    for i in (2, 3):
        assert rows["ttft_s"][i] == pytest.approx(4 * BLOCK_S + STEP_S, rel=1e-12)
        assert rows["queue_s"][i] == pytest.approx(4 * BLOCK_S, rel=1e-12)
        assert rows["prefix_hit_tokens"][i] == 64  # C's loaded, D's from the GPU cache
    summary = scheduler.offload.summary(3.0, end_s=3.0)
    assert (summary["num_loads"], summary["bytes_loaded"]) == (1, 4 * BLOCK_BYTES)
    # the GPU cache's counters: D's hit of C's loaded blocks; queries A 64, B 256, C 80, D 80
    assert (scheduler.prefix_stats.num_hit_tokens, scheduler.prefix_stats.num_query_tokens) == (64, 480)


def test_a_request_waiting_for_another_s_load_lets_the_queue_behind_it_in_and_without_caching_loads_again():
    """The world above with E (16 tokens of its own, no hit) queued behind D: vLLM's `Scheduler.schedule` puts the
    delayed D aside (`skipped_waiting`) and admits E in D's step (TTFT one step). Without GPU prefix caching vLLM
    keeps no `_blocks_being_loaded` (None), so D loads the same 4 blocks again beside C: 2 · 4 · 2.5 ms + 10 ms."""
    a, b = list(range(64)), list(range(1000, 1256))

    def requests(num):
        return [req(0, 0.0, a), req(1, 1.0, b), req(2, 2.0, a + list(range(5000, 5016))),
                req(3, 2.0, a + list(range(6000, 6016))), req(4, 2.0, list(range(7000, 7016)))][:num]

    _, rows = run(requests(5), connector(), num_blocks=17, budget=64)
    assert rows["ttft_s"][4] == pytest.approx(STEP_S, rel=1e-12)
    assert rows["ttft_s"][3] == pytest.approx(4 * BLOCK_S + STEP_S, rel=1e-12)
    alloc = PagedAllocator(17, 16, enable_caching=False)
    scheduler = make_scheduler("v1", alloc, SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=64,
                                                            max_model_len=1024))
    scheduler.offload = connector()
    run_engine(scheduler, ConstantLatency(STEP_S), requests(4), check=True)
    rows = scheduler.records.columns()
    for i in (2, 3):
        assert rows["ttft_s"][i] == pytest.approx(2 * 4 * BLOCK_S + STEP_S, rel=1e-12)
    assert scheduler.offload.summary(3.0, end_s=3.0)["num_loads"] == 2


@pytest.mark.parametrize("prompt_only", [True, False])
def test_only_the_prompt_s_blocks_are_stored_unless_offload_prompt_only_is_false(prompt_only):
    """vLLM's `OffloadingSpec` (vllm/v1/kv_offload/base.py) reads `offload_prompt_only` from
    kv_connector_extra_config, default true, and `OffloadingConnectorScheduler._build_store_jobs`
    (v1/offloading/scheduler.py) then clamps the tokens it stores to `req.num_prompt_tokens`, so a decoded
    token's block is never stored. A: 32 prompt tokens (2 blocks) and 40 output tokens, 71 computed when it
    ends (4 full blocks). D (128 other tokens) at 1 s takes all 8 GPU blocks, evicting A's. B at 2 s: A's first
    64 tokens (its prompt and 32 outputs) + 16 new. Prompt only: the tier holds a0, a1 and D's 8 when B comes,
    B loads 2 blocks (5 ms) and prefills 48 tokens at 16 a step: TTFT 2 · 2.5 ms + 3 · 10 ms, and its blocks 2..4
    are stored (13 in all). Otherwise it holds a0..a3 and D's 8: B loads 4 blocks and prefills 16: 4 · 2.5 ms +
    10 ms, and its block 4 is stored (13 again)."""
    a = list(range(72))
    requests = [Request(0, 0.0, 32, 40, TokenContent(a)), req(1, 1.0, list(range(1000, 1128))),
                req(2, 2.0, a[:64] + list(range(5000, 5016)))]
    scheduler, rows = run(requests, connector(prompt_only=prompt_only))
    num_loaded = 2 if prompt_only else 4
    assert rows["ttft_s"][2] == pytest.approx(num_loaded * BLOCK_S + (80 - 16 * num_loaded) / 16 * STEP_S,
                                              rel=1e-12)
    assert rows["prefix_hit_tokens"][2] == 16 * num_loaded
    summary = scheduler.offload.summary(3.0, end_s=3.0)
    assert summary["tiers"]["cpu"]["num_hit_blocks"] == num_loaded
    assert summary["bytes_stored"] == (2 + 8 + 3 if prompt_only else 4 + 8 + 1) * BLOCK_BYTES


def test_a_preempted_request_does_not_offer_the_blocks_it_stored_again():
    """vLLM keeps a preempted request's `next_stored_block_idx` (`OffloadingConnectorScheduler`, v1/offloading/
    scheduler.py: only `reset_cache` sets it back to 0; `_build_store_jobs` offers blocks from it on), so the
    blocks it stored before its preemption are not offered again when it recomputes them. A (32 prompt tokens)
    stores a0, a1 in its two 16-token chunks, decodes a token and is preempted; X's 2 blocks then fill the 2-block
    CPU tier, evicting a0, a1. A is admitted again hitting its own 2 blocks, still cached on the GPU, and
    computes its 2 other tokens: nothing new to store, so the tier keeps X's blocks (4 stored in all). Offering
    a0, a1 again (a reset index) stores them a second time, evicting X's."""
    sched = make_scheduler("v1", PagedAllocator(9, 16), SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=16,
                                                                        max_model_len=1024))
    sched.offload = offload = connector(num_cpu_blocks=2)
    a = req(0, 0.0, list(range(32)), output_len=50)
    assert sched.add(a)
    now = 0.0
    for _ in range(3):
        plan = sched.schedule(now)
        now += STEP_S
        sched.complete(plan, now)
    sched.running.remove(a)
    sched.preempt(a, StepPlan())  # vLLM's _preempt_request
    x = TokenContent(list(range(1000, 1032))).block_hashes(16, 2)
    offload.store([(x, 0)], now)
    now += 2 * BLOCK_S  # X's store has ended
    plan = sched.schedule(now)
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(0, 2)] and a.num_computed_tokens == 32
    sched.complete(plan, now + STEP_S)
    offload.advance(now + 1.0)
    tier = offload.cache.tiers[0]
    assert tier.hashes_lru_first() == [x[1], x[0]] and tier.num_stored_blocks == 4  # X's store touched x0 last
    sched.check_invariants()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=2, max_size=8))
def test_with_prefix_caching_no_block_is_ever_read_by_two_loads_at_once(specs):
    """vLLM's `_blocks_being_loaded` (with GPU prefix caching) means a block is loaded by one request at a time.
    Three requests store 3 prefixes of 3 blocks, a 256-token request (all 16 GPU blocks) evicts them from the GPU,
    then 2 to 8 requests, each one prefix and 16 tokens of its own, arrive in the next 4 steps: every step no tier
    block has more than one pin (two loads reading it), the books balance, and every request finishes."""
    sched = make_scheduler("v1", PagedAllocator(17, 16), SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=64,
                                                                         max_model_len=1024))
    sched.offload = offload = connector()
    prefixes = [list(range(100 * p, 100 * p + 48)) for p in range(3)]
    rounds = [[req(0, 0.0, prefixes[0]), req(1, 0.0, prefixes[1]), req(2, 0.0, prefixes[2])],
              [req(3, 1.0, list(range(10**4, 10**4 + 256)))]]  # the prefixes stored, then evicted from the GPU
    rounds.append([req(4 + i, 2.0 + step * STEP_S, prefixes[p] + list(range(10**5 * (i + 1), 10**5 * (i + 1) + 16)))
                   for i, (p, step) in enumerate(specs)])
    arrivals = sorted((r for group in rounds for r in group), key=lambda r: r.arrival_s)
    num_requests, now, num_done = len(arrivals), 0.0, 0
    while num_done < num_requests:
        assert now < 10.0, "no progress"
        while arrivals and arrivals[0].arrival_s <= now + 1e-9:
            assert sched.add(arrivals.pop(0))
        plan = sched.schedule(now)
        now = round(now + STEP_S, 9)
        num_done += len(sched.complete(plan, now))
        sched.check_invariants()
        assert all(tier.pins_of(h) <= 1 for tier in offload.cache.tiers for h in tier.hashes_lru_first())
    assert sched.alloc.num_held_slots == 0
