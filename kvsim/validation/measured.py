"""Readers of real serving runs to hold kvsim against: a measured-run folder and `vllm bench` JSON.

Two inputs, one result type (`MeasuredRun`):

* a folder in the layout of `benchmarks/validation_set/measured/<hardware>/<case>/`:
  `vllm/meta.json` (engine arguments, the workload file), `vllm/requests.jsonl` (engine-clock
  timestamps per request), `vllm/timeseries.csv` (one row a second), and optionally the peer
  simulator LLMServingSim's prediction `outputs/sim.csv`;
* the JSON that `vllm bench serve --save-result --save-detailed` writes (fields as in vLLM's
  `vllm/benchmarks/serve.py`: `input_lens`, `output_lens`, `ttfts`, `itls`, `latencies`,
  `start_times`, `errors`, plus `model_id`, `request_rate`, `burstiness`), so anyone can
  validate on their own GPU.

Definitions (the validation README's, which are vLLM's): TTFT = first token − queued;
E2E = last token − queued; TPOT = (last − first token) / (output tokens − 1), undefined for a
one-token reply. Times in the `requests` frame are seconds from the first arrival.
A malformed file raises `KvsimError` naming the file and the field, and so does an impossible
one: a request's instants out of order (queued ≤ scheduled ≤ first token ≤ last token), a
negative TTFT or inter-token gap, an E2E shorter than its TTFT.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.model.errors import KvsimError
from kvsim.workload.files import data_file, open_text
from kvsim.workload.traces import TraceRecord, iter_jsonl, read_sharegpt_tokens

REQUEST_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s",
                   "prompt_tokens", "output_tokens")
"""The columns of `MeasuredRun.requests`, in order; `request_frame` builds exactly these."""
NS_PER_S = 1e9


@dataclass(frozen=True)
class MeasuredRun:
    """One real run, reduced to what kvsim can be compared on.

    `requests`: one row per successful request (`REQUEST_COLUMNS`), sorted by arrival.
    `timeseries`: `t_s` (seconds from the first arrival), `running`, `waiting`, `kv_usage`
    (a fraction, NaN where the run did not record it), or None.
    `records`: the workload to replay: arrivals (same clock as `requests`), lengths and token
    ids where known. `engine`: vLLM engine arguments under kvsim's names.
    `peer`: LLMServingSim's per-request prediction (same columns), if present.
    `link`: the GPU-to-GPU link as LLMServingSim's cluster config describes this cluster
    (`bandwidth_bytes_per_s`, an effective rate, and `latency_s` per hop), if present.
    """

    name: str
    source: str  # "vllm-measured" | "vllm-bench"
    model_id: str
    requests: pd.DataFrame
    records: list[TraceRecord]
    engine: dict[str, Any]
    timeseries: pd.DataFrame | None = None
    hardware: str | None = None
    data_parallel_size: int = 1
    expert_parallel: bool = False
    peer: pd.DataFrame | None = None
    link: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise KvsimError(f"{path}: file not found") from None
    except json.JSONDecodeError as error:
        raise KvsimError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None


def _number(row: dict[str, Any], key: str, where: str) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise KvsimError(f"{where}: {key}={value!r} is not a number")
    return float(value)


def request_frame(arrival_s: np.ndarray, first_token_s: np.ndarray, finish_s: np.ndarray,
                  prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                  first_scheduled_s: np.ndarray | None = None) -> pd.DataFrame:
    """The per-request frame from absolute instants, re-based so the first arrival is 0
    (`first_scheduled_s` NaN where the source does not record it)."""
    t0 = float(arrival_s.min())
    out = output_tokens.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (finish_s - first_token_s) / (out - 1), np.nan)
    scheduled = np.full(len(arrival_s), np.nan) if first_scheduled_s is None else first_scheduled_s
    columns = {
        "arrival_s": arrival_s - t0, "first_scheduled_s": scheduled - t0,
        "first_token_s": first_token_s - t0, "finish_s": finish_s - t0,
        "ttft_s": first_token_s - arrival_s, "tpot_s": tpot, "e2e_s": finish_s - arrival_s,
        "prompt_tokens": prompt_tokens.astype(int), "output_tokens": output_tokens.astype(int),
    }
    df = pd.DataFrame({name: columns[name] for name in REQUEST_COLUMNS})
    return df.sort_values("arrival_s", kind="stable").reset_index(drop=True)


# -- the measured-run folder ---------------------------------------------------------------

ENGINE_KEYS = ("tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
               "kv_cache_dtype", "block_size", "gpu_memory_utilization", "enable_prefix_caching",
               "data_parallel_size", "enable_expert_parallel")


def find_workload(run_dir: Path, dataset_path: str) -> Path:
    """The workload file `meta.json` names, looked up beside each folder above the run and in
    `traces/*/` there (the validation set keeps the Llama workload under `../traces/`)."""
    name = Path(dataset_path).name
    for folder in [run_dir, *run_dir.resolve().parents]:
        for candidate in (folder / dataset_path, *sorted(folder.glob(f"traces/*/{name}"))):
            if data_file(candidate).is_file():
                return data_file(candidate)
    raise KvsimError(f"{run_dir / 'vllm' / 'meta.json'}: dataset_path={dataset_path!r} not found "
                     "beside the run or in a traces/ folder above it; pass --workload PATH")


def _read_requests_jsonl(path: Path) -> list[dict[str, Any]]:
    path = data_file(path)
    if not path.is_file():
        raise KvsimError(f"{path}: file not found")
    rows = []
    for line_no, row in iter_jsonl(path):
        where = f"{path}:{line_no}"
        for key in ("queued_ts", "first_token_ts", "last_token_ts", "input_toks", "output_toks"):
            _number(row, key, where)
        if int(row["output_toks"]) < 1 or int(row["input_toks"]) < 1:
            raise KvsimError(f"{where}: input_toks and output_toks must be positive")
        _check_order(row, where)
        rows.append(row)
    if not rows:
        raise KvsimError(f"{path}: no requests")
    return rows


TIMELINE = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
"""A request's instants in the order they happen; `scheduled_ts` may be absent."""
_SPANS = {("queued_ts", "scheduled_ts"): "queue time", ("scheduled_ts", "first_token_ts"): "prefill time",
          ("queued_ts", "first_token_ts"): "TTFT", ("first_token_ts", "last_token_ts"): "decode time (E2E below TTFT)"}


