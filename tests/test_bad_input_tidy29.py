"""Small defects other helpers noticed (tidy29): each with the behaviour a user (or vLLM) expects.

Found: `kvsim --version >&-` and `kvsim --help >&-` exited 0 without a word (`> /dev/full`: a traceback), where
`kvsim run >&-` says it in one line, exit 2: click answers the group's own options while it parses them, outside
the commands' `unwritable_stdout`, and `--version` alone is answered before the CLI loads (`kvsim.__main__`).
"""

from __future__ import annotations

import errno
import io
import os
import sys

import pytest


def _exit_status(argv: list[str]) -> int:
    """The status `kvsim ARGV` exits with, run as the console script runs it (`kvsim.__main__.main`)."""
    from kvsim.__main__ import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["kvsim", *argv])
        with pytest.raises(SystemExit) as stop:
            main()
    return int(stop.value.code or 0)


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_the_groups_own_options_say_a_closed_stdout_in_one_line(monkeypatch, capsys, argv):
    """Python sets `sys.stdout` to None when it starts with descriptor 1 closed (`>&-`); the line a write to a
    closed descriptor fails with is EBADF's (os.strerror), exit 2, as `kvsim run >&-` says it."""
    monkeypatch.setattr(sys, "stdout", None)
    assert _exit_status(argv) == 2
    assert capsys.readouterr().err == f"kvsim: error: standard output: {os.strerror(errno.EBADF)}\n"
    sys.stdout.close()  # the null device `unwritable_stdout` put in its place


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_the_groups_own_options_say_a_full_stdout_in_one_line(monkeypatch, capsys, argv):
    """`> /dev/full` refuses every write with ENOSPC: it was a traceback, exit 1."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    # text written through to the descriptor, unbuffered: no refused line is held, to be refused again on close
    with io.TextIOWrapper(open("/dev/full", "wb", buffering=0), encoding="utf-8", write_through=True) as full:
        monkeypatch.setattr(sys, "stdout", full)
        assert _exit_status(argv) == 2
    assert capsys.readouterr().err == f"kvsim: error: standard output: {os.strerror(errno.ENOSPC)}\n"
    sys.stdout.close()


def test_bare_kvsim_with_stdout_closed_prints_its_usage_on_stderr_and_leaves_stdout_closed(monkeypatch, capsys):
    """A bare `kvsim` is a usage error (click: the help on stderr, exit 2) and writes nothing to stdout: it stays
    None, as Python started, so that Python's flush at exit does not fail on a stand-in (exit 120)."""
    monkeypatch.setattr(sys, "stdout", None)
    assert _exit_status([]) == 2
    assert sys.stdout is None
    assert "Usage: " in capsys.readouterr().err
