"""Per-step rows streamed to disk in chunks, so a run never holds all of them in memory.

    writer = StepWriter(folder, "auto")    # steps.parquet with pyarrow installed, else steps.csv
    writer.write({"time_s": array, ...})   # one chunk: a Parquet row group, or CSV lines appended
    writer.close()

Parquet keeps every column's dtype (int64 or float64) and writes one row group per chunk;
pyarrow is an optional extra (`pip install 'kvsim[parquet]'`), and without it the rows go to
CSV, formatted exactly as `DataFrame.to_csv` formats the whole table (the header once), by the
csv module: writing needs no pandas (`kvsim run` never imports it).
Write into the temporary folder of `kvsim.results.output_dir.output_directory`: the file appears at
the output path only when the run has completed.
"""

from __future__ import annotations

import csv
import io
import math
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import numpy as np

from kvsim.model.errors import KvsimError
from kvsim.results import csv_arrow
from kvsim.results.csv_arrow import arrow_array

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
    """`auto` → parquet when pyarrow is importable, else csv; `parquet` without pyarrow, or another value, is an
    error (`RunResult.write(path, "xlsx")` wrote CSV text into steps.xlsx)."""
    if fmt not in ("auto", "parquet", "csv"):
        raise KvsimError(f"steps_format={fmt!r}: expected auto, parquet or csv")
    if fmt == "auto":
        return "parquet" if has_pyarrow() else "csv"
    if fmt == "parquet" and not has_pyarrow():
        raise KvsimError("steps_format=parquet needs pyarrow: pip install 'kvsim[parquet]' (or use csv)")
    return fmt


CSV_CHUNK_ROWS = 4096  # rows formatted at a time: Python objects for this many rows, however long the table
# a table with a column that is not float64/int/bool (the requests table's status): its texts are kept
# for fewer rows at a time, ~1.5 KB a row (its strings), so that writing it adds little to a run's peak
CSV_MIXED_CHUNK_ROWS = 512

Columns = Mapping[str, np.ndarray]


