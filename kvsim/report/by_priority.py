"""The load study's latency per request priority: each load point's runs reduced to one row per priority class
(`kvsim.report.paging_study.load_and_alerts`'s `load_by_priority` table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from kvsim.planning.sweep import SweepResult


def latency_by_priority(rates: list[float], runs: list[SweepResult]) -> pd.DataFrame:
    """Per load point and request priority (vLLM's: smaller is served first), that class's requests in the
    run's measurement window and their TTFT, TPOT and E2E p50/p90 (`window_evidence`'s `by_priority`); one
    class (priority 0) when the workload has none."""
    rows = []
    for rate, run in zip(rates, runs, strict=True):
        assert run.evidence is not None
        classes = run.evidence.get("by_priority") or {"0": run.evidence}
        for priority, stats in sorted(classes.items(), key=lambda item: int(item[0])):
            rows.append({"rate": rate, "priority": int(priority), "num_in_window": stats["ttft_s"]["n"],
                         **{f"{m.removesuffix('_s')}_{q}_s": stats[m][q] for m in ("ttft_s", "tpot_s", "e2e_s")
                            for q in ("p50", "p90")}})
    return pd.DataFrame(rows)
