"""YAML (and JSON) as kvsim reads user files: safe, duplicate keys refused, errors told in one short line.

PyYAML reads YAML 1.1, where `016` is the octal 14, `0b1010` the binary 10 and `1:30` the base-60 90 (`1:30.5`
90.5), forms YAML 1.2 reads otherwise: `load_yaml` refuses them (quoted, they stay text), so a zero-padded
`block_size: 016` is never 14 in silence. A hexadecimal integer (`0x10`) reads as 16 in both YAMLs, and is kept. A
number with an underscore (`1_0`, which YAML 1.1 reads as 10) stays the text it was, as YAML 1.2 reads it: a
numeric field refuses it, naming itself (`kvsim.model.spec.Settings`).

A YAML 1.1 timestamp (`2024-01-01`) stays the text it was: no field kvsim reads is a date.

PyYAML keeps the last of two equal keys (`engine:` twice: the first section silently lost), merges two `<<` merge
keys of one mapping, the second's keys over the first's, and gives a key that two mappings of `<<: [*a, *b]` both
hold the last's value where YAML's merge key gives the first's; `load_yaml` refuses them instead, naming the lines
(`load_shipped_yaml` reads kvsim's own presets).
`yaml_problem` gives an error's problem and position without echoing the offending text (a file of
anything may have been named).

An integer literal longer than Python converts (`sys.get_int_max_str_digits()`, 4,300 digits: a guard
against quadratic-time conversion) is a bare `ValueError` out of both PyYAML and `json`, and text nested
deeper than the interpreter's recursion limit (`[[[[...`) a `RecursionError`, which no reader expects:
`load_yaml` makes them a `yaml.YAMLError` and `load_json` a `json.JSONDecodeError`, so each reader
reports them as it reports any malformed file.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from kvsim.model.errors import KvsimError, first_repeat, shown

MAX_ALIASED_VALUES = 100_000
"""The most values aliases (`*name`) may repeat in one YAML text. An alias is one node where it is read, but
every value it repeats is walked by what reads the result (the scenario's checks, pydantic, `scenario.yaml`):
nine lines of ten aliases each (a "billion laughs") made 10**9 values, a run that never ended."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that raises on a mapping with a repeated key, on aliases that repeat more than
    `MAX_ALIASED_VALUES` values and on an alias inside the node it names (a list holding itself: what reads it
    recursed without end, a RecursionError)."""

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        counts: dict[int, int] = {}
        values = _count_values(node, counts, set())
        distinct = len(counts)  # every node of the graph, each once
        if values - distinct > MAX_ALIASED_VALUES:
            raise yaml.MarkedYAMLError(problem=f"its aliases repeat {values - distinct:,} values, more than kvsim "
                                       f"reads ({MAX_ALIASED_VALUES:,})")
        return self.construct_document(node)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _count_values(node: yaml.Node, counts: dict[int, int], inside: set[int]) -> int:
    """The values `node` holds once every alias in it is read as a copy of what it names (each node counted
    once: `counts`, by id); an alias inside the node it names (`inside`: the nodes around this one) raises."""
    if id(node) in counts:
        return counts[id(node)]
    if id(node) in inside:
        raise yaml.MarkedYAMLError(problem="an alias refers to a node that holds it (a loop)",
                                   problem_mark=node.start_mark)
    inside.add(id(node))
    counts[id(node)] = 1 + sum(_count_values(child, counts, inside) for child in _children(node))
    inside.discard(id(node))
    return counts[id(node)]


_MERGE = "tag:yaml.org,2002:merge"


def _refuse_ambiguous_merges(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> None:
    """Refuse the merges whose result YAML and PyYAML disagree on: two `<<` in one mapping (PyYAML merges both, the
    second's keys over the first's: a key written twice, one value lost in silence), and a key that two mappings of
    one `<<: [*a, *b]` both give (YAML's merge key takes the first's value, PyYAML 6.0.2 the last's: it drops a
    repeated key by the identity of its text, which two equal keys written apart do not share). Merged mappings
    are checked in turn (their own `<<`)."""
    merges = [(key_node, value) for key_node, value in node.value if key_node.tag == _MERGE]
    if len(merges) > 1:
        lines = [key_node.start_mark.line + 1 for key_node, _ in merges]
        raise ConstructorError(None, None, f"duplicate key '<<' (lines {lines[0]} and {lines[1]}): give one merge "
                               "key, a list of mappings to merge several (<<: [*a, *b])")
    for _, value in merges:
        merged = value.value if isinstance(value, yaml.SequenceNode) else [value]
        given: dict[Any, int] = {}  # each key merged in, to the line of the mapping that gave it first
        for mapping in merged:
            if not isinstance(mapping, yaml.MappingNode):
                continue  # PyYAML refuses it, naming it
            _refuse_ambiguous_merges(loader, mapping)
            try:
                keys = {loader.construct_object(key_node, deep=True) for key_node, _ in mapping.value
                        if key_node.tag != _MERGE}
            except TypeError:  # an unhashable key: the base constructor names it
                continue
            for key in keys:
                if key in given:
                    raise ConstructorError(None, None, f"key {shown(key)} is in two mappings merged by one '<<' "
                                           f"(lines {given[key] + 1} and {mapping.start_mark.line + 1}): YAML reads "
                                           "the first's value, PyYAML the last's; write it beside the '<<'")
                given[key] = mapping.start_mark.line


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    _refuse_ambiguous_merges(loader, node)
    written = sum(key_node.tag != _MERGE for key_node, _ in node.value)
    loader.flatten_mapping(node)  # `<<` merge keys: their pairs go first, where a key written here overrides them
    lines: dict[Any, int] = {}
    for key_node, _ in node.value[len(node.value) - written:]:  # the keys written here, each once
        key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line
        try:
            if key in lines:  # the position is in the message: no mark, so yaml_problem adds none
                raise ConstructorError(None, None, f"duplicate key {shown(key)} (lines {lines[key] + 1} and "
                                       f"{line + 1}): give each key once")
            lines[key] = line
        except TypeError:  # an unhashable key: the base constructor names it
            break
    return loader.construct_mapping(node, deep=True)


_YAML11_INT = re.compile(r"[-+]?(0b[01_]+|0[0-7_]+|[0-9][0-9_]*(:[0-5]?[0-9])+)")
"""YAML 1.1's binary (`0b1010`), octal (`016`) and base-60 (`1:30`) integers: PyYAML reads them as 10, 14 and 90,
YAML 1.2 as text (`0b1010`, `1:30`) or as 16 (`016`)."""


def _int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> int | str:
    if "_" in node.value:  # `1_0`: the text, as YAML 1.2 reads it (see `_float`)
        return str(node.value)
    try:
        value = loader.construct_yaml_int(node)
    except ValueError:  # the one an int the resolver matched can raise: too many digits (see the docstring)
        raise ConstructorError(None, None, _too_long(node.value), node.start_mark) from None
    if _YAML11_INT.fullmatch(node.value) and node.value.strip("+-0"):  # `block_size: 016` was 14 in silence
        kind = "binary" if "b" in node.value else "octal or base-60"
        raise ConstructorError(None, None, f"{node.value} reads as {value} (a YAML 1.1 {kind} integer): write the "
                               "number in decimal, without a leading zero, 0b or a colon, or quote it",
                               node.start_mark)
    return value


def _float(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> float | str:
    """A YAML 1.1 float, except two forms YAML 1.2 reads as no number: one with an underscore (`0.9_5`, which
    PyYAML reads as 0.95) stays the text it was, which a numeric field refuses naming itself (as `1_0`, where a
    slip is as likely as a digit grouping: `kvsim.model.units.underscore_problem`); a base-60 one (`1:30.5`, read
    as 90.5) is refused, as its integer form is."""
    if "_" in node.value:
        return str(node.value)
    value = loader.construct_yaml_float(node)
    if ":" in node.value:
        raise ConstructorError(None, None, f"{node.value} reads as {value:g} (a YAML 1.1 base-60 number): write the "
                               "number without a colon, or quote it", node.start_mark)
    return value


def _too_long(digits: str) -> str:
    return f"an integer of {sum(c.isdigit() for c in digits):,} digits is longer than kvsim reads"


def _timestamp(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> str:
    """A YAML 1.1 timestamp (`2024-01-01`) as the text it was: no kvsim field takes a date, and a name
    written as one (`name: 2024-01-01`) was refused as `name=datetime.date(2024, 1, 1)`, a value the file
    does not hold."""
    return str(loader.construct_scalar(node))


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _int)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _float)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp)


TOO_DEEP = "nested too deeply for kvsim to read"
TEXT_ENCODING = "utf-8-sig"
"""The encoding of every text file kvsim reads, whatever the locale's (an ASCII one, `LC_ALL=C` with `PYTHONUTF8=0`,
read a UTF-8 scenario naming `café` as "not UTF-8 text"; a Latin-1 one read it as `cafÃ©`): UTF-8, a leading
byte-order mark skipped: spreadsheet programs start a CSV with one, which was read as part of the first column's
name (`\ufeffTIMESTAMP`: "TIMESTAMP=None is not a timestamp")."""
MAX_YAML_BYTES = 2**20
"""The largest YAML (or config.json) file kvsim reads: PyYAML's pure-Python parser takes about 0.4 s a MB, so a
file of 100 MB named by mistake (a trace, a log) ran ~41 s before its error. The largest file kvsim ships is
12 KB (the GPU presets), a model's config.json a few KB."""


