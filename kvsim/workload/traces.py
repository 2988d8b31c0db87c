"""Readers for real serving workloads; each yields `TraceRecord`s in file order.

| format            | file                                   | arrivals | lengths | block identity |
|-------------------|----------------------------------------|----------|---------|----------------|
| `azure`           | Azure LLM trace 2023 CSV               | yes      | yes     | none           |
| `mooncake`        | Mooncake FAST'25 JSONL                 | yes (ms) | yes     | 512-token `hash_ids` |
| `sharegpt_tokens` | LLMServingSim token-level ShareGPT JSONL | yes (ns) | yes   | real token ids |
| `lengths`         | Vidur/Sarathi length table CSV         | no       | yes     | none           |
| `vllm_sharegpt`   | vLLM benchmark ShareGPT JSON           | no       | ≈ chars / 4 | none       |
| `servegen`        | ServeGen per-client model (a folder; `kvsim.workload.servegen`) | sampled | sampled | none |

A malformed row raises `KvsimError` naming the file and line; a column (a JSON key) a format needs and a row
lacks is an error naming it, one it does not read is ignored without a word (real traces carry columns kvsim has
no use for). Arrival times are seconds: Azure's
from its first record (its timestamps are wall-clock instants), Mooncake's and sharegpt_tokens' as the file counts
them, from the trace's start (`_seconds`). A reader takes its file as a `Path` or its text. The CSV, JSONL and JSON
files may be gzipped (`.gz`, see `kvsim.workload.files`) and may start with a UTF-8 byte-order mark.

The row formats (`azure`, `mooncake`, `sharegpt_tokens`, `lengths`) may carry two more per-request
columns, named by the scenario (`TraceColumns`): a **priority** (vLLM's integer request priority; 1.0
is 1, as in the scenario's own integers; other text is an error) and **acceptance lengths** (speculative
decoding: tokens each verify step of that request emitted, the bonus token included, each ≥ 1; a JSON list,
or in a CSV cell integers separated by spaces, commas or semicolons, brackets allowed).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kvsim.model.errors import KvsimError, not_a_file, shown
from kvsim.model.units import read_number
from kvsim.model.yaml_io import load_json
from kvsim.workload.files import csv_rows, open_text

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's traces hash one id per 512-token block (FAST'25 trace README)
log = logging.getLogger(__name__)
CHARS_PER_TOKEN = 4  # vLLM ShareGPT JSON carries text; without a tokenizer, ~4 characters a token
SHAREGPT_MIN_TOKENS = 4  # vLLM's benchmark prunes ShareGPT prompts or replies shorter ("Prune too short sequences")


MAX_LENGTH = 2**53  # tokens: the longest prompt or output read or drawn (a float64 holds it exactly)
INT64_MAX = 2**63 - 1
PRIORITY_RANGE = (-INT64_MAX - 1, INT64_MAX)  # vLLM's request priority, held as an int64


@dataclass(frozen=True, slots=True)
class TraceRecord:
    arrival_s: float | None
    prompt_len: int
    output_len: int
    segments: tuple[tuple[Any, int], ...] | None = None  # prompt block identities, if known
    token_ids: tuple[int, ...] | None = None  # prompt + output token ids, if known
    priority: int = 0  # vLLM's request priority, from the trace's priority column
    acceptance_lengths: tuple[int, ...] | None = None  # tokens per verify step, from the acceptance column


def bad_row(path: Path, line: int, what: str) -> KvsimError:
    """The error for line `line` of the trace file `path`: `path:line: what` (`what` names the field and value)."""
    return KvsimError(f"{path}:{line}: {what}")


def _positive(value: Any, path: Path, line: int, field: str) -> int:
    """A token count: an integer, read alike from a JSON number and from text (a CSV cell): 600, 600.0, "600" and
    "600.0" are 600 (a JSON 600.0 was, a CSV's "600.0" was refused), 600.7, "6e2", `1_0` and true are refused, as
    `_integral` reads the scenario's integers; 1 to `MAX_LENGTH`."""
    number = _integral(value)
    if number is None and _past_int_digits(value):  # below -10**4300 or above 10**4300
        problem = "must be positive" if value.strip().startswith("-") else f"is more tokens than kvsim counts " \
                                                                           f"({MAX_LENGTH:,})"
        raise bad_row(path, line, f"{field}={shown(value)} {problem}")
    if number is None:
        raise bad_row(path, line, f"{field}={shown(value)} is not an integer")
    if number <= 0:
        raise bad_row(path, line, f"{field}={number} must be positive")
    if number > MAX_LENGTH:
        raise bad_row(path, line, f"{field}={number} is more tokens than kvsim counts ({MAX_LENGTH:,})")
    return number


def _no_extra_fields(row: Mapping[str | None, Any], path: Path, line: int) -> None:
    """Refuse a CSV row with more fields than its header (`csv.DictReader` keys the extras by None and the
    readers dropped them without a word: a stray comma shifts what the row meant)."""
    if None in row:
        extra = row[None]
        raise bad_row(path, line, f"{len(row) - 1 + len(extra)} fields, more than the header's {len(row) - 1} "
                               f"(extra: {shown(','.join(map(str, extra)))})")


def _require_columns(reader: csv.DictReader[str], path: Path, names: tuple[str, ...]) -> None:
    """Refuse a CSV whose header lacks one of `names` (each row read it as None: "ContextTokens=None is not an
    integer" named a value the file does not have); an empty file has no header, and no rows to say so."""
    header = reader.fieldnames or []
    missing = [name for name in names if name not in header]
    if header and missing:
        raise KvsimError(f"{path}: no column {missing[0]!r} (the header has {shown(','.join(header))}; expected "
                         f"{', '.join(names)})")


def _seconds(value: Any, scale: float, path: Path, line: int, field: str) -> float:
    """An arrival time in seconds from a number of `1 / scale` seconds; NaN, inf, true/false and a negative time
    are errors (times count from the trace's start: a row before it was dropped without a word, as if before
    `start_s`)."""
    if isinstance(value, bool):  # float(true) is 1: a JSON true was an arrival 1 ms in
        raise bad_row(path, line, f"{field}={shown(value)} is not a number")
    try:
        number = read_number(value, float)
    except (TypeError, ValueError):
        raise bad_row(path, line, f"{field}={shown(value)} is not a number") from None
    if not math.isfinite(number):
        raise bad_row(path, line, f"{field}={shown(value)} is not a finite number")
    if number < 0:
        raise bad_row(path, line, f"{field}={shown(value)} is negative: a trace's times count from its start")
    return number / scale


@dataclass(frozen=True, slots=True)
class TraceColumns:
    """The optional per-request columns a reader takes from each row (None: not read)."""

    priority: str | None = None
    acceptance: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The columns read (a CSV's header must have them)."""
        return tuple(name for name in (self.priority, self.acceptance) if name is not None)

    def read(self, row: Mapping[str, Any], path: Path, line: int) -> dict[str, Any]:
        """`TraceRecord` fields from `row`'s columns; a missing or malformed value raises `KvsimError`. A JSONL row
        without the column (key) is told so, with the row's keys: it read as None, `priority column nope=None is
        not an integer`, a value the file does not hold (a CSV's header is checked first, `_require_columns`)."""
        for kind, column in (("priority", self.priority), ("acceptance", self.acceptance)):
            if column is not None and column not in row:
                raise bad_row(path, line, f"no {kind} column {column!r} (the row has {shown(','.join(map(str, row)))})")
        out: dict[str, Any] = {}
        if self.priority is not None:
            value = row.get(self.priority)
            if isinstance(value, str):
                value = value.strip()  # as `_integral` reads it, and so the error shows it
            number = _integral(value)
            if number is None and not _past_int_digits(value):
                raise bad_row(path, line, f"priority column {self.priority}={shown(value)} is not an integer")
            if number is None or not PRIORITY_RANGE[0] <= number <= PRIORITY_RANGE[1]:
                raise bad_row(path, line, f"priority column {self.priority}={shown(value)} is outside int64")
            out["priority"] = number
        if self.acceptance is not None:
            out["acceptance_lengths"] = _acceptance_lengths(row.get(self.acceptance), path, line, self.acceptance)
        return out


NO_COLUMNS = TraceColumns()


def _integral(value: Any) -> int | None:
    """`value` as an integer in the forms the scenario's own integers take (pydantic's lax mode, as
    `workload.priority`'s `priority: 1.0` is 1): an int, an integral float (a JSON 1.0), or text of one
    (`-2`, `1.00`, in ASCII digits; whitespace around it, as a CSV cell may have, ignored); None for anything else
    (1.5, `1.`, `1e0`, true, `1_0`, an Arabic-Indic or fullwidth 1: `kvsim.model.spec.Settings` refuses the last
    four there too). Text of more digits than `int()` converts (`sys.get_int_max_str_digits()`, 4,300: a
    ValueError traceback) is None too: `_past_int_digits` tells it apart, a value past every range kvsim reads."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    match = _INTEGER_TEXT.fullmatch(text)
    if match is None or _past_int_digits(text):
        return None
    number = int(match.group(1).lstrip("0") or "0")  # int() counts leading zeros against its digit limit
    return -number if text.startswith("-") else number


_INTEGER_TEXT = re.compile(r"[+-]?([0-9]+)(?:\.0+)?")  # ASCII: int() reads other scripts' digits


def _past_int_digits(value: Any) -> bool:
    """Whether `value` is text of an integer (as `_integral` reads it) of more digits, leading zeros aside, than
    `int()` converts: its magnitude is at least 10**4,300, past every count and priority a trace holds."""
    match = _INTEGER_TEXT.fullmatch(value.strip()) if isinstance(value, str) else None
    return match is not None and len(match.group(1).lstrip("0")) > sys.get_int_max_str_digits()


def _acceptance_lengths(value: Any, path: Path, line: int, column: str) -> tuple[int, ...]:
    items = re.split(r"[\s,;]+", value.strip().strip("[]").strip()) if isinstance(value, str) else value
    if isinstance(items, list) and items == [""]:
        items = []
    if not isinstance(items, list):
        raise bad_row(path, line, f"acceptance column {column}={shown(value)} is not a list of integers")
    lengths = []
    for item in items:  # read as the token counts are (`_integral`): a JSON 2.0 and a CSV's "2.0" alike are 2
        number = _integral(item)
        if number is None or number < 1:
            raise bad_row(path, line, f"acceptance column {column}: {shown(item)} is not an acceptance length "
                                   "(an integer ≥ 1: tokens a verify step emitted)")
        lengths.append(number)
    return tuple(lengths)


def trace_path(path: object) -> Path:
    """`path`, a trace file a reader was given (text or a path object), as a `Path`; else a `KvsimError` naming it:
    what the path is not (`not_a_file`: missing, blank, a folder, a FIFO) or that it is no path at all. A scenario's
    trace was checked already (`Scenario.resolve_path`); a notebook's `read_mooncake(None)` was a TypeError and a
    missing file a FileNotFoundError traceback."""
    if not isinstance(path, (str, os.PathLike)):
        raise KvsimError(f"path={shown(path)}: expected a trace file's path")
    text = os.fsdecode(path)
    problem = not_a_file(text, file_kind="a trace file")
    if problem is not None:
        raise KvsimError(f"path={text!r}: {problem}")
    return Path(text)


def iter_jsonl(path: Path | str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; a bad line raises `KvsimError` naming it."""
    path = Path(path)
    with open_text(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = load_json(line)
            except json.JSONDecodeError as error:
                raise bad_row(path, line_no, f"not JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise bad_row(path, line_no, "expected a JSON object")
            yield line_no, row


def read_azure(path: Path | str, columns: TraceColumns = NO_COLUMNS) -> list[TraceRecord]:
    """`TIMESTAMP,ContextTokens,GeneratedTokens`; timestamps have 100 ns digits."""
    path = trace_path(path)
    records, first, zoned = [], None, None
    with open_text(path, newline="") as f:
        reader = csv_rows(f, path)
        _require_columns(reader, path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens", *columns.names))
        for line_no, row in enumerate(reader, start=2):
            _no_extra_fields(row, path, line_no)
            t, has_zone = _azure_time(row.get("TIMESTAMP"), path, line_no)
            if zoned is None:
                zoned = (line_no, has_zone)
            elif has_zone != zoned[1]:  # a row without a zone read as UTC beside one with: hours apart
                which = "has a time zone" if has_zone else "has no time zone"
                raise bad_row(path, line_no, f"TIMESTAMP={shown(row['TIMESTAMP'])} {which}, but line {zoned[0]}'s "
                                          f"{'has one' if zoned[1] else 'has none'}: give every row's in one form")
            first = t if first is None else first
            records.append(TraceRecord(
                (t - first) / 1e9,
                _positive(row.get("ContextTokens"), path, line_no, "ContextTokens"),
                _positive(row.get("GeneratedTokens"), path, line_no, "GeneratedTokens"),
                **columns.read(row, path, line_no),
            ))
    return records


_AZURE_FRACTION = re.compile(r"(\d*)(Z|[+-]\d\d(?::?\d\d)?)?", re.ASCII)  # `\d` alone holds `１`


def _azure_time(stamp: Any, path: Path, line: int) -> tuple[int, bool]:
    """An Azure `TIMESTAMP` in nanoseconds since the epoch (an integer, so that a row's time from the first is
    exact before it is rounded once to seconds: seconds since the epoch as a float keep about 0.24 µs, and
    lost the 100 ns digit), and whether it gave a time zone: `2023-11-16
    18:17:03.9799600` (2023, 100 ns digits; no zone: read as UTC, not as this machine's zone) or `2024-05-10
    00:00:00.009930+00:00` (2024, with its zone). The fraction is digits only: `03.5e3` was read as 500 s in.
    (Hot: every row of a trace. A zone-less stamp's seconds are counted from a naive epoch, which is UTC's
    reading and ~4x faster than attaching the UTC zone.)"""
    date, dot, rest = stamp.partition(".") if isinstance(stamp, str) else ("", "", "")
    if rest.isascii() and rest.isdigit():  # the 2023 form (`²` passed isdigit, then int() refused it)
        fraction, zone = rest, ""
    else:
        match = _AZURE_FRACTION.fullmatch(rest)  # not text: '' matches, and `fromisoformat('')` refuses it
        if match is None or (dot and not match.group(1)):
            raise bad_row(path, line, f"TIMESTAMP={shown(stamp)} is not a timestamp")
        fraction, zone = match.group(1), match.group(2) or ""
    try:
        instant = datetime.fromisoformat(date + zone)
    except ValueError:
        raise bad_row(path, line, f"TIMESTAMP={shown(stamp)} is not a timestamp") from None
    has_zone = instant.tzinfo is not None
    seconds = instant.timestamp() if has_zone else (instant - _NAIVE_EPOCH).total_seconds()  # whole: exact
    return int(seconds) * 10**9 + int(fraction[:9].ljust(9, "0")), has_zone  # digits past the ns dropped


_NAIVE_EPOCH = datetime(1970, 1, 1)  # a zone-less stamp is UTC: its seconds since this


_HASH_ID_TYPES = frozenset((int, str))  # a Mooncake hash_id's JSON types (`type`, so true and 1.0 are not ids)


def read_mooncake(path: Path | str, columns: TraceColumns = NO_COLUMNS) -> list[TraceRecord]:
    """JSONL with `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (one per 512 tokens)."""
    path = trace_path(path)
    records = []
    for line_no, row in iter_jsonl(path):
        prompt = _positive(row.get("input_length"), path, line_no, "input_length")
        output = _positive(row.get("output_length"), path, line_no, "output_length")
        hash_ids = row.get("hash_ids")
        if not isinstance(hash_ids, list) or len(hash_ids) != math.ceil(prompt / MOONCAKE_BLOCK_TOKENS):
            raise bad_row(path, line_no, f"hash_ids must list ceil(input_length / 512) = "
                                      f"{math.ceil(prompt / MOONCAKE_BLOCK_TOKENS)} ids")
        if not _HASH_ID_TYPES.issuperset(map(type, hash_ids)):  # JSON gives exact types: a bool is not an int
            raise bad_row(path, line_no, "hash_ids must be integers or strings")
        # one id per 512 tokens, the last for the rest: ceil(prompt / 512) ids leave the last 1 to 512 tokens
        segments = [(("mooncake", hash_id), MOONCAKE_BLOCK_TOKENS) for hash_id in hash_ids]
        segments[-1] = (segments[-1][0], prompt - (len(hash_ids) - 1) * MOONCAKE_BLOCK_TOKENS)
        arrival = _seconds(row.get("timestamp"), 1000.0, path, line_no, "timestamp")
        records.append(TraceRecord(arrival, prompt, output, tuple(segments), **columns.read(row, path, line_no)))
    return records


def read_sharegpt_tokens(path: Path | str, columns: TraceColumns = NO_COLUMNS) -> list[TraceRecord]:
    """LLMServingSim JSONL: `arrival_time_ns`, `input_toks`, `output_toks`, `input_tok_ids`, `output_tok_ids`.

    The token ids are optional, as in LLMServingSim's format: a request without them shares no
    prefix with any other (its blocks get a unique identity).
    """
    path = trace_path(path)
    records = []
    for line_no, row in iter_jsonl(path):
        prompt = _positive(row.get("input_toks"), path, line_no, "input_toks")
        output = _positive(row.get("output_toks"), path, line_no, "output_toks")
        ids_in, ids_out = row.get("input_tok_ids"), row.get("output_tok_ids", [])
        if ids_in is None:
            ids_out = None
        elif not isinstance(ids_in, list) or len(ids_in) != prompt:
            raise bad_row(path, line_no, "input_tok_ids must list input_toks token ids")
        elif not isinstance(ids_out, list):  # was told as input_tok_ids', a list of the right length
            raise bad_row(path, line_no, f"output_tok_ids={shown(ids_out)} is not a list of token ids")
        elif ids_out and len(ids_out) != output:  # none given is fine: the output's ids are then unknown
            raise bad_row(path, line_no, f"output_tok_ids lists {len(ids_out)} token ids, output_toks={output}")
        elif not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in (*ids_in, *ids_out)):
            raise bad_row(path, line_no, "input_tok_ids and output_tok_ids must be integer token ids (>= 0)")
        arrival = _seconds(row.get("arrival_time_ns"), 1e9, path, line_no, "arrival_time_ns")
        ids = None if ids_in is None or ids_out is None else tuple(ids_in) + tuple(ids_out)
        records.append(TraceRecord(arrival, prompt, output, token_ids=ids, **columns.read(row, path, line_no)))
    return records


def write_sharegpt_tokens(records: list[TraceRecord], path: Path | str) -> None:
    """The inverse of `read_sharegpt_tokens`: arrivals in integer ns, token ids where known."""
    with Path(path).open("w", encoding="utf-8") as f:
        for r in records:
            row: dict[str, Any] = {"input_toks": r.prompt_len, "output_toks": r.output_len,
                                   "arrival_time_ns": round((r.arrival_s or 0.0) * 1e9)}
            if r.token_ids is not None:
                row["input_tok_ids"] = list(r.token_ids[: r.prompt_len])
                row["output_tok_ids"] = list(r.token_ids[r.prompt_len:])
            f.write(json.dumps(row, separators=(",", ":")) + "\n")

def read_lengths(path: Path | str, columns: TraceColumns = NO_COLUMNS) -> list[TraceRecord]:
    """`num_prefill_tokens,num_decode_tokens,...` (Vidur / Sarathi-Serve length tables)."""
    path = trace_path(path)
    records = []
    with open_text(path, newline="") as f:
        reader = csv_rows(f, path)
        _require_columns(reader, path, ("num_prefill_tokens", "num_decode_tokens", *columns.names))
        header = reader.fieldnames
        for line_no, row in enumerate(reader, start=2):
            _no_extra_fields(row, path, line_no)
            records.append(TraceRecord(
                None,
                _positive(row.get("num_prefill_tokens"), path, line_no, "num_prefill_tokens"),
                _positive(row.get("num_decode_tokens"), path, line_no, "num_decode_tokens"),
                **columns.read(row, path, line_no),
            ))
    if not records:  # an empty file has no header either (it was said to have one)
        why = "the table has a header but no rows" if header else "the file is empty"
        raise KvsimError(f"{path}: no requests ({why})")
    return records


def read_vllm_sharegpt(path: Path | str) -> list[TraceRecord]:
    """vLLM benchmark JSON: the first human/gpt pair of each conversation, tokens ≈ characters / 4.

    As vLLM's benchmark samples ShareGPT (`sample_sharegpt_requests`, "Prune too short sequences";
    `is_valid_sequence`'s `min_len`), a conversation without a reply, or whose prompt or reply is under
    `SHAREGPT_MIN_TOKENS` tokens (here under 16 characters, an empty one too), is skipped, with one warning
    counting them; a file of nothing else, or a turn whose value is not text, is refused. vLLM's benchmark
    also prunes prompts over 1,024 tokens and pairs over 2,048 by default; kvsim keeps those (long contexts
    are what it models; `engine.max_model_len` decides what an engine serves)."""
    path = trace_path(path)
    try:
        with open_text(path) as f:  # a byte-order mark skipped, a .gz decompressed, as every reader does
            data = load_json(f.read())
    except json.JSONDecodeError as error:
        raise KvsimError(f"{path}:{error.lineno}: not JSON ({error.msg})") from None
    if not isinstance(data, list):
        raise KvsimError(f"{path}: expected a JSON list of conversations")
    records, skipped = [], 0
    for index, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise KvsimError(f"{path}: conversation {index} has no 'conversations' list")
        if len(turns) < 2:
            skipped += 1  # as vLLM's benchmark does: skip conversations without a reply
            continue
        if not all(isinstance(turn, dict) for turn in turns[:2]):
            raise KvsimError(f"{path}: conversation {index}: turns must be objects with a 'value', "
                             f"got {str(turns[0])[:40]!r}")
        prompt, reply = turns[0].get("value"), turns[1].get("value")
        for turn, value in enumerate((prompt, reply)):
            if not isinstance(value, str):
                raise KvsimError(f"{path}: conversation {index}: turn {turn} value={shown(value)} is not text")
        prompt_len, output_len = len(prompt) // CHARS_PER_TOKEN, len(reply) // CHARS_PER_TOKEN
        if prompt_len < SHAREGPT_MIN_TOKENS or output_len < SHAREGPT_MIN_TOKENS:
            skipped += 1  # a prompt or reply of 1 to 15 characters was kept as a 1- to 3-token request
            continue
        records.append(TraceRecord(None, prompt_len, output_len))
    short = f"a prompt or reply under {SHAREGPT_MIN_TOKENS} tokens ({SHAREGPT_MIN_TOKENS * CHARS_PER_TOKEN} characters)"
    if skipped and not records:
        raise KvsimError(f"{path}: no rows: each of its {skipped:,} conversations lacks a reply or has {short} "
                         "(vLLM's benchmark skips those)")
    if skipped:
        log.warning("%s: skipped %s of %s conversations without a reply or with %s, as vLLM's benchmark does",
                    path, f"{skipped:,}", f"{len(data):,}", short)
    return records


# the row formats: each reads the optional per-request columns too
ROW_READERS: dict[str, Callable[[Path, TraceColumns], list[TraceRecord]]] = {
    "azure": read_azure,
    "mooncake": read_mooncake,
    "sharegpt_tokens": read_sharegpt_tokens,
    "lengths": read_lengths,
}
READERS: dict[str, Callable[..., list[TraceRecord]]] = {**ROW_READERS, "vllm_sharegpt": read_vllm_sharegpt}
