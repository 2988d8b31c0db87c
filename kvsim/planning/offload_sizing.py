"""How much KV offload for this trace (issue 22 item 3): the CPU tier size a target prefix hit rate or TTFT
SLO needs, the load past which the tier pays, and where it hurts.

    sizing = size_offload(base, cpu_sizes_bytes=[0, 4 * GiB, 16 * GiB, 64 * GiB], loads=[0.5, 1, 2],
                          target_hit_rate=0.5, ttft_slo_s=1.0)

1. *Points*: the base scenario (a trace replay or a synthetic workload) at each load (× its arrival rate: a
   trace's timestamps compressed by `rate_scale`, a process's rate multiplied) and each CPU tier size, each
   an ordinary `kvsim run` with `engine.kv_offload.cpu_bytes` set (0: no tier), on the sweep machinery
   (`kvsim.planning.sweep.run_many`: local processes or Dask). A point that stalls (`HeldKvStall`: priority
   scheduling, requests holding KV loaded from the tier) stops the sizing with its line: it has no summary to
   tabulate, and a grid with a hole would size from the other points as if it had none.
2. *Size*: at load 1, the smallest size whose prefix hit rate over all tiers reaches the target, and the
   smallest whose TTFT percentile meets the SLO (None when no size in the grid does).
3. *Pays*: at each load, TTFT p90 with the largest tier against no tier, beside the mean concurrency
   (running requests) without it; the tier pays at a load where it cuts TTFT p90 by at least
   `PAYS_MARGIN`; `pays_from_load` is the lowest such load of the grid.
4. *Hurts*: for prefixes of several lengths, the time to load them over the tier's link against the time
   the engine's latency model takes to prefill them alone (chunked at `max_num_batched_tokens`); the
   break-even bandwidth below which loading is slower than recomputing. vLLM loads whatever the tier
   holds, so a link slower than that makes such requests slower than without a tier.

Hit rate over all tiers = (GPU prefix-cache hit tokens + tokens loaded from the tiers) / tokens queried,
first admissions and re-admissions after preemption together (a fleet's summary counts first admissions
only: it has no re-admission counters). An engine with prefix caching off runs a tier as `kvsim run` does
(vLLM's `--no-enable-prefix-caching` beside an offloading connector) and is sized by TTFT, pays and hurts
alike, but counts no prefix-cache query (as vLLM counts none), so its hit-rate columns are empty and a
hit-rate target is refused.

`kvsim plan --offload-size` sizes the plan's answer (`sizing_base`): the cheapest feasible colocated fleet,
its GPU, TP and engine knobs on its replica count behind the plan's router, the tier on every replica, so a
load is the whole fleet's traffic × the factor; with no feasible colocated answer, the scenario as given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pydantic import ValidationError

from kvsim.engine.builder import make_latency, offload_block_bytes, resolve_engine
from kvsim.latency.step_plan import StepPlan
from kvsim.model.errors import KvsimError, from_validation_error
from kvsim.model.offload_config import KVOffloadConfig
from kvsim.model.units import ceil_div
from kvsim.planning.slo import parse_slo_key
from kvsim.planning.spec import Candidate, PlanSpec
from kvsim.planning.sweep import run_many
from kvsim.sched import POLICIES
from kvsim.workload.overrides import apply_overrides
from kvsim.workload.scenario import Scenario, make_scenario

PAYS_MARGIN = 0.05  # the tier "pays" at a load when TTFT p90 is at least 5 % lower than without it
TTFT_PERCENTILES = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class OffloadSizing:
    """The answer (module docstring): `points` (one row per load and size), `pays` (per load), `hurts` (per
    prefix length and bandwidth), the sizes found (bytes, or None) and the lowest load at which the tier pays."""

    points: pd.DataFrame
    pays: pd.DataFrame
    hurts: pd.DataFrame
    size_for_hit_rate_bytes: int | None
    size_for_ttft_bytes: int | None
    pays_from_load: float | None
    facts: dict[str, Any]


def variant(base: Scenario, cpu_bytes: int, load: float = 1.0, bandwidth_bytes_per_s: float | None = None) -> Scenario:
    """`base` with a CPU tier of `cpu_bytes` (0: none) at `load` × its arrival rate."""
    raw = base.model_dump(mode="json")
    tier = {"cpu_bytes": cpu_bytes}
    if bandwidth_bytes_per_s is not None:
        tier["bandwidth_bytes_per_s"] = bandwidth_bytes_per_s  # type: ignore[assignment]
    raw["engine"]["kv_offload"] = tier if cpu_bytes else None
    if load != 1.0:
        workload = raw["workload"]
        if workload["arrival"]["process"] == "trace":
            workload["trace"]["rate_scale"] *= load
        else:
            workload["arrival"]["rate"] *= load
    return make_scenario(apply_overrides(raw, []), base.base_dir)


def point_row(summary: dict[str, Any], load: float, cpu_bytes: int, counts_queries: bool = True) -> dict[str, Any]:
    """One point's row: the hit rates, TTFT and what the tier moved. The hit rates are None where the engine
    `counts_queries` not (prefix caching off: no query counted, so no rate; 0 would read as a tier that loaded
    nothing)."""
    offload = summary.get("kv_offload") or {}
    queried = summary["num_prefix_cache_query_tokens"] + summary.get("num_prefix_cache_preempted_query_tokens", 0)
    gpu_hits = summary["num_prefix_cache_hit_tokens"] + summary.get("num_prefix_cache_preempted_hit_tokens", 0)
    loaded = offload.get("recompute_avoided_tokens", 0)
    rate = (lambda hits: hits / queried if queried else 0.0) if counts_queries else (lambda hits: None)
    row = {"load": load, "cpu_bytes": cpu_bytes, "cpu_GiB": round(cpu_bytes / 2**30, 3),
           "gpu_hit_rate": rate(gpu_hits), "hit_rate_all_tiers": rate(gpu_hits + loaded),
           "recompute_avoided_tokens": loaded, "bytes_loaded": offload.get("bytes_loaded", 0),
           "bytes_stored": offload.get("bytes_stored", 0), "num_loads": offload.get("num_loads", 0),
           "load_s_mean": offload.get("load_s_mean", 0.0), "mean_running": summary["mean_running"],
           "num_preemptions": summary["num_preemptions"],
           "num_finished": summary["num_finished"]}
    for p in TTFT_PERCENTILES:
        row[f"ttft_{p}_s"] = summary["ttft_s"][p]
    return row


def prefill_s(base: Scenario, num_tokens: int) -> float:
    """Seconds the engine's latency model takes to prefill `num_tokens` alone, in chunks of the step budget,
    each chunk with the logits rows its scheduler's steps take (`Scheduler.logits_every_request`)."""
    spec = resolve_engine(base)
    latency, budget = make_latency(spec), spec.limits.max_num_batched_tokens
    every = POLICIES[spec.engine.scheduler].logits_every_request
    total, past = 0.0, 0
    while past < num_tokens:
        chunk = min(budget, num_tokens - past)
        plan = StepPlan()
        plan.add(chunk, past, 1, every or past + chunk == num_tokens)
        total += latency.step_time(plan)
        past += chunk
    return total


