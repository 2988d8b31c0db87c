"""Rows of dicts as a rich table, CSV, JSON or Markdown: the CLI's output formats in one place."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

FIXED_POINT_BELOW = 1e15  # a float from this size up prints with an exponent: `{:,.0f}` spelt 1e305 in 306 digits


def cell_text(value: Any) -> str:
    """A table's cell: a float to 4 significant digits, whole from 10,000 and with an exponent from
    `FIXED_POINT_BELOW` (a price per million tokens at `gpu_hourly_cost` 1e305 filled the table with digits)."""
    if value is None or (isinstance(value, float) and value != value):  # None or NaN
        return ""
    if isinstance(value, float):
        return f"{value:,.4g}" if not 1e4 <= abs(value) < FIXED_POINT_BELOW else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def rows_to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """Plain CSV (no thousands separators), columns in the first row's order."""
    if not rows:
        return ""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def rows_to_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """A GitHub-flavoured Markdown table, numbers right-aligned."""
    if not rows:
        return ""
    cols = list(rows[0])
    align = ["---:" if isinstance(rows[0][c], (int, float)) else "---" for c in cols]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cell_text(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def rows_to_rich(rows: Sequence[dict[str, Any]], title: str = "", width: int | None = None):
    """A rich renderable of `rows` for a terminal `width` columns wide [the terminal's]: one table when every
    column fits its longest word, else one small field/value table per row, so that no header or value is
    ever broken mid-word (a planner reads `lower_bound_replicas`, not `lower_` / `bound_`). Every header, value
    and the title print as the text they are, whatever console prints them: a scenario, GPU or file name holding
    `[bold]` was rich markup there, and one holding `[/]` stopped the command with a MarkupError. rich is imported
    here so that `import kvsim` stays light."""
    from rich.console import Console, Group
    from rich.table import Table
    from rich.text import Text

    cols = list(rows[0]) if rows else []
    width = width or Console().width
    cells = {c: [c, *(cell_text(r[c]) for r in rows)] for c in cols}
    longest_words = [max(len(word) for text in cells[c] for word in (text.split() or [""])) for c in cols]
    if not cols or sum(longest_words) + 3 * len(cols) + 1 <= width:
        table = Table(title=Text(title) if title else None)
        for c in cols:  # "fold": a narrow terminal wraps headers and values instead of cutting them short
            table.add_column(Text(c), justify="right" if isinstance(rows[0][c], (int, float)) else "left",
                             overflow="fold")
        for r in rows:
            table.add_row(*(Text(cell_text(r[c])) for c in cols))
        return table
    records = []
    for i, r in enumerate(rows, start=1):
        record = Table(title=Text(f"{title} ({i} of {len(rows)})" if title else f"{i} of {len(rows)}"),
                       show_header=False)
        record.add_column("field", no_wrap=True)
        record.add_column("value", overflow="fold")
        for c in cols:
            record.add_row(Text(c), Text(cell_text(r[c])))
        records.append(record)
    return Group(*records)


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False) + "\n"


def _sustained(saturated: dict[str, Any]) -> str:
    """The saturated block in words: "not saturated" with the reason when its averages are None."""
    if saturated["mean_running"] is None:
        return f"not saturated ({saturated['reason']})"
    return (f"{saturated['mean_running']:.1f} running, {saturated['preemptions_per_s']:.3g} preemptions/s "
            f"over {saturated['duration_s']:.2f} s queued")


def all_rejected(summary: dict[str, Any]) -> str | None:
    """One line for a run (one engine or a fleet) that rejected every request, else None: vLLM answers a
    request it can never serve (a prompt past max_model_len, more blocks than the pool) with HTTP 400 and
    goes on, and so does kvsim, but a run that served nothing is rarely the one meant. Some rejections
    among served requests are a result, not a warning: the summary counts them."""
    total, rejected = summary.get("num_requests", 0), summary.get("num_rejected", 0)
    if not total or rejected != total:
        return None
    why = "; ".join(f"{reason} ({n:,})" for reason, n in summary["reject_reasons"].items())
    return (f"every request was rejected ({rejected:,} of {total:,}: {why}), as vLLM rejects them (HTTP 400); "
            "nothing was served, so the latency and throughput figures are empty")


