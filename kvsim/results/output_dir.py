"""How kvsim replaces its own output without ever losing a file (`output_directory`, `claim_directory`,
`output_file`), each path checked first as `kvsim.results.output_checks` says (new, or kvsim's own output).

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

from kvsim.results.output_checks import (
    FILE_TAG,
    MARKER_NAME,
    MAX_JSON_RESULT_BYTES,
    TEMP_INFIX,
    check_output_dir,
    check_output_file,
    errors_name_output,
    folder_listing,
    json_object_keys,
    read_marker,
)

_AT_FDCWD = -100
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def _version() -> str:
    from kvsim.model.version import __version__

    return __version__


def current_umask() -> int:
    """The process's umask, unchanged (os.umask can only be read by setting it: set and restored at once), for
    giving a file made by mkstemp (0600) the permissions `open(..., "w")` would give a new one."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
    for candidate in out.parent.glob(f".{out.name}{TEMP_INFIX}*"):
        match = re.fullmatch(rf"\.{re.escape(out.name)}{re.escape(TEMP_INFIX)}(\d+)-\w+(-old)?", candidate.name)
        if not match or not candidate.is_dir() or candidate.is_symlink():
            continue
        if read_marker(candidate) is None and {p.name for p in candidate.iterdir()} - {MARKER_NAME + ".tmp"}:
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
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{TEMP_INFIX}{os.getpid()}-", dir=out.parent))
        try:
            with errors_name_output(path, tmp), _interrupt_names(path, out, tmp):
                os.chmod(tmp, 0o777 & ~current_umask())
                _write_marker(tmp, kind, [])  # a stale copy of this folder is recognisably kvsim's
                yield tmp
                _write_marker(tmp, kind, sorted(folder_listing(tmp) - {MARKER_NAME}))
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
            listed |= set((read_marker(out) or {}).get("files", []))
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
            fd, name = tempfile.mkstemp(prefix=f".{out.name}{TEMP_INFIX}{os.getpid()}-", dir=out.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            with errors_name_output(path, tmp, kind="file"), _interrupt_names(path, out, tmp):
                os.chmod(tmp, 0o666 & ~current_umask())
                yield tmp
                with tmp.open("rb") as f:
                    assert f.readline().startswith(FILE_TAG.encode()) if json_keys is None else \
                        json_object_keys(f.read(MAX_JSON_RESULT_BYTES + 1)) == json_keys, \
                        f"{out} must be recognisably kvsim's (and small enough to be read as so)"
                check_output_file(out, json_keys)
                os.replace(tmp, out)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
