"""The CLI's standard output, made to fail in one line (`unwritable_stdout`): closed, on a full disk, or cut short
under `PYTHONUNBUFFERED`, as `kvsim.cli.shared.user_errors` says an output folder that cannot be written."""

from __future__ import annotations

import errno
import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer


@contextmanager
def unwritable_stdout() -> Iterator[None]:
    """Print a standard output that cannot be written (`kvsim run > /dev/full`: a full disk, an I/O error;
    `kvsim run >&-`: closed) as one line and exit 2, as `user_errors` prints an output folder that cannot be
    written: a command prints its results after its files are written, outside `user_errors`, and the OSError was
    a traceback. An OSError escaping a command is stdout's when stdout still refuses a write (a write's OSError
    names no file); a closed pipe (`| head`) is left to click, which exits 1 without a word, as `head`'s writers
    do; any other OSError is raised as it was, nothing written to stdout. A standard output closed before Python
    started is None (`sys.stdout`), which click's echo skips without a word and `sys.stdout.write` fails on with
    an AttributeError: it is a stream whose every write fails as a closed descriptor's (EBADF) while a command
    runs, and None again after it if nothing was written (bare `kvsim >&-` prints its usage on stderr), so that
    Python's own flush at exit does not fail on it. Stdout is replaced by the null device once a write failed, so
    that the flush at exit does not fail again.

    What a command leaves in stdout's buffer is flushed here, once it is done (or exits with status 0): Python's
    own flush at exit said a failure there as "Exception ignored ... OSError", exit 120 (`kvsim capacity --format
    json > /dev/full`: the whole table fits the buffer). Under `python -u` or `PYTHONUNBUFFERED` (common in
    containers) stdout's text layer writes straight to the descriptor and drops the rest of a short write without
    a word (CPython's TextIOWrapper ignores the count an unbuffered raw stream returns): a table larger than the
    space left on the disk was cut and the command exited 0. Such a stdout is given a buffer that writes each line
    at once (`_LineBuffered`), which writes the rest or raises."""
    closed = _ClosedStream() if sys.stdout is None else None
    if closed is not None:
        sys.stdout = closed
    elif isinstance(getattr(sys.stdout, "buffer", None), io.RawIOBase):
        sys.stdout = _LineBuffered(sys.stdout)
    try:
        try:
            yield
        except typer.Exit as stop:
            if stop.exit_code == 0:
                sys.stdout.flush()
            raise
        sys.stdout.flush()
    except OSError as error:
        if error.errno == errno.EPIPE or error.filename is not None or not _refuses_a_write(sys.stdout, error):
            raise
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115  (the process's stdout from here)
        typer.echo(f"kvsim: error: standard output: {error.strerror or error}", err=True)
        raise typer.Exit(2) from None
    finally:
        if closed is not None and sys.stdout is closed:
            sys.stdout = None  # type: ignore[assignment]  # as Python started: stdout closed


def _refuses_a_write(stream: Any, error: OSError) -> bool:
    """Whether `stream` refuses a write, written nothing: flushing what it holds, then writing no bytes to its
    descriptor (a failed write's line may be held in its buffer, or dropped: /dev/full refuses even an empty
    write, a closed descriptor too); a regular file takes an empty write even on a full disk, where a write
    larger than the buffer was dropped, so for `error` ENOSPC its filesystem's free blocks say it. A stream
    without a descriptor (in memory) or a closed one refuses none."""
    try:
        stream.flush()
        fd = stream.fileno()
        os.write(fd, b"")
        return error.errno == errno.ENOSPC and os.fstatvfs(fd).f_bavail == 0
    except (io.UnsupportedOperation, ValueError):  # in memory, or closed (UnsupportedOperation is an OSError too)
        return False
    except OSError:
        return True


class _LineBuffered(io.TextIOWrapper):
    """An unbuffered stdout (a text layer straight over its descriptor's raw stream) as a text layer over a buffer
    of that raw stream, with its encoding and error handler, writing each line at once (line buffering, every
    write passed through). The raw stream stays the replaced layer's, which it keeps: freed, that layer would
    close it; closing this one leaves it open (a test's captured stdout is read after the command)."""

    def __init__(self, unbuffered: Any) -> None:
        super().__init__(io.BufferedWriter(_Unowned(unbuffered.buffer)), encoding=unbuffered.encoding,
                         errors=unbuffered.errors, line_buffering=True, write_through=True)
        self.replaced = unbuffered


class _Unowned(io.RawIOBase):
    """`raw`'s writes, descriptor and terminal, without closing it when closed."""

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self.raw = raw

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> Any:
        return self.raw.write(data)

    def fileno(self) -> int:
        return int(self.raw.fileno())

    def isatty(self) -> bool:
        return bool(self.raw.isatty())


class _ClosedStream(io.TextIOBase):
    """The standard output of a process started with it closed: every write fails as a closed descriptor's."""

    def _refuse(self, *_: Any) -> Any:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    write = flush = fileno = _refuse
