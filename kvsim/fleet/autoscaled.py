"""An autoscaled fleet: the replica count follows `kvsim.fleet.autoscaler` (Kubernetes HPA's rule), with
cold starts and draining.

    replicas: 2                      # at the start (warm), clamped to [min_replicas, max_replicas]
    router: {policy: least_outstanding}
    autoscaler: {metric: num_requests_waiting, target: 4, min_replicas: 1, max_replicas: 8, startup_s: 120}

Every replica slot is an engine exactly as a colocated fleet builds it (up to `max_replicas` of them), built when
the autoscaler first starts it: the slots are taken in order, so the slots built are always the first ones, and
a slot never started costs nothing (`max_replicas: 4096` built every engine up front, 100 s before its first
step). A slot is OFF, STARTING, READY or DRAINING:

    OFF ──scale up──▶ STARTING ──startup_s──▶ READY ──scale down──▶ DRAINING ──no work left──▶ OFF
                          └──────scale down (cancelled first)──────────────────────────────▶ OFF

Every `sync_period_s` (from t = 0) the autoscaler reads the metric of the READY replicas (vLLM's
`num_requests_waiting`, or `kv_cache_usage_perc`) and recommends a count for STARTING + READY (the HPA
counts pods that are not ready yet too, their missing metric at 0 for a scale-up: `Scaler._metric`).
Scaling up turns OFF slots STARTING (a DRAINING slot asked
for again is kept READY: its requests are still there, and it is the cheaper choice); scaling down
cancels STARTING slots first (newest first), then drains READY ones, fewest outstanding first. The
router sees only READY replicas. A DRAINING slot is switched off at the first sync after its last
request ends. GPU-hours bill every slot that is not OFF (`tensor_parallel_size` GPUs each), as a cloud
bill does from the moment a replica is requested; `gpu_hours_per_million_output_tokens` prices the run's output
by them (times a GPU-hour's price: USD per million tokens), never by `num_gpus` over the whole run. The
summary's replicas (`num_replicas`, `num_gpus`, `per_replica` and its means and spreads over replicas) are the
slots that were ever READY: a policy pinned at N replicas summarises as the static N-replica fleet, plus
`autoscaling`. The result's `replicas` hold every slot the run built (started at least once), in slot order.
A slot's KV pool counts in the fleet's `kv_cache_usage_mean` only while it serves (READY or DRAINING,
`Scaler.up_periods`): the blocks in use over the blocks of the replicas up at the time (before, over every
pool the run ever used, for the whole run, which understated it by up to the ratio of peak to mean replicas).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.engine.builder import build_engine, engine_result
from kvsim.engine.clock import ArrivalClock, call_at
from kvsim.engine.loop import LateEngines, ProgressFn, run_engines
from kvsim.engine.runtime import Engine
from kvsim.fleet.autoscaler import Autoscaler
from kvsim.fleet.driver import (
    FleetView,
    Routes,
    fleet_output_tokens,
    fleet_requests,
    fleet_summary,
    fleet_tables,
    replica_engine,
    replica_engines,
    replica_groups,
    replica_scenario,
)
from kvsim.fleet.router import Decision, Router
from kvsim.model.errors import KvsimError, expect_flag
from kvsim.results.budget import check_engines_memory
from kvsim.results.run_result import RunResult
from kvsim.workload.fleet_layout import AutoscalerConfig
from kvsim.workload.request import Request
from kvsim.workload.scenario import Scenario, expect_scenario

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd

class Slot(Enum):
    OFF = "off"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


class ScalingView(FleetView):
    """The router's view: the READY slots only, in slot order (`ready`: their slot indices), so a router
    over `len(ready)` replicas routes exactly as over a static fleet of that size."""

    def __init__(self, engines: list[Engine], slots: list[Slot]) -> None:
        super().__init__(engines)
        self.slots = slots
        self.ready: list[int] = []

    def refresh(self) -> int:
        """Re-read which slots are READY; their number."""
        self.ready = [i for i, s in enumerate(self.slots) if s is Slot.READY]
        return len(self.ready)

    def outstanding(self) -> list[int]:
        every = super().outstanding()
        return [every[i] for i in self.ready]

    def kv_usage(self) -> list[float]:
        return [self.engines[i].kv_usage(self.now_s) for i in self.ready]


@dataclass(slots=True)
class Scaler:
    """The slots' states through the run, driven by the sync timer; `history` is `scaling.csv`."""

    spec: AutoscalerConfig
    engines: list[Engine]
    slots: list[Slot]
    gpus_per_slot: int
    build: Callable[[int], None]  # builds slot i's engine, the next one, when first started (`_scale`)
    env: Any = None  # the run's simpy.Environment (only kvsim.engine imports simpy)
    arrivals: ArrivalClock | None = None
    gpu_seconds: float = 0.0
    autoscaler: Autoscaler = field(init=False)
    history: dict[str, list[Any]] = field(init=False)
    _since_s: list[float] = field(init=False)  # when each slot last left OFF
    _starts: list[object] = field(init=False)  # the pending start of each slot (a cancel voids it)
    ever_ready: list[bool] = field(init=False)  # each slot: READY at some point (a replica of the run's fleet)
    up_periods: list[list[float]] = field(init=False)  # each slot's [start, end) serving (READY or DRAINING), flat

    def __post_init__(self) -> None:
        self.autoscaler = Autoscaler(self.spec)
        self.history = {key: [] for key in ("time_s", "metric", "desired", "num_ready", "num_starting",
                                            "num_draining")}
        self._since_s = [0.0] * len(self.slots)
        self._starts = [None] * len(self.slots)
        self.ever_ready = [s is Slot.READY for s in self.slots]
        self.up_periods = [[0.0] if s is Slot.READY else [] for s in self.slots]  # an odd length: up since then

    def start(self, env: Any, arrivals: ArrivalClock) -> list[ArrivalClock]:
        """`run_engines`' `clocks` hook: every slot reads the run's arrivals; the first sync is at t = 0."""
        self.env, self.arrivals = env, arrivals
        self._sync()
        return [arrivals] * len(self.engines)

    def _count(self, state: Slot) -> int:
        return sum(1 for s in self.slots if s is state)

    def _metric(self) -> float:
        """The per-replica value handed to the HPA rule for STARTING + READY replicas, as the HPA treats pods
        that are not ready yet (their metric is missing): averaged over READY replicas, then, where that
        would scale up, STARTING ones count as 0 (which damps a scale-up: desired = ceil(Σ ready / target)),
        and where it would scale down, as exactly at target (kubernetes.io, "Horizontal Pod Autoscaling",
        algorithm details). Where counting them at 0 turns a scale-up into a scale-down, the HPA keeps the count
        (`calcPlainMetricReplicas`: "the new usage ratio would cause a change in scale direction"): exactly at
        target then, which the rule leaves where it is."""
        ready = [e for e, s in zip(self.engines, self.slots, strict=True) if s is Slot.READY]
        if not ready:
            return 0.0
        if self.spec.metric == "num_requests_waiting":
            total = float(sum(e.num_waiting for e in ready))
        else:
            total = sum(e.kv_usage(self.env.now) for e in ready)
        starting, target = self._count(Slot.STARTING), self.spec.target
        ratio = total / len(ready) / target
        if not starting or abs(ratio - 1) <= self.spec.tolerance:
            return total / len(ready)
        if ratio > 1:
            return max(total / (len(ready) + starting), target)
        return (total + target * starting) / (len(ready) + starting)

    def _set(self, i: int, state: Slot) -> None:
        now = self.env.now
        if state is Slot.OFF and self.slots[i] is not Slot.OFF:
            self.gpu_seconds += (now - self._since_s[i]) * self.gpus_per_slot
            if len(self.up_periods[i]) % 2:  # a READY or DRAINING slot switched off
                self.up_periods[i].append(now)
        elif self.slots[i] is Slot.OFF and state is not Slot.OFF:
            self._since_s[i] = now
        self.slots[i] = state

    def _sync(self) -> None:
        assert self.arrivals is not None
        now = self.env.now
        for i, s in enumerate(self.slots):  # drained: off
            if s is Slot.DRAINING and not self.engines[i].scheduler.has_work:
                self._set(i, Slot.OFF)
        current = self._count(Slot.READY) + self._count(Slot.STARTING)
        metric = self._metric()
        desired = self.autoscaler.recommend(now, current, metric)
        self._scale(desired - current)
        for key, value in zip(self.history, (now, metric, desired, self._count(Slot.READY),
                                             self._count(Slot.STARTING), self._count(Slot.DRAINING)), strict=True):
            self.history[key].append(value)
        if not (self.arrivals.all_arrived and not any(e.scheduler.has_work for e in self.engines)):
            call_at(self.env, now + self.spec.sync_period_s, self._sync)

    def finish(self) -> None:
        """The run ended (its last request finished): bill every slot still on until now; one still serving
        stays up for good (`up_periods` ends it at infinity: no step of the run is after it)."""
        for i, s in enumerate(self.slots):
            if len(self.up_periods[i]) % 2:
                self.up_periods[i].append(float("inf"))
            if s is not Slot.OFF:
                self._set(i, Slot.OFF)

    def _scale(self, change: int) -> None:
        slots = self.slots
        for _ in range(max(change, 0)):
            draining = [i for i, s in enumerate(slots) if s is Slot.DRAINING]
            off = [i for i, s in enumerate(slots) if s is Slot.OFF]
            if not draining and not off and len(slots) < self.spec.max_replicas:  # the next slot, never started
                self._add_slot()
                off = [len(slots) - 1]
            if draining:
                slots[draining[0]] = Slot.READY
            elif off:
                i = off[0]
                self._set(i, Slot.STARTING)
                token = self._starts[i] = object()
                call_at(self.env, self.env.now + self.spec.startup_s, functools.partial(self._ready, i, token))
        for _ in range(max(-change, 0)):
            starting = [i for i, s in enumerate(slots) if s is Slot.STARTING]
            if starting:
                self._set(starting[-1], Slot.OFF)
                continue
            ready = [i for i, s in enumerate(slots) if s is Slot.READY]
            slots[min(ready, key=lambda j: (self._load(j), -j))] = Slot.DRAINING

    def _add_slot(self) -> None:
        """Slot `len(slots)`, OFF, its engine built (`build`, which adds it to `engines` and starts its loop)."""
        self.build(len(self.slots))
        self.slots.append(Slot.OFF)
        self._since_s.append(0.0)
        self._starts.append(None)
        self.ever_ready.append(False)
        self.up_periods.append([])

    def _load(self, i: int) -> int:
        engine = self.engines[i]
        return engine.num_waiting + len(engine.scheduler.running) + len(engine.scheduler.swapped)

    def _ready(self, i: int, token: object) -> None:
        if self.slots[i] is Slot.STARTING and self._starts[i] is token:  # not cancelled (and restarted) meanwhile
            self.slots[i] = Slot.READY
            self.ever_ready[i] = True
            self.up_periods[i].append(self.env.now)


