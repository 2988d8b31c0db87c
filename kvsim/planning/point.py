"""One point of `kvsim plan`: a fleet simulated once, kept as the small, JSON-safe metrics the searches read.

A run that stalls for good (`kvsim.model.errors.HeldKvStall`, vLLM's held-KV deadlock) is a point too, one
that failed: vLLM's scheduler waits forever there and no later request is served, so the deployment holds
no SLO at that load, and a search that probes overloaded rates and counts (the rate search starts with the
whole traffic on one replica) goes on to lighter ones instead of stopping the plan. Its evidence is verdict
*stalled* (`kvsim.planning.window.stalled_evidence`), its line kept in the evidence's `stall`.
"""

from __future__ import annotations

from typing import Any

from kvsim.model.errors import HeldKvStall, shown
from kvsim.planning.search import Metrics
from kvsim.workload.scenario import Scenario

POINT_FORMAT = 4
"""The format of the points `point_metrics` makes, stamped on each line of points.jsonl (`PointStore`): raise it
whenever what a point's metrics mean changes, so a plan resumed from an older points.jsonl simulates those points
again instead of mixing two kvsims' numbers. 0: before the stamp (53fa429 fixed `work.recomputed_tokens`, one off
per one-token chunk). 1: a fleet's verdict read its total waiting queue only, not each replica's (7db66e8). 2: an
xPyD split's read its prefill pool's queue only, not each decode instance's (`early_overload`). 3: nor each
prefill instance's (model21).
(A stalled point needs no new format: before it, such a point stopped the plan and was never stored.)"""

SUMMARY_KEYS = ("num_replicas", "num_gpus", "num_requests", "num_finished", "num_rejected", "duration_s",
                "requests_per_s", "output_tokens_per_s", "num_preemptions", "kv_cache_usage_mean",
                "prefix_cache_hit_rate", "offered_rate_per_s")


def point_metrics(scenario: Scenario, memory_limit_bytes: int | None = None) -> Metrics:
    """Simulate one fleet (colocated, or disaggregated: `kv_transfer_config`) and keep what the plan needs
    (small, JSON-safe; runs on a Dask worker). A run that stalls is `stalled_metrics`."""
    from kvsim.fleet.run import simulate_scenario
    from kvsim.planning.window import window_evidence
    from kvsim.workload.generate import short_trace_unsaid

    with short_trace_unsaid():  # `plan` says it once (`short_trace_said_once`)
        try:
            result = simulate_scenario(scenario, memory_limit_bytes=memory_limit_bytes)
        except HeldKvStall as stall:
            return stalled_metrics(scenario, str(stall))
    summary = result.summary
    # the SLOs are judged on `evidence` (the steady-state window), never on the whole run's percentiles;
    # busy time and recomputed tokens are what the gap to the floor is made of (`kvsim.planning.bounds`)
    evidence = window_evidence(result.requests, transfers=result.tables.get("transfers"))  # a split's instances' queues
    return {**{key: summary[key] for key in SUMMARY_KEYS}, "evidence": evidence,
            "work": {"busy_replica_s": sum(run.totals.dt for run in result.replicas if run.totals is not None),
                     "recomputed_tokens": sum(run.counters.num_recomputed_tokens for run in result.replicas
                                              if run.counters is not None)}}


def stalled_metrics(scenario: Scenario, reason: str) -> Metrics:
    """The metrics of `scenario`'s run that stalled (`reason`: its line): the requests it was sent and the rate
    they were offered at (a failed probe's rate is in the plan's `limiting_factor`), the evidence *stalled*;
    what the run never finished has no value (None)."""
    from kvsim.planning.plan_rate import offered_rate_per_s
    from kvsim.planning.window import stalled_evidence

    num_requests = scenario.workload.num_requests
    return {**dict.fromkeys(SUMMARY_KEYS), "num_requests": num_requests,
            "offered_rate_per_s": offered_rate_per_s(scenario), "evidence": stalled_evidence(num_requests, reason),
            "work": {"busy_replica_s": None, "recomputed_tokens": None}}


def point_problem(metrics: Metrics) -> str | None:
    """Why a stored point's `metrics` (its `evidence` and `work` dicts: `PointStore`'s `required`) are not what
    `point_metrics` makes, or None: a summary or work figure that is no number (or null), an evidence verdict that
    is none of the window's, a request count that is no integer, or an SLO metric's statistics (over every request,
    or over one priority's) that are no numbers. A damaged or hand-edited points.jsonl line of this format was
    reused as it stood: a missing verdict stopped `kvsim plan` with a KeyError's traceback, text where a
    percentile belongs with a TypeError against the SLO. `PointStore` simulates such a point again."""
    from kvsim.planning import window

    def number(value: Any) -> bool:
        return value is None or isinstance(value, (int, float)) and not isinstance(value, bool)

    evidence, work = metrics["evidence"], metrics["work"]
    figures = {**{key: (metrics, key) for key in SUMMARY_KEYS},
               **{f"work.{key}": (work, key) for key in ("busy_replica_s", "recomputed_tokens")}}
    for name, (holder, key) in figures.items():
        if key not in holder:
            return f"{name} is missing"
        if not number(holder[key]):
            return f"{name}={shown(holder[key])} is not a number"
    verdict = evidence.get("verdict")
    if verdict not in (window.STABLE, window.BACKLOGGED, window.OVERLOADED, window.EMPTY, window.STALLED,
                       window.TOO_SHORT):
        return f"evidence.verdict={shown(verdict)} is not a verdict"
    count = evidence.get("num_requests")
    if not isinstance(count, int) or isinstance(count, bool):
        return f"evidence.num_requests={shown(count)} is not an integer"
    by_priority = evidence.get("by_priority", {})
    if not isinstance(by_priority, dict) or not all(isinstance(per, dict) for per in by_priority.values()):
        return f"evidence.by_priority={shown(by_priority)} is not statistics by priority"
    stats = {f"evidence.{metric}": evidence.get(metric) for metric in window.SLO_METRICS}
    stats |= {f"evidence.by_priority.{cls}.{metric}": per[metric] for cls, per in by_priority.items()
              for metric in window.SLO_METRICS if metric in per}  # a class without the metric has none (`slo_stats`)
    for name, values in stats.items():
        if not isinstance(values, dict):
            return f"{name}={shown(values)} is not statistics"
        for stat in window.SLO_STATS:
            if stat not in values:
                return f"{name}.{stat} is missing"
            if not number(values[stat]):
                return f"{name}.{stat}={shown(values[stat])} is not a number"
    return None
