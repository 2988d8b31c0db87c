"""A lookup that meets a block whose CPU store is still in flight (vLLM's HIT_PENDING): the request waits and is
tried again, then loads (`Scheduler.waits_for_a_transfer`, `OffloadConnector.hit_pending`, `await_stores`).

vLLM (vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py, `_maximal_prefix_lookup`) walks the
request's blocks past its GPU hit: HIT counts, HIT_PENDING (held, store not complete: `CPUOffloadingManager.lookup`
checks `block.is_ready`) counts and marks the lookup deferred, MISS ends the walk; a deferred walk makes
`get_num_new_matched_tokens` return None, and `Scheduler.schedule` skips the request this step (its skipped queue)
and asks again the next. Tiny world of `test_offload_connector`: 8 usable GPU blocks of 16 tokens, 1,000,000 B a
block, every step 10 ms, loads at 4e8 B/s (2.5 ms a block); stores here over a slow link, 1e7 B/s (0.1 s a block).
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.engine.loop import run_engine
from kvsim.kv import PagedAllocator, TokenContent
from kvsim.kv.link import LinkSpec
from kvsim.kv.offload_connector import OffloadConnector, TierSpec
from kvsim.latency.base import ConstantLatency
from kvsim.sched import SchedulerLimits, make_scheduler
from kvsim.workload.request import Request

STEP_S = 0.01
BLOCK_BYTES = 1_000_000
LOAD_BW = 4e8  # 2.5 ms a block
STORE_BW = 1e7  # 0.1 s a block


def connector(num_cpu_blocks=100):
    return OffloadConnector([TierSpec("cpu", num_cpu_blocks, LinkSpec(LOAD_BW))], LinkSpec(STORE_BW), 16,
                            BLOCK_BYTES)


def run(requests, offload, num_blocks=9, budget=64):
    scheduler = make_scheduler("v1", PagedAllocator(num_blocks, 16),
                               SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=1024))
    scheduler.offload = offload
    run_engine(scheduler, ConstantLatency(STEP_S), requests, check=True)
    return scheduler, scheduler.records.columns()


def req(request_id, arrival_s, tokens, output_len=1):
    return Request(request_id, arrival_s, len(tokens), output_len, TokenContent(tokens))


def test_a_request_whose_hit_is_still_being_stored_waits_for_the_store_then_loads():
    """A (64 tokens) at 0: one 10 ms step computes them; at 0.01 s its 4 full blocks go to the CPU tier as one
    4e6 B write, alone on the 1e7 B/s link: stored at 0.41 s. B (128 tokens, no content: nothing stored) at 0.02 s
    takes all 8 GPU blocks (2 steps), evicting A's cached ones. C (A's 64 + 16 new) at 0.1 s: GPU miss; the tier
    holds a0..a3 but their store is in flight: vLLM defers C (HIT_PENDING) and the idle engine waits. At 0.41 s
    the store ends, C hits 4 blocks and loads them (4 · 2.5 ms: ready at 0.42 s), then one step prefills its 16
    new tokens: first token at 0.43 s. TTFT 0.33 s, queue 0.32 s, 64 tokens hit. (Stopping the hit at the
    storing block, as kvsim did, prefilled all 80 tokens at once: TTFT 2 steps, 0.02 s, nothing loaded.)"""
    a = list(range(64))
    requests = [req(0, 0.0, a), Request(1, 0.02, 128, 1), req(2, 0.1, a + list(range(5000, 5016)))]
    scheduler, rows = run(requests, connector())
    assert rows["ttft_s"][2] == pytest.approx(0.43 - 0.1, rel=1e-12)
    assert rows["queue_s"][2] == pytest.approx(0.42 - 0.1, rel=1e-12)
    assert rows["prefix_hit_tokens"][2] == 64
    summary = scheduler.offload.summary(1.0, end_s=1.0)
    assert (summary["num_loads"], summary["bytes_loaded"]) == (1, 4 * BLOCK_BYTES)
    assert not scheduler.offload.awaiting_stores and not scheduler.load_waiters


def test_a_busy_engine_admits_the_deferred_request_at_the_first_step_after_the_store():
    """The world above, loads at 8e8 B/s (1.25 ms a block), and R (16 tokens, no content) arriving at 0.103 s
    and decoding throughout: the engine steps at 0.103 + 10 ms · k. C, deferred at 0.1 s and asked again each
    step, still meets the storing blocks at 0.403 s; at 0.413 s (the store ended at 0.41 s) it hits 4 blocks
    and loads them (5 ms: ready at 0.418 s) while R decodes; it is admitted at the next step boundary, 0.423 s:
    first token at 0.433 s. R, behind C in the queue, was admitted at 0.103 s: C's deferral let it by."""
    a = list(range(64))
    offload = OffloadConnector([TierSpec("cpu", 100, LinkSpec(2 * LOAD_BW))], LinkSpec(STORE_BW), 16, BLOCK_BYTES)
    requests = [req(0, 0.0, a), Request(1, 0.02, 128, 1), req(2, 0.1, a + list(range(5000, 5016))),
                Request(3, 0.103, 16, 100)]
    _, rows = run(requests, offload)
    ttft = dict(zip(rows["request_id"], rows["ttft_s"], strict=True))
    hits = dict(zip(rows["request_id"], rows["prefix_hit_tokens"], strict=True))
    assert ttft[2] == pytest.approx(0.433 - 0.1, rel=1e-9) and hits[2] == 64
    assert ttft[3] == pytest.approx(STEP_S, rel=1e-9)


