"""A plan's answer checked by a long run: the chosen fleet with `verify_factor` (10) × a probe's requests.

A search judges each count or fraction on probes of N requests; a planner signs for the traffic lasting. So once a
candidate's search ends, its chosen fleet is simulated once more, whole, on the same traffic with 10 × N requests
(`PlanSpec.verify_factor`), or a finite trace's whole (`long_requests`: a timestamped trace's rows,
`kvsim.workload.generate.most_requests`). Where that is no more than the probe's N (the search's runs already took
the whole trace), the long run at the searched count would be the search's own probe again, to the same figures: it
is not run, and that probe is the verification (`verify_run` "search", `verify_num_requests` the trace's whole; for
`--search rate`, whose probe is one replica on a fraction of the traffic, the fleet's run of the whole trace is
still a new run and is made). A short probe can be optimistic (a queue growing by under 1 % of arrivals, waits that
creep up), so while the long run fails the search goes on in long runs: the next larger count (one replica more),
up to `max_replicas` (a probe that missed by noise below the answer is the replica search's to rerun:
`kvsim.planning.replica_search`). The answer is the first count whose long run holds; that run's steady-state
evidence (`kvsim.planning.steady_state`) is the row's evidence (its window columns and headroom, `answer_columns`,
and the `verify_*` columns, `verified`: stable and every SLO met), the search's probe is in `search_*` columns,
with `searched_replicas` (the short probes' answer) and `verify_attempts` (each count tried long and whether it
held), `verify_run` "long" (else "search", above).

A count found without simulating the fleet (`--search rate`: one replica's rate, scaled linearly) can be
too large as well: c replicas pool their queues (M/D/c waits less than c × M/D/1 at the same load), so
with `shrink` a long run that holds at the searched count is followed by one replica fewer, on the traffic
`shrink` gives (the rate search's: sped up by its capacity headroom), while those hold, down to `fewest` (the
rate search's 2: one replica is its own probe, already refuted there); the answer is then the fewest replicas
whose long run held, the count below it having failed or being `fewest` (`verify_attempts` e.g.
`6 held, 5 held*, 4 held*, 3 failed*`, * marking the runs on `shrink`'s traffic).

A long run is judged without the waiting-queue veto on its throughput (`long_run_evidence`): one that served under
1 − `THROUGHPUT_TOL` of what was offered is overloaded, whatever its waiting queue did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from kvsim.planning.slo import parse_slo_key, probe_passes, slo_stats, slo_values
from kvsim.planning.window import OVERLOADED, SLO_STATS, STABLE, THROUGHPUT_TOL
from kvsim.workload.generate import most_requests
from kvsim.workload.scenario import Scenario, make_scenario

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kvsim.planning.memory import MemoryBound
    from kvsim.planning.search import Metrics
    from kvsim.planning.spec import Candidate, PlanSpec


def evidence_columns(evidence: Mapping[str, Any], slo: Mapping[str, float], prefix: str = "") -> dict[str, Any]:
    """A probe's evidence as table columns: verdict, window, served/offered, trend, each SLO value and CI."""
    cols: dict[str, Any] = {f"{prefix}verdict": evidence["verdict"], f"{prefix}window_s": evidence["window_s"],
                            f"{prefix}num_in_window": evidence["num_in_window"],
                            f"{prefix}served_over_offered": evidence["served_over_offered"],
                            f"{prefix}backlog_trend": evidence["backlog_trend"],
                            f"{prefix}rejected_fraction": evidence["rejected_fraction"]}
    for key, value in slo_values(evidence, slo).items():
        metric, stat, priority = parse_slo_key(key)
        cols[f"{prefix}{key}"] = value
        stats = slo_stats(evidence, metric, priority)
        if stat != SLO_STATS[0]:  # percentiles carry an order-statistic interval (none without values)
            low, high = stats.get(f"{stat}_ci", (None, None))
            cols[f"{prefix}{key}_ci"] = None if low is None else "–".join(
                "inf" if v is None else f"{v:.4g}" for v in (low, high))
    return cols


def answer_columns(answer: Mapping[str, Any], search: Mapping[str, Any], slo: Mapping[str, float]) -> dict[str, Any]:
    """A feasible row's evidence: the window columns and `evidence_num_requests` from the run behind the printed
    answer (`answer`: the long run of `replicas` that held, else the probe it rests on), and the search's own
    probe (`search`: at `searched_replicas`, or a rate search's one replica at its highest passing fraction) as
    `search_*` columns, so a row whose long run moved the answer up never shows the refuted count's window
    beside it."""
    return {"evidence_num_requests": answer["num_requests"], **evidence_columns(answer, slo),
            "search_num_requests": search["num_requests"], **evidence_columns(search, slo, prefix="search_")}


