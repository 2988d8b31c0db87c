"""A benchmark's `--output FILE`: new, or an earlier result of the same benchmark (a JSON object of exactly its
result's keys), else refused before the benchmark runs; written in one rename after it (kvsim's
`check_output_file` and `output_file`, as the study scripts use them). Refusals are one line and exit 2."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvsim.model.errors import KvsimError
from kvsim.results.output_checks import check_output_file
from kvsim.results.output_dir import output_file


@contextmanager
def one_line(program: str, option: str = "--output") -> Iterator[None]:
    """A `KvsimError` raised inside is `program: error: ...` on stderr and exit 2 (no traceback); an output
    refused or not written is named as `option`, the command line's, not as Python's parameter (`out_dir`)."""
    try:
        yield
    except KvsimError as error:
        print(f"{program}: error: {error.named(option)}", file=sys.stderr)
        raise SystemExit(2) from None


def check_result_file(program: str, path: Path, keys: frozenset[str]) -> None:
    """Exit 2 with one line unless `path` is new or an earlier result of `program` (a JSON object of `keys`)."""
    with one_line(program):
        check_output_file(path, keys)


def write_result_file(program: str, path: Path, keys: frozenset[str], result: dict[str, Any]) -> None:
    """Write `result` (whose keys must be `keys`) as indented JSON to `path`, checked again as `check_result_file`
    (the file may have changed while the benchmark ran)."""
    with one_line(program), output_file(path, keys) as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