def summary_table(summary: dict[str, Any]):  # -> rich.table.Table
    """The run summary as a two-column rich table: configuration, throughput, latency, KV."""
    from rich.table import Table

    def pct(d: dict[str, Any]) -> str:
        if d.get("mean") is None:
            return "-"
        return f"mean {d['mean']:.4g}  p50 {d['p50']:.4g}  p90 {d['p90']:.4g}  p99 {d['p99']:.4g}"

    waste, usage = summary["waste"], summary["kv_cache_usage_perc"]
    scheduler = summary["scheduler"] + (" (async scheduling)" if summary.get("async_scheduling") else "")
    rows = [
        ("scenario", f"{summary['scenario']}: {summary['model']} on {summary['gpu']}, "
                     f"{summary['allocator']} / {scheduler}, latency {summary['latency_model']}"),
        ("requests", f"{summary['num_finished']:,} finished, {summary['num_rejected']:,} rejected "
                     f"of {summary['num_requests']:,} in {summary['duration_s']:.2f} s simulated"),
        ("throughput", f"{summary['requests_per_s']:.3g} req/s, {_rate(summary['output_tokens_per_s'])} output tok/s"),
        ("TTFT (s)", pct(summary["ttft_s"])),
        ("TPOT (s)", pct(summary["tpot_s"])),
        ("E2E (s)", pct(summary["e2e_s"])),
        ("queue (s)", pct(summary["queue_s"])),
        *([("client queue (s)", pct(summary["client_queue_s"]))] if "client_queue_s" in summary else []),
        ("running", f"max {summary['max_running']}, mean {summary['mean_running']:.1f}"),
        ("sustained (while queued)", _sustained(summary["saturated"])),
        ("KV usage", f"mean {usage['mean']:.1%}, max {usage['max']:.1%} of {summary['num_gpu_blocks']:,} blocks"),
        ("preemptions",
         f"{summary['num_preemptions']:,} (swapped out {summary['swapped_out_bytes'] / 2**30:,.2f} GiB)"),
        ("prefix cache hit rate", f"{summary['prefix_cache_hit_rate']:.1%}"),
        ("memory saved by sharing", f"{summary['sharing_saving']:.1%} (samples, beams and prefix hits)"),
        *([("KV offload", _offload(summary["kv_offload"]))] if "kv_offload" in summary else []),
        ("KV waste (of pool)", "  ".join(f"{k} {v:.1%}" for k, v in waste.items() if v is not None)),
        ("token states of allocated KV", f"{(summary['waste_of_allocated']['token_state'] or 0):.1%}"),
    ]
    table = Table(show_header=False, title="kvsim run")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


def _offload(offload: dict[str, Any]) -> str:
    """`engine.kv_offload`'s loads and stores: the prompt tokens its tiers served, which the prefix cache's hit
    rate leaves out (all of them with prefix caching off, where that rate is 0)."""
    loads = offload["num_loads"]
    return (f"{loads:,} load{'s' * (loads != 1)}, {offload['recompute_avoided_tokens']:,} prompt tokens loaded "
            f"instead of computed; {offload['bytes_stored'] / 2**30:,.2f} GiB stored")


FLEET_ROWS_SHOWN = 8  # a larger fleet prints its spread across replicas (min, median, max), not every row


