"""`load_yaml` refuses a run of flow openers deeper than the recursion limit before PyYAML reads the text
(`kvsim.model.yaml_io._refuse_a_deep_flow_run`): the same error the loader's RecursionError became, without the
~1 s PyYAML's scanner spent reaching it, and nothing else changes."""

from __future__ import annotations

import sys

import pytest
import yaml

from kvsim.model import yaml_io
from kvsim.model.yaml_io import TOO_DEEP, load_yaml

RUN = sys.getrecursionlimit() + 1  # one past what the pre-check counts as too deep


def plain(text: str) -> object:
    """`load_yaml` without the pre-check: its loader, a RecursionError told as too deep (the naive path)."""
    try:
        return yaml.load(text, Loader=yaml_io._UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise yaml.MarkedYAMLError(problem=TOO_DEEP) from None


@pytest.mark.parametrize("text", [
    "name: " + "[" * RUN + "]" * RUN + "\n",  # a flow sequence in a block mapping
    "[" * RUN + "]" * RUN,  # a whole --set value
    "x: " + "{" * RUN + "}" * RUN,  # flow mappings, each the key of the one around it
    "x: " + "[{" * RUN + "}]" * RUN,
    "a: 1\nb: [1, " + "[" * RUN + "]" * RUN + "]\n",  # the run opens inside a collection already open
    "%YAML 1.1\n---\nname: " + "[" * RUN + "]" * RUN,  # in the stream's one document
])
def test_a_run_of_flow_openers_past_the_recursion_limit_is_refused_before_pyyaml_reads_it(text, monkeypatch):
    def no_loader(*args, **kwargs):
        raise AssertionError("the loader ran")

    monkeypatch.setattr(yaml_io.yaml, "load", no_loader)
    with pytest.raises(yaml.MarkedYAMLError, match=f"^{TOO_DEEP}$"):
        load_yaml(text)


DEEP = "[" * RUN + "]" * RUN


@pytest.mark.parametrize("text", [
    f"name: '{DEEP}'\n",  # quoted: text
    f'name: "{DEEP}"\n',
    f"name: x{DEEP}\n",  # a plain scalar in a block mapping holds brackets
    f"# {DEEP}\nname: a\n",  # a comment
    f"name: |\n  {DEEP}\n",  # a block scalar
    f"name: >\n  {DEEP}\n",
    f"a: [\n- b\nname: {DEEP}\n",  # malformed before the run: the loader's own error
    f"a: *nope\nname: '{DEEP}'\n",
    f"a: 1\n---\nname: {DEEP}\n",  # a second document: refused as one before it is composed
])
def test_a_run_the_pre_check_does_not_count_reads_as_the_loader_reads_it(text):
    def outcome(load) -> object:
        try:
            return load(text)
        except yaml.YAMLError as error:
            return type(error), str(error)

    assert outcome(load_yaml) == outcome(plain)


def test_a_run_as_long_as_the_recursion_limit_is_left_to_the_loader(monkeypatch):
    monkeypatch.setattr(yaml_io.yaml, "load", lambda text, Loader: "the loader's")  # noqa: N803 - yaml's name
    assert load_yaml("[" * (RUN - 1) + "]" * (RUN - 1)) == "the loader's"
