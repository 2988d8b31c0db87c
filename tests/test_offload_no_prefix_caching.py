"""KV offload with GPU prefix caching off, as `vllm serve --no-enable-prefix-caching` runs with an offloading
connector (LMCache's examples, vLLM's OffloadingConnector): vLLM hashes every request's full blocks whenever a
KV connector is set (`request_block_hasher`, vllm/v1/engine/core.py), so the connector stores them and finds
them (`get_num_new_matched_tokens`), while the GPU pool hits nothing (`KVCacheManager.get_computed_blocks`
returns no block without caching) and keeps nothing (`cache_blocks` does nothing); two requests loading the
same blocks each load them (the connector's `_blocks_being_loaded` is None without caching).

Tiny world of `tests/test_offload_connector.py`: a GPU pool of 8 usable blocks of 16 tokens, a CPU tier of
100 blocks of 1,000,000 B each, the GPU<->CPU link 4e8 B/s each way (a block takes 2.5 ms), a step 10 ms, a
16-token budget. A (64 tokens, 4 full blocks, 1 output token) at 0 s; B = A's 64 tokens + 16 others at 1 s,
long after A finished and its 4 blocks were stored (one block a step, 2.5 ms each).
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.engine.loop import run_engine
from kvsim.engine.simulate import simulate
from kvsim.kv import PagedAllocator
from kvsim.latency.base import ConstantLatency
from kvsim.sched import SchedulerLimits, make_scheduler
from kvsim.workload.scenario import make_scenario
from tests.test_offload_connector import BLOCK_BYTES, BLOCK_S, STEP_S, connector, req

A = list(range(64))
B = A + list(range(5000, 5016))


class NothingCached(PagedAllocator):
    """A pool whose every invariant check (each step of a `check=True` run) also looks into its prefix cache
    directly: with caching off no block is ever keyed, held or free."""

    num_checks = 0

    def check_invariants(self) -> None:
        super().check_invariants()
        cache = self.prefix_cache
        assert not cache.cached and not len(cache.evictable), "a cached block in a pool without prefix caching"
        assert all(h is None for h in cache.block_hashes), "a hashed block in a pool without prefix caching"
        self.num_checks += 1


def run(requests, offload, caching, num_blocks=9, budget=16):
    alloc = (PagedAllocator if caching else NothingCached)(num_blocks, 16, enable_caching=caching)
    scheduler = make_scheduler("v1", alloc, SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=budget,
                                                            max_model_len=1024))
    scheduler.offload = offload
    run_engine(scheduler, ConstantLatency(STEP_S), requests, check=True)
    return scheduler, scheduler.records.columns()


def test_with_prefix_caching_the_second_request_hits_the_gpu_and_loads_nothing():
    scheduler, rows = run([req(0, 0.0, A), req(1, 1.0, B)], connector(), caching=True)
    assert rows["ttft_s"][1] == pytest.approx(STEP_S, rel=1e-12)  # 4 blocks hit, its 16 new tokens: one step
    assert rows["prefix_hit_tokens"][1] == 64
    summary = scheduler.offload.summary(2.0, end_s=2.0)
    assert summary["num_loads"] == 0 and summary["bytes_loaded"] == 0
    assert summary["bytes_stored"] == 5 * BLOCK_BYTES  # A's 4 blocks, B's fifth (its first 4 offered, held: skipped)
    assert (scheduler.prefix_stats.num_query_tokens, scheduler.prefix_stats.num_hit_tokens) == (64 + 80, 64)


def test_without_prefix_caching_the_second_request_loads_the_prefix_from_the_cpu_tier():
    """B misses the GPU (nothing is cached there) and asks the tier for its 80 // 16 = 5 full blocks: it holds
    A's 4. B waits while 4 · 1,000,000 B cross the idle 4e8 B/s link (4 · 2.5 ms = 10 ms), then one step
    computes its 16 other tokens: TTFT 20 ms against 10 ms with caching (a GPU hit) and 50 ms without a tier."""
    scheduler, rows = run([req(0, 0.0, A), req(1, 1.0, B)], connector(), caching=False)
    assert rows["queue_s"][1] == pytest.approx(4 * BLOCK_S, rel=1e-12)
    assert rows["ttft_s"][1] == pytest.approx(4 * BLOCK_S + STEP_S, rel=1e-12)
    assert rows["prefix_hit_tokens"][1] == 64
    summary = scheduler.offload.summary(2.0, end_s=2.0)
    assert summary["num_loads"] == 1 and summary["tiers"]["cpu"]["num_hit_blocks"] == 4
    assert summary["bytes_loaded"] == 4 * BLOCK_BYTES and summary["recompute_avoided_tokens"] == 64
    assert summary["load_s_mean"] == pytest.approx(4 * BLOCK_S, rel=1e-12)
    # the same stores as with caching: A's 4 full blocks, then B's fifth (its first 4 are held already)
    assert summary["bytes_stored"] == 5 * BLOCK_BYTES
    # vLLM's KVCacheManager counts no prefix-cache query without caching, and nothing stays cached on the GPU
    assert (scheduler.prefix_stats.num_query_tokens, scheduler.prefix_stats.num_hit_tokens) == (0, 0)
    assert scheduler.alloc.num_checks > 0


def test_without_prefix_caching_or_a_tier_nothing_is_reused():
    scheduler, rows = run([req(0, 0.0, A), req(1, 1.0, B)], None, caching=False)
    assert rows["ttft_s"][1] == pytest.approx(5 * STEP_S, rel=1e-12)  # 80 tokens at 16 a step
    assert rows["prefix_hit_tokens"][1] == 0
    assert scheduler.prefix_stats.num_query_tokens == 0


def test_without_prefix_caching_two_requests_load_the_same_blocks_twice():
    """B1 and B2 (A's 64 tokens + 16 own each) arrive together: with caching off vLLM does not delay one for
    the other's load (`_blocks_being_loaded` is None), so both load A's 4 blocks, sharing the link: 8 blocks at
    4e8 B/s end both loads at 8 · 2.5 ms = 20 ms; one step (64-token budget) then computes both 16-token tails."""
    b1, b2 = A + list(range(5000, 5016)), A + list(range(6000, 6016))
    scheduler, rows = run([req(0, 0.0, A), req(1, 1.0, b1), req(2, 1.0, b2)], connector(), caching=False,
                          num_blocks=17, budget=64)
    for i in (1, 2):
        assert rows["ttft_s"][i] == pytest.approx(8 * BLOCK_S + STEP_S, rel=1e-12)
        assert rows["prefix_hit_tokens"][i] == 64
    summary = scheduler.offload.summary(2.0, end_s=2.0)
    assert summary["num_loads"] == 2 and summary["bytes_loaded"] == 8 * BLOCK_BYTES


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 30), st.integers(1, 30), st.integers(0, 30)),
                min_size=1, max_size=8),
       st.integers(4, 40))
def test_without_prefix_caching_the_gpu_pool_never_holds_a_cached_block(specs, num_cpu_blocks):
    """Requests over 3 shared prefixes of 32..64 tokens (own tails, outputs, arrivals in tenths of a second) on
    8 usable GPU blocks (a request takes at most 124 tokens: 8 blocks), so requests are preempted, and a CPU
    tier that evicts: at every step the books balance and the GPU pool holds no
    cached block; every request finishes, and no prefix-cache query is counted."""
    prefixes = [list(range(p * 1000, p * 1000 + 32 + 16 * p)) for p in range(3)]
    requests = [req(i, arrival / 10, prefixes[p] + list(range(10**6 + 100 * i, 10**6 + 100 * i + tail)), out)
                for i, (p, tail, out, arrival) in enumerate(specs)]
    requests.sort(key=lambda r: r.arrival_s)
    scheduler, rows = run(requests, connector(num_cpu_blocks), caching=False, budget=32)
    assert (rows["status"] == "finished").all()
    assert scheduler.prefix_stats.num_query_tokens == 0
    assert scheduler.alloc.num_checks > 0


def _chats(engine: dict, *, num_requests: int, rate: float, turns: int, think_time_s: float, seed: int):
    """Llama-3.1-8B on an H200 serving multi-turn chats of 500-token prompts and 20-token replies."""
    return make_scenario({
        "name": "chats", "model": "llama-3.1-8b", "gpu": "h200", "engine": engine,
        "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": rate},
                     "prompt_len": {"dist": "fixed", "value": 500}, "output_len": {"dist": "fixed", "value": 20},
                     "multi_turn": {"turns": turns, "think_time_s": think_time_s}},
        "seed": seed})


def test_a_scenario_with_an_offload_tier_and_prefix_caching_off_runs_and_loads():
    """The engine refused `kv_offload` without prefix caching ("kv_offload needs enable_prefix_caching=True");
    vLLM runs it. 4-turn conversations on a GPU pool too small to matter: each turn reloads its conversation's
    earlier prompt blocks from the CPU tier, and the GPU prefix-cache counters stay at 0."""
    engine = {"max_model_len": 4096, "num_gpu_blocks_override": 600, "max_num_seqs": 8,
              "enable_prefix_caching": False, "kv_offload": {"cpu_bytes": "2GiB"}}
    result = simulate(_chats(engine, num_requests=16, rate=4.0, turns=4, think_time_s=2.0, seed=3), check=True)
    offload = result.summary["kv_offload"]
    assert offload["num_loads"] > 0 and offload["recompute_avoided_tokens"] > 0
    assert result.summary["num_prefix_cache_query_tokens"] == 0
    assert result.requests["prefix_hit_tokens"].sum() <= offload["recompute_avoided_tokens"]


@pytest.mark.parametrize("tier", [True, False])
def test_the_run_table_says_what_the_tier_served_where_the_prefix_cache_hit_rate_says_0(tier):
    """One conversation of 2 turns (500-token prompts, 20-token replies, 30 s apart), caching off: turn 2's prompt
    is 500 + 20 + 500 = 1,020 tokens, of which the tier holds turn 1's 500 // 16 = 31 full prompt blocks (the
    reply is not stored: offload_prompt_only): 1 load of 31 · 16 = 496 tokens; stored: 31 blocks, then turn 2's
    1,020 // 16 = 63 less the 31 held, 63 blocks of 2 MiB (Llama-3.1-8B: 32 layers · 8 KV heads · 128 · 2 · 2 B
    a token, 16 tokens) = 0.12 GiB. `kvsim run`'s table showed a prefix-cache hit rate of 0.0% and nothing else."""
    from rich.console import Console

    from kvsim.results.render import summary_table

    engine = {"max_model_len": 4096, "num_gpu_blocks_override": 600, "enable_prefix_caching": False,
              **({"kv_offload": {"cpu_bytes": "1GiB"}} if tier else {})}
    console = Console(width=300, record=True)
    console.print(summary_table(simulate(_chats(engine, num_requests=2, rate=1.0, turns=2, think_time_s=30.0,
                                                seed=0)).summary))
    text = console.export_text()
    assert "prefix cache hit rate        │ 0.0%" in text
    row = "1 load, 496 prompt tokens loaded instead of computed; 0.12 GiB stored"
    assert (row in text) == tier and ("KV offload" in text) == tier


