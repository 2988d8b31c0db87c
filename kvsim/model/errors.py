"""The one error type users see, and the translation of pydantic's errors into it.

Contract: every problem with user input (a flag, a scenario field, a file) is raised as
`KvsimError` whose message is one line naming the field and the offending value. The CLI
prints that line and exits non-zero; it never shows a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class KvsimError(ValueError):
    """Bad user input or an impossible request; the message is a complete one-line explanation."""


SHOWN_CHARS = 60


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)`, cut to `limit` characters: an error names the value, it does not echo a file."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


@contextmanager
def reading(path: str | Path, what: str) -> Iterator[None]:
    """Read `path` inside this block: a file that cannot be opened or is not UTF-8 text (a binary
    file, another encoding) becomes one `KvsimError` line naming `what` and the file."""
    try:
        yield
    except UnicodeDecodeError as error:
        raise KvsimError(f"{what} {path}: not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise KvsimError(f"{what} {path}: cannot read ({error.strerror or error})") from None


def from_validation_error(error: ValidationError, prefix: str = "") -> KvsimError:
    """Turn pydantic's multi-line report into one line: `field.path=value: reason`.

    Only the first problem is reported: fixing one field at a time is how people work, and a
    single line keeps the CLI contract.
    """
    errors = error.errors()
    # A misspelt key usually explains a "missing" one too: report unknown keys first.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = ".".join(str(part) if len(str(part)) <= SHOWN_CHARS else shown(str(part)) for part in first["loc"])
    field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or "value")
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return KvsimError(f"{field}: unknown key")
    if first["type"] == "missing":
        return KvsimError(f"{field}: required field is missing")
    if isinstance(first.get("input"), dict):  # a check across fields: the message names them
        return KvsimError(f"{field}: {message}")
    return KvsimError(f"{field}={shown(first.get('input'))}: {message}")
