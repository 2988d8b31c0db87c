"""Is a request rate sustainable? One run judged over its measurement window: the test every rate, fleet size
and cost figure is built on (`kvsim.planning.steady_state` searches the rates with it).

    evidence = window_evidence(result.requests)                  # JSON-safe, SLO-independent

A finite burst that meets an SLO says nothing about steady state: the queue it builds may still be
growing when the last request arrives. A probe therefore judges one run over a *measurement window*

    arrivals:   |--warm-up--|=============window=============|--tail--|   drain (no arrivals)
                t0          a = t0 + 0.2·span                b = t_last − 0.1·span

that leaves out the warm-up (the system starts empty: at least 20 % of the span and 3 service times,
a service time being the median first scheduled → finish of the requests never preempted, so the
running set has filled) and the drain (after the last arrival the queue only empties). A window
shorter than 10 service times or holding fewer than 50 requests is **too short** to judge: the run
must be longer (the search doubles it). Otherwise, with
`offered` = servable requests arriving in [a, b) per second and `served` = requests finishing in
[a, b) per second:

- **overloaded**: served ÷ offered < 1 − `THROUGHPUT_TOL` (5 %): the system finishes fewer requests
  than arrive, so its backlog grows without bound;
- **backlogged**: served keeps up within the tolerance, but the backlog (requests arrived and not
  finished: waiting + running, sampled at 64 instants) grows: the lower end of its least-squares
  slope's 95 % interval (slope − 1.96 · standard error) is above `TREND_TOL` (1 %) of the offered
  rate, so more than 1 % of arrivals pile up and a longer run would fail (a slope within its noise
  is left to the longer runs of the search to settle); or, on a fleet, one replica's waiting queue
  outgrew its own margin (`early_overload`'s "worst_replica") while the fleet as a whole keeps up;
- **stable**: neither, *or* the waiting queue did not grow over the window beyond the margin a stable
  queue stays under (`early_overload`, below, with z = 1.96: at most 5 % of runs at ρ = 1 exactly, and
  none of 100 seeds of M/D/64 or M/D/1 at ρ = 0.95 came within 1.3 deviations). Both tests above read
  a shortfall the noise of a sustainable rate can make: served − offered over the window is the
  backlog's change, which at ρ = 0.8–0.85 of a batch engine's capacity moves by 5 % and more of the
  window's arrivals (the default scenario, 1,280 requests: served ÷ offered down to 0.954; its
  running set alone holds λ·S requests, Poisson-like in number), and the slope's interval takes its
  64 samples as independent where a queue's are not. So neither is a verdict unless the waiting
  queue's growth also says no stable queue could show it (a false "overloaded" makes a rate search
  answer too low). The price is power: at ρ = 1.1 a 1,280-request run still passes about 1 time in
  5 (the queue's growth, 9 % of ~900 arrivals, is within 1.96·√900), which the search's longer runs and
  its 10 × verification settle (at 3,000 requests 1 in 20 passes, at 6,000 none; a verification run is
  also held to served ÷ offered ≥ 1 − `THROUGHPUT_TOL` without this veto: `kvsim.planning.verify.long_run_evidence`).

A run too short by the service-time test (but with at least 50 requests in the window) is still judged
**overloaded** when its waiting queue (requests arrived and never scheduled) grows over the window by more
than a stable queue could show (`early_overload`): by more than

    margin = z · √(c_a² · arrivals + c_s² · departures + running)      (z = 3.29 here: one-sided 0.05 %)

counting the arrivals and departures inside the window, c_a² and c_s² the squared coefficients of variation
of the run's interarrival and service times, `running` the most requests in service in the window. Why it
never calls a sustainable rate overloaded (but for the odds the margin leaves): the waiting queue is the net
input (arrivals less the work the servers can do) reflected at an empty queue, so its growth over [a, b) is
at most the net input's largest rise over some [s, b), a ≤ s (the rise from a if the queue never emptied,
else from the last instant s it was empty: W(b) − W(a) ≤ W(b) = X(b) − X(s)), and a queue that keeps up has
a net input that drifts down, with the variance of a heavy-traffic GI/G/c queue, λ·(c_a² + c_s²) a second
(Poisson arrivals: c_a² = 1; deterministic service: c_s² = 0), so by the reflection principle its rise passes
z standard deviations with probability at most 2·Φ(−z) = 0.1 %; `running` covers the phases of the servers
(each in-service request may finish just after the window: with deterministic service, the departures of c
slots differ from c·T/S by up to c). The queue's growth is compared, not the backlog's: a batch engine's
running set grows while its batch fills, which is no overload. A single server (M/D/1) never reaches it on a
too-short run (50 arrivals inside 10 service times is an offered load of 5 and more), only on a judged one.

A run that never ends is **stalled**: vLLM's held-KV deadlock (`kvsim.model.errors.HeldKvStall`: a priority
queue's head cannot fit while requests behind it hold their KV, or a loaded head cannot add its
speculative lookahead beside them, and nothing runs), where vLLM's scheduler waits
forever and no later request is served. It has no window and fails every SLO (`stalled_evidence`).

Judging a probe against SLOs (`probe_passes`, `parse_slo_key`): `kvsim.planning.slo`.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping
from statistics import NormalDist
from typing import Any

import numpy as np

from kvsim.model.errors import KvsimError, shown

SLO_METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")
SLO_STATS = ("mean", "p50", "p90", "p99")
STABLE, BACKLOGGED, OVERLOADED, EMPTY = "stable", "backlogged", "overloaded", "no servable requests"
STALLED = "stalled"  # the run never ended: vLLM's held-KV deadlock (`stalled_evidence`)
TOO_SHORT = "too short"
WINDOW_COLUMNS = ("first_scheduled_s", "output_tokens", "num_samples", *SLO_METRICS)  # read once there is a window
WARMUP_FRACTION = 0.2  # of the arrival span, left out at the start (the system starts empty)
WARMUP_SERVICES = 3.0  # ... and at least this many service times (first scheduled → finish): the fill-up
MIN_WINDOW_SERVICES = 10.0  # a window shorter than this many service times cannot show a steady state
MIN_WINDOW_REQUESTS = 50
TAIL_FRACTION = 0.1  # of the arrival span, left out before the last arrival (its requests see the load thin out)
THROUGHPUT_TOL = 0.05  # served ÷ offered must be at least 1 − this
TREND_TOL = 0.01  # backlog slope ÷ offered rate must be at most this: 1 % of arrivals may not pile up
NUM_TREND_SAMPLES = 64
Z_95 = 1.959964
Z_EARLY = 3.290527  # one-sided 0.05 %: a too-short run is called overloaded only beyond this many deviations


def quantile_ci(sorted_values: np.ndarray, p: float, z: float = Z_95) -> tuple[float | None, float | None]:
    """A confidence interval for the p-quantile: the order statistics at ranks n·p ∓ z·√(n·p·(1−p))
    (0-based, clipped to the sample). Values must be sorted."""
    n = len(sorted_values)
    if n == 0:
        return None, None
    half = z * math.sqrt(n * p * (1 - p))
    lo, hi = max(0, math.floor(n * p - half) - 1), min(n - 1, math.ceil(n * p + half))
    return _finite(sorted_values[lo]), _finite(sorted_values[hi])


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def metric_stats(values: np.ndarray) -> dict[str, Any]:
    """mean, p50/p90/p99 (numpy's linear interpolation, as `kvsim.results.metrics.percentiles`) and CIs,
    over the requests that have the value (NaN left out: a one-token reply has no TPOT)."""
    values = values[~np.isnan(values)]
    ordered = np.sort(values)
    out: dict[str, Any] = {"n": int(len(values))}
    if not len(values):
        return {**out, **dict.fromkeys(SLO_STATS)}
    out["mean"] = _finite(float(np.mean(values)))
    for stat in SLO_STATS[1:]:
        p = int(stat[1:]) / 100
        out[stat] = _finite(float(np.quantile(ordered, p)))
        out[f"{stat}_ci"] = quantile_ci(ordered, p)
    return out


def _slope(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope of y on x and its standard error (residuals taken as independent)."""
    dx = x - x.mean()
    sxx = float((dx**2).sum())
    slope = float((dx * (y - y.mean())).sum()) / sxx
    residuals = y - y.mean() - slope * dx
    return slope, math.sqrt(float((residuals**2).sum()) / (len(x) - 2) / sxx)


def _service_s(requests: Mapping[str, Any], servable: np.ndarray, handoff_s: np.ndarray | None = None) -> float:
    """The median time a request runs once scheduled (first scheduled → finish), over the requests never
    preempted when there are any: a preempted request's time includes its wait to be re-admitted, which
    grows without bound in an overloaded run and would say nothing about how long serving one takes. A
    disaggregated run's (`handoff_s`, per row) leaves out its hand-off → first token: the decode instance's
    queue, which grows so, with the transfer and D's first step."""
    busy = np.asarray(requests["finish_s"], float) - np.asarray(requests["first_scheduled_s"], float)
    if handoff_s is not None:
        busy -= np.where(np.isnan(handoff_s), 0.0, np.asarray(requests["first_token_s"], float) - handoff_s)
    calm = servable & (np.asarray(requests["num_preemptions"]) == 0) if "num_preemptions" in requests else servable
    chosen = busy[calm if calm.any() else servable]
    chosen = chosen[~np.isnan(chosen)]
    return float(np.median(chosen)) if len(chosen) else 0.0


def _cv2(values: np.ndarray) -> float:
    """The squared coefficient of variation (variance ÷ mean²) of the finite values; 1 (Poisson's) for < 2."""
    values = values[np.isfinite(values)]
    mean = float(values.mean()) if len(values) > 1 else 0.0
    return float(values.var()) / mean**2 if mean > 0 else 1.0


def _queue_growth(requests: Mapping[str, Any], servable: np.ndarray, start: float, end: float,
                  z: float) -> dict[str, Any]:
    """The waiting queue of the `servable` rows over [start, end): its growth and a stable queue's margin."""
    arrival = np.sort(np.asarray(requests["arrival_s"], float)[servable])
    first = np.asarray(requests["first_scheduled_s"], float)[servable]
    finish = np.asarray(requests["finish_s"], float)[servable]
    admitted, done = np.sort(first[~np.isnan(first)]), np.sort(finish[~np.isnan(finish)])

    def count(times: np.ndarray, t: float) -> int:
        return int(np.searchsorted(times, t, side="right"))

    waiting_growth = ((count(arrival, end) - count(admitted, end)) - (count(arrival, start) - count(admitted, start)))
    grid = np.linspace(start, end, NUM_TREND_SAMPLES)
    running = int((np.searchsorted(admitted, grid, side="right") - np.searchsorted(done, grid, side="right")).max())
    calm = (np.asarray(requests["num_preemptions"])[servable] == 0 if "num_preemptions" in requests
            else np.ones(len(first), bool))
    variance = (_cv2(np.diff(arrival[: count(arrival, end)])) * (count(arrival, end) - count(arrival, start))
                + _cv2((finish - first)[calm]) * (count(done, end) - count(done, start)) + running)
    return {"waiting_growth": waiting_growth, "margin": z * math.sqrt(variance), "z": z}


def _handoffs(requests: Mapping[str, Any], transfers: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per row of a disaggregated run's `requests`, its hand-off to a decode instance and the prefill instance it
    came from (`transfers`' handoff_s and prefill_replica, by request_id); NaN and −1 for a request with no transfer
    (rejected on its prefill instance, or by the decode instance it was handed to: not servable, so in no queue)."""
    row = {int(rid): i for i, rid in enumerate(np.asarray(requests["request_id"]))}
    at = [row[int(rid)] for rid in np.asarray(transfers["request_id"])]
    handoff, prefill = np.full(len(row), np.nan), np.full(len(row), -1)
    handoff[at], prefill[at] = np.asarray(transfers["handoff_s"]), np.asarray(transfers["prefill_replica"])
    return handoff, prefill


def _prefill_queues(requests: Mapping[str, Any], handoff_s: np.ndarray,
                    prefill: np.ndarray) -> dict[int, dict[str, np.ndarray]]:
    """Per prefill instance of a disaggregated run (`_handoffs`), its queue as `_queue_growth` reads one: a request
    arrives with the client's arrival, is admitted when its prefill is first scheduled (the client row's
    `first_scheduled_s` is the prefill's) and leaves at its hand-off."""
    columns = {"arrival_s": np.asarray(requests["arrival_s"], float),
               "first_scheduled_s": np.asarray(requests["first_scheduled_s"], float), "finish_s": handoff_s,
               "num_preemptions": np.asarray(requests["num_preemptions"]) if "num_preemptions" in requests
               else np.zeros(len(prefill))}
    return {int(r): {name: values[prefill == r] for name, values in columns.items()} for r in np.unique(prefill)
            if r >= 0}


def _decode_queues(requests: Mapping[str, Any], handoff_s: np.ndarray) -> dict[int, dict[str, np.ndarray]]:
    """Per decode instance of a disaggregated run (a handed-off request's `replica`), its queue as `_queue_growth`
    reads one: a request arrives at its hand-off (`_handoffs`), counts as admitted at its first token (D's first
    step, which recomputes the last prompt token) and leaves when it finishes. So it waits while D reserves its
    blocks, while its KV moves and while it is queued on D with its KV there, as vLLM's decode instance counts it
    waiting (WAITING_FOR_REMOTE_KVS, then WAITING), and one step more."""
    rows = ~np.isnan(handoff_s)
    preempted = np.asarray(requests["num_preemptions"]) if "num_preemptions" in requests else np.zeros(len(rows))
    columns = {"arrival_s": handoff_s, "first_scheduled_s": np.asarray(requests["first_token_s"], float),
               "finish_s": np.asarray(requests["finish_s"], float), "num_preemptions": preempted}
    replica = np.asarray(requests["replica"])
    return {int(r): {name: values[rows & (replica == r)] for name, values in columns.items()}
            for r in np.unique(replica[rows])}


def early_overload(requests: Mapping[str, Any], servable: np.ndarray, start: float, end: float,
                   z: float = Z_EARLY, handoffs: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """The waiting queue's growth over the window [start, end) against the margin a stable queue stays under
    (the module's docstring derives it), `z` deviations of the net input: {"waiting_growth", "margin", "z"};
    growth > margin is an overload.

    A fleet's table (a `replica` column naming two or more replicas) also gets "worst_replica": the replica
    whose own waiting queue outgrew its own margin by the most ({"replica", "waiting_growth", "margin", "z"}),
    each judged at the z that gives the c replicas together the fleet test's odds (Bonferroni: one-sided tail
    Φ(−z) ÷ c). The fleet's total queue hides one replica falling behind: its growth is that replica's, its
    margin counts every replica's arrivals (4 round-robin replicas, one of them 10 % over its capacity: the
    total grows by ~2.3 % of arrivals, under 1.96·√arrivals on 6,000 requests). The verdict reads both the
    fleet's test and the replicas', so a fleet's odds of a false alarm are at most twice one test's (the union
    bound), not the fleet test's alone; where the replicas are alike they mostly coincide (200 naive runs each of
    2 and 4 round-robin M/D/1 replicas at ρ = 1, 4,000 requests: a replica's test fired in 3.5 % and 2 %, always
    beside the fleet's, in 8 %).

    A disaggregated run's hand-offs (`handoffs`, per row: `_handoffs`) make the fleet's queue the whole way to
    the decode instance, arrival to first token (the prefill queue, the prefill, the wait for D's blocks, the
    transfer, D's queue and its first step), and the replicas its instances, each judged on its own queue: a
    decode instance's hand-off to first token (`_decode_queues`), a prefill instance's arrival to prefill
    (`_prefill_queues`), one instance too, the Bonferroni count all of them. A client row's `first_scheduled_s`
    is the prefill's: read alone, the prefill pool's queue missed a decode pool falling behind while P kept up
    (served ÷ offered 0.89 with P's queue flat: stable). The pipeline queue alone missed one prefill instance
    falling behind (2P1D round-robin, one P at 50 req/s offered 53.5: its queue grew 70 against its own margin
    of 53, the pipeline's 69 against 88, whose variance counts every arrival and D's running requests: stable)."""
    if handoffs is not None and not np.isnan(handoffs[0]).all():
        handoff_s, prefill = handoffs
        queues = {**_prefill_queues(requests, handoff_s, prefill), **_decode_queues(requests, handoff_s)}
        first_token = np.asarray(requests["first_token_s"], float)
        pipeline = {name: np.asarray(requests[name]) for name in ("arrival_s", "finish_s", "num_preemptions")
                    if name in requests}
        pipeline["first_scheduled_s"] = np.where(np.isnan(handoff_s), np.asarray(requests["first_scheduled_s"], float),
                                                 first_token)
        out = _queue_growth(pipeline, servable, start, end, z)
        return {**out, "worst_replica": _worst_replica(
            {r: (queue, np.ones(len(queue["arrival_s"]), bool)) for r, queue in queues.items()}, start, end, z)}
    out = _queue_growth(requests, servable, start, end, z)
    replica = np.asarray(requests["replica"]) if "replica" in requests else None
    ids = np.unique(replica[servable]) if replica is not None else ()
    if len(ids) < 2:
        return out
    return {**out, "worst_replica": _worst_replica({int(r): (requests, servable & (replica == r)) for r in ids},
                                                   start, end, z)}


def _worst_replica(queues: Mapping[int, tuple[Mapping[str, Any], np.ndarray]], start: float, end: float,
                   z: float) -> dict[str, Any]:
    """Of the replicas' queues (replica → its table and the rows of it that queue there), each judged by
    `_queue_growth` at the z that gives them together one queue's odds `z` (Bonferroni), the one furthest over
    its margin: {"replica", "waiting_growth", "margin", "z"}."""
    z_each = -NormalDist().inv_cdf(NormalDist().cdf(-z) / len(queues))
    each = [{"replica": r, **_queue_growth(table, rows, start, end, z_each)} for r, (table, rows) in queues.items()]
    return max(each, key=lambda g: g["waiting_growth"] - g["margin"])


def replica_outgrew(early: Mapping[str, Any] | None) -> bool:
    """Whether one replica's waiting queue outgrew its own stable margin (`early_overload`'s "worst_replica")."""
    worst = (early or {}).get("worst_replica")
    return worst is not None and worst["waiting_growth"] > worst["margin"]


def early_overloaded(evidence: Mapping[str, Any]) -> bool:
    """Whether a run was judged overloaded: every such verdict rests on its waiting queue's growth beyond a
    stable queue's margin (`early_overload`), a verdict on the rate, not on the run's length, which a longer
    run of the same traffic would not reverse (a too-short run is judged so only on that growth). A stalled
    run counts too: a longer run of the same traffic sends the same requests first and stalls where it did."""
    return evidence["verdict"] in (OVERLOADED, STALLED)


def _no_window(out: dict[str, Any], verdict: str) -> dict[str, Any]:
    """The evidence of a run with no measurement window (`verdict` says why): nothing offered or served in it."""
    return {**out, "verdict": verdict, "window_s": 0.0, "num_in_window": 0, "offered_per_s": 0.0,
            "served_per_s": 0.0, "served_over_offered": None, "backlog_trend": None,
            **{m: metric_stats(np.zeros(0)) for m in SLO_METRICS}}


def stalled_evidence(num_requests: int, reason: str) -> dict[str, Any]:
    """The evidence of a run of `num_requests` that never ended (`kvsim.model.errors.HeldKvStall`, its line
    `reason`): verdict *stalled*, no window; every SLO unmet (no request measured), so no probe passes on it."""
    return _no_window({"num_requests": num_requests, "num_rejected": 0, "rejected_fraction": 0.0,
                       "stall": reason}, STALLED)


def _require(table: str, columns: Mapping[str, Any], names: tuple[str, ...], num_rows: int | None = None) -> None:
    """A `KvsimError` naming the first of `names` the table lacks (a KeyError deep in the judging, else), or naming
    a value that is no table at all (a `RunResult` given for its `requests`, None: `in` raised a TypeError), or the
    first of `names` that is no column of `num_rows` values (of the first name's count where None): a dict of columns
    of two lengths stopped in NumPy's broadcasting (a ValueError) or indexing (an IndexError)."""
    where = "RunResult.requests" if table == "requests" else f"RunResult.tables[{table!r}]"
    if isinstance(columns, (str, bytes)) or not isinstance(columns, Container):
        raise KvsimError(f"{table}={shown(columns)}: expected a run's {table} table ({where})")
    missing = next((name for name in names if name not in columns), None)
    if missing is not None:
        raise KvsimError(f"{table}: no column {missing!r}; expected a run's {table} table ({where})")
    for name in names:
        shape = np.shape(columns[name])  # a Series' or an array's without a copy
        if num_rows is None and len(shape) == 1:
            num_rows = shape[0]  # the first column's count is the table's
        if shape != (num_rows,):
            held = f"{shape[0]:,} values" if len(shape) == 1 else f"no column of values (shape {shape})"
            rows = "" if num_rows is None else f" of the table's {num_rows:,}"
            raise KvsimError(f"{table}: column {name!r} holds {held}, not one per row{rows}; expected a run's "
                             f"{table} table ({where})")


def _seconds(requests: Mapping[str, Any], name: str) -> np.ndarray:
    """The column `name` of `requests` as float seconds, or a `KvsimError` naming it (text was a ValueError)."""
    try:
        return np.asarray(requests[name], dtype=float)
    except (TypeError, ValueError):
        raise KvsimError(f"requests: column {name!r} holds {shown(requests[name])}, not seconds") from None


def window_evidence(requests: Mapping[str, Any], warmup_fraction: float = WARMUP_FRACTION,
                    tail_fraction: float = TAIL_FRACTION, transfers: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What one run says about steady state: window, counts, served ÷ offered, backlog trend, verdict,
    and latency percentiles with CIs over the servable requests that arrived in the window.

    `requests`: a run's requests table (`RunResult.requests` or its columns; a fleet's works too), and a
    disaggregated run's `transfers` table (`RunResult.tables`), whose instances' queues `early_overload` judges.
    The result is JSON-safe and independent of any SLO (`probe_passes` applies one). The fractions are in [0, 1) and
    leave a window, else a `KvsimError` (a negative one widened the window into the warm-up, NaN made it NaN); so is
    a table without a column the judging reads (arrival_s, finish_s and status always, `WINDOW_COLUMNS` once two
    requests are servable; request_id, first_token_s, replica and the transfers' with `transfers`).
    """
    for name, fraction in (("warmup_fraction", warmup_fraction), ("tail_fraction", tail_fraction)):
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
            raise KvsimError(f"{name}={shown(fraction)}: expected a fraction of the arrival span in [0, 1)")
    if warmup_fraction + tail_fraction >= 1:
        raise KvsimError(f"warmup_fraction={warmup_fraction:g}, tail_fraction={tail_fraction:g}: leave no window")
    _require("requests", requests, ("arrival_s", "finish_s", "status"))
    arrival, finish = (_seconds(requests, name) for name in ("arrival_s", "finish_s"))
    status = np.asarray(requests["status"])
    rejected = status == "rejected"
    servable = ~rejected
    num_rejected = int(rejected.sum())
    out: dict[str, Any] = {"num_requests": int(len(arrival)), "num_rejected": num_rejected,
                           "rejected_fraction": num_rejected / len(arrival) if len(arrival) else 0.0}
    if servable.sum() < 2:
        return _no_window(out, EMPTY)
    _require("requests", requests, WINDOW_COLUMNS, len(arrival))
    if transfers is not None:
        _require("requests", requests, ("request_id", "first_token_s", "replica"), len(arrival))
        _require("transfers", transfers, ("request_id", "handoff_s", "prefill_replica"))
    t0, t_last = float(arrival[servable].min()), float(arrival[servable].max())
    span = t_last - t0
    handoffs = _handoffs(requests, transfers) if transfers is not None else None
    service_s = _service_s(requests, servable, handoffs[0] if handoffs is not None else None)
    start, end = t0 + max(warmup_fraction * span, WARMUP_SERVICES * service_s), t_last - tail_fraction * span
    end = max(end, start)
    window_s = end - start
    in_window = servable & (arrival >= start) & (arrival < end)
    num_in = int(in_window.sum())
    done = servable & ~np.isnan(finish)
    offered = num_in / window_s if window_s > 0 else math.inf
    served = int((done & (finish >= start) & (finish < end)).sum()) / window_s if window_s > 0 else 0.0
    grid = np.linspace(start, end, NUM_TREND_SAMPLES)
    backlog = (np.searchsorted(np.sort(arrival[servable]), grid, side="right")
               - np.searchsorted(np.sort(finish[done]), grid, side="right"))
    slope, slope_se = _slope(grid - start, backlog) if window_s > 0 else (math.inf, 0.0)
    ratio = served / offered if offered > 0 and math.isfinite(offered) else None
    trend = slope / offered if offered > 0 and math.isfinite(offered) else None
    trend_low = (slope - Z_95 * slope_se) / offered if trend is not None else None
    too_short = window_s < MIN_WINDOW_SERVICES * service_s or num_in < MIN_WINDOW_REQUESTS
    early = (early_overload(requests, servable, start, end, Z_EARLY if too_short else Z_95, handoffs)
             if num_in >= MIN_WINDOW_REQUESTS else None)
    by_replica = replica_outgrew(early)
    queue_outgrew = (early is not None and early["waiting_growth"] > early["margin"]) or by_replica
    if too_short:
        # judged on too few requests or service times: a longer run must decide, unless the queue already
        # grows beyond what a stable one could show
        verdict = OVERLOADED if queue_outgrew else TOO_SHORT
    elif not queue_outgrew:
        verdict = STABLE  # a shortfall or a backlog trend within what a sustainable rate shows by chance
    elif ratio is None or ratio < 1 - THROUGHPUT_TOL:
        verdict = OVERLOADED
    elif trend_low is None or trend_low > TREND_TOL or by_replica:
        verdict = BACKLOGGED  # the fleet's backlog grows, or one replica's does while the others keep up
    else:
        verdict = STABLE
    window_rows = np.flatnonzero(in_window)
    busy_s = finish[window_rows] - np.asarray(requests["first_scheduled_s"], dtype=float)[window_rows]
    outputs = (np.asarray(requests["output_tokens"]) * np.asarray(requests["num_samples"]))
    finished_in = done & (finish >= start) & (finish < end)
    classes = {"by_priority": _class_stats(requests, window_rows)} if "priority" in requests else {}
    return {**out, "verdict": verdict, "window_start_s": start, "window_s": window_s, "num_in_window": num_in,
            "offered_per_s": offered, "served_per_s": served, "served_over_offered": ratio,
            "backlog_trend": trend, "backlog_trend_low": trend_low, "backlog_end": int(backlog[-1]),
            "early_overload": early,
            "mean_service_s": service_s,
            # Little's law over the window: sequences running = throughput × time each spends scheduled
            "mean_running": served * float(np.nanmean(busy_s)) if num_in else 0.0,
            "output_tokens_per_s": float(outputs[finished_in].sum()) / window_s if window_s > 0 else 0.0,
            **{m: metric_stats(np.asarray(requests[m], dtype=float)[window_rows]) for m in SLO_METRICS}, **classes}


def _class_stats(requests: Mapping[str, Any], window_rows: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per priority present in the window (str keys, JSON-safe): each metric's stats over its requests.
    A fleet's table may hold NaN where a replica had no priority column: those requests have priority 0."""
    priority = np.nan_to_num(np.asarray(requests["priority"], dtype=float)[window_rows]).astype(np.int64)
    out = {}
    for value in np.unique(priority):
        rows = window_rows[priority == value]
        out[str(int(value))] = {m: metric_stats(np.asarray(requests[m], dtype=float)[rows]) for m in SLO_METRICS}
    return out


def unjudged(num_requests: int, ran: int, where: str, max_probe_requests: int, whole_trace: bool = False) -> str:
    """Why a search answered nothing when its last probe of `num_requests` (`where`: at what; `ran`: the requests
    its evidence counts) was still too short to judge: the run could not be judged, not the hardware unable to
    serve the traffic; the advice to raise `max_probe_requests` only when that cap stopped the doubling (not the
    memory limit, nor a trace shorter than the probe, `ran` < `num_requests`, or exactly as long, `whole_trace`,
    which no longer probe lengthens)."""
    if ran < num_requests:
        return (f"could not be judged: its probes ran only {ran} requests ({num_requests} asked: the trace holds no "
                f"more) and were too short {where}")
    if whole_trace:
        return f"could not be judged: its probes ran the trace's whole, {ran} requests, and were too short {where}"
    advice = f"; raise max_probe_requests (now {max_probe_requests})" if 2 * num_requests > max_probe_requests else ""
    return f"could not be judged: its {num_requests}-request probes were too short {where}{advice}"
