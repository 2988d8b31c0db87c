"""What a replay of a measured run runs: its model and GPU (`--model`/`--gpu`, else what the run recorded,
held against each other) and the equivalent kvsim scenario (`build_scenario`), for `kvsim.validation.compare`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvsim.latency.base import PROFILE_META_KEYS
from kvsim.model.config import gpu_presets, load_gpu, load_model, model_presets
from kvsim.model.engine_config import EngineConfig
from kvsim.model.errors import KvsimError, shown
from kvsim.validation.measured import MeasuredRun
from kvsim.validation.recorded import recorded_engine
from kvsim.workload.overrides import apply_overrides, override_items
from kvsim.workload.scenario import Scenario, make_scenario

# The validation set's hardware labels (LLMServingSim's `hardware`) → kvsim GPU presets.
HARDWARE_GPUS = {"RTXPRO6000": "rtx-pro-6000", "H100": "h100-80gb", "A100": "a100-80gb", "H200": "h200",
                 "L40S": "l40s", "L4": "l4"}
LATENCY_MODELS = ("roofline", "calibrated")

# -- the equivalent scenario ---------------------------------------------------------------

MODEL_SHAPE_KEYS = tuple(k for k, kind in PROFILE_META_KEYS.items() if kind is int and k != "tensor_parallel_size")
GPU_HARDWARE_KEYS = ("memory_bytes", "hbm_bandwidth_bytes_per_s", "fp16_flops")


def _differs(given: Any, recorded: Any, keys: tuple[str, ...]) -> tuple[str, str] | None:
    """(`key=given's value`, `key=recorded's value`) for the first of `keys` in which two specs differ, else None."""
    key = next((k for k in keys if getattr(given, k) != getattr(recorded, k)), None)
    return None if key is None else (f"{key}={getattr(given, key):,}", f"{key}={getattr(recorded, key):,}")


TUNED_SUFFIXES = ("-instruct", "-chat", "-it")  # a fine-tune of the base model: the same architecture and weights


def id_name(model_id: str) -> str:
    """A Hugging Face id's model name as kvsim names presets (`meta-llama/Llama-3.1-8B` → `llama-3.1-8b`)."""
    return model_id.rpartition("/")[2].lower()


def run_model_preset(model_id: str) -> str | None:
    """The preset named like a Hugging Face id (`meta-llama/Llama-3.1-8B` → `llama-3.1-8b`), or like its base
    model when the id is an instruction or chat fine-tune of it (`Llama-3.1-8B-Instruct`, `gemma-3-27b-it`:
    the same architecture, so the same step times); None when neither is a preset."""
    name = id_name(model_id)
    presets = model_presets()
    if name in presets:
        return name
    base = next((name.removesuffix(s) for s in TUNED_SUFFIXES if name.endswith(s)), None)
    return base if base in presets else None


def resolve_model(run: MeasuredRun, model: str | None) -> str:
    """`--model`, else the preset `run_model_preset` names for the run's Hugging Face id. Mixture-of-experts
    and data-parallel runs replay as such (`kvsim.model.moe_cost`,
    `kvsim.engine.simulate.simulate_data_parallel`). A `--model` of another shape than the preset the
    run's id names is refused (a config.json of the same model is not): the replay would hold one model's
    timings against another's."""
    recorded = run_model_preset(run.model_id)
    name = model if model is not None else recorded
    if name is None:
        raise KvsimError(f"model={run.model_id!r}: no kvsim preset of that name; pass --model with a preset "
                         "or the model's config.json")
    if model is not None and recorded is not None:
        difference = _differs(load_model(model), load_model(recorded), MODEL_SHAPE_KEYS)
        if difference is not None:
            raise KvsimError(f"--model={shown(model)}: {difference[0]}, but the measured run is of {run.model_id!r} "
                             f"(preset {recorded}, {difference[1]}); pass the run's model or leave --model out")
    return name


def _recorded_gpu(recorded: dict[str, Any] | None) -> str | None:
    """The preset the device name a run recorded matches (exactly one), else None."""
    name = (recorded or {}).get("gpu")
    if not name:
        return None
    from kvsim.latency.profiles import gpu_matches

    matches = [p for p in gpu_presets() if gpu_matches(str(name), load_gpu(p))]
    return matches[0] if len(matches) == 1 else None


