"""Field overrides of a scenario (`--set k=v`, or a dict of dotted keys): how they are read and applied
to a raw scenario dict before it is validated (`kvsim.workload.scenario.load_scenario`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from kvsim.model.errors import KvsimError, shown
from kvsim.model.units import ascii_int
from kvsim.model.yaml_io import load_yaml, yaml_problem

Overrides = Mapping[str, Any] | Sequence[str]
"""Field overrides: `["engine.block_size=32"]` as `--set` gives them (values parsed as YAML), or
`{"engine.block_size": 32}` (values as given). Each replaces the field it names, a section too; a number
names a list's entry (`replicas.1.count=2`). Applied in order: a field given twice keeps the last value, as
Helm's repeated `--set` does (a command's own flags, applied after, may not set a field a `--set` sets:
`kvsim.cli.shared.refuse_flag_beside_set`)."""


class FlagOverride(str):
    """A `--set`-style override (`engine.max_num_seqs=5`) that a command's own flag makes (`--max-num-seqs=5`, its
    `label`): an error about it names the flag the user gave, not a `--set` they did not."""

    label: str

    def __new__(cls, text: str, label: str) -> FlagOverride:
        override = super().__new__(cls, text)
        override.label = label
        return override


def apply_overrides(raw: dict[str, Any], overrides: Overrides) -> dict[str, Any]:
    """Apply dotted-key overrides (see `Overrides`) to a raw scenario dict, in place; returns it. One that a replica
    group's own setting replaces is refused (`refuse_replaced_by_group`)."""
    items = override_items(overrides)
    for key, value, label in items:
        if "" in key.split("."):  # `engine..block_size` (`engine____block_size=` in `kvsim.simulate`)
            raise KvsimError(f"{label}: an empty field name between its dots")
        _refuse_beneath_count(raw.get("replicas"), key, label)
        _set_field(raw, key.split("."), value, label)
    refuse_replaced_by_group(raw.get("replicas"), items)
    return raw


def _refuse_beneath_count(replicas: Any, key: str, label: str) -> None:
    """Refuse an override beneath `replicas` (`replicas.0.gpu`) where the scenario's raw `replicas` is a count or not
    given: a section was made for it, and the scenario refused as `replicas={'0': {...}}: Input should be a valid
    integer`. A group's field is set only where a list of groups is given; one given as a mapping is left to the
    scenario's own check."""
    parts = key.split(".")
    if parts[0] != "replicas" or len(parts) == 1 or isinstance(replicas, (dict, list)):
        return
    count = "not given: one engine" if replicas is None else shown(replicas)
    group = ascii_int(parts[1]) is not None
    raise KvsimError(f"{label}: replicas is an integer count here ({count}), not a list of replica groups" +
                     ("; to set a group's field, give replicas as a list of groups in the scenario "
                      "(replicas: [{count: 2, gpu: h200}])" if group else ""))


def refuse_replaced_by_group(groups: Any, items: list[tuple[str, Any, str]]) -> None:
    """Refuse an override (`items`, as `override_items` gives them) of a scenario-wide field that one of the replica
    `groups` (a scenario's raw `replicas`; a count has none) gives for its own replicas: `engine.max_num_seqs=8` beside
    `replicas: [{engine: {max_num_seqs: 64}}]` (or `max_num_seqs: null`, the engine's default), `gpu` or `model`
    beside a group's own. The group's value replaces the scenario's there (`kvsim.fleet.driver`), so the override
    reached none of that group's replicas without a word; `replicas.G.engine.FIELD` sets one group's."""
    groups = [group if isinstance(group, dict) else {} for group in groups] if isinstance(groups, list) else []
    for key, value, label in items:
        parts = key.split(".")
        if parts[0] == "engine" and len(parts) > 1:
            fields = [".".join(parts[:2])]
        elif key == "engine" and isinstance(value, dict):  # a section: each field it gives
            fields = [f"engine.{name}" for name in value]
        else:
            fields = [key] if key in ("model", "gpu") else []
        for field in fields:
            name = field.removeprefix("engine.")
            for g, group in enumerate(groups):
                if field.startswith("engine."):  # null too: the engine's default, which replaces the scenario's
                    own = group.get("engine")
                    gives = isinstance(own, dict) and name in own
                else:  # null: the scenario's model or GPU
                    own, gives = group, group.get(name) is not None
                if gives:
                    raise KvsimError(f"{label}: sets {field}, which replicas.{g}.{field}={shown(own[name])} sets for "
                                     f"that group's replicas; give each field once (per group: --set "
                                     f"replicas.{g}.{field}=...)")


