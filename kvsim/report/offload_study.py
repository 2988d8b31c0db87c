"""The report's offload section: how much CPU memory a KV offload tier needs for the Mooncake trace, the
load from which it pays, and where loading is slower than recomputing (`kvsim.planning.offload_sizing`).

Traffic: the fleet section's (`kvsim.report.fleet_study.traffic`: the shipped Mooncake conversation slice,
its real arrivals and 512-token prefix `hash_ids`), its first `StudyConfig.offload_requests` requests on
one replica of the report's engine, its allocator and prefix caching as the user gave them (the fleet section
turns caching on; a tier is sized for the engine the user runs). CPU tier sizes: 0, 1, 4 and 16 times the
replica's GPU KV pool (those that fit in a DGX node's host memory), each at `StudyConfig.offload_loads` × the
trace's rate. The hit-rate target is 90 % of what an unbounded cache would hit on the slice (read from the
trace): a tier cannot serve reuse the trace does not have. An engine with prefix caching off counts no
prefix-cache query (as vLLM counts none), so it has no hit rate and no hit-rate target: it is sized by TTFT
alone, as `kvsim plan --offload-size` sizes it, and the section says so. The TTFT target is the report's SLO
on TTFT p90.

An engine that cannot take a CPU tier (kvsim, as vLLM, puts one only beside the v1 scheduler's paged
hash-chain block pool, its prefix caching on or off) gets the section skipped with its refusal
(`kvsim.report.applicable`), not run. So does a slice whose every prompt this engine refuses (max_model_len or
longer, as vLLM refuses it): no request would be served at any tier size, no TTFT to compare, nothing to size.
"""

from __future__ import annotations

from kvsim.model.offload_config import DGX_HOST_MEMORY_BYTES
from kvsim.planning.offload_sizing import size_offload
from kvsim.planning.offload_sizing import variant as with_tier
from kvsim.report.applicable import inapplicable, refusal, skipped
from kvsim.report.fleet_study import TRACE, traffic, unbounded_hit_rate
from kvsim.report.section import Section
from kvsim.report.studies import Study, variant
from kvsim.workload.traces import read_mooncake

POOL_MULTIPLES = (1, 4, 16)  # CPU tier sizes tried, in GPU KV pools
REACHABLE_SHARE = 0.9  # the hit-rate target: this share of the unbounded cache's hit rate
TITLE = "How much KV offload (CPU tier) for this traffic (Mooncake trace)"
SETTING = "a CPU KV offload tier (`engine.kv_offload`)"


def gpu_pool_bytes(st: Study) -> int:
    """The replica's GPU KV pool that sequences can hold, in bytes (the unit of the CPU tier sizes): its blocks
    less the null block a paged pool keeps back (vLLM v1's block 0; v0's block manager keeps none, though a v0
    engine is refused a tier and never sized here: `EngineConfig.num_null_blocks`)."""
    return (st.num_blocks - st.paged_null_blocks) * st.kv_layout.bytes_per_block


def offload_sizing(st: Study) -> Section:
    """The sizing grid on the Mooncake slice and its answers (module docstring)."""
    caching = st.base.engine.enable_prefix_caching
    base = variant(traffic(st), f"workload.num_requests={st.cfg.offload_requests}",
                   f"engine.allocator={st.base.engine.allocator}",
                   f"engine.enable_prefix_caching={str(caching).lower()}")
    pool_bytes = gpu_pool_bytes(st)
    sizes = [m * pool_bytes for m in POOL_MULTIPLES if m * pool_bytes <= DGX_HOST_MEMORY_BYTES]
    reason = refusal(lambda: with_tier(base, sizes[0])) if sizes else None
    if reason is not None:
        return skipped("offload", TITLE, SETTING, reason)
    records = read_mooncake(base.resolve_path(TRACE, "workload.trace.path"))[: st.cfg.offload_requests]
    max_model_len = base.engine.resolved_max_model_len(st.model)
    if all(record.prompt_len >= max_model_len for record in records):
        return inapplicable("offload", TITLE, f"every one of the first {len(records)} Mooncake requests has a "
                            f"prompt of max_model_len ({max_model_len:,} tokens) or more, which this engine refuses "
                            "(as vLLM does): no request would be served with or without a tier, so no tier is sized.")
    unbounded = unbounded_hit_rate(records, max_model_len)
    num_runs = (len(sizes) + 1) * len(set(st.cfg.offload_loads) | {1.0})
    st.count_runs(num_runs, 0)
    sizing = size_offload(base, sizes, st.cfg.offload_loads, target_hit_rate=REACHABLE_SHARE * unbounded if caching
                          else None,
                          ttft_slo_s=st.cfg.ttft_slo_s, workers=st.cfg.workers, dask_address=st.cfg.dask_address)
    st.count_runs(0, num_runs)
    facts = {**sizing.facts, "size_for_hit_rate_bytes": sizing.size_for_hit_rate_bytes,
             "size_for_ttft_bytes": sizing.size_for_ttft_bytes, "pays_from_load": sizing.pays_from_load,
             "unbounded_hit_rate": unbounded, "num_requests": st.cfg.offload_requests, "pool_bytes": pool_bytes}
    return Section("offload", TITLE, {"offload_points": sizing.points, "offload_pays": sizing.pays,
                                      "offload_hurts": sizing.hurts}, facts)

