"""LLMServingSim's profile bundle (casys-kaist/LLMServingSim, `profiler/perf/<hw>/<model>/<variant>/`).

Format (benchmarks/validation_set/formats/profile-bundle.md), times in microseconds; any CSV
may be gzipped (`dense.csv.gz`):

    meta.yaml               gpu (driver's name), model, variant (bf16, bf16-kvfp8, ...), tp_degrees,
                            engine_effective.hf_overrides (per-rank shapes at the largest TP degree)
    tp<N>/dense.csv         layer,tokens,time_us           one op of one decoder layer (or of the step)
    tp<N>/attention.csv     prefill_chunk,kv_prefill,n_decode,kv_decode,time_us   one attention layer
    tp<N>/per_sequence.csv  layer,sequences,time_us        lm_head, sampler
    tp<N>/moe.csv           tokens,activated_experts,time_us   (MoE models)

Mapped into kvsim's schema: qkv_proj/o_proj/gate_up_proj/down_proj → `gemm` (qkv/o/gate_up/down);
layernorm (twice per layer: before attention and before the MLP, as LLMServingSim's architecture
files list it), qk_norm, rotary_emb, act_fn → `token_op`; embedding, final_layernorm → `step_op`;
lm_head, sampler → `sequence_op`; attention rows → `attention` (query_len = prefill_chunk,
context_len = kv_prefill + prefill_chunk, batch = n_decode, decode_context_len = kv_decode);
moe.csv → `moe`; skew_fit.csv (the correction for decodes of unequal lengths,
t = t(mean context) + α · (t(longest context) − t(mean context)), α per bucket of chunk, decodes,
share of long decodes, longest context and cached tokens: `kvsim.latency.skew`) → `attention_skew`,
with meta.yaml's `skew_fit.bucket_axes` as each bucket's upper edges and `per_tp.<N>.alpha_default`
as the default, when `skew_fit.enabled`. skew.csv (the raw shots the fit was made from) is not read.

Provenance: meta.yaml's versions and dates are kept; the source repository, commit and licence
come from a `source.yaml` (`repository`, `commit`, `licence`) in the bundle or a folder above it,
and are recorded as "unrecorded" when there is none.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import yaml

from kvsim.latency.profiles import Profile, check_csv_table, find_source
from kvsim.latency.skew import AXES, DEFAULT_KEY, EDGES_KEY, alpha_default, bucket_name, format_edges
from kvsim.model.errors import KvsimError, reading
from kvsim.model.units import read_number
from kvsim.model.yaml_io import check_yaml_size, load_yaml, yaml_problem
from kvsim.workload.files import csv_rows, data_file, open_text

GEMMS = {"qkv_proj": "qkv", "o_proj": "o", "gate_up_proj": "gate_up", "down_proj": "down"}
TOKEN_OPS = {"layernorm": 2, "qk_norm": 1, "rotary_emb": 1, "act_fn": 1}
STEP_OPS = ("embedding", "final_layernorm")
VARIANT_KV = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "fp8"}
PROVENANCE = ("profiler_version", "vllm_version", "cuda_version", "hardware", "profiled_at", "architecture",
              "architecture_sha256", "variant")


def _read_csv(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows of one of the bundle's CSVs, each with exactly the header's fields: a row with one more (`60,7`
    for a time) was read without it, a row cut short as a cell of None, as Vidur's mlp.csv is checked. A header
    with no rows is refused (a profiler that stopped after it): read as no measurements, a dense.csv so cut was
    imported as a profile without its linear layers, which fell back to the roofline; a file the profiler did not
    write is absent instead (the optional ones are then not read)."""
    with reading(path, "profile"), open_text(path, newline="") as f:  # not UTF-8, a truncated .gz: bare errors
        reader = csv_rows(f, path)
        fields = reader.fieldnames or ()
        if not set(columns) <= set(fields):
            raise KvsimError(f"profile {path}: expected the columns {','.join(columns)}")
        table = list(reader)
    check_csv_table(path, table, len(fields))
    return table


def _seconds(value: str | None, path: Path) -> str:
    try:
        us = read_number(value, float)
    except (TypeError, ValueError):  # TypeError: a short (truncated) row
        raise KvsimError(f"profile {path}: time_us={value!r} is not a number") from None
    if not us > 0:
        raise KvsimError(f"profile {path}: time_us={value!r} must be positive")
    return repr(us * 1e-6)


def _whole(row: dict[str, str], column: str, path: Path) -> int:
    try:
        return read_number(row[column], int)
    except (TypeError, ValueError):
        raise KvsimError(f"profile {path}: {column}={row[column]!r} is not a whole number") from None


def _count(value: Any) -> int:
    """A count of at least 1 (an int, or a float or text holding one); anything else raises ValueError or
    TypeError: `int()` read `tp_degrees: [1.5]` as 1 and an override of 12.5 heads as 12, and `float()` read
    `1_0` (YAML keeps it as text) as 10, without a word."""
    if isinstance(value, bool):
        raise TypeError(value)
    number = read_number(value, float)
    if not number.is_integer() or number < 1:
        raise ValueError(value)
    return int(number)


