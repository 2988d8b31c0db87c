"""What every reader of a real serving run produces: `MeasuredRun`, its request frame, and the JSON
primitives the readers share (a file that is not JSON, or a field that is not a finite number, raises
`KvsimError` naming the file and the field).

Definitions (the validation README's, which are vLLM's): TTFT = first token − queued;
E2E = last token − queued; TPOT = (last − first token) / (output tokens − 1), undefined for a
one-token reply. Times in the `requests` frame are seconds from the first arrival.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.model.errors import KvsimError, reading, shown
from kvsim.model.units import is_number
from kvsim.model.yaml_io import load_json
from kvsim.workload.files import open_text
from kvsim.workload.traces import TraceRecord

REQUEST_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s",
                   "prompt_tokens", "output_tokens", "request_index")
"""The columns of `MeasuredRun.requests`, in order; `request_frame` builds exactly these. `request_index`: the
request in its source (vLLM's benchmark number `bench-N`, a bench JSON's list position, LLMServingSim's `request
id`), which pairs a row with its replay and with the peer's prediction of it (`MeasuredRun.record_index`)."""
NS_PER_S = 1e9
MAX_SPAN_S = 2**63 / NS_PER_S
"""The longest run a measured one may span: int64 nanoseconds (about 292 years), the `arrival_time_ns` of the
workload kvsim replays (a span of 1e300 s overflowed converting it)."""


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
    `max_concurrency`: the client kept at most this many requests in flight (`records` then arrive when the
    client had them, before any wait for a free slot; the replay's `workload.max_concurrency`).
    `record_index`: each record's `request_index` (None: record i is row i of `requests`); a record whose index
    no row has is replayed for its load alone (a failed request that was in the engine), in neither column.
    `speculative_config`: the run's `engine_kwargs.speculative_config` (it drafted speculatively), if any.
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
    max_concurrency: int | None = None  # a closed-loop client's cap on requests in flight (`vllm bench serve`)
    record_index: tuple[int, ...] | None = None
    speculative_config: dict[str, Any] | None = None  # vLLM's, as recorded: no acceptance model kvsim can replay


def read_json(path: Path) -> Any:
    """The JSON in `path` (as every reader opens a file: `x.json.gz` decompressed, a byte-order mark skipped,
    `kvsim.workload.files.open_text`); a missing file or one that is not JSON raises `KvsimError` naming it
    (`kvsim.model.errors.reading`'s reasons). A bench JSON saved as `b.json.gz` was "not UTF-8 text (byte 1)",
    one with a mark "not JSON"."""
    if not path.exists():
        raise KvsimError(f"JSON file {path}: file not found")
    try:
        with reading(path, "JSON file"), open_text(path) as f:
            text = f.read()
        return load_json(text)
    except json.JSONDecodeError as error:
        raise KvsimError(f"JSON file {path}: not JSON ({error.msg} at line {error.lineno})") from None


def refuse_late_arrival(arrival_s: np.ndarray, path: Path, name_of: Callable[[int], str]) -> None:
    """Refuse the first arrival more than `MAX_SPAN_S` after the earliest, naming it `name_of(its index)`
    (e.g. `start_times[7]`) in `path`."""
    late = np.flatnonzero(arrival_s - arrival_s.min() > MAX_SPAN_S)
    if len(late):
        i = int(late[0])
        raise KvsimError(f"{path}: {name_of(i)}={float(arrival_s[i])!r} is {arrival_s[i] - arrival_s.min():g} s "
                         f"after the first request, longer than a run kvsim replays ({MAX_SPAN_S:g} s: int64 ns)")


def json_number(row: dict[str, Any], key: str, where: str) -> float:
    """`row[key]` as a finite float; anything else (a string, true, NaN, Infinity, absent) names it."""
    value = row.get(key)
    if not is_number(value):
        raise KvsimError(f"{where}: {key}={value!r} is not a number")
    return float(value)


def json_text(row: dict[str, Any], keys: tuple[str, ...], where: str) -> str:
    """The first of `keys` that `row` gives (not null or ""), as text; "" where none does. A value that is not a
    string (a number, a list) names its key: `str()` of it read `model: 5` as a model called '5' and a null
    `dataset_path` as a file called 'None'."""
    for key in keys:
        value = row.get(key)
        if value is not None and value != "":
            if not isinstance(value, str):
                raise KvsimError(f"{where}: {key}={shown(value)} is not text")
            return value
    return ""


def request_frame(arrival_s: np.ndarray, first_token_s: np.ndarray, finish_s: np.ndarray,
                  prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                  first_scheduled_s: np.ndarray | None = None, request_index: np.ndarray | None = None,
                  ) -> pd.DataFrame:
    """The per-request frame from absolute instants, re-based so the first arrival is 0
    (`first_scheduled_s` NaN where the source does not record it; `request_index` 0, 1, ... in the order
    given where the source numbers no request), sorted by arrival (ties: by request index)."""
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
        "request_index": np.arange(len(arrival_s)) if request_index is None else np.asarray(request_index, int),
    }
    df = pd.DataFrame({name: columns[name] for name in REQUEST_COLUMNS})
    return df.sort_values(["arrival_s", "request_index"], kind="stable").reset_index(drop=True)


MIN_TICK_S = 1e-3
"""The shortest gap a measured series' rows may have (`series_tick_s`): kvsim bins its own run by that gap, and a
gap under half a microsecond rounded to 0 (a division by zero, then a traceback); rows logged faster than every
millisecond are not a rate logger's ticks, and an hour's run at 1 ms is already 3.6 million bins."""


def series_tick_s(series: pd.DataFrame | None) -> float:
    """How often the measured series was read: the median gap between its rows' `t_s`, to the microsecond (1 s
    where it has fewer than two rows). A row's rates are its window's tokens over the window's length, as vLLM's
    logger averages them over its interval, so kvsim's are binned by the same length (`simulated_phase_rates`)."""
    if series is None or len(series) < 2:
        return 1.0
    return round(float(np.median(np.diff(series["t_s"].to_numpy(dtype=float)))), 6)