def settings_text(path: str | Path, what: str) -> str:
    """The text of the YAML or JSON settings file `path` (`what` names it in an error), read as UTF-8
    (`TEXT_ENCODING`) once `check_yaml_size` passes it; call it inside `kvsim.model.errors.reading`."""
    check_yaml_size(path, what)
    return Path(path).read_text(encoding=TEXT_ENCODING)


def check_yaml_size(path: str | Path, what: str) -> None:
    """A `KvsimError` naming `what`, the file and its size when `path` holds more than `MAX_YAML_BYTES`; call it
    inside `kvsim.model.errors.reading`, which reports a file that cannot be inspected."""
    size = os.stat(path).st_size
    if size > MAX_YAML_BYTES:
        raise KvsimError(f"{what} {path}: {size:,} bytes, more than the {MAX_YAML_BYTES:,} kvsim reads in a YAML "
                         "or JSON settings file (is it the file you meant?)")


def load_yaml(text: str) -> Any:
    """`yaml.safe_load(text)`, except that a repeated key, an integer too long to convert or text nested too
    deeply is a `yaml.YAMLError`."""
    _refuse_a_deep_flow_run(text)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise yaml.MarkedYAMLError(problem=TOO_DEEP) from None


def _refuse_a_deep_flow_run(text: str) -> None:
    """The `TOO_DEEP` error, raised before PyYAML reads `text`, when its first run of more consecutive `[` and `{`
    than the recursion limit opens that many nested flow collections: the loader, which spends at least one
    Python frame a level, would end in a RecursionError (the same error), but only after ~1 s in PyYAML's scanner,
    which walks every open level at each token. The run opens collections when PyYAML parses the text up to it and
    the run's first three characters as three collection starts there: past an opening `[` or `{`, a `[` or `{`
    always opens another. A run inside a quoted or block scalar, a comment or a plain scalar (`a: x[[[`) parses
    otherwise, and a text malformed before the run fails that parse: both are left to the loader."""
    run = re.search(rf"[\[{{]{{{sys.getrecursionlimit() + 1},}}", text)
    if run is None:
        return
    opened = documents = 0
    try:
        for event in yaml.parse(text[:run.start() + 3], Loader=yaml.SafeLoader):
            documents += isinstance(event, yaml.DocumentStartEvent)
            if isinstance(event, yaml.CollectionStartEvent) and event.start_mark.index >= run.start():
                opened += 1
    except yaml.YAMLError:
        pass  # the prefix ends inside the run's open collections (or is malformed before it: `opened` says)
    if opened == 3 and documents == 1:  # in a second document, the loader refuses the stream before composing it
        raise yaml.MarkedYAMLError(problem=TOO_DEEP)


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, unless a key repeats (`json` keeps the last one without a word)."""
    out = dict(pairs)
    if len(out) < len(pairs):
        raise _DuplicateKey(first_repeat([key for key, _ in pairs]))
    return out


_UNIQUE_KEYS = json.JSONDecoder(object_pairs_hook=_unique_keys)
"""The one decoder `load_json` uses: `json.loads` given a hook builds a decoder and its scanner at every call,
a third of the time a Mooncake trace row takes to read (every line of a JSONL trace is a call)."""


def load_json(text: str) -> Any:
    """`json.loads(text)`, except that a repeated key in an object (as `load_yaml` refuses one: a trace row giving
    `input_length` twice was read as its last), an integer too long to convert or text nested too deeply is a
    `json.JSONDecodeError` (see the module docstring)."""
    try:
        if text.startswith("\ufeff"):  # as `json.loads` refuses it (a decoder's `decode` reads it as no value)
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return _UNIQUE_KEYS.decode(text)
    except json.JSONDecodeError:
        raise
    except _DuplicateKey as error:
        again = list(re.finditer(re.escape(json.dumps(error.key)) + r"\s*:", text))[1:2]  # where it is written again
        raise json.JSONDecodeError(f"duplicate key {shown(error.key)}: give each key once", text,
                                   again[0].start() if again else 0) from None
    except RecursionError:
        raise json.JSONDecodeError(TOO_DEEP, text, 0) from None
    except ValueError:
        long_digits = re.search(rf"\d{{{sys.get_int_max_str_digits() + 1},}}", text)
        if long_digits is None:
            raise
        raise json.JSONDecodeError(_too_long(long_digits[0]), text, long_digits.start()) from None


def load_shipped_yaml(text: str) -> Any:
    """`yaml.safe_load(text)` for the YAML files kvsim ships (presets: no repeated keys, never a user's
    file), through libyaml's C parser when PyYAML has it: the same objects, parsed several times faster
    (they are read at every run's start)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe loaders


def flag_mapping(text: str, flag: str) -> dict[Any, Any]:
    """A flag's JSON object, as vLLM's JSON flags take one (`--speculative-config '{"method": "eagle", ...}'`,
    `--kv-transfer-config '{"kv_connector": "NixlConnector"}'`: vLLM reads them with `json.loads`); anything
    else, the empty text included, is one `KvsimError` line naming the flag."""
    try:
        value = load_json(text)
    except json.JSONDecodeError as error:
        raise KvsimError(f"{flag}={shown(text)}: not JSON ({error.msg} at character {error.pos})") from None
    if not isinstance(value, dict):
        raise KvsimError(f"{flag}={shown(text)}: expected a JSON object")
    return value


def yaml_problem(error: yaml.YAMLError) -> str:
    """The error's problem and where it is (`... at line 3, column 7`), never the offending text."""
    if isinstance(error, yaml.reader.ReaderError):  # a control character: no problem or mark, a position
        code = error.character if isinstance(error.character, int) else ord(error.character)
        return f"character #x{code:04x} is not allowed ({error.reason}) at character {error.position}"
    problem = getattr(error, "problem", None) or getattr(error, "context", None) or type(error).__name__
    if problem.startswith("but ") and getattr(error, "context", None):  # the half of a sentence the context begins:
        problem = f"{error.context}, {problem}"  # `expected a single document in the stream, but found another ...`
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(problem)
