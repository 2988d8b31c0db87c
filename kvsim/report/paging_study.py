"""The capacity report's paging and load sections: the allocators compared, the rate each sustains, load curves.

`paging_and_load` runs every allocator (`ALLOCATORS`) saturated (the waste breakdown), searches each one's
highest rate under the TTFT SLO (`sustained_rates`, priced per GPU-hour), then runs the paged engine at
fractions of its rate (`load_and_alerts`: load curves, per priority class too, and the alerts that fire). It
takes a `Study` (`kvsim.report.studies`) and returns three `Section`s: paging, load and alerts.
"""

from __future__ import annotations

from functools import partial

import pandas as pd

from kvsim.kv import fig2_shares
from kvsim.planning.cost import cost_per_million_output_tokens, cost_per_user_hour, engine_gpus, gpu_price, usd_rounded
from kvsim.planning.slo import probe_passes, why_failed
from kvsim.planning.steady_state import failing_evidence, search_rates
from kvsim.planning.sweep import run_many
from kvsim.report.alerts import alert_firings
from kvsim.report.applicable import refused_settings
from kvsim.report.by_priority import latency_by_priority
from kvsim.report.section import Section
from kvsim.report.studies import Study, poisson, sustained, variant

ALLOCATORS = ("slab-max", "slab-pow2", "slab-oracle", "paged")


def paging_and_load(st: Study) -> tuple[Section, Section, Section]:
    """Waste per allocator, sustainable rate under the TTFT SLO, load curves and alerts (paged).

    A slab allocator this engine cannot take has no rows (its refusal in the paging section's `left_out`);
    the load runs are paged (`load_and_alerts`).
    """
    refused = refused_settings({f"engine.allocator={a}": partial(st.saturated, f"engine.allocator={a}")
                                for a in ALLOCATORS if a != "paged"})
    allocators = tuple(a for a in ALLOCATORS if f"engine.allocator={a}" not in refused)
    sat, _ = st.run_saturated([(f"engine.allocator={a}",) for a in allocators])
    rates_df = sustained_rates(st, allocators)
    load_section, alerts = load_and_alerts(st, rates_df)
    waste_rows = []
    for a, result in zip(allocators, sat, strict=True):
        shares = fig2_shares(result.summary["saturated"]["waste"])  # whole pool, while requests queue
        waste_rows.append({"allocator": a, **{k: round(v, 4) for k, v in shares.items()},
                           "sustained_running": sustained(result.summary),
                           "max_running": result.summary["max_running"],
                           "kv_usage_max": round(result.summary["kv_cache_usage_perc"]["max"], 4),
                           "limited_by": st.limited_by(result.summary)})
    paging = Section("paging", "Paging multiplier", {"waste_breakdown": pd.DataFrame(waste_rows),
                                                   "sustained_rate": rates_df}, {"left_out": refused})
    return paging, load_section, alerts


def load_and_alerts(st: Study, rates_df: pd.DataFrame) -> tuple[Section, Section]:
    """Load curves (per priority class too, when the workload has classes) and alerts, paged, from the paged
    row of `rates_df` (`sustained_rates`; the paged rate searched alone is the one searched beside the slab
    allocators: each search asks for its own runs, and a run is a function of its scenario).

    The load grid is `load_fractions` of paged KV's sustainable rate (the SLO's knee sits inside it);
    when nothing is sustainable it falls back to 1 req/s times the fractions.
    """
    cfg = st.cfg
    knee = rates_df.loc[rates_df.allocator == "paged", "max_rate_meeting_slo"].item()
    grid = [round((knee or 1.0) * f, 4) for f in cfg.load_fractions]
    paged_row = rates_df[rates_df.allocator == "paged"].iloc[0]
    # As long as the rate search's converged probes (at least 3 × num_requests, so that saturation lasts past
    # the alerts' `for:`), judged over the same window.
    num_load = max(3 * cfg.num_requests, int(paged_row.requests_per_probe or 0))
    load = run_many([variant(st.base, "engine.allocator=paged", poisson(r), f"workload.num_requests={num_load}")
                     for r in grid], keep_steps=True, workers=cfg.workers, dask_address=cfg.dask_address,
                    evidence=True)
    slo = {"ttft_s.p90": cfg.ttft_slo_s}
    load_rows = []
    for rate, r in zip(grid, load, strict=True):
        ev = r.evidence
        assert ev is not None
        load_rows.append({"rate": rate, "fraction_of_sustainable": rate / knee if knee else None,
                          "num_requests": num_load, "verdict": ev["verdict"],
                          **{f"{m}_{p}_s": ev[f"{m}_s"][p] for m in ("ttft", "tpot") for p in ("p50", "p90", "p99")},
                          "meets_slo": probe_passes(ev, slo), "num_preemptions": r.summary["num_preemptions"],
                          "served_per_s": ev["served_per_s"], "served_over_offered": ev["served_over_offered"]})
    paged_runs = list(zip(grid, load, strict=True))
    top_rate, top = paged_runs[-1]
    assert top.steps is not None, "load runs keep their steps"
    series = top.steps[["time_s", "vllm:num_requests_running", "vllm:num_requests_waiting",
                        "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"]].copy()
    load_tables = {"load_curves": pd.DataFrame(load_rows)}
    by_class = latency_by_priority(grid, load)
    if by_class["priority"].nunique() > 1:  # a workload with priority classes: each class's latency per load
        load_tables["load_by_priority"] = by_class
    load_section = Section("load", "Load", {**load_tables, "time_series": series},
                           {"time_series_rate": top_rate, "sustainable_rate": knee, "ttft_slo_s": cfg.ttft_slo_s})
    alerts = Section("alerts", "Alerts", {"alert_firings": alert_firings(paged_runs, cfg)})
    return load_section, alerts


