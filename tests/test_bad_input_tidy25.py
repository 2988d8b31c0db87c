"""Small things found on 7 December: each message names what its caller gave, in the caller's words.

Found: `RunResult.write(out_dir)` and `to_parquet(out_dir)` refused a folder as `--output=...`, an option Python
has not; the CLI's messages keep `--output`.
"""

from __future__ import annotations

import inspect

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path

import kvsim
from kvsim.model.errors import KvsimError
from kvsim.results.output_dir import check_output_file
from kvsim.results.run_result import RunResult

SMALL = {"steps": "none", "workload": {"num_requests": 2, "prompt_len": {"dist": "fixed", "value": 16},
                                       "output_len": {"dist": "fixed", "value": 2}}}


@pytest.mark.parametrize("method", [RunResult.write, RunResult.to_parquet])
def test_a_refused_output_from_python_is_named_as_the_parameter_the_caller_passed(tmp_path, method):
    """The name expected is the method's own first parameter after `self` (read from its signature), not a
    literal: a caller who wrote `result.write(out_dir=...)` finds that word in the error."""
    if method is RunResult.to_parquet:
        pytest.importorskip("pyarrow")  # its engine
    parameter = list(inspect.signature(method).parameters)[1]
    theirs = tmp_path / "mine"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("my notes\n")
    result = kvsim.simulate(SMALL)
    with pytest.raises(KvsimError) as refused:
        method(result, **{parameter: theirs})
    assert str(refused.value) == (f"{parameter}={str(theirs)!r}: exists and has no .kvsim-output marker; kvsim only "
                                  "replaces output it wrote itself (choose a new path)")
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]


def test_a_refused_output_file_from_python_is_named_as_its_parameter(tmp_path):
    theirs = tmp_path / "profile.csv"
    theirs.write_text("mine\n")
    parameter = list(inspect.signature(check_output_file).parameters)[0]
    with pytest.raises(KvsimError, match=rf"^{parameter}='[^']*profile.csv': exists and does not start with"):
        check_output_file(theirs)


def test_the_cli_names_the_same_refusal_as_its_option(tmp_path):
    theirs = tmp_path / "mine"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("my notes\n")
    assert one_line_exit_2(["run", "--set", "workload.num_requests=2", "-o", str(theirs)]) == (
        f"--output={str(theirs)!r}: exists and has no .kvsim-output marker; kvsim only replaces output it wrote "
        "itself (choose a new path)")
