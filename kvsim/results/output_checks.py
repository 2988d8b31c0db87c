"""Where kvsim may write: the checks an output passes before anything is written (`check_output_dir`,
`check_output_file`), the marker that tells a folder kvsim wrote, a harmless name for a default folder
(`safe_component`), and an OS error on an output said as that output's (`errors_name_output`).

kvsim writes only to a path that does not exist yet or that it wrote itself:

    runs/default/                 a kvsim folder: its marker lists every file kvsim put there
      .kvsim-output               {"kvsim": "0.1.0", "kind": "run", "files": ["requests.csv", ...]}
      requests.csv  steps.csv  summary.json  scenario.yaml

A folder without the marker, a folder holding anything its marker does not list (a user's
notes beside a run), a file, a symlink, `/`, the home directory and the working directory or
any of its ancestors are refused with a one-line `KvsimError`; no flag overrides this. A
single output file (a calibration profile) is replaced only if its first line is
`FILE_TAG`, which every such file kvsim writes begins with; a study's JSON result only if it
is a JSON object of exactly that result's keys. How it then replaces its own output: `kvsim.results.output_dir`.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvsim.model.errors import OutputError
from kvsim.model.units import control_character

MARKER_NAME = ".kvsim-output"
# The most of a file kvsim reads to tell a JSON result or an output folder's marker it wrote (kilobytes, a few MB).
MAX_JSON_RESULT_BYTES = 64 * 2**20
FILE_TAG = "# generator: kvsim"
TEMP_INFIX = ".kvsim-"  # a writer's temporary beside its output: `.NAME.kvsim-PID-XXXX` (`output_dir`)
MAX_COMPONENT_CHARS = 100  # a default folder's name at most: room left under NAME_MAX (255) for the temporaries'
_DIGEST_CHARS = 8  # hex digits of the whole name's SHA-256 that tell apart names cleaned or cut to one beginning


def safe_component(name: str, fallback: str = "scenario") -> str:
    """`name` as one harmless path component: `[A-Za-z0-9._-]` only, no leading dot, not empty, at most
    `MAX_COMPONENT_CHARS` long; the same name always gives the same component.

    A name that is one already is kept; any other keeps what it can (its beginning, if over 100 characters) and
    ends in `-` and `_DIGEST_CHARS` hex digits of the whole name's SHA-256, so distinct names never share a folder
    (`a/b` → `a_b-<digest>`, `..` → `fallback-<digest>`): cleaning made `a/b`, `a b` and `a_b` one `a_b`, and
    cutting names alike in 100 characters one; the second run replaced the first's output."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).lstrip("._")
    if cleaned == name and len(name) <= MAX_COMPONENT_CHARS:
        return name or fallback
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_CHARS]
    return f"{(cleaned or fallback)[:MAX_COMPONENT_CHARS - _DIGEST_CHARS - 1]}-{digest}"


def _home_folders() -> set[Path]:
    """The home directory, as given and resolved; none when it cannot be known (HOME unset and no passwd entry
    for this user, as in a container run under an arbitrary user id: `Path.home()` raises RuntimeError there)."""
    try:
        home = Path.home()
    except RuntimeError:
        return set()
    return {home, home.resolve()}


def _protected_reason(path: Path) -> str | None:
    """Why `path` (absolute, not resolved) may never be an output, or None."""
    cwd = Path.cwd()
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # RuntimeError("Symlink loop from ..."): Python 3.11, 3.12
        return "leads through a loop of symbolic links"
    places = {Path(os.path.abspath(path)), resolved}
    home = _home_folders()
    protected = {Path("/"), *home, cwd, cwd.resolve()}
    ancestors = set(cwd.parents) | set(cwd.resolve().parents)
    if places & {Path("/")}:
        return "is the filesystem root"
    if places & home:
        return "is the home directory"
    if places & protected:
        return "is the working directory"
    if places & ancestors:
        return "is an ancestor of the working directory"
    return None


PYTHON_PARAMETERS = {"folder": "out_dir", "file": "path"}  # what Python's callers pass an output as


def _refuse(path: object, why: str, rule: str = "; kvsim only replaces output it wrote itself (choose a new path)",
            kind: str = "folder") -> OutputError:
    """The refusal of `path` (a `kind` of output, named as Python's caller passes it: `PYTHON_PARAMETERS`)."""
    return OutputError(path, f"{why}{rule}", PYTHON_PARAMETERS[kind])


