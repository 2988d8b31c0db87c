"""What a measured run recorded about its setup beyond the engine arguments `load_measured` reads.

`kvsim validate` uses it so a run that names its GPU and KV pool needs no `--gpu` and replays with the
pool vLLM really allocated (`kvsim.validation.compare.validate`, `kvsim.validation.replay.resolve_gpu`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvsim.model.errors import KvsimError, shown
from kvsim.model.units import ascii_int, is_number
from kvsim.model.yaml_io import TEXT_ENCODING, load_json
from kvsim.validation.meta import ENGINE_KEYS

RECORDED_GPU_KEYS = ("gpu", "gpu_name", "device_name")  # not "device": engine_kwargs may say "cuda"
RECORDED_FLAGS = ("enable_prefix_caching", "async_scheduling", "enforce_eager")  # `--metadata enforce_eager=true`
RECORDED_ENGINE_KEYS = ("tensor_parallel_size", "kv_cache_dtype", "block_size", "max_num_seqs",
                        "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization", *RECORDED_FLAGS)


def recorded_settings(path: str | Path) -> dict[str, Any]:
    """What a measured run recorded about its setup, beyond the engine arguments `load_measured` reads:
    the GPU's name (`gpu`), the KV pool vLLM allocated (`num_gpu_blocks`) and, for a `vllm bench serve`
    JSON, engine arguments saved as its metadata (`--metadata tensor_parallel_size=2 ...`).

    Read from `vllm/meta.json` of a measured folder (top level, `engine_kwargs` or `cache_config`) or from
    the top level of a bench result. Missing (or null) keys are simply absent; values are as recorded (a bench
    result's `num_gpu_blocks` of ASCII digits, as `--metadata num_gpu_blocks=5000` saves it, is that number), but a
    GPU name that is not a string, a `num_gpu_blocks` that is not a whole number >= 1, or `true`/`false`
    for an engine argument other than a flag (`RECORDED_FLAGS`) raises `KvsimError` naming the file and the key
    (never a default in its place).
    """
    p = Path(path)
    source = p / "vllm" / "meta.json" if p.is_dir() else p
    if not source.is_file():
        return {}
    try:
        raw = load_json(source.read_text(encoding=TEXT_ENCODING))  # `[[[...` a ValueError, not a RecursionError
    except (OSError, ValueError):
        return {}  # load_measured reports an unreadable file; nothing more is recorded
    if not isinstance(raw, dict):
        return {}
    scopes = [raw, *(raw[k] for k in ("engine_kwargs", "cache_config", "metadata") if isinstance(raw.get(k), dict))]
    out: dict[str, Any] = {}
    for scope in scopes:
        for key in RECORDED_GPU_KEYS:
            name = scope.get(key)
            if name is not None and (not isinstance(name, str) or not name.strip()):
                raise KvsimError(f"{source}: {key}={name!r} is not a GPU name")
            if name and "gpu" not in out:
                out["gpu"] = name
        blocks = scope.get("num_gpu_blocks")
        if not p.is_dir() and (digits := ascii_int(blocks)) is not None:  # `--metadata num_gpu_blocks=5000`
            blocks = digits  # saves text
        if blocks is not None:
            if not is_number(blocks) or blocks < 1 or blocks != int(blocks):  # Infinity: not int()'d
                raise KvsimError(f"{source}: num_gpu_blocks={blocks!r} is not a whole number of blocks >= 1")
            out.setdefault("num_gpu_blocks", int(blocks))
        if not p.is_dir():  # a bench result's engine arguments; a measured folder's come from load_measured
            for key in RECORDED_ENGINE_KEYS:  # `--metadata key=value` saves strings; the engine config parses them
                if isinstance(scope.get(key), bool) and key not in RECORDED_FLAGS:
                    raise KvsimError(f"{source}: {key}={scope[key]!r} is not a number or a name")
                if scope.get(key) not in (None, "") and key not in out:
                    out[key] = scope[key]
    return out


def unread_bench_engine_notes(raw: dict[str, Any]) -> list[str]:
    """A note naming a bench result's top-level keys that are engine arguments a measured folder's engine_kwargs give
    the replay (`kvsim.validation.meta.ENGINE_KEYS`) but `recorded_settings` does not read from a bench result:
    `--metadata num_gpu_blocks_override=500` (`vllm serve`'s own name for the pool) or `data_parallel_size=2` was
    dropped in silence, the replay running the GPU's whole pool or one engine. They are not replayed; the note says
    to --set them (a setting the run did not record may be set)."""
    unread = {key: raw[key] for key in ENGINE_KEYS
              if key not in RECORDED_ENGINE_KEYS and raw.get(key) not in (None, "")}
    if not unread:
        return []
    shown_args = ", ".join(f"{key}={shown(value)}" for key, value in unread.items())
    sets = " ".join(f"--set engine.{key}=..." for key in unread)
    return [f"the file's {shown_args}: engine arguments a bench result's metadata does not give the replay (it reads "
            f"{', '.join(RECORDED_ENGINE_KEYS)} and num_gpu_blocks); not replayed: {sets} to replay them"]


def recorded_engine(recorded: dict[str, Any]) -> dict[str, Any]:
    """Engine arguments (vLLM's names) from `recorded_settings`: the recorded pool as `num_gpu_blocks_override`."""
    engine = {k: recorded[k] for k in RECORDED_ENGINE_KEYS if k in recorded}
    if "num_gpu_blocks" in recorded:
        engine["num_gpu_blocks_override"] = recorded["num_gpu_blocks"]
    return engine