def test_a_store_started_while_a_request_waits_wakes_the_engine_at_the_awaited_stores_new_end():
    """The write link is shared (processor sharing, `kvsim.kv.link`): a store started while a request awaits
    another one delays it, and the idle engine must wake at the new end. The first world, plus D (64 tokens of its
    own) at 0.15 s: one step, then at 0.16 s its 4 blocks (4e6 B) start storing beside A's, which has 2.5e6 B left
    (1.5e6 B drained since 0.01 s). Each drains at 5e6 B/s: A's ends at 0.16 + 0.5 = 0.66 s, not 0.41 s. C, woken
    then, loads 4 blocks (10 ms) and prefills: first token 0.68 s, TTFT 0.58 s, queue 0.57 s. (The engine was woken
    at 0.41 s only, found A's store in flight and waited for a wake-up never armed: simpy ran out of events.)"""
    a = list(range(64))
    requests = [req(0, 0.0, a), Request(1, 0.02, 128, 1), req(2, 0.1, a + list(range(5000, 5016))),
                req(3, 0.15, list(range(9000, 9064)))]
    scheduler, rows = run(requests, connector())
    assert rows["ttft_s"][2] == pytest.approx(0.68 - 0.1, rel=1e-12)
    assert rows["queue_s"][2] == pytest.approx(0.67 - 0.1, rel=1e-12)
    assert rows["prefix_hit_tokens"][2] == 64 and rows["finish_s"][3] == pytest.approx(0.16, rel=1e-12)
    assert not scheduler.has_work and not scheduler.offload.awaiting_stores

def test_an_awaited_store_whose_end_was_re_estimated_is_told_again_when_the_told_instant_comes():
    """A link re-estimates a transfer's end each time it drains it piecewise (`SharedLink.advance`), a few ulps
    apart. One block (1e6 B) stored at 0 over 1e6 B/s ends at 1.0 s alone, the instant told when a request awaits
    it; booked at six instants before (as the steps' `store` calls do), the link now puts its end an ulp past 1.0 s.
    Advanced to 1.0 s (the engine woken then), the store has ended or its new end is told, past 1.0 s; nothing
    else would wake an idle engine (it waited for good: simpy's 'No scheduled events left' traceback)."""
    told = []
    offload = OffloadConnector([TierSpec("cpu", 100, LinkSpec(LOAD_BW))], LinkSpec(1e6), 16, BLOCK_BYTES)
    offload.on_next_load_end = told.append
    offload.store([(TokenContent(list(range(16))).block_hashes(16, 1), 0)], 0.0)
    offload.await_stores()
    assert told == [1.0]
    for t in (0.2896641383723638, 0.4178406508691356, 0.42636667866841493, 0.7546182662703457, 0.9011387199060191,
              0.9725485107467589):
        offload.advance(t)
    offload.advance(1.0)
    in_flight = offload._writes_on[0].next_end()
    assert in_flight is None or (len(told) == 2 and told[1] == in_flight[0] >= 1.0)


