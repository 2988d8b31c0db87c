"""The box at the top of the report: the three answers a planner came for, read from the report's
own tables (nothing is simulated or computed anew here).

    users:  sustained concurrent sequences on one replica at the scenario's lengths (`kv_quantization`,
            the base KV dtype's row; the fp8 row beside it)
    rate:   the highest request rate one paged replica serves within the TTFT SLO (`sustained_rate`)
    fleet:  replicas and GPUs the fleet section's traffic needs within its TTFT target
            (`fleet_routing`, least-outstanding routing), "not verified" when no longer run held it, or that
            its probes were too short to judge any count (`--quick`'s are capped)

A figure a table lacks (a renamed column, a missing value) drops its line instead of printing a
wrong one; an empty box is left out.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvsim.model.units import counted, dollars
from kvsim.report import studies
from kvsim.report.section import Section

SIZING_ROUTER = "least_outstanding"


def _cell(sections: list[Section], table: str, key: str, value: Any, column: str) -> Any:
    """`column` of the row of `table` whose `key` is `value`; None when any of them is missing or NaN."""
    for sec in sections:
        df = sec.tables.get(table)
        if df is None or key not in df or column not in df:
            continue
        rows = df.loc[df[key] == value, column]
        if len(rows) and not pd.isna(rows.iloc[0]):
            return rows.iloc[0]
    return None


def _facts(sections: list[Section], key: str) -> dict[str, Any]:
    return next((s.facts for s in sections if s.key == key), {})


def _seconds(value: float) -> str:
    return f"{value:.3g} s"


def summary_lines(sections: list[Section], st: studies.Study, cfg: studies.StudyConfig) -> list[str]:
    """The box's sentences, in Markdown (bold for the answer), from the sections' tables."""
    engine, gpu = st.base.engine, st.gpu.name
    tp = engine.tensor_parallel_size
    replica = f"one {gpu}" if tp == 1 else f"one replica ({tp}× {gpu}, tensor parallel)"
    lines = []
    users = _cell(sections, "kv_quantization", "kv_cache_dtype", engine.kv_cache_dtype, "simulated_sustained_running")
    if users is not None:
        fp8 = _cell(sections, "kv_quantization", "kv_cache_dtype", "fp8", "simulated_sustained_running")
        also = f"; {fp8:,.0f} with fp8 KV" if fp8 is not None and engine.kv_cache_dtype != "fp8" else ""
        lines.append(f"**{users:,.0f} users fit on {replica}** at a time (sustained concurrency while "
                     f"saturated, {st.mean_kv_len:,.0f} tokens per sequence on average, max_model_len "
                     f"{st.max_model_len:,}){also}.")
    rate = _cell(sections, "sustained_rate", "allocator", "paged", "max_rate_meeting_slo")
    if rate is not None:
        failed = _cell(sections, "sustained_rate", "allocator", "paged", "first_failing_rate")
        bound = "" if failed is not None else "at least "
        lines.append(f"**{replica[0].upper()}{replica[1:]} serves {bound}{rate:.3g} requests/s** of this scenario's "
                     f"traffic with TTFT p90 ≤ {_seconds(cfg.ttft_slo_s)} (Poisson arrivals asked at that rate"
                     + (f"; {failed:.3g} requests/s misses it)." if failed is not None else ")."))
    fleet = _facts(sections, "fleet")
    if "ttft_target_s" in fleet:
        traffic = f"the {fleet['trace'].name} trace's first {fleet.get('num_requests', '?')} requests"
        target = f"TTFT p90 ≤ {_seconds(fleet['ttft_target_s'])}"
        gpus = _cell(sections, "fleet_routing", "router", SIZING_ROUTER, "gpus_for_slo")
        replicas = _cell(sections, "fleet_routing", "router", SIZING_ROUTER, "replicas_for_slo")
        if gpus is not None and replicas is not None:
            cost = _cell(sections, "fleet_routing", "router", SIZING_ROUTER, "cost_per_hour_for_slo")
            price = f", {dollars(cost, 2, widen=False)} per hour" if cost is not None else ""
            verified = _cell(sections, "fleet_routing", "router", SIZING_ROUTER, "verified_10x")
            asked = fleet.get("verify_factor")  # the long run's length factor (0: none asked for)
            unverified = ("; probes alone, not verified by a longer run" if asked == 0 or (asked and not verified)
                          else "")
            lines.append(f"**{counted(round(gpus), 'GPU')} ({counted(round(replicas), 'replica')}) for {traffic}** "
                         f"at {target} (least-outstanding routing{price}{unverified}).")
        elif _cell(sections, "fleet_routing", "router", SIZING_ROUTER, "probes_too_short"):
            lines.append(f"**No fleet sized for {traffic}** at {target}: its probes were too short to judge one (see "
                         "the fleet section).")
        elif "max_replicas" in fleet:
            lines.append(f"**More than {counted(fleet['max_replicas'], 'replica')} for {traffic}** at {target}: the "
                         "search stopped at its limit without meeting it (see the fleet section).")
    return lines


def summary_markdown(sections: list[Section], st: studies.Study, cfg: studies.StudyConfig) -> list[str]:
    """The box as Markdown quote lines (`> ...`), or nothing when no line could be read."""
    lines = summary_lines(sections, st, cfg)
    return ["> **At a glance**", ">", *(f"> - {line}" for line in lines), ""] if lines else []
