"""Per-step rows streamed to disk in chunks, so a run never holds all of them in memory.

    writer = StepWriter(folder, "auto")    # steps.parquet with pyarrow installed, else steps.csv
    writer.write({"time_s": array, ...})   # one chunk: a Parquet row group, or CSV lines appended
    writer.close()

Parquet keeps every column's dtype (int64 or float64) and writes one row group per chunk;
pyarrow is an optional extra (`pip install 'kvsim[parquet]'`), and without it the rows go to
CSV, formatted exactly as `DataFrame.to_csv` formats the whole table (the header once).
Write into the temporary folder of `kvsim.output_dir.output_directory`: the file appears at
the output path only when the run has completed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import numpy as np

from kvsim.errors import KvsimError

if TYPE_CHECKING:
    import pandas as pd

StepsFormat = Literal["auto", "parquet", "csv"]


def has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_format(fmt: StepsFormat) -> Literal["parquet", "csv"]:
    """`auto` → parquet when pyarrow is importable, else csv; `parquet` without pyarrow is an error."""
    if fmt == "auto":
        return "parquet" if has_pyarrow() else "csv"
    if fmt == "parquet" and not has_pyarrow():
        raise KvsimError("steps_format=parquet needs pyarrow: pip install 'kvsim[parquet]' (or use csv)")
    return fmt


CSV_CHUNK_ROWS = 2048  # rows pandas formats at a time (its own default, 100,000 values, is 5,000 rows)


def append_csv(frame: pd.DataFrame, f: IO[str], header: bool) -> None:
    """`frame.to_csv(f, header=header, index=False)`, formatted `CSV_CHUNK_ROWS` rows at a time:
    the same text, through a small buffer however long the table."""
    for start in range(0, max(len(frame), 1), CSV_CHUNK_ROWS):
        frame.iloc[start:start + CSV_CHUNK_ROWS].to_csv(f, header=header and start == 0, index=False)


def frame_to_csv(frame: pd.DataFrame, path: Path) -> None:
    """`frame.to_csv(path, index=False)` through `append_csv`."""
    with path.open("w", newline="") as f:
        append_csv(frame, f, header=True)


class StepWriter:
    """Appends chunks of step rows (a dict of equal-length numpy columns) to `folder/NAME.parquet|csv`."""

    def __init__(self, folder: Path, fmt: StepsFormat = "auto", name: str = "steps") -> None:
        self.format = resolve_format(fmt)
        self.path = Path(folder) / f"{name}.{self.format}"
        self.num_rows = 0
        self.write_s = 0.0  # wall seconds spent writing (a benchmark's simulate/write split)
        self._parquet: Any = None  # pyarrow.parquet.ParquetWriter, opened on the first chunk
        self._csv: IO[str] | None = None

    def write(self, chunk: Mapping[str, np.ndarray]) -> None:
        """Append one chunk; every chunk must have the same columns in the same order."""
        start_s = time.perf_counter()
        if self.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.table(dict(chunk))
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(self.path, table.schema)
            self._parquet.write_table(table)
        else:
            import pandas as pd

            first = self._csv is None
            if self._csv is None:
                self._csv = self.path.open("w", newline="")
            append_csv(pd.DataFrame(dict(chunk)), self._csv, header=first)
        self.num_rows += len(next(iter(chunk.values()), ()))
        self.write_s += time.perf_counter() - start_s

    def close(self, columns: Mapping[str, np.dtype] | None = None) -> None:
        """Finish the file; with no rows written, an empty table with `columns` (name → dtype)."""
        if self._parquet is None and self._csv is None and columns is not None:
            self.write({name: np.zeros(0, dtype=dtype) for name, dtype in columns.items()})
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        if self._csv is not None:
            self._csv.close()
            self._csv = None