def read_marker(folder: Path) -> dict | None:
    """The marker kvsim wrote in `folder` (a JSON object with a `files` list); None where there is none: no such
    file, a link, unreadable, over `MAX_JSON_RESULT_BYTES` or not such an object."""
    marker = folder / MARKER_NAME
    if marker.is_symlink() or not marker.is_file():
        return None
    from kvsim.model.yaml_io import load_json

    try:  # a bounded read: a stranger's 1 GiB file of that name was read whole (2 GB of memory, 10 s)
        with marker.open("rb") as f:
            data = load_json(f.read(MAX_JSON_RESULT_BYTES + 1).decode("utf-8"))  # `[[[...` too: a ValueError
    except (OSError, ValueError):  # a file cut at the bound is no JSON either
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), list) else None


def folder_listing(folder: Path) -> set[str]:
    """Every file and folder below `folder`, as relative POSIX paths."""
    names: set[str] = set()
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        names.update((rel / name).as_posix() for name in dirs + files)
    return names


def _absolute_unprotected(path: str | Path, kind: str = "folder") -> Path:
    """`path` made absolute (`~` expanded), unless it is empty (an unset shell variable, not the working
    folder), protected or a symlink; an error asks for a `kind` (folder or file)."""
    if not isinstance(path, (str, os.PathLike)):  # Path(5) was a bare TypeError (`RunResult.write(5)`)
        raise _refuse(path, f"is not a path: name a {kind}", kind=kind)
    if not str(path).strip():
        raise _refuse(path, f"is empty: name a {kind}", kind=kind)
    if "\0" in str(path):  # no file name holds one: the OS calls below raised a bare ValueError
        raise _refuse(path, "holds a NUL character, which no file name can", kind=kind)
    bad = control_character(str(path))
    if bad is not None:  # `-o $'a\nb'` split the "results written to" line and every error naming the folder
        raise _refuse(path, f"holds the control character {bad!r}; name a folder with one line of printable text",
                      kind=kind)
    try:
        out = Path(os.path.abspath(Path(path).expanduser()))
    except RuntimeError:  # pathlib's "Could not determine home directory": `~name/x` for a user this machine
        # has not, or `~/x` where HOME is unset and this user has no passwd entry (a container's arbitrary uid)
        first = str(path).split("/")[0]
        raise _refuse(path, f"starts with {first!r}, the home folder of a user this machine does not know"
                      if first != "~" else "starts with '~', but this user has no home folder (HOME is not set "
                      "and the user has no passwd entry)", kind=kind) from None
    with errors_name_output(path, kind=kind):  # a name over the system's limit: OSError 'File name too long'
        reason = _protected_reason(out) or ("is a symbolic link" if out.is_symlink() else None)
    if reason:
        raise _refuse(path, reason, kind=kind)
    return out


def _check_writable(path: str | Path, out: Path, kind: str = "folder") -> None:
    """A `KvsimError` unless kvsim can create files beside `out` (where the writers put their
    temporary copy): probed by creating and removing an empty folder, named like a writer's
    temporary (so one left by a kill is cleared like theirs), in the nearest existing folder
    above it, so a command refuses before its work rather than after (`-o /proc/x`)."""
    base = out.parent
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise OutputError(path, f"cannot write there ({base} is not a folder)", PYTHON_PARAMETERS[kind])
    with errors_name_output(path, kind=kind):
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}{TEMP_INFIX}{os.getpid()}-", dir=base))


def check_output_dir(path: str | Path, kind: str | None = None) -> Path:
    """The absolute folder to write, or a `KvsimError` saying why kvsim must not touch it
    (protected, someone else's, or not writable).

    With `kind`, an existing kvsim folder must also be of that kind (a `run` never replaces a `report`).
    """
    out = _absolute_unprotected(path)
    _check_writable(path, out)
    if not out.exists():
        return out
    if not out.is_dir():
        raise _refuse(path, "exists and is not a folder")
    marker = read_marker(out)
    if marker is None:
        raise _refuse(path, f"exists and has no {MARKER_NAME} marker")
    if kind is not None and marker.get("kind") != kind:
        raise _refuse(path, f"holds kvsim {marker.get('kind')!r} output, not {kind!r}")
    allowed = set(marker["files"]) | {MARKER_NAME}
    allowed |= {parent.as_posix() for name in marker["files"] for parent in Path(name).parents if str(parent) != "."}
    strangers = sorted(folder_listing(out) - allowed)
    outer = read_marker(out.parent)
    if strangers and outer is not None and f"{out.name}/{strangers[0]}" in outer["files"]:
        # validate's sim/ (a run's output) holds the replayed workload.jsonl, which validation's marker lists
        raise _refuse(path, f"holds {strangers[0]!r}, which belongs to the kvsim {outer.get('kind')} output around "
                            f"it ({str(out.parent)!r}), not to {marker.get('kind')!r} output",
                      ": replacing the folder would delete it (choose a new path)")
    if strangers:
        raise _refuse(path, f"holds {strangers[0]!r}, which kvsim did not write")
    return out


