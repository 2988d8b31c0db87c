"""Validated configuration: models (shapes in `kvsim.model.spec`) and GPU datasheets; vLLM's engine arguments are
`kvsim.model.engine_config`'s.

Everything a user types passes through here once, at the boundary; the rest of kvsim
trusts these frozen objects. A bad value raises `KvsimError` naming the field and value.

Models load from a Hugging Face `config.json` (the families in `kvsim.model.families`: Llama,
Mistral, Qwen2/3, Qwen3-MoE, Mixtral, DeepSeek-V2/V3, gpt-oss, Gemma 3, Llama 4, OPT) or a
preset name (`kvsim/model/presets/models/*.json`, the same format). GPUs load from a preset
name (`kvsim/model/presets/gpus.yaml`) or a YAML/JSON file with `GPUSpec`'s fields.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from kvsim.model.errors import (
    KvsimError,
    blank_name,
    expect_name,
    from_validation_error,
    not_a_file,
    not_a_preset,
    reading,
)
from kvsim.model.sizes import Bytes
from kvsim.model.spec import Label, ModelSpec, Settings
from kvsim.model.yaml_io import (
    TEXT_ENCODING,
    load_json,
    load_shipped_yaml,
    load_yaml,
    settings_text,
    yaml_problem,
)

PRESETS_DIR = Path(__file__).parent / "presets"

# Rates (bytes/s, FLOP/s) are at least 1 a second: a positive rate as small as 1e-300 makes a step last
# inf seconds, which the event clock cannot schedule.


def model_from_hf_config(raw: dict[str, Any], name: str) -> ModelSpec:
    """Build a `ModelSpec` from a Hugging Face `config.json` dict (families: `kvsim.model.families`)."""
    from kvsim.model.families import fields_from_hf_config

    fields = fields_from_hf_config(raw, name)
    try:
        return ModelSpec(**fields)
    except ValidationError as error:
        raise from_validation_error(error, prefix=f"model {name}") from None


MODEL_WANTED = "a preset, a config.json or a model's folder"  # what a model names, for an error
GPU_WANTED = "a preset or a GPU file (YAML or JSON)"  # what a GPU names, for an error


def model_presets() -> list[str]:
    return sorted(p.stem for p in (PRESETS_DIR / "models").glob("*.json"))


def model_file(name_or_path: str) -> tuple[Path, bool]:
    """The file a model name reads and whether it is a preset: a preset's config (`llama-3.1-8b`), else
    the path given, or the `config.json` in a folder given (a downloaded model's folder, as vLLM's `--model`
    takes it); KvsimError naming the value when it is none of these, or blank (`Path('')` is the working folder,
    so an unset shell variable, `--model "$MODEL"`, read the config.json there)."""
    blank = blank_name("model", name_or_path, MODEL_WANTED)
    if blank is not None:
        raise KvsimError(blank)
    preset = PRESETS_DIR / "models" / f"{name_or_path}.json"
    path = Path(name_or_path)
    try:
        if preset.is_file():
            return preset, True
        if path.is_dir() and (path / "config.json").is_file():
            return path / "config.json", False
        is_file, folder = path.is_file(), _folder_without_config(path) if path.is_dir() else ""
    except OSError as error:  # a name over the system's limit: 'File name too long', naming the presets' folder
        is_file, folder = False, f" ({error.strerror})"
    if not is_file:
        raise KvsimError(not_a_preset("model", name_or_path, model_presets(), folder, MODEL_WANTED))
    return path, False


def _folder_without_config(folder: Path) -> str:
    """Why a model folder has no config.json to read: none there, or one that is a folder or a broken link."""
    config = folder / "config.json"
    if config.is_symlink() or config.exists():  # a link to nothing (or a loop), a folder, a FIFO
        special = not_a_file(config) or ""
        return f" (a folder whose config.json is {special if special.startswith('not a regular') else 'not a file'})"
    return " (a folder without a config.json)"


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What says a user's file is the one read before (inode, size, modification time in ns), or None where it
    cannot be read: `load_model` and `load_gpu` key their caches on it, so a notebook that edits its GPU or model
    file between runs reads the new file, not the first one read under that path. A name no file can have (a NUL
    in it: ValueError) is None too, for the loader to refuse in one line as it refuses a missing file."""
    try:
        status = path.stat()
    except (OSError, ValueError):
        return None
    return status.st_ino, status.st_size, status.st_mtime_ns


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name (`llama-3.1-8b`) or a path to a `config.json`, YAML or JSON file; read again when the file
    changed since it was last read (`file_stamp`). A `name_or_path` that is no text (nor a path object) is a
    `KvsimError` naming it (`expect_name`)."""
    name_or_path = expect_name("model", name_or_path, MODEL_WANTED)
    path, is_preset = model_file(name_or_path)
    return _load_model_file(name_or_path, path, is_preset, None if is_preset else file_stamp(path))


@cache
def _load_model_file(name_or_path: str, path: Path, is_preset: bool,
                     stamp: tuple[int, int, int] | None) -> ModelSpec:
    """`load_model`'s work, once per file version (`stamp` is the cache's key only)."""
    from kvsim.model.families import config_name

    raw = _read_mapping(path, "model")
    return model_from_hf_config(raw, name_or_path if is_preset else config_name(raw, path))


DEFAULT_PCIE_STEP_LATENCY_S = 1.0e-6
"""NCCL's cost model (src/graph/tuning.cc, hwLat, Ring/LL over PCI): 1.0 us per ring step."""
MAX_FIXED_COST_S = 3600.0
"""The largest fixed time cost kvsim takes (a link's latency, a collective's launch, a step's overhead, a constant
step): no link hop or GPU step takes an hour (they take micro- to milliseconds), and a cost of 1.7e308 s pushed the
simulated clock past the largest float at the second step (an AssertionError mid-run)."""


