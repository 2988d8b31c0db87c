"""Where kvsim may write, and how it replaces its own output without ever losing a file.

kvsim writes only to a path that does not exist yet or that it wrote itself:

    runs/default/                 a kvsim folder: its marker lists every file kvsim put there
      .kvsim-output               {"kvsim": "0.1.0", "kind": "run", "files": ["requests.csv", ...]}
      requests.csv  steps.csv  summary.json  scenario.yaml

A folder without the marker, a folder holding anything its marker does not list (a user's
notes beside a run), a file, a symlink, `/`, the home directory and the working directory or
any of its ancestors are refused with a one-line `KvsimError`; no flag overrides this. A
single output file (a calibration profile) is replaced only if its first line is
`FILE_TAG`, which every such file kvsim writes begins with; a study's JSON result only if it
is a JSON object of exactly that result's keys.

Replacing is a swap, so an interrupt at any instant leaves the complete old output or the
complete new one at the path:

    1. fill   .default.kvsim-PID-XXXX/     (marker first, then the files, then the file list)
    2. swap   renameat2(RENAME_EXCHANGE)   one atomic step: the path now holds the new folder,
                                           the temporary name the old one
    3. remove .default.kvsim-PID-XXXX/     (the old output)

Where the filesystem cannot exchange, step 2 is two renames with SIGINT/SIGTERM/SIGHUP held off in
between. A temporary folder left by a killed run is removed by the next write to the same
path once its process is gone. Folders and files get the permissions the umask allows.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvsim.model.errors import OutputError
from kvsim.model.units import control_character

MARKER_NAME = ".kvsim-output"
# The most of a file kvsim reads to tell a JSON result or an output folder's marker it wrote (kilobytes, a few MB).
MAX_JSON_RESULT_BYTES = 64 * 2**20
FILE_TAG = "# generator: kvsim"
_TEMP_INFIX = ".kvsim-"
_AT_FDCWD = -100
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
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


def _version() -> str:
    from kvsim.model.version import __version__

    return __version__


def current_umask() -> int:
    """The process's umask, unchanged (os.umask can only be read by setting it: set and restored at once), for
    giving a file made by mkstemp (0600) the permissions `open(..., "w")` would give a new one."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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


def _read_marker(folder: Path) -> dict | None:
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


def _listing(folder: Path) -> set[str]:
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
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}{_TEMP_INFIX}{os.getpid()}-", dir=base))


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
    marker = _read_marker(out)
    if marker is None:
        raise _refuse(path, f"exists and has no {MARKER_NAME} marker")
    if kind is not None and marker.get("kind") != kind:
        raise _refuse(path, f"holds kvsim {marker.get('kind')!r} output, not {kind!r}")
    allowed = set(marker["files"]) | {MARKER_NAME}
    allowed |= {parent.as_posix() for name in marker["files"] for parent in Path(name).parents if str(parent) != "."}
    strangers = sorted(_listing(out) - allowed)
    outer = _read_marker(out.parent)
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
    if json_keys is not None and _json_keys(first) != json_keys:
        raise _refuse(path, f"exists and is not a JSON object of this result's keys ({', '.join(sorted(json_keys))})",
                      kind="file")
    return out