def _check_order(row: dict[str, Any], where: str) -> None:
    """Each recorded instant of `TIMELINE` is at or after the one before it: no negative TTFT or E2E."""
    known = [(key, _number(row, key, where)) for key in TIMELINE if key in row]
    for (before, t0), (after, t1) in zip(known, known[1:], strict=False):
        if t1 < t0:
            raise KvsimError(f"{where}: {after}={t1!r} is before {before}={t0!r}: the {_SPANS[before, after]} "
                             "would be negative; not a physical measurement")


def _request_index(row: dict[str, Any], fallback: int) -> int:
    """`bench-17` → 17: vLLM's benchmark numbers requests in workload order."""
    tail = str(row.get("request_id", "")).rpartition("-")[2]
    return int(tail) if tail.isdigit() else fallback


def _read_timeseries(path: Path, offset_s: float) -> tuple[pd.DataFrame | None, list[str]]:
    path = data_file(path)
    if not path.is_file():
        return None, [f"{path.name} absent: no running/waiting comparison"]
    with open_text(path, newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        df = pd.DataFrame({
            "t_s": [float(r["t"]) - offset_s for r in rows],
            "running": [float(r["running"]) for r in rows],
            "waiting": [float(r["waiting"]) for r in rows],
            "kv_usage": [float(r.get("kv_cache_pct") or 0.0) / 100 for r in rows],
        })
    except (KeyError, ValueError, TypeError) as error:
        raise KvsimError(f"{path}: expected columns t, running, waiting, kv_cache_pct ({error})") from None
    notes = []
    if len(df) and not (df["kv_usage"] > 0).any():
        df["kv_usage"] = np.nan
        notes.append("kv_cache_pct is 0 throughout the measured time series: KV usage was not recorded "
                     "in this run, so it is reported for kvsim only and not compared")
    return df, notes


def _epoch_s(stamp: str, where: Path) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise KvsimError(f"{where}: started_at={stamp!r} is not an ISO timestamp") from None


def read_measured_dir(run_dir: Path, workload: Path | None = None) -> MeasuredRun:
    """A measured run in the validation layout; `workload` overrides the file meta.json names."""
    vllm = run_dir / "vllm"
    meta = _read_json(vllm / "meta.json")
    if not isinstance(meta, dict) or not isinstance(meta.get("engine_kwargs"), dict):
        raise KvsimError(f"{vllm / 'meta.json'}: expected an object with engine_kwargs")
    kwargs = meta["engine_kwargs"]
    rows = _read_requests_jsonl(vllm / "requests.jsonl")
    wl_path = workload or find_workload(run_dir, str(meta.get("dataset_path", "")))
    wl = read_sharegpt_tokens(wl_path)
    queued = np.array([float(r["queued_ts"]) for r in rows])
    t0 = float(queued.min())
    records = []
    for i, row in enumerate(rows):
        index = _request_index(row, i)
        if index >= len(wl):
            raise KvsimError(f"{vllm / 'requests.jsonl'}: request {row.get('request_id')!r} has no line "
                             f"in the workload {wl_path} ({len(wl)} lines)")
        w = wl[index]
        if (w.prompt_len, w.output_len) != (int(row["input_toks"]), int(row["output_toks"])):
            raise KvsimError(f"{wl_path}: line {index + 1} has {w.prompt_len}+{w.output_len} tokens but the "
                             f"measured request {row.get('request_id')!r} has "
                             f"{row['input_toks']}+{row['output_toks']}: not this run's workload")
        records.append(TraceRecord(float(row["queued_ts"]) - t0, w.prompt_len, w.output_len,
                                   token_ids=w.token_ids))
    records.sort(key=lambda r: r.arrival_s or 0.0)
    requests = request_frame(queued, np.array([float(r["first_token_ts"]) for r in rows]),
                             np.array([float(r["last_token_ts"]) for r in rows]),
                             np.array([int(r["input_toks"]) for r in rows]),
                             np.array([int(r["output_toks"]) for r in rows]),
                             np.array([float(r.get("scheduled_ts", "nan")) for r in rows]))
    # the time series counts from started_at (wall clock); requests carry wall-clock arrival_time too
    offset_s = 0.0
    first = min(rows, key=lambda r: float(r["queued_ts"]))
    if "started_at" in meta and isinstance(first.get("arrival_time"), (int, float)):
        offset_s = float(first["arrival_time"]) - _epoch_s(str(meta["started_at"]), vllm / "meta.json")
    timeseries, notes = _read_timeseries(vllm / "timeseries.csv", offset_s)
    engine = {k: kwargs[k] for k in ENGINE_KEYS if kwargs.get(k) is not None}
    config = run_dir / "config.json"
    hardware = _hardware(config) if config.is_file() else None
    link = _link(config) if config.is_file() else None
    return MeasuredRun(
        name=run_dir.name, source="vllm-measured", model_id=str(meta.get("model") or kwargs.get("model")),
        requests=requests, records=records, engine=engine, timeseries=timeseries,
        hardware=hardware or run_dir.resolve().parent.name,
        data_parallel_size=int(kwargs.get("data_parallel_size") or 1),
        expert_parallel=bool(kwargs.get("enable_expert_parallel")),
        peer=read_llmservingsim(run_dir / "outputs" / "sim.csv"), link=link, notes=notes,
    )


def _hardware(config: Path) -> str | None:
    """LLMServingSim's cluster config names the hardware of each instance."""
    raw = _read_json(config)
    for node in raw.get("nodes", []) if isinstance(raw, dict) else []:
        for instance in node.get("instances", []):
            if instance.get("hardware"):
                return str(instance["hardware"])
    return None


def _link(config: Path) -> dict[str, float] | None:
    """`link_bw` (GB/s) and `link_latency` (ns) of LLMServingSim's cluster config, in kvsim's units.

    The config is ASTRA-Sim's input, and ASTRA-Sim's analytical network reads a GB as 2^30 bytes
    (`bw_GBps_to_Bpns` in extern/network_backend/analytical/common/NetworkFunction.cpp: "1 GB is 2^30 B"),
    so the link the peer simulated, and fitted to its run, carries link_bw · 2^30 bytes/s. None when the
    config gives no link_bw; a link_bw or link_latency that is not a finite number, a link_bw <= 0 or a
    negative link_latency raises `KvsimError` naming the file and the field."""
    raw = _read_json(config)
    if not isinstance(raw, dict) or raw.get("link_bw") is None:
        return None
    bandwidth_gb_per_s = _number(raw, "link_bw", str(config))
    latency_ns = _number(raw, "link_latency", str(config)) if raw.get("link_latency") is not None else 0.0
    if bandwidth_gb_per_s <= 0:
        raise KvsimError(f"{config}: link_bw={raw['link_bw']!r} must be > 0 (GB/s)")
    if latency_ns < 0:
        raise KvsimError(f"{config}: link_latency={raw['link_latency']!r} must be >= 0 (ns)")
    return {"bandwidth_bytes_per_s": bandwidth_gb_per_s * 2**30, "latency_s": latency_ns * 1e-9}


def read_llmservingsim(path: Path) -> pd.DataFrame | None:
    """LLMServingSim's `outputs/sim.csv` (nanoseconds) as a request frame, or None if absent."""
    path = data_file(path)
    if not path.is_file():
        return None
    csv.field_size_limit(2**31 - 1)  # the ITL column lists every token's gap
    with open_text(path, newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        arrival = np.array([float(r["arrival"]) for r in rows]) / NS_PER_S
        ttft = np.array([float(r["TTFT"]) for r in rows]) / NS_PER_S
        queuing = np.array([float(r.get("queuing_delay") or "nan") for r in rows]) / NS_PER_S
        finish = np.array([float(r["end_time"]) for r in rows]) / NS_PER_S
        prompt = np.array([int(r["input"]) for r in rows])
        output = np.array([int(r["output"]) for r in rows])
    except (KeyError, ValueError, TypeError) as error:
        raise KvsimError(f"{path}: expected LLMServingSim columns input, output, arrival, end_time, "
                         f"TTFT ({error})") from None
    if not rows:
        return None
    return request_frame(arrival, arrival + ttft, finish, prompt, output, arrival + queuing)


# -- vllm bench serve --save-result --save-detailed -----------------------------------------

def read_vllm_bench(path: Path) -> MeasuredRun:
    """`vllm bench serve` result JSON with `--save-detailed`: client-side per-request times.

    Arrivals are the requests' `start_times` (client send instants); a file without them gets
    arrivals at the recorded `request_rate` (Poisson, or gamma with the file's `burstiness`),
    seeded, and says so in the notes. Failed requests (non-empty `errors`) are left out.
    """
    raw = _read_json(path)
    if not isinstance(raw, dict):
        raise KvsimError(f"{path}: expected a JSON object (vllm bench serve --save-result)")
    lists = {}
    for key in ("input_lens", "output_lens", "ttfts", "itls"):
        value = raw.get(key)
        if not isinstance(value, list):
            raise KvsimError(f"{path}: {key} is missing: save the result with --save-detailed")
        lists[key] = value
    n = len(lists["input_lens"])
    latencies = raw.get("latencies") or raw.get("e2els")
    errors = raw.get("errors") or [""] * n
    starts = raw.get("start_times")
    for key, value in (*lists.items(), ("errors", errors)):
        if len(value) != n:
            raise KvsimError(f"{path}: {key} has {len(value)} entries, input_lens has {n}")
    output_all = _values(lists["output_lens"], range(n), "output_lens", path, allow_missing=True)
    ok = [i for i in range(n) if not errors[i] and output_all[i] > 0]
    if not ok:
        raise KvsimError(f"{path}: no successful request to compare")
    notes = []
    if n - len(ok):
        notes.append(f"{n - len(ok)} failed requests left out")
    prompt = _values(lists["input_lens"], ok, "input_lens", path).astype(int)
    output = output_all[ok].astype(int)
    if (prompt < 1).any():
        raise KvsimError(f"{path}: input_lens has a non-positive entry")
    ttft = _values(lists["ttfts"], ok, "ttfts", path)
    if isinstance(latencies, list) and len(latencies) == n:
        e2e = _values(latencies, ok, "latencies", path)
    else:  # TTFT plus every inter-token gap
        gaps = [lists["itls"][i] or [] for i in ok]
        if not all(isinstance(g, list) for g in gaps):
            raise KvsimError(f"{path}: itls must hold one list of gaps per request")
        e2e = ttft + np.array([_values(g, range(len(g)), "itls", path).sum() for g in gaps])
    _check_bench_times(ttft, e2e, ok, [lists["itls"][i] for i in ok], path)
    if isinstance(starts, list) and len(starts) == n:
        arrival = _values(starts, ok, "start_times", path)
    else:
        arrival = _bench_arrivals(raw, len(ok), path)
        notes.append("the file has no start_times: arrivals are resampled at its request_rate, so only "
                     "aggregate statistics are comparable")
    records = [TraceRecord(float(a - arrival.min()), int(p), int(o))
               for a, p, o in sorted(zip(arrival, prompt, output, strict=True), key=lambda t: t[0])]
    engine: dict[str, Any] = {}
    if raw.get("max_concurrency"):
        notes.append(f"the client capped concurrency at {raw['max_concurrency']}; kvsim replays the "
                     "recorded send times as open-loop arrivals")
    notes.append("client-side timings: TTFT includes HTTP and detokenization overheads the engine does not see")
    return MeasuredRun(
        name=path.stem, source="vllm-bench", model_id=str(raw.get("model_id") or raw.get("tokenizer_id") or ""),
        requests=request_frame(arrival, arrival + ttft, arrival + e2e, prompt, output),
        records=records, engine=engine, notes=notes,
    )


def _values(items: list[Any], indices: Any, key: str, path: Path, allow_missing: bool = False) -> np.ndarray:
    """`items[i]` for i in `indices` as finite floats; anything else names the field and the entry."""
    out = []
    for i in indices:
        value = items[i]
        if value is None and allow_missing:
            value = 0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise KvsimError(f"{path}: {key}[{i}]={value!r} is not a number")
        out.append(float(value))
    return np.array(out, dtype=float)


def _check_bench_times(ttft: np.ndarray, e2e: np.ndarray, ok: list[int], itls: list[Any], path: Path) -> None:
    """TTFT and inter-token gaps are never negative, and E2E is never shorter than TTFT."""
    for j, i in enumerate(ok):
        first, last = float(ttft[j]), float(e2e[j])
        if first < 0:
            raise KvsimError(f"{path}: ttfts[{i}]={first!r} is negative; not a physical measurement")
        gaps = itls[j] if isinstance(itls[j], list) else []
        if any(isinstance(g, (int, float)) and g < 0 for g in gaps):
            raise KvsimError(f"{path}: itls[{i}] has a negative gap; not a physical measurement")
        if last < first:
            raise KvsimError(f"{path}: request {i}'s E2E {last!r} s is below its TTFT {first!r} s "
                             "(latencies, or ttfts plus itls); not a physical measurement")


def _bench_arrivals(raw: dict[str, Any], n: int, path: Path) -> np.ndarray:
    rate = raw.get("request_rate")
    if rate in (None, "inf") or (isinstance(rate, float) and math.isinf(rate)):
        return np.zeros(n)
    if not isinstance(rate, (int, float)) or rate <= 0:
        raise KvsimError(f"{path}: request_rate={rate!r} is not a positive number")
    burstiness = float(raw.get("burstiness") or 1.0)
    rng = np.random.default_rng(0)
    gaps = rng.gamma(burstiness, 1.0 / (float(rate) * burstiness), size=n)  # vLLM's get_request
    gaps[0] = 0.0
    return np.cumsum(gaps)


def load_measured(path: str | Path, workload: str | Path | None = None) -> MeasuredRun:
    """A measured-run folder or a `vllm bench serve` JSON file."""
    p = Path(path)
    if p.is_dir():
        if not (p / "vllm" / "meta.json").is_file():
            raise KvsimError(f"measured={str(path)!r}: no vllm/meta.json in this folder (expected the layout "
                             "of benchmarks/validation_set/measured/<hardware>/<case>/)")
        return read_measured_dir(p, Path(workload) if workload else None)
    if p.is_file():
        return read_vllm_bench(p)
    raise KvsimError(f"measured={str(path)!r}: no such file or folder")
