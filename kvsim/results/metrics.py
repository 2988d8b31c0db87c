"""What a run records, as pandas DataFrames with vLLM's metric names, and its summary.

Per step (one row per engine step, recorded when the step is planned, so it describes the
memory held while the step runs): `time_s`, `duration_s`, `vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:num_requests_swapped`, `num_batched_tokens`,
`num_prefill_tokens` (prompt and recomputed tokens), `num_decode_seqs` (sequences past their prompt:
a sequence verifying k speculative drafts is one, processing k + 1 tokens), `vllm:kv_cache_usage_perc`,
`vllm:num_preemptions_total` (cumulative), swap bytes, and the waste breakdown as fractions
of the pool (`token_state`, `reserved`, `internal_frag`, `slack`, `external_frag`, `free`),
and `shared_slots`: slots that sharing saves (forked samples and beams, prefix-cache hits)
against every sequence holding its own copy. The summary's `sharing_saving` is the paper's
memory saving (§6.3): saved ÷ (held + saved), time-averaged over the steps that hold KV.

Per request: arrival, first scheduled, first token, finish (seconds), `ttft_s`
(`vllm:time_to_first_token_seconds`), `tpot_s` (`vllm:request_time_per_output_token_seconds`:
one value per request, its decode time over its output tokens after the first), `e2e_s`
(`vllm:e2e_request_latency_seconds`), `queue_s`, token counts, prefix-hit tokens,
preemptions, status and reject reason. vLLM's `vllm:inter_token_latency_seconds` is per
token (one observation per generated token, vllm/v1/metrics/loggers.py); its mean over
every token is the summary's `inter_token_latency_s`.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.results.records import RequestRecords
from kvsim.workload.request import Request, RequestStatus

if TYPE_CHECKING:
    import pandas as pd

WASTE_KEYS = ("token_state", "reserved", "internal_frag", "slack", "external_frag", "free")
DRAFT_KEY = "draft_rejected"
"""Speculative decoding's step rows only: the pool share holding the KV of drafts that a verify step
rejected, until a step overwrites them; carved out of `reserved` and `internal_frag` (where those slots
would otherwise count), so the shares still sum to 1. A run without speculation has no such column."""
VLLM_REQUEST_METRICS = {
    "ttft_s": "vllm:time_to_first_token_seconds",
    "tpot_s": "vllm:request_time_per_output_token_seconds",
    "e2e_s": "vllm:e2e_request_latency_seconds",
}


STEP_COLUMNS = (
    "time_s", "duration_s", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:num_requests_swapped", "num_batched_tokens", "num_prefill_tokens", "num_decode_seqs",
    "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "swap_in_bytes", "swap_out_bytes",
    "held_slots", "shared_slots", *WASTE_KEYS,
)
"""The per-step table's columns, in order (`kvsim.engine.recorder.StepRecorder` fills them)."""
STEP_FLOAT_COLUMNS = frozenset(("time_s", "duration_s", "vllm:kv_cache_usage_perc", *WASTE_KEYS))
"""The float64 columns; the others are int64."""