def hurts_table(base: Scenario, prefix_lens: Sequence[int], bandwidths: Sequence[float]) -> pd.DataFrame:
    """Per prefix length and link bandwidth: load time (whole blocks, all TP ranks over their own links)
    against recompute time, and the break-even bandwidth per TP rank."""
    spec = resolve_engine(base)
    bs, tp = spec.engine.block_size, spec.engine.tensor_parallel_size
    rows = []
    for n in prefix_lens:
        if n > spec.max_model_len:
            continue
        num_bytes = ceil_div(n, bs) * spec.bytes_per_block  # one rank's shard; every rank moves its own at once
        recompute = prefill_s(base, n)
        for bandwidth in bandwidths:
            load = num_bytes / bandwidth
            rows.append({"prefix_tokens": n, "bandwidth_bytes_per_s": bandwidth, "bytes_per_rank": num_bytes,
                         "load_s": load, "recompute_s": recompute, "load_over_recompute": load / recompute,
                         "load_is_faster": load < recompute,
                         "break_even_bandwidth_bytes_per_s": num_bytes / recompute, "tensor_parallel_size": tp})
    return pd.DataFrame(rows)


def pays_table(points: pd.DataFrame, largest: int) -> pd.DataFrame:
    """Per load: TTFT p90 without a tier and with the largest, the concurrency without it, and whether the tier
    cuts TTFT p90 by at least `PAYS_MARGIN` there: None (an empty cell) where either run served no request (every
    prompt refused: no TTFT to compare), as is the ratio then; it was a TypeError traceback."""
    rows = []
    for load in sorted(points["load"].unique()):
        at = points[points["load"] == load].set_index("cpu_bytes")
        without, with_tier = at.loc[0, "ttft_p90_s"], at.loc[largest, "ttft_p90_s"]
        judged = not (pd.isna(without) or pd.isna(with_tier))
        rows.append({"load": load, "mean_running_without": at.loc[0, "mean_running"],
                     "ttft_p90_without_s": without, "ttft_p90_with_largest_s": with_tier,
                     "ttft_p90_ratio": with_tier / without if judged and without else None,
                     "pays": bool(with_tier <= (1 - PAYS_MARGIN) * without) if judged else None})
    return pd.DataFrame(rows)


