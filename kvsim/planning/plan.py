"""`kvsim plan`: the cheapest fleet that meets latency SLOs for a given traffic.

    spec = PlanSpec(slo={"ttft_s.p90": 2.0, "tpot_s.p90": 0.1}, gpus=["h100-80gb", "h200"],
                    tensor_parallel_sizes=[1, 2], engine={"max_num_seqs": [128, 256]})
    rows = plan(base_scenario, spec, out_dir)          # ranked, cheapest first

The base scenario's workload is the whole fleet's traffic (a trace, or a rate and a length
mix). Each candidate (GPU × TP × engine knobs) gets the fewest replicas that meet every SLO
at that traffic: counts 1, 2, 4, … are tried until one meets it, then bisection between the
last miss and the first hit. This assumes that adding a replica never breaks an SLO (more
replicas, less load each), which holds for the load-aware routers and round robin alike.

For each candidate the table gives the cost per hour (replicas × TP × the GPU's hourly
price), GPUs, replicas, the headroom (the smallest relative slack of an SLO at that count),
and the limiting factor: the SLO that failed with one replica fewer, and whether that
fleet was short of KV memory (it preempted) or of compute (it only queued).

`search: rate` sizes a homogeneous fleet instead from the highest load one replica sustains
(`kvsim.planning.plan_rate`): one single-replica bisection per candidate, then
`replicas = ceil((1 + capacity_headroom) · target rate / max rate per replica)`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvsim.model.errors import KvsimError, from_validation_error
from kvsim.planning.plan_rate import RateSearch, headroom, offered_rate_per_s, slo_values
from kvsim.planning.search import Metrics, PointStore, run_searches
from kvsim.workload.scenario import Scenario, make_scenario

SLO_METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")
SLO_STATS = ("mean", "p50", "p90", "p99")
ROUTERS = ("round_robin", "least_outstanding", "least_kv", "affinity")


class PlanSpec(BaseModel):
    """What to search: SLOs (`metric.stat: seconds`), candidate GPUs, TP sizes, engine knob grid."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    slo: dict[str, float] = Field(min_length=1)
    gpus: list[str] = Field(min_length=1)
    tensor_parallel_sizes: list[int] = Field(default=[1], min_length=1)
    engine: dict[str, list[Any]] = Field(default_factory=dict)
    max_replicas: int = Field(default=64, gt=0, le=4096)
    router: str = "least_outstanding"
    gpu_hourly_cost: dict[str, float] = Field(default_factory=dict)
    search: Literal["replicas", "rate"] = "replicas"  # bisect the replica count, or the rate one replica takes
    capacity_headroom: float = Field(default=0.1, ge=0, le=10)  # rate search: spare capacity kept, a fraction
    rel_tol: float = Field(default=0.05, gt=0, le=1)  # rate search: bisect until failing/passing <= 1 + rel_tol
    probe_requests: int = Field(default=2000, gt=0)  # rate search: the workload's first requests per probe

    @field_validator("slo")
    @classmethod
    def _known_slos(cls, slo: dict[str, float]) -> dict[str, float]:
        for key, limit in slo.items():
            metric, _, stat = key.partition(".")
            if metric not in SLO_METRICS or stat not in SLO_STATS:
                raise ValueError(f"{key!r}: expected METRIC.STAT with METRIC in {SLO_METRICS}, STAT in {SLO_STATS}")
            if not limit > 0:
                raise ValueError(f"{key}={limit}: must be positive (seconds)")
        return slo

    @field_validator("router")
    @classmethod
    def _known_router(cls, router: str) -> str:
        if router not in ROUTERS:
            raise ValueError(f"router={router!r}: expected one of {', '.join(ROUTERS)}")
        return router

    @field_validator("tensor_parallel_sizes")
    @classmethod
    def _positive_tp(cls, sizes: list[int]) -> list[int]:
        if any(tp <= 0 for tp in sizes):
            raise ValueError(f"{sizes}: tensor-parallel sizes must be positive")
        return sizes

    @field_validator("gpu_hourly_cost")
    @classmethod
    def _positive_cost(cls, costs: dict[str, float]) -> dict[str, float]:
        for gpu, cost in costs.items():
            if not cost > 0:
                raise ValueError(f"{gpu}={cost}: an hourly cost must be positive")
        return costs

    @model_validator(mode="after")
    def _costs_for_candidates(self) -> PlanSpec:
        """A price for a GPU that is not a candidate is a typo or a forgotten `--gpu`: refuse it."""
        stray = sorted(set(self.gpu_hourly_cost) - set(self.gpus))
        if stray:
            raise ValueError(f"gpu_hourly_cost names {stray[0]!r}, which is not a candidate GPU "
                             f"(gpus: {', '.join(self.gpus)})")
        return self


