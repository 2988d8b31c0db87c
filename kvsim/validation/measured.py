"""Readers of real serving runs to hold kvsim against: a measured-run folder and `vllm bench` JSON.

Two inputs, one result type (`MeasuredRun`, `kvsim.validation.frame`):

* a folder in the layout of `benchmarks/validation_set/measured/<hardware>/<case>/`:
  `vllm/meta.json` (engine arguments, the workload file: `kvsim.validation.meta`), `vllm/requests.jsonl` (engine-clock
  timestamps per request), `vllm/timeseries.csv` (a row a tick: a second in the validation set), and optionally the peer
  simulator LLMServingSim's prediction `outputs/sim.csv` and its cluster config `config.json`;
* the JSON that `vllm bench serve --save-result --save-detailed` writes (`kvsim.validation.bench`).

A malformed file raises `KvsimError` naming the file (and line) and the field, and so does an impossible
one: a request's instants out of order (queued ≤ scheduled ≤ first token ≤ last token), a token count
that is not a whole number ≥ 1, a request recorded twice, an engine argument of the wrong JSON type, a
gauge that is negative or not finite, a series whose `t` does not run forward, a peer prediction that
is not physical. A value is never quietly dropped for a default.
"""


from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.model.errors import KvsimError, near_path, not_a_file, reading, shown
from kvsim.model.units import read_number
from kvsim.validation.bench import read_vllm_bench
from kvsim.validation.frame import (
    MAX_SPAN_S,
    MIN_TICK_S,
    NS_PER_S,
    REQUEST_COLUMNS,
    MeasuredRun,
    json_number,
    json_text,
    read_json,
    refuse_late_arrival,
    request_frame,
    series_tick_s,
)
from kvsim.validation.meta import check_tick, engine_args, meta_notes
from kvsim.workload.files import csv_rows, data_file, open_text
from kvsim.workload.traces import TraceRecord, iter_jsonl, read_sharegpt_tokens

__all__ = ["REQUEST_COLUMNS", "MeasuredRun", "find_workload", "load_measured", "read_llmservingsim",
           "read_measured_dir", "read_vllm_bench", "request_frame", "series_number"]


def _count(row: dict[str, Any], key: str, where: str) -> int:
    """`row[key]` as a token count: a whole number >= 1 (32.7 tokens is a corrupt row, not 32)."""
    value = json_number(row, key, where)
    if value < 1 or value != int(value):
        raise KvsimError(f"{where}: {key}={row[key]!r} is not a positive whole number of tokens")
    return int(value)


def series_number(raw: str | None, column: str, where: str, upper: float = math.inf) -> float:
    """A cell of vLLM's per-second series: a finite number in [0, `upper`] (a gauge or a rate)."""
    try:
        value = read_number(raw, float)
    except (TypeError, ValueError):
        raise KvsimError(f"{where}: {column}={raw!r} is not a number") from None
    if not (math.isfinite(value) and 0 <= value <= upper):
        bounds = ">= 0" if upper == math.inf else f"in [0, {upper:g}]"
        raise KvsimError(f"{where}: {column}={raw!r} is not a finite number {bounds}")
    return value


# -- the measured-run folder ---------------------------------------------------------------

def find_workload(run_dir: Path, dataset_path: str) -> Path:
    """The workload file `meta.json` names, looked up beside each folder above the run and in
    `traces/*/` there (the validation set keeps the Llama workload under `../traces/`); "" (meta.json names
    none) is refused."""
    if not dataset_path:
        raise KvsimError(f"{run_dir / 'vllm' / 'meta.json'}: dataset_path is missing; pass --workload PATH")
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
    with reading(path, "requests file"):  # not UTF-8, or a corrupt .gz: a bare UnicodeDecodeError or EOFError
        numbered = list(iter_jsonl(path))
    for line_no, row in numbered:
        where = f"{path}:{line_no}"
        for key in ("queued_ts", "first_token_ts", "last_token_ts"):
            json_number(row, key, where)
        for key in ("input_toks", "output_toks"):
            _count(row, key, where)
        if "arrival_time" in row:  # the wall clock that aligns the time series
            json_number(row, "arrival_time", where)
        if "request_id" in row and not isinstance(row["request_id"], str):  # null, 1.0, true: read as no number
            raise KvsimError(f"{where}: request_id={shown(row['request_id'])}: expected text, vLLM's request id "
                             "(its benchmark's 'bench-N' pairs the request with workload line N + 1)")
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
    known = [(key, json_number(row, key, where)) for key in TIMELINE if key in row]
    for (before, t0), (after, t1) in zip(known, known[1:], strict=False):
        if t1 < t0:
            raise KvsimError(f"{where}: {after}={t1!r} is before {before}={t0!r}: the {_SPANS[before, after]} "
                             "would be negative; not a physical measurement")