def long_run_evidence(evidence: Mapping[str, Any]) -> Mapping[str, Any]:
    """A long run's evidence as a verification judges it: a *stable* window that served under 1 − `THROUGHPUT_TOL`
    of what was offered is *overloaded* (`long_run_shortfall` True), the waiting queue's growth notwithstanding.
    The plan's verification (`Verification.observe`, the replica search's near-miss rerun) and the rate search's
    long runs (`kvsim.planning.steady_state.SteadyRateSearch.observe`) judge theirs with it.

    Over a window [a, b) with N arrivals, served ÷ offered is exactly 1 − (B(b) − B(a)) ÷ N, B the backlog (arrived,
    not finished): the λ·W requests a queue holds (Little's law) trail the arrivals at both ends of the window, so
    that lag cancels and a shortfall is the backlog's growth. A stable queue's backlog wanders by an amount that does
    not grow with the run: several % of a short probe's N, which is why a probe's verdict needs its waiting queue
    to outgrow a stable queue's margin as well (`kvsim.planning.window`), and a tenth of that on a run 10 × as long.
    An overloaded batch engine's backlog grows in proportion to N, and first in its running set (admitted at once,
    each step slower), which the waiting queue does not show: one H100 on the default traffic at 19 req/s, 3,200
    requests, read *stable* with served ÷ offered 0.878 (backlog 201 → 471, waiting queue +75 within its margin of
    125, p90 TTFT 4.2 s), and its 16,000-request run is overloaded (p90 TTFT 33 s)."""
    ratio = evidence.get("served_over_offered")
    if evidence["verdict"] != STABLE or ratio is None or ratio >= 1 - THROUGHPUT_TOL:
        return evidence
    return {**evidence, "verdict": OVERLOADED, "long_run_shortfall": True}


def with_requests(base: Scenario, num_requests: int) -> Scenario:
    """`base` with its workload's first `num_requests` requests (a trace yields at most its records)."""
    raw = base.model_dump(mode="json")
    raw["workload"]["num_requests"] = num_requests
    raw["name"] = f"{base.name}/verify{num_requests}"
    return make_scenario(raw, base.base_dir)


def traffic_of(base: Scenario, num_requests: int) -> Scenario:
    """`base` itself when `num_requests` is its own count (the same scenario, so the same point keys), else
    `with_requests(base, num_requests)`: a search's traffic at one run length."""
    return base if num_requests == base.workload.num_requests else with_requests(base, num_requests)


class _Unread(Enum):
    """A memo not yet read, where None is an answer (`Verification`'s `most_requests`: any count can be run)."""

    UNREAD = "unread"


