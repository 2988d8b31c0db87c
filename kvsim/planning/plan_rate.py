"""`kvsim plan --search rate`: size a homogeneous fleet from the highest load one replica sustains.

For each candidate, one replica is simulated on the fleet's traffic slowed down to a fraction
`f` of it (arrivals `1/f` times further apart: a rate process's rate and a trace's
`rate_scale` times `f`, the same requests otherwise, first `probe_requests` of them (or the
traffic's count if smaller) at first; a
multi-turn conversation's think time stays as given, only conversations start further apart). A
fraction passes when the replica is stable there and meets the SLOs over the measurement window
(`kvsim.planning.steady_state`); `f` starts at 1 (the whole traffic on one replica), halves until
a probe passes (or doubles while they do, up to `1 + capacity_headroom`), bisects, and the run
length doubles until `f` moves less than 2 % (`SteadyRateSearch`, capped at `max_probe_requests`).
The fleet is then

    replicas = ceil((1 + capacity_headroom) / f_max)      (one replica per f_max of the traffic)

which assumes what the replica-count search verifies by simulating whole fleets: a router
that spreads load evenly (every replica sees about 1/replicas of the traffic) and a workload
whose SLOs do not depend on the fleet as a whole. It is a linear bound: c replicas pool their queues
(Erlang: M/D/4 with single-slot replicas of 0.1 s meets p90 TTFT ≤ 0.25 s up to 35.7 req/s, 5.6× M/D/1's
6.35), so it over-sizes where pooling helps. It costs single-replica bisections per candidate instead of a
fleet simulation per tried count, so it suits big fleets; the chosen fleet is then simulated as a whole with
10× a probe's requests (`kvsim.planning.verify`): one replica more while that long run fails, and, when it
holds, one replica fewer on the traffic sped up by 1 + `capacity_headroom` while those hold, down to 2 (one
replica is the search's own probe, which a fraction of at most 1 + `capacity_headroom` failed wherever the answer
is 2 or more), so the answer is the fewest replicas the fleet itself was seen to hold with that spare capacity
(the count below failing, or 2).
The row's window columns and headroom are that fleet's long run (the one-replica probe that set the rate is
in `search_*` columns, `kvsim.planning.verify.answer_columns`); with `verify_factor` 0 no fleet is
simulated and the row says its count is the linear bound.

`rate_per_replica` (and a failed probe's rate in `limiting_factor`) is the rate the probe's own arrivals
offered one replica, (requests − 1) / (last arrival − first): not `f` times the base traffic's rate, whose
first few hundred arrivals estimate a Poisson rate only to ±1/√n (shared-prompt-5000x100: 16.9 req/s of
its 20), while the probes run thousands.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvsim.model.units import counted
from kvsim.planning.cost import window_output_tokens_per_s
from kvsim.planning.memory import MemoryBound, bounded_by_memory
from kvsim.planning.search import Metrics
from kvsim.planning.slo import headroom, probe_passes, shortage, why_failed
from kvsim.planning.steady_state import SteadyRateSearch, failing_probe
from kvsim.planning.verify import Verification, answer_columns, evidence_columns
from kvsim.planning.window import TOO_SHORT, unjudged
from kvsim.workload.scenario import Scenario, make_scenario

if TYPE_CHECKING:
    from kvsim.planning.spec import Candidate, PlanSpec


def scaled_traffic(base: Scenario, fraction: float, num_requests: int) -> Scenario:
    """`base` with its arrivals slowed to `fraction` of their rate and its first `num_requests` requests."""
    raw = base.model_dump(mode="json")
    workload = raw["workload"]
    workload["num_requests"] = num_requests
    if workload["arrival"]["process"] == "trace" or (workload["trace"] or {}).get("format") == "servegen":
        workload["trace"]["rate_scale"] *= fraction
    else:
        workload["arrival"]["rate"] *= fraction
    raw["name"] = f"{base.name}/traffic{fraction:.6g}"
    return make_scenario(raw, base.base_dir)


@dataclass(slots=True)
class RateSearch:
    """The largest fraction of the traffic one replica of `candidate` sustains within the SLOs
    (`kvsim.planning.steady_state.SteadyRateSearch` over the fraction, from `probe_requests` a probe,
    doubling until the fraction moves < 2 %), then the chosen fleet's long runs (`Verification`): one replica more
    while they fail; where the first holds, one fewer on the traffic sped up by `spare` while they hold, down to 2."""

    candidate: Candidate
    base: Scenario
    spec: PlanSpec
    search: SteadyRateSearch = field(init=False)
    verify: Verification = field(init=False)
    memory: MemoryBound = field(init=False)
    cap: int = field(init=False)  # the most replicas (<= max_replicas) whose fleet fits in memory on the traffic
    first_probe_fits: bool = field(init=False)  # False: nothing is simulated (the memory bound)
    _pending: tuple[float, int] | None = None

    def __post_init__(self) -> None:
        self.memory = MemoryBound.of(self.spec.memory_limit_bytes)
        self.cap = self.memory.most_replicas(lambda n: self.candidate.scenario(self.base, n, self.spec.router),
                                             self.spec.max_replicas)
        enough = spare = self.spare  # a passing fraction at which one replica is the answer
        # never down to one replica: that fleet is the search's own probe, which failed a fraction of at most
        # `spare` wherever the answer is 2 or more (else ceil(spare / f) = 1), so its long run could only fail
        self.verify = Verification(self.candidate, self.spec, self.memory,
                                   shrink=lambda traffic, n: scaled_traffic(traffic, spare, n), fewest=2)
        first = first_probe_requests(self.base, self.spec)  # then doubled as it converges
        # a probe's run length doubles only while the probe fits in memory and the traffic holds more requests than
        # the probe before it took (`Verification.holds_more`, as the replica search doubles): a probe that took a
        # finite trace's whole was doubled into the same rows again, a level of probes to the same figures
        longest = longest_probe(first, self.spec.max_probe_requests, lambda n: self.verify.holds_more(self.base, n // 2)
                                and self.memory.fits(self._probe(n)))
        self.first_probe_fits = self.memory.fits(self._probe(first))
        self.search = SteadyRateSearch(1.0, first, max_requests=longest, first_tol=self.spec.rel_tol,
                                       max_rate=enough, min_rate=enough / max(1, self.cap))

    @property
    def spare(self) -> float:
        """1 + `capacity_headroom`: the traffic a fleet of the answer's size must hold, as a multiple of the
        base traffic (the fraction one replica must pass to be the answer alone; the speed-up of the long runs
        below the searched count)."""
        return 1.0 + self.spec.capacity_headroom

    def _probe(self, num_requests: int) -> Scenario:
        """A one-replica probe of `num_requests` (its memory does not depend on the traffic's fraction)."""
        return self.candidate.scenario(scaled_traffic(self.base, 1.0, num_requests), 1, self.spec.router)

    @property
    def replicas(self) -> int | None:
        fraction = self.search.rate
        if not fraction or fraction < self.search.min_rate:
            return None
        replicas = math.ceil(self.search.max_rate / fraction)
        return replicas if replicas <= self.cap else None

    def next_scenario(self) -> Scenario | None:
        if not self.first_probe_fits or self.cap == 0:
            return None
        if self._pending is None or self._pending[1] > 0:
            probe = self.search.next_probe()
            if probe is not None:
                fraction, n = self._pending = probe
                return self.candidate.scenario(scaled_traffic(self.base, fraction, n), 1, self.spec.router)
        self._pending = (0.0, 0)
        level = self.search.answer_level()
        return self.verify.next_scenario(self.base, self.replicas, level.num_requests if level else 0)

    def observe(self, metrics: Metrics) -> None:
        assert self._pending is not None
        if self._pending[1] > 0:
            evidence = metrics["evidence"]  # the search keeps the whole metrics: it cannot read the verdict itself
            self.search.observe(probe_passes(evidence, self.spec.slo), metrics,
                                too_short=evidence["verdict"] == TOO_SHORT)
        else:
            self.verify.observe(metrics)

    def memory_block(self) -> tuple[str, Scenario] | None:
        """What the memory bound kept this search from simulating when that decided its answer: (what, its
        scenario), or None (`ReplicaSearch.memory_block`)."""
        if not self.first_probe_fits:
            first = self.search.levels[0].num_requests
            return f"a {first}-request probe of 1 replica", self._probe(first)
        if self.replicas is None and self.cap < self.spec.max_replicas:
            count = self.cap + 1
            return counted(count, "replica"), self.candidate.scenario(self.base, count, self.spec.router)
        return None

    def answer_metrics(self) -> Metrics | None:
        """The run behind the answer: the long run that held (a single-replica probe is not the fleet)."""
        return self.verify.metrics if self.verify.held else None

    def output_tokens_per_s(self) -> float | None:
        """The chosen fleet's output tokens a second in steady state (None: no answer): its long run's
        (`window_output_tokens_per_s`); without one (`verify_factor` 0, no fleet is simulated) the answer probe's,
        which served the fraction f of the traffic on one replica, ÷ f: the fleet serves all of it. A long run
        below the searched count served the traffic sped up by `spare`, so its rate is ÷ `spare`: the fleet
        serves the traffic, and `usd_per_million_output_tokens` prices those tokens."""
        answer = self.answer_metrics()
        if answer is not None:
            return window_output_tokens_per_s(answer) / (self.spare if self.verify.shrunk else 1.0)
        probe, fraction = self.search.evidence, self.search.rate
        return window_output_tokens_per_s(probe) / fraction if probe is not None and fraction > 0 else None

    def row(self, hourly_cost: float | None) -> dict[str, Any]:
        """This candidate's line of the plan table (the same columns as the replica-count search)."""
        c, slo, s = self.candidate, self.spec.slo, self.search
        row: dict[str, Any] = {"candidate": c.label, "gpu": c.gpu, "tensor_parallel_size": c.tensor_parallel_size,
                               **dict(c.knobs), "memory_limited": False, "memory_bound_replicas": self.cap}
        block = self.memory_block()
        if block is not None and not s.results:  # not even one replica, or its first probe, fits in memory
            return {**row, "feasible": False, "memory_limited": True, "replicas": None, "num_gpus": None,
                    "cost_per_hour": None, "headroom": None,
                    "limiting_factor": bounded_by_memory(self.memory.over(*block)), **self.verify.columns()}
        probe = failing_probe(s)
        failed, asked = probe if probe is not None else (None, None)
        unjudged_rate = failed is not None and failed["evidence"]["verdict"] == TOO_SHORT  # at the longest probe
        if s.rate >= s.max_rate:
            limiting = "none: one replica sustains all the traffic within every SLO"
        elif failed is None:
            limiting = "nothing sustainable"
        elif unjudged_rate:  # a failure only as the search counts it: not over capacity, nor over any count
            ran = failed["evidence"]["num_requests"]  # a long run was asked what it ran
            limiting = unjudged(ran if asked is None else asked, ran,
                                f"at {failed['offered_rate_per_s']:.3g} req/s per replica",
                                self.spec.max_probe_requests, whole_trace=not self.verify.holds_more(self.base, ran))
        else:
            cause = shortage(failed["evidence"], failed["num_preemptions"])
            limiting = (f"{why_failed(failed['evidence'], slo)} at {failed['offered_rate_per_s']:.3g} req/s per "
                        f"replica: {cause}")
        searched = self.replicas
        replicas = self.verify.replicas(searched)
        row["searched_replicas"] = searched
        found = s.evidence
        if replicas is None:
            worst = found or failed or next(iter(s.results.values()))
            if searched is not None:  # the search found a count; its long runs failed
                count, long_run = self.verify.attempts[-1]
                worst = long_run
                why = (f"the long run {why_failed(long_run['evidence'], slo)} even at {counted(count, 'replica')} "
                       f"({searched} from the rate search)")
                if self.verify.memory_note is not None:  # and the next count's long run would not fit
                    row["memory_limited"] = True
                    why += "; " + bounded_by_memory(self.verify.memory_note)
            elif block is not None:  # the bound is memory's, not max_replicas'
                row["memory_limited"] = True
                memory = bounded_by_memory(self.memory.over(*block))
                why = f"over {counted(self.cap, 'replica')} ({memory}); " + limiting
            else:
                why = limiting if unjudged_rate else f"over {counted(self.spec.max_replicas, 'replica')}; " + limiting
            return {**row, "feasible": False, "replicas": None, "num_gpus": None, "cost_per_hour": None,
                    "headroom": headroom(worst["evidence"], slo),
                    "limiting_factor": why,
                    "rate_per_replica": found["offered_rate_per_s"] if found else 0.0, "capacity_headroom": None,
                    **evidence_columns(worst["evidence"], slo), **search_columns(s), **self.verify.columns()}
        assert searched is not None  # long runs start from the searched count: none ran without one
        num_gpus = replicas * c.tensor_parallel_size
        held = self.answer_metrics()  # the fleet's long run that held, if one did
        answer = held or found  # (else the one-replica probe)
        on_probe = s.rate if held is None else None  # the probe's fraction: no long run held
        if replicas > searched:
            failed_long = (counted(searched, "replica") if searched == replicas - 1
                           else f"{searched}..{replicas - 1} replicas")
            limiting += f"; the long run failed at {failed_long}"
        elif replicas < searched:  # the fleet pools: fewer replicas than one replica's rate implies
            limiting += pooled_note(replicas, searched, self.spare,
                                    any(n == replicas - 1 for n, _ in self.verify.attempts))
        elif self.verify.held is None and searched > 1:
            limiting += (f"; a linear bound, ceil({self.spare:g} / f) from one replica's rate: "
                         "the fleet was not simulated, and pooling can need fewer")
        return {**row, "feasible": True, "replicas": replicas, "num_gpus": num_gpus,
                "cost_per_hour": num_gpus * hourly_cost if hourly_cost is not None else None,
                "headroom": headroom(answer["evidence"], slo),
                "limiting_factor": limiting,
                "rate_per_replica": found["offered_rate_per_s"],
                # the spare capacity: linear from one replica's rate, or what fewer replicas' long runs showed
                "capacity_headroom": (replicas * s.rate - 1.0 if replicas >= searched
                                      else self.spec.capacity_headroom),
                **answer_columns(answer["evidence"], found["evidence"], slo),
                # the run behind the window columns, as a rerun needs it: a long run below the searched count
                # served the traffic sped up by `spare`; without a long run (`verify_factor` 0) they are the
                # one-replica probe's, on the fraction f of the traffic
                "evidence_replicas": replicas if on_probe is None else 1,
                "evidence_traffic_scale": on_probe or (self.spare if self.verify.shrunk else 1.0),
                **search_columns(s), **self.verify.columns()}


def pooled_note(replicas: int, searched: int, spare: float, below_failed: bool) -> str:
    """The limiting factor's note on a fleet whose long runs held `spare` × the traffic on fewer `replicas` than
    the `searched` count one replica's rate implied; `below_failed`: one replica fewer was run long and failed
    (it was not run where its long run would not fit the memory limit)."""
    fewer = f", {replicas - 1} did not" if below_failed else ""
    return (f"; {counted(replicas, 'replica')} held {spare:g}× the traffic in a long run (the fleet pools its "
            f"queues){fewer}; one replica's rate implied {searched}")


def search_columns(search: SteadyRateSearch) -> dict[str, Any]:
    """How the rate search ended: requests per probe behind the answer, converged or capped, probes."""
    level = search.answer_level()
    return {"requests_per_probe": level.num_requests if level else None, "converged": search.converged,
            "capped": search.capped, "num_probes": search.summary()["num_probes"]}


def first_probe_requests(base: Scenario, spec: PlanSpec) -> int:
    """The requests of a rate search's first probe: the traffic's first `probe_requests`, or all of it where it has
    fewer (then doubled as the search converges, `longest_probe`)."""
    return min(spec.probe_requests, base.workload.num_requests)


def longest_probe(first: int, max_probe_requests: int, fits: Callable[[int], bool] = lambda _: True) -> int:
    """The most requests a rate search's probe runs: its first probe's `first`, doubled while twice as many are at
    most `max_probe_requests` and `fits` them (`SteadyRateSearch` doubles a probe too short to judge up to it)."""
    longest = first
    while 2 * longest <= max_probe_requests and fits(2 * longest):
        longest *= 2
    return longest


def arrivals_s(base: Scenario) -> list[float]:
    """The arrival instants of the base traffic's requests, in order."""
    import numpy as np

    from kvsim.model.config import load_model
    from kvsim.workload.generate import build_requests

    max_model_len = base.engine.resolved_max_model_len(load_model(base.model))
    return [r.arrival_s for r in build_requests(base, max_model_len, np.random.default_rng(base.seed))]


def offered_rate_per_s(base: Scenario) -> float:
    """The base traffic's request rate: (requests − 1) / (last arrival − first); inf without a span (one
    request, or all arriving at one instant: `kvsim.planning.plan_checks.check_candidates` refuses a plan's such)."""
    return _rate_per_s(arrivals_s(base))


def _rate_per_s(arrivals: list[float]) -> float:
    span_s = arrivals[-1] - arrivals[0] if arrivals else 0.0
    return (len(arrivals) - 1) / span_s if span_s > 0 else math.inf


ARRIVAL_NAMES = {"poisson": "Poisson", "gamma": "gamma", "constant": "constant"}


def sized_traffic(base: Scenario) -> str:
    """The traffic a plan sizes every fleet for, for `kvsim plan`'s terminal: its rate in req/s and where that comes
    from. A timestamped trace's (or ServeGen's) is the rate its run's arrivals offer (`offered_rate_per_s`: its first
    `num_requests`, from `start_s`, times `rate_scale`); Poisson, gamma or constant arrivals offer the rate asked,
    `workload.arrival.rate`. The answer named no rate at all."""
    w = base.workload
    if w.arrival.process == "trace" or (w.trace is not None and w.trace.format == "servegen"):
        assert w.trace is not None
        arrivals = arrivals_s(base)
        start = f" from start_s={w.trace.start_s:g}" if w.trace.start_s else ""
        scale = f", times workload.trace.rate_scale={w.trace.rate_scale:g}" if w.trace.rate_scale != 1 else ""
        return (f"{_rate_per_s(arrivals):,.4g} req/s, the arrivals of {w.trace.path}: its first "  # 2 or more
                f"{len(arrivals):,} requests{start} over {arrivals[-1] - arrivals[0]:,.4g} s{scale}")
    assert w.arrival.rate is not None
    cv = f" (cv {w.arrival.cv:g})" if w.arrival.process == "gamma" else ""
    return f"{w.arrival.rate:,.4g} req/s, {ARRIVAL_NAMES[w.arrival.process]} arrivals{cv} at workload.arrival.rate"
