"""The reader of `vllm bench serve --save-result --save-detailed` JSON, so anyone can validate on their
own GPU: fields as in vLLM's `vllm/benchmarks/serve.py` (`input_lens`, `output_lens`, `ttfts`, `itls`,
`latencies`, `start_times`, `errors`, plus `model_id`, `request_rate`, `burstiness`).

A malformed file raises `KvsimError` naming the file and the field: a list that is not one entry per
request (an optional one, `latencies` or `start_times`, is whole or absent, never ignored; `errors` is absent
or such a list, never read as "no failure" for being empty or false), a token count that is not a whole number,
a negative TTFT or inter-token gap, an E2E shorter than its TTFT or not finite (gaps whose sum overflows), a wait
(`queue_times`) that puts an arrival further back than a replay's clock reaches.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.model.errors import KvsimError, shown
from kvsim.model.units import is_number
from kvsim.validation.frame import (
    MAX_SPAN_S,
    MeasuredRun,
    json_text,
    read_json,
    refuse_late_arrival,
    request_frame,
)
from kvsim.validation.recorded import unread_bench_engine_notes
from kvsim.workload.traces import MAX_LENGTH, TraceRecord


def read_vllm_bench(path: Path) -> MeasuredRun:
    """`vllm bench serve` result JSON with `--save-detailed`: client-side per-request times.

    Arrivals are the requests' `start_times` (client send instants); a file without them gets
    arrivals at the recorded `request_rate` (Poisson, or gamma with the file's `burstiness`),
    seeded, and says so in the notes. What each request put on the server is read as vLLM's client records
    it (vllm/benchmarks/lib/endpoint_request_func.py): a TTFT once the first streamed chunk with a token came
    (0 until then), one inter-token gap a chunk after it, `errors` non-empty for a refusal (a non-200 reply)
    or a stream that broke, and `output_lens` 0 for a failure (`calculate_metrics`) and, for a success, the
    server's usage count, or the tokenizer's count of its text where the server reported none (0 for an empty
    text). So:

    - failed requests (non-empty `errors`) are left out of the measured requests, as vLLM's means leave them
      out; one that streamed tokens (TTFT > 0) was in the engine until it broke: it is replayed, with its
      prompt and the tokens received (a lower bound), for its load alone, and left out of kvsim's column too
      (`MeasuredRun.record_index` names it); one that streamed none is not replayed (nothing shows it reached
      the engine);
    - a success counted as 0 tokens that streamed some is counted as those it streamed, on both sides (vLLM's
      means count it); one that streamed none (a 200 with no chunk) is left out of both (no first token).

    The notes give each count.
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
    latency_key = "latencies" if raw.get("latencies") is not None else "e2els"  # vLLM's older name
    latencies = raw.get(latency_key)
    errors = [""] * n if raw.get("errors") is None else raw["errors"]  # absent: no failure recorded
    starts, waits = raw.get("start_times"), raw.get("queue_times")
    optional = [(key, value) for key, value in ((latency_key, latencies), ("start_times", starts),
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
    ttft_all = _values(lists["ttfts"], range(n), "ttfts", path, allow_missing=True)
    if not all(isinstance(lists["itls"][i], list | None) for i in range(n)):
        raise KvsimError(f"{path}: itls must hold one list of gaps per request")
    # the streamed chunks with a token that reached the client: the first (its TTFT > 0) and one a gap after it
    chunks = np.array([1 + len(lists["itls"][i] or []) if ttft_all[i] > 0 else 0 for i in range(n)])
    counted = np.where(output_all > 0, output_all, chunks)  # a reply counted as 0 tokens that streamed some
    ok = [i for i in range(n) if not errors[i] and counted[i] > 0]
    load = [i for i in range(n) if errors[i] and chunks[i] > 0]
    if not ok:
        raise KvsimError(f"{path}: no successful request to compare")
    notes = _bench_notes(errors, output_all, counted, len(ok), len(load))
    replayed = sorted(ok + load)  # the requests whose load the replay carries, in the file's order
    prompt_all = _whole(_values(lists["input_lens"], replayed, "input_lens", path), replayed, "input_lens", path,
                        minimum=1)
    measured = np.isin(replayed, ok)  # of the replayed, those measured (the rest: failures, load only)
    prompt, output = prompt_all[measured], counted[ok].astype(int)
    ttft = ttft_all[ok]
    gaps = [_values(lists["itls"][i] or [], range(len(lists["itls"][i] or [])), f"itls[{i}]", path) for i in ok]
    if latencies is not None:
        e2e = _values(latencies, ok, latency_key, path)
    else:  # TTFT plus every inter-token gap (a sum that overflows is refused by _check_bench_times)
        with np.errstate(over="ignore"):
            e2e = ttft + np.array([g.sum() for g in gaps])
    _check_bench_times(ttft, e2e, ok, gaps, path)
    notes += _summary_notes(raw, ttft_all[[i for i in range(n) if not errors[i]]])
    notes += unread_bench_engine_notes(raw)
    if starts is not None:
        sent = _values(starts, replayed, "start_times", path)
        refuse_late_arrival(sent, path, lambda i: f"start_times[{replayed[i]}]")
    else:
        sent = _bench_arrivals(raw, len(replayed), path)
        drawn = "all at the start (request_rate inf)" if _infinite_rate(raw) else "resampled at its request_rate"
        notes.append(f"the file has no start_times: arrivals are {drawn}, so only aggregate statistics are "
                     "comparable")
    max_concurrency = _max_concurrency(raw.get("max_concurrency"), path)
    client = sent
    if max_concurrency is not None:
        if waits is not None and starts is not None:
            wait = _values(waits, replayed, "queue_times", path)
            if (wait < 0).any():
                i = replayed[int(np.flatnonzero(wait < 0)[0])]
                raise KvsimError(f"{path}: queue_times[{i}]={waits[i]!r} is negative; not a physical measurement")
            client = sent - wait
            if client.max() - client.min() > MAX_SPAN_S:  # the longest wait made the earliest arrival
                i = replayed[int(np.argmin(client))]
                raise KvsimError(f"{path}: queue_times[{i}]={waits[i]!r} puts the request's arrival "
                                 f"{client.max() - client.min():g} s before another's, longer than a run kvsim "
                                 f"replays ({MAX_SPAN_S:g} s: int64 ns)")
        elif _infinite_rate(raw):
            client = np.full(len(replayed), sent.min())
        notes.append(f"the client kept at most {max_concurrency} requests in flight; the replay does too "
                     "(workload.max_concurrency), its TTFT and E2E counted from each send")
    # in the order the client had them (ties: the file's order), each record with its request's index
    order = np.lexsort((np.asarray(replayed), client))
    records = [TraceRecord(float(client[j] - client.min()), int(prompt_all[j]), int(counted[replayed[j]]))
               for j in order]
    arrival = sent[measured]
    engine: dict[str, Any] = {}
    notes.append("client-side timings: TTFT includes HTTP and detokenization overheads the engine does not see")
    return MeasuredRun(
        name=path.stem, source="vllm-bench", model_id=json_text(raw, ("model_id", "tokenizer_id"), str(path)),
        requests=request_frame(arrival, arrival + ttft, arrival + e2e, prompt, output,
                               request_index=np.asarray(ok)),
        records=records, record_index=tuple(replayed[j] for j in order), engine=engine, notes=notes,
        max_concurrency=max_concurrency,
    )


def _bench_notes(errors: list[str], output: np.ndarray, counted: np.ndarray, num_ok: int, num_load: int) -> list[str]:
    """What the reader left out or counted otherwise (`read_vllm_bench`), one note each."""
    notes = []
    num_failed = sum(1 for e in errors if e)
    if num_load:
        notes.append(f"{num_load} failed requests (errors) that had streamed tokens are replayed for their load (their "
                     "prompt and the tokens received, a lower bound) and left out of both columns, as vLLM's means "
                     "leave them out")
    if num_failed - num_load:
        notes.append(f"{num_failed - num_load} failed requests (errors) with no token received left out of both "
                     "sides: not replayed (refused, or never answered: no load the file can show), not measured")
    relabelled = int(((output == 0) & (counted > 0) & np.array([not e for e in errors])).sum())
    if relabelled:
        notes.append(f"{relabelled} successful requests counted as 0 output tokens streamed some (usage not "
                     "reported): counted as the tokens received, on both sides, as vLLM's means count them")
    if len(errors) - num_failed - num_ok:
        notes.append(f"{len(errors) - num_failed - num_ok} successful requests with no token received left out of "
                     "both sides (no first token to time; kvsim simulates at least one)")
    return notes


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


def _summary_notes(raw: dict[str, Any], success_ttfts_s: np.ndarray) -> list[str]:
    """The file's own `mean_ttft_ms` held against its lists, in a note where they differ (beyond float rounding):
    vLLM computes it from its successful requests' `ttfts` (`calculate_metrics`), so another mean says the lists are
    not the summary's: edited, another tool's, or in other units (milliseconds read as seconds)."""
    saved = raw.get("mean_ttft_ms")
    if not is_number(saved) or not len(success_ttfts_s):
        return []
    mean_ms = float(np.mean(success_ttfts_s)) * 1000
    if math.isclose(mean_ms, saved, rel_tol=1e-6, abs_tol=1e-6):
        return []
    return [f"the file's mean_ttft_ms={saved:g} is not the mean of its successful requests' ttfts ({mean_ms:g} ms): "
            "its per-request lists may be another run's or in other units; the comparison reads the lists"]


def _check_bench_times(ttft: np.ndarray, e2e: np.ndarray, ok: list[int], itls: list[np.ndarray],
                       path: Path) -> None:
    """TTFT and inter-token gaps are never negative, and E2E is never shorter than TTFT."""
    for j, i in enumerate(ok):
        first, last = float(ttft[j]), float(e2e[j])
        if first < 0:
            raise KvsimError(f"{path}: ttfts[{i}]={first!r} is negative; not a physical measurement")
        if (itls[j] < 0).any():
            raise KvsimError(f"{path}: itls[{i}] has a negative gap; not a physical measurement")
        if not math.isfinite(last):  # finite gaps whose sum overflows a float
            raise KvsimError(f"{path}: request {i}'s E2E (ttfts plus itls) is {last!r} s; not a physical measurement")
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
    """Arrivals for a file without `start_times`: all at 0 at an infinite rate, else drawn at `request_rate` as
    vLLM's `get_request` draws them. A ramp (`--ramp-up-strategy`, saved with `request_rate` "inf") is refused:
    its sends followed a rate that changed request by request, which were replayed all at once."""
    if raw.get("ramp_up_strategy") is not None:
        raise KvsimError(f"{path}: ramp_up_strategy={shown(raw['ramp_up_strategy'])} and no start_times: the requests "
                         "were sent at a ramping rate the file does not record; kvsim replays a ramp from "
                         "its start_times, which newer vLLM versions save")
    if _infinite_rate(raw):
        return np.zeros(n)
    rate = _positive(raw.get("request_rate"), "request_rate", path)
    burstiness = _positive(1.0 if raw.get("burstiness") is None else raw["burstiness"], "burstiness", path)
    rng = np.random.default_rng(0)
    scale_s = 1.0 / (rate * burstiness) if rate * burstiness > 0 else math.inf  # the product of two tiny underflows
    gaps = rng.gamma(burstiness, scale_s, size=n)  # vLLM's get_request
    gaps[0] = 0.0
    with np.errstate(over="ignore"):
        arrivals = np.cumsum(gaps)
    if not arrivals[-1] <= MAX_SPAN_S:  # inf, or NaN (gamma's tiny shape at an infinite scale): a traceback later
        raise KvsimError(f"{path}: request_rate={rate!r}, burstiness={burstiness!r}: the arrivals drawn at that rate "
                         f"run past {MAX_SPAN_S:g} s, longer than a run kvsim replays (int64 ns)")
    return arrivals
