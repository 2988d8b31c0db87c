"""Defects found reviewing today's merges (review30), each with the behaviour a user expects.

`kvsim --version` with a standard output that cannot take its line: tidy28 made every command say a closed stdout
(`>&-`) or a full one (`> /dev/full`) in one line, exit 2, but `--version` is answered before any command runs (the
entry's fast path, `kvsim.__main__.print_version`, and the CLI's eager option while click parses): `>&-` exited 0
without a word, `> /dev/full` was an OSError traceback, exit 1.
"""

from __future__ import annotations

import errno
import io
import os
import sys

import pytest
from typer.main import get_command

from kvsim.__main__ import print_version
from kvsim.cli import app
from kvsim.model.version import VERSION_LINE


class _FullDisk(io.StringIO):
    """A standard output on a full disk: every flush fails as /dev/full's does (ENOSPC)."""

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_the_entrys_version_line_is_left_to_the_cli_where_stdout_cannot_take_it(monkeypatch, capsys):
    assert print_version() and capsys.readouterr().out == VERSION_LINE + "\n"
    for stdout in (None, _FullDisk()):
        monkeypatch.setattr(sys, "stdout", stdout)
        assert print_version() is False


@pytest.mark.parametrize(("stdout", "said"), [(None, errno.EBADF), (_FullDisk(), errno.ENOSPC)])
def test_the_clis_version_option_says_a_stdout_it_cannot_write_in_one_line_exit_2(monkeypatch, capsys, stdout,
                                                                                    said):
    """The line the commands say (`kvsim.cli.shared.unwritable_stdout`): closed, EBADF as `os.write(1, b"")`
    fails in a process started with `>&-`; full, ENOSPC."""
    monkeypatch.setattr(sys, "stdout", stdout)
    with pytest.raises(SystemExit) as stop:
        get_command(app).main(["--version"], prog_name="kvsim")
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"kvsim: error: standard output: {os.strerror(said)}\n"
    assert sys.stdout.name == os.devnull
    sys.stdout.close()
