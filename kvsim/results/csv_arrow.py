"""CSV rows of a float64/int/bool (and plain text) table written by pyarrow's CSV writer: `step_writer.append_csv`'s
bytes, faster.

`append_csv` spends most of a long step table's time on Python objects: a `float.__repr__` per mostly
distinct float (times, durations: ~0.5 µs each) and a join per row. Here pyarrow's CSV writer
(`pyarrow.csv.write_csv`, quoting none) formats the numbers and joins the rows in C++ (a 120k-step table:
~0.45 → ~0.15 CPU s, after ~0.05 s to import pyarrow, so only long tables come here: `worth_using`).
It needs no `pyarrow.compute`, whose import (~200 M instructions: it wraps every compute function in
Python) the casts and joins of an earlier version paid for; the writer formats as fast (the Mooncake
bench run writing steps.csv: 14.56 → 14.31 G instructions, the same bytes). Each column goes
to the writer as

* ints: the int array (decimal digits, as `str`), or where its values span at most a quarter as many
  integers as it has rows (counts: running, waiting, preemptions), a dictionary of the texts of every
  integer of that span, each formatted once by the writer: taking a row's text from a dictionary costs a
  third of formatting it (the Mooncake bench run's steps.csv: 13.40 → 13.34 G instructions, the same bytes);
  bools: "False"/"True" (a dictionary of the two texts); object columns of texts that need no quoting
  (`step_writer.unquoted_texts`: a request's status): the texts, None as "" (requests.csv: its floats' texts
  by the writer rather than by `float.__repr__`, ~5x dearer);
* floats of few distinct values (at most half distinct: usage shares, mostly-zero fragmentation
  columns): a dictionary of each distinct value's text, each formatted once (`_texts_of`);
* other floats: the float array, whose text is Python's where the layouts agree. Both print the
  shortest decimal that reads back to the same double, and of two such the nearer (pyarrow through
  double-conversion, Python's repr through Gay's `dtoa` mode 0), an exact tie to the even digit
  (2^33 + 1/128 = 8589934592.0078125 is "8589934592.007812" in both; double-conversion's bignum
  fallback rounds half to even "since this is what Gay seems to do"). The layout agrees where both write
  a plain decimal with a fraction: 1e-4 ≤ |x| < 1e10, not integral (`float.__repr__` switches to an
  exponent at 1e16 and below 1e-4, pyarrow 26 at 1e10 and below 1e-6, and pyarrow writes an integral
  960.0 as "960"). A row holding any other value (integral, zero, -0.0, tiny, huge, infinite, NaN) in
  such a column is written apart, those columns as `float.__repr__`'s text ("" for NaN); where writing them
  apart costs more than texts (`_split_pays`), those columns are each a dictionary of their distinct values' texts.
  A value's text in a dictionary is the writer's where it is plain, else `float.__repr__`'s ("" for NaN).

`formats_floats_as_python()` checks the writer against `float.__repr__` once per process on values at the
layout's edges, ties and ordinary fractions; a pyarrow that formats otherwise is not used (the rows are
then `append_csv`'s own). tests/test_csv_arrow.py compares both paths on fresh random doubles of every
layout and on a simulated fleet's steps.

`pa.array` of a Python list or str imports pandas (~0.2 s) to look for its types: arrays here are built
from their buffers (`arrow_array`, `string_array`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any, Protocol

import numpy as np

ARROW_MIN_ROWS = 32_768  # a table this long repays importing pyarrow (~0.05 s) within its first rows
ARROW_CHUNK_ROWS = 32_768  # rows assembled at a time: a recorder's chunk (`kvsim.engine.recorder.CHUNK_ROWS`) whole
DISTINCT_SAMPLE = 1_024  # `_few_distinct` looks at this many values before it sorts a whole column
INT_RANGE_SHARE = 4  # an int column spanning at most 1/4 as many values as it has rows is a dictionary
# a field of one more table costs the writer about what 80 rows of a column written as texts (`_texts_of`) cost:
# callgrind, ~60 k instructions a column a table (its cast; 100 one-row tables of 16 columns: 98 M) against ~740 a row
# (a 32,768-row steps chunk's time column as texts: +24 M)
SPLIT_FIELD_ROWS = 80
PLAIN_LOW, PLAIN_HIGH = 1e-4, 1e10  # |x| where both write a plain decimal (see the module docstring)

_checked: list[bool] = []  # formats_floats_as_python's answer, once per process


class BytesSink(Protocol):
    """Where `write_rows` can put bytes: a binary file (a text file's `buffer`)."""

    def write(self, data: Any, /) -> Any: ...


def worth_using(table_rows: int) -> bool:
    """Whether to assemble a numeric table of `table_rows` rows here: pyarrow is installed, formats floats
    as Python does, and is already imported or the table is long enough to repay importing it."""
    if table_rows < ARROW_MIN_ROWS and "pyarrow.csv" not in sys.modules:
        return False
    return formats_floats_as_python()


def formats_floats_as_python() -> bool:
    """pyarrow is importable and its CSV writer gives `float.__repr__`'s text for plain values (checked
    once: the edges of the plain range, ties between two shortest decimals, 17-digit and short fractions)."""
    if not _checked:
        try:
            import pyarrow as pa
            import pyarrow.csv  # noqa: F401  (the writer)
        except ImportError:
            _checked.append(False)
        else:
            probe = np.array([
                PLAIN_LOW, np.nextafter(PLAIN_LOW, 1.0), np.nextafter(PLAIN_HIGH, 0.0), 9999999999.999998,
                2.0**33 + 1 / 128, 2.0**33 + 3 / 128, 2.0**33 + 2.0**-19, 1073741824.25, 0.1 + 0.2, 1 / 3, 2 / 3,
                123.456, -0.5, 5e-4, 1.5e-4, -987654.321, 0.2945185379169278,
            ])
            table = pa.Table.from_arrays([arrow_array(probe)], names=["probe"])
            _checked.append(_csv_text([table]).splitlines() == list(map(float.__repr__, probe.tolist())))
    return _checked[0]


def write_rows(arrays: Sequence[np.ndarray], f: IO[str], binary: BytesSink | None = None) -> None:
    """The rows of `arrays` (float64, int or bool columns of equal length, two or more; or object columns of
    None and ASCII texts that need no quoting: `step_writer.unquoted_texts`) as `step_writer.append_csv` writes
    them: fields joined by ",", each row ending in "\\n".

    `binary`: the file under `f` (`f.buffer` of a UTF-8 file opened with `newline=""`, where a text's bytes are its
    ASCII bytes unchanged), which then takes the writer's bytes as they are, after `f` is flushed: no decode to
    a str and encode back, nor a copy of each chunk's ~5 MB (the Mooncake bench run's 20 MB steps.csv:
    ~0.02 CPU s)."""
    names = [str(k) for k in range(len(arrays))]
    if binary is not None:
        f.flush()  # what `f` holds (the header) goes first
    for start in range(0, len(arrays[0]), ARROW_CHUNK_ROWS):
        tables = _tables([a[start:start + ARROW_CHUNK_ROWS] for a in arrays], names)
        if binary is None:
            f.write(_csv_text(tables))
        else:
            binary.write(_csv_buffer(tables))


def _csv_text(tables: Iterator[Any] | list[Any]) -> str:
    """The CSV rows of `tables`, one after the other, as pyarrow's writer gives them: no header, no quotes
    (fields are numbers' texts, and texts that hold no comma, quote or line break), "\\n" line ends."""
    return _csv_bytes(tables).decode("ascii")


def _csv_bytes(tables: Iterator[Any] | list[Any]) -> bytes:
    """`_csv_text`'s bytes."""
    return _csv_buffer(tables).to_pybytes()


def _csv_buffer(tables: Iterator[Any] | list[Any]) -> Any:
    """`_csv_text`'s bytes in the pyarrow buffer the writer wrote them to."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    # a batch per table (the writer's default, 1,024 rows, casts each column per batch: ~0.1 M instructions each)
    options = pa_csv.WriteOptions(include_header=False, batch_size=ARROW_CHUNK_ROWS, quoting_style="none")
    sink = pa.BufferOutputStream()
    for table in tables:
        pa_csv.write_csv(table, sink, options)
    return sink.getvalue()


def _tables(chunk: list[np.ndarray], names: list[str]) -> Iterator[Any]:
    """`chunk`'s rows as pyarrow tables whose CSV texts, in order, are the rows' (module docstring): one
    table, or where float columns of mostly distinct values hold odd values (`_odd`), a table per run of
    rows without one and per row with one (those columns then their `float.__repr__` texts), or where that
    costs more (`_split_pays`), one table with those columns as texts."""
    import pyarrow as pa

    columns = [_column(values) for values in chunk]
    mixed = [k for k, column in enumerate(columns) if column is None]
    odd_rows = np.flatnonzero(np.logical_or.reduce([_odd(chunk[k]) for k in mixed])) if mixed else np.zeros(0)
    split = len(odd_rows) > 0 and _split_pays(len(odd_rows), len(chunk), len(mixed), len(chunk[0]))
    if len(odd_rows) and not split:
        for k in mixed:
            distinct, inverse = np.unique(chunk[k].view(np.int64), return_inverse=True)
            columns[k] = _texts_of(distinct, inverse.reshape(-1))
    if not split:
        yield pa.Table.from_arrays(columns, names=names)
        return
    start = 0
    for row in [*odd_rows.tolist(), len(chunk[0])]:
        for first, last, odd in ((start, row, False), (row, row + 1, True)):
            if first == last or first == len(chunk[0]):
                continue
            parts = [column.slice(first, last - first) if column is not None
                     else string_array([_python_text(float(chunk[k][first]))]) if odd
                     else arrow_array(chunk[k][first:last]) for k, column in enumerate(columns)]
            yield pa.Table.from_arrays(parts, names=names)
        start = row + 1


def _split_pays(num_odd_rows: int, num_columns: int, num_mixed: int, num_rows: int) -> bool:
    """Whether writing a chunk's odd rows apart (2 · `num_odd_rows` + 1 tables at most, of `num_columns` fields
    each) costs the writer less than writing its `num_mixed` mixed columns as texts, every row of each
    (`SPLIT_FIELD_ROWS`). A steps chunk of 32,768 rows and 20 columns with an integral time or two is written
    apart; the Mooncake bench's requests.csv (4,000 rows, 16 columns, 46 rows with a 0.0, an integral time or
    a NaN in 3 columns) as texts: 93 tables cost it ~159 M instructions."""
    return (2 * num_odd_rows + 1) * num_columns * SPLIT_FIELD_ROWS <= num_mixed * num_rows


def _column(values: np.ndarray) -> Any:
    """One column as the pyarrow array the writer formats as `append_csv` does, or None for a float column
    of mostly distinct values holding an odd value (`_tables` writes its rows apart)."""
    import pyarrow as pa

    if values.dtype.kind in "iu":
        low, high = (int(values.min()), int(values.max())) if len(values) else (0, 0)
        if (high - low + 1) * INT_RANGE_SHARE > len(values):
            return arrow_array(values)
        # counts (running, waiting, preemptions): entry k of the dictionary is the text of low + k, each
        # formatted once by the writer (cheaper than the writer's int-to-text cast of every row, measured)
        texts = _written(arrow_array(np.arange(low, high + 1, dtype=values.dtype)))
        offsets = (values.astype(np.int64, copy=False) - low if values.dtype.kind == "i"  # no int8 wrap-around
                   else (values - values.dtype.type(low)).astype(np.int64))  # a uint64 above int64's range
        return pa.DictionaryArray.from_arrays(arrow_array(offsets), texts)
    if values.dtype.kind == "b":
        return pa.DictionaryArray.from_arrays(arrow_array(values.view(np.int8)), string_array(["False", "True"]))
    if values.dtype.kind == "O":  # texts as they are (a status), None as an empty field
        return string_array(["" if text is None else text for text in values.tolist()])
    bits = values.view(np.int64)  # a float's bit pattern: -0.0 is not 0.0
    distinct = _few_distinct(bits)
    if distinct is not None:
        return _texts_of(distinct, np.searchsorted(distinct, bits))
    return None if _odd(values).any() else arrow_array(values)


def _odd(values: np.ndarray) -> np.ndarray:
    """Where a float column's values are outside the layout both write alike (module docstring)."""
    with np.errstate(invalid="ignore"):  # a signalling NaN's payload: it is odd, whatever numpy says of it
        magnitude = np.abs(values)
        return ~((magnitude >= PLAIN_LOW) & (magnitude < PLAIN_HIGH) & (values != np.trunc(values)))