def slo_attainment(requests_df: pd.DataFrame, slo_ttft_s: float, slo_tpot_s: float, window_s: float) -> pd.DataFrame:
    """Per window of `window_s` seconds of arrivals: requests, and the share that finished within both SLOs
    (a rejected request misses; a one-token output has no TPOT and is judged on TTFT alone)."""
    import pandas as pd

    arrival = requests_df["arrival_s"].to_numpy(dtype=float)
    window = np.floor(arrival / window_s).astype(np.int64)
    tpot = requests_df["tpot_s"].to_numpy(dtype=float)
    met = ((requests_df["status"] == "finished").to_numpy() & (requests_df["ttft_s"].to_numpy(dtype=float)
                                                               <= slo_ttft_s)
           & (np.isnan(tpot) | (tpot <= slo_tpot_s)))
    frame = pd.DataFrame({"window": window, "met": met})
    grouped = frame.groupby("window", sort=True)["met"].agg(["size", "mean"]).reset_index()
    return pd.DataFrame({"window_start_s": grouped["window"].to_numpy(dtype=float) * window_s,
                         "num_requests": grouped["size"].to_numpy(dtype=np.int64),
                         "slo_attainment": grouped["mean"].to_numpy(dtype=float)})


MAX_SYNCS = 10**7
"""The most sync periods an autoscaled run's arrivals may span: its `scaling` table keeps a row for each (six
values, about 100 B apiece while the run goes: a GiB at this bound), and each is a step of the run's clock. 10**7 is a
1 s period over 116 days. A 1 ms period over three requests at 1e-9 req/s (arrivals some 1e9 s apart) ran
about 10**12 syncs: the run did not end, its table growing all the while."""


