"""A request that preempts itself and comes back to the same state loops forever: kvsim says so in one line
(`kvsim.sched.livelock`, `SchedulingLivelock`), as it says vLLM's held-KV deadlock, instead of running until
the clock's end (a reviewer's disaggregated world: 13,148 preemptions in 15 s of wall time, simulated time past
5,000 s). The check is exact: a world that preempts itself and then recovers runs as it did without it."""

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.engine.builder import build_engine
from kvsim.fleet.disagg import simulate_disagg
from kvsim.fleet.disagg_pools import Disaggregation
from kvsim.fleet.run import simulate_scenario
from kvsim.kv import PagedAllocator, TokenContent
from kvsim.kv.radix_cache import RadixCache
from kvsim.kv.radix_prefix_cache import RadixPrefixCache
from kvsim.kv.slab import SlabAllocator
from kvsim.model.errors import KvsimError, SchedulingLivelock
from kvsim.sched.livelock import SelfPreemptions
from kvsim.workload.scenario import make_scenario
from tests.test_disagg import scenario
from tests.test_hybrid_alloc import tiny

EAGLE_ALWAYS_REJECTED = {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rates": 0.0}


def fleet(tmp_path, policy, output_len=40, prefix_cache="hash_chain"):
    """1P1D (`tests.test_disagg.scenario`: 10 ms steps, a large prefill instance). Two requests at t = 0:
    request 0, a 48-token prompt asking `output_len` tokens, and request 1, 80 tokens asking 5. The decode
    instance: 10 blocks of 16 (9 usable, 144 slots), max_model_len 128, max_num_seqs 1, a 16-token budget, EAGLE
    K = 3 whose drafts are always rejected (each verify emits exactly one token: no randomness), its prefix cache
    `prefix_cache`."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 0, "input_length": n, "output_length": out, "hash_ids": [i]})
                            + "\n" for i, (n, out) in enumerate([(48, output_len), (80, 5)])))
    decode = {"num_gpu_blocks_override": 10, "max_model_len": 128, "max_num_seqs": 1, "max_num_batched_tokens": 16,
              "scheduling_policy": policy, "speculative_config": EAGLE_ALWAYS_REJECTED, "prefix_cache": prefix_cache}
    raw = scenario(num_requests=2, decode_engine=decode).model_dump(mode="json")
    raw["workload"] = {"num_requests": 2, "arrival": {"process": "trace"}, "prompt_len": None, "output_len": None,
                       "trace": {"format": "mooncake", "path": str(path)}}
    return make_scenario(raw)


class Endless(Exception):
    """Raised by `capped`: the run went past its simulated-time cap."""


def capped(cap_s):
    """A `progress` callback that stops a run past `cap_s` simulated seconds (it is called every 64 steps)."""
    def progress(now, done, total):
        if now > cap_s:
            raise Endless(f"{done} of {total} done at t={now:.2f}s")
    return progress


def without_the_check(monkeypatch):
    """The reference: the same simulator with the check taken out (it only reads state, or raises)."""
    monkeypatch.setattr(SelfPreemptions, "note_self_preemption", lambda self, req, num_slots, plan: None)


def assert_same_run(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert json.dumps(a.summary, sort_keys=True, default=str) == json.dumps(b.summary, sort_keys=True, default=str)


@pytest.mark.parametrize("prefix_cache", ["hash_chain", "radix"])
def test_a_request_that_recomputes_into_its_own_lookahead_forever_is_a_named_livelock(tmp_path, monkeypatch,
                                                                                      prefix_cache):
    # By hand. P prefills both prompts in one step and hands both off at 10 ms; D reserves 3 + 5 blocks of its 9.
    # Request 0 (first in priority order: same priority, its transfer ends first) is admitted holding 47 computed
    # tokens and asks 47 + 1 + 3 = 51 slots (vLLM asks the lookahead of a request with computed tokens): 4 blocks,
    # the free one taken. Each verify asks computed + 1 + 3 drafts + 3 lookahead slots and emits 1 token: at 58
    # computed (59 tokens) it asks 65 > 64 and preempts itself (nothing else runs), freeing its 4 blocks.
    # Admitted again (its 59 tokens fit the 64 free slots; no lookahead is asked of a request with nothing
    # computed), its last prefill chunk asks 59 + 3 = 62 slots and samples (60 tokens), its verify asks 59 + 7 =
    # 66 > 64: preempted again; 60 -> 61 -> 62 tokens the same way (63 and 64 slots fit). With 62 tokens its last
    # prefill chunk asks 62 + 3 = 65 slots, 5 blocks (80 slots), 4 free (64): it preempts itself before sampling,
    # in the same state each time, and request 1 (behind it in priority order, max_num_seqs 1) is never admitted.
    # The slots asked and free do not depend on the prefix cache: SGLang's radix tree (`prefix_cache: radix`) gives
    # the same line. Its cache said no state (`state_key` None), so the check never fired there and the run went on
    # until the clock's end (`kvsim run` still looping after 60 s of wall time, 630 s simulated).
    with pytest.raises(SchedulingLivelock) as livelock:  # capped: a missed livelock fails, it does not hang
        simulate_disagg(fleet(tmp_path, "priority", prefix_cache=prefix_cache), check=True, progress=capped(10.0))
    assert str(livelock.value) == (
        "engine.scheduling_policy=priority: request 0 preempts itself forever: it needs 80 KV slots for its 62 "
        "tokens and the 3 slots of its speculative lookahead, 64 of the KV cache's 144 are free and requests [1] "
        "waiting behind it hold the KV they loaded from a prefill instance (kv_transfer_config); admitted again, it "
        "recomputes and preempts itself again with nothing changed, as vLLM's scheduler would loop: give the KV "
        "cache more blocks (engine.num_gpu_blocks_override, engine.gpu_memory_utilization)")
    # Without the check the same world is still running after 10 s of simulated time, where it would have ended in
    # under 1 s (2 requests, 40 + 5 tokens in 10 ms steps, a few recomputes of at most 4 chunks each).
    without_the_check(monkeypatch)
    with pytest.raises(Endless):
        simulate_disagg(fleet(tmp_path, "priority", prefix_cache=prefix_cache), progress=capped(10.0))


@pytest.mark.parametrize(("policy", "output_len", "num_preemptions"), [
    # FCFS: after request 0 preempts itself (at 59 tokens, as above), vLLM's skipped queue (`loaded_first`) admits
    # request 1 first: it asks 79 + 1 + 3 = 83 slots, 6 blocks; it holds 5 and 4 are free: it runs and finishes;
    # request 0 then recomputes in an empty pool and finishes. One preemption.
    ("fcfs", 40, 1),
    # priority, request 0 asking 13 tokens (the world of the test above): preempted at 59 tokens (11 out), at 60
    # (12 out), then its recompute samples its 13th token and it finishes; request 1 runs after it. Two
    # preemptions, each by itself, with a token sampled between them.
    ("priority", 13, 2),
])
@pytest.mark.parametrize("prefix_cache", ["hash_chain", "radix"])
def test_a_request_that_preempts_itself_and_recovers_runs_as_without_the_check(tmp_path, monkeypatch, policy,
                                                                              output_len, num_preemptions,
                                                                              prefix_cache):
    checked = simulate_disagg(fleet(tmp_path, policy, output_len, prefix_cache), check=True)
    assert set(checked.requests.status) == {"finished"}
    assert checked.summary["num_preemptions"] == num_preemptions
    without_the_check(monkeypatch)
    assert_same_run(checked, simulate_disagg(fleet(tmp_path, policy, output_len, prefix_cache), check=True))


@st.composite
def small_worlds(draw):
    """Small worlds that preempt: disaggregated or not, FCFS or priority classes, EAGLE or a draft model or none,
    a KV pool of 1 to 2 requests at max_model_len, at most 8 requests."""
    mml = draw(st.sampled_from([64, 128]))
    engine = {"max_model_len": mml, "num_gpu_blocks_override": draw(st.integers(mml // 16 + 1, mml // 8 + 3)),
              "max_num_seqs": draw(st.sampled_from([1, 2, 4])), "max_num_batched_tokens": draw(st.sampled_from([16, 32])),
              "enable_prefix_caching": draw(st.booleans()), "scheduling_policy": draw(st.sampled_from(["fcfs", "priority"])),
              "async_scheduling": draw(st.booleans())}
    method = draw(st.sampled_from(["eagle", "draft_model", None]))
    if method is not None:
        engine["speculative_config"] = {"method": method, "num_speculative_tokens": draw(st.integers(1, 4)),
                                        "acceptance_rates": draw(st.sampled_from([0.0, 0.5, 1.0]))}
        if method == "draft_model":
            engine["speculative_config"]["model"] = "llama-3.1-8b"
    workload = {"num_requests": draw(st.integers(2, 8)), "arrival": {"process": "poisson", "rate": 1e4},
                "prompt_len": {"dist": "uniform", "low": 1, "high": mml + 8},
                "output_len": {"dist": "uniform", "low": 1, "high": mml // 2}}
    if draw(st.booleans()):
        workload["priority"] = {"classes": [{"name": "hi", "priority": 0, "weight": 1},
                                            {"name": "lo", "priority": 1, "weight": 2}]}
    raw = {"name": "w", "model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": draw(st.integers(0, 5)),
           "engine": engine, "workload": workload, "latency": {"model": "constant", "step_s": 0.01}, "steps": "none"}
    if draw(st.booleans()):
        raw["kv_transfer_config"] = {"kv_link": "rdma"}
        raw["replicas"] = [{"count": draw(st.integers(1, 2)), "kv_role": "kv_producer"},
                           {"count": 1, "kv_role": "kv_consumer", "engine": {"max_num_seqs": draw(st.integers(1, 2))}}]
    return raw


@settings(max_examples=15, deadline=None)
@given(small_worlds())
def test_every_small_world_ends_or_says_why_in_one_line(raw):
    # Each of these runs ends in well under 60 simulated seconds (8 requests of at most 136 tokens, 10 ms steps,
    # a few recomputes each), or never: the cap tells a run that would loop until the clock's end.
    try:
        scenario = make_scenario(raw)
        result = simulate_scenario(scenario, check=True, progress=capped(60.0))
    except KvsimError as error:  # a refusal, a held-KV stall or a livelock: one line, exit 2 from the CLI
        assert "\n" not in str(error)
        return
    assert result.summary["num_finished"] + result.summary["num_rejected"] == raw["workload"]["num_requests"]


@pytest.mark.parametrize("make", [lambda: PagedAllocator(num_blocks=11, block_size=16, enable_caching=True),
                                  lambda: PagedAllocator(num_blocks=11, block_size=16, enable_caching=True,
                                                         prefix_cache=RadixPrefixCache(11, 16)),
                                  lambda: tiny(enable_caching=True)], ids=["paged", "radix", "hybrid"])
def test_an_allocator_state_key_follows_every_change_and_comes_back_with_the_state(make):
    # The livelock check is exact only if equal keys mean equal allocators: a key must change with a table, a
    # fill or the free queue's order, and be equal for the same state reached again.
    alloc, content = make(), TokenContent(list(range(40)))
    empty = alloc.state_key()
    assert alloc.allocate(1, 21, 40, content) is not None
    grown = alloc.state_key()
    assert grown != empty
    assert alloc.allocate(1, 22, 40, content) is not None  # the same blocks (of 16, of 4), one more token written
    assert alloc.state_key() not in (empty, grown)
    alloc.free(1)
    freed = alloc.state_key()
    assert freed != empty  # the freed blocks went to the queue's other end, their fill kept
    twin = make()
    assert twin.allocate(1, 21, 40, content) is not None and twin.allocate(1, 22, 40, content) is not None
    twin.free(1)
    assert twin.state_key() == freed  # the same calls, the same state: equal keys


def test_allocators_that_cannot_say_their_state_never_fire():
    assert SlabAllocator(num_slots=64, max_model_len=32, policy="max").state_key() is None


def test_a_radix_tree_key_keeps_the_access_order_of_locked_nodes_and_drops_the_clock():
    # Two pages in SGLang's tree (page size 1), both locked (in use), the same nodes and locks, one of them matched
    # again since: no free queue holds them, yet which one is evicted first once both are unlocked is the one not
    # matched (least recently used). Trees that differ only in which was matched must differ; the same calls on a
    # tree whose clock and node ids are further on (another page inserted and evicted first) must not, and must
    # evict alike.
    def tree(matched, warm_up=False):
        radix = RadixCache(1)
        if warm_up:
            radix.insert(["w"], [9])
            assert radix.evict(1) == [9]
        for key, value in (("a", 1), ("b", 2)):
            radix.insert([key], [value])
            radix.inc_lock_ref(radix.where(value)[0])
        radix.match_prefix([matched])
        return radix

    def evicted_first(radix):
        for value in (1, 2):
            radix.dec_lock_ref(radix.where(value)[0])
        return radix.evict(1)

    a, b, warm = tree("a"), tree("b"), tree("a", warm_up=True)
    assert a.state_key() != b.state_key() and warm.state_key() == a.state_key()
    assert (warm._clock, warm._next_id) != (a._clock, a._next_id)
    assert evicted_first(a) == evicted_first(warm) == [2] and evicted_first(b) == [1]


def test_kvsim_run_says_the_livelock_in_one_line_exits_2_and_writes_nothing(tmp_path):
    scenario_path = tmp_path / "livelock.json"
    raw = fleet(tmp_path, "priority").model_dump(mode="json")
    scenario_path.write_text(json.dumps(raw))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(scenario_path), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("kvsim: error: engine.scheduling_policy=priority: request 0 preempts itself "
                                    "forever: it needs 80 KV slots")
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_decode_instance_is_not_told_nothing_can_reach_it_while_a_transfer_to_another_is_in_flight(monkeypatch):
    # 1P2D (`tests.test_disagg.scenario`: 10 ms steps, transfers of 15.68 ms, round robin). Request 0 arrives at
    # t = 0, is prefilled in [0, 10 ms] and goes to D0 (transfer [10, 25.68 ms]); request 1 arrives at 5 ms, is
    # prefilled in [10, 20 ms] and goes to D1 (transfer [20, 35.68 ms]). From 20 ms P is idle, keeping request 1's
    # KV until that transfer ends, and every request has arrived; D0 steps from 25.68 ms. When D1's transfer ends,
    # P frees those blocks, and a P whose queue waited for them would prefill a request and could hand it to D0:
    # while it is in flight D0's livelock check must not be told that nothing can reach D0 (None, never fires).
    observed = []
    reserve_on = Disaggregation._reserve_on

    def reserve_and_look(self, k):
        reserve, upstream = reserve_on(self, k), self._upstream_state(k)

        def at_boundary(now):
            reserve(now)
            observed.append((k, bool(self.in_flight[1 - k]), upstream()))
        return at_boundary
    monkeypatch.setattr(Disaggregation, "_reserve_on", reserve_and_look)
    result = simulate_disagg(scenario(num_decode=2, num_requests=2, rate=200.0), check=True)
    assert set(result.requests.status) == {"finished"}
    assert list(result.tables["transfers"].start_s) == pytest.approx([0.010, 0.020])
    assert any(k == 0 and other for k, other, _ in observed)  # D0 stepped while D1's transfer was in flight
    assert all(state is None for _, other, state in observed if other)
    assert any(state is not None for _, _, state in observed)  # once nothing is in flight, it says the state


def test_an_idle_scheduler_whose_head_waits_for_an_offload_store_does_not_say_its_state():
    # A disaggregated decode instance's check reads its prefill instances' `idle_state`. An idle prefill instance
    # whose head waits for a CPU-tier store in flight (`OffloadConnector.await_stores`) is woken when it ends, and
    # may then admit its head and hand it off: None then. With nothing in flight that wakes it, it says its state.
    raw = {"name": "p", "model": "llama-3.1-8b", "gpu": "h100-80gb",
           "engine": {"max_model_len": 2048, "kv_offload": {"num_cpu_blocks": 300}},
           "workload": {"num_requests": 1, "prompt_len": {"dist": "fixed", "value": 100},
                        "output_len": {"dist": "fixed", "value": 5}}}
    scheduler = build_engine(make_scenario(raw), np.random.default_rng(0)).scheduler
    assert scheduler.offload is not None and scheduler.idle_state() is not None
    scheduler.offload.awaiting_stores = True  # what `await_stores` sets
    assert scheduler.awaits_transfers and scheduler.idle_state() is None
