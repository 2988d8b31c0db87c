"""The report's fleet section: how many GPUs for a real trace, and what the router changes.

Traffic: the first `StudyConfig.fleet_requests` requests of a production trace shipped in `kvsim/workload/data`,
the first of `kvsim.report.fleet_traffic.TRACES` the engine can serve (the Mooncake FAST'25 conversation slice,
whose 512-token prefix `hash_ids` give the routers real reuse to compete for; else the Azure conversation trace,
lengths and arrivals alone), served by replicas of the report's model, GPU, TP and engine settings with prefix
caching on and the user's `max_model_len` (which one replica's pool holds: vLLM, and `Study`, refuse an engine
whose pool cannot hold one request of it; a longer prompt is refused, as vLLM refuses it, and counted). When
more than half of every trace's slice is refused, the section says so and sizes nothing.

Three measurements, all ordinary simulations:

1. the *floor*: the same requests one at a time on one replica (arrivals `FLOOR_GAP_S` apart),
   so TTFT is prefill alone, with the warmest cache one replica can keep: no fleet size beats
   its p90;
2. the replicas each router needs for TTFT p90 within the report's SLO (`kvsim.planning.plan.plan`:
   doubling, then bisection; probes too short to judge doubled up to `fleet_max_probe_requests`, the answer
   re-run `fleet_verify_factor` × as long: `--quick` caps the probes at its 60 requests and re-runs nothing,
   and the words say so), or within the floor plus the SLO when the floor alone exceeds it;
3. every router at one fleet size (the fewest replicas least-outstanding routing needs):
   prefix-cache hit rate, TTFT p50/p90, queue p90, prompt tokens computed, load spread.

A trace without prompt content (Azure's) has no prefix a router could follow: affinity routing is not run (it
would route as least outstanding does, on no evidence), and no hit rate is compared.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.model.errors import KvsimError, expect_count, shown
from kvsim.planning.cost import gpu_price
from kvsim.planning.plan import Candidate, make_plan_spec, plan
from kvsim.planning.spec import PlanSpec
from kvsim.planning.window import TOO_SHORT
from kvsim.report.fleet_traffic import MOONCAKE, FleetTrace, TraceTried, choose
from kvsim.report.section import Section
from kvsim.report.studies import Study, variant
from kvsim.report.study_config import StudyConfig
from kvsim.workload.scenario import Scenario
from kvsim.workload.traces import TraceRecord

TRACE = MOONCAKE.path  # the offload section's traffic
ROUTERS = ("round_robin", "least_outstanding", "affinity")
LOAD_ROUTERS = ROUTERS[:2]  # for a trace without prompt content: affinity has no prefix to follow
FLOOR_GAP_S = 1000.0  # s between the floor run's arrivals; its queue p99 is reported to show none waited


def traffic(st: Study, trace: FleetTrace = MOONCAKE) -> Scenario:
    """The report's engine on `trace`'s first `fleet_requests` requests (the Mooncake slice unless named), prefix
    caching on."""
    workload = {"num_requests": st.cfg.fleet_requests, "arrival": {"process": "trace"},
                "trace": {"format": trace.format, "path": trace.path}}
    return variant(st.base, f"workload={json.dumps(workload)}", "engine.allocator=paged",
                   "engine.enable_prefix_caching=true", "replicas=null")


def pool_tokens(st: Study) -> int:
    """One replica's KV pool in tokens, as vLLM logs it ("GPU KV cache size: N tokens", `_report_kv_cache_config`
    in vllm/v1/core/kv_cache_utils.py): the blocks divided among the KV cache groups, whose block tables all draw
    on the one pool (a Gemma 3 pool's among 7: 6 sliding-window groups and 1 full), times block_size. The
    blocks are `kv_cache_config.num_blocks`, v1's null block included (its `BlockPool` takes block 0 of them as
    the null block after sizing, so the log counts one block no sequence holds); v0 keeps none."""
    return st.kv_layout.token_slots(st.num_blocks)


def unbounded_hit_rate(records: Sequence[TraceRecord], max_model_len: int) -> float:
    """Prompt tokens an unbounded, fleet-wide prefix cache would serve: per request, its leading
    segments some earlier request already had (Mooncake's ids are chained hashes), over all
    prompt tokens; prompts the engine refuses (≥ max_model_len) are left out, as they are never
    looked up. Read from the trace itself, not from a simulation. A record without segments (a trace of lengths
    alone: Azure's, a length table) is refused naming it: no block identity to hit (it was an AssertionError); so is
    anything but a sequence of `TraceRecord`s (None, a path: TypeError, AttributeError) and a `max_model_len` that is
    no count of tokens (a negative one, or '8192', left every prompt out or failed mid-loop)."""
    if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
        raise KvsimError(f"records={shown(records)}: expected a list of trace records "
                         "(kvsim.workload.traces.read_mooncake(path))")
    expect_count(max_model_len, "max_model_len", 1, "a count of tokens, 1 or more")
    seen: set[Any] = set()
    hit = total = 0
    for index, record in enumerate(records):
        if not isinstance(record, TraceRecord):
            raise KvsimError(f"records[{index}]={shown(record)}: expected a trace record (read_mooncake gives them)")
        if record.segments is None:
            raise KvsimError(f"records[{index}]: no segments (block identities, as Mooncake's hash_ids give); "
                             "unbounded_hit_rate reads a trace that names each prompt block")
        if record.prompt_len >= max_model_len:
            continue
        leading = True
        for segment, length in record.segments:
            leading = leading and segment in seen
            hit += length if leading else 0
            seen.add(segment)
        total += record.prompt_len
    return hit / total if total else 0.0


def fleet_plan_spec(cfg: StudyConfig, base: Scenario, gpu_name: str, target_s: float, router: str) -> PlanSpec:
    """The plan the fleet section runs per router: TTFT p90 <= `target_s` on `base`'s GPU (named `gpu_name`) and
    TP, at most `cfg.fleet_max_replicas` replicas, priced at `cfg.gpu_hourly_cost` (else the GPU's list price),
    probes too short to judge doubled up to `cfg.fleet_max_probe_requests` requests (a probe still too short there
    judges no count: the row has no replicas, and the section says its probes were too short), the answer re-run
    `cfg.fleet_verify_factor` × as long (0: not re-run, and the section says the answer rests on probes alone).
    `kvsim report` makes one first, so that a price the plan refuses fails before any run."""
    price = gpu_price(gpu_name, cfg.gpu_hourly_cost).usd_per_gpu_hour
    return make_plan_spec({"slo": {"ttft_s.p90": target_s}, "gpus": [base.gpu],
                           "tensor_parallel_sizes": [base.engine.tensor_parallel_size],
                           "max_replicas": cfg.fleet_max_replicas, "router": router,
                           "max_probe_requests": cfg.fleet_max_probe_requests,
                           "verify_factor": cfg.fleet_verify_factor,
                           "gpu_hourly_cost": {base.gpu: price} if price else {}})


def _replicas_needed(st: Study, base: Scenario, target_s: float, routers: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per router, `kvsim.planning.plan.plan`'s row for TTFT p90 ≤ `target_s` on this GPU and TP."""
    out = {}
    for router in routers:
        spec = fleet_plan_spec(st.cfg, base, st.gpu.name, target_s, router)
        with tempfile.TemporaryDirectory() as tmp:
            rows, _ = plan(base, spec, Path(tmp) / "plan",  # a folder plan() makes: it writes only into its own
                           on_point=lambda *_: st.count_runs(1, 1))  # counted as it goes
        out[router] = rows[0]
    return out


def _passed_over(tried: Sequence[TraceTried]) -> list[dict[str, Any]]:
    """Each trace tried and not served: its name and how many of its first requests are too long."""
    return [{"name": t.trace.name, "num_too_long": t.num_too_long} for t in tried if not t.served]


def fleet_routing(st: Study) -> Section:
    """Replicas needed per router for the TTFT SLO, and the routers compared at one fleet size."""
    max_model_len = st.max_model_len  # the traffic's engine is the report's, its allocator and prefix caching aside
    tried = choose(st.base, st.cfg.fleet_requests, max_model_len)
    chosen = tried[-1]
    if not chosen.served:  # sizing the rest would answer another question
        return Section("fleet", "How many GPUs for this traffic (shipped traces, routing)",
                       {"fleet_routing": pd.DataFrame()},
                       {"unservable": True, "passed_over": _passed_over(tried), "num_requests": len(chosen.records),
                        "max_model_len": max_model_len})
    base, records = traffic(st, chosen.trace), chosen.records
    routers = ROUTERS if chosen.trace.has_prefixes else LOAD_ROUTERS
    prompts = np.array([r.prompt_len for r in records])
    floor = st.run([variant(base, f"workload.arrival={{process: constant, rate: {1 / FLOOR_GAP_S}}}")])[0].summary
    slo = st.cfg.ttft_slo_s
    floor_p90 = floor["ttft_s"]["p90"]
    target = slo if floor_p90 is None or floor_p90 < slo else floor_p90 + slo
    needed = _replicas_needed(st, base, target, routers)
    size = needed["least_outstanding"]["replicas"] or st.cfg.fleet_max_replicas
    candidate = Candidate(base.gpu, base.engine.tensor_parallel_size)
    runs = st.run([candidate.scenario(base, size, router) for router in routers])
    rows = []
    for router, run in zip(routers, runs, strict=True):
        s, need = run.summary, needed[router]
        rows.append({
            "router": router, "replicas": size, "prefix_cache_hit_rate": round(s["prefix_cache_hit_rate"], 4),
            "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p90_s": s["ttft_s"]["p90"], "queue_p90_s": s["queue_s"]["p90"],
            "prompt_tokens_computed": s["num_prefix_cache_query_tokens"] - s["num_prefix_cache_hit_tokens"],
            "requests_per_replica_max": s["requests_per_replica"]["max"],
            "routed_to_prefix": s["route_reasons"].get("affinity", 0),
            "num_preemptions": s["num_preemptions"], "num_rejected": s["num_rejected"],
            "replicas_for_slo": need["replicas"], "gpus_for_slo": need["num_gpus"],
            "cost_per_hour_for_slo": need["cost_per_hour"], "verified_10x": need.get("verified"),
            "requests_per_probe": need.get("requests_per_probe"),
            "probes_too_short": need["replicas"] is None and need.get("verdict") == TOO_SHORT,
            "floor_replicas": need["lower_bound_replicas"], "floor_binds": need["bound_binds"],
            "replicas_over_floor": need["replicas_over_bound"], "gap_breakdown": need.get("gap_breakdown") or None})
    arrivals = np.array([r.arrival_s or 0.0 for r in records])
    facts = {"num_requests": st.cfg.fleet_requests, "span_s": float(arrivals.max() - arrivals.min()),
             "mean_prompt_tokens": float(prompts.mean()), "max_model_len": max_model_len,
             "pool_tokens": pool_tokens(st),
             "num_too_long": chosen.num_too_long,
             "trace": chosen.trace, "passed_over": _passed_over(tried),
             "floor_ttft_p90_s": floor_p90, "floor_hit_rate": floor["prefix_cache_hit_rate"],
             "floor_queue_p99_s": floor["queue_s"]["p99"],
             "unbounded_hit_rate": unbounded_hit_rate(records, max_model_len) if chosen.trace.has_prefixes else None,
             "ttft_target_s": target, "slo_s": slo,
             "max_replicas": st.cfg.fleet_max_replicas,
             "max_probe_requests": st.cfg.fleet_max_probe_requests, "verify_factor": st.cfg.fleet_verify_factor,
             "price_source": gpu_price(st.gpu.name, st.cfg.gpu_hourly_cost).source}
    return Section("fleet", f"How many GPUs for this traffic ({chosen.trace.name} trace, routing)",
                   {"fleet_routing": pd.DataFrame(rows)}, facts)
