"""Measured profiles in kvsim's calibration schema, from any supported source.

One importer per source format, each returning a `Profile` (metadata + rows in the schema that
`kvsim.latency.base` declares); the latency models never read a foreign format:

    native.py   kvsim's own CSV (`kvsim calibrate`, or an imported profile written back out)
    bundle.py   LLMServingSim's profile bundle (meta.yaml + tp<N>/dense.csv, attention.csv, ...)
    vidur.py    Microsoft Vidur's per-operator `mlp.csv`

`loader.load_profile(path, ...)` picks the importer from what the path holds; `check_profile` refuses
a profile measured for another model, MLP kind, vocabulary, KV dtype, GPU or tensor-parallel degree.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.model.errors import KvsimError, reading
from kvsim.model.units import read_number

if TYPE_CHECKING:
    from kvsim.model.config import GPUSpec
    from kvsim.model.engine_config import EngineConfig
    from kvsim.model.spec import ModelSpec


@dataclass(slots=True)
class Profile:
    """A profile in kvsim's schema: `meta` (`kvsim.latency.base.PROFILE_META_KEYS` and more) and `rows`.

    `names`: for a value imported from another format, what its own file calls it, by the name kvsim's schema
    gives it (`attention_skew_alpha_default` -> `meta.yaml skew_fit.per_tp.1.alpha_default`), so that an error
    names the field the user wrote; empty for kvsim's own CSV, whose names are the schema's."""

    name: str
    meta: dict[str, str] = field(default_factory=dict)
    rows: list[dict[str, str]] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)

    def kinds(self) -> set[str]:
        return {r["kind"] for r in self.rows}


def with_source(profile: Profile, repository: str | None, commit: str | None, licence: str | None) -> Profile:
    """`profile` with the source fields that are given (not None) replaced, the rest kept as imported. A blank one
    is a `KvsimError` naming it: `--source-licence ''` was ignored without a word and `' '` recorded as no
    licence, in the `# key: value` lines a profile's provenance is read from."""
    given = {"source_repository": repository, "source_commit": commit, "source_licence": licence}
    for key, value in given.items():
        if value is not None and not value.strip():
            raise KvsimError(f"{key}={value!r}: is empty: give the source's {key.removeprefix('source_')} or leave it "
                             "out")
    meta = {**profile.meta, **{k: v for k, v in given.items() if v is not None}}
    return Profile(profile.name, meta, profile.rows, profile.names)


def check_csv_table(path: Path, table: list[dict[str | None, str | None]], num_fields: int) -> None:
    """A `KvsimError` naming the file unless every row of `table` (a measured profile's CSV, read by
    `kvsim.workload.files.csv_rows` below its header of `num_fields` fields) has exactly the header's fields, and
    there is a row: a header alone is a profiler that stopped after it, not a profile without measurements."""
    from kvsim.workload.files import first_ragged

    short = first_ragged(table)
    if short is not None:
        raise KvsimError(f"profile {path}: line {short + 2} does not have the header's {num_fields} fields "
                         "(a truncated or malformed file)")
    if not table:
        raise KvsimError(f"profile {path}: no rows (the table has a header but no rows)")


def find_source(folder: Path, default_repository: str) -> dict[str, str]:
    """`source_repository`, `source_commit`, `source_licence` from the nearest `source.yaml` at or above `folder`.

    Profiles copied from a public repository carry that file (`repository`, `commit`, `licence`);
    without one the repository is the format's origin and the commit and licence are "unrecorded".
    """
    import yaml

    from kvsim.model.yaml_io import check_yaml_size, load_yaml, yaml_problem
    from kvsim.workload.files import open_text

    for parent in (folder, *folder.parents):
        candidate = parent / "source.yaml"
        if candidate.is_file():
            try:  # not UTF-8 was a bare UnicodeDecodeError, a list an AttributeError (a bundle's: "tp_degrees must...")
                with reading(candidate, "profile source"), open_text(candidate) as f:
                    check_yaml_size(candidate, "profile source")
                    raw = load_yaml(f.read()) or {}
            except yaml.YAMLError as error:
                raise KvsimError(f"profile source {candidate}: cannot read: {yaml_problem(error)}") from None
            if not isinstance(raw, dict):
                raise KvsimError(f"profile source {candidate}: expected a mapping (repository, commit, licence)")
            return {f"source_{k}": str(raw.get(k, "unrecorded")) for k in ("repository", "commit", "licence")}
    return {"source_repository": default_repository, "source_commit": "unrecorded", "source_licence": "unrecorded"}


