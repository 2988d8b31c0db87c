"""The one error type users see, and the translation of pydantic's errors into it.

Contract: every problem with user input (a flag, a scenario field, a file) is raised as
`KvsimError` whose message is one line naming the field and the offending value. The CLI
prints that line and exits non-zero; it never shows a traceback.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


SHOWN_CHARS = 60


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` when at most `limit` characters, else its first `limit - 3` and `...`."""
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)`, cut to `limit` characters: an error names the value, it does not echo a file."""
    return cut(repr(value), limit)


_LONG_DIGITS = re.compile(rf"\d{{{SHOWN_CHARS + 1},}}")


class KvsimError(ValueError):
    """Bad user input or an impossible request; the message is a complete one-line explanation.

    A run of more than `SHOWN_CHARS` digits in the message is cut as `shown` cuts a value: an integer field
    takes any size (`--set engine.max_model_len=` and 400 digits), and the many messages that name such a
    value as `field={value}` would echo it whole."""

    def __init__(self, message: str, *args: object) -> None:
        super().__init__(_LONG_DIGITS.sub(lambda digits: cut(digits.group()), message), *args)

    def named(self, parameter: str) -> KvsimError:
        """This error as a command line says it, its output named as `parameter` (the command's option): itself,
        but an `OutputError`'s."""
        return self


class HeldKvStall(KvsimError):
    """vLLM's held-KV deadlock (`Scheduler.held_kv_stall` says why in the message): the run can never end, as
    vLLM's scheduler waits forever there. `kvsim run` stops with the line; a `kvsim plan` point reads it as a
    run that failed (`kvsim.planning.point.point_metrics`, verdict *stalled*): a deployment that stalls holds
    no SLO, and the search goes on to other rates and counts; so does a rate search's probe on the sweep
    machinery (`kvsim.planning.sweep.run_evidence`). A sweep read for summaries alone stops with the line."""


class SchedulingLivelock(HeldKvStall):
    """A request that preempts itself, is admitted again and comes back to the same state with nothing left that
    could change it (`kvsim.sched.livelock`): the run would loop forever, as vLLM's scheduler does there. A stall
    too: the CLI says the line, a `kvsim plan` point reads it as one (verdict *stalled*)."""


class OutputError(KvsimError):
    """An output refused or not written, as one line: `out_dir='runs/x': exists and ...`. The output is named as
    its caller passed it: from Python as the parameter (`out_dir` for a folder: `RunResult.write`, `simulate`,
    `build_report`; `path` for a file: `kvsim.results.output_dir`), from a command line as its option
    (`named("--output")`: kvsim's `user_errors`, a benchmark's `one_line`); `RunResult.write(out_dir=x)` said
    `--output=x`, an option Python has not. `path` is the output as given, `problem` what is wrong with it."""

    def __init__(self, path: object, problem: str, parameter: str = "out_dir") -> None:
        given = repr(str(path)) if isinstance(path, (str, os.PathLike)) else shown(path)
        super().__init__(f"{parameter}={given}: {problem}")
        self.path, self.problem = path, problem

    def named(self, parameter: str) -> OutputError:
        """This error with the output named as `parameter` (a command line's option)."""
        return type(self)(self.path, self.problem, parameter)


@contextmanager
def reading(path: str | Path, what: str) -> Iterator[None]:
    """Read `path` inside this block: a file that cannot be opened or is not UTF-8 text (a binary
    file, another encoding), a truncated .gz or a malformed CSV becomes one `KvsimError` line naming
    `what` and the file."""
    import csv
    import zlib

    try:
        yield
    except UnicodeDecodeError as error:
        if _gzip_bytes(path):  # a gzip file under a plain name: "not UTF-8 text (byte 1)" named no way out
            raise KvsimError(f"{what} {path}: gzip-compressed, but its name does not end in .gz (name it "
                             f"{Path(path).name}.gz, or decompress it)") from None
        raise KvsimError(f"{what} {path}: not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise KvsimError(f"{what} {path}: cannot read ({error.strerror or error})") from None
    except (EOFError, zlib.error) as error:  # a truncated or corrupt .gz
        raise KvsimError(f"{what} {path}: cannot read, the compressed file is truncated or corrupt "
                         f"({error})") from None
    except csv.Error as error:  # e.g. a field over the csv module's size limit
        raise KvsimError(f"{what} {path}: not a CSV file kvsim reads ({error})") from None


GZIP_MAGIC = b"\x1f\x8b"


def _gzip_bytes(path: str | Path) -> bool:
    """Whether `path` is a gzip file read as text: its name does not end in .gz, its first bytes are gzip's."""
    if str(path).endswith(".gz") or not Path(path).is_file():  # a FIFO would block a second open
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(GZIP_MAGIC)) == GZIP_MAGIC
    except OSError:
        return False


def not_a_file(path: str | Path, missing: str = "file not found", file_kind: str | None = None) -> str | None:
    """Why `path` is neither a regular file nor a folder, for a one-line error: `missing`, "not a
    regular file (a FIFO)" (a named pipe or /dev/zero: reading would block or never end), or the system's
    reason (a loop of symbolic links, a folder without search permission); None when it is either. With
    `file_kind` (e.g. "a scenario YAML file") only a file will do: a folder is "is a directory, not {file_kind}"."""
    import stat

    if isinstance(path, str) and not path.strip():  # Path('') is the working folder: an unset shell variable read
        return "is empty"  # it in silence; '  ' was 'file not found' (blank names nothing kvsim reads)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return missing
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the name
        return f"cannot read ({getattr(error, 'strerror', None) or error})"
    if stat.S_ISDIR(mode):
        return None if file_kind is None else f"is a directory, not {file_kind}"
    if stat.S_ISREG(mode):
        return None
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
             stat.S_ISSOCK: "a socket"}
    kind = next((name for test, name in kinds.items() if test(mode)), "not a file or folder")
    return f"not a regular file ({kind})"


def expect_flag(value: object, name: str) -> bool:
    """`value` when it is True or False, else a `KvsimError` naming it (`name`): a truthy text (`check="no"`) ran every
    check it meant to skip, and a NumPy boolean is no answer either."""
    if not isinstance(value, bool):
        raise KvsimError(f"{name}={shown(value)}: expected True or False")
    return value


def expect_count(value: object, name: str, least: int, expected: str) -> int:
    """`value` as an `int` when it is an integer (a NumPy one too, never a bool) of at least `least`, else a
    `KvsimError` naming it (`name`) and saying what is `expected`: `workers=2.5` was a TypeError deep in a pool."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise KvsimError(f"{name}={shown(value)}: expected {expected}")
    return int(value)


def expect_function(value: object, name: str, num_args: int, expected: str) -> None:
    """Refuse a `value` that is neither None nor a function taking `num_args` positional arguments, in one
    `KvsimError` line naming it (`name`) and saying what is `expected`: `progress=1` was a TypeError traceback at
    its first call. A callable whose signature Python cannot read (a builtin) is given the benefit of the doubt."""
    import inspect

    if value is None:
        return
    readable = callable(value)
    if callable(value):
        try:
            inspect.signature(value).bind(*([0] * num_args))
        except TypeError:
            readable = False
        except ValueError:  # no signature to read
            pass
    if not readable:
        raise KvsimError(f"{name}={shown(value)}: expected {expected}")


def first_repeat(values: Sequence[Any]) -> Any:
    """The first value equal to one before it, or None when each appears once (for "given twice")."""
    return next((value for i, value in enumerate(values) if value in values[:i]), None)


def empty_item(text: str) -> int | None:
    """The 1-based position of the first empty item of a comma-separated list (`1,,2` → 2, `1,` → 2), or None
    when every item holds something (for "item N is empty": a gap is a value left out, never skipped)."""
    items = [item.strip() for item in text.split(",")]
    return items.index("") + 1 if "" in items else None


def close_match(word: str, choices: list[str]) -> str:
    """` (did you mean X?)` for the choice nearest a misspelt `word` (`nearest`), or "" when none is near."""
    near = nearest(word, choices)
    return f" (did you mean {near}?)" if near is not None else ""


def nearest(word: str, choices: list[str]) -> str | None:
    """The choice nearest a misspelt `word` (difflib, similarity at least 0.75), or None when none is near."""
    import difflib

    near = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    return near[0] if near else None


def near_path(path: Path, pattern: str = "*", also: Sequence[Path] = ()) -> str:
    """` (did you mean X?)` for a `path` that names nothing: the entry matching `pattern` whose name is nearest its
    name (`nearest`: `.yml` for `.yaml`, `_` for `-`, a suffix left out, `Llama` for `llama`) in its folder, or in
    the nearest sibling folder where its folder does not exist (`scenario/x.yaml`: `scenarios/`), then in the
    folders `also` names; "" when none is near or a folder cannot be read."""
    folder = path.parent
    try:
        if not folder.is_dir():
            siblings = [sub.name for sub in folder.parent.iterdir() if sub.is_dir()] if folder.parent.is_dir() else []
            near_folder = nearest(folder.name, siblings)
            if near_folder is None:
                return ""
            folder = folder.parent / near_folder
        for where in (folder, *also):
            near = nearest(path.name, sorted(entry.name for entry in where.glob(pattern)))
            if near is not None:
                return f" (did you mean {where / near}?)"
    except OSError:  # a folder without read permission: no hint, the error stands
        pass
    return ""


def expect_name(field: str, name: object, wanted: str) -> str:
    """`name` (a model or GPU: a preset or a path) as text, a path object's too, else a `KvsimError` naming it:
    `load_model(None)` was an AttributeError in `blank_name` and `load_gpu([])` a TypeError (unhashable)."""
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str):
        raise KvsimError(f"{field}={shown(name)}: expected {wanted}, a name or a path")
    return name


def blank_name(field: str, name: str, wanted: str) -> str | None:
    """`field='name': is empty: name {wanted}` when `name` (a model or GPU: a preset or a path) is blank, else None:
    `Path('')` is the working folder, so an unset shell variable (`--model "$MODEL"`) read what lay there."""
    return f"{field}={name!r}: is empty: name {wanted}" if not name.strip() else None


def not_a_preset(field: str, name: str, presets: list[str], why: str = "", wanted: str = "a preset or a file") -> str:
    """Why `name`, no preset, cannot be read: `blank_name`; or, where it names something that is neither a regular
    file nor a folder (a FIFO, a device: reading it would block or never end), `field='name': not a regular file
    (a FIFO): name {wanted}` (`not_a_file`; "nor a file" named no reason); else `field='name': not a preset (the
    presets) nor a file` with `why` (what the path is instead), then ` (did you mean X?)` where a preset is near
    (`near_presets`)."""
    blank = blank_name(field, name, wanted)
    if blank is not None:
        return blank
    special = None if why else not_a_file(name)
    if special is not None and special.startswith("not a regular file"):
        return f"{field}={name!r}: {special}: name {wanted}"
    near = near_presets(name, presets)
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    return f"{field}={name!r}: not a preset ({', '.join(presets)}) nor a file{why}{hint}"


def near_presets(name: str, presets: list[str]) -> list[str]:
    """The presets a name that is none of them most likely meant, case aside, first rule that answers: the presets
    it begins, up to three (`h100`: h100-80gb or h100-pcie; more, as `llama`'s six, answer nothing: the list says
    them); the longest preset it holds with no letter or digit right after (a Hugging Face id,
    `meta-llama/Llama-3.1-8B-Instruct`: llama-3.1-8b; `NVIDIA-H100-80GB-HBM3`; `nvidia-l40s`: l40s; `rtx-a4000`
    holds no a40); the presets, up to three, that begin with its first family word that begins any (letters, then
    digits, at the start of a word, two characters at least: `H100-SXM`, `h100sxm`, nvidia-smi's `NVIDIA H100 80GB
    HBM3`: `h100`); the nearest (`nearest`: `llama3.1-8b`)."""
    key = name.strip().lower()
    starting = [preset for preset in presets if preset.startswith(key)]
    if starting:
        return starting if len(starting) <= 3 else []
    held = [preset for preset in presets if re.search(rf"{re.escape(preset)}(?![a-z0-9])", key)]
    if held:
        return [max(held, key=len)]
    for family in re.findall(r"(?<![a-z0-9])[a-z]+[0-9]*", key):
        if len(family) < 2:  # a lone letter (a path's `m`, `a`) is no family: it began mistral and mixtral
            continue
        same_family = [preset for preset in presets if preset.startswith(family)]
        if 0 < len(same_family) <= 3:
            return same_family
    near = nearest(key, presets)
    return [near] if near is not None else []


def union_members(annotation: Any) -> list[Any]:
    """The alternatives of a union or optional, Annotated unwrapped (`list[int] | None` -> [list[int], NoneType])."""
    from types import UnionType
    from typing import Annotated, Union, get_args, get_origin

    origin = get_origin(annotation)
    if origin in (Union, UnionType, Annotated):
        args = get_args(annotation)[:1] if origin is Annotated else get_args(annotation)
        return [member for arg in args for member in union_members(arg)]
    return [annotation]


def _union_tags(model: type | None, loc: tuple[Any, ...]) -> set[int]:
    """The positions in `loc` (from the pydantic `model`) that are pydantic's names for a union's member
    ('int', 'list[ReplicaGroup]', 'float'), not a field, an index or a key: after a field whose type is a
    union of two or more types, pydantic reports each member's failure under that member's name. A union
    with a discriminator (`prompt_len`'s `dist`) is named by the value the user wrote: that part stays."""
    from typing import get_args, get_origin

    tags: set[int] = set()
    annotation: Any = model
    discriminated = False
    for i, part in enumerate(loc):
        members = [m for m in union_members(annotation) if m is not type(None)]
        if len(members) > 1:  # `part` names the member; the next part is inside it: an index, a field or nothing
            if not discriminated:
                tags.add(i)
            following = loc[i + 1] if i + 1 < len(loc) else None
            annotation = next((m for m in members if (isinstance(following, int) and get_origin(m) in (list, tuple))
                               or following in getattr(m, "model_fields", {})), None)
            continue
        annotation = members[0] if members else None
        fields = getattr(annotation, "model_fields", None)
        discriminated = False
        if fields is not None and part in fields:
            annotation = fields[part].annotation
            discriminated = fields[part].discriminator is not None or _discriminated(annotation)
        elif isinstance(part, int) and get_origin(annotation) in (list, tuple):
            annotation = get_args(annotation)[0]
        else:
            break
    return tags


def _discriminated(annotation: Any) -> bool:
    """Whether `annotation` holds a union tagged by a discriminator (`Annotated[A | B, Field(discriminator=...)]`,
    alone or in an optional)."""
    from types import UnionType
    from typing import Annotated, Union, get_args, get_origin

    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return any(getattr(meta, "discriminator", None) is not None for meta in args[1:]) or _discriminated(args[0])
    return origin in (Union, UnionType) and any(_discriminated(arg) for arg in args)


def _past_union_members(errors: list[Any], first: Any, model: type | None) -> tuple[Any, tuple[Any, ...]]:
    """The error to report in place of `first`, and its location without union member names (`_union_tags`):
    `replicas: [{count: 1}, 5]` failed as an `int` (`replicas.int=[...]`: a valid integer is expected) and as a
    list (`replicas.list[ReplicaGroup].1=5`); the member that got furthest (the list, at item 1) says what is
    wrong, and the user wrote no field `int`."""
    tags = _union_tags(model, tuple(first["loc"]))
    if tags:
        at = min(tags)
        members = [e for e in errors if tuple(e["loc"][:at]) == tuple(first["loc"][:at]) and len(e["loc"]) > at]
        first = max(members, key=lambda e: len(e["loc"]))  # the earliest of the deepest
        tags = _union_tags(model, tuple(first["loc"]))
    return first, tuple(part for i, part in enumerate(first["loc"]) if i not in tags)


def _section_at(model: type | None, loc: tuple[Any, ...]) -> type | None:
    """The pydantic model class that `loc` leads to from `model` (a list's entry, `replicas.1`, is its item's
    class), or None where it leads to no model."""
    from typing import get_args

    for part in loc:
        if isinstance(part, int) and model is not None:  # an entry of the list the previous part gave
            continue
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return None
        candidates = [fields[part].annotation]
        for candidate in list(candidates):  # `X | None`, `int | list[Group]`: two levels of arguments
            candidates += [arg for inner in get_args(candidate) for arg in (inner, *get_args(inner))]
        model = next((c for c in candidates if isinstance(c, type) and hasattr(c, "model_fields")), None)
    return model


def _fields_at(model: type | None, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the pydantic model that `loc` leads to from `model`."""
    return list(getattr(_section_at(model, loc), "model_fields", {}))


def _moved_hint(model: type | None, loc: tuple[Any, ...], key: str, field: str) -> str:
    """` (did you mean section.key?)` for an unknown `key` (written as `field`) of the section `loc` leads to that is
    a field of one of that section's own sections, the first in field order (`max_model_len` at the top: the
    engine's; `workload.rate`: the arrival's), or ""."""
    parent = field.rpartition(".")[0]
    for name in _fields_at(model, loc):
        if key in _fields_at(model, (*loc, name)):
            return f" (did you mean {parent + '.' if parent else ''}{name}.{key}?)"
    return ""


def section_hint(model: type | None, loc: tuple[Any, ...], field: str, value: Any, setter: str = "") -> str:
    """What to write for a section given one value (`router=least_kv`, `router: least_kv`): pydantic's "a valid
    dictionary or instance of Router" named a class, not the form. The field of the section whose choices hold
    `value` (`router.policy=least_kv`), else the section's fields; each setting written after `setter` (the CLI's
    `--set `). "" where `loc` leads to no section."""
    from typing import Literal, get_args, get_origin

    section_fields = getattr(_section_at(model, loc), "model_fields", {})
    fields = list(section_fields)
    if not fields:
        return _tagged_hint(model, loc, field, setter)
    for name in fields:
        annotation = section_fields[name].annotation
        choices = get_args(annotation) if get_origin(annotation) is Literal else ()
        if isinstance(value, str) and value in choices:
            return f": set its field, {setter}{field}.{name}={value}"
    listed = ", ".join(fields) if len(fields) <= 6 else f"{', '.join(fields[:6])}, ..."
    return f": set its fields ({listed}), e.g. {setter}{field}.{fields[0]}=..."


def _tagged_hint(model: type | None, loc: tuple[Any, ...], field: str, setter: str) -> str:
    """For a field that is one of several sections told apart by a tag (`prompt_len`: `{dist: fixed, value: 512}`,
    `{dist: uniform, ...}`): the tag and its values; "" for any other field."""
    from typing import get_args

    parent = _section_at(model, loc[:-1]) if loc else None
    info = getattr(parent, "model_fields", {}).get(loc[-1]) if loc else None
    if info is None:
        return ""
    pending, tag, members = [info.annotation, *info.metadata], None, []
    while pending:  # `X | None`, `Annotated[A | B, Field(discriminator=...)]`: their arguments and metadata
        item = pending.pop(0)
        tag = tag or (getattr(item, "discriminator", None) if isinstance(getattr(item, "discriminator", None), str)
                      else None)
        if hasattr(item, "model_fields"):
            members.append(item)
        else:
            pending += [*get_args(item), *getattr(item, "__metadata__", ())]
    values = [str(v) for m in members for v in get_args(m.model_fields[tag].annotation)] if tag else []
    return f": give {setter}{field}={{{tag}: {values[0]}, ...}} ({tag}: {', '.join(values)})" if values else ""


def from_validation_error(error: ValidationError, prefix: str = "", model: type | None = None,
                          name: str = "value") -> KvsimError:
    """Turn pydantic's multi-line report into one line: `field.path=value: reason`.

    Only the first problem is reported: fixing one field at a time is how people work, and a
    single line keeps the CLI contract. Given the validated `model` class, a misspelt key is
    told the nearest field name (`engine.max_num_seq: unknown key (did you mean max_num_seqs?)`).
    A problem with the whole input (no field, no `prefix`) names it `name`: `Scenario.model_validate("x")` was
    `value='x': ..., e.g. value.name=...`, a field the caller never gave.
    """
    errors = error.errors()
    # A misspelt key usually explains a "missing" one too: report unknown keys (and keys that are no names) first.
    first = next((e for e in errors if e["type"] in ("extra_forbidden", "invalid_key")), errors[0])
    first, where = _past_union_members(errors, first, model)
    loc = ".".join(str(part) if len(str(part)) <= SHOWN_CHARS else shown(str(part)) for part in where)
    field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or name)
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        key = str(first["loc"][-1]) if first["loc"] else ""
        fields = _fields_at(model, where[:-1]) if where else []
        name, colon, _ = key.partition(":")
        if colon and name.strip() in fields:  # YAML reads `{cpu_bytes:1GiB}` as one key: it needs `: `
            return KvsimError(f"{field}: unknown key; YAML needs a space after the colon: "
                              f"`{name.strip()}: {key[len(name) + 1:].strip()}`")
        hint = close_match(key, fields) or _moved_hint(model, where[:-1], key, field)
        return KvsimError(f"{field}: unknown key{hint}")
    if first["type"] == "missing":
        return KvsimError(f"{field}: required field is missing")
    if first["type"] == "invalid_key":  # YAML's `1: x` or `~: x`, a dict's non-str key
        return KvsimError(f"{field}: a key must be a string, not {type(first.get('input')).__name__}")
    if isinstance(first.get("input"), dict) and first["type"] == "value_error":  # a check across fields: the
        # message names them
        return KvsimError(f"{field}: {message}" if prefix or loc else message)
    if first["type"] == "int_parsing_size" and not isinstance(first.get("input"), str):  # "input string": a float
        message = "a float or a NumPy number is read as an integer only up to int64 (2**63 - 1); give an int"
    if first["type"] in ("model_type", "model_attributes_type") and not isinstance(first.get("input"), dict):
        # a value for a section (model_attributes_type: for one of several told apart by a tag)
        message = "a section, not one value" + section_hint(model, where, field, first["input"]) if prefix or loc \
            else f"expected a dict of its fields{f' or a {model.__name__}' if model else ''}"  # the whole input
    if isinstance(first.get("input"), bool) and first["type"] in ("string_type", "literal_error", "enum"):
        message += " (YAML reads an unquoted yes, no, on or off as true or false: quote the text, 'no')"
    return KvsimError(f"{field}={shown(first.get('input'))}: {message}")
