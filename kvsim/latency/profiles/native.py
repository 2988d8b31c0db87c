"""kvsim's own profile CSV: `# key: value` metadata lines, then `kvsim.latency.base.PROFILE_COLUMNS`.

Written by `kvsim calibrate` (kernels/calibrate.py) and by `write_native` for imported profiles,
so an import can be done once and shipped as one file.
"""

from __future__ import annotations

import csv
from pathlib import Path

from kvsim.latency.base import PROFILE_COLUMNS, PROFILE_KINDS
from kvsim.latency.profiles import Profile
from kvsim.model.errors import KvsimError, reading, shown
from kvsim.results.output_checks import FILE_TAG
from kvsim.results.output_dir import output_file
from kvsim.workload.files import csv_rows, first_ragged, open_text

NUM_LEGACY_COLUMNS = 16
"""Profiles written before `decode_context_len`, `calls` and `num_experts` existed have only these."""


def read_native(path: Path) -> Profile:
    """Metadata and rows of a kvsim profile CSV; a bad file is a `KvsimError`."""
    meta: dict[str, str] = {}
    lines = []
    with reading(path, "profile"), open_text(path) as f:  # a truncated .gz was a bare EOFError
        text = f.read()
    for line_no, line in enumerate(text.splitlines(), start=1):
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            key, value = key.strip(), value.strip()
            if meta.get(key, value) != value:  # the last one was used: a profile of two GPUs, read as one
                raise KvsimError(f"profile {path}: line {line_no}: metadata {key}={shown(value)}, but an earlier "
                                 f"line gives {key}={shown(meta[key])}: give each key once")
            meta[key] = value
        elif line.strip():
            lines.append(line)
    reader = csv_rows(lines, path)
    header = tuple(reader.fieldnames or ())
    if header != PROFILE_COLUMNS[:len(header)] or len(header) < NUM_LEGACY_COLUMNS:
        missing = next((c for c in PROFILE_COLUMNS[:NUM_LEGACY_COLUMNS] if c not in header), None)
        what = f"column {missing!r} is missing" if missing else "columns out of order"
        raise KvsimError(f"profile {path}: {what}; expected the columns {','.join(PROFILE_COLUMNS)}")
    table = list(reader)
    short = first_ragged(table)
    if short is not None:
        raise KvsimError(f"profile {path}: row {short + 1} does not have the header's {len(header)} fields "
                         "(a truncated or malformed file)")
    rows = [{c: (r.get(c) or "") for c in PROFILE_COLUMNS} for r in table]
    if not rows:
        raise KvsimError(f"profile {path}: no rows")
    for row in rows:
        if row["kind"] not in PROFILE_KINDS:
            raise KvsimError(f"profile {path}: kind={row['kind']!r} is not one of {', '.join(PROFILE_KINDS)}")
    return Profile(path.stem, meta, rows)


def check_one_line(field: str, value: str) -> None:
    """Refuse a metadata value (`field` names it) that spans lines, as `read_native` splits them: written as one
    `# key: value` line, its next line would be read back as a row."""
    if len(value.splitlines()) > 1:
        raise KvsimError(f"{field}={shown(value)}: spans lines; a profile CSV keeps each metadata value on one line")


def write_native(profile: Profile, path: Path) -> Path:
    """Write `profile` as a kvsim CSV (`FILE_TAG` line, metadata, rows) through
    `kvsim.results.output_dir.output_file`: only a new file or one kvsim wrote is replaced, when complete.
    A metadata value is one `# key: value` line: one that spans lines (a flag's, a bundle's meta.yaml's) is
    refused, as its next line would be read back as a row."""
    for key, value in profile.meta.items():
        check_one_line(f"profile metadata {key}", value)
    with output_file(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        f.write(f"{FILE_TAG} import-profile\n")
        for key, value in profile.meta.items():
            if key != "generator":  # an imported kvsim CSV's own tag line, rewritten above
                f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, fieldnames=PROFILE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(profile.rows)
    return path