def name_words(name: str) -> set[str]:
    """The words of a device or model name (`NVIDIA H100 80GB` → h100, 80gb, nvidia), compared as sets."""
    return set(re.findall(r"[a-z]+[0-9]*|[0-9]+[a-z]*", name.lower()))


def gpu_matches(measured_on: str, gpu: GPUSpec) -> bool:
    """Whether a device name (`NVIDIA RTX PRO 6000 Blackwell Server Edition`) is the preset `gpu`.

    True when the names are equal, or every word of one is a word of the other and the device name has
    none of the preset's `other_sku_words`: the preset `rtx-pro-6000` (`rtx`, `pro`, `6000`) matches the
    driver's `... Server Edition` but not the `... Workstation Edition` (another SKU, with other clocks
    and bandwidth); Vidur's `a100` matches `a100-80gb`.
    """
    if measured_on.lower() == gpu.name.lower():
        return True
    preset, device = name_words(gpu.name), name_words(measured_on)
    if device & {word.lower() for word in gpu.other_sku_words}:
        return False
    return bool(preset and device) and (preset <= device or device <= preset)


def _kv_family(dtype: str) -> str:
    """fp8 variants are one family (the kernels differ only in scaling); others compare by name."""
    return "fp8" if dtype.startswith("fp8") else dtype


def check_profile(profile: Profile, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig) -> None:
    """Refuse a profile measured for another model shape, MLP kind (gated or not), vocabulary, KV dtype, GPU or TP
    degree.

    Only what the profile's metadata records is compared; every mismatch is one `KvsimError`
    naming the field, the profile's value and the scenario's.
    """
    from kvsim.latency.base import PROFILE_META_KEYS

    meta = profile.meta
    for key, kind in PROFILE_META_KEYS.items():
        have = meta.get(key)
        if kind is not int or have in (None, ""):
            continue
        try:
            value = read_number(have, float)
        except ValueError:
            value = math.nan
        if not value.is_integer():
            raise KvsimError(f"profile {profile.name}: metadata {key}={have!r} is not an integer")
        want = engine.tensor_parallel_size if key == "tensor_parallel_size" else getattr(model, key)
        if int(value) != want:
            raise KvsimError(f"profile {profile.name}: measured with {key}={have}, but the scenario has "
                             f"{key}={want} ({model.name}, tensor_parallel_size={engine.tensor_parallel_size})")
    gated = meta.get("gated_mlp")
    if gated:
        label = profile.names.get("gated_mlp", "gated_mlp")  # the source's own name (Vidur's use_gated_mlp)
        if gated not in ("true", "false"):
            raise KvsimError(f"profile {profile.name}: metadata {label}={gated!r} is not true or false")
        if (gated == "true") != model.gated_mlp:
            raise KvsimError(f"profile {profile.name}: measured with {label}={gated}, but the scenario's model "
                             f"{model.name} has {'a gated' if model.gated_mlp else 'no gated'} MLP")
    kv = meta.get("kv_cache_dtype")
    if kv:
        scenario_kv = model.dtype if engine.kv_cache_dtype == "auto" else engine.kv_cache_dtype
        if _kv_family(kv) != _kv_family(scenario_kv):
            raise KvsimError(f"profile {profile.name}: measured with kv_cache_dtype={kv}, but the scenario's KV "
                             f"cache is {scenario_kv}")
    measured_on = meta.get("gpu")
    if measured_on and not gpu_matches(measured_on, gpu):
        raise KvsimError(f"profile {profile.name}: measured on gpu={measured_on!r}, but the scenario's gpu is "
                         f"{gpu.name!r}")
