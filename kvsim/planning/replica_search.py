"""`kvsim plan`'s default search: the fewest replicas of one candidate whose fleet meets the SLOs.

Counts 1, 2, 4, … are tried until one meets every SLO over the steady-state measurement window
(`kvsim.planning.window`), then bisection between the last miss and the first hit; the chosen count is re-run
with `verify_factor` × the requests (`kvsim.planning.verify`), one replica more while that long run fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvsim.model.units import counted
from kvsim.planning.cost import window_output_tokens_per_s
from kvsim.planning.memory import MemoryBound, bounded_by_memory
from kvsim.planning.search import Metrics
from kvsim.planning.slo import headroom, missed_within_noise, probe_passes, shortage, slo_values, why_failed
from kvsim.planning.spec import Candidate, PlanSpec
from kvsim.planning.verify import (
    Verification,
    answer_columns,
    evidence_columns,
    long_run_evidence,
    traffic_of,
    with_requests,
)
from kvsim.planning.window import STABLE, TOO_SHORT, early_overloaded, unjudged
from kvsim.workload.scenario import Scenario


@dataclass(slots=True)
class ReplicaSearch:
    """The fewest replicas of one candidate whose fleet is stable and meets the SLOs over the
    measurement window (`kvsim.planning.steady_state`): doubling, then bisection; then one
    verification run of that fleet with 10× the traffic's requests (`kvsim.planning.verify`).

    A probe errs both ways, and the verification only catches an optimistic one. So once the bisection ends, the
    count just below the answer, where its probe missed an SLO only within that percentile's confidence interval
    (`missed_within_noise`), is run again as long as a verification run (`_long`); if that run meets the SLOs it
    replaces the probe, and the search goes on below it. One seed's toy of `tests/test_metamorphic11.py` missed
    p90 TTFT <= 0.3 s at 3 replicas with 400 requests (0.32 s, interval 0.25–0.41) and answered 4; 3 replicas
    meet it in 2,000- and 4,000-request runs (0.13 s, 0.096 s), as four other seeds' plans answered."""

    candidate: Candidate
    base: Scenario
    spec: PlanSpec
    results: dict[int, Metrics] = field(default_factory=dict)
    verify: Verification = field(init=False)
    num_requests: int = field(init=False)  # per probe: the traffic's, doubled while a window is too short
    memory: MemoryBound = field(init=False)
    cap: int = field(init=False)  # the most replicas (<= max_replicas) whose fleet fits in memory at this length
    _longer: tuple[str, Scenario] | None = None  # a longer run the memory bound ruled out
    _pending: int | None = None
    _long: set[int] = field(default_factory=set)  # counts whose result is a long rerun of a near miss
    _rerun: bool = False  # the pending point is such a rerun

    def __post_init__(self) -> None:
        self.memory = MemoryBound.of(self.spec.memory_limit_bytes)
        self.verify = Verification(self.candidate, self.spec, self.memory)
        self.num_requests = self.base.workload.num_requests
        self.cap = self._most_replicas(self.num_requests)

    def _traffic(self, num_requests: int) -> Scenario:
        return traffic_of(self.base, num_requests)

    def _fleet(self, count: int, num_requests: int) -> Scenario:
        return self.candidate.scenario(self._traffic(num_requests), count, self.spec.router)

    def _most_replicas(self, num_requests: int) -> int:
        return self.memory.most_replicas(lambda n: self._fleet(n, num_requests), self.spec.max_replicas)

    def _ok(self, metrics: Metrics) -> bool:
        return probe_passes(metrics["evidence"], self.spec.slo)

    def _fewest_ok(self) -> int | None:
        ok = [n for n, m in self.results.items() if self._ok(m)]
        return min(ok) if ok else None

    def _next_count(self) -> int | None:
        best = self._fewest_ok()
        misses = [n for n, m in self.results.items() if not self._ok(m) and (best is None or n < best)]
        low = max(misses, default=0)
        if best is None:  # double until a count meets the SLOs (the last try: max_replicas, or what fits in memory)
            if low >= self.cap:
                return None
            return min(self.cap, max(1, 2 * low))
        mid = (low + best) // 2
        return mid if mid > low else None

    def _near_miss(self, traffic: Scenario) -> tuple[int, Scenario] | None:
        """The count just below the answer and its long run, when its probe missed only within noise, it is not
        a long run already, long runs are asked for (`verify_factor`), the run is longer than the probe (a finite
        trace may hold no more requests) and fits in memory; else None."""
        best = self._fewest_ok()
        below = best - 1 if best is not None else 0
        if below < 1 or below in self._long or not self.spec.verify_factor or below not in self.results:
            return None
        long_requests = self.verify.long_requests(traffic, self.num_requests)
        if long_requests <= self.num_requests or not missed_within_noise(self.results[below]["evidence"],
                                                                        self.spec.slo):
            return None  # a finite trace's whole already probed: its rerun would be that probe again
        # the scenario the verification would run at that count, so a rerun that holds is its long run too
        scenario = self.candidate.scenario(with_requests(traffic, long_requests), below, self.spec.router)
        return (below, scenario) if self.memory.fits(scenario) else None

    def next_scenario(self) -> Scenario | None:
        count = self._next_count()
        self._pending = count
        traffic = self._traffic(self.num_requests)
        if count is not None:
            return self.candidate.scenario(traffic, count, self.spec.router)
        if (rerun := self._near_miss(traffic)) is not None:
            self._pending, self._rerun = rerun[0], True
            return rerun[1]
        best = self._fewest_ok()
        return self.verify.next_scenario(traffic, best, self.num_requests,
                                         probe=None if best is None else self.results[best])

    def observe(self, metrics: Metrics) -> None:
        if self._pending is None:
            self.verify.observe(metrics)
            return
        if self._rerun:  # a near miss run long: its verdict, judged as a long run's, replaces the probe's
            self.results[self._pending] = {**metrics, "evidence": long_run_evidence(metrics["evidence"])}
            self._rerun = False
            self._long.add(self._pending)
            return
        ev = metrics["evidence"]
        if (ev["verdict"] == TOO_SHORT and ev["num_requests"] >= self.num_requests
                and 2 * self.num_requests <= self.spec.max_probe_requests
                and self.verify.holds_more(self.base, self.num_requests)):
            longer = self._most_replicas(2 * self.num_requests)
            if longer >= self._pending:
                self.num_requests *= 2  # this traffic is too short to judge a fleet: every count again, longer
                self.cap = longer
                # but a count whose queue already outgrew what a stable one shows fails at any length
                self.results = {n: m for n, m in self.results.items() if early_overloaded(m["evidence"])}
                self._long.clear()
                return
            self._longer = (f"a {2 * self.num_requests}-request run of {counted(self._pending, 'replica')}",
                            self._fleet(self._pending, 2 * self.num_requests))
        self.results[self._pending] = metrics

    def memory_block(self) -> tuple[str, Scenario] | None:
        """What the memory bound kept this search from simulating when that decided its answer (no count
        met the SLOs): (what, its scenario); None when the bound did not decide."""
        if self._fewest_ok() is not None:
            return None
        if not self.results:  # not even one replica fits
            return "1 replica", self._fleet(1, self.num_requests)
        most = max(self.results)
        if most == self.cap < self.spec.max_replicas:
            return counted(most + 1, "replica"), self._fleet(most + 1, self.num_requests)
        return self._longer

    def answer_metrics(self) -> Metrics | None:
        """The run behind the answer: the long run that held, else the probe at the searched count."""
        best = self._fewest_ok()
        if self.verify.held:
            return self.verify.metrics
        return self.results.get(best) if best is not None and not self.verify.attempts else None

    def row(self, hourly_cost: float | None) -> dict[str, Any]:
        """This candidate's line of the plan table: `replicas` is the count whose long run held."""
        best, slo = self._fewest_ok(), self.spec.slo
        block = self.memory_block()
        c = self.candidate
        row: dict[str, Any] = {"candidate": c.label, "gpu": c.gpu, "tensor_parallel_size": c.tensor_parallel_size,
                               **{k: v for k, v in c.knobs}, "feasible": best is not None,
                               "memory_limited": False, "memory_bound_replicas": self.cap, "searched_replicas": best}
        if block is not None and not self.results:  # not even one replica fits in memory
            return {**row, "memory_limited": True, "replicas": None, "num_gpus": None, "cost_per_hour": None,
                    "headroom": None, "limiting_factor": bounded_by_memory(self.memory.over(*block)),
                    **self.verify.columns()}
        replicas = self.verify.replicas(best)
        if best is None or replicas is None:
            count = max(self.results) if best is None else best
            worst = self.results[count] if best is None else self.verify.attempts[-1][1]
            why = (unjudged(self.num_requests, worst["evidence"]["num_requests"],
                            f"up to {counted(count, 'replica')}", self.spec.max_probe_requests,
                            whole_trace=not self.verify.holds_more(self.base, self.num_requests))
                   if best is None and worst["evidence"]["verdict"] == TOO_SHORT else
                   f"{why_failed(worst['evidence'], slo)} even at {counted(count, 'replica')}"
                   f"{missed_trend(self.results, slo)}" if best is None else
                   f"the long run {why_failed(worst['evidence'], slo)} even at "
                   f"{counted(self.verify.attempts[-1][0], 'replica')} ({best} passed the probes)")
            over = (self.memory.over(*block) if block is not None else self.verify.memory_note)
            if over is not None:  # memory kept the search (or the next long run) from a larger count
                row["memory_limited"] = True
                why += "; " + bounded_by_memory(over)
            return {**row, "feasible": False, "replicas": None, "num_gpus": None,
                    "requests_per_probe": self.num_requests, "cost_per_hour": None,
                    "headroom": headroom(worst["evidence"], slo), "limiting_factor": why,
                    "rate_per_replica": None, **evidence_columns(self.results[count]["evidence"], slo),
                    **self.verify.columns()}
        metrics = self.results[best]
        answer = self.answer_metrics() or metrics  # the long run that held (else the probe): the answer's evidence
        failed_long = [(n, m) for n, m in self.verify.attempts if n < replicas]
        below = failed_long[-1] if failed_long else (best - 1, self.results.get(best - 1))
        if below[1] is None:
            limiting = "none: one replica meets every SLO"
        else:
            cause = shortage(below[1]["evidence"], below[1]["num_preemptions"])
            run = "in the long run " if failed_long or below[0] in self._long else ""
            limiting = f"{why_failed(below[1]['evidence'], slo)} {run}at {counted(below[0], 'replica')}: {cause}"
        num_gpus = replicas * c.tensor_parallel_size
        return {**row, "feasible": True, "replicas": replicas, "num_gpus": num_gpus,
                "requests_per_probe": self.num_requests,
                "output_tokens_per_s": window_output_tokens_per_s(answer),
                "cost_per_hour": num_gpus * hourly_cost if hourly_cost is not None else None,
                "headroom": headroom(answer["evidence"], slo), "limiting_factor": limiting,
                "rate_per_replica": metrics["offered_rate_per_s"] / replicas,
                **answer_columns(answer["evidence"], metrics["evidence"], slo), **self.verify.columns()}


def missed_trend(results: dict[int, Metrics], slo: dict[str, float]) -> str:
    """The SLOs the largest count missed, at it and at the count before, when both runs kept up (stable): a value
    that barely falls as the fleet doubles is the requests' own service time, which more replicas do not remove,
    so `misses ttft_s.p90 even at 64 replicas` reads as such. Llama-3.1-70B TP4 on H200s, Mooncake's first 1,500
    requests, p90 TTFT <= 2 s: 2.953 s at 32 replicas, 2.757 s at 64 (no request queued at p90: its long prompts'
    prefill), where the row said only "even at 64 replicas". "" when fewer than two counts ran or one did not keep
    up (its values are queueing's)."""
    counts = sorted(results)[-2:]
    if len(counts) < 2 or any(results[n]["evidence"]["verdict"] != STABLE for n in counts):
        return ""
    before, last = (slo_values(results[n]["evidence"], slo) for n in counts)
    missed = [key for key, value in last.items() if value > slo[key]]
    values = "; ".join(f"{key} {before[key]:.4g} s at {counts[0]}, {last[key]:.4g} s at {counts[1]} replicas, limit "
                       f"{slo[key]:g} s" for key in missed)
    return f" (both stable: {values})" if missed else ""