def resolve_gpu(run: MeasuredRun, gpu: str | None, recorded: dict[str, Any] | None = None) -> str:
    """`--gpu`, else the GPU the run recorded (its device name matched to a preset), else its hardware label
    when it recorded no device name (a recorded name that no preset is, `NVIDIA H100 NVL` in a folder labelled
    `H100`, is another SKU than the label's preset: refused, asking for `--gpu`).
    A `--gpu` whose memory, bandwidth or FLOP rate differ from the device the run recorded is refused (a GPU
    file of the same chip, with other efficiency fractions, is not); a hardware label alone (`H100`) names a
    family, SXM or PCIe, not a chip, so `--gpu` stands against it."""
    ran_on = _recorded_gpu(recorded)
    if gpu is not None:
        difference = None if ran_on is None else _differs(load_gpu(gpu), load_gpu(ran_on), GPU_HARDWARE_KEYS)
        if difference is not None:
            raise KvsimError(f"--gpu={shown(gpu)}: {difference[0]}, but the measured run ran on "
                             f"{(recorded or {}).get('gpu')!r} (preset {ran_on}, {difference[1]}); pass the run's "
                             "GPU or leave --gpu out")
        return gpu
    if ran_on is not None:
        return ran_on
    name = (recorded or {}).get("gpu")
    if run.hardware in HARDWARE_GPUS and not name:  # a device name no preset is outranks the family label
        return HARDWARE_GPUS[run.hardware]
    ask = f"pass --gpu with a preset ({', '.join(gpu_presets())}) or a GPU file"
    if name:  # refused rather than guessed: a near name is often another SKU (H100 NVL, A100 80GB PCIe, L40)
        raise KvsimError(f"gpu: the run recorded gpu={shown(name)}, which matches no single preset "
                         f"(hardware={run.hardware!r}); {ask}")
    raise KvsimError(f"gpu: the run does not say which GPU it ran on (hardware={run.hardware!r}); {ask}")


def label_disagreement(run: MeasuredRun, recorded: dict[str, Any], preset: str) -> str | None:
    """A note when the device a run recorded (its preset `preset`, which the replay runs) is not of the family its
    hardware label names (a folder labelled H100 whose meta.json says NVIDIA H200), else None: the record is
    followed, and the disagreement said, not resolved in silence. An H100 PCIe under the label H100 agrees."""
    from kvsim.latency.profiles import gpu_matches

    label = run.hardware
    if not recorded.get("gpu") or label not in HARDWARE_GPUS or HARDWARE_GPUS[label] == preset \
            or gpu_matches(label, load_gpu(preset)):
        return None
    return (f"the run's hardware label {label} (preset {HARDWARE_GPUS[label]}) is not the device it recorded, "
            f"{shown(recorded['gpu'])}: replayed on the recorded device's preset {preset}")


def default_profile(run_dir: Path, run: MeasuredRun) -> Path | None:
    """The measured profile bundle for the run's GPU and model in a `profiles/` folder above it
    (`profiles/<hardware>/<org>/<model>/bf16/`), if there is one."""
    if run.hardware is None or not run.model_id:
        return None
    variant = "bf16" if run.engine.get("kv_cache_dtype", "auto") == "auto" else "bf16-kvfp8"
    for folder in run_dir.resolve().parents:
        candidate = folder / "profiles" / run.hardware / run.model_id / variant
        if candidate.is_dir():
            return candidate
    return None


RUN_FIELDS = {"model": "--model (held against the run's model)", "gpu": "--gpu (held against the run's GPU)",
              "workload": "the measured run's requests (--workload replaces a measured folder's)",
              "replicas": "one engine, as the measured run's (its data-parallel ranks from its engine arguments)",
              "steps": "all (its running, waiting and KV usage are compared from every step)"}
"""Scenario sections a replay takes from the measured run, not from `--set`, and where each comes from."""


def _refuse_run_overrides(overrides: list[str]) -> None:
    """`--set model=...` replayed another model than the run's, past the check `--model` gets (`resolve_model`),
    and `--set workload.num_requests=1` compared one replayed request with every measured one."""
    for key, value, label in override_items(overrides):
        section = key.split(".")[0].strip()
        if section in RUN_FIELDS:
            raise KvsimError(f"{label}: a replay's {section} is {RUN_FIELDS[section]}, not a --set")
        fields = key.strip().split(".")
        latency = (value if isinstance(value, dict) else {}) if fields == ["latency"] else \
            {fields[1]: value} if fields[0] == "latency" else {}
        if "profile" in latency or latency.get("model") == "calibrated":
            # a relative profile was looked up beside the replay's temporary workload, never where it was given
            raise KvsimError(f"{label}: a replay's calibrated latency is --latency calibrated --profile PATH, "
                             "not a --set")


def _same_setting(name: str, given: Any, recorded: Any) -> bool:
    """Whether `given` and `recorded` are one value of engine field `name` as the engine config reads each: a bench
    result's `--metadata max_num_seqs=8` saves the text '8', which a `--set engine.max_num_seqs=8` repeats."""
    if given == recorded:
        return True
    try:
        return bool(getattr(EngineConfig.model_validate({name: given}), name)
                    == getattr(EngineConfig.model_validate({name: recorded}), name))
    except (KvsimError, ValueError):  # either refused on its own: not one value (the replay's config names it)
        return False


