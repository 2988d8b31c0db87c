"""What every imported profile must hold before it is used or written: physical rows, the right model.

`check_rows` refuses, naming the row:
* no rows at all (a file whose every time was zero or negative leaves none);
* a time that is not a finite positive number of seconds, a size (tokens, batch, context...)
  that is not a whole number >= 0 or is empty where the row's kind is looked up by it (`KIND_SIZES`),
  a `calls` that is not a whole number >= 1 (the op's runs per layer or step, a multiplier of its
  time); an `attention_skew` row (a fitted α, no time) whose α or bucket edges are not finite numbers;
* one point measured twice with times more than `MAX_SPREAD` apart (a unit slip, not noise);
* a time more than `MAX_SPREAD` below the time of a smaller size of the same op, others fixed
  (more tokens, sequences or context never make a kernel 10x faster; measured profiles dip at
  most 2.5x between neighbouring sizes: the embedding lookup at a few tokens).

`check_model_name` refuses a profile whose recorded model is another model's: the names are
compared by words, as GPU names are (`meta-llama/Llama-3.1-8B` is the preset `llama-3.1-8b`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kvsim.latency.profiles import Profile, name_words
from kvsim.model.errors import KvsimError
from kvsim.model.units import read_number

if TYPE_CHECKING:
    from pathlib import Path

    from kvsim.model.config import ModelSpec

MAX_SPREAD = 10.0
SIZES = ("batch", "context_len", "query_len", "num_tokens", "n", "k", "block_size", "num_heads", "num_kv_heads",
         "head_dim", "decode_context_len", "num_experts")
"""The schema's size columns: whole numbers where given (empty: not this kind's axis)."""
KIND_SIZES = {"decode": ("batch", "context_len"), "prefill": ("query_len",), "attention": ("query_len",),
              "gemm": ("num_tokens",), "token_op": ("num_tokens",), "step_op": ("num_tokens",),
              "sequence_op": ("batch",), "moe": ("num_tokens", "num_experts")}
"""The sizes a row of each kind is looked up by (`kvsim.latency.calibrated` reads them as numbers): never empty."""
SKEW_SIZES = ("query_len", "batch", "decode_context_len", "context_len")
"""An `attention_skew` row's bucket edges besides `skew_share` (`kvsim.latency.skew`)."""


def check_rows(profile: Profile, path: Path) -> None:
    """Raise `KvsimError` naming the first row that is not physical (see the module docstring) and `path`,
    the file or folder it was read from (a kvsim CSV's `source_path` is where it was imported from)."""
    where = f"profile {path}"
    if not profile.rows:
        raise KvsimError(f"{where}: no usable rows (times that are zero or negative are left out)")
    points: dict[tuple[str, ...], list[float]] = {}
    for i, row in enumerate(profile.rows):
        what = f"{where}: row {i + 1} ({row.get('kind')} {row.get('op') or ''})".replace(" )", ")")
        if row.get("kind") == "attention_skew":  # a fitted coefficient over bucket edges, not a time
            for column in ("alpha", "skew_share", *SKEW_SIZES):
                _finite(row.get(column), column, what)
            continue
        seconds = _finite(row.get("time_s"), "time_s", what)
        if not seconds > 0:
            raise KvsimError(f"{what}: time_s={row.get('time_s')!r} must be positive")
        for column in KIND_SIZES.get(str(row.get("kind")), ()):  # empty: a ValueError traceback mid-run
            if row.get(column) in (None, ""):
                raise KvsimError(f"{what}: {column} is empty (a {row.get('kind')} row is looked up by its {column})")
        for column in SIZES:
            value = row.get(column)
            if value not in (None, ""):
                size = _finite(value, column, what)
                if size < 0 or not size.is_integer():
                    raise KvsimError(f"{what}: {column}={value!r} is not a whole number >= 0")
        calls = row.get("calls")
        if calls not in (None, ""):
            runs = _finite(calls, "calls", what)
            if runs < 1 or not runs.is_integer():
                raise KvsimError(f"{what}: calls={calls!r} is not a whole number >= 1")
        key = (str(row.get("kind")), str(row.get("op") or ""), *(str(row.get(c) or "") for c in SIZES))
        points.setdefault(key, []).append(seconds)
    for key, times in points.items():
        if max(times) > MAX_SPREAD * min(times):
            raise KvsimError(f"{where}: the {key[0]} {key[1]} point {_sizes(key)} is measured {len(times)} times, "
                             f"{max(times) / min(times):,.0f}x apart ({min(times):.3g} s to {max(times):.3g} s)")
    _check_monotone(where, {key: min(times) for key, times in points.items()})


def _check_monotone(where: str, points: dict[tuple[str, ...], float]) -> None:
    """Along each size axis, others fixed: no time more than `MAX_SPREAD` below a smaller size's."""
    for axis in range(len(SIZES)):
        lines: dict[tuple[str, ...], list[tuple[float, float, tuple[str, ...]]]] = {}
        for key, seconds in points.items():
            if key[2 + axis]:
                rest = key[:2 + axis] + key[3 + axis:]
                lines.setdefault(rest, []).append((float(key[2 + axis]), seconds, key))
        for line in lines.values():
            line.sort()
            slowest, slowest_key = 0.0, line[0][2]
            for _, seconds, key in line:
                if slowest > MAX_SPREAD * seconds:
                    raise KvsimError(f"{where}: the {key[0]} {key[1]} time at {_sizes(key)} ({seconds:.3g} s) is "
                                     f"{slowest / seconds:,.0f}x below the time at the smaller {_sizes(slowest_key)} "
                                     f"({slowest:.3g} s): not a physical shape")
                if seconds > slowest:
                    slowest, slowest_key = seconds, key


def _sizes(key: tuple[str, ...]) -> str:
    return ", ".join(f"{c}={v}" for c, v in zip(SIZES, key[2:], strict=True) if v) or "(no sizes)"


def _finite(value: object, column: str, what: str) -> float:
    try:
        number = read_number(value, float)
    except (TypeError, ValueError):
        raise KvsimError(f"{what}: {column}={value!r} is not a number") from None
    if not math.isfinite(number):
        raise KvsimError(f"{what}: {column}={value!r} is not a finite number")
    return number


def check_model_name(profile: Profile, model: ModelSpec) -> None:
    """Raise `KvsimError` when the profile records a model whose name is not `model`'s (by words)."""
    measured = profile.meta.get("model", "")
    if not measured:
        return
    theirs, ours = name_words(measured.rpartition("/")[2]), name_words(model.name.rpartition("/")[2])
    if theirs and ours and not (theirs <= ours or ours <= theirs):
        raise KvsimError(f"profile {profile.name}: measured for model={measured!r}, but the scenario's model is "
                         f"{model.name!r}")