def check_sizes(scenarios: Sequence[Scenario], cpu_sizes_bytes: Sequence[int], field: str = "offload size") -> None:
    """Refuse, before any run, to size a tier for an engine in `scenarios` (those it may size) that cannot
    have one (not the paged allocator; prefix caching on or off, as `kvsim run` takes a tier either way), or a
    CPU tier size of more than 0 bytes but less than one KV block of such an engine: it would hold no block,
    a tier that is no tier (a `KvsimError` naming `field` and the size)."""
    for scenario in scenarios:
        engine = scenario.engine
        if engine.allocator != "paged":
            raise KvsimError(f"{field}: sizing an offload tier needs engine.allocator=paged "
                             f"(allocator={engine.allocator})")
        block = offload_block_bytes(resolve_engine(scenario))
        for size in cpu_sizes_bytes:
            try:
                tier = KVOffloadConfig(cpu_bytes=size)
            except ValidationError as error:  # past the host's memory: a ValidationError traceback from kvsim plan
                raise from_validation_error(error, field) from None
            tier.num_blocks("cpu", block, field=field)


def size_offload(base: Scenario, cpu_sizes_bytes: Sequence[int], loads: Sequence[float] = (1.0,),
                 target_hit_rate: float | None = None, ttft_slo_s: float | None = None, ttft_percentile: str = "p90",
                 bandwidth_bytes_per_s: float | None = None, prefix_lens: Sequence[int] = (1024, 4096, 16384, 65536),
                 hurt_bandwidths: Sequence[float] | None = None, workers: int | None = None,
                 dask_address: str | None = None, sized_for: str = "the scenario as given") -> OffloadSizing:
    """Run the grid and answer (module docstring). Size 0 (no tier) is always part of the grid; a size is
    each engine's tier (a fleet's replicas each get one). `sized_for` labels what `base` is."""
    if not cpu_sizes_bytes or any(size < 0 for size in cpu_sizes_bytes):
        raise KvsimError(f"offload sizes={list(cpu_sizes_bytes)}: give sizes >= 0 bytes")
    if ttft_percentile not in TTFT_PERCENTILES:
        raise KvsimError(f"ttft percentile={ttft_percentile!r}: one of {', '.join(TTFT_PERCENTILES)}")
    check_sizes([base], cpu_sizes_bytes)
    counts_queries = base.engine.enable_prefix_caching
    if target_hit_rate is not None and not counts_queries:
        raise KvsimError(f"target_hit_rate={target_hit_rate}: an engine with enable_prefix_caching off counts no "
                         "prefix-cache query to take a hit rate over; size it by a TTFT SLO")
    sizes = sorted({0, *cpu_sizes_bytes})
    loads = sorted(set(loads) | {1.0})
    grid = [(load, size) for load in loads for size in sizes]
    runs = run_many([variant(base, size, load, bandwidth_bytes_per_s) for load, size in grid], workers=workers,
                    dask_address=dask_address)
    points = pd.DataFrame([point_row(r.summary, load, size, counts_queries)
                           for (load, size), r in zip(grid, runs, strict=True)])
    at_one = points[points["load"] == 1.0]
    size_hit = size_ttft = None
    if target_hit_rate is not None:
        ok = at_one[at_one["hit_rate_all_tiers"] >= target_hit_rate]
        size_hit = int(ok["cpu_bytes"].min()) if len(ok) else None
    if ttft_slo_s is not None:
        ok = at_one[at_one[f"ttft_{ttft_percentile}_s"] <= ttft_slo_s]
        size_ttft = int(ok["cpu_bytes"].min()) if len(ok) else None
    spec = resolve_engine(base)
    link = bandwidth_bytes_per_s or spec.gpu.host_link_bandwidth_bytes_per_s
    bandwidths = hurt_bandwidths or sorted({link, link / 4, link / 16}, reverse=True)
    hurts = hurts_table(base, prefix_lens, bandwidths)
    facts = {"tier_bandwidth_bytes_per_s": link, "target_hit_rate": target_hit_rate, "ttft_slo_s": ttft_slo_s,
             "ttft_percentile": ttft_percentile, "largest_bytes": sizes[-1], "pays_margin": PAYS_MARGIN,
             "num_runs": len(grid), "sized_for": sized_for}
    pays = pays_table(points, sizes[-1]) if sizes[-1] else pd.DataFrame()
    paying = [float(x) for x in pays["load"][pays["pays"].eq(True)]] if len(pays) else []
    return OffloadSizing(points, pays, hurts, size_hit, size_ttft, min(paying, default=None), facts)


