"""The reader of `vllm bench serve --save-result --save-detailed` JSON, so anyone can validate on their
own GPU: fields as in vLLM's `vllm/benchmarks/serve.py` (`input_lens`, `output_lens`, `ttfts`, `itls`,
`latencies`, `start_times`, `errors`, plus `model_id`, `request_rate`, `burstiness`).

A malformed file raises `KvsimError` naming the file and the field: a list that is not one entry per
request (an optional one, `latencies` or `start_times`, is whole or absent, never ignored), a token count
that is not a whole number, a negative TTFT or inter-token gap, an E2E shorter than its TTFT.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.model.errors import KvsimError
from kvsim.validation.frame import MeasuredRun, is_number, read_json, refuse_late_arrival, request_frame
from kvsim.workload.traces import MAX_LENGTH, TraceRecord


def read_vllm_bench(path: Path) -> MeasuredRun:
    """`vllm bench serve` result JSON with `--save-detailed`: client-side per-request times.

    Arrivals are the requests' `start_times` (client send instants); a file without them gets
    arrivals at the recorded `request_rate` (Poisson, or gamma with the file's `burstiness`),
    seeded, and says so in the notes. Failed requests (non-empty `errors`) are left out.
    """
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise KvsimError(f"{path}: expected a JSON object (vllm bench serve --save-result)")
    lists = {}
    for key in ("input_lens", "output_lens", "ttfts", "itls"):
        value = raw.get(key)
        if value is None:
            raise KvsimError(f"{path}: {key} is missing: save the result with --save-detailed")
        lists[key] = value
    n = len(lists["input_lens"]) if isinstance(lists["input_lens"], list) else 0
    latencies = raw.get("latencies") if raw.get("latencies") is not None else raw.get("e2els")
    errors = raw.get("errors") or [""] * n
    starts = raw.get("start_times")
    optional = [(key, value) for key, value in (("latencies", latencies), ("start_times", starts)) if value is not None]
    for key, value in (*lists.items(), ("errors", errors), *optional):  # an optional list is whole or absent
        if not isinstance(value, list):
            raise KvsimError(f"{path}: {key}={value!r:.60} is not a list (one entry per request)")
        if len(value) != n:
            raise KvsimError(f"{path}: {key} has {len(value)} entries, input_lens has {n}")
    if not all(isinstance(e, str) for e in errors):
        raise KvsimError(f"{path}: errors must hold one string per request (empty for a success)")
    output_all = _whole(_values(lists["output_lens"], range(n), "output_lens", path, allow_missing=True),
                        range(n), "output_lens", path, minimum=0)
    ok = [i for i in range(n) if not errors[i] and output_all[i] > 0]
    if not ok:
        raise KvsimError(f"{path}: no successful request to compare")
    notes = []
    if n - len(ok):
        notes.append(f"{n - len(ok)} failed requests left out")
    prompt = _whole(_values(lists["input_lens"], ok, "input_lens", path), ok, "input_lens", path, minimum=1)
    output = output_all[ok].astype(int)
    ttft = _values(lists["ttfts"], ok, "ttfts", path)
    if not all(isinstance(lists["itls"][i], list | None) for i in ok):
        raise KvsimError(f"{path}: itls must hold one list of gaps per request")
    gaps = [_values(lists["itls"][i] or [], range(len(lists["itls"][i] or [])), f"itls[{i}]", path) for i in ok]
    if latencies is not None:
        e2e = _values(latencies, ok, "latencies", path)
    else:  # TTFT plus every inter-token gap
        e2e = ttft + np.array([g.sum() for g in gaps])
    _check_bench_times(ttft, e2e, ok, gaps, path)
    if starts is not None:
        arrival = _values(starts, ok, "start_times", path)
        refuse_late_arrival(arrival, path, lambda i: f"start_times[{ok[i]}]")
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
        if not is_number(value):
            raise KvsimError(f"{path}: {key}[{i}]={value!r} is not a number")
        out.append(float(value))
    return np.array(out, dtype=float)


def _whole(values: np.ndarray, indices: Any, key: str, path: Path, minimum: int) -> np.ndarray:
    """`values` (entries `indices` of `key`) as token counts: whole numbers >= `minimum`, at most `MAX_LENGTH`
    (a 1e300 became int64's minimum, refused as a token count of the temporary workload file)."""
    for value, i in zip(values, indices, strict=True):
        if value < minimum or value != int(value):
            raise KvsimError(f"{path}: {key}[{i}]={value:g} is not a whole number of tokens >= {minimum}")
        if value > MAX_LENGTH:
            raise KvsimError(f"{path}: {key}[{i}]={value:g} is more tokens than kvsim counts ({MAX_LENGTH:,})")
    return values.astype(int)


def _check_bench_times(ttft: np.ndarray, e2e: np.ndarray, ok: list[int], itls: list[np.ndarray],
                       path: Path) -> None:
    """TTFT and inter-token gaps are never negative, and E2E is never shorter than TTFT."""
    for j, i in enumerate(ok):
        first, last = float(ttft[j]), float(e2e[j])
        if first < 0:
            raise KvsimError(f"{path}: ttfts[{i}]={first!r} is negative; not a physical measurement")
        if (itls[j] < 0).any():
            raise KvsimError(f"{path}: itls[{i}] has a negative gap; not a physical measurement")
        if last < first:
            raise KvsimError(f"{path}: request {i}'s E2E {last!r} s is below its TTFT {first!r} s "
                             "(latencies, or ttfts plus itls); not a physical measurement")


def _bench_arrivals(raw: dict[str, Any], n: int, path: Path) -> np.ndarray:
    rate = raw.get("request_rate")
    if rate in (None, "inf") or (isinstance(rate, float) and math.isinf(rate) and rate > 0):
        return np.zeros(n)
    burstiness = 1.0 if raw.get("burstiness") is None else raw["burstiness"]
    for key, value in (("request_rate", rate), ("burstiness", burstiness)):
        if not is_number(value) or value <= 0:
            raise KvsimError(f"{path}: {key}={value!r} is not a positive number")
    rng = np.random.default_rng(0)
    gaps = rng.gamma(float(burstiness), 1.0 / (float(rate) * burstiness), size=n)  # vLLM's get_request
    gaps[0] = 0.0
    return np.cumsum(gaps)