class AllReduceFit(Settings):
    """An all-reduce fitted at one GPU count: t = 2 (p − 1) / p · n / (`efficiency` · bandwidth) + `fixed_s`."""

    efficiency: float = Field(gt=0, le=1)
    fixed_s: float = Field(ge=0, le=MAX_FIXED_COST_S)


class GPULink(Settings):
    """The GPU-to-GPU interconnect that tensor-parallel all-reduces cross.

    `bandwidth_bytes_per_s` is the datasheet rate one GPU sends in one direction (NVLink 4:
    450e9 of the quoted 900 GB/s bidirectional; PCIe 5.0 x16: 64e9); `latency_s` is the cost of
    one step of a ring collective (NCCL's per-hop latency), independent of the message size.
    `efficiency` is the fraction of that bandwidth an all-reduce achieves; None means the
    measured default for the link's kind (`kvsim.model.collectives.LINK_EFFICIENCY`), 1.0 suits a
    bandwidth that is already an effective figure (a simulator's cluster description).
    `collective_latency_s` is the fixed cost of launching one collective; None means NCCL's
    (`kvsim.model.collectives.BASE_LATENCY_S`); 0 suits a description whose per-hop latency already
    includes it (LLMServingSim's `link_latency`). `by_num_gpus` holds fits at particular GPU counts
    (NCCL picks other algorithms and protocols at other counts); a count it lists replaces the
    pooled form for that count.
    """

    kind: Literal["nvlink", "pcie"]
    bandwidth_bytes_per_s: float = Field(ge=1)
    latency_s: float = Field(ge=0, le=MAX_FIXED_COST_S)
    efficiency: float | None = Field(default=None, gt=0, le=1)
    collective_latency_s: float | None = Field(default=None, ge=0, le=MAX_FIXED_COST_S)
    by_num_gpus: dict[int, AllReduceFit] | None = None
    source: str = "user-defined"


