"""The terminal the CLI writes to, made safe before a command runs (`kvsim.cli.main`): a stdout that cannot
encode a name, and a `COLUMNS` or `LINES` that rich misreads, each ended a command with a traceback or no output."""

from __future__ import annotations

import codecs
import os
import sys

from kvsim.model.units import ascii_int

ESCAPE_ERRORS = "kvsim-escape"
"""The error handler `escape_unencodable_output` gives stdout (`_escape`)."""


def _escape(error: UnicodeError) -> tuple[str | bytes, int]:
    """Bytes a name was read with and could not decode (`surrogateescape`: Python's stdout handler in a C locale)
    are written back as they were; any other character the encoding lacks as a backslash escape."""
    assert isinstance(error, UnicodeEncodeError)
    try:
        return codecs.lookup_error("surrogateescape")(error)
    except UnicodeEncodeError:
        return codecs.backslashreplace_errors(error)


def escape_unencodable_output() -> None:
    """Have stdout write a character its encoding lacks as a backslash escape (`caf\\xe9`), as Python's stderr
    always does: under an ASCII or Latin-1 locale (`PYTHONIOENCODING=ascii`, `LC_ALL=C` with `PYTHONUTF8=0`) a
    name kvsim prints (a GPU file `gpu-é.yaml`, a scenario's name) ended the command with a UnicodeEncodeError
    traceback, exit 1, after its output was written. Python's own handlers are replaced (`strict`, and a C
    locale's `surrogateescape`, which `_escape` keeps for the bytes it is for); another one the user chose is kept."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None and getattr(sys.stdout, "errors", None) in ("strict", "surrogateescape"):
        codecs.register_error(ESCAPE_ERRORS, _escape)
        reconfigure(errors=ESCAPE_ERRORS)


def usable_terminal_size() -> None:
    """Drop a `COLUMNS` or `LINES` that rich misreads from the environment (rich then asks the terminal, else takes
    80 by 25). Rich reads any text `str.isdigit` passes with `int()`: 0 as a console zero characters wide, which
    prints nothing (`kvsim capacity` under a shell or container that exports `COLUMNS=0`, as fish does while reading
    its config, wrote no table, exit 0), and a superscript two (`²`) as a ValueError traceback before any output.
    A count of ASCII digits (`kvsim.model.units.ascii_int`) of at least 1 is kept."""
    for name in ("COLUMNS", "LINES"):
        value = os.environ.get(name)
        if value is not None and value.isdigit() and not ascii_int(value):
            del os.environ[name]