def _shapes_error(meta_path: Path) -> KvsimError:
    """The one error for a meta.yaml whose `tp_degrees` or `hf_overrides` are not counts."""
    return KvsimError(f"profile {meta_path}: tp_degrees must list integers and engine_effective.hf_overrides "
                      "map shape names to integers")


def _tp_degrees(raw: dict[str, Any], tp: int) -> list[int]:
    """meta.yaml's `tp_degrees`, the degrees the bundle has folders for ([tp] when it gives none); anything but a
    list of counts raises ValueError or TypeError (a text `"12"` was read as the degrees 1 and 2)."""
    given = raw.get("tp_degrees")
    if not given:
        return [tp]
    if not isinstance(given, list):
        raise TypeError(given)
    return [_count(d) for d in given]


def _meta(root: Path, raw: dict[str, Any], tp: int, rank_tp: int) -> dict[str, str]:
    variant = str(raw.get("variant", ""))
    weight, _, kv = variant.partition("-kv")
    meta = {"gpu": str(raw.get("gpu", "")), "model": str(raw.get("model", "")), "tensor_parallel_size": str(tp),
            "kv_cache_dtype": VARIANT_KV.get(kv or weight, kv or weight),
            **find_source(root, "casys-kaist/LLMServingSim (profile bundle format)"),
            "source_path": str(root), "source_format": "LLMServingSim profile bundle"}
    overrides = (raw.get("engine_effective") or {}).get("hf_overrides") or {}
    for ours, theirs in (("num_attention_heads", "num_attention_heads"), ("num_kv_heads", "num_key_value_heads"),
                         ("intermediate_size", "intermediate_size"), ("vocab_size", "vocab_size")):
        if theirs in overrides:
            meta[ours] = str(_count(overrides[theirs]) * rank_tp)
    meta.update({k: str(raw[k]) for k in PROVENANCE if k in raw})
    return meta


