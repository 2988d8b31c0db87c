"""`kvsim plan`: the cheapest fleet that meets latency SLOs for a given traffic.

    spec = PlanSpec(slo={"ttft_s.p90": 2.0, "tpot_s.p90": 0.1}, gpus=["h100-80gb", "h200"],
                    tensor_parallel_sizes=[1, 2], engine={"max_num_seqs": [128, 256]})
    rows = plan(base_scenario, spec, out_dir)          # ranked, cheapest first

The base scenario's workload is the whole fleet's traffic (a trace, or a rate and a length
mix). Each candidate (GPU × TP × engine knobs) gets the fewest replicas that meet every SLO
at that traffic: counts 1, 2, 4, … are tried until one meets it, then bisection between the
last miss and the first hit. This assumes that adding a replica never breaks an SLO (more
replicas, less load each), which holds for the load-aware routers and round robin alike.

A count passes only when its fleet is stable and meets every SLO over the steady-state
measurement window (`kvsim.planning.steady_state`); the chosen count is then re-run with 10×
the requests, and while that long run fails, one replica more is tried long (`kvsim.planning.verify`:
`replicas` is the count that held, `searched_replicas` the probes' answer, `verified`, `verify_*`).

For each candidate the table gives the cost per hour (replicas × TP × the GPU's hourly
price: the planner's, or the shipped list's, `price_source`), GPUs, replicas, the headroom
(the smallest relative slack of an SLO at that count), the limiting factor (the SLO that
failed with one replica fewer, and whether that fleet was short of KV memory, it preempted,
or of compute, it only queued), the window's evidence, and the first-principles floor
(`kvsim.planning.bounds`: `lower_bound_replicas`, which bound binds, `replicas_over_bound`).

`search: rate` sizes a homogeneous fleet instead from the highest load one replica sustains
(`kvsim.planning.plan_rate`): one single-replica bisection per candidate, then
`replicas = ceil((1 + capacity_headroom) · target rate / max rate per replica)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsim.model.errors import KvsimError
from kvsim.planning.bounds import ReplicaFloor, gap_breakdown, gap_text, replica_floor
from kvsim.planning.cost import GpuPrice, gpu_price
from kvsim.planning.plan_rate import RateSearch, offered_rate_per_s
from kvsim.planning.search import Metrics, PointStore, run_searches
from kvsim.planning.spec import Candidate, PlanSpec, candidates, make_plan_spec
from kvsim.planning.steady_state import TOO_SHORT, headroom, probe_passes, why_failed
from kvsim.planning.verify import Verification, evidence_columns, with_requests
from kvsim.workload.scenario import Scenario


def check_candidates(base: Scenario, spec: PlanSpec) -> None:
    """Refuse, before any cluster starts or folder is made, a scenario that already fixes `replicas`, and
    a candidate whose GPU is unknown, whose engine knobs do not make a valid scenario, or whose TP the
    model cannot be split over or whose weights leave no KV pool (a `KvsimError` naming the field)."""
    from kvsim.model.capacity import check_parallel, num_gpu_blocks
    from kvsim.model.config import load_gpu, load_model

    if base.replicas is not None:
        raise KvsimError(f"replicas={base.replicas!r}: plan searches the replica count; remove it from the scenario")
    for gpu in dict.fromkeys(spec.gpus):
        load_gpu(gpu)
    model = load_model(base.model)
    for candidate in candidates(spec):
        scenario = candidate.scenario(base, 1, spec.router)
        check_parallel(model, scenario.engine)
        num_gpu_blocks(model, load_gpu(candidate.gpu), scenario.engine)


def point_metrics(scenario: Scenario) -> Metrics:
    """Simulate one fleet and keep what the plan needs (small, JSON-safe; runs on a Dask worker)."""
    from kvsim.fleet.driver import simulate_fleet
    from kvsim.planning.steady_state import window_evidence

    result = simulate_fleet(scenario)
    summary = result.summary
    keep = ("num_replicas", "num_gpus", "num_requests", "num_finished", "num_rejected", "duration_s",
            "requests_per_s", "output_tokens_per_s", "num_preemptions", "kv_cache_usage_mean",
            "prefix_cache_hit_rate", "offered_rate_per_s")
    requests = result.requests
    servable = requests["status"] != "rejected"
    uncached = int((requests["prompt_tokens"] - requests["prefix_hit_tokens"])[servable].sum())
    prefill = sum(run.num_prefill_tokens for run in result.replicas)
    # the SLOs are judged on `evidence` (the steady-state window), never on the whole run's percentiles;
    # busy time and recomputed tokens are what the gap to the floor is made of (`kvsim.planning.bounds`)
    return {**{key: summary[key] for key in keep}, "evidence": window_evidence(requests),
            "work": {"busy_replica_s": sum(run.busy_s for run in result.replicas),
                     "recomputed_tokens": max(0, prefill - uncached)}}


@dataclass(slots=True)
class ReplicaSearch:
    """The fewest replicas of one candidate whose fleet is stable and meets the SLOs over the
    measurement window (`kvsim.planning.steady_state`): doubling, then bisection; then one
    verification run of that fleet with 10× the traffic's requests (`kvsim.planning.verify`)."""

    candidate: Candidate
    base: Scenario
    spec: PlanSpec
    results: dict[int, Metrics] = field(default_factory=dict)
    verify: Verification = field(init=False)
    num_requests: int = field(init=False)  # per probe: the traffic's, doubled while a window is too short
    _pending: int | None = None

    def __post_init__(self) -> None:
        self.verify = Verification(self.candidate, self.spec)
        self.num_requests = self.base.workload.num_requests

    def _ok(self, metrics: Metrics) -> bool:
        return probe_passes(metrics["evidence"], self.spec.slo)

    def _fewest_ok(self) -> int | None:
        ok = [n for n, m in self.results.items() if self._ok(m)]
        return min(ok) if ok else None

    def _next_count(self) -> int | None:
        best = self._fewest_ok()
        misses = [n for n, m in self.results.items() if not self._ok(m) and (best is None or n < best)]
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
        traffic = self.base if self.num_requests == self.base.workload.num_requests \
            else with_requests(self.base, self.num_requests)
        if count is not None:
            return self.candidate.scenario(traffic, count, self.spec.router)
        return self.verify.next_scenario(traffic, self._fewest_ok(), self.num_requests)

    def observe(self, metrics: Metrics) -> None:
        if self._pending is None:
            self.verify.observe(metrics)
            return
        ev = metrics["evidence"]
        if (ev["verdict"] == TOO_SHORT and ev["num_requests"] >= self.num_requests
                and 2 * self.num_requests <= self.spec.max_probe_requests):
            self.num_requests *= 2  # this traffic is too short to judge a fleet: every count again, longer
            self.results.clear()
            return
        self.results[self._pending] = metrics

    def answer_metrics(self) -> Metrics | None:
        """The run behind the answer: the long run that held, else the probe at the searched count."""
        best = self._fewest_ok()
        if self.verify.held:
            return self.verify.metrics
        return self.results.get(best) if best is not None and not self.verify.attempts else None

    def row(self, hourly_cost: float | None) -> dict[str, Any]:
        """This candidate's line of the plan table: `replicas` is the count whose long run held."""
        best, slo = self._fewest_ok(), self.spec.slo
        c = self.candidate
        row: dict[str, Any] = {"candidate": c.label, "gpu": c.gpu, "tensor_parallel_size": c.tensor_parallel_size,
                               **{k: v for k, v in c.knobs}, "searched_replicas": best}
        replicas = self.verify.replicas(best)
        if best is None or replicas is None:
            count = max(self.results) if best is None else best
            worst = self.results[count] if best is None else self.verify.attempts[-1][1]
            why = (f"{why_failed(worst['evidence'], slo)} even at {count} replicas" if best is None else
                   f"the long run {why_failed(worst['evidence'], slo)} even at {self.verify.attempts[-1][0]} "
                   f"replicas ({best} passed the probes)")
            return {**row, "feasible": False, "replicas": None, "num_gpus": None, "cost_per_hour": None,
                    "headroom": headroom(worst["evidence"], slo), "limiting_factor": why,
                    "rate_per_replica": None, **evidence_columns(self.results[count]["evidence"], slo),
                    **self.verify.columns()}
        metrics = self.results[best]
        failed_long = [(n, m) for n, m in self.verify.attempts if n < replicas]
        below = failed_long[-1] if failed_long else (best - 1, self.results.get(best - 1))
        if below[1] is None:
            limiting = "none: one replica meets every SLO"
        else:
            cause = "KV memory (preempting)" if below[1]["num_preemptions"] else "compute (queueing)"
            run = "in the long run " if failed_long else ""
            limiting = f"{why_failed(below[1]['evidence'], slo)} {run}at {below[0]} replicas: {cause}"
        num_gpus = replicas * c.tensor_parallel_size
        return {**row, "feasible": True, "replicas": replicas, "num_gpus": num_gpus,
                "requests_per_probe": self.num_requests,
                "cost_per_hour": num_gpus * hourly_cost if hourly_cost is not None else None,
                "headroom": headroom((self.verify.metrics or metrics)["evidence"], slo), "limiting_factor": limiting,
                "rate_per_replica": metrics["offered_rate_per_s"] / replicas,
                **evidence_columns(metrics["evidence"], slo), **self.verify.columns()}


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
    check_candidates(base, spec)  # bad knob values fail here, before any simulation
    searches: list[ReplicaSearch] | list[RateSearch]
    if spec.search == "rate":
        searches = [RateSearch(c, base, spec, offered_rate_per_s(base)) for c in candidates(spec)]
    else:
        searches = [ReplicaSearch(c, base, spec) for c in candidates(spec)]
    store = PointStore(Path(out_dir) / "points.jsonl", required=("evidence", "work"))
    simulated = run_searches(searches, point_metrics, store, client, on_point)
    target_rate_per_s = offered_rate_per_s(base)
    rows = []
    for s in searches:
        row = s.row(hourly_price(spec, s.candidate.gpu).usd_per_gpu_hour)
        floor = replica_floor(s.candidate.scenario(base, 1, spec.router), target_rate_per_s)
        gap = answer_gap(floor, row["replicas"], s.answer_metrics())
        rows.append({**row, "lower_bound_replicas": floor.replicas, "bound_binds": floor.binds,
                     "replicas_over_bound": round(row["replicas"] / floor.replicas, 3) if row["replicas"] else None,
                     **{f"gap_{k}": v for k, v in gap.items()}, "gap_breakdown": gap_text(gap, row["replicas"]),
                     "price_source": hourly_price(spec, s.candidate.gpu).source})
    return rank(rows), simulated


def answer_gap(floor: ReplicaFloor, replicas: int | None, metrics: Metrics | None) -> dict[str, float]:
    """The gap between `replicas` and the floor, from the run that backs them (`kvsim.planning.bounds`)."""
    if not replicas or metrics is None:
        return {}
    work = metrics["work"]
    return gap_breakdown(floor, replicas, work["busy_replica_s"], metrics["num_finished"], work["recomputed_tokens"])


def hourly_price(spec: PlanSpec, gpu: str) -> GpuPrice:
    """The planner's price for `gpu` when given, else the shipped list price (`kvsim.planning.cost`)."""
    return gpu_price(gpu, spec.gpu_hourly_cost.get(gpu))


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
        try:
            raw.setdefault("engine", {})[key] = [yaml.safe_load(v) for v in value.split(",")]
        except yaml.YAMLError:
            raise KvsimError(f"--engine {key}={value!r}: not a comma-separated list of values") from None
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
