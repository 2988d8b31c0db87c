"""Engines side by side as one deployment: their step rows regrouped, their time-averages combined.

* data-parallel ranks (`dp_rank`): `dp_group_steps` sums lockstep ranks' step rows into one row per step
  (counts summed, pool shares averaged, a rank without a row idle: `IDLE_POOL`); `dp_interval_steps` first cuts
  independent ranks' overlapping steps at every instant one starts or ends, into such lockstep rows;
* a fleet's replicas or a disaggregated pool's instances: `busy_together_s` is the time at least one of them
  steps, and `means_together` their running, waiting and KV usage time-averaged over it, from each engine's
  streaming `StepTotals`, so that one engine's figures are its own summary's exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.results.metrics import STEP_COLUMNS, WASTE_KEYS, time_weighted_mean

if TYPE_CHECKING:
    import pandas as pd

    from kvsim.results.metrics import StepTotals

IDLE_POOL = {"vllm:kv_cache_usage_perc": 0.0, **dict.fromkeys(WASTE_KEYS, 0.0), "free": 1.0}
"""The pool shares of a data-parallel engine that has no row in a lockstep step: it runs nothing."""


def dp_group_steps(steps_df: pd.DataFrame, num_engines: int, preemptions_before: Sequence[int] | None = None,
                   ) -> pd.DataFrame:
    """Data-parallel engines' step rows (`dp_rank`, sharing `time_s` in lockstep) as one row per
    step of the whole deployment, so its summary speaks of all engines together.

    Counts (running, waiting, tokens, held and shared slots, bytes) are summed over the engines;
    pool shares are averaged over every engine (the pools are equal), an engine without a row
    counting as idle (`IDLE_POOL`); the cumulative preemption count is each engine's latest, summed
    (before its first row here: its count in `preemptions_before`, by rank, default 0; so the steps
    can come a chunk at a time, each chunk holding whole steps).
    """
    import pandas as pd

    wide = steps_df.pivot(index="time_s", columns="dp_rank")
    ranks = range(num_engines)
    data: dict[str, Any] = {"time_s": wide.index.to_numpy(),
                            "duration_s": wide["duration_s"].max(axis=1).to_numpy()}
    for name in STEP_COLUMNS[2:]:
        column = wide[name].reindex(columns=ranks)
        if name == "vllm:num_preemptions_total":
            column = column.ffill().fillna(dict(enumerate(preemptions_before or [0] * num_engines)))
        if name in IDLE_POOL:
            data[name] = column.fillna(IDLE_POOL[name]).mean(axis=1).to_numpy()
        else:
            data[name] = column.fillna(0).sum(axis=1).to_numpy().astype(steps_df[name].dtype)
    return pd.DataFrame(data)


def dp_interval_steps(steps_df: pd.DataFrame, until_s: float = np.inf) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Independent data-parallel engines' step rows (`dp_rank`; each engine's own steps never overlap, but
    different engines' do) cut at every instant a step starts or ends, as lockstep rows `dp_group_steps`
    regroups: for each interval between consecutive instants up to `until_s`, one row per engine stepping
    through it, its `time_s` and `duration_s` the interval's (the interval during which an engine runs no
    step is not there: that engine is idle then). Returns those rows and the steps still running at
    `until_s`, from `until_s` on (the rows to cut with the next ones, when the steps come a chunk at a time:
    no step of a later chunk starts before `until_s`)."""
    start = steps_df["time_s"].to_numpy()
    end = start + steps_df["duration_s"].to_numpy()
    instants = np.unique(np.concatenate([start, np.minimum(end, until_s)]))
    first = np.searchsorted(instants, start)
    counts = np.searchsorted(instants, np.minimum(end, until_s)) - first  # intervals each step runs through
    rows = np.repeat(np.arange(len(start)), counts)
    interval = np.repeat(first, counts) + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    cut = steps_df.iloc[rows].assign(time_s=instants[interval], duration_s=instants[interval + 1] - instants[interval])
    running_on = end > until_s
    rest = steps_df[running_on].assign(time_s=until_s, duration_s=end[running_on] - until_s)
    return cut.reset_index(drop=True), rest.reset_index(drop=True)


