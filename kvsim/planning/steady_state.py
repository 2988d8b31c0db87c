"""Is a request rate sustainable? The one test every rate, fleet size and cost figure is built on.

    evidence = window_evidence(result.requests)                  # JSON-safe, SLO-independent
    ok = probe_passes(evidence, {"ttft_s.p90": 2.0})             # stable and every SLO met
    ok = probe_passes(evidence, {"ttft_s.p90@0": 0.5})           # ... over priority-0 requests only
    search = SteadyRateSearch(start_rate=1.0, num_requests=400)  # then next_probe() / observe(...)

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
  is left to the longer runs of the search to settle);
- **stable**: neither.

A rate passes only when its probe is stable *and* every SLO percentile, taken over the servable
requests that arrived inside the window, is within its limit. An SLO may name one priority class,
`METRIC.STAT@PRIORITY` (vLLM's integer request priority, as the summary's `by_priority` keys it):
its percentile is then taken over the window's requests of that priority only (`parse_slo_key`).
Each percentile comes with a 95 % order-statistic confidence interval (the ranks n·p ∓
1.96·√(n·p·(1−p)) of the sorted sample, the normal approximation of the binomial): latencies of
neighbouring requests are correlated in a queue, so read it as a lower bound on the uncertainty.
Requests the engine refuses (prompt over `max_model_len`, more KV than the pool ever holds) are
counted apart: neither offered nor SLO misses.

The run length is the search's choice (`SteadyRateSearch`): the highest passing rate is found with
N requests, then again with 2N, 4N, …, until it moves less than `converge_tol` (2 %) when the run
doubles, or the cap `max_requests` is reached (then `capped` says so).

A rate found on runs of N requests can still be optimistic: a backlog that grows by well under 1 % of
arrivals, or a queue whose waits creep up, passes N and fails 10 N (the report's default: 3.290 req/s
passed 6,400 requests and missed p90 TTFT ≤ 2 s at 64,000, 2.10 s; 3.191 held, 0.47 s). With
`verify_factor` k > 0 the search therefore ends with **verification**: the answer is run once more
with k × its run length (at most `max_verify_requests`); while that long run fails, the rate backs
off, 3 % (`verify_backoff`) the first time and twice as far each next time, and once a long run holds
it is bisected against the lowest failed one to within 3 % (at most `max_verify_tries` long runs).
`rate` is then the highest rate a long run held (0, with `verified` False, when none did), and
`evidence` that long run's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SLO_METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")
SLO_KEY_FORMAT = "METRIC.STAT or METRIC.STAT@PRIORITY"
SLO_STATS = ("mean", "p50", "p90", "p99")
STABLE, BACKLOGGED, OVERLOADED, EMPTY = "stable", "backlogged", "overloaded", "no servable requests"
TOO_SHORT = "too short"
WARMUP_FRACTION = 0.2  # of the arrival span, left out at the start (the system starts empty)
WARMUP_SERVICES = 3.0  # ... and at least this many service times (first scheduled → finish): the fill-up
MIN_WINDOW_SERVICES = 10.0  # a window shorter than this many service times cannot show a steady state
MIN_WINDOW_REQUESTS = 50
TAIL_FRACTION = 0.1  # of the arrival span, left out before the last arrival (its requests see the load thin out)
THROUGHPUT_TOL = 0.05  # served ÷ offered must be at least 1 − this
TREND_TOL = 0.01  # backlog slope ÷ offered rate must be at most this: 1 % of arrivals may not pile up
NUM_TREND_SAMPLES = 64
Z_95 = 1.959964


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


def _stats(values: np.ndarray) -> dict[str, Any]:
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


def _service_s(requests: Mapping[str, Any], servable: np.ndarray) -> float:
    """The median time a request runs once scheduled (first scheduled → finish), over the requests never
    preempted when there are any: a preempted request's time includes its wait to be re-admitted, which
    grows without bound in an overloaded run and would say nothing about how long serving one takes."""
    busy = np.asarray(requests["finish_s"], float) - np.asarray(requests["first_scheduled_s"], float)
    calm = servable & (np.asarray(requests["num_preemptions"]) == 0) if "num_preemptions" in requests else servable
    chosen = busy[calm if calm.any() else servable]
    chosen = chosen[~np.isnan(chosen)]
    return float(np.median(chosen)) if len(chosen) else 0.0


def window_evidence(requests: Mapping[str, Any], warmup_fraction: float = WARMUP_FRACTION,
                    tail_fraction: float = TAIL_FRACTION) -> dict[str, Any]:
    """What one run says about steady state: window, counts, served ÷ offered, backlog trend, verdict,
    and latency percentiles with CIs over the servable requests that arrived in the window.

    `requests`: a run's requests table (`RunResult.requests` or its columns; a fleet's works too).
    The result is JSON-safe and independent of any SLO (`probe_passes` applies one).
    """
    arrival = np.asarray(requests["arrival_s"], dtype=float)
    finish = np.asarray(requests["finish_s"], dtype=float)
    status = np.asarray(requests["status"])
    rejected = status == "rejected"
    servable = ~rejected
    num_rejected = int(rejected.sum())
    out: dict[str, Any] = {"num_requests": int(len(arrival)), "num_rejected": num_rejected,
                           "rejected_fraction": num_rejected / len(arrival) if len(arrival) else 0.0}
    if servable.sum() < 2:
        return {**out, "verdict": EMPTY, "window_s": 0.0, "num_in_window": 0, "offered_per_s": 0.0,
                "served_per_s": 0.0, "served_over_offered": None, "backlog_trend": None,
                **{m: _stats(np.zeros(0)) for m in SLO_METRICS}}
    t0, t_last = float(arrival[servable].min()), float(arrival[servable].max())
    span = t_last - t0
    service_s = _service_s(requests, servable)
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
    if window_s < MIN_WINDOW_SERVICES * service_s or num_in < MIN_WINDOW_REQUESTS:
        verdict = TOO_SHORT  # judged on too few requests or service times: a longer run must decide
    elif ratio is None or ratio < 1 - THROUGHPUT_TOL:
        verdict = OVERLOADED
    elif trend_low is None or trend_low > TREND_TOL:
        verdict = BACKLOGGED
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
            "mean_service_s": service_s,
            # Little's law over the window: sequences running = throughput × time each spends scheduled
            "mean_running": served * float(np.nanmean(busy_s)) if num_in else 0.0,
            "output_tokens_per_s": float(outputs[finished_in].sum()) / window_s if window_s > 0 else 0.0,
            **{m: _stats(np.asarray(requests[m], dtype=float)[window_rows]) for m in SLO_METRICS}, **classes}


def _class_stats(requests: Mapping[str, Any], window_rows: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per priority present in the window (str keys, JSON-safe): each metric's stats over its requests.
    A fleet's table may hold NaN where a replica had no priority column: those requests have priority 0."""
    priority = np.nan_to_num(np.asarray(requests["priority"], dtype=float)[window_rows]).astype(np.int64)
    out = {}
    for value in np.unique(priority):
        rows = window_rows[priority == value]
        out[str(int(value))] = {m: _stats(np.asarray(requests[m], dtype=float)[rows]) for m in SLO_METRICS}
    return out


