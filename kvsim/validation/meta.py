"""What a measured folder's `vllm/meta.json` says beside its requests: the engine arguments a replay runs
(`engine_args`) and, as notes, what the replay cannot follow (`meta_notes`). Read by
`kvsim.validation.measured.read_measured_dir`; a value of the wrong JSON type raises `KvsimError` naming it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsim.model.errors import KvsimError, shown
from kvsim.model.units import is_number
from kvsim.validation.frame import series_tick_s

if TYPE_CHECKING:
    import pandas as pd

# vLLM's engine arguments kvsim's engine has under the same name and the replay reads (the last four were dropped
# without a word: a run of `num_gpu_blocks_override: 50` replayed on the GPU's whole pool, a priority one as FCFS)
ENGINE_KEYS = ("tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
               "kv_cache_dtype", "block_size", "gpu_memory_utilization", "enable_prefix_caching",
               "data_parallel_size", "enable_expert_parallel", "async_scheduling", "num_gpu_blocks_override",
               "kv_cache_memory_bytes", "scheduling_policy", "disable_hybrid_kv_cache_manager", "enforce_eager")
_ENGINE_KINDS = {"kv_cache_dtype": "a string", "gpu_memory_utilization": "a number", "enforce_eager": "true or false",
                 "enable_prefix_caching": "true or false", "enable_expert_parallel": "true or false",
                 "async_scheduling": "true or false", "scheduling_policy": "a string",
                 "disable_hybrid_kv_cache_manager": "true or false"}


def engine_args(kwargs: dict[str, Any], where: Path) -> dict[str, Any]:
    """The `ENGINE_KEYS` meta.json's engine_kwargs set (null: vLLM's default), each of the JSON type vLLM
    records (an integer, unless `_ENGINE_KINDS` says otherwise); ranges are the engine config's to check.
    A `true` where a count belongs, or `"false"` for a flag, raises rather than reading as 1 or as on."""
    engine = {}
    for key in ENGINE_KEYS:
        value = kwargs.get(key)
        if value is None:
            continue
        kind = _ENGINE_KINDS.get(key, "an integer")
        ok = {"a string": isinstance(value, str), "true or false": isinstance(value, bool),
              "a number": is_number(value),
              "an integer": isinstance(value, int) and not isinstance(value, bool)}[kind]
        if not ok:
            raise KvsimError(f"{where}: engine_kwargs.{key}={value!r} is not {kind}")
        engine[key] = value
    return engine


# engine_kwargs the replay reads besides `ENGINE_KEYS` (the model id, the drafts, `recorded_settings`' GPU and pool),
# and those that change nothing it models: the sampling seed (the replay takes the recorded output lengths) and a
# 2-byte `dtype`, the presets' weights
READ_ELSEWHERE = ("model", "speculative_config", "gpu", "gpu_name", "device_name", "num_gpu_blocks", "seed")
TWO_BYTE_DTYPES = ("auto", "bfloat16", "float16", "half")


def meta_notes(meta: dict[str, Any], num_rows: int, where: Path) -> list[str]:
    """What `meta.json` says that the replay cannot follow, as notes (they print with the comparison): the
    engine_kwargs it does not replay (vLLM ran with them; the replay runs kvsim's defaults there), a
    `num_requests` (the requests the benchmark sent) above the recorded rows (those that failed or were not
    recorded put load on the server that the replay lacks), a `vllm_version` before the one the replay follows
    (`_version_notes`) and keys no reader takes (`_unread_meta_notes`). A `num_requests` that is no whole number
    >= 1, or below the rows (then it is not this run's), is a `KvsimError` naming it."""
    kwargs = meta["engine_kwargs"]
    unread = {key: value for key, value in kwargs.items() if key not in (*ENGINE_KEYS, *READ_ELSEWHERE)
              and not (key == "dtype" and value in TWO_BYTE_DTYPES)}
    notes = _version_notes(meta, where) + _unread_meta_notes(meta, where)
    if unread:
        shown_args = ", ".join(f"{key}={shown(value)}" for key, value in unread.items())
        notes.append(f"meta.json's engine_kwargs {shown_args}: not replayed (the replay runs kvsim's defaults "
                     "there; --set an engine field where kvsim has one)")
    sent = meta.get("num_requests")
    if sent is None:
        return notes
    if isinstance(sent, bool) or not isinstance(sent, int) or sent < 1:
        raise KvsimError(f"{where}: num_requests={shown(sent)} is not a whole number of requests >= 1")
    if sent < num_rows:
        raise KvsimError(f"{where}: num_requests={sent} but requests.jsonl records {num_rows} requests: not this "
                         "run's meta.json")
    if sent > num_rows:
        notes.append(f"meta.json's num_requests={sent} but requests.jsonl records {num_rows}: the "
                     f"{sent - num_rows} not recorded (failed, or lost) loaded the server and are not replayed")
    return notes


# meta.json's keys beside engine_kwargs that a validation reads (the workload, the clock, the request count, what
# `recorded_settings` takes) or that describe the record alone (its schema, the workload's hash, when it ended, the
# series' tick, which the series' own `t` gives)
META_KEYS = ("schema_version", "model", "vllm_version", "engine_kwargs", "dataset_path", "dataset_hash", "num_requests",
             "started_at", "finished_at", "tick_seconds", "gpu", "gpu_name", "device_name", "num_gpu_blocks",
             "cache_config", "metadata")
RECORDED_SECTION_KEYS = ("gpu", "gpu_name", "device_name", "num_gpu_blocks")  # of cache_config and metadata


def _unread_meta_notes(meta: dict[str, Any], where: Path) -> list[str]:
    """A note naming the keys of `meta.json` (and of its `cache_config` and `metadata` sections) that no reader
    takes: a `cache_config.cache_dtype` or a top-level `gpu_type` was dropped in silence, the replay running its
    default or the folder's hardware label there. A section that is not an object is a `KvsimError` naming it
    (`cache_config: "x"` was skipped, its pool with it)."""
    unread = {key: value for key, value in meta.items() if key not in META_KEYS}
    for section in ("cache_config", "metadata"):
        if meta.get(section) is not None and not isinstance(meta[section], dict):
            raise KvsimError(f"{where}: {section}={shown(meta[section])} is not an object")
        if isinstance(meta.get(section), dict):
            unread |= {f"{section}.{key}": value for key, value in meta[section].items()
                       if key not in RECORDED_SECTION_KEYS}
    if not unread:
        return []
    return ["meta.json's " + ", ".join(f"{key}={shown(value)}" for key, value in unread.items()) + ": not read (the "
            "replay follows engine_kwargs and its defaults there; --set an engine field, or --gpu, where one applies)"]


REPLAYED_VLLM = (0, 19)
"""The vLLM release whose scheduler and defaults a replay follows where engine_kwargs says nothing: the measured
runs' (`kvsim.latency.cudagraph`, docs/accuracy.md)."""


def _version_notes(meta: dict[str, Any], where: Path) -> list[str]:
    """A note for a `vllm_version` older than `REPLAYED_VLLM`, or that names no release: its defaults may differ
    (asynchronous scheduling became vLLM's default in late 2025), and nothing in the record says which it ran. A
    version that is not text is a `KvsimError` naming it."""
    version = meta.get("vllm_version")
    if version is None:
        return []
    if not isinstance(version, str):
        raise KvsimError(f"{where}: vllm_version={shown(version)} is not text")
    release = re.match(r"v?(\d+)\.(\d+)", version)
    if release and (int(release[1]), int(release[2])) >= REPLAYED_VLLM:
        return []
    return [f"meta.json's vllm_version={shown(version)}: the replay follows vLLM {'.'.join(map(str, REPLAYED_VLLM))}'s "
            "defaults where engine_kwargs gives none (asynchronous scheduling, since late 2025; CUDA-graph padding); "
            "record engine_kwargs.async_scheduling and enforce_eager as that version ran them"]


# how far the rows' gap may run past `tick_seconds`: a series logged or polled every tick is read a little late each
# time (vLLM's server logs after `asyncio.sleep(VLLM_LOG_STATS_INTERVAL)` and the log call itself, on an event loop
# that also streams every response: milliseconds a tick), which 0.1 % (1 ms a second) refused; another interval
# (2 s rows for 1 s, 0.5 s for 1 s) is 50 % or more off
TICK_DRIFT = 0.1


def check_tick(meta: dict[str, Any], series: pd.DataFrame | None, where: Path) -> None:
    """meta.json's `tick_seconds`, where given, is a positive number and, within `TICK_DRIFT`, the gap the series'
    rows have (`series_tick_s`): kvsim's per-phase rates are binned by the series' gap, so a record that says 1 s
    beside rows 2 s apart (or `tick_seconds: "x"`, which was read as nothing) is refused, not resolved in silence;
    rows read a few milliseconds late each tick are that tick's, binned by their own gap."""
    tick = meta.get("tick_seconds")
    if tick is None:
        return
    if not is_number(tick) or tick <= 0:
        raise KvsimError(f"{where}: tick_seconds={shown(tick)} is not a positive number of seconds")
    gap_s = series_tick_s(series)
    if series is not None and len(series) >= 2 and not math.isclose(gap_s, tick, rel_tol=TICK_DRIFT):
        raise KvsimError(f"{where}: tick_seconds={shown(tick)}, but timeseries.csv's rows are {gap_s:g} s apart: one "
                         "of the two is not this run's")
