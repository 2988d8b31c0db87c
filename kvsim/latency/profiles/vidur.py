"""Microsoft Vidur's per-operator MLP profile (`data/profiling/compute/<device>/<org>/<model>/mlp.csv`).

One row per (num_tokens, num_tensor_parallel_workers) with the model's shapes (n_head, n_kv_head,
n_embd, n_expanded_embd, vocab_size, use_gated_mlp) and `time_stats.<op>.<stat>` in milliseconds
for the ops Vidur's profiler times (vidur/profiling/mlp/mlp_impl.py): emb, input_layernorm,
attn_pre_proj, attn_rope, attn_post_proj, post_attention_layernorm, mlp_up_proj, mlp_act,
mlp_down_proj, add. The median is used (as Vidur's predictors do), the mean where it is absent.

It has no attention, LM head or sampler timings, so those terms fall back to the roofline; it
records no GPU or dtype, so the GPU is the `<device>` folder, read as the preset Vidur measured on
(`VIDUR_DEVICES`: its `h100` is the H100-80GB SXM, its `a100` an 80 GB A100), so that the GPU check
refuses the profile for a sibling chip (an H100 PCIe, an A100 40GB) instead of matching the bare family
name; an unknown folder name is kept as it is. The vocabulary in the file is
Vidur's padded size and is not recorded (no timing depends on it). `use_gated_mlp` (pandas writes the bool as
True or False) is recorded as `gated_mlp`, which `check_profile` compares with the model: a gated MLP's up
projection is twice as wide, so its `gate_up` times are not a plain MLP's.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

from kvsim.latency.profiles import Profile, check_csv_table, find_source
from kvsim.model.errors import KvsimError, cut, reading
from kvsim.model.units import ascii_int, read_number
from kvsim.workload.files import csv_rows, open_text

OPS = {  # Vidur op -> (kind, kvsim op, calls per layer or step)
    "emb": ("step_op", "embedding", 1),
    "input_layernorm": ("token_op", "input_layernorm", 1),
    "attn_pre_proj": ("gemm", "qkv", 1),
    "attn_rope": ("token_op", "rotary_emb", 1),
    "attn_post_proj": ("gemm", "o", 1),
    "post_attention_layernorm": ("token_op", "post_attention_layernorm", 1),
    "mlp_up_proj": ("gemm", "gate_up", 1),
    "mlp_act": ("token_op", "act_fn", 1),
    "mlp_down_proj": ("gemm", "down", 1),
    "add": ("token_op", "add", 1),
}
VIDUR_DEVICES = {"h100": "h100-80gb", "a100": "a100-80gb", "a40": "a40"}  # Vidur's device folders -> presets
SHAPES = {"n_head": "num_attention_heads", "n_kv_head": "num_kv_heads", "n_embd": "hidden_size",
          "n_expanded_embd": "intermediate_size"}
GATED = "use_gated_mlp"


def is_vidur_csv(path: Path) -> bool:
    """Whether `path`'s header is a Vidur mlp.csv's, read as every reader reads (`open_text`): an `mlp.csv.gz`
    was taken for a kvsim CSV and refused as one ("column 'kind' is missing")."""
    try:
        with open_text(path) as f:
            header = f.readline()
    except (OSError, UnicodeDecodeError, EOFError, zlib.error):
        return False
    return "num_tensor_parallel_workers" in header and "n_embd" in header


def _time_column(fields: list[str], op: str) -> str | None:
    for stat in ("median", "mean"):
        if f"time_stats.{op}.{stat}" in fields:
            return f"time_stats.{op}.{stat}"
    return None


def _workers(cell: str | None, index: int, path: Path) -> int:
    """A row's num_tensor_parallel_workers, a whole number >= 1 (`2.0` too, as pandas may write it); a blank or
    other cell is refused (a blank one left its row out without a word, `2.0` was 'not tensor_parallel_size=2')."""
    try:
        workers = read_number(cell, float)
    except (TypeError, ValueError):
        workers = math.nan
    if not (workers >= 1 and workers.is_integer()):
        raise KvsimError(f"profile {path}: line {index + 2}: num_tensor_parallel_workers={cell!r} is not a whole "
                         "number >= 1")
    return int(workers)


def read_vidur_mlp(path: Path, tp: int) -> Profile:
    """Import the rows of `path` measured at `tp` tensor-parallel workers."""
    with reading(path, "profile"), open_text(path, newline="") as f:  # a truncated .gz was a bare EOFError
        reader = csv_rows(f, path)
        fields = list(reader.fieldnames or ())
        table = list(reader)
    columns = {op: _time_column(fields, op) for op in OPS}
    if not any(columns.values()):
        raise KvsimError(f"profile {path}: a Vidur mlp.csv without time_stats.<op>.median columns")
    for needed in ("num_tokens", "num_tensor_parallel_workers"):  # a missing num_tokens was a KeyError traceback
        if needed not in fields:
            raise KvsimError(f"profile {path}: column {needed!r} is missing (Vidur's mlp.csv gives it on each row)")
    check_csv_table(path, table, len(fields))  # no rows read "measured at num_tensor_parallel_workers , not ..."
    workers = [_workers(r["num_tensor_parallel_workers"], i, path) for i, r in enumerate(table)]
    mine = [r for r, n in zip(table, workers, strict=True) if n == tp]
    if not mine:
        raise KvsimError(f"profile {path}: measured at num_tensor_parallel_workers "
                         f"{', '.join(map(str, sorted(set(workers))))}, not tensor_parallel_size={tp}")
    for shape in SHAPES:  # one model's rows: only the first row's shapes were checked against the model
        values = list(dict.fromkeys(r.get(shape) for r in table))
        if len(values) > 1:
            raise KvsimError(f"profile {path}: the rows disagree on {shape} ({cut(', '.join(map(str, values)))}): "
                             "one model's profile per file")
    gated = _gated_mlp(table, path) if GATED in fields else None
    rows = []
    for r in mine:
        for op, column in columns.items():
            if column is None or r.get(column) in (None, ""):
                continue
            try:
                seconds = read_number(r[column], float) * 1e-3
            except (TypeError, ValueError):  # TypeError: a short (truncated) row
                raise KvsimError(f"profile {path}: {column}={r[column]!r} is not a number") from None
            if math.isnan(seconds):  # dropped as a timer that did not fire, while an inf was refused
                raise KvsimError(f"profile {path}: {column}={r[column]!r} is not a number")
            if seconds < 0:  # dropped as a timer that did not fire, without a word
                raise KvsimError(f"profile {path}: {column}={r[column]!r} is negative (a time is 0, a timer that did "
                                 "not fire, or positive)")
            if seconds == 0:  # Vidur writes 0.0 for an op whose timer did not fire; skip it
                continue
            kind, name, calls = OPS[op]
            rows.append({"kind": kind, "op": name, "num_tokens": r["num_tokens"], "time_s": repr(seconds),
                         "calls": str(calls) if kind != "gemm" else ""})
    first = mine[0]
    for column in SHAPES:
        value = first.get(column)
        if value not in (None, "") and not (ascii_int(value) or 0) > 0:  # `²` passed isdigit, then int() refused it
            raise KvsimError(f"profile {path}: {column}={value!r} must be a positive whole number")
    meta = {SHAPES[k]: first[k] for k in SHAPES if first.get(k)}
    if first.get("n_embd") and first.get("n_head"):
        meta["head_dim"] = str(int(first["n_embd"]) // int(first["n_head"]))
    parts = path.resolve().parts
    folder = parts[-4] if len(parts) >= 4 else ""
    device = VIDUR_DEVICES.get(folder, folder)
    meta.update({"gpu": device, "model": "/".join(parts[-3:-1]), "tensor_parallel_size": str(tp),
                 **find_source(path.parent, "microsoft/vidur"), "source_path": str(path),
                 "source_format": "Vidur mlp.csv"})
    if gated is None:
        return Profile(f"vidur:{meta['model']}", meta, rows)
    meta["gated_mlp"] = gated
    return Profile(f"vidur:{meta['model']}", meta, rows, {"gated_mlp": GATED})


def _gated_mlp(table: list[dict[str, str]], path: Path) -> str:
    """The rows' one `use_gated_mlp`, as `true` or `false`: a cell that is neither (`maybe`) was accepted unread,
    and rows that disagree are two models' profiles in one file."""
    values = []
    for index, row in enumerate(table):
        cell = row.get(GATED)
        value = cell.strip().lower() if isinstance(cell, str) else ""
        if value not in ("true", "false"):
            raise KvsimError(f"profile {path}: line {index + 2}: {GATED}={cell!r} is not True or False")
        values.append(value)
    if len(set(values)) > 1:
        raise KvsimError(f"profile {path}: the rows disagree on {GATED} (True, False): one model's profile per file")
    return values[0]
