"""CSV rows of a float64/int/bool table assembled by pyarrow: `step_writer.append_csv`'s bytes, faster.

`append_csv` spends most of a long step table's time on Python objects: a `float.__repr__` per mostly
distinct float (times, durations: ~0.5 µs each) and a join per row. Here each column becomes a pyarrow
string array and the rows are joined in C (a 100k-step table: ~0.3 → ~0.12 CPU s, after ~0.07 s to
import pyarrow, so only long tables come here: `worth_using`):

* ints: pyarrow's cast (decimal digits, as `str`); bools: "True"/"False" (a column of bools gathers them);
* floats: pyarrow's cast, whose digits are Python's: both print the shortest decimal that reads back to
  the same double, and of two such the nearer (pyarrow through double-conversion, Python's repr through
  Gay's `dtoa` mode 0), an exact tie to the even digit (2^33 + 1/128 = 8589934592.0078125 is
  "8589934592.007812" in both; double-conversion's bignum fallback rounds half to even "since this is
  what Gay seems to do"). The layout agrees where both write a plain decimal with a fraction:
  1e-4 ≤ |x| < 1e10, not integral (`float.__repr__` switches to an exponent at 1e16 and below 1e-4,
  pyarrow 26 at 1e10 and below 1e-6, and pyarrow writes an integral 960.0 as "960"). Every other value
  (integral, zero, -0.0, tiny, huge, infinite, NaN) gets `float.__repr__`'s text ("" for NaN), each
  distinct bit pattern formatted once, put in place by mask. A column of few distinct values (a float
  column at most half distinct, an int column of one value) is formatted a distinct value at a time
  and its texts put in place (`_fields`).

`formats_floats_as_python()` checks the cast against `float.__repr__` once per process on values at the
layout's edges, ties and ordinary fractions; a pyarrow that formats otherwise is not used (the rows are
then `append_csv`'s own). tests/test_csv_arrow.py compares both paths on fresh random doubles of every
layout and on a simulated fleet's steps.

`pa.array` of a Python list or str imports pandas (~0.2 s) to look for its types: arrays here are built
from their buffers (`arrow_array`, `string_array`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

ARROW_MIN_ROWS = 32_768  # a table this long repays importing pyarrow (~0.07 s) within its first rows
ARROW_CHUNK_ROWS = 16_384  # rows assembled at a time (measured: 4k and 32k are slower)
DISTINCT_SAMPLE = 1_024  # `_few_distinct` looks at this many values before it sorts a whole column
PLAIN_LOW, PLAIN_HIGH = 1e-4, 1e10  # |x| where both write a plain decimal (see the module docstring)

_checked: list[bool] = []  # formats_floats_as_python's answer, once per process


def worth_using(table_rows: int) -> bool:
    """Whether to assemble a numeric table of `table_rows` rows here: pyarrow is installed, formats floats
    as Python does, and is already imported or the table is long enough to repay importing it."""
    if table_rows < ARROW_MIN_ROWS and "pyarrow.compute" not in sys.modules:
        return False
    return formats_floats_as_python()


def formats_floats_as_python() -> bool:
    """pyarrow is importable and its float → string cast gives `float.__repr__`'s text for plain values
    (checked once: the edges of the plain range, ties between two shortest decimals, 17-digit and short
    fractions)."""
    if not _checked:
        try:
            import pyarrow as pa
            import pyarrow.compute  # noqa: F401  (casts need it)
        except ImportError:
            _checked.append(False)
        else:
            probe = np.array([
                PLAIN_LOW, np.nextafter(PLAIN_LOW, 1.0), np.nextafter(PLAIN_HIGH, 0.0), 9999999999.999998,
                2.0**33 + 1 / 128, 2.0**33 + 3 / 128, 2.0**33 + 2.0**-19, 1073741824.25, 0.1 + 0.2, 1 / 3, 2 / 3,
                123.456, -0.5, 5e-4, 1.5e-4, -987654.321, 0.2945185379169278,
            ])
            cast = arrow_array(probe).cast(pa.string()).to_pylist()
            _checked.append(cast == list(map(float.__repr__, probe.tolist())))
    return _checked[0]


def write_rows(arrays: Sequence[np.ndarray], f: IO[str]) -> None:
    """The rows of `arrays` (float64, int or bool columns of equal length, two or more) as
    `step_writer.append_csv` writes them: fields joined by ",", each row ending in "\\n"."""
    import pyarrow.compute as pc

    comma, newline = string_array([",", "\n"])  # scalars made from a str would import pandas
    for start in range(0, len(arrays[0]), ARROW_CHUNK_ROWS):
        rows = pc.binary_join_element_wise(*(_fields(a[start:start + ARROW_CHUNK_ROWS]) for a in arrays), comma)
        lines = pc.binary_join_element_wise(rows, _empty_strings(len(rows)), newline)
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset:lines.offset + len(lines) + 1]
        f.write(memoryview(lines.buffers()[2])[offsets[0]:offsets[-1]].tobytes().decode("ascii"))


def _fields(values: np.ndarray) -> Any:
    """One column's CSV fields as a pyarrow string array. A field's text depends on its value alone, so a
    column of few distinct values (a float's bit pattern: -0.0 is not 0.0) formats each once and puts the
    texts in place: an int column holding one value throughout, a float column at most half distinct."""
    import pyarrow as pa

    if values.dtype.kind in "iu":
        if values[0] == values[-1] and bool(np.all(values == values[0])):
            return arrow_array(values[:1]).cast(pa.string()).take(arrow_array(np.zeros(len(values), dtype=np.int64)))
        return arrow_array(values).cast(pa.string())
    if values.dtype.kind == "b":
        return string_array(["False", "True"]).take(arrow_array(values.view(np.uint8)))
    bits = values.view(np.int64)
    distinct = _few_distinct(bits)
    if distinct is None:
        return _float_fields(values)
    return _float_fields(distinct.view(np.float64)).take(arrow_array(np.searchsorted(distinct, bits)))


def _few_distinct(values: np.ndarray) -> np.ndarray | None:
    """`values`' distinct values, sorted, if at most half of them are distinct, else None; decided first on
    the first `DISTINCT_SAMPLE` values (a column whose head is mostly distinct is left unsorted: times, durations).
    Sorted, not `np.unique`, which hashes and costs about as much as the casts it saves."""
    head = np.sort(values[:DISTINCT_SAMPLE])
    if 2 * (1 + np.count_nonzero(head[1:] != head[:-1])) > len(head):
        return None
    ordered = np.sort(values)
    distinct = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
    return distinct if 2 * len(distinct) <= len(values) else None


def _float_fields(values: np.ndarray) -> Any:
    """A float64 column's CSV fields, formatted value by value, as a pyarrow string array."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bits = values.view(np.int64)
    fields = arrow_array(values).cast(pa.string())
    with np.errstate(invalid="ignore"):  # a signalling NaN's payload: it is odd, whatever numpy says of it
        magnitude = np.abs(values)
        odd = ~((magnitude >= PLAIN_LOW) & (magnitude < PLAIN_HIGH) & (values != np.trunc(values)))
    if odd.any():
        distinct, inverse = np.unique(bits[odd], return_inverse=True)
        python = _python_texts(distinct.view(np.float64)).take(arrow_array(inverse.reshape(-1)))
        fields = pc.replace_with_mask(fields, arrow_array(odd.view(np.uint8)).cast(pa.bool_()), python)
    return fields


def _python_texts(values: np.ndarray) -> Any:
    """`float.__repr__` of each float ("" for NaN) as a pyarrow string array."""
    return string_array(["" if v != v else float.__repr__(v) for v in values.tolist()])


def _empty_strings(num: int) -> Any:
    import pyarrow as pa

    return pa.Array.from_buffers(pa.string(), num, [None, pa.py_buffer(np.zeros(num + 1, dtype=np.int32)),
                                                    pa.py_buffer(b"")])


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
