"""pyarrow's CSV assembly (`kvsim.results.csv_arrow`) against `append_csv`'s plain path on tables hypothesis draws:
the two must write the same bytes. The plain path (`float.__repr__` per value, "" for NaN, `str` per int and bool) is
the independent side: it shares no code with the pyarrow one.

The draws aim at where the two could part: the edges of the layout both write alike (1e-4, 1e10, 1e16, a few ulps
either side), subnormals, 17-digit shortest reprs, integral values just under 1e16, negatives, NaN and infinities,
and columns that are few-valued (the dictionary path) in one chunk and mostly distinct (the plain path) in the
next. The chunk and the sample `_few_distinct` looks at first are shrunk, and `SPLIT_FIELD_ROWS` drawn (odd rows
written apart or as texts), so that small tables cross every branch; one test keeps the shipped constants, at the
most odd rows a chunk writes apart (`_split_pays`) and one more.
"""

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.results import csv_arrow
from kvsim.results.step_writer import append_csv, has_pyarrow

pytestmark = pytest.mark.skipif(not has_pyarrow(), reason="pyarrow is not installed (the fast path needs it)")


def _near(x: float, ulps: int) -> float:
    """`x` moved `ulps` doubles up (negative: down), for positive `x`."""
    return float((np.array([x]).view(np.int64) + ulps).view(np.float64)[0])


EDGES = [1e-4, 1e10, 1e16, 1e-6, 5e-324, 2.2250738585072014e-308, 2.0**53]
edge_values = st.builds(lambda x, ulps, sign: sign * _near(x, ulps), st.sampled_from(EDGES), st.integers(-3, 3),
                        st.sampled_from([1.0, -1.0]))
seventeen_digits = st.integers(10**16, 10**17 - 1).flatmap(
    lambda digits: st.integers(-20, 26).map(lambda exp: float(f"{digits}e{exp - 16}")))
integral = st.integers(-(2**53), 2**53).map(float) | st.integers(10**15, 10**16 - 1).map(float)
floats = (st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True) | edge_values | seventeen_digits
          | integral | st.floats(1e-4, 1e10) | st.floats(-1e10, -1e-4))


@st.composite
def float_column(draw: st.DrawFn, num_rows: int) -> np.ndarray:
    """A float64 column: drawn values throughout, a few drawn values repeated, or one half of each (a column
    the dictionary path takes in one chunk and the plain path in another)."""
    kind = draw(st.sampled_from(["distinct", "few", "half"]))
    values = draw(st.lists(floats, min_size=num_rows, max_size=num_rows))
    few = draw(st.lists(floats, min_size=1, max_size=3))
    repeated = [few[draw(st.integers(0, len(few) - 1))] for _ in range(num_rows)]
    column = values if kind == "distinct" else repeated if kind == "few" else repeated[: num_rows // 2] + values[
        num_rows // 2:]
    return np.array(column, dtype=np.float64)


def both_paths(columns: dict[str, np.ndarray]) -> tuple[str, str]:
    """The CSV text of `columns` through pyarrow and through the plain path."""
    texts = []
    for fast in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(csv_arrow, "_checked", [fast])
            mp.setattr(csv_arrow, "ARROW_MIN_ROWS", 0)
            f = io.StringIO()
            append_csv(columns, f, header=True)
            texts.append(f.getvalue())
    return texts[0], texts[1]


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(1, 40), st.sampled_from([1, 3, 8, 64]), st.sampled_from([0, 1, 80, 10**12]),
       st.sampled_from([2, 4, 1024]))
def test_drawn_tables_write_the_same_bytes(data, num_rows, chunk_rows, split_field_rows, sample):
    """Two to four float columns (and an int and a bool column) of drawn values, in chunks of a few rows: the
    same bytes through pyarrow as through `append_csv`'s plain path."""
    columns = {f"f{k}": data.draw(float_column(num_rows)) for k in range(data.draw(st.integers(2, 4)))}
    columns["n"] = np.array(data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=num_rows,
                                               max_size=num_rows)), dtype=np.int64)
    columns["flag"] = np.array(data.draw(st.lists(st.booleans(), min_size=num_rows, max_size=num_rows)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(csv_arrow, "ARROW_CHUNK_ROWS", chunk_rows)
        mp.setattr(csv_arrow, "SPLIT_FIELD_ROWS", split_field_rows)
        mp.setattr(csv_arrow, "DISTINCT_SAMPLE", sample)
        fast, plain = both_paths(columns)
    assert fast == plain


# the most odd rows a full chunk of the test's 3 columns, 1 of them mixed, writes apart: (2 o + 1) 3 S <= chunk
APART_MAX = (csv_arrow.ARROW_CHUNK_ROWS // (3 * csv_arrow.SPLIT_FIELD_ROWS) - 1) // 2


@pytest.mark.parametrize("num_odd", [APART_MAX, APART_MAX + 1])
def test_odd_rows_at_the_limit_in_each_chunk_write_the_same_bytes(num_odd):
    """Shipped constants: two chunks and a bit of mostly distinct plain floats, exactly `APART_MAX` odd rows
    in each (rows written apart) or one more (the column becomes texts), one odd value at each chunk's first and
    last row, and a column that is few-valued in the first chunk and distinct in the second."""
    chunk_rows = csv_arrow.ARROW_CHUNK_ROWS
    assert csv_arrow._split_pays(num_odd, 3, 1, chunk_rows) == (num_odd == APART_MAX)
    rng = np.random.default_rng()
    chunk = csv_arrow.ARROW_CHUNK_ROWS
    num_rows = 2 * chunk + 7
    odd_values = np.array([0.0, -0.0, 1e16, np.nextafter(1e16, 0), 9.999999999999999e-05, 1e10, -1e10, 5e-324,
                           np.nan, np.inf, -960.0, 2.0**53 - 1, 1.2345678901234567e-300])
    mixed = rng.uniform(-1e4, 1e4, num_rows)
    for start in (0, chunk):
        rows = np.concatenate(([start, start + chunk - 1],
                               rng.choice(np.arange(start + 1, start + chunk - 1), num_odd - 2, replace=False)))
        mixed[rows] = rng.choice(odd_values, num_odd)
    switching = np.concatenate((np.resize([0.25, -0.0, 3.0], chunk), rng.uniform(1e-4, 1e10, num_rows - chunk)))
    columns = {"mixed": mixed, "switching": switching, "n": np.arange(num_rows) - 5}
    fast, plain = both_paths(columns)
    assert fast == plain