def make_plan_spec(raw: dict[str, Any]) -> PlanSpec:
    try:
        return PlanSpec(**raw)
    except ValidationError as error:
        raise from_validation_error(error, prefix="plan") from None


@dataclass(frozen=True, slots=True)
class Candidate:
    """One deployment shape: GPU, tensor-parallel size and engine settings (replica count searched)."""

    gpu: str
    tensor_parallel_size: int
    knobs: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        knobs = "".join(f" {k}={v}" for k, v in self.knobs)
        return f"{self.gpu} tp{self.tensor_parallel_size}{knobs}"

    def scenario(self, base: Scenario, replicas: int, router: str) -> Scenario:
        """The base scenario's traffic on `replicas` replicas of this candidate behind `router`."""
        raw = base.model_dump(mode="json")
        raw["engine"] = {**raw["engine"], "tensor_parallel_size": self.tensor_parallel_size, **dict(self.knobs)}
        raw.update(gpu=self.gpu, replicas=replicas, router={**raw["router"], "policy": router},
                   name=f"{base.name}/{self.label.replace(' ', '_')}/x{replicas}")
        return make_scenario(raw, base.base_dir)


def candidates(spec: PlanSpec) -> list[Candidate]:
    """Every combination of GPU, TP size and engine knob values, in the order given."""
    names = list(spec.engine)
    grid = itertools.product(*(spec.engine[name] for name in names))
    knob_sets = [tuple(zip(names, values, strict=True)) for values in grid]
    return [Candidate(gpu, tp, knobs) for gpu in spec.gpus for tp in spec.tensor_parallel_sizes for knobs in knob_sets]


def check_candidates(base: Scenario, spec: PlanSpec) -> None:
    """Refuse, before any cluster starts or folder is made, a candidate whose GPU is unknown or
    whose engine knobs do not make a valid scenario (a `KvsimError` naming the field)."""
    from kvsim.model.config import load_gpu

    for gpu in dict.fromkeys(spec.gpus):
        load_gpu(gpu)
    for candidate in candidates(spec):
        candidate.scenario(base, 1, spec.router)


def point_metrics(scenario: Scenario) -> Metrics:
    """Simulate one fleet and keep what the plan needs (small, JSON-safe; runs on a Dask worker)."""
    from kvsim.fleet.driver import simulate_fleet

    summary = simulate_fleet(scenario).summary
    keep = ("num_replicas", "num_gpus", "num_requests", "num_finished", "num_rejected", "duration_s",
            "requests_per_s", "output_tokens_per_s", "ttft_s", "tpot_s", "e2e_s", "queue_s", "num_preemptions",
            "kv_cache_usage_mean", "prefix_cache_hit_rate", "offered_rate_per_s")
    return {key: summary[key] for key in keep}


@dataclass(slots=True)
class ReplicaSearch:
    """The fewest replicas of one candidate meeting the SLOs: doubling, then bisection."""

    candidate: Candidate
    base: Scenario
    spec: PlanSpec
    results: dict[int, Metrics] = field(default_factory=dict)
    _pending: int | None = None

    def _fewest_ok(self) -> int | None:
        ok = [n for n, m in self.results.items() if headroom(m, self.spec.slo) >= 0]
        return min(ok) if ok else None

    def _next_count(self) -> int | None:
        best = self._fewest_ok()
        misses = [n for n, m in self.results.items() if headroom(m, self.spec.slo) < 0 and (best is None or n < best)]
        low = max(misses, default=0)
        if best is None:  # double until a count meets the SLOs (the last try is max_replicas)
            if low >= self.spec.max_replicas:
                return None
            return min(self.spec.max_replicas, max(1, 2 * low))
        mid = (low + best) // 2
        return mid if mid > low else None

    def next_scenario(self) -> Scenario | None:
        count = self._next_count()
        self._pending = count
        return None if count is None else self.candidate.scenario(self.base, count, self.spec.router)

    def observe(self, metrics: Metrics) -> None:
        assert self._pending is not None
        self.results[self._pending] = metrics

    def row(self, hourly_cost: float | None) -> dict[str, Any]:
        """This candidate's line of the plan table."""
        best, slo = self._fewest_ok(), self.spec.slo
        c = self.candidate
        row: dict[str, Any] = {"candidate": c.label, "gpu": c.gpu, "tensor_parallel_size": c.tensor_parallel_size,
                               **{k: v for k, v in c.knobs}, "feasible": best is not None}
        if best is None:
            worst = self.results[max(self.results)]
            failing = [k for k, v in slo_values(worst, slo).items() if v > slo[k]]
            return {**row, "replicas": None, "num_gpus": None, "cost_per_hour": None, "headroom": headroom(worst, slo),
                    "limiting_factor": f"misses {', '.join(failing)} even at {max(self.results)} replicas",
                    "rate_per_replica": None, **{k: v for k, v in slo_values(worst, slo).items()}}
        metrics = self.results[best]
        below = self.results.get(best - 1)
        if below is None:
            limiting = "none: one replica meets every SLO"
        else:
            failing = [k for k, v in slo_values(below, slo).items() if v > slo[k]]
            cause = "KV memory (preempting)" if below["num_preemptions"] else "compute (queueing)"
            limiting = f"{', '.join(failing)} at {best - 1} replicas: {cause}"
        num_gpus = best * c.tensor_parallel_size
        return {**row, "replicas": best, "num_gpus": num_gpus,
                "cost_per_hour": num_gpus * hourly_cost if hourly_cost is not None else None,
                "headroom": headroom(metrics, slo), "limiting_factor": limiting,
                "rate_per_replica": metrics["offered_rate_per_s"] / best, **slo_values(metrics, slo)}


def rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Feasible first, then by cost per hour (GPUs when a price is missing), then more headroom."""
    def key(row: dict[str, Any]) -> tuple:
        cost = row["cost_per_hour"]
        return (not row["feasible"], cost is None, cost if cost is not None else 0.0,
                row["num_gpus"] or 0, -row["headroom"])
    return [{"rank": i + 1, **row} for i, row in enumerate(sorted(rows, key=key))]


def plan(base: Scenario, spec: PlanSpec, out_dir: str | Path, client: Any = None,
         on_point: Any = None) -> tuple[list[dict[str, Any]], int]:
    """Search every candidate; returns the ranked rows and how many points were simulated now.

    Finished points are kept in `out_dir/points.jsonl`, so a rerun resumes where it stopped.
    """
    if base.replicas is not None:
        raise KvsimError(f"replicas={base.replicas!r}: plan searches the replica count; remove it from the scenario")
    for candidate in candidates(spec):  # bad knob values fail here, before any simulation
        candidate.scenario(base, 1, spec.router)
    searches: list[ReplicaSearch] | list[RateSearch]
    if spec.search == "rate":
        target_rate_per_s = offered_rate_per_s(base)
        searches = [RateSearch(c, base, spec, target_rate_per_s) for c in candidates(spec)]
    else:
        searches = [ReplicaSearch(c, base, spec) for c in candidates(spec)]
    store = PointStore(Path(out_dir) / "points.jsonl")
    simulated = run_searches(searches, point_metrics, store, client, on_point)
    rows = [s.row(spec.gpu_hourly_cost.get(s.candidate.gpu)) for s in searches]
    return rank(rows), simulated


def _assignments(items: list[str], flag: str) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise KvsimError(f"{flag} {item!r}: expected NAME=VALUE")
        pairs.append((key.strip(), value.strip()))
    return pairs


def spec_from_options(raw: dict[str, Any], slo: list[str], gpus: list[str], tp_sizes: list[int], knobs: list[str],
                      costs: list[str], max_replicas: int | None, router: str | None,
                      search: str | None = None) -> PlanSpec:
    """A `PlanSpec` from a spec file's mapping (may be empty) with command-line flags on top."""
    import yaml

    raw = dict(raw)
    for key, value in _assignments(slo, "--slo"):
        try:
            raw.setdefault("slo", {})[key] = float(value)
        except ValueError:
            raise KvsimError(f"--slo {key}={value!r}: expected seconds") from None
    for key, value in _assignments(costs, "--gpu-hourly-cost"):
        try:
            raw.setdefault("gpu_hourly_cost", {})[key] = float(value)
        except ValueError:
            raise KvsimError(f"--gpu-hourly-cost {key}={value!r}: expected a price per hour") from None
    for key, value in _assignments(knobs, "--engine"):
        raw.setdefault("engine", {})[key] = [yaml.safe_load(v) for v in value.split(",")]
    if gpus:
        raw["gpus"] = gpus
    if tp_sizes:
        raw["tensor_parallel_sizes"] = tp_sizes
    if max_replicas is not None:
        raw["max_replicas"] = max_replicas
    if router is not None:
        raw["router"] = router
    if search is not None:
        raw["search"] = search
    return make_plan_spec(raw)