MAX_INDEX_DIGITS = 18
"""The most digits of a request number read (an int64 holds them): `int()` refused a `bench-` followed by 4,301
digits with a bare ValueError (Python's guard against slow conversion), a traceback."""


def _request_index(row: dict[str, Any], fallback: int, where: str) -> int:
    """`bench-17` → 17: vLLM's benchmark numbers requests in workload order, in ASCII digits (`str.isdigit` took
    `bench-²` for a number, which `int()` then refused: a traceback). A number of more than `MAX_INDEX_DIGITS`
    digits, past any workload's lines, is refused naming `where`. A row without a request_id, or whose id (text:
    `_read_requests_jsonl` refuses any other JSON type) ends in no number, is paired by its position `fallback`."""
    tail = str(row.get("request_id", "")).rpartition("-")[2]
    if not (tail.isascii() and tail.isdigit()):
        return fallback
    if len(tail.lstrip("0")) > MAX_INDEX_DIGITS:
        raise KvsimError(f"{where}: request_id={shown(row['request_id'])}: a request number of "
                         f"{len(tail.lstrip('0')):,} digits, past any workload's lines")
    return int(tail)


def _read_timeseries(path: Path, offset_s: float) -> tuple[pd.DataFrame | None, list[str]]:
    path = data_file(path)
    if not path.is_file():
        return None, [f"{path.name} absent: no running/waiting comparison"]
    with reading(path, "time series file"), open_text(path, newline="") as f:
        reader = csv_rows(f, path)
        rows, columns = list(reader), reader.fieldnames or []
    missing = [c for c in ("t", "running", "waiting") if c not in columns]
    if rows and missing:
        raise KvsimError(f"{path}: expected columns t, running, waiting, kv_cache_pct ({missing[0]!r} is missing)")
    series: dict[str, list[float]] = {"t_s": [], "running": [], "waiting": [], "kv_usage": []}
    for line_no, r in enumerate(rows, start=2):
        where = f"{path}:{line_no}"
        t = series_number(r["t"], "t", where)
        if series["t_s"] and t - offset_s <= series["t_s"][-1]:
            raise KvsimError(f"{where}: t={r['t']!r} is not after the row before it: the series must run forward")
        series["t_s"].append(t - offset_s)
        series["running"].append(series_number(r["running"], "running", where))
        series["waiting"].append(series_number(r["waiting"], "waiting", where))
        kv_pct = series_number(r.get("kv_cache_pct") or "0", "kv_cache_pct", where, upper=100)
        series["kv_usage"].append(kv_pct / 100)
    df = pd.DataFrame(series)
    if (gap_s := series_tick_s(df)) < MIN_TICK_S:  # kvsim's rates are binned by it (`simulated_phase_rates`)
        raise KvsimError(f"{path}: t: its rows are {gap_s:g} s apart (the median gap, to the microsecond), under "
                         f"{MIN_TICK_S:g} s: t counts seconds, a row each tick of the run's rate logger")
    notes = []
    if len(df) and not (df["kv_usage"] > 0).any():
        df["kv_usage"] = np.nan
        notes.append("kv_cache_pct is 0 throughout the measured time series: KV usage was not recorded "
                     "in this run, so it is reported for kvsim only and not compared")
    return df, notes


def _epoch_s(stamp: Any, where: Path) -> float:
    """`started_at` in seconds since the epoch; it must carry its time zone (vLLM's ends in Z), since a
    naive one would be read in this machine's zone and shift the series against the requests."""
    from datetime import datetime

    try:
        instant = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except (AttributeError, TypeError, ValueError):
        raise KvsimError(f"{where}: started_at={stamp!r} is not an ISO timestamp") from None
    if instant.tzinfo is None:
        raise KvsimError(f"{where}: started_at={stamp!r} has no time zone (e.g. a trailing Z for UTC)")
    return instant.timestamp()