def parse_slo_key(key: str) -> tuple[str, str, int | None]:
    """`ttft_s.p90` → ("ttft_s", "p90", None); `ttft_s.p90@1` → ("ttft_s", "p90", 1): the SLO over priority-1
    requests. A malformed key raises `ValueError` naming it."""
    name, at, cls = key.partition("@")
    metric, _, stat = name.partition(".")
    if metric not in SLO_METRICS or stat not in SLO_STATS:
        raise ValueError(f"{key!r}: expected {SLO_KEY_FORMAT} with METRIC in {SLO_METRICS}, STAT in {SLO_STATS}")
    if not at:
        return metric, stat, None
    try:
        return metric, stat, int(cls)
    except ValueError:
        raise ValueError(f"{key!r}: the class after '@' must be an integer request priority, got {cls!r}") from None


def slo_stats(evidence: Mapping[str, Any], metric: str, priority: int | None) -> Mapping[str, Any]:
    """The window's stats of `metric`, over every request or over one priority's (empty when none arrived).
    A run whose table has no `priority` column gave every request priority 0."""
    if priority is None or ("by_priority" not in evidence and priority == 0):
        return evidence[metric]
    return evidence.get("by_priority", {}).get(str(priority), {}).get(metric) or _stats(np.zeros(0))


