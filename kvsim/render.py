"""Rows of dicts as a rich table, CSV, JSON or Markdown: the CLI's output formats in one place."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
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
    lines += ["| " + " | ".join(_cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def rows_to_rich(rows: Sequence[dict[str, Any]], title: str = ""):  # -> rich.table.Table
    """A rich Table; rich is imported here so that `import kvsim` stays light."""
    from rich.table import Table

    table = Table(title=title or None)
    cols = list(rows[0]) if rows else []
    for c in cols:
        table.add_column(c, justify="right" if isinstance(rows[0][c], (int, float)) else "left")
    for r in rows:
        table.add_row(*(_cell(r[c]) for c in cols))
    return table


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False) + "\n"
