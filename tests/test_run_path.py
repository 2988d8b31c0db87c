"""`kvsim run` writes its files without pandas, and the files are what pandas would have written.

pandas costs about 0.4 s to import (a tenth of a 10k-request run end to end), so the run path
(the CLI, simulate, requests.csv, steps as Parquet or CSV, summary.json) must not import it; the
`requests` DataFrame is built only when a user asks for it. The CSV writer is checked byte for
byte against `DataFrame.to_csv` on awkward values, and a fresh interpreter running the CLI is
checked for the heavy modules it loaded.
"""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from kvsim.results.metrics import EngineCounters, summarize
from kvsim.results.step_writer import append_csv, frame_columns, has_pyarrow, write_csv
from kvsim.workload.scenario import load_scenario

HEAVY = ("pandas", "matplotlib", "torch", "triton", "scipy")
ON_DEMAND = ("rich", "pyarrow")  # imported only for what needs them: a printed table, a Parquet file or long table

RUN_AND_LIST_HEAVY_MODULES = """
import json, sys
from kvsim.__main__ import main
sys.argv = ["kvsim", "run", "--set", "workload.num_requests=40", "-o", sys.argv[1], *sys.argv[2:]]
try:
    main()
except SystemExit as exit:
    assert exit.code in (0, None), exit.code
print(json.dumps(sorted(m for m in {heavy} if m in sys.modules)))
"""


PARQUET = ["pyarrow"] if has_pyarrow() else []  # the steps file `--steps-format auto` writes (CSV without pyarrow)


