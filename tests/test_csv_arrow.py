"""pyarrow's CSV assembly (`kvsim.results.csv_arrow`) writes `append_csv`'s own bytes, which are pandas' (test_run_path).

The fast path is taken for long numeric tables only; each test runs a table through both paths (the
plain one by declaring pyarrow's float format unusable) and compares the bytes. The doubles are drawn
fresh: random bit patterns (every exponent, subnormals, NaN payloads, infinities), values of every
layout boundary (1e-4, 1e10, 1e16), integral values, ±0.0, and exact ties between two shortest
decimals (x = N·2^-j, which `float.__repr__` rounds half to even).
"""

import io
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from kvsim.results import csv_arrow
from kvsim.results.step_writer import append_csv, has_pyarrow

pytestmark = pytest.mark.skipif(not has_pyarrow(), reason="pyarrow is not installed (the fast path needs it)")


def both_paths(monkeypatch, columns, chunk_sizes=(None,)):
    """The CSV text of `columns` through pyarrow and through the plain path, appended in chunks of each size."""
    texts = {}
    for fast in (True, False):
        monkeypatch.setattr(csv_arrow, "_checked", [fast])  # the fast path even if the probe failed
        monkeypatch.setattr(csv_arrow, "ARROW_MIN_ROWS", 0)
        f = io.StringIO()
        num_rows = len(next(iter(columns.values())))
        for size in chunk_sizes:
            step = size or num_rows
            for start in range(0, num_rows, step):
                append_csv({k: v[start:start + step] for k, v in columns.items()}, f, header=start == 0)
        texts[fast] = f.getvalue()
    return texts[True], texts[False]


def random_doubles(rng, num):
    """Doubles of every kind, mixed: see the module docstring."""
    bits = rng.integers(0, 2**63, num, dtype=np.int64) * rng.choice([1, -1], num)
    anything = bits.view(np.float64)
    plain = rng.uniform(-4, 10, num)
    plain = np.sign(rng.standard_normal(num)) * 10.0**plain
    j = rng.integers(1, 60, num)
    ties = np.ldexp(np.floor(np.ldexp(10.0 ** rng.uniform(-4, 10, num), j)), -j)  # N·2^-j: exact ties among them
    edges = np.array([1e-4, np.nextafter(1e-4, 0), np.nextafter(1e-4, 1), 1e10, np.nextafter(1e10, 0), 1e16,
                      np.nextafter(1e16, 0), 1e15, 0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, 1.7976931348623157e308,
                      2.0**33 + 1 / 128, 960.0, -3.0, 2.0**53, 0.1 + 0.2])
    integral = np.trunc(10.0 ** rng.uniform(0, 17, num))
    pool = np.concatenate([anything, plain, ties, integral, np.resize(edges, num)])
    return rng.permutation(pool)