def sizing_base(base: Scenario, spec: PlanSpec, rows: Sequence[dict[str, Any]]) -> tuple[Scenario, str]:
    """What `kvsim plan --offload-size` sizes, and its label (module docstring): the first feasible colocated
    row of the ranked plan `rows` as a fleet, or `base` itself when no colocated row is feasible."""
    for row in rows:
        if row.get("topology") == "colocated" and row["feasible"] and row["replicas"]:
            shape = Candidate(row["gpu"], row["tensor_parallel_size"], tuple((k, row[k]) for k in spec.engine))
            return shape.scenario(base, row["replicas"], spec.router), f"{shape.label} x{row['replicas']}"
    return base, "the scenario as given (no feasible colocated answer)"


OFFLOAD_FILES = ["offload_points.csv", "offload_pays.csv", "offload_hurts.csv", "offload_sizing.json"]


def ttft_slo(slo: dict[str, float]) -> tuple[float | None, str]:
    """The TTFT limit and its statistic among a plan's SLOs (`ttft_s.p90: 2` -> (2, "p90")); (None, "p90").

    The sizing judges one TTFT statistic of the whole traffic, so a plan with two TTFT SLOs, or one of a priority
    class (`ttft_s.p90@0`), is refused (`KvsimError` naming `--offload-size` and those SLOs); `kvsim plan` asks
    before it plans. It took the first TTFT SLO in the order given, so `ttft_s.p50` and `ttft_s.p99` sized a tier
    for the p50 and, given the other way round, for the p99; and a class's `p90@0` was refused as no percentile
    only once the whole plan had run and been written."""
    ttft = {key: limit for key, limit in slo.items() if parse_slo_key(key)[0] == "ttft_s"}
    if len(ttft) > 1 or any(parse_slo_key(key)[2] is not None for key in ttft):
        raise KvsimError(f"--offload-size: sizes a tier for one TTFT SLO over the whole traffic; the plan has "
                         f"{', '.join(ttft)}")
    if not ttft:
        return None, "p90"
    ((key, limit),) = ttft.items()
    return limit, parse_slo_key(key)[1]


def answer(sizing: OffloadSizing) -> dict[str, Any]:
    """The sizing's answers in one mapping (`offload_sizing.json`)."""
    return {"size_for_hit_rate_bytes": sizing.size_for_hit_rate_bytes,
            "size_for_ttft_bytes": sizing.size_for_ttft_bytes, "pays_from_load": sizing.pays_from_load, **sizing.facts}


def write_sizing(sizing: OffloadSizing, out_dir: Any) -> list[str]:
    """The tables as CSV and the answers as JSON in `out_dir`, all written whole, then each renamed into place (an
    interrupt leaves no file cut short, a full disk none of this sizing's beside an earlier one's); returns the
    file names."""
    import json
    import os
    from pathlib import Path

    out = Path(out_dir)
    texts = {name: df.to_csv(index=False) for name, df in (("offload_points.csv", sizing.points),
                                                          ("offload_pays.csv", sizing.pays),
                                                          ("offload_hurts.csv", sizing.hurts))}
    texts["offload_sizing.json"] = json.dumps(answer(sizing), indent=2) + "\n"
    for name, text in texts.items():
        (out / f".{name}.tmp").write_text(text, encoding="utf-8")
    for name in texts:
        os.replace(out / f".{name}.tmp", out / name)
    return OFFLOAD_FILES