def busy_together_s(totals: Sequence[StepTotals]) -> float:
    """The time at least one of engines side by side (a fleet's replicas) steps: Σ dt less the time two or
    more step at once (their busy periods' overlap), so that one engine's is its own Σ dt exactly."""
    periods = [np.asarray(t.busy_periods).reshape(-1, 2) for t in totals]
    every = np.concatenate(periods) if periods else np.zeros((0, 2))
    start, end = every[np.argsort(every[:, 0], kind="stable")].T
    reach = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])  # the latest end before each period
    uncovered = np.maximum(0.0, end - np.maximum(start, reach))  # each period's time no earlier one covered
    overlap_s = float((end - start).sum() - uncovered.sum())  # 0.0 exactly when no two periods overlap
    return sum(t.dt for t in totals) - overlap_s


def _periods_together(totals: Sequence[StepTotals]) -> np.ndarray:
    """The time at least one of the engines steps, as disjoint (start, end) rows in time order."""
    every = np.concatenate([np.asarray(t.busy_periods).reshape(-1, 2) for t in totals] or [np.zeros((0, 2))])
    if not every.size:
        return every
    start, end = every[np.argsort(every[:, 0], kind="stable")].T
    reach = np.maximum.accumulate(end)
    new = np.concatenate([[True], start[1:] > reach[:-1]])
    firsts = np.flatnonzero(new)
    return np.column_stack([start[firsts], np.maximum.reduceat(reach, firsts)])


def _down_together_s(together: np.ndarray, up_periods: Sequence[float]) -> float:
    """The time in `together`'s periods outside the flat [start, end) pairs of `up_periods` (0.0 exactly when
    every period is inside one)."""
    down = np.concatenate([[-np.inf], np.asarray(up_periods, dtype=np.float64), [np.inf]]).reshape(-1, 2)
    overlap = (np.minimum(together[:, 1, None], down[None, :, 1])
               - np.maximum(together[:, 0, None], down[None, :, 0]))
    return float(np.maximum(overlap, 0.0).sum())


def means_together(totals: Sequence[StepTotals], num_blocks: Sequence[int],
                   up_periods: Sequence[Sequence[float]] | None = None) -> dict[str, float]:
    """Engines side by side (a fleet's replicas, a disaggregated pool's instances; engine i with a pool of
    `num_blocks[i]` blocks) as one: their running and waiting requests summed and their KV usage weighted by
    pool size (the share of all their blocks in use), each time-averaged over the time at least one of them
    steps (`busy_together_s`, computed once), as one engine's `mean_running` is over the time it steps, so
    that one engine's are its own exactly: `mean_running`, `mean_waiting`, `kv_cache_usage_mean`.

    `up_periods` (an autoscaled fleet's slots: engine i serves only in its flat [start, end) pairs): KV usage
    is then the blocks in use over the blocks of the engines up at the time, `Σ_i blocks_i · usage_dt_i ÷
    Σ_i blocks_i · (busy − time engine i was down within it)`, so a replica counts only while it is up (a slot
    switched off for most of the run no longer dilutes the share); a slot up throughout gives the static figure
    exactly.

    An engine counts as running, waiting and using none while it does not step, time its own means leave out
    too: a colocated replica then runs nothing, and blocks a finished request left in the prefix cache count
    as free, as in vLLM's gauge (a disaggregated instance may then hold blocks for a transfer, which no step
    records). (Summing each engine's mean, or averaging it, counts an engine stepping for a tenth of the run
    as if it ran all along, and a small pool as much as a large one.)"""
    busy_s = busy_together_s(totals)
    all_blocks = sum(num_blocks)
    used_dt = sum(blocks / all_blocks * t.usage_dt for t, blocks in zip(totals, num_blocks, strict=True))
    up_s = busy_s
    if up_periods is not None:
        together = _periods_together(totals)
        up_s -= sum(blocks / all_blocks * _down_together_s(together, up)
                    for blocks, up in zip(num_blocks, up_periods, strict=True))
    return {"mean_running": time_weighted_mean(sum(t.running_dt for t in totals), busy_s) or 0.0,
            "mean_waiting": time_weighted_mean(sum(t.waiting_dt for t in totals), busy_s) or 0.0,
            "kv_cache_usage_mean": time_weighted_mean(used_dt, up_s) or 0.0}