def read_bundle(path: Path, tp: int) -> Profile:
    """Import the bundle at `path` (the variant folder holding meta.yaml, or one of its tp<N> folders)."""
    root = path.parent if data_file(path / "dense.csv").is_file() and not (path / "meta.yaml").is_file() else path
    meta_path = root / "meta.yaml"
    if not meta_path.is_file():
        raise KvsimError(f"profile {path}: not a profile bundle (no meta.yaml)")
    try:
        with reading(meta_path, "profile"), open_text(meta_path) as f:  # not UTF-8: a bare UnicodeDecodeError
            check_yaml_size(meta_path, "profile")
            raw = load_yaml(f.read())
    except yaml.YAMLError as error:
        raise KvsimError(f"profile {meta_path}: cannot read: {yaml_problem(error)}") from None
    if not isinstance(raw, dict):
        raise KvsimError(f"profile {meta_path}: expected a mapping (gpu, model, variant, tp_degrees, ...), "
                         f"got {type(raw).__name__ if raw is not None else 'an empty file'}")
    folder = root / f"tp{tp}"
    if not folder.is_dir():
        have = sorted(p.name for p in root.glob("tp*") if p.is_dir())
        raise KvsimError(f"profile {root}: measured at {', '.join(have) or 'no TP degree'}, "
                         f"not tensor_parallel_size={tp}")
    try:
        degrees = _tp_degrees(raw, tp)
    except (TypeError, ValueError):
        raise _shapes_error(meta_path) from None
    if tp not in degrees:  # a tp1 folder beside `tp_degrees: [2]` was imported without a word
        raise KvsimError(f"profile {meta_path}: tp_degrees={raw['tp_degrees']} does not list "
                         f"tensor_parallel_size={tp}: meta.yaml does not describe the folder {folder.name}")
    rows: list[dict[str, str]] = []
    dense = data_file(folder / "dense.csv")
    for r in _read_csv(dense, ("layer", "tokens", "time_us")):
        layer, t = r["layer"], _seconds(r["time_us"], dense)
        if layer in GEMMS:
            rows.append({"kind": "gemm", "op": GEMMS[layer], "num_tokens": r["tokens"], "time_s": t})
        elif layer in STEP_OPS:
            rows.append({"kind": "step_op", "op": layer, "num_tokens": r["tokens"], "time_s": t, "calls": "1"})
        else:
            rows.append({"kind": "token_op", "op": layer, "num_tokens": r["tokens"], "time_s": t,
                         "calls": str(TOKEN_OPS.get(layer, 1))})
    per_seq = data_file(folder / "per_sequence.csv")
    if per_seq.is_file():
        for r in _read_csv(per_seq, ("layer", "sequences", "time_us")):
            rows.append({"kind": "sequence_op", "op": r["layer"], "batch": r["sequences"],
                         "time_s": _seconds(r["time_us"], per_seq)})
    attention = data_file(folder / "attention.csv")
    if attention.is_file():
        for r in _read_csv(attention, ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")):
            chunk, cached = _whole(r, "prefill_chunk", attention), _whole(r, "kv_prefill", attention)
            rows.append({"kind": "attention", "query_len": str(chunk), "context_len": str(cached + chunk),
                         "batch": r["n_decode"], "decode_context_len": r["kv_decode"],
                         "time_s": _seconds(r["time_us"], attention)})
    moe = data_file(folder / "moe.csv")
    if moe.is_file():
        for r in _read_csv(moe, ("tokens", "activated_experts", "time_us")):
            rows.append({"kind": "moe", "num_tokens": r["tokens"], "num_experts": r["activated_experts"],
                         "time_s": _seconds(r["time_us"], moe)})
    name = f"{raw.get('model', root.name)}/{raw.get('variant', '')}/tp{tp}"
    try:
        meta = _meta(root, raw, tp, max(degrees))  # the overrides are the per-rank shapes of the largest degree
    except KvsimError:  # source.yaml's, named as it is (a KvsimError is a ValueError)
        raise
    except (AttributeError, TypeError, ValueError):
        raise _shapes_error(meta_path) from None
    skew = _skew_rows(folder, raw, tp, meta_path)
    if skew is None:
        return Profile(name, meta, rows)
    rows += skew[0]
    meta.update(skew[1])
    return Profile(name, meta, rows, skew[2])


SKEW_AXES = (("n", "n_label", "batch"), ("skew_rate", "skew_rate_label", "skew_share"),
             ("kv_big", "kv_big_label", "decode_context_len"), ("kp", "kp_label", "context_len"))
"""skew_fit's bucket axes: (meta.yaml's prefix of `<prefix>_bins` / `_labels`, skew_fit.csv's column,
kvsim's column)."""


def _skew_rows(folder: Path, raw: dict[str, Any], tp: int,
               meta_path: Path) -> tuple[list[dict[str, str]], dict[str, str], dict[str, str]] | None:
    """`attention_skew` rows, their metadata and the bundle's own names of them (`Profile.names`: a skew_fit.csv
    row by its labels, the meta.yaml field the default came from) from tp<N>/skew_fit.csv, or None when the
    bundle has no enabled skew fit. A label's bucket is (bins[i], bins[i + 1]]: its upper edge is bins[i + 1]."""
    fit = raw.get("skew_fit")
    table = data_file(folder / "skew_fit.csv")
    if not isinstance(fit, dict) or not fit.get("enabled") or not table.is_file():
        return None
    try:
        axes = fit["bucket_axes"]
        bins = {prefix: [read_number(b, float) for b in axes[f"{prefix}_bins"]] for prefix, _, _ in SKEW_AXES}
        edge_of = {prefix: dict(zip(axes[f"{prefix}_labels"], bins[prefix][1:], strict=True))
                   for prefix, _, _ in SKEW_AXES}
    except (KeyError, TypeError, ValueError):
        raise KvsimError(f"profile {meta_path}: skew_fit.bucket_axes needs <axis>_bins (one more than its labels) "
                         "and <axis>_labels for n, skew_rate, kv_big and kp") from None
    for prefix, given in bins.items():  # unsorted, a label took another's upper edge (pandas' cut refuses them)
        if not all(math.isfinite(edge) for edge in given) or any(a >= b for a, b in itertools.pairwise(given)):
            raise KvsimError(f"profile {meta_path}: skew_fit.bucket_axes.{prefix}_bins={given}: expected finite "
                             "numbers, increasing (label i's bucket is (bins[i], bins[i + 1]])")
    entry = (fit.get("per_tp") or {}).get(tp) or {}
    raw_default = entry.get("alpha_default", fit.get("alpha_default", 0.0)) if isinstance(entry, dict) else None
    pooled = isinstance(entry, dict) and "alpha_default" not in entry and "alpha_default" in fit  # the fit's own
    default_field = "skew_fit.alpha_default" if pooled else f"skew_fit.per_tp.{tp}.alpha_default"
    default = alpha_default(raw_default, str(meta_path), default_field)
    columns = ("pc", "alpha", *(label for _, label, _ in SKEW_AXES))
    rows, names = [], {DEFAULT_KEY: f"meta.yaml {default_field}"}
    for r in _read_csv(table, columns):
        row = {"kind": "attention_skew", "query_len": str(_whole(r, "pc", table)), "alpha": r["alpha"]}
        for prefix, label, ours in SKEW_AXES:
            if r[label] not in edge_of[prefix]:
                raise KvsimError(f"profile {table}: {label}={r[label]!r} is not one of meta.yaml's {prefix}_labels")
            row[ours] = repr(edge_of[prefix][r[label]])
        rows.append(row)
        labels = ", ".join(f"{column}={r[column]}" for column in ("pc", *(label for _, label, _ in SKEW_AXES)))
        names[bucket_name([float(row["query_len"]), *(float(row[axis]) for axis in AXES)])] = \
            f"{table.name} row ({labels})"
    edges = {ours: sorted(edge_of[prefix].values()) for prefix, _, ours in SKEW_AXES}
    return rows, {EDGES_KEY: format_edges(edges), DEFAULT_KEY: repr(default)}, names