def slo_values(evidence: Mapping[str, Any], slo: Mapping[str, float]) -> dict[str, float]:
    """Each SLO's measured value over the window, or over its class's requests there (inf when none
    produced one)."""
    out = {}
    for key in slo:
        metric, stat, priority = parse_slo_key(key)
        value = slo_stats(evidence, metric, priority)[stat]
        out[key] = math.inf if value is None else float(value)
    return out


def headroom(evidence: Mapping[str, Any], slo: Mapping[str, float]) -> float:
    """min over SLOs of (limit − value) ÷ limit: ≥ 0 means every SLO is met in the window (inf: no SLO)."""
    values = slo_values(evidence, slo)
    return min(((limit - values[key]) / limit for key, limit in slo.items()), default=math.inf)


def probe_passes(evidence: Mapping[str, Any], slo: Mapping[str, float]) -> bool:
    """Stable over the window and every SLO within its limit there (no SLO: stability alone, the capacity)."""
    return evidence["verdict"] == STABLE and headroom(evidence, slo) >= 0


@dataclass(slots=True)
class RateBound:
    """`passed`: the highest rate whose probe passed (0 if none); `failed`: the lowest that failed (None
    before one has); `result`: the probe's evidence at `passed`."""

    passed: float = 0.0
    failed: float | None = None
    result: Any = None
    num_probes: int = 0


@dataclass(slots=True)
class Level:
    """One run length's search: the bracket of the highest passing rate with `num_requests` per probe."""

    num_requests: int
    bound: RateBound = field(default_factory=RateBound)
    start_rate: float = 1.0
    step: float = 2.0  # growth factor until the bracket closes

    def next_rate(self) -> float:
        b = self.bound
        if b.failed is None:
            return b.passed * self.step if b.passed else self.start_rate
        if b.passed == 0.0:
            low = b.failed / self.step
            return low if low > 0 else b.failed / 2
        return math.sqrt(b.passed * b.failed)


