"""The highest sustainable request rate: a search over rates and run lengths, each probe judged by
`kvsim.planning.window` (stable over its measurement window, every SLO met).

    search = SteadyRateSearch(start_rate=1.0, num_requests=400)  # then next_probe() / observe(...)
    searches = search_rates(make, num_items, slo, run)            # several at once, a round per batch

The run length is the search's choice (`SteadyRateSearch`): the highest passing rate is found with
N requests, then again with 2N, 4N, …, until it moves less than `converge_tol` (2 %) when the run
doubles, or the cap `max_requests` is reached (then `capped` says so).

A rate found on runs of N requests can still be optimistic: a backlog that grows by well under 1 % of
arrivals, or a queue whose waits creep up, passes N and fails 10 N (the report's default: 3.290 req/s
passed 6,400 requests and missed p90 TTFT ≤ 2 s at 64,000, 2.10 s; 3.191 held, 0.47 s). With
`verify_factor` k > 0 the search therefore ends with **verification**: the answer is run once more
with k × its run length (at most `max_verify_requests`); while that long run fails, the rate backs
off, 3 % (`verify_backoff`) the first time and twice as far each next time; while it holds (and no long
run failed yet, and the long runs are the whole k × a probe, not cut short by `max_verify_requests`), the
rate goes up, first to the short search's lowest failing rate, then 3 %, 6 %, 12 %, … above the highest
held (3 %, 3 %, 6 %, … where the short search failed at no rate above its answer); once long runs have
both held and failed, the rate is bisected between the highest held and the lowest failed to within 3 %
(at most `max_verify_tries` long runs). `rate` is then the highest rate a
long run held (0, with `verified` False, when none did), and `evidence` that long run's.

A long run is judged as a plan's verification judges its fleet's (`kvsim.planning.verify.long_run_evidence`):
one that served under 95 % of its arrivals is *overloaded*, whatever its waiting queue did, and fails. A probe's
verdict lets such a shortfall through while its waiting queue stays within a stable queue's margin, as a short
run's backlog wanders by several % of its arrivals; an overloaded batch engine grows its running set first, which
that margin does not see. One H100 on the default traffic, stability alone (no SLO), 320-request probes: the 10 ×
long runs (6,400 requests) held 18.49 req/s at served ÷ offered 0.909 (p90 TTFT 11.5 s), which 32,000 requests
find backlogged (p90 TTFT 63 s); judged as a long run it fails, and the answer is 16.97 (stable on 32,000, p90
TTFT 0.30 s).

The long runs bracket the answer from both sides because short runs err both ways: a short run can pass an
optimistic rate (above), and miss a percentile SLO by noise below the true limit, which no longer run
revisits once the bisection has moved below it. Checking only downwards left that bias in the answer: an
M/D/1 queue (S = 0.1 s) with p90 TTFT ≤ 1 s sustains ρ = 0.892 (Erlang's waiting-time distribution), and
one seed's search answered 0.759, 15 % low, because its 400- and 800-request probes (the same first 400
arrivals) both missed the SLO by noise at 0.77; its long run held there, and verification stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsim.model.errors import KvsimError, expect_count, expect_function, shown
from kvsim.planning.slo import check_slo, probe_passes
from kvsim.planning.verify import long_run_evidence
from kvsim.planning.window import TOO_SHORT


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
        """The lowest rate that failed at the answer's run length (a failed long run's, when there is one; a
        short probe's failure only above the answer: a long run that held above it refuted it)."""
        failed = [run.rate for run in self.long_runs if not run.passed]
        if failed:
            return min(failed)
        short = (self.answer_level() or self.level).bound.failed
        return short if short is None or short > self.rate else None

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
        lowest failed rate, at most half); while every long run held, each step up goes to the short
        search's lowest failing rate first, then 3 %, 6 %, 12 %, … above the highest held (3 %, 3 %, 6 %, …
        without a short failure above the answer; at most double, never above `max_rate`); once long runs
        have held and failed, bisect between the highest held and the lowest failed until they are within
        one first step (`verify_backoff`). So a short search that was 3 % off either way costs one or two
        more long runs, and one 30 % off a handful, not a rate of 0."""
        if not self.verify_factor or self.search_rate <= 0 or self.search_rate < self.min_rate:
            return None
        held = [run.rate for run in self.long_runs if run.passed]
        failed = [run.rate for run in self.long_runs if not run.passed]
        level = self.answer_level()
        assert level is not None
        num_requests = min(self.verify_factor * level.num_requests, self.max_verify_requests)
        if not self.long_runs:
            rate = self.search_rate
        elif len(self.long_runs) >= self.max_verify_tries:
            return None
        elif held and not failed:
            highest = max(held)
            if highest >= self.max_rate or num_requests < self.verify_factor * level.num_requests:
                return None  # nothing above to try, or "long" runs cut short by max_verify_requests: too short to
                #              overrule the search upwards (a run a few times a probe's still passes optimistic rates)
            short_failed = level.bound.failed  # the answer's level, found above
            if len(held) == 1 and short_failed is not None and short_failed > highest:
                rate = short_failed
            else:
                rate = highest * (1 + min(1.0, self.verify_backoff * 2 ** max(0, len(held) - 2)))
            rate = min(rate, self.max_rate)
        elif held:
            if min(failed) * (1 - self.verify_backoff) <= max(held) * (1 + 1e-9):
                return None
            rate = math.sqrt(max(held) * min(failed))
        else:
            rate = min(failed) * (1 - min(0.5, self.verify_backoff * 2 ** (len(failed) - 1)))
        self._pending, self._verifying = rate, True
        return rate, num_requests

    def observe(self, passed: bool, evidence: Any, too_short: bool | None = None) -> None:
        """The pending probe's outcome. `too_short`: its run was too short to judge the rate (None: read
        from `evidence`'s verdict, which a caller keeping more than the window evidence must pass itself);
        such a probe is not a failure: its level starts again with twice the requests.

        A long run's window evidence (a mapping with a verdict) is judged as a long run's (`long_run_evidence`):
        one that served under 95 % of its arrivals fails, its verdict *overloaded*, though `passed` (a probe's
        judgement, which needs a stable verdict) said it held. Other evidence is kept as given."""
        assert self._pending is not None, "observe follows next_probe"
        if self._verifying:
            if isinstance(evidence, Mapping) and "verdict" in evidence:
                evidence = long_run_evidence(evidence)
                passed = passed and not evidence.get("long_run_shortfall", False)
            self.long_runs.append(LongRun(self._pending, passed, evidence))
            self._pending, self._verifying = None, False
            return
        rate, b = self._pending, self.level.bound
        self.results[(self.level.num_requests, rate)] = evidence
        if too_short is None:
            too_short = _too_short(evidence)
        if too_short and 2 * self.level.num_requests <= self.max_requests:
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


def _check_search(make: object, num_items: object, slo: Mapping[str, float], run: object, start_rate: object,
                  counts: tuple[object, object, object, object]) -> None:
    """`search_rates`' arguments, each a `KvsimError` naming it when it is none, before any probe runs: a notebook's
    `verify_factor=-1` was refused only after the whole search had run, as a long run's `workload.num_requests`
    of minus the answer's requests, and a bad SLO after the first round of probes; `num_items=1.5` and `make=None`
    were TypeErrors."""
    for name, function, num_args, expected in (
            ("make", make, 3, "a function (item, rate, num_requests) -> the probe's scenario"),
            ("run", run, 1, "a function (scenarios) -> each one's window evidence")):
        if function is None:  # `expect_function` lets None through: an optional callback's "none"
            raise KvsimError(f"{name}=None: expected {expected}")
        expect_function(function, name, num_args, expected)
    expect_count(num_items, "num_items", 0, "a count of variants, 0 or more")
    check_slo(slo)
    if isinstance(start_rate, bool) or not isinstance(start_rate, (int, float)) or not 0 < start_rate < math.inf:
        raise KvsimError(f"start_rate={shown(start_rate)}: expected a positive, finite number of requests per second")
    num_requests, max_requests, verify_factor, max_verify_requests = counts
    for name, value in (("num_requests", num_requests), ("max_requests", max_requests),
                        ("max_verify_requests", max_verify_requests)):
        expect_count(value, name, 1, "a count of requests, 1 or more")
    expect_count(verify_factor, "verify_factor", 0, "a whole factor, 0 or more (0: no long run)")


def search_rates(make: Callable[[int, float, int], Any], num_items: int, slo: Mapping[str, float],
                 run: Callable[[list[Any]], Sequence[Mapping[str, Any]]], start_rate: float = 1.0,
                 num_requests: int = 400, max_requests: int = 12_800, verify_factor: int = 0,
                 max_verify_requests: int = 128_000) -> list[SteadyRateSearch]:
    """The sustainable rate of `num_items` variants at once: `make(item, rate, num_requests)` builds a
    probe's scenario, `run(scenarios)` returns each one's `window_evidence` (a round's probes together);
    `verify_factor` > 0 re-runs each answer that much longer, backing off until it holds. Every argument is
    checked before the first probe (`_check_search`)."""
    _check_search(make, num_items, slo, run, start_rate, (num_requests, max_requests, verify_factor,
                                                           max_verify_requests))
    searches = [SteadyRateSearch(start_rate, num_requests, max_requests, verify_factor=verify_factor,
                                 max_verify_requests=max_verify_requests) for _ in range(num_items)]

    def probe(batch: list[tuple[int, float, int]]) -> list[tuple[bool, Any]]:
        evidence = run([make(i, rate, n) for i, rate, n in batch])
        # a `run` of the wrong count paired probes with other probes' evidence, or stopped in zip() (a ValueError)
        if isinstance(evidence, (str, bytes, Mapping)) or not isinstance(evidence, Sequence) \
                or len(evidence) != len(batch):
            raise KvsimError(f"run returned {shown(evidence)}: expected a list of {len(batch)} window evidences, "
                             "one per scenario it was given")
        return [(probe_passes(ev, slo), ev) for ev in evidence]

    drive(searches, probe)
    return searches


def failing_probe(search: SteadyRateSearch) -> tuple[Any, int | None] | None:
    """The lowest failing probe at the answer's run length (what stopped the rate), as (its evidence, the
    requests the search asked of it): the last failed long run's when verification backed off (asked None: its
    evidence counts what it ran), else the short search's at the answer's level (or the level still searching)."""
    failed_long = [run for run in search.long_runs if not run.passed]
    if failed_long:
        return min(failed_long, key=lambda run: run.rate).evidence, None
    level = search.answer_level() or search.level
    failed = search.failed_rate
    evidence = None if failed is None else search.results.get((level.num_requests, failed))
    return None if evidence is None else (evidence, level.num_requests)


def failing_evidence(search: SteadyRateSearch) -> Mapping[str, Any] | None:
    """The evidence of `failing_probe` (None: nothing failed at the answer's run length)."""
    probe = failing_probe(search)
    return None if probe is None else probe[0]
