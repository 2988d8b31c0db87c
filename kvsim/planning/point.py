"""One point of `kvsim plan`: a fleet simulated once, kept as the small, JSON-safe metrics the searches read.

A run that stalls for good (`kvsim.model.errors.HeldKvStall`, vLLM's held-KV deadlock) is a point too, one
that failed: vLLM's scheduler waits forever there and no later request is served, so the deployment holds
no SLO at that load, and a search that probes overloaded rates and counts (the rate search starts with the
whole traffic on one replica) goes on to lighter ones instead of stopping the plan. Its evidence is verdict
*stalled* (`kvsim.planning.window.stalled_evidence`), its line kept in the evidence's `stall`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvsim.model.errors import HeldKvStall, from_validation_error
from kvsim.planning.search import Metrics
from kvsim.planning.window import BACKLOGGED, EMPTY, OVERLOADED, SLO_METRICS, STABLE, STALLED, TOO_SHORT
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


Count = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]  # a latency the SLOs are judged on
Number = Annotated[float, Field(allow_inf_nan=True)]  # an int is a float too (strict mode takes it), a bool is not
_READ = ConfigDict(strict=True, extra="allow")  # JSON's types as `json.loads` gives them; other keys pass


class _Stats(BaseModel):
    """One metric's stats over a window (`kvsim.planning.window.metric_stats`): what an SLO is judged on."""

    model_config = _READ
    n: Count
    mean: Seconds | None
    p50: Seconds | None
    p90: Seconds | None
    p99: Seconds | None
    p50_ci: Annotated[list[Seconds | None], Field(min_length=2, max_length=2)] | None = None
    p90_ci: Annotated[list[Seconds | None], Field(min_length=2, max_length=2)] | None = None
    p99_ci: Annotated[list[Seconds | None], Field(min_length=2, max_length=2)] | None = None


class _Evidence(BaseModel):
    """The fields of `kvsim.planning.window.window_evidence` (or `stalled_evidence`) the plan reads."""

    model_config = _READ
    verdict: Literal[STABLE, BACKLOGGED, OVERLOADED, EMPTY, STALLED, TOO_SHORT]  # type: ignore[valid-type]
    num_requests: Count
    rejected_fraction: Annotated[float, Field(ge=0, le=1)]
    window_s: Annotated[float, Field(ge=0)]
    num_in_window: Count
    served_over_offered: Number | None
    backlog_trend: Number | None
    ttft_s: _Stats
    tpot_s: _Stats
    e2e_s: _Stats
    queue_s: _Stats
    by_priority: dict[str, dict[Literal[SLO_METRICS], _Stats]] = {}  # type: ignore[valid-type]


class _Work(BaseModel):
    model_config = _READ
    busy_replica_s: Seconds | None
    recomputed_tokens: Count | None


class _Point(BaseModel):
    """A point's metrics as `point_metrics` (or `stalled_metrics`) makes them: each of `SUMMARY_KEYS` (a number,
    or None where a stalled run made none), the evidence and the work."""

    model_config = _READ
    num_replicas: Count | None
    num_gpus: Count | None
    num_requests: Count
    num_finished: Count | None
    num_rejected: Count | None
    duration_s: Number | None
    requests_per_s: Number | None
    output_tokens_per_s: Number | None
    num_preemptions: Count | None
    kv_cache_usage_mean: Number | None
    prefix_cache_hit_rate: Number | None
    # inf where every request arrived at one instant: `stalled_metrics` takes `plan_rate.offered_rate_per_s`'s
    offered_rate_per_s: Annotated[float, Field(ge=0)]  # (NaN fails ge)
    evidence: _Evidence
    work: _Work


def point_problem(metrics: Any) -> str | None:
    """What keeps `metrics` (read back from points.jsonl) from being a point `point_metrics` made: one line naming
    the field and its value (a hand edit, a damaged or foreign file), or None for a whole point. The plan judges
    SLOs, verdicts and costs on these values: a text or a missing stat stopped a resumed plan with a traceback,
    a negative p90 met every SLO (`kvsim.planning.search.PointStore` skips such a line: simulated again)."""
    try:
        _Point.model_validate(metrics)
    except ValidationError as error:
        return str(from_validation_error(error))
    return None