@dataclass(slots=True)
class SteadyRateSearch:
    """The highest rate whose probe passes, with the run length grown until the answer converges.

    Drive it: `while (probe := s.next_probe()) is not None: s.observe(run_and_judge(*probe))`, where a
    probe is (rate, num_requests) and `observe` takes (passed, evidence). Level 0 doubles/halves from
    `start_rate`, then bisects to `first_tol`; each later level doubles the requests, brackets the
    previous answer with steps of `1 + 2·rel_tol` (squared at each further step the same way, up to 2)
    and bisects to `rel_tol`. Done when two levels agree within `converge_tol`, or the next level
    would exceed `max_requests` (`capped`), or nothing passes even at `start_rate · 2^-20` (rate 0).
    """

    start_rate: float
    num_requests: int
    max_requests: int = 64_000
    rel_tol: float = 0.01
    first_tol: float = 0.05
    converge_tol: float = 0.02
    max_rate: float = math.inf  # a passing rate this high ends a level: nothing more is asked for
    min_rate: float = 0.0  # a failing rate this low ends the search: nothing useful passes
    verify_factor: int = 0  # > 0: the answer re-run with this × its run length, backed off until it holds
    max_verify_requests: int = 128_000
    verify_backoff: float = 0.03
    max_verify_tries: int = 12
    levels: list[Level] = field(default_factory=list)
    results: dict[tuple[int, float], Any] = field(default_factory=dict)
    long_runs: list[LongRun] = field(default_factory=list)  # the verification runs, in order
    converged: bool = False
    capped: bool = False
    _pending: float | None = None
    _verifying: bool = False

    def __post_init__(self) -> None:
        self.levels.append(Level(self.num_requests, start_rate=self.start_rate))

    @property
    def level(self) -> Level:
        return self.levels[-1]

    def answer_level(self) -> Level | None:
        """The longest level whose search has finished (its passing rate is the answer)."""
        done = [lv for lv in self.levels if self._level_done(lv)]
        return done[-1] if done else None

    @property
    def search_rate(self) -> float:
        """The search's answer before verification: the highest passing rate of the longest finished level."""
        level = self.answer_level()
        return level.bound.passed if level else 0.0

    @property
    def verified(self) -> bool | None:
        """Whether a long run held the answer (None: no verification asked for, or nothing to verify)."""
        if not self.long_runs:
            return None
        return any(run.passed for run in self.long_runs)

    def _best_long_run(self) -> LongRun | None:
        held = [run for run in self.long_runs if run.passed]
        return max(held, key=lambda run: run.rate) if held else None

    @property
    def rate(self) -> float:
        """The answer: the highest rate a long run held when verifying (0 if none held), else `search_rate`."""
        if self.long_runs:
            best = self._best_long_run()
            return best.rate if best else 0.0
        return self.search_rate

    @property
    def evidence(self) -> Any:
        """The evidence behind `rate`: the long run's when verifying, else the passing probe's (None: none)."""
        if self.long_runs:
            best = self._best_long_run()
            return best.evidence if best else None
        level = self.answer_level()
        return level.bound.result if level else None

    @property
    def failed_rate(self) -> float | None:
        """The lowest rate that failed at the answer's run length (a failed long run's, when there is one)."""
        failed = [run.rate for run in self.long_runs if not run.passed]
        if failed:
            return min(failed)
        return (self.answer_level() or self.level).bound.failed

    def _level_done(self, lv: Level) -> bool:
        b, tol = lv.bound, self.first_tol if lv is self.levels[0] else self.rel_tol
        if b.passed >= self.max_rate or (b.failed is not None and b.failed <= self.min_rate):
            return True
        if b.failed is None:
            return False
        if b.passed == 0.0:
            return b.failed <= self.start_rate * 2.0**-20
        return b.failed <= b.passed * (1 + tol)

    def next_probe(self) -> tuple[float, int] | None:
        if self.converged or self.capped:
            return self._next_long_run()
        if self._level_done(self.level):
            if self.level.bound.passed == 0.0 or self.level.bound.passed < self.min_rate:
                self.converged = True  # nothing (useful) passes, however long the run
                return None
            if len(self.levels) > 1:
                before, now = self.levels[-2].bound.passed, self.level.bound.passed
                if before > 0 and abs(now - before) / before < self.converge_tol:
                    self.converged = True
                    return self._next_long_run()
            if 2 * self.level.num_requests > self.max_requests:
                self.capped = True
                return self._next_long_run()
            self.levels.append(Level(2 * self.level.num_requests, start_rate=self.level.bound.passed,
                                     step=1 + 2 * self.rel_tol))
        rate = self._pending = min(self.level.next_rate(), self.max_rate)
        return rate, self.level.num_requests

    def _next_long_run(self) -> tuple[float, int] | None:
        """The next verification run (rate, requests), or None: not asked for, nothing to verify, or done.

        Back-off: while every long run failed, each step down is twice the last (3 %, 6 %, 12 %, … of the
        lowest failed rate, at most half); once one held, bisect between it and the lowest failed rate
        until they are within one first step (`verify_backoff`). So a short search that was 3 % optimistic
        costs one more long run, and one that was 30 % optimistic a handful, not a rate of 0."""
        if not self.verify_factor or self.search_rate <= 0 or self.search_rate < self.min_rate:
            return None
        held = [run.rate for run in self.long_runs if run.passed]
        failed = [run.rate for run in self.long_runs if not run.passed]
        if not self.long_runs:
            rate = self.search_rate
        elif len(self.long_runs) >= self.max_verify_tries:
            return None
        elif held:
            if not failed or min(failed) * (1 - self.verify_backoff) <= max(held) * (1 + 1e-9):
                return None
            rate = math.sqrt(max(held) * min(failed))
        else:
            rate = min(failed) * (1 - min(0.5, self.verify_backoff * 2 ** (len(failed) - 1)))
        level = self.answer_level()
        assert level is not None
        self._pending, self._verifying = rate, True
        return rate, min(self.verify_factor * level.num_requests, self.max_verify_requests)

    def observe(self, passed: bool, evidence: Any) -> None:
        assert self._pending is not None, "observe follows next_probe"
        if self._verifying:
            self.long_runs.append(LongRun(self._pending, passed, evidence))
            self._pending, self._verifying = None, False
            return
        rate, b = self._pending, self.level.bound
        self.results[(self.level.num_requests, rate)] = evidence
        if _too_short(evidence) and 2 * self.level.num_requests <= self.max_requests:
            # the run cannot judge this rate: this level starts again, twice as long, from this rate
            lv = self.level
            self.levels[-1] = Level(2 * lv.num_requests, RateBound(num_probes=lv.bound.num_probes + 1), rate, lv.step)
            self._pending = None
            return
        b.num_probes += 1
        if b.num_probes > 1 and (b.failed is None if passed else b.passed == 0.0):
            self.level.step = min(self.level.step**2, 2.0)  # still not bracketed: take longer strides
        if passed:
            b.passed, b.result = rate, evidence
        else:
            b.failed = rate if b.failed is None else min(b.failed, rate)
        self._pending = None

    def summary(self) -> dict[str, Any]:
        """The answer and how it was reached (JSON-safe)."""
        level = self.answer_level()
        return {"rate_per_s": self.rate, "search_rate_per_s": self.search_rate, "converged": self.converged,
                "capped": self.capped, "num_requests": level.num_requests if level else self.num_requests,
                "rates_by_length": {lv.num_requests: lv.bound.passed for lv in self.levels if self._level_done(lv)},
                "num_probes": sum(lv.bound.num_probes for lv in self.levels), "verified": self.verified,
                "long_runs": [{"rate_per_s": run.rate, "passed": run.passed,
                               "num_requests": run.evidence["num_requests"] if isinstance(run.evidence, Mapping)
                               else None} for run in self.long_runs],
                "evidence": self.evidence}