def read_measured_dir(run_dir: Path, workload: Path | None = None) -> MeasuredRun:
    """A measured run in the validation layout; `workload` overrides the file meta.json names."""
    vllm = run_dir / "vllm"
    meta = read_json(vllm / "meta.json")
    if not isinstance(meta, dict) or not isinstance(meta.get("engine_kwargs"), dict):
        raise KvsimError(f"{vllm / 'meta.json'}: expected an object with engine_kwargs")
    engine = engine_args(meta["engine_kwargs"], vllm / "meta.json")
    speculative = meta["engine_kwargs"].get("speculative_config")
    if speculative is not None and not isinstance(speculative, dict):
        raise KvsimError(f"{vllm / 'meta.json'}: engine_kwargs.speculative_config={shown(speculative)} is not an "
                         "object")
    requests_path = data_file(vllm / "requests.jsonl")
    rows = _read_requests_jsonl(requests_path)
    noted = meta_notes(meta, len(rows), vllm / "meta.json")
    model_id = json_text(meta, ("model",), str(vllm / "meta.json")) or json_text(
        meta["engine_kwargs"], ("model",), f"{vllm / 'meta.json'}: engine_kwargs")
    wl_path = workload or find_workload(run_dir, json_text(meta, ("dataset_path",), str(vllm / "meta.json")))
    with reading(wl_path, "workload file"):
        wl = read_sharegpt_tokens(wl_path)
    queued = np.array([float(r["queued_ts"]) for r in rows])
    t0 = float(queued.min())
    refuse_late_arrival(queued, requests_path, lambda i: f"request {rows[i].get('request_id')!r} queued_ts")
    records, seen, indices = [], set(), []
    for i, row in enumerate(rows):
        index = _request_index(row, i, str(requests_path))
        indices.append(index)
        if index in seen:
            raise KvsimError(f"{requests_path}: request {row.get('request_id')!r} is workload line "
                             f"{index + 1} again: each request is recorded once")
        seen.add(index)
        if index >= len(wl):
            raise KvsimError(f"{requests_path}: request {row.get('request_id')!r} has no line "
                             f"in the workload {wl_path} ({len(wl)} lines)")
        w = wl[index]
        if (w.prompt_len, w.output_len) != (int(row["input_toks"]), int(row["output_toks"])):
            raise KvsimError(f"{wl_path}: line {index + 1} has {w.prompt_len}+{w.output_len} tokens but the "
                             f"measured request {row.get('request_id')!r} has "
                             f"{row['input_toks']}+{row['output_toks']}: not this run's workload")
        records.append(TraceRecord(float(row["queued_ts"]) - t0, w.prompt_len, w.output_len,
                                   token_ids=w.token_ids))
    order = sorted(range(len(records)), key=lambda j: (records[j].arrival_s or 0.0, indices[j]))  # as the frame
    requests = request_frame(queued, np.array([float(r["first_token_ts"]) for r in rows]),
                             np.array([float(r["last_token_ts"]) for r in rows]),
                             np.array([int(r["input_toks"]) for r in rows]),
                             np.array([int(r["output_toks"]) for r in rows]),
                             np.array([float(r.get("scheduled_ts", "nan")) for r in rows]), np.array(indices))
    # the time series counts from started_at (wall clock); requests carry wall-clock arrival_time too
    offset_s, aligned = 0.0, False
    first = min(rows, key=lambda r: float(r["queued_ts"]))
    stamp = meta.get("started_at")  # null: not recorded, as every meta.json value (it was refused as no timestamp)
    started_s = _epoch_s(stamp, vllm / "meta.json") if stamp is not None else None  # checked alone too
    if started_s is not None and isinstance(first.get("arrival_time"), (int, float)):
        offset_s = float(first["arrival_time"]) - started_s
        if offset_s < 0:  # the series was shifted by it in silence (a year-9999 started_at: by 8e3 years)
            raise KvsimError(f"{vllm / 'meta.json'}: started_at={shown(meta['started_at'])} is {-offset_s:g} s after "
                             f"the first request's arrival_time ({requests_path}): a run starts before its requests "
                             "arrive, on one clock")
        if offset_s > MAX_SPAN_S:  # every row of the series shifted to ~ -1e300 s: "t=2.0 is not after the row before"
            raise KvsimError(f"{requests_path}: request {first.get('request_id')!r} arrival_time="
                             f"{float(first['arrival_time'])!r} is {offset_s:g} s after meta.json's started_at="
                             f"{shown(meta['started_at'])}, longer than a run kvsim replays ({MAX_SPAN_S:g} s: "
                             "int64 ns)")
        aligned = True
    timeseries, notes = _read_timeseries(vllm / "timeseries.csv", offset_s)
    check_tick(meta, timeseries, vllm / "meta.json")
    if timeseries is not None and not aligned:
        notes.append("timeseries.csv is taken to start at the first arrival: the run records no started_at "
                     "or no arrival_time to align it by, so its gauges may be shifted against the requests")
    config = run_dir / "config.json"
    hardware = _hardware(config) if config.is_file() else None
    link = _link(config) if config.is_file() else None
    return MeasuredRun(
        name=run_dir.name, source="vllm-measured",
        model_id=model_id,
        requests=requests, records=[records[j] for j in order], record_index=tuple(indices[j] for j in order),
        engine=engine, timeseries=timeseries,
        hardware=hardware or run_dir.resolve().parent.name,
        data_parallel_size=int(engine.get("data_parallel_size", 1)),
        expert_parallel=bool(engine.get("enable_expert_parallel")),
        peer=read_llmservingsim(run_dir / "outputs" / "sim.csv"), link=link, notes=[*noted, *notes],
        speculative_config=speculative,
    )