def undone_by(key: str, earlier: list[str]) -> str | None:
    """The first of the `earlier` dotted keys that an override of `key` after them undoes: the same field again, or
    one inside the section `key` replaces (`engine` after `engine.max_num_seqs`); None when none is. A field
    inside a section set before it (`engine.max_num_seqs` after `engine`) is set there, and undoes nothing."""
    parts = key.split(".")
    return next((done for done in earlier if done.split(".")[:len(parts)] == parts), None)


def held_by_section(key: str, items: list[tuple[str, Any, str]]) -> tuple[str, Any, str] | None:
    """The first of `items` (`override_items`) that sets a section above the dotted `key` with a value that gives
    `key`'s field (`engine={max_num_seqs: 8}` holds `engine.max_num_seqs`); None when none does. An override of
    `key` after it drops that value (`_set_field` replaces the one field)."""
    parts = key.split(".")
    for item in items:
        above = item[0].split(".")
        if len(above) >= len(parts) or parts[:len(above)] != above:
            continue
        node = item[1]
        for part in parts[len(above):]:
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return item
    return None


def override_items(overrides: Overrides) -> list[tuple[str, Any, str]]:
    """Each override as (dotted key, value, the label its errors start with: `--set 'k=v'` for a string,
    whose value is parsed as YAML, its flag for a `FlagOverride`; `override 'k'` for a dict's entry, whose value is
    as given)."""
    if isinstance(overrides, str):
        overrides = [overrides]
    if not isinstance(overrides, (Mapping, Sequence)):  # iterating an int was a bare TypeError
        raise KvsimError(f"overrides={shown(overrides)}: expected a dict of dotted keys to values, or "
                         "'dotted.key=value' strings")
    if isinstance(overrides, Mapping):  # each value a copy: a later override sets fields inside it
        return [(str(key), _fresh(value), f"override {key!r}") for key, value in overrides.items()]
    items = []
    for item in overrides:
        if not isinstance(item, str):  # `item.partition` was an AttributeError
            raise KvsimError(f"overrides item {shown(item)}: expected a 'dotted.key=value' string")
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise KvsimError(f"--set {shown(item)}: expected dotted.key=value")
        try:
            label = item.label if isinstance(item, FlagOverride) else f"--set {shown(item)}"
            items.append((key, load_yaml(value), label))
        except yaml.YAMLError as error:
            raise KvsimError(f"{label}: the value is not valid YAML ({yaml_problem(error)})") from None
    return items


def _fresh(value: Any) -> Any:
    """`value` with each dict and list in it (the nodes `_set_field` sets fields in) copied, as deep as they go:
    `kvsim.simulate(engine__speculative_config=spec, engine__speculative_config__num_speculative_tokens=3)` set
    K=3 in the caller's own `spec`. Other values are kept as they are (the scenario validates them)."""
    if isinstance(value, dict):
        return {key: _fresh(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_fresh(item) for item in value]
    return value


def _set_field(node: dict[str, Any] | list[Any], parts: list[str], value: Any, label: str) -> None:
    """Set the field `parts` names under `node`, making missing sections; a number indexes a list
    (`replicas.1.count=2`: the second pool's count)."""
    for depth, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            child = node[_list_index(node, parts[:depth + 1], label)]
        else:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
        if not isinstance(child, (dict, list)):
            raise KvsimError(f"{label}: {part} is not a section")
        node = child
    if isinstance(node, list):
        node[_list_index(node, parts, label)] = value
    else:  # replaced, never merged: `workload.prompt_len={dist: fixed, value: 512}` means just that
        node[parts[-1]] = value


def _list_index(items: list[Any], parts: list[str], label: str) -> int:
    """The list entry `parts[-1]` names (0-based), or a `KvsimError` naming the list and its length."""
    where, part = ".".join(parts[:-1]), parts[-1]
    index = ascii_int(part)  # `²` passed str.isdigit and int() refused it: a traceback
    if index is None or index >= len(items):
        raise KvsimError(f"{label}: {where} is a list of {len(items)}: index an entry by its number, 0 to "
                         f"{len(items) - 1} (got {shown(part)})" if items else f"{label}: {where} is an empty list")
    return index