@dataclass(slots=True)
class Verification:
    """The long runs of a candidate's chosen fleet: the searched count first, one replica more while it fails."""

    candidate: Candidate
    spec: PlanSpec
    memory: MemoryBound
    grows: bool = True  # a failed long run is retried one replica larger (False: a fixed fleet, an xPyD split)
    # a held long run is followed by one replica fewer on shrink(traffic, requests) while they hold (None: never)
    shrink: Callable[[Scenario, int], Scenario] | None = None
    fewest: int = 1  # the fewest replicas a run on `shrink`'s traffic may have (fewer are known to fail)
    attempts: list[tuple[int, Metrics]] = field(default_factory=list)  # (replicas, long run's metrics)
    memory_note: str | None = None  # why a long run was not made: its memory floor exceeds the plan's limit
    search_run: bool = False  # the verification is the search's probe: the trace held no more requests
    _most: int | None | _Unread = _Unread.UNREAD  # the traffic's `most_requests`, once read
    _count: int | None = None

    def _most_requests(self, traffic: Scenario) -> int | None:
        """`most_requests(traffic)`, read once: every run of a plan takes the same trace."""
        if self._most is _Unread.UNREAD:
            self._most = most_requests(traffic)
        return self._most

    def long_requests(self, traffic: Scenario, probe_requests: int) -> int:
        """A long run's requests: `verify_factor` × `probe_requests`, at most what `traffic` holds (a timestamped
        trace's rows: `most_requests`)."""
        most, num_requests = self._most_requests(traffic), self.spec.verify_factor * probe_requests
        return num_requests if most is None else min(num_requests, most)

    def holds_more(self, traffic: Scenario, num_requests: int) -> bool:
        """Whether a run of `traffic` can take more than `num_requests` requests: a probe that took a finite trace's
        whole is not doubled (the longer run would be the same requests again, to the same figures)."""
        most = self._most_requests(traffic)
        return most is None or most > num_requests

    def next_scenario(self, traffic: Scenario, replicas: int | None, probe_requests: int,
                      probe: Metrics | None = None) -> Scenario | None:
        """The next long run, or None: nothing to verify, not asked for, held (with `shrink`: held down to `fewest`
        replicas, or one fewer failed), failed at `max_replicas` (or once one held), or the run would not fit in
        the plan's memory limit (`memory_note` says so; no other count is tried). `probe`: the passing probe of
        `replicas` on `traffic` with `probe_requests`, when a run of that fleet on that traffic is that probe;
        if the long run would take no more requests (a finite trace), it is the first attempt (`search_run`)."""
        if (replicas is None or probe_requests <= 0 or self.spec.verify_factor == 0
                or self.memory_note is not None):
            return None
        count, fewer = replicas, False
        if self.attempts:
            last, metrics = self.attempts[-1]
            if probe_passes(metrics["evidence"], self.spec.slo):
                if self.shrink is None or last <= self.fewest or len(self._held()) < len(self.attempts):
                    return None  # no shrinking asked for, nothing worth running below, or the count below failed
                count, fewer = last - 1, True
            elif self._held() or last >= self.spec.max_replicas or not self.grows:
                return None
            else:
                count = last + 1
        num_requests = self.long_requests(traffic, probe_requests)
        if probe is not None and not self.attempts and num_requests <= probe_requests:
            self.attempts.append((count, probe))  # the same requests again would give the same figures
            self.search_run = True
            return None
        long_traffic = (self.shrink(traffic, num_requests) if fewer and self.shrink is not None
                        else with_requests(traffic, num_requests))
        scenario = self.candidate.scenario(long_traffic, count, self.spec.router)
        if not self.memory.fits(scenario):
            self.memory_note = self.memory.over(f"the {num_requests}-request verification run", scenario)
            return None
        self._count = count
        return scenario

    def observe(self, metrics: Metrics) -> None:
        """A long run's metrics, its evidence judged as a long run's (`long_run_evidence`)."""
        assert self._count is not None, "observe follows next_scenario"
        self.attempts.append((self._count, {**metrics, "evidence": long_run_evidence(metrics["evidence"])}))
        self._count = None

    def _held(self) -> list[tuple[int, Metrics]]:
        return [(n, m) for n, m in self.attempts if probe_passes(m["evidence"], self.spec.slo)]

    def _answer(self) -> tuple[int, Metrics] | None:
        """The long run behind the answer: the fewest replicas that held, else the last run (None: none ran)."""
        held = self._held()
        if held:
            return min(held, key=lambda attempt: attempt[0])
        return self.attempts[-1] if self.attempts else None

    @property
    def metrics(self) -> Metrics | None:
        """The answer's long run's metrics (the fewest replicas that held), else the last long run's (None: none
        ran)."""
        answer = self._answer()
        return None if answer is None else answer[1]

    @property
    def shrunk(self) -> bool:
        """Whether the answer's long run is one of `shrink`'s: fewer replicas than the first long run, on the
        traffic `shrink` gave (not the base traffic)."""
        answer = self._answer()
        return answer is not None and answer[0] < self.attempts[0][0]

    @property
    def held(self) -> bool | None:
        """Whether a long run held (None: none ran)."""
        return None if not self.attempts else bool(self._held())

    def replicas(self, searched: int | None) -> int | None:
        """The answer: the fewest replicas whose long run held; `searched` when none ran; None when none held."""
        if not self.attempts:
            return searched
        answer = self._answer()
        return answer[0] if answer is not None and self.held else None

    def columns(self) -> dict[str, Any]:
        """`verified` and the long run's evidence as `verify_*` columns (empty values when not run); `verify_run`
        says which run that is: "long", or "search" (the search's probe, the trace holding no more requests)."""
        if self.metrics is None:
            return {"verified": None, "verify_num_requests": None, "verify_attempts": None,
                    "verify_run": None, "verify_memory": self.memory_note}
        ev = self.metrics["evidence"]
        first = self.attempts[0][0]  # runs below the first count are on `shrink`'s traffic: marked *
        tried = ", ".join(f"{n} {'held' if probe_passes(m['evidence'], self.spec.slo) else 'failed'}"
                          f"{'*' if n < first else ''}" for n, m in self.attempts)
        return {"verified": self.held, "verify_num_requests": ev["num_requests"], "verify_attempts": tried,
                "verify_run": "search" if self.search_run else "long", "verify_memory": self.memory_note,
                **evidence_columns(ev, self.spec.slo, prefix="verify_")}
