"""KV offload books over several engines (`kvsim.kv.offload_connector.combine_summaries`): a fleet's replicas and
a data-parallel group's ranks. A hand-made pair of summaries with the combined numbers worked out by hand, and
the identities a combined run must keep (bytes loaded = blocks hit x block bytes; a request's prefix hit =
its GPU hit + the tokens it loaded, summed over every engine)."""

import pytest

from kvsim.engine.simulate import simulate
from kvsim.fleet.driver import simulate_fleet
from kvsim.kv.offload_connector import combine_summaries
from kvsim.workload.scenario import make_scenario

BLOCK_BYTES = 16 * 131072  # Llama-3.1-8B, TP 1: 2 MiB a 16-token block


def tier(num_blocks, hits, load_bw, stored, busy, store_bw=4e8):
    return {"num_blocks": num_blocks, "bytes": num_blocks * 1000, "num_hit_blocks": hits, "num_hit_tokens": 16 * hits,
            "bytes_loaded": 1000 * hits, "num_stored_blocks": stored, "num_evicted_blocks": 1, "num_refused_stores": 0,
            "num_held_blocks_at_end": num_blocks, "bytes_stored": 1000 * stored, "load_bandwidth_bytes_per_s": load_bw,
            "store_bandwidth_bytes_per_s": store_bw, "store_link_busy_fraction": busy}


def engine(tiers, num_loads, load_s_mean, load_s_max, busy):
    hits = sum(t["num_hit_blocks"] for t in tiers.values())
    return {"tiers": tiers, "store_bandwidth_bytes_per_s": 4e8, "num_loads": num_loads, "bytes_loaded": 1000 * hits,
            "bytes_stored": tiers["cpu"]["bytes_stored"], "recompute_avoided_tokens": 16 * hits,
            "load_s_mean": load_s_mean, "load_s_max": load_s_max, "store_link_busy_fraction": busy}


def test_two_engines_books_combine_exactly():
    # A: a CPU tier only, run 1 s; B: CPU (a slower link) and disk, run 3 s
    a = engine({"cpu": tier(10, 3, 4e8, 7, 0.2)}, num_loads=2, load_s_mean=0.01, load_s_max=0.015, busy=0.2)
    b = engine({"cpu": tier(20, 5, 2e8, 9, 0.1), "disk": tier(50, 4, 1e8, 6, 0.5, store_bw=1e8)},
               num_loads=1, load_s_mean=0.04, load_s_max=0.04, busy=0.1)
    got = combine_summaries([a, b], [1.0, 3.0])
    cpu, disk = got["tiers"]["cpu"], got["tiers"]["disk"]
    assert (cpu["num_blocks"], cpu["num_hit_blocks"], cpu["num_hit_tokens"], cpu["bytes_stored"]) == (30, 8, 128, 16000)
    assert cpu["num_evicted_blocks"] == 2 and cpu["num_engines"] == 2
    assert cpu["load_bandwidth_bytes_per_s"] is None  # 4e8 and 2e8: no one figure
    assert cpu["store_bandwidth_bytes_per_s"] == 4e8  # shared
    assert cpu["store_link_busy_fraction"] == pytest.approx((0.2 * 1 + 0.1 * 3) / 4)  # 0.125: busy s / run s
    assert disk == {**tier(50, 4, 1e8, 6, 0.5, store_bw=1e8), "num_engines": 1}  # B's alone
    assert got["num_loads"] == 3 and got["num_engines"] == 2
    assert got["bytes_loaded"] == 1000 * (3 + 5 + 4) and got["recompute_avoided_tokens"] == 16 * 12
    assert got["load_s_mean"] == pytest.approx((2 * 0.01 + 1 * 0.04) / 3)  # 0.02: per load, not per engine
    assert got["load_s_max"] == 0.04
    assert got["store_link_busy_fraction"] == pytest.approx(0.125)


def multi_turn(**extra):
    """Conversations of 4 turns (1,000-token turns, 50 out, 5 s apart) on 800 GPU blocks per engine, a 4 GiB
    CPU tier (2,048 blocks) per engine: earlier turns fall out of the GPU and load from the CPU."""
    engine_config = {"max_model_len": 8192, "num_gpu_blocks_override": 800, "max_num_seqs": 16,
                     "kv_offload": {"cpu_bytes": "4GiB"}, **extra.pop("engine", {})}
    return make_scenario({"name": "mt", "model": "llama-3.1-8b", "gpu": "h200", "engine": engine_config,
                          "workload": {"num_requests": 80, "arrival": {"process": "poisson", "rate": 4.0},
                                       "prompt_len": {"dist": "fixed", "value": 1000},
                                       "output_len": {"dist": "fixed", "value": 50},
                                       "multi_turn": {"turns": 4, "think_time_s": 5.0}}, "seed": 3, **extra})


def check_books(result):
    offload = result.summary["kv_offload"]
    cpu = offload["tiers"]["cpu"]
    assert offload["num_engines"] == 2 and cpu["num_blocks"] == 2 * 2048
    assert cpu["num_hit_blocks"] > 0 and offload["num_loads"] > 0
    assert offload["bytes_loaded"] == cpu["bytes_loaded"] == cpu["num_hit_blocks"] * BLOCK_BYTES
    assert offload["recompute_avoided_tokens"] == cpu["num_hit_tokens"] == 16 * cpu["num_hit_blocks"]
    assert result.summary["num_preemptions"] == 0  # so every query is a first admission's
    assert result.requests["prefix_hit_tokens"].sum() == (result.summary["num_prefix_cache_hit_tokens"]
                                                          + offload["recompute_avoided_tokens"])


def test_a_data_parallel_group_reports_its_ranks_tiers():
    check_books(simulate(multi_turn(engine={"data_parallel_size": 2})))


def test_a_fleet_reports_its_replicas_tiers():
    result = simulate_fleet(multi_turn(replicas=2))
    check_books(result)
    per_replica = [r.summary["kv_offload"]["tiers"]["cpu"]["num_hit_blocks"] for r in result.replicas]
    assert result.summary["kv_offload"]["tiers"]["cpu"]["num_hit_blocks"] == sum(per_replica)
