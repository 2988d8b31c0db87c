"""`kvsim plan --search rate`: size a homogeneous fleet from the highest load one replica sustains.

For each candidate, one replica is simulated on the fleet's traffic slowed down to a fraction
`f` of it (arrivals `1/f` times further apart: a rate process's rate and a trace's
`rate_scale` times `f`, the same requests otherwise, first `probe_requests` of them; a
multi-turn conversation's think time stays as given, only conversations start further apart). `f`
starts at 1 (the whole traffic on one replica), halves until the SLOs are met (or doubles
while they are, up to `1 + capacity_headroom`), then bisects geometrically between the highest
passing and the lowest failing fraction until they are within `rel_tol`
(`kvsim.planning.rate_search.RateBound`, the same growth-and-bisection as `kvsim sweep`'s rate search).
The fleet is then

    replicas = ceil((1 + capacity_headroom) / f_max)      (one replica per f_max of the traffic)

which assumes what the replica-count search verifies by simulating whole fleets: a router
that spreads load evenly (every replica sees about 1/replicas of the traffic) and a workload
whose SLOs do not depend on the fleet as a whole. It costs one single-replica bisection per
candidate instead of a fleet simulation per tried count, so it suits big fleets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvsim.planning.rate_search import RateBound
from kvsim.planning.search import Metrics
from kvsim.workload.scenario import Scenario, make_scenario

if TYPE_CHECKING:
    from kvsim.planning.plan import Candidate, PlanSpec


def slo_values(metrics: Metrics, slo: dict[str, float]) -> dict[str, float]:
    """The measured value of every SLO's metric and statistic (inf when no request produced one)."""
    out = {}
    for key in slo:
        metric, _, stat = key.partition(".")
        value = metrics[metric][stat]
        out[key] = math.inf if value is None else float(value)
    return out


def headroom(metrics: Metrics, slo: dict[str, float]) -> float:
    """min over SLOs of (limit − value) / limit: ≥ 0 means every SLO is met."""
    values = slo_values(metrics, slo)
    return min((limit - values[key]) / limit for key, limit in slo.items())


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
    """The largest fraction of the traffic one replica of `candidate` serves within the SLOs."""

    candidate: Candidate
    base: Scenario
    spec: PlanSpec
    target_rate_per_s: float  # the base traffic's offered request rate
    bound: RateBound = field(default_factory=RateBound)
    results: dict[float, Metrics] = field(default_factory=dict)
    _pending: float | None = None

    @property
    def _enough(self) -> float:
        """A passing fraction at which one replica is the answer: search no higher."""
        return 1.0 + self.spec.capacity_headroom

    def _settled(self) -> bool:
        b = self.bound
        if b.passed >= self._enough:
            return True
        if b.failed is not None and b.failed <= self._enough / self.spec.max_replicas:
            return True  # even max_replicas replicas would each carry more than one can
        return b.settled(1.0, self.spec.rel_tol)

    def next_scenario(self) -> Scenario | None:
        if self._settled():
            self._pending = None
            return None
        fraction = self._pending = min(self.bound.next_rate(1.0), self._enough)
        probe = scaled_traffic(self.base, fraction, min(self.spec.probe_requests, self.base.workload.num_requests))
        return self.candidate.scenario(probe, 1, self.spec.router)

    def observe(self, metrics: Metrics) -> None:
        assert self._pending is not None
        fraction = self._pending
        self.results[fraction] = metrics
        self.bound.num_probes += 1
        if headroom(metrics, self.spec.slo) >= 0:
            self.bound.passed, self.bound.result = fraction, metrics
        else:
            self.bound.failed = fraction

    def row(self, hourly_cost: float | None) -> dict[str, Any]:
        """This candidate's line of the plan table (the same columns as the replica-count search)."""
        c, slo, b = self.candidate, self.spec.slo, self.bound
        row: dict[str, Any] = {"candidate": c.label, "gpu": c.gpu, "tensor_parallel_size": c.tensor_parallel_size,
                               **dict(c.knobs)}
        failed = self.results.get(b.failed) if b.failed is not None else None
        if b.failed is None or failed is None:
            limiting = "none: one replica meets every SLO under all the traffic"
        else:
            failing = [k for k, v in slo_values(failed, slo).items() if v > slo[k]]
            cause = "KV memory (preempting)" if failed["num_preemptions"] else "compute (queueing)"
            limiting = f"{', '.join(failing)} at {b.failed * self.target_rate_per_s:.3g} req/s per replica: {cause}"
        replicas = math.ceil(self._enough / b.passed) if b.passed else None
        if replicas is None or replicas > self.spec.max_replicas:
            worst = failed if failed is not None else self.results[max(self.results)]
            return {**row, "feasible": False, "replicas": None, "num_gpus": None, "cost_per_hour": None,
                    "headroom": headroom(worst, slo), "limiting_factor": f"over {self.spec.max_replicas} replicas; "
                    + limiting, "rate_per_replica": b.passed * self.target_rate_per_s, "capacity_headroom": None,
                    **slo_values(worst, slo)}
        num_gpus = replicas * c.tensor_parallel_size
        return {**row, "feasible": True, "replicas": replicas, "num_gpus": num_gpus,
                "cost_per_hour": num_gpus * hourly_cost if hourly_cost is not None else None,
                "headroom": headroom(b.result, slo), "limiting_factor": limiting,
                "rate_per_replica": b.passed * self.target_rate_per_s,
                "capacity_headroom": replicas * b.passed - 1.0, **slo_values(b.result, slo)}


def offered_rate_per_s(base: Scenario) -> float:
    """The base traffic's request rate: (requests − 1) / (last arrival − first)."""
    import numpy as np

    from kvsim.model.config import load_model
    from kvsim.workload.generate import build_requests

    max_model_len = base.engine.resolved_max_model_len(load_model(base.model))
    arrivals = [r.arrival_s for r in build_requests(base, max_model_len, np.random.default_rng(base.seed))]
    span_s = arrivals[-1] - arrivals[0] if arrivals else 0.0
    return (len(arrivals) - 1) / span_s if span_s > 0 else math.inf