def _texts_of(distinct_bits: np.ndarray, index: np.ndarray) -> Any:
    """A dictionary array: row i is `append_csv`'s text of the float whose bits are `distinct_bits[index[i]]`
    (distinct): the plain values' texts by the writer (module docstring), then the odd values' `_python_text`."""
    import pyarrow as pa

    distinct = distinct_bits.view(np.float64)
    odd = _odd(distinct)
    plain = distinct[~odd]
    dictionary = _written(arrow_array(plain), [_python_text(value) for value in distinct[odd].tolist()])
    position = np.empty(len(distinct), dtype=np.int64)  # distinct value j's entry: the plain ones first
    position[~odd] = np.arange(len(plain))
    position[odd] = np.arange(len(plain), len(distinct))
    return pa.DictionaryArray.from_arrays(arrow_array(position[index]), dictionary)


def _written(values: Any, more: Sequence[str] = ()) -> Any:
    """A string array: the writer's text of each value of the pyarrow array `values`, in order, then the texts
    `more` (ASCII): each value formatted once, for a dictionary whose entries many rows share."""
    import pyarrow as pa

    num_values = len(values)
    lines = np.frombuffer(_csv_bytes([pa.Table.from_arrays([values], names=["v"])]) if num_values else b"",
                          dtype=np.uint8)  # each value's text and "\n"
    newline = lines == ord("\n")
    encoded = [text.encode("ascii") for text in more]
    data = lines[~newline].tobytes() + b"".join(encoded)
    ends = np.flatnonzero(newline) - np.arange(num_values)  # where each text ends once the newlines are gone
    more_ends = len(lines) - num_values + np.cumsum(list(map(len, encoded)), dtype=np.int64)
    offsets = np.concatenate(([0], ends, more_ends))
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.string(), num_values + len(encoded), buffers)