@pytest.mark.parametrize(("args", "expected"), [
    (["--format", "json"], PARQUET),
    (["--steps-format", "csv"], ["rich"]),
    pytest.param(["--steps-format", "parquet"], ["pyarrow", "rich"],
                 marks=pytest.mark.skipif(not has_pyarrow(), reason="needs pyarrow")),
    (["--steps", "sampled", "--format", "json"], PARQUET),
    (["--set", "engine.data_parallel_size=2", "--format", "json"], ["pandas", *PARQUET]),
])
def test_kvsim_run_imports_no_pandas(tmp_path, args, expected):
    """A fresh interpreter running `kvsim run` (the table or JSON output, steps as CSV or Parquet, all or
    sampled) has imported none of the heavy optional libraries once it has written its files.
    Data-parallel runs concatenate their engines' tables with pandas, so they are the case that shows
    this check sees pandas when it is there. rich (~170 M instructions) loads only to print the table, not for
    JSON, and pyarrow only to write Parquet: 40 requests' CSV steps are too short for its CSV writer
    (`kvsim.results.csv_arrow.worth_using`)."""
    out = tmp_path / "run"
    script = RUN_AND_LIST_HEAVY_MODULES.format(heavy=HEAVY + ON_DEMAND)
    result = subprocess.run([sys.executable, "-c", script, str(out), *args], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert (out / "requests.csv").is_file() and (out / "summary.json").is_file()
    assert loaded == sorted(expected)


def test_the_cli_loads_no_command_dependencies():
    """Importing the CLI (what every command line pays before its command runs) loads typer and pydantic, which
    typer needs to parse any option, and none of the libraries a command loads when it runs: numpy, YAML,
    simpy, rich, pyarrow, pandas."""
    code = ("import sys, kvsim.cli; print(sorted(m for m in ('numpy', 'yaml', 'simpy', 'rich', 'pyarrow', 'pandas', "
            "'typer', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "['pydantic', 'typer']"


def test_csv_writer_writes_what_pandas_writes(tmp_path):
    """NaN, None, missing strings, commas, quotes and newlines in fields, an object column of mixed types,
    tiny, huge, negative zero and infinite floats, float32s (written as numpy writes them: 0.1, not 0.10000000149011612), ints and bools: `append_csv` gives `DataFrame.to_csv(index=False)`'s bytes, with
    and without the header, and written in chunks (every 3 rows) or whole."""
    frame = pd.DataFrame({
        "i": np.array([0, -7, 2**62, 5, 1, 3], dtype=np.int64),
        "f": np.array([0.1 + 0.2, np.nan, 1e16, 1e-5, -0.0, np.inf]),
        "g": np.array([1e-300, 123456789.125, 2.5, -np.inf, 1 / 3, 1e15]),
        "f32": np.array([0.1, np.nan, 1e-7, 3.4e38, -2.5, 16777217.0], dtype=np.float32),
        "b": np.array([True, False, True, True, False, False]),
        "s": np.array(["plain", None, 'say "hi"', "a,b", "two\nlines", ""], dtype=object),
        "vllm:metric": np.array([None] * 6, dtype=object),
        "mixed": np.array([1, 2.5, None, "x,y", True, -0.0], dtype=object),
    })
    expected = frame.to_csv(index=False)
    write_csv(frame_columns(frame), tmp_path / "whole.csv")
    assert (tmp_path / "whole.csv").read_bytes() == expected.encode()
    import kvsim.results.step_writer as step_writer

    with (tmp_path / "chunks.csv").open("w", newline="") as f:
        saved = step_writer.CSV_CHUNK_ROWS, step_writer.CSV_MIXED_CHUNK_ROWS
        step_writer.CSV_CHUNK_ROWS = step_writer.CSV_MIXED_CHUNK_ROWS = 3
        try:
            append_csv(frame_columns(frame.iloc[:4]), f, header=True)
            append_csv(frame_columns(frame.iloc[4:]), f, header=False)
        finally:
            step_writer.CSV_CHUNK_ROWS, step_writer.CSV_MIXED_CHUNK_ROWS = saved
    assert (tmp_path / "chunks.csv").read_text() == expected


@pytest.mark.parametrize("negative_zero", [False, True])
def test_numeric_csv_fast_path_writes_what_pandas_writes(tmp_path, negative_zero):
    """Only float64, int and bool columns (the step rows) take `append_csv`'s join path, which formats
    each distinct value once: repeated values (so the distinct-value branch runs), repeated NaN and
    infinities, a column of distinct floats, negative zero beside zero (np.unique merges them), and a
    lone column (csv.writer quotes a lone empty field) all give `to_csv`'s bytes."""
    zero = -0.0 if negative_zero else 0.0
    frame = pd.DataFrame({
        "time_s": np.array([0.0, 0.1, 0.30000000000000004, 1e16, 1e-300, 2.5, 7.0, 8.125]),
        "usage": np.array([0.5, 0.5, np.nan, np.nan, 1 / 3, 1 / 3, 0.5, zero]),
        "frac": np.array([0.0, 0.0, zero, np.inf, np.inf, -np.inf, 0.0, 0.0]),
        "vllm:running": np.array([3, 3, 3, -1, 2**62, 3, 3, 3], dtype=np.int64),
        "flag": np.array([True, True, False, True, True, True, True, True]),
    })
    write_csv(frame_columns(frame), tmp_path / "steps.csv")
    assert (tmp_path / "steps.csv").read_bytes() == frame.to_csv(index=False).encode()
    lone = frame[["usage"]]
    write_csv(frame_columns(lone), tmp_path / "lone.csv")
    assert (tmp_path / "lone.csv").read_bytes() == lone.to_csv(index=False).encode()


@pytest.mark.parametrize("texts_kept", [2, 4096])
def test_step_writer_csv_remembers_texts_across_chunks(tmp_path, monkeypatch, texts_kept):
    """`StepWriter` keeps each float column's texts from chunk to chunk: values repeated in later chunks,
    NaN in several, 0.0 remembered before a chunk holding -0.0, a strictly increasing column (formatted
    value by value) and columns holding one value per chunk (0.0, then -0.0: formatted once) still give
    `to_csv`'s bytes for the whole table, also when the texts kept turn over into an older generation."""
    import kvsim.results.step_writer as step_writer
    from kvsim.results.step_writer import StepWriter

    monkeypatch.setattr(step_writer, "TEXTS_KEPT", texts_kept)
    chunks = [
        {"time_s": np.array([0.0, 0.1, 0.30000000000000004]), "usage": np.array([0.5, 0.0, np.nan]),
         "n": np.array([1, 1, 2], dtype=np.int64), "slack": np.zeros(3), "swaps": np.zeros(3, dtype=np.int64)},
        {"time_s": np.array([0.5, 0.75, 1e16]), "usage": np.array([-0.0, 0.5, 1 / 3]),
         "n": np.array([2, 3, 3], dtype=np.int64), "slack": np.full(3, -0.0), "swaps": np.full(3, 7)},
        {"time_s": np.array([2e16, 2e16, 3e16]), "usage": np.array([np.nan, 1 / 3, 0.0]),
         "n": np.array([3, 3, 4], dtype=np.int64), "slack": np.array([0.0, -0.0, 0.0]),
         "swaps": np.array([7, 7, 8])},
        {"time_s": np.array([4e16, 5e16, 6e16]), "usage": np.array([0.5, 0.0, 1 / 3]),
         "n": np.array([4, 4, 4], dtype=np.int64), "slack": np.full(3, np.nan), "swaps": np.full(3, 8)},
    ]
    writer = StepWriter(tmp_path, "csv")
    for chunk in chunks:
        writer.write(chunk)
    writer.close()
    whole = pd.DataFrame({k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]})
    assert (tmp_path / "steps.csv").read_bytes() == whole.to_csv(index=False).encode()


def test_requests_csv_and_frame_come_from_the_same_columns(tmp_path):
    """A run with rejected requests: requests.csv is `to_csv` of the `requests` DataFrame, which is built
    (once) from `request_columns` only when asked for."""
    from kvsim.engine.simulate import simulate

    spec = load_scenario(None, ["workload.num_requests=40", "engine.max_model_len=1024"])
    result = simulate(spec, out_dir=tmp_path / "run")
    assert result.summary["num_rejected"] > 0
    assert "requests" not in result._frames  # not built by the run itself
    frame = result.requests
    assert result.requests is frame
    assert list(frame.columns) == list(result.request_columns)
    assert (tmp_path / "run" / "requests.csv").read_text() == frame.to_csv(index=False)


def test_reject_reasons_most_frequent_first_ties_in_order_of_first_appearance():
    """By hand: reasons b, a, (a finished request), c, a, b, c, c → c three times, then b and a twice each
    (b seen first), the order pandas' `value_counts` gives; the finished request's None is not counted."""
    from kvsim.results.metrics import StepTotals

    reasons = ["b", "a", None, "c", "a", "b", "c", "c"]
    columns = {
        "status": np.array(["finished" if r is None else "rejected" for r in reasons], dtype=object),
        "reject_reason": np.array(reasons, dtype=object),
        "arrival_s": np.zeros(8), "output_tokens": np.ones(8, dtype=np.int64),
        "num_samples": np.ones(8, dtype=np.int64), "finish_s": np.ones(8), "first_token_s": np.ones(8),
        **{key: np.ones(8) for key in ("ttft_s", "tpot_s", "e2e_s", "queue_s")},
    }
    summary = summarize(columns, StepTotals(), EngineCounters(), {})
    assert list(summary["reject_reasons"].items()) == [("c", 3), ("b", 2), ("a", 2)]
    assert summary["num_requests"] == 8 and summary["num_rejected"] == 7 and summary["num_finished"] == 1
    frame = pd.DataFrame(columns)
    counted = frame["reject_reason"][frame["status"] == "rejected"].value_counts()
    assert list(counted.items()) == list(summary["reject_reasons"].items())
    assert summarize(frame, StepTotals(), EngineCounters(), {}) == summary


def test_requests_refused_for_one_limit_count_under_one_reason():
    """`reject_reasons` counts requests per reason (docs/metrics.md): 30 prompts of different lengths, all over
    max_model_len 64, are one reason counted 30 times, not 30 reasons of one request each (the message named
    each request's own lengths, which its row already carries)."""
    from kvsim.engine.simulate import simulate

    scenario = load_scenario(None, ["engine.max_model_len=64", "workload.num_requests=30",
                                    "workload.prompt_len={dist: uniform, low: 100, high: 900}",
                                    "workload.output_len={dist: fixed, value: 8}"])
    result = simulate(scenario)
    assert result.summary["reject_reasons"] == {"prompt_len >= max_model_len 64": 30}
    assert result.requests["prompt_tokens"].nunique() > 1  # the rows keep each request's own lengths
