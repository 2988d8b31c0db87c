"""What a run records, as pandas DataFrames with vLLM's metric names, and its summary.

Per step (one row per engine step, recorded when the step is planned, so it describes the
memory held while the step runs): `time_s`, `duration_s`, `vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:num_requests_swapped`, `num_batched_tokens`,
`num_prefill_tokens`, `num_decode_seqs`, `vllm:kv_cache_usage_perc`,
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
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.memory import sharing_saved_slots, waste
from kvsim.request import Request, RequestStatus

if TYPE_CHECKING:
    import pandas as pd

    from kvsim.scenario import StepsMode
    from kvsim.scheduler import Scheduler
    from kvsim.scheduler.burst import Burst
    from kvsim.step import StepPlan

WASTE_KEYS = ("token_state", "reserved", "internal_frag", "slack", "external_frag", "free")
VLLM_REQUEST_METRICS = {
    "ttft_s": "vllm:time_to_first_token_seconds",
    "tpot_s": "vllm:request_time_per_output_token_seconds",
    "e2e_s": "vllm:e2e_request_latency_seconds",
}


def _next_region_slots(scheduler: Scheduler) -> int | None:
    """The region the next waiting request needs (slabs' external fragmentation is relative to it)."""
    if not scheduler.waiting:
        return None
    head = scheduler.waiting[0]
    return scheduler.alloc.region_slots(head.kv_len, head.prompt_len)


MAX_SAMPLED_STEPS = 100_000  # `steps: sampled` keeps at most this many evenly spaced rows


class StepRecorder:
    """Appends one row per step into compact typed columns (8 bytes a value, cheap in the step loop).

    The summary always uses every step; `frame(mode)` returns what a run keeps and writes:
    every row (`all`), at most `MAX_SAMPLED_STEPS` rows evenly spaced by step index, always
    including the first and the last (`sampled`), or none (`none`).
    """

    COLUMNS = (
        "time_s", "duration_s", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:num_requests_swapped", "num_batched_tokens", "num_prefill_tokens", "num_decode_seqs",
        "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "swap_in_bytes", "swap_out_bytes",
        "held_slots", "shared_slots", *WASTE_KEYS,
    )

    FLOAT_COLUMNS = frozenset(("time_s", "duration_s", "vllm:kv_cache_usage_perc", *WASTE_KEYS))

    def __init__(self) -> None:
        self.columns: dict[str, array] = {c: array("d" if c in self.FLOAT_COLUMNS else "q") for c in self.COLUMNS}

    def record(self, now: float, duration_s: float, plan: StepPlan, scheduler: Scheduler) -> None:
        alloc = scheduler.alloc
        w = waste(alloc, _next_region_slots(scheduler))
        total = alloc.num_total_slots
        row = (
            now, duration_s, len(scheduler.running), len(scheduler.waiting), len(scheduler.swapped),
            plan.num_tokens, plan.num_prefill_tokens, plan.num_decode_seqs, alloc.usage,
            scheduler.num_preemptions, plan.swap_in_bytes, plan.swap_out_bytes, alloc.num_held_slots,
            sharing_saved_slots(alloc),
            w.token_state / total, w.reserved / total, w.internal_frag / total, w.slack / total,
            w.external_frag / total, w.free / total,
        )
        for column, value in zip(self.columns.values(), row, strict=True):
            column.append(value)

    def begin_burst(self, start_s: float, burst: Burst, scheduler: Scheduler) -> dict[str, list]:
        """Rows for a decode burst, identical to what `record` would write step by step, but for
        the waiting counts, which `end_burst` adds. Call before the burst is applied."""
        alloc = scheduler.alloc
        durations = burst.durations
        k, n = len(durations), len(burst.batch)
        held, filled, reserved = alloc.burst_occupancy(burst.seq_ids, k)
        total = alloc.num_total_slots
        external = alloc.external_fragmentation_slots(_next_region_slots(scheduler))
        slack = alloc.num_slack_slots  # constant: nothing is placed or freed inside a burst
        starts, t = [], start_s
        for d in durations:
            starts.append(t)
            t += d
        rows: dict[str, list] = {"time_s": starts, "duration_s": list(durations)}
        for name, value in (("vllm:num_requests_running", n), ("vllm:num_requests_swapped", 0),
                            ("num_batched_tokens", n), ("num_prefill_tokens", 0),
                            ("num_decode_seqs", n), ("vllm:num_preemptions_total", scheduler.num_preemptions),
                            ("swap_in_bytes", 0), ("swap_out_bytes", 0), ("external_frag", external / total),
                            ("slack", slack / total),
                            ("shared_slots", sharing_saved_slots(alloc))):  # bursts only append unshared blocks
            rows[name] = [value] * k
        rows["vllm:kv_cache_usage_perc"] = [1.0 - (total - h) / total for h in held]
        rows["held_slots"] = held
        rows["token_state"] = [f / total for f in filled]
        rows["reserved"] = [r / total for r in reserved]
        rows["internal_frag"] = [(h - f - r - slack) / total for h, f, r in zip(held, filled, reserved, strict=True)]
        rows["free"] = [(total - h - external) / total for h in held]
        return rows

    def end_burst(self, rows: dict[str, list], waiting: list[int]) -> None:
        """Append a burst's rows, with the waiting count the engine saw before each step."""
        rows["vllm:num_requests_waiting"] = waiting
        for name, column in self.columns.items():
            column.extend(rows[name])

    @property
    def num_steps(self) -> int:
        return len(self.columns["time_s"])

    def frame(self, mode: StepsMode = "all") -> pd.DataFrame:
        """The recorded steps (`mode` as in the class docstring); columns are int64 or float64."""
        import pandas as pd

        n = self.num_steps
        index = kept_step_index(n, mode)
        data = {}
        for name, column in self.columns.items():
            values = np.frombuffer(column, dtype=np.float64 if column.typecode == "d" else np.int64) if n else \
                np.zeros(0, dtype=np.float64 if column.typecode == "d" else np.int64)
            data[name] = values.copy() if index is None else values[index]
        return pd.DataFrame(data)


def kept_step_index(num_steps: int, mode: StepsMode) -> np.ndarray | None:
    """Which of `num_steps` rows a run keeps in `mode` (see `StepRecorder`); None: all of them."""
    if mode == "none":
        return np.arange(0)
    if mode == "sampled" and num_steps > MAX_SAMPLED_STEPS:
        return np.unique(np.linspace(0, num_steps - 1, MAX_SAMPLED_STEPS).round().astype(np.int64))
    return None


IDLE_POOL = {"vllm:kv_cache_usage_perc": 0.0, **dict.fromkeys(WASTE_KEYS, 0.0), "free": 1.0}
"""The pool shares of a data-parallel engine that has no row in a lockstep step: it runs nothing."""


def dp_group_steps(steps_df: pd.DataFrame, num_engines: int) -> pd.DataFrame:
    """Data-parallel engines' step rows (`dp_rank`, sharing `time_s` in lockstep) as one row per
    step of the whole deployment, so its summary speaks of all engines together.

    Counts (running, waiting, tokens, held and shared slots, bytes) are summed over the engines;
    pool shares are averaged over every engine (the pools are equal), an engine without a row
    counting as idle (`IDLE_POOL`); the cumulative preemption count is each engine's latest, summed.
    """
    import pandas as pd

    wide = steps_df.pivot(index="time_s", columns="dp_rank")
    ranks = range(num_engines)
    data: dict[str, Any] = {"time_s": wide.index.to_numpy(),
                            "duration_s": wide["duration_s"].max(axis=1).to_numpy()}
    for name in StepRecorder.COLUMNS[2:]:
        column = wide[name].reindex(columns=ranks)
        if name == "vllm:num_preemptions_total":
            column = column.ffill().fillna(0)
        if name in IDLE_POOL:
            data[name] = column.fillna(IDLE_POOL[name]).mean(axis=1).to_numpy()
        else:
            data[name] = column.fillna(0).sum(axis=1).to_numpy().astype(steps_df[name].dtype)
    return pd.DataFrame(data)


def requests_frame(requests: list[Request]) -> pd.DataFrame:
    """One row per request, in arrival order."""
    import pandas as pd

    def times(attr: str) -> np.ndarray:
        return np.fromiter((v if (v := getattr(r, attr)) is not None else np.nan for r in requests),
                           dtype=np.float64, count=len(requests))

    def ints(attr: str) -> np.ndarray:
        return np.fromiter((getattr(r, attr) for r in requests), dtype=np.int64, count=len(requests))

    arrival, scheduled, first, finish = (times(a) for a in ("arrival_s", "first_scheduled_s", "first_token_s",
                                                            "finish_s"))
    output = ints("output_len")
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (finish - first) / (output - 1), np.nan)
    return pd.DataFrame({  # columnar: 8 bytes a value, no per-request row objects
        "request_id": ints("request_id"), "arrival_s": arrival, "first_scheduled_s": scheduled,
        "first_token_s": first, "finish_s": finish, "ttft_s": first - arrival, "tpot_s": tpot,
        "e2e_s": finish - arrival, "queue_s": scheduled - arrival, "prompt_tokens": ints("prompt_len"),
        "output_tokens": output, "num_samples": ints("num_samples"), "prefix_hit_tokens": ints("num_prefix_hit_tokens"),
        "num_preemptions": ints("num_preemptions"), "status": [r.status.value for r in requests],
        "reject_reason": [r.reject_reason for r in requests],
    })


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    """Mean, p50, p90 and p99 of the non-NaN values (all None when there are none)."""
    values = values[~np.isnan(values)]
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"mean": float(values.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def _time_weighted(values: np.ndarray, weights: np.ndarray) -> float | None:
    total = weights.sum()
    return float((values * weights).sum() / total) if total > 0 else None


MIN_SATURATED_FRACTION = 0.1
"""Shortest saturated window, as a share of the run, whose averages `saturated` reports.

The sustained figures are meant to describe a steady state a plan can be built on. Queues that
exist for under a tenth of the run are transient clumps of arrivals (a Poisson stream bunches up
now and then even at light load), and the concurrency averaged over them is the burst's peak, not
what the engine holds under sustained overload: the default scenario, whose KV pool never fills
beyond half, queued for well under 10 % of its run. A saturated run (arrivals faster than the
engine serves) queues for most of the run, far above this floor.
"""


def saturated_summary(steps_df: pd.DataFrame, run_duration_s: float) -> dict[str, Any]:
    """The saturated steady state: the steps during which requests were queued (waiting > 0).

    Ramp-up (before a queue forms) and drain (after it empties) are excluded, so these are
    the numbers a plan for sustained load is built on: `mean_running` (the *sustained*
    concurrency), preemptions per second, and the six KV states as time-averaged shares of
    the whole pool (the view of the PagedAttention paper's Fig. 2). `duration_s` is always the
    queued time; the averages are None, with a `reason`, when nothing queued or when the queued
    time is under `MIN_SATURATED_FRACTION` of `run_duration_s` (too short to be a steady state).
    """
    queued = steps_df["vllm:num_requests_waiting"].to_numpy() > 0
    dt = steps_df["duration_s"].to_numpy() * queued
    duration = float(dt.sum())
    if duration <= 0 or duration < MIN_SATURATED_FRACTION * run_duration_s:
        reason = ("no request ever waited" if duration <= 0 else
                  f"requests waited for {duration:.3g} s, under {MIN_SATURATED_FRACTION:.0%} of the "
                  f"{run_duration_s:.3g} s run: a transient, not a sustained steady state")
        return {"duration_s": duration, "mean_running": None, "preemptions_per_s": None,
                "waste": dict.fromkeys(WASTE_KEYS), "reason": reason}
    preempt = np.diff(steps_df["vllm:num_preemptions_total"].to_numpy(), prepend=0)
    running = steps_df["vllm:num_requests_running"].to_numpy(dtype=float)
    return {"duration_s": duration, "mean_running": _time_weighted(running, dt),
            "preemptions_per_s": float(preempt[queued].sum()) / duration,
            "waste": {k: _time_weighted(steps_df[k].to_numpy(), dt) for k in WASTE_KEYS}, "reason": None}


def summarize(requests_df: pd.DataFrame, steps_df: pd.DataFrame, scheduler: Scheduler,
              extra: dict[str, Any]) -> dict[str, Any]:
    """The run's headline numbers (`summary.json`); `extra` adds configuration facts."""
    finished = requests_df[requests_df["status"] == RequestStatus.FINISHED.value]
    end_s = float((steps_df["time_s"] + steps_df["duration_s"]).max()) if len(steps_df) else 0.0
    start_s = float(requests_df["arrival_s"].min()) if len(requests_df) else 0.0
    duration = max(end_s - start_s, 0.0)
    dt = steps_df["duration_s"].to_numpy()
    running = steps_df["vllm:num_requests_running"].to_numpy(dtype=float)
    usage = steps_df["vllm:kv_cache_usage_perc"].to_numpy()
    holding = dt * (steps_df["held_slots"].to_numpy() > 0)
    fractions = {k: _time_weighted(steps_df[k].to_numpy(), holding) for k in WASTE_KEYS}
    used = {k: steps_df[k].to_numpy() for k in WASTE_KEYS[:-1]}
    allocated = sum(used.values())
    with np.errstate(invalid="ignore", divide="ignore"):
        of_allocated = {k: _time_weighted(np.nan_to_num(v / allocated), holding) for k, v in used.items()}
    shared = steps_df["shared_slots"].to_numpy(dtype=float)
    logical = steps_df["held_slots"].to_numpy(dtype=float) + shared
    sharing_saving = float((shared * holding).sum() / (logical * holding).sum()) if (logical * holding).sum() else 0.0
    output_tokens = int((finished["output_tokens"] * finished["num_samples"]).sum())
    decoded = finished[finished["output_tokens"] > 1]
    num_gaps = float((decoded["output_tokens"] - 1).sum())
    itl_mean = float((decoded["finish_s"] - decoded["first_token_s"]).sum() / num_gaps) if num_gaps else None
    rejected = requests_df[requests_df["status"] == RequestStatus.REJECTED.value]
    return {
        **extra,
        "num_requests": int(len(requests_df)),
        "num_finished": int(len(finished)),
        "num_rejected": int(len(rejected)),
        "reject_reasons": {str(k): int(v) for k, v in rejected["reject_reason"].value_counts().items()},
        "num_steps": int(len(steps_df)),
        "duration_s": duration,
        "output_tokens_per_s": output_tokens / duration if duration else 0.0,
        "requests_per_s": len(finished) / duration if duration else 0.0,
        **{key: percentiles(requests_df[key].to_numpy(dtype=float)) for key in ("ttft_s", "tpot_s", "e2e_s",
                                                                                 "queue_s")},
        "inter_token_latency_s": {"mean": itl_mean},
        "max_running": int(running.max()) if running.size else 0,
        # The peak of a run that preempted is an admission transient, not a level it held without
        # preempting: null then (`kvsim report` bisects max_num_seqs for the largest level that never preempts).
        "max_running_without_preemption": (int(running.max()) if running.size else 0)
        if scheduler.num_preemptions == 0 else None,
        "mean_running": _time_weighted(running, dt) or 0.0,
        "num_preemptions": scheduler.num_preemptions,
        "kv_cache_usage_perc": {"mean": _time_weighted(usage, dt) or 0.0,
                                "max": float(usage.max()) if usage.size else 0.0},
        "prefix_cache_hit_rate": (scheduler.num_prefix_hit_tokens / scheduler.num_prefix_query_tokens
                                  if scheduler.num_prefix_query_tokens else 0.0),
        "num_prefix_cache_query_tokens": scheduler.num_prefix_query_tokens,
        "num_prefix_cache_hit_tokens": scheduler.num_prefix_hit_tokens,
        "num_prefix_cache_preempted_query_tokens": scheduler.num_preempted_query_tokens,
        "num_prefix_cache_preempted_hit_tokens": scheduler.num_preempted_hit_tokens,
        "swapped_out_bytes": scheduler.num_swapped_out_bytes,
        "num_copy_on_writes": scheduler.alloc.num_copy_on_writes,
        "sharing_saving": sharing_saving,
        "waste": fractions,
        "waste_of_allocated": of_allocated,
        "saturated": saturated_summary(steps_df, duration),
    }