def fleet_table(summary: dict[str, Any]):  # -> rich.table.Table
    """A fleet summary: fleet-wide latency and totals in the title, then one row per replica, or, past
    `FLEET_ROWS_SHOWN` replicas, the minimum, median and maximum of each column across replicas (every
    replica's row is in `replicas.csv`); with KV offload tiers, their books over the fleet under it, in the words
    of one engine's `KV offload` row (`_offload`). Fractions print as percentages and times in ms or s, short enough
    for 80 columns; the GPU is named once when every replica has the same."""
    import statistics

    from rich import box
    from rich.table import Table

    def p90(d: dict[str, Any]) -> str:
        return "-" if d.get("p90") is None else f"{d['p90']:.4g}"

    rows = summary["per_replica"]
    gpus = sorted({row["gpu"] for row in rows})
    on = f" on {gpus[0]}" if len(gpus) == 1 else ""
    table = Table(title=f"kvsim fleet: {summary['num_replicas']} replicas ({summary['num_gpus']} GPUs{on}), "
                        f"router {summary['router']}; {summary['num_finished']:,} of {summary['num_requests']:,} "
                        f"finished in {summary['duration_s']:.2f} s; TTFT p90 {p90(summary['ttft_s'])} s, "
                        f"TPOT p90 {p90(summary['tpot_s'])} s, prefix hits {summary['prefix_cache_hit_rate']:.1%}"
                        + (f", client queue p90 {p90(summary['client_queue_s'])} s" if "client_queue_s" in summary
                           else ""),
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    shares = {"kv_cache_usage_mean": "KV\nuse", "prefix_cache_hit_rate": "prefix\nhits"}
    times = {"ttft_p90_s": "TTFT\np90", "tpot_p90_s": "TPOT\np90", "e2e_p90_s": "E2E\np90"}
    counts = {"num_requests": "requests", "mean_running": "mean\nrunning", "num_preemptions": "preempt"}
    spread = len(rows) > FLEET_ROWS_SHOWN
    table.add_column("" if spread else "#", justify="left" if spread else "right", no_wrap=True)
    if not on:
        table.add_column("gpu", no_wrap=True)
    for label in [*counts.values(), *shares.values(), *times.values()]:
        table.add_column(label, justify="right", no_wrap=True)

    def cells(row: dict[str, Any]) -> list[str]:
        return ([cell_text(row[c]) for c in counts] + [_share(row[c]) for c in shares]
                + [_duration(row[c]) for c in times])

    scaled = summary.get("autoscaling")
    billed = (f"autoscaled: the replicas ever ready; billed {scaled['gpu_hours']:.3g} GPU-hours, "
              f"{scaled['mean_gpus']:.3g} GPUs on average" if scaled else None)
    # the replicas' tiers together, as `summary_table`'s row says one engine's (the prefix hits leave them out)
    offload = f"KV offload: {_offload(summary['kv_offload'])}" if "kv_offload" in summary else None
    if not spread:
        for row in rows:
            table.add_row(str(row["replica"]), *([] if on else [row["gpu"]]), *cells(row))
        table.caption = "\n".join(filter(None, [billed, offload])) or None
        return table
    for name, pick in (("min", min), ("p50", statistics.median), ("max", max)):
        picked = {c: _finite_pick(pick, [row[c] for row in rows]) for c in [*counts, *shares, *times]}
        table.add_row(name, *([] if on else [", ".join(gpus)]), *cells(picked))
    table.caption = "\n".join(filter(None, ["; ".join(filter(None, [
        f"across the {len(rows)} replicas; one row per replica: replicas.csv", billed])), offload]))
    return table


def _finite_pick(pick: Any, values: list[Any]) -> Any:
    """`pick` (min, median, max) over the values a replica has (a replica that served nothing has None)."""
    present = [v for v in values if v is not None and v == v]
    return pick(present) if present else None


def _share(value: Any) -> str:
    return "" if value is None or value != value else f"{value:.1%}"


def _duration(value: Any) -> str:
    """Seconds, shown in ms below one second (3 significant digits)."""
    if value is None or value != value:
        return ""
    return f"{value * 1e3:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"


def _rate(per_s: float) -> str:
    """A rate as a whole number with thousands separators from 1 a second up (`2,697`), to 3 significant digits
    below it: a run at 1e-9 req/s served 1.7e-07 output tokens a second, printed as `0 output tok/s`."""
    return f"{per_s:,.0f}" if per_s >= 1 or per_s == 0 else f"{per_s:.3g}"