class GPUSpec(Settings):
    """Datasheet figures of one GPU: memory, bandwidths, dense tensor-core rates and its link.

    A GPU file without `link` is taken to talk to its peers over PCIe at the host link's
    bandwidth (`host_link_bandwidth_bytes_per_s`), with NCCL's PCIe step latency. `memory_type`
    picks the roofline's default achievable fractions for a GPU without fitted ones; `l2_cache_bytes`
    (0: none known) and `boost_clock_hz` (None: the roofline's reference clock) price the token ops; and
    `efficiency` (fields of `kvsim.latency.efficiency.Efficiency`) overrides any of them
    (`kvsim.latency.efficiency.efficiency_for`). `other_sku_words`: words of a driver's device name that
    make it another SKU of the same chip, with other bandwidth, clocks or power (`PCIe` for the A100
    80GB's), so that a device name holding one does not match this GPU
    (`kvsim.latency.profiles.gpu_matches`).
    """

    name: Label  # in one-line errors and tables: a newline split them (`kvsim.model.spec.Label`)
    memory_bytes: Bytes
    hbm_bandwidth_bytes_per_s: float = Field(ge=1)
    fp16_flops: float = Field(ge=1)
    fp8_flops: float | None = Field(default=None, ge=1)
    host_link_bandwidth_bytes_per_s: float = Field(ge=1)
    link: GPULink | None = None
    memory_type: Literal["hbm", "gddr"] = "hbm"
    l2_cache_bytes: float = Field(default=0.0, ge=0)
    boost_clock_hz: float | None = Field(default=None, gt=0)
    efficiency: dict[str, Any] | None = None
    other_sku_words: list[str] = []
    source: str = "user-defined"

    @property
    def resolved_link(self) -> GPULink:
        """`link`, or PCIe at the host link's bandwidth when the GPU file names none."""
        if self.link is not None:
            return self.link
        return GPULink(kind="pcie", bandwidth_bytes_per_s=self.host_link_bandwidth_bytes_per_s,
                       latency_s=DEFAULT_PCIE_STEP_LATENCY_S, source="default: PCIe at the host link's bandwidth")


@cache
def _gpu_presets() -> dict[str, dict[str, Any]]:
    return load_shipped_yaml((PRESETS_DIR / "gpus.yaml").read_text(encoding=TEXT_ENCODING))


def gpu_presets() -> list[str]:
    return sorted(_gpu_presets())


def load_gpu(name_or_path: str) -> GPUSpec:
    """A preset name (`h100-80gb`) or a YAML/JSON file with `GPUSpec` fields; a file is read again when it
    changed since it was last read (`file_stamp`). A `name_or_path` that is no text (nor a path object) is a
    `KvsimError` naming it (`expect_name`)."""
    name_or_path = expect_name("gpu", name_or_path, GPU_WANTED)
    stamp = None if name_or_path in _gpu_presets() else file_stamp(Path(name_or_path))
    return _load_gpu_version(name_or_path, stamp)


@cache
def _load_gpu_version(name_or_path: str, stamp: tuple[int, int, int] | None) -> GPUSpec:
    """`load_gpu`'s work, once per file version (`stamp` is the cache's key only)."""
    presets = _gpu_presets()
    try:
        is_file, why = name_or_path not in presets and Path(name_or_path).is_file(), ""
    except OSError as error:  # a name over the system's limit: 'File name too long', naming no field
        is_file, why = False, f" ({error.strerror})"
    if name_or_path in presets:
        raw, name = presets[name_or_path], name_or_path
    elif is_file:
        raw, name = _read_mapping(Path(name_or_path), "gpu"), Path(name_or_path).stem
    else:
        raise KvsimError(not_a_preset("gpu", name_or_path, gpu_presets(), why, GPU_WANTED))
    try:
        return GPUSpec(**{"name": name, **raw})
    except ValidationError as error:
        raise from_validation_error(error, prefix=f"gpu {name}", model=GPUSpec) from None


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    """The mapping a model or GPU file holds; a `.json` file is read as JSON, as vLLM reads a config.json (PyYAML
    reads JSON as YAML 1.1, where `4e0` and `1e-05`, numbers in JSON, are text: `rope_scaling.factor: 4e0` was
    refused as "must be a positive number"). A repeated key is refused either way."""
    try:
        with reading(path, f"{what} file"):
            text = settings_text(path, f"{what} file")
        raw = load_json(text) if path.suffix.lower() == ".json" else load_yaml(text)
    except yaml.YAMLError as error:
        raise KvsimError(f"{what} file {path}: cannot read: {yaml_problem(error)}") from None
    except json.JSONDecodeError as error:
        raise KvsimError(f"{what} file {path}: cannot read: {error.msg} at line {error.lineno}") from None
    if not isinstance(raw, dict):
        raise KvsimError(f"{what} file {path}: expected a mapping of fields")
    return raw