def _hardware(config: Path) -> str | None:
    """The hardware of the first instance LLMServingSim's cluster config names (an object whose `nodes`
    list objects whose `instances` list objects); a config of another shape raises `KvsimError`."""
    raw = read_json(config)
    if not isinstance(raw, dict):
        raise KvsimError(f"{config}: expected a JSON object (LLMServingSim's cluster config)")
    for i, node in enumerate(_objects(raw, "nodes", f"{config}: ")):
        for j, instance in enumerate(_objects(node, "instances", f"{config}: nodes[{i}].")):
            hardware = instance.get("hardware")
            if hardware is not None and (not isinstance(hardware, str) or not hardware):
                raise KvsimError(f"{config}: nodes[{i}].instances[{j}].hardware={hardware!r} is not a name")
            if hardware:
                return hardware
    return None


def _objects(parent: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    """`parent[key]` when it is a list of objects, [] when absent; anything else raises `KvsimError`."""
    items = parent.get(key, [])
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise KvsimError(f"{where}{key}={items!r:.60} is not a list of objects")
    return items


def _link(config: Path) -> dict[str, float] | None:
    """`link_bw` (GB/s) and `link_latency` (ns) of LLMServingSim's cluster config, in kvsim's units.

    The config is ASTRA-Sim's input, and ASTRA-Sim's analytical network reads a GB as 2^30 bytes
    (`bw_GBps_to_Bpns` in extern/network_backend/analytical/common/NetworkFunction.cpp: "1 GB is 2^30 B"),
    so the link the peer simulated, and fitted to its run, carries link_bw · 2^30 bytes/s. None when the
    config gives no link_bw; a link_bw or link_latency that is not a finite number, a link_bw <= 0 or a
    negative link_latency raises `KvsimError` naming the file and the field."""
    raw = read_json(config)
    if not isinstance(raw, dict) or raw.get("link_bw") is None:
        return None
    bandwidth_gb_per_s = json_number(raw, "link_bw", str(config))
    latency_ns = json_number(raw, "link_latency", str(config)) if raw.get("link_latency") is not None else 0.0
    if bandwidth_gb_per_s <= 0:
        raise KvsimError(f"{config}: link_bw={raw['link_bw']!r} must be > 0 (GB/s)")
    if latency_ns < 0:
        raise KvsimError(f"{config}: link_latency={raw['link_latency']!r} must be >= 0 (ns)")
    return {"bandwidth_bytes_per_s": bandwidth_gb_per_s * 2**30, "latency_s": latency_ns * 1e-9}


def read_llmservingsim(path: Path) -> pd.DataFrame | None:
    """LLMServingSim's `outputs/sim.csv` (nanoseconds) as a request frame, or None if absent; its `request id`
    (the workload's request number, as vLLM's benchmark numbers it) is the `request_index`. A file without rows,
    or a row that is not a physical prediction (`_check_peer`), raises `KvsimError`."""
    path = data_file(path)
    if not path.is_file():
        return None
    limit = csv.field_size_limit(2**31 - 1)  # the ITL column lists every token's gap
    try:
        with reading(path, "LLMServingSim prediction"), open_text(path, newline="") as f:
            rows = list(csv_rows(f, path))
    finally:  # the limit is the csv module's, process-wide: every other reader keeps the default
        csv.field_size_limit(limit)
    try:
        arrival = np.array([float(r["arrival"]) for r in rows]) / NS_PER_S
        ttft = np.array([float(r["TTFT"]) for r in rows]) / NS_PER_S
        queuing = np.array([float(r.get("queuing_delay") or "nan") for r in rows]) / NS_PER_S
        finish = np.array([float(r["end_time"]) for r in rows]) / NS_PER_S
        prompt = np.array([int(r["input"]) for r in rows])
        output = np.array([int(r["output"]) for r in rows])
        # the request's number in the workload, as vLLM's benchmark numbers it (`bench-N`); else the row's
        index = np.array([int(r["request id"]) for r in rows]) if rows and "request id" in rows[0] else None
    except (KeyError, ValueError, TypeError) as error:
        raise KvsimError(f"{path}: expected LLMServingSim columns input, output, arrival, end_time, "
                         f"TTFT ({error})") from None
    if not rows:
        raise KvsimError(f"{path}: no requests (LLMServingSim's prediction has no rows)")
    _check_peer(path, rows, arrival, ttft, queuing, finish, (prompt < 1) | (output < 1))
    return request_frame(arrival, arrival + ttft, finish, prompt, output, arrival + queuing, index)


def _check_peer(path: Path, rows: list[dict[str, str]], arrival: np.ndarray, ttft: np.ndarray,
                queuing: np.ndarray, finish: np.ndarray, no_tokens: np.ndarray) -> None:
    """Finite instants, 0 <= queuing_delay <= TTFT (a missing delay passes), end_time >= arrival + TTFT
    and at least one input and output token; the first row that breaks one is named by its line."""
    with np.errstate(invalid="ignore"):
        checks = ((("arrival", "TTFT", "end_time"), ~np.isfinite(arrival + ttft + finish), "not finite"),
                  (("TTFT",), ttft < 0, "negative"),
                  (("queuing_delay", "TTFT"), (queuing < 0) | (queuing > ttft), "a queuing delay outside [0, TTFT]"),
                  (("arrival", "TTFT", "end_time"), finish < arrival + ttft, "an end before the first token"),
                  (("input", "output"), no_tokens, "fewer than one token"))
    for fields, bad, what in checks:
        if bad.any():
            i = int(np.argmax(bad))
            values = ", ".join(f"{name}={rows[i].get(name)!r}" for name in fields)
            raise KvsimError(f"{path}:{i + 2}: {values}: {what}; not a physical prediction")


def load_measured(path: str | Path, workload: str | Path | None = None) -> MeasuredRun:
    """A measured-run folder or a `vllm bench serve` JSON file."""
    p = Path(path)
    problem = not_a_file(path, missing="no such file or folder")
    if problem is not None:  # a FIFO was "no such file or folder"
        hint = near_path(p) if problem == "no such file or folder" else ""
        raise KvsimError(f"measured={str(path)!r}: {problem}{hint}")
    if workload is not None:  # a missing file was "PATH: No such file or directory", naming no flag
        if not p.is_dir():  # it was ignored: a bench JSON lists its own requests
            raise KvsimError(f"workload={str(workload)!r}: replaces the workload a measured folder's meta.json "
                             f"names; {path} is a vllm bench serve JSON, which lists its own requests")
        problem = not_a_file(workload, file_kind="a workload JSONL file")
        if problem is not None:
            raise KvsimError(f"workload={str(workload)!r}: {problem}")
    if p.is_dir():
        # a folder or a FIFO of that name was "no vllm/meta.json in this folder"
        problem = not_a_file(p / "vllm" / "meta.json", missing="", file_kind="a JSON file")
        if problem == "":
            raise KvsimError(f"measured={str(path)!r}: no vllm/meta.json in this folder (expected the layout "
                             "of benchmarks/validation_set/measured/<hardware>/<case>/)")
        if problem is not None:
            raise KvsimError(f"measured={str(path)!r}: vllm/meta.json: {problem}")
        return read_measured_dir(p, Path(workload) if workload else None)
    return read_vllm_bench(p)