def test_plan_sizes_a_tier_for_an_engine_with_prefix_caching_off_as_run_runs_it():
    """`kvsim plan --offload-size` refused caching off ("sizing an offload tier needs ... enable_prefix_caching
    on") though `kvsim run` runs such a tier. The 2-turn conversation of the table test above, sized with a
    1 GiB tier: its point holds what the run does, by hand (1 load of 31 blocks = 496 tokens; 63 blocks of 2 MiB
    stored), the no-tier point nothing; the hit-rate columns are empty (no prefix-cache query is counted with
    caching off), not 0, and a hit-rate target is refused in one line naming it."""
    from kvsim.model.errors import KvsimError
    from kvsim.planning.offload_sizing import size_offload

    base = _chats({"max_model_len": 4096, "num_gpu_blocks_override": 600, "enable_prefix_caching": False},
                  num_requests=2, rate=1.0, turns=2, think_time_s=30.0, seed=0)
    sizing = size_offload(base, [2**30], ttft_slo_s=10.0, prefix_lens=(1024,), workers=1)
    points = sizing.points.set_index("cpu_bytes")
    assert list(points.index) == [0, 2**30]
    assert (points.loc[2**30, "num_loads"], points.loc[2**30, "recompute_avoided_tokens"]) == (1, 31 * 16)
    assert points.loc[2**30, "bytes_stored"] == 63 * 16 * 131072
    assert (points.loc[0, "num_loads"], points.loc[0, "recompute_avoided_tokens"]) == (0, 0)
    assert points[["gpu_hit_rate", "hit_rate_all_tiers"]].isna().all(axis=None)
    assert sizing.size_for_ttft_bytes == 0
    with pytest.raises(KvsimError, match=r"^target_hit_rate=0.5: an engine with enable_prefix_caching off counts "):
        size_offload(base, [2**30], target_hit_rate=0.5, workers=1)


