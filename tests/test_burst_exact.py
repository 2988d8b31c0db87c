"""Decode bursts are exact: bursts on and off give the same requests, steps, routes and summary, bit for bit.

A burst books several pure-decode steps at once (`kvsim.sched.burst`, `kvsim.engine.runtime`); the
reference is the step-by-step run (`bursts=False`), which plans every step. The worlds are chosen to
hit every way a burst can go wrong: prompts over `max_model_len` (rejected on arrival, while other
replicas burst), a small pool (the queue's head blocked, arrivals joining behind it, preemptions),
conversations (prefix hits, affinity), an arrival rate near the fleet's capacity (routers reading
replicas mid-burst), and every router on fleets of 8 and 16 replicas. Each run also counts the
bursts and the cuts, so an equality that held because no burst ran would fail.
"""

import json

import pandas as pd
import pytest
from conftest import sized

import kvsim.engine.recorder
import kvsim.engine.runtime
from kvsim.engine.simulate import simulate
from kvsim.fleet.driver import simulate_fleet
from kvsim.workload.scenario import make_scenario

ROUTERS = ["round_robin", "least_outstanding", "least_kv", "affinity"]
# "v1-sync": vLLM v1 without its default async scheduling (each step planned when it starts)
ENGINES = {"v1": {"scheduler": "v1"}, "v1-sync": {"scheduler": "v1", "async_scheduling": False},
           "v0": {"scheduler": "v0"}, "static": {"scheduler": "static"}}


def world(replicas=None, router="round_robin", num_requests=2000, rate_per_replica=14.0, seed=11, latency=None,
          output_len=None, **engine):
    raw = {
        "name": "bursts", "model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": seed,
        "engine": {"max_model_len": 1024, "num_gpu_blocks_override": 110, "enable_prefix_caching": True, **engine},
        "workload": {"num_requests": num_requests,
                     "arrival": {"process": "poisson", "rate": rate_per_replica * (replicas or 1)},
                     "prompt_len": {"dist": "lognormal", "mean": 200, "p99": 1000},  # a few % rejected
                     "output_len": output_len or {"dist": "lognormal", "mean": 32, "p99": 200},
                     "multi_turn": {"turns": 3, "think_time_s": 0.5}},
        "latency": latency or {"model": "roofline"},
    }
    if replicas is not None:
        raw.update(replicas=replicas, router={"policy": router})
    return make_scenario(raw)


@pytest.fixture
def burst_counts(monkeypatch):
    """How many bursts ran, how many of them were waited for (the others were booked back to back, with
    nothing else due before they ended) and how many were cut by a request joining the queue."""
    counts = {"bursts": 0, "waited": 0, "cuts": 0}
    apply_burst, end_after = kvsim.engine.runtime.apply_burst, kvsim.engine.runtime.BurstInFlight.end_after
    begin_burst = kvsim.engine.runtime.BurstInFlight.__init__

    def counting_apply_burst(*args):
        counts["bursts"] += 1
        return apply_burst(*args)

    def counting_begin_burst(self, *args):
        counts["waited"] += 1
        begin_burst(self, *args)

    def counting_end_after(self, num_steps):
        counts["cuts"] += num_steps < len(self.ends_s)
        return end_after(self, num_steps)

    monkeypatch.setattr(kvsim.engine.runtime, "apply_burst", counting_apply_burst)
    monkeypatch.setattr(kvsim.engine.runtime.BurstInFlight, "__init__", counting_begin_burst)
    monkeypatch.setattr(kvsim.engine.runtime.BurstInFlight, "end_after", counting_end_after)
    return counts


def assert_same(a, b, tables):
    for name in tables:
        frames = [r.tables[name] if name in r.tables else getattr(r, name) for r in (a, b)]
        pd.testing.assert_frame_equal(*frames, check_exact=True)
    assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize(("replicas", "scheduler"), [(8, "v1"), (16, "v1"), (8, "v1-sync")])
