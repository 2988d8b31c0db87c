"""Opening the data files kvsim reads (traces, measured runs, profiles), plain or gzip-compressed.

The repository ships its larger data files gzipped (`benchmarks/validation_set/`); every reader
goes through `data_file` and `open_text`, so a file named `x.csv` may also be given, or found,
as `x.csv.gz`, and reads the same.
"""

from __future__ import annotations

import csv
import gzip
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from kvsim.model.errors import KvsimError, first_repeat
from kvsim.model.yaml_io import TEXT_ENCODING

GZIP_SUFFIX = ".gz"


def data_file(path: Path) -> Path:
    """`path`, or `path.gz` when only the compressed copy exists (then the caller reads that one)."""
    if not path.exists():
        compressed = path.with_name(path.name + GZIP_SUFFIX)
        if compressed.is_file():
            return compressed
    return path


def open_text(path: Path, newline: str | None = None) -> IO[str]:
    """Open `path` for reading UTF-8 text (`TEXT_ENCODING`); a name ending in `.gz` is decompressed on the fly."""
    if path.name.endswith(GZIP_SUFFIX):
        return gzip.open(path, "rt", encoding=TEXT_ENCODING, newline=newline)
    return path.open(encoding=TEXT_ENCODING, newline=newline)


def csv_rows(lines: Iterable[str], path: Path) -> csv.DictReader[str]:
    """`csv.DictReader` over `lines` (read from `path`): a header that names a column twice is a
    `KvsimError` naming the file and the column (the reader would keep the later column's values and
    drop the earlier's without a word)."""
    reader = csv.DictReader(lines)
    names = list(reader.fieldnames or ())
    twice = first_repeat(names)
    if twice is not None:
        raise KvsimError(f"{path}: its header names the column {twice!r} twice")
    return reader


def first_ragged(rows: list[dict[str | None, str | None]]) -> int | None:
    """The index of the first `csv_rows` row without exactly the header's fields, or None: `csv.DictReader`
    fills a short row's missing fields with None and keys a long row's extra ones by None."""
    return next((i for i, row in enumerate(rows) if None in row or None in row.values()), None)


def path_texts(value: Any) -> Any:
    """`value` with every `os.PathLike` inside it (a notebook's `model=Path(...)`, a trace's path) as its text."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, dict):
        return {key: path_texts(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [path_texts(item) for item in value]
    return value