@pytest.mark.parametrize(("replicas", "row"), [
    (2, "KV offload: 2 loads, 992 prompt tokens loaded instead of computed; 0.25 GiB stored"),
    (9, "KV offload: 0 loads, 0 prompt tokens loaded instead of computed; 0.37 GiB stored"),
    (None, None),
])
def test_the_fleet_table_says_what_the_replicas_tiers_served(replicas, row):
    """`kvsim run` on a fleet printed nothing of its replicas' tiers (one engine's table has a `KV offload` row).
    Two conversations as in the test above (A, then B, each 2 turns 30 s apart), round-robin: arrivals A1, B1, A2,
    B2. On 2 replicas A's turns both reach replica 0 and B's replica 1: each as the one engine above, 1 load of
    496 tokens and 63 blocks stored, so 2 loads, 992 tokens, 126 blocks of 2 MiB = 0.25 GiB. On 9 (past
    FLEET_ROWS_SHOWN: the spread table) A2 and B2 reach replicas 2 and 3, whose tiers hold nothing: no load;
    stored 31 + 31 + 63 + 63 = 188 blocks = 0.37 GiB. Without a tier, no line."""
    from rich.console import Console

    from kvsim.fleet.driver import simulate_fleet
    from kvsim.results.render import fleet_table

    engine = {"max_model_len": 4096, "num_gpu_blocks_override": 600, "enable_prefix_caching": False,
              **({"kv_offload": {"cpu_bytes": "1GiB"}} if replicas else {})}
    scenario = _chats(engine, num_requests=4, rate=1.0, turns=2, think_time_s=30.0, seed=0)
    scenario = scenario.model_copy(update={"replicas": replicas or 2})
    console = Console(width=300, record=True)
    console.print(fleet_table(simulate_fleet(scenario).summary))
    text = " ".join(console.export_text().split())  # the caption wraps at the table's width
    assert (row in text) if row else ("KV offload" not in text)