def requests_frame(requests: RequestRecords | Iterable[Request]) -> pd.DataFrame:
    """One row per request, in arrival order: a scheduler's `records` or the given requests as they are now."""
    import pandas as pd

    if not isinstance(requests, RequestRecords):
        records = RequestRecords()
        records.extend(requests)
        requests = records
    return pd.DataFrame(requests.columns())


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    """Mean, p50, p90 and p99 of the non-NaN values (all None when there are none)."""
    values = values[~np.isnan(values)]
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"mean": float(values.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def time_weighted_mean(numerator: float, denominator: float) -> float | None:
    """A time-weighted mean from its two sums: None when no time was weighted."""
    return float(numerator / denominator) if denominator > 0 else None


@dataclass(slots=True)
class StepTotals:
    """Streaming sums over every step, from which the summary's step figures follow exactly.

    `add` takes the steps a chunk at a time (a dict of columns or a steps DataFrame, in step
    order); each time-weighted mean is kept as Σ value·weight and Σ weight, so memory does not
    grow with the run but for `busy_periods` (start and end of each stretch of back-to-back steps,
    flat: two floats per idle gap), from which engines running side by side get the time any of them
    steps (`kvsim.results.together.means_together`). Weights: `dt` (each step's duration), `holding` (dt of steps that
    hold KV: the waste shares and sharing), `queued` (dt of steps with requests waiting: `saturated`).
    """

    num_steps: int = 0
    end_s: float = 0.0
    dt: float = 0.0
    max_running: int = 0
    running_dt: float = 0.0
    usage_dt: float = 0.0
    max_usage: float = 0.0
    holding: float = 0.0
    waste_holding: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WASTE_KEYS, 0.0))
    of_allocated_holding: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WASTE_KEYS[:-1], 0.0))
    shared_holding: float = 0.0
    logical_holding: float = 0.0
    queued: float = 0.0
    queued_preemptions: int = 0
    running_queued: float = 0.0
    waste_queued: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WASTE_KEYS, 0.0))
    last_preemptions_total: int = 0  # the cumulative count of the last step added
    waiting_dt: float = 0.0  # Σ waiting·dt
    busy_periods: array = field(default_factory=lambda: array("d"))

    @classmethod
    def of(cls, steps: Mapping[str, Any]) -> StepTotals:
        """The totals of a whole steps table (a DataFrame or a dict of columns)."""
        totals = cls()
        totals.add(steps)
        return totals

    def add(self, steps: Mapping[str, Any]) -> None:
        """Add the next steps, in order (after those already added)."""
        def col(name: str) -> np.ndarray:
            return np.asarray(steps[name])

        dt = col("duration_s").astype(np.float64)
        if dt.size == 0:
            return
        self.num_steps += int(dt.size)
        start = col("time_s").astype(np.float64)
        end = start + dt
        self.end_s = max(self.end_s, float(end.max()))
        reach = np.maximum.accumulate(end)  # the latest end so far
        new = np.empty(dt.size, dtype=bool)  # a step that starts after every earlier one ended begins a period
        new[0] = not self.busy_periods or start[0] > self.busy_periods[-1]
        new[1:] = start[1:] > reach[:-1]
        firsts = np.flatnonzero(new)
        if not new[0]:  # the steps before the first new period extend the last one
            last = (firsts[0] if firsts.size else dt.size) - 1
            self.busy_periods[-1] = max(self.busy_periods[-1], float(reach[last]))
        if firsts.size:
            ends = np.maximum.reduceat(end, firsts)
            self.busy_periods.extend(np.column_stack([start[firsts], ends]).ravel().tolist())
        self.dt += float(dt.sum())
        running = col("vllm:num_requests_running").astype(np.float64)
        self.max_running = max(self.max_running, int(running.max()))
        self.running_dt += float((running * dt).sum())
        usage = col("vllm:kv_cache_usage_perc")
        self.usage_dt += float((usage * dt).sum())
        self.max_usage = max(self.max_usage, float(usage.max()))
        held = col("held_slots")
        holding = dt * (held > 0)
        self.holding += float(holding.sum())
        fractions = {k: col(k) for k in WASTE_KEYS}
        allocated = sum(fractions[k] for k in WASTE_KEYS[:-1])
        if DRAFT_KEY in steps:  # speculative decoding: a held share beside the others
            fractions[DRAFT_KEY] = col(DRAFT_KEY)
            allocated = allocated + fractions[DRAFT_KEY]
        for k, v in fractions.items():
            self.waste_holding[k] = self.waste_holding.get(k, 0.0) + float((v * holding).sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            for k in fractions:
                if k != "free":
                    self.of_allocated_holding[k] = self.of_allocated_holding.get(k, 0.0) + float(
                        (np.nan_to_num(fractions[k] / allocated) * holding).sum())
        shared = col("shared_slots").astype(np.float64)
        self.shared_holding += float((shared * holding).sum())
        self.logical_holding += float(((held + shared) * holding).sum())
        waiting = col("vllm:num_requests_waiting")
        self.waiting_dt += float((waiting * dt).sum())
        queued = waiting > 0
        dt_queued = dt * queued
        self.queued += float(dt_queued.sum())
        preemptions = col("vllm:num_preemptions_total")
        self.queued_preemptions += int(np.diff(preemptions, prepend=self.last_preemptions_total)[queued].sum())
        self.last_preemptions_total = int(preemptions[-1])
        self.running_queued += float((running * dt_queued).sum())
        for k, v in fractions.items():
            self.waste_queued[k] = self.waste_queued.get(k, 0.0) + float((v * dt_queued).sum())


MIN_SATURATED_FRACTION = 0.1
"""Shortest saturated window, as a share of the run, whose averages `saturated` reports.

The sustained figures are meant to describe a steady state a plan can be built on. Queues that
exist for under a tenth of the run are transient clumps of arrivals (a Poisson stream bunches up
now and then even at light load), and the concurrency averaged over them is the burst's peak, not
what the engine holds under sustained overload: the default scenario, whose KV pool never fills
beyond half, queued for well under 10 % of its run. A saturated run (arrivals faster than the
engine serves) queues for most of the run, far above this floor.
"""


def saturated_summary(steps: StepTotals | pd.DataFrame, run_duration_s: float) -> dict[str, Any]:
    """The saturated steady state: the steps during which requests were queued (waiting > 0).

    Ramp-up (before a queue forms) and drain (after it empties) are excluded, so these are
    the numbers a plan for sustained load is built on: `mean_running` (the *sustained*
    concurrency), preemptions per second, and the six KV states as time-averaged shares of
    the whole pool (the view of the PagedAttention paper's Fig. 2). `duration_s` is always the
    queued time; the averages are None, with a `reason`, when nothing queued or when the queued
    time is under `MIN_SATURATED_FRACTION` of `run_duration_s` (too short to be a steady state).
    `steps`: the run's `StepTotals`, or its whole steps table.
    """
    totals = steps if isinstance(steps, StepTotals) else StepTotals.of(steps)
    duration = totals.queued
    if duration <= 0 or duration < MIN_SATURATED_FRACTION * run_duration_s:
        reason = ("no request ever waited" if duration <= 0 else
                  f"requests waited for {duration:.3g} s, under {MIN_SATURATED_FRACTION:.0%} of the "
                  f"{run_duration_s:.3g} s run: a transient, not a sustained steady state")
        return {"duration_s": duration, "mean_running": None, "preemptions_per_s": None,
                "waste": dict.fromkeys(totals.waste_queued), "reason": reason}
    return {"duration_s": duration, "mean_running": time_weighted_mean(totals.running_queued, duration),
            "preemptions_per_s": float(totals.queued_preemptions) / duration,
            "waste": {k: time_weighted_mean(v, duration) for k, v in totals.waste_queued.items()}, "reason": None}


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """An engine's run-long counters, as its scheduler (`Scheduler.counters()`) reports them at the end.

    Prefix-cache tokens as vLLM v1 counts them: queries and hits of first admissions, and apart from them
    those of re-admissions after a preemption; under the v0 scheduler also full blocks queried and hit at
    every admission, as vLLM v0 counts them (`PrefixCacheStats.record_blocks`; 0 under v1).
    """

    num_preemptions: int = 0
    num_prefix_query_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    num_preempted_query_tokens: int = 0
    num_preempted_hit_tokens: int = 0
    num_swapped_out_bytes: int = 0
    num_copy_on_writes: int = 0
    num_recomputed_tokens: int = 0  # tokens computed again after a preemption by recompute dropped their KV
    num_prefix_query_blocks: int = 0
    num_prefix_hit_blocks: int = 0
    spec_decode: SpecDecodeCounters | None = None  # with speculative decoding only


@dataclass(frozen=True, slots=True)
class SpecDecodeCounters:
    """Speculative decoding's run-long counts (vLLM's `vllm:spec_decode_*`) and `rejected_slot_s`, the
    time integral of the KV slots that rejected drafts held, over a pool of `num_total_slots`."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    rejected_slot_s: float
    num_total_slots: int

    def summary(self, duration_s: float) -> dict[str, Any]:
        drafts, tokens, accepted = self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens
        return {
            "num_drafts": drafts, "num_draft_tokens": tokens, "num_accepted_tokens": accepted,
            "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None,
            "draft_acceptance_rate": accepted / tokens if tokens else None,
            "draft_rejected_share": self.rejected_slot_s / (self.num_total_slots * duration_s) if duration_s else 0.0,
        }


def combined_counters(engines: Sequence[EngineCounters]) -> EngineCounters:
    """The counters of engines serving as one (a data-parallel group's ranks) as one engine's: every count
    summed, speculative decoding's too (its rejected drafts' share then over the ranks' pools together)."""
    def summed(kind: type, items: Sequence[Any]) -> dict[str, Any]:
        return {f.name: sum(getattr(item, f.name) for item in items) for f in fields(kind) if f.name != "spec_decode"}

    spec = [engine.spec_decode for engine in engines if engine.spec_decode is not None]
    return EngineCounters(**summed(EngineCounters, engines),
                          spec_decode=SpecDecodeCounters(**summed(SpecDecodeCounters, spec)) if spec else None)


def prefix_cache_hit_rate(query_tokens: int, hit_tokens: int, query_blocks: int, hit_blocks: int) -> dict[str, Any]:
    """`prefix_cache_hit_rate` as vLLM reports it: v1's hit tokens / queried tokens of first admissions, or,
    where blocks were queried (the v0 scheduler), v0's hit blocks / queried blocks of every admission, with
    those block counts (`num_prefix_cache_query_blocks`, `num_prefix_cache_hit_blocks`)."""
    if query_blocks:
        return {"prefix_cache_hit_rate": hit_blocks / query_blocks, "num_prefix_cache_query_blocks": query_blocks,
                "num_prefix_cache_hit_blocks": hit_blocks}
    return {"prefix_cache_hit_rate": hit_tokens / query_tokens if query_tokens else 0.0}


def summarize(requests: Mapping[str, Any], steps: StepTotals | pd.DataFrame, scheduler: EngineCounters,
              extra: dict[str, Any]) -> dict[str, Any]:
    """The run's headline numbers (`summary.json`); `extra` adds configuration facts.

    `requests`: the requests table's columns (`RequestRecords.columns()`, or a requests DataFrame);
    `steps`: the streaming `StepTotals` over every step (or the whole steps table).
    """
    def col(name: str) -> np.ndarray:
        return np.asarray(requests[name])

    totals = steps if isinstance(steps, StepTotals) else StepTotals.of(steps)
    status = col("status")
    finished = status == RequestStatus.FINISHED.value  # masks, not filtered copies of the table
    rejected = status == RequestStatus.REJECTED.value
    num_finished = int(finished.sum())
    start_s = float(col("arrival_s").min()) if len(status) else 0.0
    duration = max(totals.end_s - start_s, 0.0) if totals.num_steps else 0.0
    fractions = {k: time_weighted_mean(v, totals.holding) for k, v in totals.waste_holding.items()}
    of_allocated = {k: time_weighted_mean(v, totals.holding) for k, v in totals.of_allocated_holding.items()}
    sharing_saving = totals.shared_holding / totals.logical_holding if totals.logical_holding else 0.0
    outputs = col("output_tokens")
    output_tokens = int((outputs * col("num_samples"))[finished].sum())
    decoded = finished & (outputs > 1)
    num_gaps = float((outputs[decoded] - 1).sum())
    gaps_s = col("finish_s")[decoded] - col("first_token_s")[decoded]
    itl_mean = float(gaps_s.sum() / num_gaps) if num_gaps else None
    # Most frequent first, ties in order of first appearance (as pandas' value_counts orders them).
    reasons = Counter(col("reject_reason")[rejected].tolist()).most_common()
    return {
        **extra,
        "num_requests": len(status),
        "num_finished": num_finished,
        "num_rejected": int(rejected.sum()),
        "reject_reasons": {str(k): int(v) for k, v in reasons},
        "num_steps": totals.num_steps,
        "duration_s": duration,
        "output_tokens_per_s": output_tokens / duration if duration else 0.0,
        "requests_per_s": num_finished / duration if duration else 0.0,
        **{key: percentiles(col(key).astype(float)) for key in ("ttft_s", "tpot_s", "e2e_s", "queue_s")},
        "inter_token_latency_s": {"mean": itl_mean},
        "max_running": totals.max_running,
        # The peak of a run that preempted is an admission transient, not a level it held without
        # preempting: null then (`kvsim report` bisects max_num_seqs for the largest level that never preempts).
        "max_running_without_preemption": totals.max_running if scheduler.num_preemptions == 0 else None,
        "mean_running": time_weighted_mean(totals.running_dt, totals.dt) or 0.0,
        "num_preemptions": scheduler.num_preemptions,
        "kv_cache_usage_perc": {"mean": time_weighted_mean(totals.usage_dt, totals.dt) or 0.0, "max": totals.max_usage},
        **prefix_cache_hit_rate(scheduler.num_prefix_query_tokens, scheduler.num_prefix_hit_tokens,
                                scheduler.num_prefix_query_blocks, scheduler.num_prefix_hit_blocks),
        "num_prefix_cache_query_tokens": scheduler.num_prefix_query_tokens,
        "num_prefix_cache_hit_tokens": scheduler.num_prefix_hit_tokens,
        "num_prefix_cache_preempted_query_tokens": scheduler.num_preempted_query_tokens,
        "num_prefix_cache_preempted_hit_tokens": scheduler.num_preempted_hit_tokens,
        "swapped_out_bytes": scheduler.num_swapped_out_bytes,
        "num_copy_on_writes": scheduler.num_copy_on_writes,
        "sharing_saving": sharing_saving,
        "waste": fractions,
        "waste_of_allocated": of_allocated,
        "saturated": saturated_summary(totals, duration),
        **optional_column_summaries(requests),
        **({"spec_decode": scheduler.spec_decode.summary(duration)} if scheduler.spec_decode is not None else {}),
    }


def optional_column_summaries(requests: Mapping[str, Any]) -> dict[str, Any]:
    """The summary keys of the requests table's optional columns (`kvsim.results.records`), one engine's or a
    fleet's table alike: `by_priority` with `priority`; with `client_queue_s` (a closed-loop client's waits), its
    percentiles over the finished requests, as `vllm bench serve` takes its "Client Queue Time" over the
    successful ones (TTFT and E2E are over the finished requests too); with `length_capped_tokens`,
    `length_capped`: the finished requests whose output max_model_len cut (vLLM's finish_reason "length") and the
    output tokens cut, every sample's counted (as `output_tokens_per_s` counts them, over the finished requests). A
    refused request generated nothing, so nothing of its was cut: its row keeps the cap its admission check
    used (refused for its KV or its samples, the capped output), the summary does not count it."""
    out: dict[str, Any] = {}
    finished = np.asarray(requests["status"]) == RequestStatus.FINISHED.value
    if "length_capped_tokens" in requests:
        capped = np.asarray(requests["length_capped_tokens"]) * finished
        out["length_capped"] = {"num_requests": int((capped > 0).sum()),
                                "num_dropped_output_tokens": int((capped * np.asarray(requests["num_samples"])).sum())}
    if "priority" in requests:
        out["by_priority"] = by_priority(requests)
    if "client_queue_s" in requests:
        out["client_queue_s"] = percentiles(np.asarray(requests["client_queue_s"], dtype=float)[finished])
    return out


def by_priority(requests: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per request priority (smallest, i.e. served first, first): requests, finished, TTFT, TPOT, E2E."""
    priority = np.asarray(requests["priority"])
    finished = np.asarray(requests["status"]) == RequestStatus.FINISHED.value
    out = {}
    for value in np.unique(priority):
        rows = priority == value
        out[str(int(value))] = {
            "num_requests": int(rows.sum()), "num_finished": int((rows & finished).sum()),
            **{key: percentiles(np.asarray(requests[key], dtype=float)[rows]) for key in ("ttft_s", "tpot_s", "e2e_s")},
        }
    return out
