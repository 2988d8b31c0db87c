"""Bad input found by the twenty-first sweep. Each is refused (the CLI: exit 2, one line naming the field and the
value, nothing written; the Python API: a `KvsimError`), or said as it is.

Found: `--set router=least_kv` (one value for a section) was refused in pydantic's words, "Input should be a valid
dictionary or instance of Router", a class name, not the form to write (`router.policy=least_kv`). An xPyD plan
row's evidence line called the split's two instances "2 replicas" (`tests/test_plan_verify.py`).
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
