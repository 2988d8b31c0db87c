"""What one study of the report found: its tables and the facts its text quotes.

A module of its own so that `kvsim.report.applicable` (which builds a skipped section) and the studies
(`kvsim.report.capacity_study`, `paging_study`, ..., whose comparisons ask `applicable` which variants an engine
takes) both use it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd


@dataclass
class Section:
    """A report section: `tables` (the CSVs behind its tables and figure), `facts` (quoted in its text; a
    comparison that left out variants this engine refuses keeps them in `facts["left_out"]`, setting →
    refusal), and `skipped`, this engine's refusal of the section's own setting (then nothing was run)."""

    key: str
    title: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None  # this engine's refusal of the section's setting: not run (`kvsim.report.applicable`)
