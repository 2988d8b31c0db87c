"""A plan's answer checked by one long run: the chosen fleet with `verify_factor` (10) × a probe's requests.

A search judges each count or fraction on probes of N requests; a planner signs for the traffic
lasting. So once a candidate's search ends, its chosen fleet is simulated once more, whole, on the
same traffic with 10 × N requests (`PlanSpec.verify_factor`) (a trace gives at most the records it has: the count run is
reported), and that run's steady-state evidence (`kvsim.planning.steady_state`) stands in the
table beside the search's: `verify_*` columns, and `verified` (stable and every SLO met).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvsim.planning.steady_state import SLO_STATS, parse_slo_key, probe_passes, slo_stats, slo_values
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


@dataclass(slots=True)
class Verification:
    """One long run of a candidate's chosen fleet; asked for once, after the search settles."""

    candidate: Candidate
    spec: PlanSpec
    memory: MemoryBound
    metrics: Metrics | None = None
    asked: bool = False
    memory_note: str | None = None  # why the run was not made: its memory floor exceeds the plan's limit

    def next_scenario(self, traffic: Scenario, replicas: int | None, probe_requests: int) -> Scenario | None:
        """The verification run (once), or None: already asked, no feasible fleet to verify, or the run
        would not fit in the plan's memory limit (`memory_note` says so)."""
        if self.asked or replicas is None or probe_requests <= 0 or self.spec.verify_factor == 0:
            return None
        self.asked = True
        num_requests = self.spec.verify_factor * probe_requests
        scenario = self.candidate.scenario(with_requests(traffic, num_requests), replicas, self.spec.router)
        if not self.memory.fits(scenario):
            self.memory_note = self.memory.over(f"the {num_requests}-request verification run", scenario)
            return None
        return scenario

    def observe(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def columns(self) -> dict[str, Any]:
        """`verified` and the long run's evidence as `verify_*` columns (empty values when not run)."""
        if self.metrics is None:
            return {"verified": None, "verify_num_requests": None, "verify_memory": self.memory_note}
        ev = self.metrics["evidence"]
        return {"verified": probe_passes(ev, self.spec.slo), "verify_num_requests": ev["num_requests"],
                "verify_memory": None, **evidence_columns(ev, self.spec.slo, prefix="verify_")}
