"""`kvsim plan --xpyd 1P1D,2P1D`: disaggregated prefill/decode splits beside the colocated fleets.

Each split of each candidate shape (GPU × TP × engine knobs) is one fixed fleet: x prefill and y
decode instances of that shape (`kvsim.fleet.disagg`; every instance at the candidate's TP, so it
uses (x + y) · TP GPUs and costs that many GPU-hours an hour), serving the whole traffic. It is
judged exactly as a replica count of a colocated fleet is: stable and every SLO met over the
steady-state window (`kvsim.planning.steady_state`, on the client's TTFT, TPOT and E2E, which for a
split include the KV transfer), the run doubled while the window is too short (up to
`max_probe_requests`, and only while the longer run fits in the memory limit), then verified by one
run with `verify_factor` × the requests (`kvsim.planning.verify`). Its row has the colocated rows'
columns, so `kvsim.planning.plan.rank` orders all of them by cost under the SLOs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvsim.planning.cost import window_output_tokens_per_s
from kvsim.planning.memory import MemoryBound, bounded_by_memory
from kvsim.planning.slo import headroom, probe_passes, why_failed
from kvsim.planning.verify import Verification, answer_columns, evidence_columns, traffic_of
from kvsim.planning.window import TOO_SHORT, unjudged

if TYPE_CHECKING:
    from kvsim.planning.search import Metrics
    from kvsim.planning.spec import Candidate, PlanSpec
    from kvsim.workload.scenario import Scenario


@dataclass(slots=True)
class XpydSearch:
    """One xPyD split (`candidate.split`) judged on the traffic, then verified (module docstring)."""

    candidate: Candidate
    base: Scenario
    spec: PlanSpec
    metrics: Metrics | None = None  # the judged run (None until it is in)
    num_requests: int = field(init=False)  # per run: the traffic's, doubled while a window is too short
    memory: MemoryBound = field(init=False)
    verify: Verification = field(init=False)
    _blocked: tuple[str, Scenario] | None = None  # a run the memory bound ruled out

    def __post_init__(self) -> None:
        assert self.candidate.split is not None
        self.memory = MemoryBound.of(self.spec.memory_limit_bytes)
        self.verify = Verification(self.candidate, self.spec, self.memory, grows=False)
        self.num_requests = self.base.workload.num_requests

    @property
    def split_text(self) -> str:
        assert self.candidate.topology is not None
        return self.candidate.topology

    def _traffic(self, num_requests: int) -> Scenario:
        return traffic_of(self.base, num_requests)

    def _fleet(self, num_requests: int) -> Scenario:
        return self.candidate.scenario(self._traffic(num_requests), self.candidate.smallest_fleet, self.spec.router)

    def _passes(self) -> bool:
        return self.metrics is not None and probe_passes(self.metrics["evidence"], self.spec.slo)

    def next_scenario(self) -> Scenario | None:
        if self.metrics is None:
            if self._blocked is not None:
                return None
            fleet = self._fleet(self.num_requests)
            if not self.memory.fits(fleet):
                self._blocked = (f"{self.split_text} ({self.num_requests} requests)", fleet)
                return None
            return fleet
        passes = self._passes()
        return self.verify.next_scenario(self._traffic(self.num_requests),
                                         self.candidate.smallest_fleet if passes else None, self.num_requests,
                                         probe=self.metrics if passes else None)

    def observe(self, metrics: Metrics) -> None:
        if self.metrics is not None:
            self.verify.observe(metrics)
            return
        ev = metrics["evidence"]
        if (ev["verdict"] == TOO_SHORT and ev["num_requests"] >= self.num_requests
                and 2 * self.num_requests <= self.spec.max_probe_requests
                and self.verify.holds_more(self.base, self.num_requests)):
            longer = self._fleet(2 * self.num_requests)
            if self.memory.fits(longer):
                self.num_requests *= 2  # too short to judge: the same split again, twice as long
                return
            self._blocked = (f"a {2 * self.num_requests}-request run of {self.split_text}", longer)
        self.metrics = metrics

    def answer_metrics(self) -> Metrics | None:
        """None: a split's gap to the colocated floor is not broken down (`kvsim.planning.plan.answer_floor`)."""
        return None

    def memory_block(self) -> tuple[str, Scenario] | None:
        """What the memory bound kept this split from simulating when that decided its answer, or None."""
        return None if self._passes() else self._blocked

    def row(self, hourly_cost: float | None) -> dict[str, Any]:
        """This split's line of the plan table (the colocated rows' columns, plus the pools' sizes)."""
        c, slo = self.candidate, self.spec.slo
        assert c.split is not None
        block = self.memory_block()
        row: dict[str, Any] = {"candidate": c.label, "gpu": c.gpu, "tensor_parallel_size": c.tensor_parallel_size,
                               **dict(c.knobs), "feasible": self._passes(), "memory_limited": block is not None,
                               "memory_bound_replicas": None, **c.split_columns()}
        if self.metrics is None:
            assert block is not None
            return {**row, "replicas": None, "num_gpus": None, "cost_per_hour": None, "headroom": None,
                    "limiting_factor": bounded_by_memory(self.memory.over(*block)), **self.verify.columns()}
        ev = self.metrics["evidence"]
        common = {"requests_per_probe": self.num_requests, "headroom": headroom(ev, slo),
                  **evidence_columns(ev, slo), **self.verify.columns()}
        if not self._passes():
            limiting = (unjudged(self.num_requests, ev["num_requests"], f"at {self.split_text}",
                                 self.spec.max_probe_requests,
                                 whole_trace=not self.verify.holds_more(self.base, self.num_requests))
                        if ev["verdict"] == TOO_SHORT else f"{why_failed(ev, slo)} at {self.split_text}")
            if block is not None:
                limiting += "; " + bounded_by_memory(self.memory.over(*block))
            return {**row, "replicas": None, "num_gpus": None, "cost_per_hour": None, "limiting_factor": limiting,
                    "rate_per_replica": None, **common}
        instances = c.smallest_fleet
        if self.verify.replicas(instances) is None:  # the long run failed: a split does not grow
            long_run = self.verify.attempts[-1][1]["evidence"]
            return {**row, "feasible": False, "replicas": None, "num_gpus": None, "cost_per_hour": None,
                    "limiting_factor": f"the long run {why_failed(long_run, slo)} at {self.split_text} (the probes "
                                       "passed)", "rate_per_replica": None, **common}
        num_gpus = instances * c.tensor_parallel_size
        answer = self.verify.metrics if self.verify.held else self.metrics  # the long run when it held
        assert answer is not None
        return {**row, "replicas": instances, "num_gpus": num_gpus,
                "cost_per_hour": num_gpus * hourly_cost if hourly_cost is not None else None,
                "limiting_factor": f"none: {c.split[0]} prefill + {c.split[1]} decode instances meet every SLO",
                "rate_per_replica": self.metrics["offered_rate_per_s"] / instances,
                "output_tokens_per_s": window_output_tokens_per_s(answer), **common,
                "headroom": headroom(answer["evidence"], slo), **answer_columns(answer["evidence"], ev, slo)}