def _json_keys(data: bytes) -> frozenset[str] | None:
    from kvsim.model.yaml_io import load_json

    try:
        parsed = load_json(data.decode("utf-8"))  # not json.loads: text nested too deeply was a RecursionError
    except ValueError:  # UnicodeDecodeError included
        return None
    return frozenset(parsed) if isinstance(parsed, dict) else None


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Linux renameat2(2); False where the C library or the filesystem lacks it."""
    func = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if func is None:
        return False
    if func(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


@contextmanager
def _signals_held() -> Iterator[None]:
    """Delay SIGINT, SIGTERM and SIGHUP (delivered on exit) so that two renames cannot be split. The mask holds them in
    this thread only: another thread (a Dask client's, a process pool's) takes the signal, and Python runs its
    handler in the main thread at once, between the renames (the output moved aside, the new one then removed). So
    in the main thread a Python handler is also put off, and run on exit for the first signal that came."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}  # the signals the CLI takes as an interrupt
    came: list[tuple[int, Any]] = []
    deferred: dict[int, Any] = {signum: handler for signum in held if callable(handler := signal.getsignal(signum))} \
        if threading.current_thread() is threading.main_thread() else {}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ())  # the mask as it is, put back however the block ends
    try:  # a handler run as a call returns (another thread's signal) raises inside the try: nothing left swapped
        signal.pthread_sigmask(signal.SIG_BLOCK, held)
        for signum in deferred:
            signal.signal(signum, lambda number, frame: came.append((number, frame)))
        yield
    finally:
        try:
            for signum, handler in deferred.items():
                signal.signal(signum, handler)
        finally:  # a handler put back may run at once, and raise: the mask is put back all the same
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if came:
            first, frame = came[0]
            deferred[first](first, frame)


def _swap_into_place(new: Path, out: Path) -> None:
    """Put folder `new` at `out`; afterwards `new` holds the old output (if there was one)."""
    if not out.exists():
        if not _renameat2(new, out, _RENAME_NOREPLACE):
            os.rename(new, out)
        return
    if _renameat2(new, out, _RENAME_EXCHANGE):
        return
    aside = new.with_name(new.name + "-old")
    with _signals_held():
        os.rename(out, aside)
        os.rename(new, out)
        os.rename(aside, new)


def _remove_stale_temporaries(out: Path) -> None:
    """Remove `.NAME.kvsim-PID-*` folders that kvsim left when a writer with that PID was killed."""
    for candidate in out.parent.glob(f".{out.name}{_TEMP_INFIX}*"):
        match = re.fullmatch(rf"\.{re.escape(out.name)}{re.escape(_TEMP_INFIX)}(\d+)-\w+(-old)?", candidate.name)
        if not match or not candidate.is_dir() or candidate.is_symlink():
            continue
        if _read_marker(candidate) is None and {p.name for p in candidate.iterdir()} - {MARKER_NAME + ".tmp"}:
            continue  # kvsim's name but not (recognisably) kvsim's content: leave it
        pid = int(match.group(1))
        if pid != os.getpid():
            try:
                os.kill(pid, 0)
                continue  # still running: another writer's folder
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        _remove_folder(candidate)


