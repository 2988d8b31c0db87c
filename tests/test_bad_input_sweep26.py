"""Bad input found by the twenty-sixth sweep (the notebook API, `kvsim plan` under a memory limit, fleets, the
environment). Each is refused (the CLI: exit 2, one line naming the field and the value, nothing written; the
Python API: a `KvsimError`), or said as it is.

Found: an assignment to a loaded scenario or one of its sections (`scenario.seed = 5`, `scenario.engine.block_size
= -1`) raised pydantic's multi-line ValidationError, no `KvsimError`.
"""

from __future__ import annotations

import pytest

from kvsim.model.errors import KvsimError


@pytest.mark.parametrize(("section", "field", "value"), [
    ("", "seed", 5),
    ("engine", "block_size", -1),
    ("workload", "num_requests", 10),
    ("", "bogus", 1),  # not a field at all: refused the same way, never kept
])
def test_an_assignment_to_a_scenario_is_one_kvsim_error_line(section, field, value):
    """A section is frozen once validated; pydantic refused an assignment with its multi-line ValidationError
    ("1 validation error for Scenario / seed / Instance is frozen [type=frozen_instance, ...]")."""
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario()
    target = getattr(scenario, section) if section else scenario
    before = getattr(target, field, None)
    with pytest.raises(KvsimError) as error:
        setattr(target, field, value)
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"{field}={value}: ") and ".model_copy(update=" in text
    assert getattr(target, field, None) == before


def test_a_scenario_still_copies_with_a_change():
    """The way the error names: a copy with the change, the original untouched."""
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario()
    assert (scenario.model_copy(update={"seed": 5}).seed, scenario.seed) == (5, 0)