def _csv_fields(values: np.ndarray) -> list[Any]:
    """One column's fields as `DataFrame.to_csv` writes them (float64 through numpy's `astype(str)`,
    which for a float64 is Python's `repr`: the shortest text that reads back to the same double;
    ints and bools as `str`; NaN and None as empty fields); `csv.writer` stringifies the rest."""
    # float64's Python repr is numpy's str (and the fast path); other floats take numpy's own text.
    fields = values.astype(str).tolist() if values.dtype.kind == "f" and values.dtype != np.float64 else values.tolist()
    if values.dtype.kind == "f":
        for i in np.flatnonzero(np.isnan(values)).tolist():
            fields[i] = ""
    elif values.dtype.kind == "O":  # strings, None or NaN (pandas' missing value)
        fields = ["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in fields]
    else:
        assert values.dtype.kind in "iub", f"no CSV formatting for dtype {values.dtype}"
    return fields


class _Texts(dict[float, str]):
    """One float64 column's field texts by value (repr; NaN → ""), kept across the chunks of a table:
    step columns (usage, waste shares, durations) repeat values from chunk to chunk, and a float's
    repr is the costliest part of a row (a 17-digit repr takes thousands of instructions). At most
    `TEXTS_KEPT` values are kept, then they become the older generation (`older`, looked up before a
    repr) and it starts again: so memory stays bounded however long the run, and a column whose values
    drift (the KV usage of a long run) keeps its recent ones (measured: Azure's usage column 0.018 →
    0.014 s, against starting again from nothing)."""

    __slots__ = ("older",)

    def __init__(self) -> None:
        super().__init__()
        self.older: dict[float, str] = {}

    def __missing__(self, value: float) -> str:
        text = self.older.get(value)
        if text is None:
            text = "" if value != value else float.__repr__(value)  # value != value: NaN
        if len(self) >= TEXTS_KEPT:  # a new generation: the values of the run's recent steps are the likely ones
            self.older = dict(self)
            self.clear()
        self[value] = text
        return text


TEXTS_KEPT = 1 << 12  # per float column and generation: at most a few hundred KiB each


def _csv_text(field: Any) -> str:
    """`csv.writer`'s text for one field of a row of several fields, whatever QUOTE_MINIMAL decides for
    it (a comma, a quote or a line break: quoted, quotes doubled; an empty field stays empty): the row
    `[field, ""]` is that text, a comma and the line end, and a field's text never depends on its row."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow([field, ""])
    return buffer.getvalue()[:-2]


class _FieldTexts(dict[str, str]):
    """`_csv_text` of string fields by value, for one call's object columns (strings repeat: a status,
    a reject reason); at most `TEXTS_KEPT` kept (then it starts again)."""

    __slots__ = ()

    def __missing__(self, field: str) -> str:
        text = _csv_text(field)
        if len(self) >= TEXTS_KEPT:
            self.clear()
        self[field] = text
        return text


def _object_texts(values: np.ndarray, texts: _FieldTexts) -> list[str]:
    """Any column that is not float64, int or bool (strings, None, float32, ...) as the field texts
    `csv.writer` writes for `_csv_fields(values)` in a row of several fields; strings through `texts`."""
    return [texts[field] if type(field) is str else _csv_text(field) for field in _csv_fields(values)]


def _numeric_texts(values: np.ndarray, texts: _Texts | None = None) -> list[str]:
    """A float64, int or bool column's fields as text, exactly what `csv.writer` makes of
    `_csv_fields(values)` (repr of each float, str of each int or bool, NaN as "").

    Hot (every step row, ~20 columns): most step columns repeat few values (counts, usage), so
    each distinct value is formatted once (`np.unique`) and the texts are gathered back, a float's
    text looked up in `texts` (the table's earlier chunks) before it is formatted; a column of
    mostly distinct values (over 3/4 distinct; a strictly increasing one, times, without sorting it)
    is formatted value by value. -0.0 equals 0.0 for `np.unique` and a dict but prints differently,
    so a float column holding one takes the value-by-value path. (Measured in CPU time: looking up
    every float of a mostly distinct column costs more than its repr saves.) A column holding one value
    throughout (a float's bits, so that -0.0 is not 0.0) is formatted once (7 of Azure's 20 step columns).
    """
    is_float = values.dtype.kind == "f"
    if len(values) > 1 and values[0] == values[-1]:  # maybe one value throughout (swaps, preemptions, slack)
        same = values.view(np.int64) if is_float else values  # floats by their bits: -0.0 is not 0.0
        if bool(np.all(same == same[0])):
            return [_numeric_texts(values[:1], texts)[0]] * len(values)
    if not (is_float and (bool(np.all(values[1:] > values[:-1]))  # strictly increasing (times): all distinct
                          or bool(np.any(np.signbit(values) & (values == 0))))):
        distinct, inverse = np.unique(values, return_inverse=True)
        if 4 * len(distinct) <= 3 * len(values):  # measured: still faster than a repr each at 3/4 distinct
            to_text = (texts if texts is not None else _Texts()).__getitem__ if is_float else str
            return np.array(list(map(to_text, distinct.tolist())), dtype=object)[inverse.reshape(-1)].tolist()
    fields = list(map(float.__repr__ if is_float else str, values.tolist()))
    if is_float:
        for i in np.flatnonzero(np.isnan(values)).tolist():
            fields[i] = ""
    return fields


def unquoted_texts(values: np.ndarray) -> bool:
    """Whether `values` is an object column of None and texts that `csv.writer` writes as they are and
    pyarrow's writer takes unquoted (ASCII, no comma, quote or line break): a status, a reject reason without
    a comma. Such a table's rows can be assembled by `kvsim.results.csv_arrow` (None as an empty field)."""
    if values.dtype.kind != "O":
        return False
    fields = values.tolist()
    if not all(field is None or type(field) is str for field in fields):
        return False
    return all(text.isascii() and not _STRUCTURAL.intersection(text) and _csv_text(text) == text
               for text in set(fields) - {None})


_STRUCTURAL = frozenset(',"\r\n')  # characters pyarrow's writer refuses in an unquoted field


def append_csv(columns: Columns, f: IO[str], header: bool, texts: list[_Texts] | None = None,
               table_rows: int | None = None, binary: csv_arrow.BytesSink | None = None) -> None:
    """Write `columns` (name → equal-length 1-d array) as CSV rows to `f`, the header first if `header`:
    byte for byte `pandas.DataFrame(columns).to_csv(f, header=header, index=False)` (QUOTE_MINIMAL,
    "\\n" line ends), without pandas, `CSV_CHUNK_ROWS` rows at a time (`CSV_MIXED_CHUNK_ROWS` for a
    table with a column that is not float64, int or bool).

    Tables of two or more columns skip `csv.writer` for their rows: each chunk is its fields' texts
    joined, the same bytes in about half the time. A float64, int or bool column's texts never need
    quoting (`_numeric_texts`); any other column's are `csv.writer`'s per field (`_object_texts`:
    in a row of several fields a field's text depends on that field alone). (One column is left to
    `csv.writer`: it writes an empty lone field as `""`.)
    `texts`: one `_Texts` per column, kept by the caller from one call to the next (`StepWriter`
    appends a table a chunk at a time), so repeated floats are formatted once per table.
    `table_rows`: the whole table's length as far as the caller knows (default: these rows). A table of
    two or more float64, int and bool columns (and object columns of texts that need no quoting:
    `unquoted_texts`) long enough to repay importing pyarrow, or once it is imported, is assembled by it
    instead (`kvsim.results.csv_arrow`): the same bytes, in less than half the time; `binary` (`f.buffer`, where
    `f` is a UTF-8 file opened with `newline=""`) then takes them as bytes (`csv_arrow.write_rows`).
    """
    writer = csv.writer(f, lineterminator="\n")
    if header:
        writer.writerow(columns.keys())
    arrays = [np.asarray(values) for values in columns.values()]
    num_rows = len(arrays[0]) if arrays else 0
    if texts is None:
        texts = [_Texts() for _ in arrays]
    field_texts = _FieldTexts()

    def is_numeric(values: np.ndarray) -> bool:
        return values.dtype == np.float64 or values.dtype.kind in "iub"

    def column_texts(values: np.ndarray, float_texts: _Texts) -> list[str]:
        return _numeric_texts(values, float_texts) if is_numeric(values) else _object_texts(values, field_texts)

    all_numeric = all(map(is_numeric, arrays))
    if (len(arrays) >= 2 and num_rows and all(is_numeric(values) or unquoted_texts(values) for values in arrays)
            and csv_arrow.worth_using(table_rows or num_rows)):
        csv_arrow.write_rows(arrays, f, binary)
        return
    chunk_rows = CSV_CHUNK_ROWS if all_numeric else CSV_MIXED_CHUNK_ROWS
    for start in range(0, num_rows, chunk_rows):
        chunks = [a[start:start + chunk_rows] for a in arrays]
        if len(arrays) >= 2:
            f.write("\n".join(map(",".join, zip(*map(column_texts, chunks, texts), strict=True))))
            f.write("\n")
        else:
            writer.writerows(zip(*map(_csv_fields, chunks), strict=True))


def write_csv(columns: Columns, path: Path) -> None:
    """A new CSV file at `path` holding `columns` (see `append_csv`)."""
    with path.open("w", newline="", encoding="utf-8") as f:
        append_csv(columns, f, header=True, binary=f.buffer)


def frame_columns(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """A DataFrame's columns as numpy arrays (what `append_csv` takes)."""
    return {str(name): frame[name].to_numpy() for name in frame.columns}


class StepWriter:
    """Appends chunks of step rows (a dict of equal-length numpy columns) to `folder/NAME.parquet|csv`."""

    def __init__(self, folder: Path, fmt: StepsFormat = "auto", name: str = "steps") -> None:
        self.format = resolve_format(fmt)
        self.path = Path(folder) / f"{name}.{self.format}"
        self.num_rows = 0
        self.write_s = 0.0  # wall seconds spent writing (a benchmark's simulate/write split)
        self._parquet: Any = None  # pyarrow.parquet.ParquetWriter, opened on the first chunk
        self._csv: io.TextIOWrapper | None = None
        self._texts: list[_Texts] | None = None  # CSV: each column's texts, kept from chunk to chunk

    def write(self, chunk: Mapping[str, np.ndarray]) -> None:
        """Append one chunk; every chunk must have the same columns in the same order."""
        start_s = time.perf_counter()
        num_rows = len(next(iter(chunk.values()), ()))
        if self.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_arrays([arrow_array(v) for v in chunk.values()], names=list(chunk))
            if self._parquet is None:
                # No dictionary encoding: steps are mostly distinct floats, and building dictionaries
                # doubled the write time (10k-request bench run: 92 -> 52 ms) for a file 15 % smaller.
                self._parquet = pq.ParquetWriter(self.path, table.schema, use_dictionary=False)
            self._parquet.write_table(table)
        else:
            first = self._csv is None
            if self._csv is None:
                self._csv = self.path.open("w", newline="", encoding="utf-8")
                self._texts = [_Texts() for _ in chunk]
            append_csv(chunk, self._csv, header=first, texts=self._texts, table_rows=self.num_rows + num_rows,
                       binary=self._csv.buffer)
        self.num_rows += num_rows
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


def concat_step_files(parts: list[Path], dest: Path) -> None:
    """Concatenate step files written by `StepWriter`s (same columns, same format as `dest`) into `dest`,
    in the order given, a row group or a line at a time (memory stays bounded), and remove the parts."""
    if dest.suffix == ".parquet":
        import pyarrow.parquet as pq

        writer = None
        for part in parts:
            source = pq.ParquetFile(part)
            if writer is None:
                writer = pq.ParquetWriter(dest, source.schema_arrow, use_dictionary=False)
            for index in range(source.num_row_groups):
                writer.write_table(source.read_row_group(index))
        if writer is not None:
            writer.close()
    else:
        with dest.open("w", newline="", encoding="utf-8") as out:
            for number, part in enumerate(parts):
                with part.open(newline="", encoding="utf-8") as f:
                    header = f.readline()
                    if number == 0:
                        out.write(header)
                    shutil.copyfileobj(f, out)
    for part in parts:
        part.unlink()