def test_every_request_of_a_world_whose_store_ends_drift_is_served():
    """Found by a property run: 14 requests (3 shared 183-token system prompts) over a 1e6 B/s store link, one
    engine, the CPU tier 20 blocks. A request deferred for a store was woken at the store's first estimated end,
    found it an ulp short and waited for good (simpy's RuntimeError). Every request is served, once."""
    import kvsim

    result = kvsim.simulate({
        "name": "drift", "model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": 1, "latency": {"model": "roofline"},
        "engine": {"max_model_len": 512, "num_gpu_blocks_override": 40, "enable_prefix_caching": True,
                   "kv_offload": {"num_cpu_blocks": 20, "bandwidth_bytes_per_s": 1e6}},
        "workload": {"num_requests": 14, "arrival": {"process": "poisson", "rate": 2.0},
                     "prompt_len": {"dist": "uniform", "low": 1, "high": 59},
                     "output_len": {"dist": "uniform", "low": 1, "high": 3},
                     "shared_prefix": {"tokens": 183, "num_prefixes": 3}}}, check=True)
    assert sorted(result.requests["request_id"]) == list(range(14))
    assert result.summary["kv_offload"]["num_loads"] > 0

def test_a_miss_before_the_storing_block_ends_the_walk_without_deferring():
    """vLLM's walk stops at the first MISS: a block being stored after it does not delay the request. The tier
    holds x0 ready and x2 being stored, not x1: a lookup of x0..x2 hits 1 block and is not pending; of x2 alone,
    it is pending."""
    offload = connector()
    x = TokenContent(list(range(48)))
    hashes = x.block_hashes(16, 3)
    offload.store([([hashes[0]], 0)], 0.0)
    offload.advance(1.0)  # x0 stored
    offload.store([([hashes[2]], 0)], 1.0)  # x2 in flight until 1.1 s
    assert offload.lookup(x, 0, 3) == 1 and not offload.hit_pending(x, 0, 3)
    assert offload.hit_pending(x, 2, 3) and offload.lookup(x, 2, 3) == 0
    offload.advance(1.1 + 1e-9)
    assert not offload.hit_pending(x, 2, 3) and offload.lookup(x, 2, 3) == 1


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(1, 3)), min_size=1, max_size=10),
       st.sampled_from([4, 100]))
def test_deferral_never_loses_or_duplicates_a_request(specs, num_cpu_blocks):
    """Requests sharing one of 3 prefixes (3 blocks) and 16 tokens of their own arrive within 0.4 s while the
    slow link stores the prefixes (0.1 s a block), over a 16-block GPU pool and a CPU tier of 4 or 100 blocks:
    many meet a block still being stored and are deferred, some again and again. Every request ends exactly
    once, finished, with its tokens; every step's books balance (`check=True`); nothing waits at the end."""
    prefixes = [list(range(100 * p, 100 * p + 48)) for p in range(3)]
    requests = sorted((req(i, step * STEP_S, prefixes[p] + list(range(10**4 * (i + 1), 10**4 * (i + 1) + 16)),
                           output_len=out)
                       for i, (p, step, out) in enumerate(specs)), key=lambda r: r.arrival_s)
    scheduler, rows = run(requests, connector(num_cpu_blocks), num_blocks=17)
    assert sorted(rows["request_id"]) == list(range(len(specs)))
    assert list(rows["output_tokens"]) == [specs[i][2] for i in rows["request_id"]]
    assert not scheduler.has_work and not scheduler.awaits_transfers and scheduler.alloc.num_held_slots == 0


def test_a_demotion_being_written_to_disk_is_a_miss_not_pending():
    """Only the CPU tier's stores are vLLM's HIT_PENDING; the disk tier admits a block once written, as LMCache's
    local disk does. CPU tier of 4 blocks, disk written at 1e8 B/s (10 ms a block): A's 4 blocks stored at 0 (ready
    at 0.4 s over the 1e7 B/s store link); B's 4 at 0.5 s evict them to disk, one 4-block write ending at 0.54 s.
    At 0.52 s A's blocks are in neither tier: a miss, nothing to wait for; B's are being stored on the CPU:
    pending. At 0.55 s A hits on disk."""
    offload = OffloadConnector([TierSpec("cpu", 4, LinkSpec(LOAD_BW)), TierSpec("disk", 100, LinkSpec(1e8),
                                                                                  LinkSpec(1e8))],
                               LinkSpec(STORE_BW), 16, BLOCK_BYTES)
    a, b = TokenContent(list(range(64))), TokenContent(list(range(1000, 1064)))
    offload.store([(a.block_hashes(16, 4), 0)], 0.0)
    offload.store([(b.block_hashes(16, 4), 0)], 0.5)
    offload.advance(0.52)
    assert offload.lookup(a, 0, 4) == 0 and not offload.hit_pending(a, 0, 4)
    assert offload.hit_pending(b, 0, 4)
    offload.advance(0.55)
    assert offload.lookup(a, 0, 4) == 4 and not offload.hit_pending(a, 0, 4)