def test_fleet_bursts_equal_step_by_step_bit_for_bit(replicas, scheduler, router, burst_counts):
    spec = world(replicas, router, num_requests=sized(1000, 8000) * replicas // 8, **ENGINES[scheduler])
    step_by_step = simulate_fleet(spec, bursts=False)
    assert burst_counts["bursts"] == 0
    bursts = simulate_fleet(spec)
    assert_same(bursts, step_by_step, ("requests", "steps", "routes"))
    s = step_by_step.summary
    assert s["num_rejected"] > 0 and s["num_preemptions"] > 0 and s["prefix_cache_hit_rate"] > 0
    assert burst_counts["bursts"] > 100 and burst_counts["cuts"] > 10 and burst_counts["waited"] > 100


@pytest.mark.parametrize("scheduler", ["v1", "v1-sync", "v0"])
def test_fleet_bursts_equal_step_by_step_when_steps_end_on_arrivals_and_evict_cached_blocks(scheduler, burst_counts):
    # Dyadic step times (1/16 s) and conversations whose next turn comes 0.5 s after the last one ended
    # put arrivals exactly on step ends (one timeout per step then); a 110-block pool makes decode steps
    # evict free cached blocks whose hashes a running sequence is about to register: step by step the
    # hash is registered (or not) before the eviction of a later step, so a burst must interleave its
    # block takes and hash registrations in (step, position) order (it once took all blocks first).
    spec = world(16, "affinity", num_requests=960, rate_per_replica=3.0, seed=2, **ENGINES[scheduler],
                 latency={"model": "constant", "step_s": 0.0625},
                 output_len={"dist": "lognormal", "mean": 40, "p99": 300})
    assert_same(simulate_fleet(spec), simulate_fleet(spec, bursts=False), ("requests", "steps", "routes"))
    assert burst_counts["bursts"] > 100


@pytest.mark.slow
def test_the_reported_fleet_divergence_is_gone():
    # The case that showed it (issue 19): 8 replicas of the default scenario at 160 req/s, where a
    # request rejected mid-burst was counted outstanding until the burst ended.
    from kvsim.workload.scenario import load_scenario

    spec = load_scenario(None, {"replicas": 8, "router.policy": "least_outstanding", "workload.arrival.rate": 160,
                                "workload.num_requests": sized(1800, 4000)})
    assert_same(simulate_fleet(spec), simulate_fleet(spec, bursts=False), ("requests", "steps", "routes"))


@pytest.mark.parametrize(("scheduler", "allocator"), [("v1", "paged"), ("v1-sync", "paged"), ("v0", "paged"),
                                                      ("static", "paged"), ("v1", "slab-pow2"), ("v0", "slab-max")])
def test_single_engine_bursts_equal_step_by_step_bit_for_bit(scheduler, allocator, burst_counts):
    spec = world(num_requests=sized(500, 3000), rate_per_replica=6.0, **ENGINES[scheduler], allocator=allocator,
                 **({} if allocator == "paged" else {"enable_prefix_caching": False, "num_gpu_blocks_override": 400}))
    step_by_step = simulate(spec, bursts=False)
    bursts = simulate(spec, check=True)
    assert_same(bursts, step_by_step, ("requests", "steps"))
    assert burst_counts["bursts"] > 50 and burst_counts["bursts"] - burst_counts["waited"] > 10


SPECULATING = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": 2}}


@pytest.mark.parametrize("fleet", ["least_kv", "half-speculating"])
def test_fleet_bursts_equal_step_by_step_across_chunks_of_rows(fleet, monkeypatch, tmp_path, burst_counts):
    # Each replica's rows go on in chunks of `CHUNK_ROWS` (32,768: a replica of a fleet this size never
    # reaches it); at 7, bursts straddle every replica's chunk boundaries, and the summaries' per-chunk
    # sums must group the same steps. Half the replicas speculating gives every replica the draft_rejected
    # column, which a burst's rows fill with 0 and a chunk's rest carries over. Streamed to steps.csv, the
    # rows are the in-memory table's `to_csv` text.
    monkeypatch.setattr(kvsim.engine.recorder, "CHUNK_ROWS", 7)
    if fleet == "least_kv":
        spec = world(8, "least_kv", num_requests=800)
    else:
        raw = world(2, num_requests=300, rate_per_replica=8.0).model_dump(mode="json")
        raw["replicas"] = [{"count": 2, "engine": {}}, {"count": 2, "engine": SPECULATING}]
        spec = make_scenario(raw)
    step_by_step = simulate_fleet(spec, bursts=False)
    bursts = simulate_fleet(spec)
    assert_same(bursts, step_by_step, ("requests", "steps", "routes"))
    assert burst_counts["bursts"] > 100 and len(bursts.steps) > 7 * 100
    streamed = simulate_fleet(spec, out_dir=tmp_path / "run", steps_format="csv")
    assert (tmp_path / "run" / "steps.csv").read_text() == step_by_step.steps.to_csv(index=False)
    assert json.dumps(streamed.summary, sort_keys=True) == json.dumps(step_by_step.summary, sort_keys=True)
