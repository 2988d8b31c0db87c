"""YAML 1.1 reads an unquoted yes, no, on or off as a boolean: a text field given one is refused with the
reason spelt out, since the message's value (False) is not what the user typed (no)."""

import pytest

from tests.conftest import one_line_exit_2

HINT = "(YAML reads an unquoted yes, no, on or off as true or false: quote the text, 'no')"


@pytest.mark.parametrize(("text", "expected"), [
    ("name: no", "name=False: Input should be a valid string " + HINT),
    ("engine: {scheduling_policy: on}", "engine.scheduling_policy=True: Input should be 'fcfs' or 'priority' " + HINT),
])
def test_a_yaml_boolean_where_text_belongs_says_why(tmp_path, text, expected):
    (tmp_path / "s.yaml").write_text(f"{text}\nworkload: {{num_requests: 5}}\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == expected
    assert not (tmp_path / "out").exists()


def test_a_quoted_no_is_text_and_a_boolean_field_takes_no():
    from kvsim.workload.scenario import load_scenario

    spec = load_scenario(None, ["name='no'", "engine.enable_prefix_caching=no"])  # --set values are YAML too
    assert spec.name == "no" and spec.engine.enable_prefix_caching is False
