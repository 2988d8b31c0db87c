"""Defects found reviewing today's merges (review30), each with the behaviour a user expects.

A standard output that cannot take what kvsim prints: tidy28 made every command say a closed stdout (`>&-`) or a
full one (`> /dev/full`) in one line, exit 2, but
* `--version` is answered before any command runs (the entry's fast path, `kvsim.__main__.print_version`, and the
  CLI's eager option while click parses): `>&-` exited 0 without a word, `> /dev/full` was an OSError traceback;
* output that fits stdout's buffer (`kvsim capacity --format json > /dev/full`) failed only in Python's flush at
  exit: "Exception ignored ... OSError", exit 120;
* under `PYTHONUNBUFFERED` (or `python -u`) a table larger than the disk's free space was cut without a word,
  exit 0: CPython's text layer ignores a short write's count from an unbuffered raw stream.
"""

from __future__ import annotations

import errno
import io
import os
import sys

import pytest
import typer
from typer.main import get_command

from kvsim.__main__ import print_version
from kvsim.cli import app
from kvsim.cli.stdout import unwritable_stdout
from kvsim.model.version import VERSION_LINE

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


class _FullDisk(io.StringIO):
    """A standard output on a full disk: every flush fails as /dev/full's does (ENOSPC)."""

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@needs_dev_full
def test_the_entrys_version_line_is_left_to_the_cli_where_stdout_cannot_take_it(monkeypatch, capfd):
    assert print_version() and capfd.readouterr().out == VERSION_LINE + "\n"
    with open("/dev/full", "w", encoding="utf-8") as full:
        for stdout in (None, full):
            monkeypatch.setattr(sys, "stdout", stdout)
            assert print_version() is False


@pytest.mark.parametrize(("stdout", "said"), [(None, errno.EBADF), (_FullDisk(), errno.ENOSPC)])
def test_the_clis_version_option_says_a_stdout_it_cannot_write_in_one_line_exit_2(monkeypatch, capsys, stdout,
                                                                                    said):
    """The line the commands say (`kvsim.cli.stdout.unwritable_stdout`): closed, EBADF as `os.write(1, b"")`
    fails in a process started with `>&-`; full, ENOSPC."""
    monkeypatch.setattr(sys, "stdout", stdout)
    with pytest.raises(SystemExit) as stop:
        get_command(app).main(["--version"], prog_name="kvsim")
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"kvsim: error: standard output: {os.strerror(said)}\n"
    assert sys.stdout.name == os.devnull
    sys.stdout.close()


class _DiskFillingRaw(io.RawIOBase):
    """The raw stream of a stdout on a disk with `room` bytes left (its descriptor /dev/full's, which refuses even an
    empty write): a write takes what room is left (a short write), then fails ENOSPC."""

    def __init__(self, room: int, fd: int) -> None:
        self.room, self.fd, self.taken = room, fd, 0

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, data) -> int:
        if self.taken == self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(len(data), self.room - self.taken)
        self.taken += n
        return n


@pytest.fixture
def dev_full_fd():
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    fd = os.open("/dev/full", os.O_WRONLY)
    yield fd
    os.close(fd)


def _told_then_closed(capsys, stop, stream, raw) -> None:
    """Exit 2 with stdout's line; then the disk has room again, so that `stream` closes cleanly."""
    assert stop.value.exit_code == 2
    assert capsys.readouterr().err == f"kvsim: error: standard output: {os.strerror(errno.ENOSPC)}\n"
    assert sys.stdout.name == os.devnull
    sys.stdout.close()
    raw.room = 10**9
    stream.close()


def test_what_a_command_left_in_stdouts_buffer_is_flushed_inside_the_guard(monkeypatch, capsys, dev_full_fd):
    """Two bytes stay in the buffer of a stdout on a full disk (no error while the command writes them)."""
    raw = _DiskFillingRaw(0, dev_full_fd)
    stream = io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", stream)
    with pytest.raises(typer.Exit) as stop, unwritable_stdout():
        sys.stdout.write("{}")
    _told_then_closed(capsys, stop, stream, raw)


def test_an_unbuffered_stdout_cut_short_by_a_full_disk_is_told(monkeypatch, capsys, dev_full_fd):
    """`python -u`'s stdout: a text layer straight over the raw stream. 100,000 characters onto a disk with 4,096
    bytes left: the text layer took the first short write as the whole and the run went on, exit 0."""
    raw = _DiskFillingRaw(4096, dev_full_fd)
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8", write_through=True))
    with pytest.raises(typer.Exit) as stop, unwritable_stdout():
        stream = sys.stdout
        sys.stdout.write("x" * 100_000)
    assert raw.taken == 4096
    _told_then_closed(capsys, stop, stream, raw)
