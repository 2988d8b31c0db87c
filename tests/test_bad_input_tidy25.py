"""Small things found on 7 December: each message names what its caller gave, in the caller's words.

Found: `RunResult.write(out_dir)` and `to_parquet(out_dir)` refused a folder as `--output=...`, an option Python
has not; the CLI's messages keep `--output`.
"""

from __future__ import annotations

import inspect

import pytest
from conftest import benchmark_script, one_line_exit_2  # tests/ is on sys.path

import kvsim
from kvsim.model.errors import KvsimError
from kvsim.results.output_checks import check_output_file
from kvsim.results.run_result import RunResult
from kvsim.workload.scenario import Scenario

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


COUNT_NOT_GROUPS = "replicas is an integer count here ({}), not a list of replica groups"
GROUPS_NEEDED = ("; to set a group's field, give replicas as a list of groups in the scenario "
                 "(replicas: [{count: 2, gpu: h200}])")


@pytest.mark.parametrize(("sets", "said"), [
    (["replicas.0.gpu=h200"], COUNT_NOT_GROUPS.format("not given: one engine") + GROUPS_NEEDED),
    (["replicas=3", "replicas.1.engine.max_num_seqs=8"], COUNT_NOT_GROUPS.format("3") + GROUPS_NEEDED),
    (["replicas.gpu=h200"], COUNT_NOT_GROUPS.format("not given: one engine")),  # no group named: no group advice
])
def test_a_group_field_set_where_replicas_is_a_count_says_so(sets, said):
    """`--set replicas.0.gpu=h200` without a list of groups was `replicas={'0': {'gpu': 'h200'}}: Input should be a
    valid integer` (the section the override made, validated as the count); over `replicas: 3` it was `replicas is
    not a section`."""
    argv = ["run", *[arg for item in sets for arg in ("--set", item)], "-o", "unused"]
    assert one_line_exit_2(argv) == f"--set {sets[-1]!r}: {said}"
    overrides = dict(item.split("=") for item in sets)
    with pytest.raises(KvsimError) as refused:
        kvsim.simulate(SMALL, **{key.replace(".", "__"): int(v) if v.isdigit() else v for key, v in overrides.items()})
    assert str(refused.value) == f"override {sets[-1].split('=')[0]!r}: {said}"


def test_a_group_field_is_set_where_the_scenario_gives_groups():
    fleet = {**SMALL, "replicas": [{"count": 1}, {"count": 1}]}
    result = kvsim.simulate(fleet, replicas__1__engine__max_num_seqs=8)
    assert result.scenario.replicas[1].engine == {"max_num_seqs": 8}  # type: ignore[index, union-attr]


@pytest.mark.parametrize(("validate", "given"), [
    *[("model_validate", given) for given in ("x", 5, None, [1])],
    ("model_validate_strings", "x"), ("model_validate_json", "5")])
def test_a_scenario_that_is_no_mapping_is_named_as_the_scenario(validate, given):
    """`Scenario.model_validate("x")` was `value='x': a section, not one value: set its fields (...), e.g.
    value.name=...`: a field `value` the caller never gave, and a `--set` form for a Python call."""
    with pytest.raises(KvsimError) as refused:
        getattr(Scenario, validate)(given)
    shown = 5 if validate == "model_validate_json" else repr(given)  # the JSON text's value
    assert str(refused.value) == f"scenario={shown}: expected a dict of its fields or a Scenario"


def test_a_scenario_section_given_one_value_keeps_its_hint():
    with pytest.raises(KvsimError, match=r"^workload=5: a section, not one value: set its fields \(num_requests, "):
        Scenario(workload=5)


def test_the_accuracy_table_goes_into_the_readme_as_utf8_whatever_the_locale(tmp_path, monkeypatch):
    """`benchmarks/accuracy.py` read and wrote README.md in the locale's encoding: under an ASCII one (LC_ALL=C with
    PYTHONUTF8=0) reading its '—' was a UnicodeDecodeError. `Path.read_text` and `write_text` are made to use an
    ASCII locale's encoding where none is given; the page (README.md then, docs/accuracy.md now) is read
    and written back in UTF-8."""
    from pathlib import Path

    accuracy = benchmark_script("accuracy")
    read_text, write_text = Path.read_text, Path.write_text
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None, errors=None: read_text(
        self, encoding=encoding or "ascii", errors=errors))
    monkeypatch.setattr(Path, "write_text", lambda self, data, encoding=None, errors=None, newline=None: write_text(
        self, data, encoding or "ascii", errors, newline))
    readme = tmp_path / "README.md"
    readme.write_bytes("# kvsim — notes\n<!-- a -->\nold\n<!-- b -->\nTTFT ≤ 1 s\n".encode())
    accuracy.update_page("| case | TTFT |\n| café | — |\n", readme, "<!-- a -->", "<!-- b -->")
    assert readme.read_bytes().decode("utf-8") == (
        "# kvsim — notes\n<!-- a -->\n| case | TTFT |\n| café | — |\n<!-- b -->\nTTFT ≤ 1 s\n")