def _remove_folder(folder: Path) -> None:
    """Remove a kvsim folder, its marker last, so that a removal cut short stays recognisable."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name == MARKER_NAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
    with contextlib.suppress(FileNotFoundError):
        (folder / MARKER_NAME).unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()


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


def _file_id(path: Path) -> tuple[int, int] | None:
    """The (device, inode) of `path` itself (not a link's target); None where there is nothing."""
    try:
        stat = os.lstat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


@contextmanager
def _interrupt_names(path: str | Path, out: Path, new: Path) -> Iterator[None]:
    """A Ctrl-C inside the block carries the output's path (`kvsim_output`) to the command's one
    line (kvsim/__main__.py): that output was not written, the old one is intact; or, where it came once `new`
    was put at `out` (a signal held over the swap's renames is delivered after them), that it was written
    (`kvsim_output_written`): it said "was not written; what was there before is intact" of a new output in place
    and an old one removed."""
    new_id = _file_id(new)
    try:
        yield
    except KeyboardInterrupt as interrupt:
        # the innermost output is the one being written, unless it was written and this one (around it) was not
        if not hasattr(interrupt, "kvsim_output") or getattr(interrupt, "kvsim_output_written", False):
            written = new_id is not None and _file_id(out) == new_id
            interrupt.kvsim_output, interrupt.kvsim_output_written = str(path), written  # type: ignore[attr-defined]
        raise


def _write_marker(folder: Path, kind: str, files: list[str]) -> None:
    text = json.dumps({"kvsim": _version(), "kind": kind, "files": sorted(files)}) + "\n"
    tmp = folder / (MARKER_NAME + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, folder / MARKER_NAME)


@contextmanager
def _parents_made(out: Path, path: str | Path, kind: str = "folder") -> Iterator[None]:
    """Create the missing folders above `out` (`path`, as given, for an error) for the block; when it fails (a
    refused run, a bad trace row, a Ctrl-C) remove those of them left empty, deepest first: a failed write
    writes nothing, yet `-o a/b/run` stopped by a bad trace row left `a/b/` behind (the default `runs/`)."""
    missing = [folder for folder in out.parents if not folder.exists()]  # deepest first
    try:
        with errors_name_output(path, kind=kind):
            out.parent.mkdir(parents=True, exist_ok=True)
        yield
    except BaseException:
        for folder in missing:
            with contextlib.suppress(OSError):  # no longer empty: something else was put there meanwhile
                folder.rmdir()
        raise


@contextmanager
def output_directory(path: str | Path, kind: str) -> Iterator[Path]:
    """Yield an empty folder to fill; when the block succeeds it replaces `path` (see the module doc).

    `path` is checked first (`check_output_dir`); on any exception, KeyboardInterrupt included,
    the new folder is removed and `path` is left as it was.
    """
    out = check_output_dir(path, kind)
    with _parents_made(out, path):
        with errors_name_output(path):
            _remove_stale_temporaries(out)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{_TEMP_INFIX}{os.getpid()}-", dir=out.parent))
        try:
            with errors_name_output(path, tmp), _interrupt_names(path, out, tmp):
                os.chmod(tmp, 0o777 & ~current_umask())
                _write_marker(tmp, kind, [])  # a stale copy of this folder is recognisably kvsim's
                yield tmp
                _write_marker(tmp, kind, sorted(_listing(tmp) - {MARKER_NAME}))
                check_output_dir(out, kind)  # nothing foreign appeared while we worked
                _swap_into_place(tmp, out)
        finally:
            _remove_folder(tmp)  # the new folder if the block failed, else the old output


def claim_directory(path: str | Path, kind: str, files: list[str]) -> Path:
    """A folder kvsim keeps working in across runs (a resumable search) and writes only `files` in.

    It must be new or kvsim's (`check_output_dir`); it is created if missing, and its marker
    lists `files` (with those it listed before), so a later check accepts exactly them.
    """
    out = check_output_dir(path, kind)
    listed = set(files)
    with errors_name_output(path):
        if out.exists():
            listed |= set((_read_marker(out) or {}).get("files", []))
        else:
            out.mkdir(parents=True)
        _write_marker(out, kind, sorted(listed))
    return out


@contextmanager
def output_file(path: str | Path, json_keys: frozenset[str] | None = None) -> Iterator[Path]:
    """Yield a temporary sibling of `path` to write (starting with `FILE_TAG`, or with `json_keys` a JSON object
    of exactly those keys: `check_output_file`); it replaces `path` in one rename when the block succeeds, and is
    removed otherwise."""
    out = check_output_file(path, json_keys)
    with _parents_made(out, path, "file"):
        with errors_name_output(path, kind="file"):
            fd, name = tempfile.mkstemp(prefix=f".{out.name}{_TEMP_INFIX}{os.getpid()}-", dir=out.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            with errors_name_output(path, tmp, kind="file"), _interrupt_names(path, out, tmp):
                os.chmod(tmp, 0o666 & ~current_umask())
                yield tmp
                with tmp.open("rb") as f:
                    assert f.readline().startswith(FILE_TAG.encode()) if json_keys is None else \
                        _json_keys(f.read(MAX_JSON_RESULT_BYTES + 1)) == json_keys, \
                        f"{out} must be recognisably kvsim's (and small enough to be read as so)"
                check_output_file(out, json_keys)
                os.replace(tmp, out)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