def test_random_doubles_of_every_layout_write_the_same_bytes(monkeypatch):
    """Half a million fresh doubles of every kind (module docstring), in columns that repeat values, hold
    one value throughout, are strictly increasing, and mix in ints (one column of one value) and bools: both
    paths, the same bytes."""
    rng = np.random.default_rng()
    num = 100_000
    doubles = random_doubles(rng, num // 5 + 1)[:num]
    columns = {
        "x": doubles,
        "repeats": rng.choice(doubles[:50], num),
        "zeros": np.full(num, -0.0),
        "time_s": np.cumsum(rng.exponential(0.03, num)),
        "n": rng.integers(-2**62, 2**62, num),
        "small": rng.integers(0, 300, num),
        "one_int": np.full(num, 7),
        "near_max": rng.integers(2**63 - 300, 2**63 - 1, num),  # counts span a short range: a dictionary
        "u_near_max": rng.integers(2**64 - 300, 2**64 - 1, num, dtype=np.uint64),
        "int8": rng.integers(-128, 127, num, dtype=np.int8),
        "u": rng.integers(0, 2**63, num, dtype=np.uint64) * np.uint64(2),
        "flag": rng.random(num) < 0.5,
        "nan": np.full(num, np.nan),
    }
    fast, plain = both_paths(monkeypatch, columns, chunk_sizes=(None, 7_000))
    assert fast == plain
    assert fast.count("\n") == 2 * (num + 1)  # two headers, every row twice
    few = {name: values[:300] for name, values in columns.items()}
    one_row_chunks = both_paths(monkeypatch, few, chunk_sizes=(1,))
    assert one_row_chunks[0] == one_row_chunks[1] == both_paths(monkeypatch, few)[1]


def test_a_fleets_steps_csv_is_the_same_through_both_paths(tmp_path, monkeypatch):
    """A simulated 8-replica fleet (3,000 requests, every step kept, its replicas' step tables assembled by
    pyarrow whatever their length): every table the run's files assemble through pyarrow is written by the plain
    path too, from the same rows, and the bytes agree; so steps.csv, requests.csv and summary.json are those the
    plain path writes. The fleet is simulated once: both paths see its rows as the run hands them over, in the
    order and chunks it does (a second run only repeated the simulation, which no write can change)."""
    from kvsim.fleet.run import simulate_scenario
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario(None, ["workload.num_requests=3000", "workload.arrival.rate=200", "replicas=8",
                                    "router={policy: least_outstanding}"])
    monkeypatch.setattr(csv_arrow, "ARROW_MIN_ROWS", 0)
    monkeypatch.setattr(csv_arrow, "_checked", [True])  # the fast path even if the probe failed
    tables = []  # (rows, pyarrow's text, the plain path's text) of every table assembled

    def tee(arrays, f, binary=None, real=csv_arrow.write_rows):
        fast, plain = io.StringIO(), io.StringIO()
        real(arrays, fast)
        csv_arrow._checked[0] = False  # append_csv's own rows for the same columns
        append_csv({str(i): a for i, a in enumerate(arrays)}, plain, header=False)
        csv_arrow._checked[0] = True
        tables.append((len(arrays[0]), fast.getvalue(), plain.getvalue(), Path(f.name).name))
        f.write(fast.getvalue())

    monkeypatch.setattr(csv_arrow, "write_rows", tee)
    out = tmp_path / "fleet"
    simulate_scenario(scenario, out_dir=out, steps_format="csv")
    steps = (out / "steps.csv").read_bytes()
    step_tables = [rows for rows, *_, name in tables if name.startswith(".steps-r")]
    assert sum(step_tables) == steps.count(b"\n") - 1  # every step row through pyarrow, once
    assert len(step_tables) == 8  # each replica's table
    assert {name for *_, name in tables} - {f".steps-r{k}.csv" for k in range(8)} == {"routes.csv", "replicas.csv"}
    for rows, fast, plain, _ in tables:
        assert fast == plain and fast.count("\n") == rows


def test_pyarrow_float_text_is_pythons_on_the_probe():
    """The installed pyarrow passes the once-per-process check the fast path relies on (if a later pyarrow
    formats otherwise, the fast path is off and this fails, asking for a look)."""
    assert csv_arrow.formats_floats_as_python()


IMPORTS = """
import io, sys
import numpy as np
from kvsim.results.step_writer import append_csv
rows = int(sys.argv[1])
append_csv({"t": np.arange(rows) * 0.1, "n": np.arange(rows)}, io.StringIO(), header=True)
print("pyarrow" in sys.modules, "pandas" in sys.modules, "pyarrow.compute" in sys.modules)
"""


@pytest.mark.parametrize("rows, pyarrow_loaded", [(100, False), (csv_arrow.ARROW_MIN_ROWS, True)])
def test_only_a_long_table_imports_pyarrow_and_never_pandas(rows, pyarrow_loaded):
    """A short table is not worth pyarrow's import (~0.05 s); a long one is, and building its arrays never
    imports pandas (`pa.array` of a list would, ~0.2 s), nor pyarrow.compute (~220 M instructions)."""
    result = subprocess.run([sys.executable, "-c", IMPORTS, str(rows)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [str(pyarrow_loaded), "False", "False"]


ADVERSARIAL = [0.0, -0.0, 1e-05, 1e-4, 1e16, 1e10, 960.0, -3.0, 1.2345678901234567e-300, 5e-324,
               1.7976931348623157e308, np.inf, -np.inf, np.nan, 0.1 + 0.2, 2.0**33 + 1 / 128, 123.456, -0.5]


SPLIT = {"apart": 0, "texts": 10**12}  # SPLIT_FIELD_ROWS that has every chunk's odd rows written apart, or as texts


@pytest.mark.parametrize("route", list(SPLIT))
@pytest.mark.parametrize("rows", [1, 5, 65, 192])
def test_adversarial_values_write_the_same_bytes(monkeypatch, rows, route):
    """Each adversarial double (zeros of both signs, the layout edges, the smallest and largest doubles,
    infinities, NaN) in a column of few distinct values, and in a column of mostly distinct plain values
    holding them at a few rows or many, written apart or as texts (`_split_pays` forced each way), beside ints
    (the int64 extremes), uint64 and bools: both paths, the same bytes."""
    monkeypatch.setattr(csv_arrow, "SPLIT_FIELD_ROWS", SPLIT[route])
    rng = np.random.default_rng()
    odd = np.resize(np.array(ADVERSARIAL), rows)
    plain = rng.uniform(1, 1000, 4 * rows + 50)
    mixed = plain.copy()
    mixed[rng.choice(len(mixed), rows, replace=False)] = odd
    num = len(mixed)
    columns = {"mixed": mixed, "few": np.resize(odd, num), "plain": plain,
               "n": np.resize(np.array([0, -1, 2**63 - 1, -2**63]), num),
               "u": np.resize(np.array([0, 2**64 - 1], dtype=np.uint64), num), "flag": np.resize([True, False], num)}
    fast, plain_text = both_paths(monkeypatch, columns)
    assert fast == plain_text


@pytest.mark.parametrize("reasons", [["prompt too long", None], ["a, b", None], ['say "no"', None], ["café", None],
                                     ["two\nlines", "x\ry"]])
def test_text_columns_write_the_same_bytes(monkeypatch, reasons):
    """A requests-like table (floats, ints, a status and a reject reason): through pyarrow where every text
    needs no quoting, else (a comma, a quote, a line break, a non-ASCII letter) on the plain path; the same
    bytes either way."""
    rng = np.random.default_rng()
    num = 2_000
    assembled = []

    def counted(arrays, f, binary=None, real=csv_arrow.write_rows):
        assembled.append(len(arrays[0]))
        real(arrays, f, binary)

    monkeypatch.setattr(csv_arrow, "write_rows", counted)
    columns = {"arrival_s": np.cumsum(rng.exponential(0.3, num)), "ttft_s": rng.choice([np.nan, 0.0, 0.25], num),
               "prompt_tokens": rng.integers(1, 9_000, num),
               "status": np.array(rng.choice(["finished", "rejected"], num), dtype=object),
               "reject_reason": np.array([reasons[k % 2] for k in range(num)], dtype=object)}
    fast, plain = both_paths(monkeypatch, columns, chunk_sizes=(None, 300))
    assert fast == plain
    assert fast.count("\n") == 2 * (num + 1) + num // 2 * 2 * sum(text.count("\n") for text in reasons if text)
    assert bool(assembled) == (reasons == ["prompt too long", None])  # only plain texts through pyarrow


def test_step_writer_hands_pyarrow_bytes_to_the_file_as_the_text_path_writes_them(tmp_path, monkeypatch):
    """`StepWriter` (and `write_csv`) give the writer's bytes to the file under the text one (`binary`): a table of
    2.5 `ARROW_CHUNK_ROWS` chunks, appended as a run hands it over (three chunks, the header first, then a short
    one written by `append_csv`'s own rows), is byte for byte the text path's, and so is `write_csv`'s file."""
    from kvsim.results.step_writer import StepWriter, write_csv

    monkeypatch.setattr(csv_arrow, "_checked", [True])  # the fast path even if the probe failed
    rng = np.random.default_rng()
    num = 5 * csv_arrow.ARROW_CHUNK_ROWS // 2
    columns = {"time_s": np.cumsum(rng.exponential(0.03, num)), "usage": rng.choice(rng.random(50), num),
               "odd": np.resize(random_doubles(rng, 1_000), num), "running": rng.integers(0, 200, num),
               "held": rng.integers(0, 10**9, num), "flag": rng.random(num) < 0.5}
    cuts = [0, 1_000, csv_arrow.ARROW_CHUNK_ROWS + 7, num - 10, num]
    writer = StepWriter(tmp_path, "csv")
    for first, last in pairwise(cuts):
        writer.write({k: v[first:last] for k, v in columns.items()})
    writer.close()
    text = io.StringIO()
    for first, last in pairwise(cuts):
        append_csv({k: v[first:last] for k, v in columns.items()}, text, header=first == 0, table_rows=last)
    same = (tmp_path / "steps.csv").read_bytes() == text.getvalue().encode("ascii")  # 10 MB: no diff printed
    assert same
    write_csv(columns, tmp_path / "whole.csv")
    whole = io.StringIO()
    append_csv(columns, whole, header=True)
    same = (tmp_path / "whole.csv").read_bytes() == whole.getvalue().encode("ascii")
    assert same


def requests_like(rng, num):
    """A requests.csv-like table of `num` rows (the Mooncake bench's columns and kinds): times mostly distinct,
    some 0.0 or integral (a request arriving or first scheduled at a whole second), NaN TPOTs (one output
    token), zero queueing, counts, a status."""
    arrival = np.round(np.cumsum(rng.exponential(0.5, num)), 9)
    arrival[rng.choice(num, num // 200, replace=False)] = np.trunc(arrival[:num // 200])
    arrival[:3] = 0.0
    queue = np.where(rng.random(num) < 0.005, 0.0, rng.exponential(2.0, num))
    ttft = rng.exponential(1.0, num) + 1e-3
    tpot = np.where(rng.random(num) < 0.005, np.nan, rng.uniform(0.01, 0.05, num))
    e2e = ttft + rng.uniform(1, 30, num)
    prompt = rng.integers(1, 4_096, num)
    return {"request_id": np.arange(num), "arrival_s": arrival, "first_scheduled_s": arrival + queue,
            "first_token_s": arrival + queue + ttft, "finish_s": arrival + e2e, "ttft_s": ttft, "tpot_s": tpot,
            "e2e_s": e2e, "queue_s": queue, "prompt_tokens": prompt, "output_tokens": rng.integers(1, 1_000, num),
            "num_samples": np.ones(num, dtype=np.int64), "prefix_hit_tokens": prompt // 512 * 512,
            "num_preemptions": rng.integers(0, 3, num),
            "status": np.array(["finished"] * num, dtype=object), "reject_reason": np.array([None] * num)}


@pytest.mark.parametrize("route", list(SPLIT))
def test_a_requests_table_writes_the_same_bytes_either_route(monkeypatch, route):
    """A 4,000-row requests-like table (the Mooncake bench's size) with odd rows in several columns: the texts
    route `_split_pays` picks for it and the split it used to take (each forced), the plain path's bytes."""
    monkeypatch.setattr(csv_arrow, "SPLIT_FIELD_ROWS", SPLIT[route])
    fast, plain = both_paths(monkeypatch, requests_like(np.random.default_rng(), 4_000))
    assert fast == plain


def test_odd_rows_are_written_apart_only_where_that_costs_the_writer_less():
    """A table handed to pyarrow's writer costs a cast of each of its columns (~0.11 ms for 20), so a chunk's odd
    rows are written apart only while their 2 · odd + 1 tables cost less than the mixed columns as texts, every
    row (`SPLIT_FIELD_ROWS` rows a field). Mooncake's requests.csv (4,000 rows, 16 columns, odd rows in 3) was
    93 tables, ~159 M instructions: one now; a 32,768-row steps chunk with one integral time stays 3 tables."""
    rng = np.random.default_rng(0)
    requests = list(requests_like(rng, 4_000).values())
    mixed = [k for k, values in enumerate(requests) if values.dtype.kind == "f" and csv_arrow._column(values) is None]
    num_odd = np.logical_or.reduce([csv_arrow._odd(requests[k]) for k in mixed]).sum()
    assert len(mixed) >= 3 and 20 < num_odd <= 64  # the shape the old fixed bound (64 odd rows) split apart
    assert len(list(csv_arrow._tables(requests, [str(k) for k in range(16)]))) == 1
    duration_s = rng.uniform(0.01, 0.05, 32_768)
    time_s = np.cumsum(duration_s) + 0.5
    time_s[1_000] = 960.0  # one integral time: two runs around one odd row
    steps = [time_s, duration_s, *(rng.integers(0, 128, 32_768) for _ in range(18))]
    assert len(list(csv_arrow._tables(steps, [str(k) for k in range(20)]))) == 3
