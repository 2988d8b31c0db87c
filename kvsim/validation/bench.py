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
    seeded, and says so in the notes. Failed requests (non-empty `errors`) are left out of the measured
    requests and of the replay, as vLLM's own means leave them out (`calculate_metrics` counts successes);
    their load on the server, if they reached it, is not replayed. So are successes with no output token
    (kvsim simulates at least one), which vLLM's means count. The notes give both counts.
    With `max_concurrency` (`--max-concurrency`: a closed-loop client) the replay keeps that cap
    (`workload.max_concurrency`) and its requests arrive when the client had them: each send less its
    wait for a slot (`queue_times`), or, where those are not recorded, all at once at an infinite
    `request_rate` (vLLM hands the client every request at the start), else at the sends.
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
    starts, waits = raw.get("start_times"), raw.get("queue_times")
    optional = [(key, value) for key, value in (("latencies", latencies), ("start_times", starts),
                                                ("queue_times", waits)) if value is not None]
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
    num_failed = sum(1 for e in errors if e)
    if num_failed:
        notes.append(f"{num_failed} failed requests (errors) left out of both sides: not replayed, not measured "
                     "(vLLM's means leave them out too); any load they put on the server is missing from the replay")
    if n - num_failed - len(ok):
        notes.append(f"{n - num_failed - len(ok)} successful requests with no output tokens left out of both sides "
                     "(kvsim simulates at least one token; vLLM's printed means count them)")
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
        drawn = "all at the start (request_rate inf)" if _infinite_rate(raw) else "resampled at its request_rate"
        notes.append(f"the file has no start_times: arrivals are {drawn}, so only aggregate statistics are "
                     "comparable")
    max_concurrency = _max_concurrency(raw.get("max_concurrency"), path)
    client = arrival
    if max_concurrency is not None:
        if waits is not None and starts is not None:
            wait = _values(waits, ok, "queue_times", path)
            if (wait < 0).any():
                i = ok[int(np.flatnonzero(wait < 0)[0])]
                raise KvsimError(f"{path}: queue_times[{i}]={waits[i]!r} is negative; not a physical measurement")
            client = arrival - wait
        elif _infinite_rate(raw):
            client = np.full(len(ok), arrival.min())
        notes.append(f"the client kept at most {max_concurrency} requests in flight; the replay does too "
                     "(workload.max_concurrency), its TTFT and E2E counted from each send")
    records = [TraceRecord(float(a - client.min()), int(p), int(o))
               for a, p, o in sorted(zip(client, prompt, output, strict=True), key=lambda t: t[0])]
    engine: dict[str, Any] = {}
    notes.append("client-side timings: TTFT includes HTTP and detokenization overheads the engine does not see")
    return MeasuredRun(
        name=path.stem, source="vllm-bench", model_id=str(raw.get("model_id") or raw.get("tokenizer_id") or ""),
        requests=request_frame(arrival, arrival + ttft, arrival + e2e, prompt, output),
        records=records, engine=engine, notes=notes, max_concurrency=max_concurrency,
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


def _infinite_rate(raw: dict[str, Any]) -> bool:
    """`vllm bench serve`'s default `request_rate` (inf, saved as "inf"): every request is handed over at once."""
    rate = raw.get("request_rate")
    return rate in (None, "inf") or (isinstance(rate, float) and math.isinf(rate) and rate > 0)


def _max_concurrency(value: Any, path: Path) -> int | None:
    """The file's `max_concurrency` (None: the client had no cap), a positive whole number or refused."""
    if value is None:
        return None
    if not is_number(value) or value < 1 or value != int(value):
        raise KvsimError(f"{path}: max_concurrency={value!r} is not a positive whole number")
    return int(value)


def _positive(value: Any, key: str, path: Path) -> float:
    """The file's `key` as a positive float, or refused naming the file, the field and the value."""
    if not is_number(value) or value <= 0:
        raise KvsimError(f"{path}: {key}={value!r} is not a positive number")
    return float(value)


def _bench_arrivals(raw: dict[str, Any], n: int, path: Path) -> np.ndarray:
    if _infinite_rate(raw):
        return np.zeros(n)
    rate = _positive(raw.get("request_rate"), "request_rate", path)
    burstiness = _positive(1.0 if raw.get("burstiness") is None else raw["burstiness"], "burstiness", path)
    rng = np.random.default_rng(0)
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)  # vLLM's get_request
    gaps[0] = 0.0
    return np.cumsum(gaps)
