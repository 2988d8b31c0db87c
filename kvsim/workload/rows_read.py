"""A trace file's rows parsed once per process: `read_rows` is `ROW_READERS[format](path, columns)`, kept by content.

A plan or a report runs one trace many times: the report's fleet section read the shipped Azure conversation trace
(19,000 rows, 0.44 CPU s a parse) 18 times for a 12-request test report, 94 % of that section's CPU. The rows
kept are keyed by the format, the columns read and a digest of the file's bytes, never its time stamp (a rewrite
within the clock's tick keeps one), so a changed file is parsed anew, and a file that fails to parse is not kept
(its error is raised on every read, as before). `TraceRecord`s are frozen; each call gets a list of its own.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kvsim.workload.traces import ROW_READERS, TraceColumns, TraceRecord

MOST_KEPT = 4  # traces kept (the oldest goes first): a report reads two, a plan one
_kept: dict[tuple[str, TraceColumns, str], tuple[TraceRecord, ...]] = {}


def read_rows(path: Path, trace_format: str, columns: TraceColumns) -> list[TraceRecord]:
    """The rows of the `trace_format` file `path` (a key of `ROW_READERS`) with `columns`, exactly as its reader
    returns them; the reader's errors (and `OSError` for a file that cannot be read) as it raises them."""
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "blake2b").hexdigest()
    key = (trace_format, columns, digest)
    rows = _kept.get(key)
    if rows is None:
        rows = tuple(ROW_READERS[trace_format](path, columns))
        while len(_kept) >= MOST_KEPT:
            del _kept[next(iter(_kept))]
        _kept[key] = rows
    return list(rows)