def check_output_file(path: str | Path, json_keys: frozenset[str] | None = None) -> Path:
    """The absolute file to write, or a `KvsimError` unless it is new or a file kvsim wrote, and writable.

    With `json_keys` (a study's JSON result, which has no comment line to carry `FILE_TAG`), a file kvsim wrote
    is a JSON object with exactly those keys: `--output notes.json` of a study replaced a user's file.
    A path ending in `/` (or `/.`, `/..`) names a folder: `-o profiles/` wrote a file called `profiles`."""
    out = _absolute_unprotected(path, "file")
    if os.path.basename(str(path)) in ("", ".", ".."):
        raise _refuse(path, "names a folder (it ends in '/'), not a file: give the file's name", kind="file")
    _check_writable(path, out, "file")
    if not out.exists():
        return out
    if not out.is_file():
        raise _refuse(path, "exists and is not a file", kind="file")
    try:
        with out.open("rb") as f:
            first = f.readline(len(FILE_TAG) + 1) if json_keys is None else f.read(MAX_JSON_RESULT_BYTES + 1)
    except OSError as error:
        raise _refuse(path, f"cannot be read ({error.strerror})", kind="file") from None
    if len(first) > MAX_JSON_RESULT_BYTES:  # read no further: a 2 GB file was read whole (2.6 GB of memory)
        raise _refuse(path, f"exists and is over {MAX_JSON_RESULT_BYTES:,} B, no JSON result kvsim writes", kind="file")
    if json_keys is None and not first.startswith(FILE_TAG.encode()):
        raise _refuse(path, f"exists and does not start with {FILE_TAG!r}", kind="file")
    if json_keys is not None and json_object_keys(first) != json_keys:
        raise _refuse(path, f"exists and is not a JSON object of this result's keys ({', '.join(sorted(json_keys))})",
                      kind="file")
    return out


def json_object_keys(data: bytes) -> frozenset[str] | None:
    """The keys of `data` read as a JSON object; None where it is none (not UTF-8, not JSON, not an object)."""
    from kvsim.model.yaml_io import load_json

    try:
        parsed = load_json(data.decode("utf-8"))  # not json.loads: text nested too deeply was a RecursionError
    except ValueError:  # UnicodeDecodeError included
        return None
    return frozenset(parsed) if isinstance(parsed, dict) else None


class _WriteFailed(OutputError):
    """The output `path` (as given) could not be written: `problem` is "cannot write there (the OS's reason)"."""


@contextmanager
def errors_name_output(path: str | Path, tmp: Path | None = None, named_only: bool = False,
                       kind: str = "folder") -> Iterator[None]:
    """An `OSError` on the output's folder (or on the temporary `tmp`) as an `OutputError` naming the output (a
    `kind` of output, as Python's caller passes it: `PYTHON_PARAMETERS`),
    so that no message shows kvsim's temporary names; other errors pass through unchanged. An error
    without a file name (a full disk: `write` on an open file) is the output's too: only it is written
    (unless `named_only`: a block that also talks to a Dask cluster, whose lost connection is an OSError).
    An output written inside `tmp` (validate's `sim/` run) that fails is this output's failure: it named
    kvsim's temporary folder (`--output='.../.v.kvsim-PID-XXXX/sim'`)."""
    try:
        yield
    except _WriteFailed as error:
        if tmp is None or not os.path.abspath(str(error.path)).startswith(str(tmp)):
            raise
        raise _WriteFailed(path, error.problem, PYTHON_PARAMETERS[kind]) from None
    except OSError as error:
        if tmp is not None and (error.filename or named_only) and not str(error.filename).startswith(str(tmp)):
            raise
        raise _WriteFailed(path, f"cannot write there ({error.strerror or error})", PYTHON_PARAMETERS[kind]) from None