def sustained_rates(st: Study, allocators: tuple[str, ...] = ALLOCATORS) -> pd.DataFrame:
    """Per allocator of `allocators`, the highest Poisson rate that is sustainable under the TTFT SLO
    (`kvsim.planning.steady_state`: stable over a measurement window, p90 TTFT over the requests that
    arrived in it), the run length grown until the rate moves < 2 % when it doubles; then that answer is
    run `rate_verify_factor` (10) × longer, backed off (3 %, doubling) while those long runs fail and raised
    while they hold, then bisected between them to within 3 %, so the rate printed is one that held in the
    long run with a failed long run at most 3 % above (`search_rate` is the answer before verification).
    The rates (`max_rate_meeting_slo`, `first_failing_rate`, `search_rate`) are the Poisson rates asked of the
    arrival generator, the search's variable; `offered_rate_in_window` is the rate the answer's measurement
    window actually got (one seed's Poisson draw: a few % off either way). `capacity --sustained` shows the
    window's served rate, which a stable window keeps within noise of its offered one.

    Throughput, concurrency and cost are the window's at that rate (the drain left out), so the $/M
    tokens and $/user-hour price a steady state, not a burst.
    """
    slo = {"ttft_s.p90": st.cfg.ttft_slo_s}
    searches = search_rates(
        lambda i, rate, n: variant(st.base, f"engine.allocator={allocators[i]}", poisson(rate),
                                   f"workload.num_requests={n}", "steps=none"),
        len(allocators), slo, st.evidence, num_requests=st.cfg.rate_requests, max_requests=st.cfg.rate_max_requests,
        verify_factor=st.cfg.rate_verify_factor, max_verify_requests=st.cfg.rate_max_verify_requests)
    rows = []
    for a, s in zip(allocators, searches, strict=True):
        ev, failed = s.evidence, failing_evidence(s)
        level = s.answer_level()
        ci = ev["ttft_s"]["p90_ci"] if ev else (None, None)
        rows.append({"allocator": a, "max_rate_meeting_slo": round(s.rate, 4) if s.rate else None,
                     "offered_rate_in_window": round(ev["offered_per_s"], 4) if ev else None,
                     "first_failing_rate": round(s.failed_rate, 4) if s.failed_rate else None,
                     "fails_by": why_failed(failed, slo), "requests_per_probe": level.num_requests if level else None,
                     "converged": s.converged, "capped": s.capped, "num_probes": s.summary()["num_probes"],
                     "search_rate": round(s.search_rate, 4) if s.search_rate else None, "verified": s.verified,
                     "verify_num_requests": ev["num_requests"] if ev and s.long_runs else None,
                     "num_long_runs": len(s.long_runs),
                     "verdict": ev["verdict"] if ev else None,
                     "window_s": round(ev["window_s"], 1) if ev else None,
                     "num_in_window": ev["num_in_window"] if ev else None,
                     "served_over_offered": _round(ev["served_over_offered"]) if ev else None,
                     "backlog_trend": _round(ev["backlog_trend"]) if ev else None,
                     "ttft_p90_s": _round(ev["ttft_s"]["p90"]) if ev else None,
                     "ttft_p90_ci_low_s": _round(ci[0]), "ttft_p90_ci_high_s": _round(ci[1]),
                     "rejected_fraction": _round(ev["rejected_fraction"]) if ev else None,
                     "output_tokens_per_s": round(ev["output_tokens_per_s"], 1) if ev else None,
                     "mean_running": round(ev["mean_running"], 2) if ev else None})
    df = pd.DataFrame(rows)
    price = gpu_price(st.gpu.name, st.cfg.gpu_hourly_cost)
    num_gpus = engine_gpus(st.base.engine)  # every DP engine serves the rate whose tokens are priced
    df["usd_per_concurrent_user_hour"] = [usd_rounded(cost_per_user_hour(price, num_gpus, c)) if c else None
                                          for c in df.mean_running]
    df["usd_per_million_output_tokens"] = [usd_rounded(cost_per_million_output_tokens(price, num_gpus, t or 0.0))
                                           for t in df.output_tokens_per_s]
    df["price_source"] = price.source
    paged = df.loc[df.allocator == "paged", "max_rate_meeting_slo"].item()
    df["paging_multiplier"] = [round(paged / r, 2) if r and paged else None for r in df.max_rate_meeting_slo]
    return df


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