def check_syncs(spec: AutoscalerConfig, last_arrival_s: float) -> None:
    """Refuse arrivals that span more than `MAX_SYNCS` sync periods (a `KvsimError` naming `sync_period_s`)."""
    syncs = last_arrival_s / spec.sync_period_s
    if syncs > MAX_SYNCS:
        raise KvsimError(f"autoscaler.sync_period_s={spec.sync_period_s:g}: the arrivals span {last_arrival_s:g} s, "
                         f"{syncs:.3g} syncs, more than {MAX_SYNCS:,} (the run's scaling table keeps a row for each); "
                         "give a longer sync period or traffic that spans less time")


def simulate_autoscaled(scenario: Scenario, check: bool = False, progress: ProgressFn | None = None,
                        bursts: bool = True, memory_limit_bytes: int | None = None) -> RunResult:
    """Simulate the autoscaled fleet (module docstring): a fleet's result (`kvsim.fleet.driver`) whose `tables`
    add `scaling` (one row per sync) and `slo` (attainment per window of arrivals). A replica is built when it is
    first started (module docstring); a fleet of `autoscaler.max_replicas`, which the run may start, that cannot
    fit in `memory_limit_bytes` [the machine's memory] is refused before any is built
    (`kvsim.results.budget.check_engines_memory`). A `scenario` that is no Scenario, or one without an autoscaler,
    and a `check` that is not True or False are each a `KvsimError` naming it, as `simulate_fleet` and
    `simulate_disagg` refuse them (they were an AttributeError, an AssertionError and every check run)."""
    import pandas as pd

    spec = expect_scenario(scenario).autoscaler
    expect_flag(check, "check")  # `check="no"` ran every check
    expect_flag(bursts, "bursts")  # `bursts="no"` ran bursts
    if spec is None:
        raise KvsimError("autoscaler: not set, so no autoscaled fleet; use kvsim.simulate, which runs any scenario")
    assert isinstance(scenario.replicas, int), "a scenario's autoscaler starts from a count of replicas"
    policy = scenario.router.policy
    if policy not in ("least_outstanding", "least_kv"):
        why = {"round_robin": "round_robin takes the replicas in turn, blind to their load: a replica just started "
                              "would get only its turn's share of arrivals, the rest still joining the queues it was "
                              "started to relieve",
               "affinity": "affinity's memory of which replica holds a prefix is not kept across scaling"}[policy]
        given = "" if "policy" in scenario.router.model_fields_set else " (the default)"
        raise KvsimError(f"router.policy={policy}{given}: an autoscaled fleet routes by load (set router.policy to "
                         f"least_outstanding or least_kv); {why}")
    largest = scenario.model_copy(update={"replicas": spec.max_replicas})
    check_engines_memory(largest, replica_groups(largest), memory_limit_bytes, steps_in_memory=scenario.steps == "all",
                         size_field=f"autoscaler.max_replicas={spec.max_replicas}")
    initial = min(max(scenario.replicas, spec.min_replicas), spec.max_replicas)
    specs = [replica_scenario(largest, i) for i in range(initial)]
    observe_kv = scenario.router.policy == "least_kv" or spec.metric == "kv_cache_usage_perc"
    rng = np.random.default_rng(scenario.seed)  # the engines built later share it, as every replica's scheduler does
    parts, engines, requests = replica_engines(scenario, specs, observe_kv, num_replicas=spec.max_replicas, rng=rng)
    arrival_s = getattr(requests, "arrival_s", None)  # a closed loop's follow-ups are sent as its turns end
    if arrival_s is not None and len(arrival_s):
        check_syncs(spec, float(arrival_s[-1]))
    slots = [Slot.READY] * initial
    speculates = parts[0].scheduler.speculation is not None  # every replica alike
    late = LateEngines(spec.max_replicas)

    def build(i: int) -> None:  # slot i's engine, built when the autoscaler first starts it (`Scaler._scale`)
        specs.append(replica_scenario(largest, i))
        parts.append(build_engine(specs[i], rng))
        view.add(replica_engine(scenario, parts[i], spec.max_replicas, speculates, observe_kv))
        assert late.start is not None and scaler.arrivals is not None
        late.start(engines[i], scaler.arrivals)

    scaler = Scaler(spec, engines, slots, specs[0].engine.tensor_parallel_size, build)
    view = ScalingView(engines, slots)
    router_config = scenario.router
    router = Router(router_config.policy, initial, scenario.engine.block_size, router_config.load_bound,
                    router_config.load_slack, router_config.match_threshold)
    routes = Routes()

    def dispatch(req: Request, now: float) -> int:
        view.now_s = now
        router.num_replicas = view.refresh()  # the router's turn counter carries on over the new set
        decision = router.route(req, view)
        replica = view.ready[decision.replica]
        routes.add(req, Decision(replica, decision.reason, decision.matched_tokens))
        view.dispatched[replica] += 1
        return replica

    run_engines([[engine] for engine in engines], requests, dispatch, check, progress, bursts,
                clocks=scaler.start,
                max_in_flight=scenario.workload.max_concurrency, late=late)
    billed_span_s = scaler.env.now
    scaler.finish()
    runs = [engine_result(s, p, e.recorder) for s, p, e in zip(specs, parts, engines, strict=True)]
    # the fleet is the slots that were ever READY: one never started (or cancelled while starting) served nothing
    # and is no replica of the summary's counts, means and rows, so a policy pinned at N is the static N fleet
    used = [i for i, ready in enumerate(scaler.ever_ready) if ready]
    requests_df = fleet_requests([runs[i].request_columns for i in used], used)
    steps_df = pd.concat([run.steps.assign(replica=i) for i, run in enumerate(runs)], ignore_index=True)
    routes_df = routes.frame()
    summary = fleet_summary(scenario, requests_df, [runs[i] for i in used], routes_df, used,
                            [scaler.up_periods[i] for i in used])
    scaling = pd.DataFrame(scaler.history)
    slo = slo_attainment(requests_df, spec.slo_ttft_s, spec.slo_tpot_s, spec.slo_window_s)
    met = slo["slo_attainment"] * slo["num_requests"]
    output_tokens = fleet_output_tokens(requests_df)
    summary["autoscaling"] = {
        **spec.model_dump(mode="json"),
        "gpu_hours": scaler.gpu_seconds / 3600.0,
        # what a million output tokens cost in billed GPU-hours (× a GPU-hour's price: USD per million tokens)
        "gpu_hours_per_million_output_tokens": scaler.gpu_seconds / 3600.0 / (output_tokens / 1e6)
        if output_tokens else None,
        "mean_gpus": scaler.gpu_seconds / billed_span_s if billed_span_s else 0.0,
        "billed_span_s": billed_span_s,
        "max_ready": int(scaling["num_ready"].max()) if len(scaling) else initial,
        "num_syncs": len(scaling),
        "slo_attainment": float(met.sum() / slo["num_requests"].sum()) if len(slo) else 0.0,
        "worst_window_slo_attainment": float(slo["slo_attainment"].min()) if len(slo) else 0.0,
    }
    tables = {**fleet_tables(routes_df, summary), "scaling": scaling, "slo": slo}
    return RunResult.of_frames(scenario, requests_df, steps_df, summary, runs, tables)
