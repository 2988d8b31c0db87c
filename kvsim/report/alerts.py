"""The capacity report's alert rules: when each would have fired in a simulated run, and the rules as a
Prometheus rule file over vLLM's metric names, so what the report tested is what a deployment loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from kvsim.planning.sweep import SweepResult


class AlertThresholds(Protocol):
    """The rules' thresholds (`kvsim.report.studies.StudyConfig` carries them)."""

    @property
    def usage_alert(self) -> float:
        """KVCacheNearlyFull: vllm:kv_cache_usage_perc above this fraction ..."""

    @property
    def alert_for_s(self) -> float:
        """... (either rule) for this many seconds (Prometheus `for:`)."""

    @property
    def preemption_rate_alert(self) -> float:
        """PreemptionStorm: preemptions per second above this ..."""

    @property
    def preemption_window_s(self) -> float:
        """... over a window of this many seconds (`rate(...[window])`)."""


def _firing_intervals(times: np.ndarray, ends: np.ndarray, condition: np.ndarray, for_s: float) -> list[tuple]:
    """(fired_at, resolved_at) of each stretch where `condition` held continuously for `for_s`."""
    out, start = [], None
    for t, c in zip(times, condition, strict=True):
        if c and start is None:
            start = t
        if not c and start is not None:
            if t - start >= for_s:
                out.append((start + for_s, t))
            start = None
    if start is not None and ends[-1] - start >= for_s:
        out.append((start + for_s, ends[-1]))
    return out


def alert_firings(runs: list[tuple[float, SweepResult]], cfg: AlertThresholds) -> pd.DataFrame:
    """When each alert rule would have fired in each simulated run (Prometheus `for:` semantics)."""
    rows = []
    for rate, result in runs:
        steps = result.steps
        assert steps is not None, "alerts need the per-step series"
        t = steps["time_s"].to_numpy()
        ends = t + steps["duration_s"].to_numpy()
        usage = steps["vllm:kv_cache_usage_perc"].to_numpy()
        preempt = steps["vllm:num_preemptions_total"].to_numpy()
        earlier = np.searchsorted(t, t - cfg.preemption_window_s)
        preempt_rate = (preempt - preempt[earlier]) / cfg.preemption_window_s
        for name, condition in (("KVCacheNearlyFull", usage > cfg.usage_alert),
                                ("PreemptionStorm", preempt_rate > cfg.preemption_rate_alert)):
            fired = _firing_intervals(t, ends, condition, cfg.alert_for_s)
            rows.append({"rate": rate, "alert": name, "times_fired": len(fired),
                         "first_fired_s": round(fired[0][0], 1) if fired else None,
                         "total_firing_s": round(sum(b - a for a, b in fired), 1)})
    return pd.DataFrame(rows)


def prometheus_rules(cfg: AlertThresholds) -> str:
    """The alert rules as a Prometheus rule file."""
    window = f"{int(cfg.preemption_window_s)}s"
    return f"""groups:
  - name: kvsim-kv-cache
    rules:
      - alert: KVCacheNearlyFull
        expr: vllm:kv_cache_usage_perc > {cfg.usage_alert}
        for: {int(cfg.alert_for_s)}s
        labels:
          severity: warning
        annotations:
          summary: "KV cache above {cfg.usage_alert:.0%} for {int(cfg.alert_for_s)}s: queueing, then preemptions"
      - alert: PreemptionStorm
        expr: rate(vllm:num_preemptions_total[{window}]) > {cfg.preemption_rate_alert}
        for: {int(cfg.alert_for_s)}s
        labels:
          severity: critical
        annotations:
          summary: "More than {cfg.preemption_rate_alert * 60:.0f} preemptions a minute: KV memory is thrashing"
"""