def _refuse_recorded_engine_overrides(overrides: list[str], recorded: dict[str, Any]) -> None:
    """`--set engine.tensor_parallel_size=2` on a run that recorded 1 replayed another deployment than the one
    measured, and its errors were tabulated as kvsim's on the run. A setting the run did not record (vLLM's default
    then) may be set; one it recorded may be given only as recorded, and a whole `engine` section (which replaces
    the recorded one) must give each."""
    missing = object()
    for key, value, label in override_items(overrides):
        fields = key.strip().split(".")
        whole = fields == ["engine"]
        given = (value if isinstance(value, dict) else {}) if whole else \
            {fields[1]: value} if fields[0] == "engine" and len(fields) == 2 else {}
        for name in recorded if whole else given:
            setting = given.get(name, missing)
            if name in recorded and not _same_setting(name, setting, recorded[name]):
                raise KvsimError(f"{label}: the measured run recorded engine.{name}={shown(recorded[name])}; a replay "
                                 "runs the engine that ran (--set only what the run did not record)")


def _recorded_engine_args(run: MeasuredRun, recorded: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments the run recorded: its engine_kwargs (`run.engine`) and what `recorded_settings` read
    besides (the pool vLLM allocated, a bench result's metadata). A setting the two give differently is refused,
    not resolved in silence: `num_gpu_blocks` 200 beside `engine_kwargs.num_gpu_blocks_override` 100 replayed the
    override's pool while the notes said the recorded 200 was used (vLLM allocates an override exactly)."""
    extra = recorded_engine(recorded)
    for name in extra.keys() & run.engine.keys():
        if not _same_setting(name, run.engine[name], extra[name]):
            label = "num_gpu_blocks" if name == "num_gpu_blocks_override" else name
            raise KvsimError(f"measured run {run.name}: engine_kwargs.{name}={shown(run.engine[name])}, but it "
                             f"recorded {label}={shown(recorded[label])}: one of the two is not this run's; "
                             "correct the record")
    return {**extra, **run.engine}


def build_scenario(run: MeasuredRun, trace_path: Path, *, model: str, gpu: str, latency: str = "roofline",
                   profile: str | Path | None = None, overrides: list[str] | None = None,
                   recorded: dict[str, Any] | None = None, cluster_link: bool = True) -> Scenario:
    """The run as a kvsim scenario whose workload is `trace_path` (written by `write_trace`); a KV pool
    size the run `recorded` (`num_gpu_blocks`) becomes `num_gpu_blocks_override`, and a bench result's
    recorded engine arguments fill what its file lacks. With `cluster_link` False the GPU preset's own
    link is used even where the run's cluster config describes another."""
    if latency not in LATENCY_MODELS:
        raise KvsimError(f"--latency={latency!r}: expected one of {', '.join(LATENCY_MODELS)}")
    _refuse_run_overrides(overrides or [])
    engine = _recorded_engine_args(run, recorded or {})
    _refuse_recorded_engine_overrides(overrides or [], engine)
    if profile is not None and not str(profile).strip():  # Path('') is the working folder, read as the bundle
        raise KvsimError(f"--profile={str(profile)!r}: is empty: name a measured profile bundle or CSV")
    if latency == "calibrated" and profile is None:
        raise KvsimError("--latency=calibrated needs --profile (a measured profile bundle or CSV)")
    latency_cfg: dict[str, Any] = {"model": latency}
    if latency == "calibrated":
        latency_cfg["profile"] = str(Path(profile).resolve())  # type: ignore[arg-type]
    raw: dict[str, Any] = {
        "name": f"validate-{run.name}-{latency}",
        "description": f"replay of the measured run {run.name} ({run.source}, {run.model_id})",
        "model": model, "gpu": gpu,
        "engine": {"enable_prefix_caching": True, **engine},
        "workload": {"num_requests": len(run.records), "arrival": {"process": "trace"},
                     "trace": {"format": "sharegpt_tokens", "path": trace_path.name},
                     **({"max_concurrency": run.max_concurrency} if run.max_concurrency is not None else {})},
        "latency": latency_cfg,
        "seed": 0,
    }
    if cluster_link and run.link is not None and (int(run.engine.get("tensor_parallel_size", 1)) > 1
                                 or int(run.engine.get("data_parallel_size", 1)) > 1):
        # the cluster's own GPU link, not the GPU's datasheet: the measured TP run's all-reduces
        # crossed it. LLMServingSim's figures are effective ones (efficiency 1) and its per-hop
        # latency includes a collective's fixed cost (no NCCL base on top); see kvsim/model/collectives.py
        raw["gpu_link"] = {"kind": load_gpu(gpu).resolved_link.kind, **run.link, "efficiency": 1.0,
                           "collective_latency_s": 0.0,
                           "source": "the measured cluster's link, from LLMServingSim's config.json"}
    return make_scenario(apply_overrides(raw, overrides or []), trace_path.parent)