def _python_text(value: float) -> str:
    """`append_csv`'s text of one float: its `float.__repr__`, "" for NaN."""
    return "" if value != value else float.__repr__(value)


def _few_distinct(values: np.ndarray) -> np.ndarray | None:
    """`values`' distinct values, sorted, if at most half of them are distinct, else None; decided first on
    the first `DISTINCT_SAMPLE` values (a column whose head is mostly distinct is left unsorted: times, durations).
    Sorted, not `np.unique`, which hashes and costs about as much as the texts it saves."""
    head = np.sort(values[:DISTINCT_SAMPLE])
    if 2 * (1 + np.count_nonzero(head[1:] != head[:-1])) > len(head):
        return None
    ordered = np.sort(values)
    distinct = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
    return distinct if 2 * len(distinct) <= len(values) else None


def string_array(texts: list[str]) -> Any:
    """A pyarrow string array of `texts` (ASCII), built from its buffers."""
    import pyarrow as pa

    encoded = [text.encode("ascii") for text in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum(list(map(len, encoded)), out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(encoded), buffers)


def arrow_array(values: np.ndarray) -> Any:
    """A numpy column as a pyarrow Array, the same as `pa.array(values)` gives: an int or float column wraps its
    buffer; any other dtype goes through `pa.array` (which imports pandas)."""
    import pyarrow as pa

    if values.dtype.kind in "iuf" and values.dtype.isnative:
        values = np.ascontiguousarray(values)
        return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])
    return pa.array(values)