@dataclass(frozen=True, slots=True)
class LongRun:
    """One verification run of a search's answer: the rate, whether it passed, its evidence."""

    rate: float
    passed: bool
    evidence: Any


def _too_short(evidence: Any) -> bool:
    return isinstance(evidence, Mapping) and evidence.get("verdict") == TOO_SHORT


def drive(searches: Sequence[SteadyRateSearch],
          run: Callable[[list[tuple[int, float, int]]], Sequence[tuple[bool, Any]]], max_rounds: int = 200) -> None:
    """Run several searches to their end, one probe of each per round: `run` gets (search index, rate,
    num_requests) triples and returns (passed, evidence) for each (so a round can go to many workers)."""
    for _ in range(max_rounds):
        todo = [(i, *probe) for i, s in enumerate(searches) if (probe := s.next_probe()) is not None]
        if not todo:
            return
        for (i, _, _), (passed, evidence) in zip(todo, run(todo), strict=True):
            searches[i].observe(passed, evidence)
    raise RuntimeError(f"steady-state rate search did not settle in {max_rounds} rounds")


def search_rates(make: Callable[[int, float, int], Any], num_items: int, slo: Mapping[str, float],
                 run: Callable[[list[Any]], Sequence[Mapping[str, Any]]], start_rate: float = 1.0,
                 num_requests: int = 400, max_requests: int = 12_800, verify_factor: int = 0,
                 max_verify_requests: int = 128_000) -> list[SteadyRateSearch]:
    """The sustainable rate of `num_items` variants at once: `make(item, rate, num_requests)` builds a
    probe's scenario, `run(scenarios)` returns each one's `window_evidence` (a round's probes together);
    `verify_factor` > 0 re-runs each answer that much longer, backing off until it holds."""
    searches = [SteadyRateSearch(start_rate, num_requests, max_requests, verify_factor=verify_factor,
                                 max_verify_requests=max_verify_requests) for _ in range(num_items)]

    def probe(batch: list[tuple[int, float, int]]) -> list[tuple[bool, Any]]:
        evidence = run([make(i, rate, n) for i, rate, n in batch])
        return [(probe_passes(ev, slo), ev) for ev in evidence]

    drive(searches, probe)
    return searches


def failing_evidence(search: SteadyRateSearch) -> Mapping[str, Any] | None:
    """The evidence of the lowest failing probe at the answer's run length (what stopped the rate): the
    last failed long run's when verification backed off."""
    failed_long = [run for run in search.long_runs if not run.passed]
    if failed_long:
        return min(failed_long, key=lambda run: run.rate).evidence
    level = search.answer_level() or search.level
    failed = level.bound.failed
    return None if failed is None else search.results.get((level.num_requests, failed))


def why_failed(evidence: Mapping[str, Any] | None, slo: Mapping[str, float]) -> str | None:
    """'is overloaded' / 'is backlogged' when the system was not stable, else 'misses' and the SLOs missed."""
    if evidence is None:
        return None
    if evidence["verdict"] != STABLE:
        return f"is {evidence['verdict']}"
    missed = [k for k, v in slo_values(evidence, slo).items() if v > slo[k]]
    return "misses " + ", ".join(missed) if missed else None
