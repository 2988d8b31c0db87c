"""Bad input found by the twenty-first sweep. Each is refused (the CLI: exit 2, one line naming the field and the
value, nothing written; the Python API: a `KvsimError`), or said as it is.

Found: `--set router=least_kv` (one value for a section) was refused in pydantic's words, "Input should be a valid
dictionary or instance of Router", a class name, not the form to write (`router.policy=least_kv`). An xPyD plan
row's evidence line called the split's two instances "2 replicas" (`tests/test_plan_verify.py`). A section's
`model_copy(update=...)` (`scenario.engine.model_copy(update={"max_num_seqs": -1})`) raised pydantic's multi-line
ValidationError. `run_many` given dicts of fields stopped with an AttributeError deep in the run, `workers=2.5` with
a TypeError, and `workers=0` ran without a word. `kvsim capacity --sustained` at context lengths no probe can run at (1
token, past max_model_len) left the sustained columns out of the CSV and the table without a word.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path

import kvsim
from kvsim.model.errors import KvsimError

ROOT = Path(__file__).resolve().parent.parent


def test_one_value_for_a_section_says_the_field_it_names(tmp_path):
    """`least_kv` is one of the router's policies (`Router.policy`'s choices), so the form is `router.policy=...`;
    a value no field takes is told the section's fields."""
    argv = ["run", str(ROOT / "scenarios" / "azure-autoscale.yaml"), "-o", str(tmp_path / "out")]
    assert one_line_exit_2([*argv[:2], "--set", "router=least_kv", *argv[2:]]) == (
        "router='least_kv': a section, not one value: set its field, router.policy=least_kv")
    assert one_line_exit_2([*argv[:2], "--set", "router=3", *argv[2:]]) == (
        "router=3: a section, not one value: set its fields (policy, load_bound, load_slack, match_threshold), "
        "e.g. router.policy=...")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(KvsimError, match=r"^workload\.arrival='poisson': a section, not one value: set its field, "
                                         r"workload\.arrival\.process=poisson$"):
        kvsim.simulate(None, workload__arrival="poisson")


def test_a_sections_copy_refuses_a_bad_field_as_one_line():
    """`model_copy(update=...)` validates (sweep 13) a `Scenario`'s copy; a section's copy
    (`scenario.engine.model_copy(...)`) raised pydantic's multi-line ValidationError, no `KvsimError`. vLLM's
    `max_num_seqs` is a count of sequences, at least 1."""
    base = kvsim.load_scenario(None)
    with pytest.raises(KvsimError, match=r"^max_num_seqs=-1: Input should be greater than 0$"):
        base.engine.model_copy(update={"max_num_seqs": -1})
    with pytest.raises(KvsimError, match=r"^num_requests=0: Input should be greater than 0$"):
        base.workload.model_copy(update={"num_requests": 0})
    assert base.engine.model_copy(update={"max_num_seqs": 7}).max_num_seqs == 7


@pytest.mark.parametrize(("args", "message"), [
    (([{"seed": 1}],), "scenarios[0]={'seed': 1}: expected a Scenario (kvsim.load_scenario(path, overrides) or "
                       "kvsim.Scenario(**fields) makes one)"),
    ((5,), "scenarios=5: expected a list of Scenarios"),
    (("a.yaml",), "scenarios='a.yaml': expected a list of Scenarios"),
    (([], 2.5), "workers=2.5: expected a count of processes, 1 or more (None: one per CPU)"),
    (([], 0), "workers=0: expected a count of processes, 1 or more (None: one per CPU)"),
    (([], "2"), "workers='2': expected a count of processes, 1 or more (None: one per CPU)"),
])
def test_run_many_refuses_what_is_no_list_of_scenarios_before_any_run(args, message):
    """A notebook's sweep (`kvsim.planning.sweep.run_many`) given a dict of fields stopped with an AttributeError
    ('dict' object has no attribute 'kv_transfer_config') deep in the run, 5 with a TypeError, `workers=2.5`
    with a TypeError from the process pool, and `workers=0` ran in this process without a word."""
    from kvsim.planning.sweep import run_many

    scenarios, *workers = args
    with pytest.raises(KvsimError) as caught:
        run_many(scenarios, workers=workers[0] if workers else 1)
    assert str(caught.value) == message


def test_run_many_takes_any_iterable_of_scenarios_and_a_numpy_worker_count():
    import numpy as np

    from kvsim.planning.sweep import run_many

    scenario = kvsim.load_scenario(None, {"workload.num_requests": 3})
    assert len(run_many(iter([scenario]), workers=np.int64(1))) == 1


@pytest.mark.parametrize(("lengths", "said"), [("1", "context length 1"), ("1,200000", "context lengths 1, 200000")])
def test_capacity_sustained_says_the_context_lengths_it_cannot_probe(lengths, said):
    """A context of 1 token has no prompt and output to split (c/2 = 0), and 200,000 tokens exceed Llama-3.1-8B's
    max_model_len (its max_position_embeddings, 131,072): `--sustained` simulated neither, and with no other length
    the CSV (and the table) left its columns out without a word, as if it had never been asked for."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, ["capacity", "--context-lengths", lengths, "--sustained", "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"kvsim: warning: --sustained: no probe at {said}: a probe needs 2 tokens or more (a prompt and an output), "
        "at most max_model_len=131072, and a KV cache that holds one"]
    assert [line.split(",")[0] for line in result.stdout.splitlines()[1:]] == lengths.split(",")
