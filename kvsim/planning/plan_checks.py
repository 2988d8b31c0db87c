"""What `kvsim plan` refuses before any cluster starts or folder is made (`check_candidates`): a fleet the scenario
fixes already, SLOs for classes the traffic lacks, candidates that cannot be built, engine knobs given twice, traffic
that offers no rate, a rate search's first probe past its cap, and a plan nothing of which fits the memory limit.
Each refusal is one `KvsimError` naming the field and the value."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvsim.model.errors import KvsimError, shown
from kvsim.planning.memory import MemoryBound
from kvsim.planning.plan_rate import arrivals_s, first_probe_requests, longest_probe, scaled_traffic
from kvsim.planning.slo_floor import Unsearched
from kvsim.planning.spec import Candidate, PlanSpec, candidates, check_slo_classes, has_auto, with_split
from kvsim.planning.verify import traffic_of
from kvsim.workload.scenario import Scenario

if TYPE_CHECKING:
    from kvsim.model.config import GPUSpec
    from kvsim.model.engine_config import EngineConfig
    from kvsim.model.spec import ModelSpec


def check_candidates(base: Scenario, spec: PlanSpec, memory_limit_name: str = "plan.memory_limit_bytes",
                     xpyd_name: str = "plan.xpyd", stand_ins: StandIns | None = None) -> StandIns:
    """Refuse, before any cluster starts or folder is made, a scenario that already fixes `replicas` or autoscales, an
    SLO for a priority class the workload does not have, and a candidate whose GPU is unknown, whose engine
    knobs do not make a valid scenario, or whose TP the model cannot be split over, whose weights leave
    no KV pool or whose split's engine cannot be split (`unfit_search`; where some candidates can be planned, those
    that cannot are ranked infeasible instead, but a plan none of whose splits can be split is refused as
    `check_split_engine` says) or whose engine cannot be built (`check_engine`: e.g. an offload tier under one block) (a
    `KvsimError` naming the field; `memory_limit_name` is what gave `spec.memory_limit_bytes`, as
    `check_plan_memory` names it, and `xpyd_name` what gave `spec.xpyd`, as `check_split_engine` names it).
    Returns the candidates' stand-ins (`stand_ins`, those of `base` and `spec.router` found so far, or new), for
    the plan's searches and lists of the candidates it simulates to read."""
    import numpy as np

    from kvsim.engine.builder import check_engine
    from kvsim.fleet.driver import replica_groups
    from kvsim.model.capacity import check_parallel
    from kvsim.model.config import load_gpu, load_model
    from kvsim.workload.fleet_layout import Router
    from kvsim.workload.generate import iter_requests

    if base.autoscaler is not None:  # "remove replicas" alone was refused next as an autoscaler without its start
        drop = ["autoscaler", "replicas", *(["router"] if base.router != Router() else [])]  # no router without them
        raise KvsimError(f"autoscaler: plan sizes a static fleet, searching its replica count; remove "
                         f"{', '.join(drop)} from the scenario ({' '.join(f'--set {name}=null' for name in drop)})")
    if base.replicas is not None:
        raise KvsimError(f"replicas={base.replicas_shown}: plan searches the replica count; remove it from the "
                         "scenario")
    if base.workload.max_concurrency is not None:  # a closed loop's queue waits in the client, never grows
        raise KvsimError(f"workload.max_concurrency={base.workload.max_concurrency}: plan sizes a fleet for open-loop "
                         "traffic (requests arrive whether or not earlier ones ended); remove it from the scenario")
    multi_turn = base.workload.multi_turn
    if multi_turn is not None and multi_turn.timing == "after_reply":  # each user waits for the reply: a closed loop
        raise KvsimError("workload.multi_turn.timing=after_reply: plan sizes a fleet for open-loop traffic "
                         "(turns arrive whether or not earlier replies came); use timing=open")
    check_slo_classes(base, spec)
    for gpu in dict.fromkeys(spec.gpus):
        load_gpu(gpu)
    model = load_model(base.model)
    # the traffic as the first point reads it: a trace that is missing or has a bad row was found after the
    # plan folder had been made (every random draw happens here, the requests themselves are built lazily)
    iter_requests(base, base.engine.resolved_max_model_len(model), np.random.default_rng(base.seed))
    stand_ins = StandIns(base, spec.router) if stand_ins is None else stand_ins
    assert stand_ins.base is base and stand_ins.router == spec.router, "stand-ins of another plan"
    auto = [with_split(c, (1, 1), spec) for c in candidates(spec) if c.split is None] if has_auto(spec) else []
    everything = [*candidates(spec), *auto]  # an automatic split's shape is checked as 1P1D
    unfit, unsplit = [], []  # ranked infeasible, unless nothing is left to plan: why each does not fit its GPU,
    for candidate in everything:  # and the splits of an engine that cannot be split
        scenario = candidate.scenario(base, candidate.smallest_fleet, spec.router)
        check_parallel(model, scenario.engine)
        if (stand_in := stand_ins.of(candidate)) is not None:
            if stand_in.cannot == CANNOT_SPLIT:
                unsplit.append(scenario)
            else:
                unfit.append(stand_in.reason)
            continue
        for replica, _ in replica_groups(scenario):  # what building it refuses: found after the folder was made
            check_engine(replica)
        if candidate.split is not None:
            from kvsim.fleet.disagg_checks import check_disaggregable
            from kvsim.fleet.driver import replica_scenarios

            check_disaggregable(scenario, replica_scenarios(scenario))
    if unsplit and len(unsplit) == sum(c.split is not None for c in everything):  # no split to plan
        check_split_engine(unsplit[0], spec, xpyd_name)
    if len(unfit) + len(unsplit) == len(everything):  # nothing to plan: the first one's refusal
        raise KvsimError(unfit[0])
    check_knob_repeats(base, spec)
    check_traffic_rate(base, spec)
    check_probe_cap(base, spec)
    check_plan_memory(base, spec, memory_limit_name, stand_ins)
    return stand_ins


def check_split_engine(scenario: Scenario, spec: PlanSpec, xpyd_name: str) -> None:
    """Refuse an xPyD split of an engine that is not v1 and paged (`split_problem`), in the plan's terms: the splits
    as given (`xpyd_name`: `--xpyd 1P1D`, or a spec file's `plan.xpyd=1P1D`) and the engine field and value.
    `check_disaggregable` said it of the fleet's first instance, a name the plan made up
    (`replicas (default/h100-80gb_tp1_1P1D/x2/prefill-0, kv_producer): ...`)."""
    if (problem := split_problem(scenario.engine)) is not None:
        field, value, needed = problem
        given = f"{xpyd_name}{' ' if xpyd_name.startswith('--') else '='}{','.join(spec.xpyd)}"
        raise KvsimError(f"{given}: {split_text(problem)}; plan the splits on a {needed} engine, or without "
                         f"{xpyd_name}")


def split_problem(engine: EngineConfig) -> tuple[str, str, str] | None:
    """The first engine field an xPyD split cannot run on, as (field, value, the value it needs): a split needs
    vLLM's v1 engine over the paged pool, the engine its KV connectors run on; None where it can be split."""
    for field, value, needed in (("scheduler", engine.scheduler, "v1"), ("allocator", engine.allocator, "paged")):
        if value != needed:
            return field, value, needed
    return None


def split_text(problem: tuple[str, str, str]) -> str:
    """`split_problem`'s answer in words: `engine.scheduler=v0: a prefill/decode split needs ...`."""
    field, value, needed = problem
    return f"engine.{field}={value}: a prefill/decode split needs engine.{field}={needed} (vLLM v1's KV connectors)"


def check_knob_repeats(base: Scenario, spec: PlanSpec) -> None:
    """Refuse two values of an engine knob that make one engine on every GPU of the plan: as the engine reads them
    (`max_num_seqs: [4, '4']`) or once its defaults are filled (`defaults_filled`: `max_num_seqs: [null, 256]` on
    v0, whose default is 256 on every GPU). `PlanSpec` refuses values equal as written, but these made two
    candidates of one engine, searched twice and ranked beside each other. Two values that are one engine on
    some of the plan's GPUs only are kept (v1's default `max_num_seqs` is 1024 on an H100, 256 on an L4). A
    `KvsimError` naming the knob, the later value and the earlier one it repeats."""
    from kvsim.model.config import load_gpu, load_model

    model, gpus = load_model(base.model), [load_gpu(gpu) for gpu in dict.fromkeys(spec.gpus)]
    shape = (spec.gpus[0], spec.tensor_parallel_sizes[0])
    for name, values in spec.engine.items():
        engines: list[tuple[EngineConfig, list[EngineConfig], Any]] = []  # (engine, it filled per GPU, value)
        for value in values:
            engine = Candidate(*shape, ((name, value),)).scenario(base, 1, spec.router).engine
            filled = [defaults_filled(engine, model, gpu) for gpu in gpus]
            earlier = next(((made, given) for made, made_filled, given in engines if made_filled == filled), None)
            if earlier is not None:
                made, given = earlier
                how = "the same engine" if made == engine else "the same engine once its defaults are filled"
                raise KvsimError(f"plan.engine: {name}={shown(value)} is given twice (as {name}={shown(given)}, "
                                 f"{how})")
            engines.append((engine, filled, value))


def defaults_filled(engine: EngineConfig, model: ModelSpec, gpu: GPUSpec) -> EngineConfig:
    """`engine` on `model` and `gpu` with every default it resolves there given (`EngineConfig.resolved_*`):
    `max_model_len`, `max_num_seqs`, `max_num_batched_tokens`, `async_scheduling` and `watermark`; and its KV
    dtype as vLLM reads it (`auto`: the model's dtype; `fp8`: `fp8_e4m3`, vLLM's CacheConfig "fp8 (=fp8_e4m3)"),
    so `kv_cache_dtype: [auto, bfloat16]` on a bfloat16 model is one engine, as `[fp8, fp8_e4m3]` is."""
    max_model_len = engine.resolved_max_model_len(model)
    kv_dtype = {"auto": model.dtype, "fp8": "fp8_e4m3"}.get(engine.kv_cache_dtype, engine.kv_cache_dtype)
    return engine.model_copy(update={
        "max_model_len": max_model_len, "max_num_seqs": engine.resolved_max_num_seqs(gpu),
        "max_num_batched_tokens": engine.resolved_max_num_batched_tokens(max_model_len, gpu),
        "async_scheduling": engine.resolved_async_scheduling, "watermark": engine.resolved_watermark,
        "kv_cache_dtype": kv_dtype})


def check_traffic_rate(base: Scenario, spec: PlanSpec) -> None:
    """Refuse traffic that offers no rate: one request, or a burst arriving at one instant. A fleet is sized for
    a rate, and a steady state is judged over a window between arrivals (`kvsim.planning.window`): the search
    found no window at any count and the traffic's floor was infinite replicas (an OverflowError after every
    point had run). A rate search's first probe is the traffic's first `probe_requests`: one request is refused
    (its probe has no window, is judged empty and never lengthened); a burst of them at one instant is not where
    later arrivals follow within its longest probe (`longest_probe`, at most the traffic's count), as a probe too
    short to judge runs again with twice the requests (a trace opening with a burst at t=0 was refused)."""
    num_requests = base.workload.num_requests
    probed = first_probe_requests(base, spec) if spec.search == "rate" else num_requests
    arrivals = arrivals_s(traffic_of(base, probed))
    if 2 <= len(arrivals) < num_requests and arrivals[-1] == arrivals[0]:  # a burst: the probe is doubled
        probed = min(longest_probe(probed, spec.max_probe_requests), num_requests)
        arrivals = arrivals_s(traffic_of(base, probed))
    if len(arrivals) < 2 or arrivals[-1] == arrivals[0]:
        field = f"plan.probe_requests={probed}" if probed < num_requests else f"workload.num_requests={num_requests}"
        which = "one request offers" if len(arrivals) == 1 else \
            f"{len(arrivals):,} requests arriving at one instant offer"
        raise KvsimError(f"{field}: {which} no rate to size a fleet for; give at least 2 requests that arrive at "
                         "different times")


def check_probe_cap(base: Scenario, spec: PlanSpec) -> None:
    """Refuse a rate search whose first probe, the traffic's first `probe_requests`, is longer than
    `max_probe_requests`, the longest probe it may run: it ran the whole search anyway, then advised raising
    the cap. A `probe_requests` past the cap is none where the traffic has no more requests than the cap: the
    first probe is then the whole traffic (a cap of 200 beside the default 2,000 on 100 requests)."""
    probed = first_probe_requests(base, spec)
    if spec.search == "rate" and probed > spec.max_probe_requests:
        raise KvsimError(f"plan.probe_requests={spec.probe_requests}: a rate search's first probe of {probed:,} "
                         f"requests is longer than plan.max_probe_requests={spec.max_probe_requests}, the longest "
                         "probe it runs")


def first_point(base: Scenario, spec: PlanSpec, candidate: Candidate) -> Scenario:
    """The smallest point a candidate's search simulates: one replica on the traffic (a rate search's
    first probe: its first `probe_requests`)."""
    traffic = scaled_traffic(base, 1.0, first_probe_requests(base, spec)) \
        if spec.search == "rate" and candidate.split is None else base
    return candidate.scenario(traffic, candidate.smallest_fleet, spec.router)


def check_plan_memory(base: Scenario, spec: PlanSpec, memory_limit_name: str, stand_ins: StandIns) -> None:
    """Refuse a plan none of whose candidates that can be planned (`stand_ins`) fits in the memory limit even at its
    smallest point (the searches are bounded by it; `kvsim.planning.memory`): one line naming the limit as the user
    gave it, `memory_limit_name` (a spec file's `plan.memory_limit_bytes` was refused as `--memory-limit`)."""
    memory = MemoryBound.of(spec.memory_limit_bytes, memory_limit_name)
    needs = [(memory.needed_bytes(first_point(base, spec, c)), c) for c in candidates(spec)
             if stand_ins.of(c) is None]
    least, smallest = min(needs, key=lambda need: need[0])
    if least > memory.limit_bytes:
        raise KvsimError(f"{memory.label}: even the smallest point ({smallest.label}, {smallest.smallest_fleet} "
                         f"{'instances' if smallest.split else 'replica'}, "
                         f"{first_point(base, spec, smallest).workload.num_requests} requests) needs at least "
                         f"{memory.size(least)} of memory; nothing in this plan fits")


def unfit_search(base: Scenario, candidate: Candidate, router: str) -> UnfitSearch | None:
    """The stand-in of a candidate that cannot be planned: a split of an engine that cannot be split
    (`split_problem`: v0, or a slab allocator), or an engine that does not fit its GPU
    (`kvsim.model.capacity.num_gpu_blocks`'s refusal, one line: weights over its memory, no KV pool left, a
    `num_gpu_blocks_override` or `kv_cache_memory_bytes` pool beside the weights over it, a pool that cannot hold one
    request of max_model_len); None where it can. A plan ranks such a candidate infeasible with that line as its
    limiting factor and plans the others: one `--engine num_gpu_blocks_override=...` value, one `--gpu` too small
    for the model, or a v0 value beside `--xpyd`, refused the whole plan."""
    from kvsim.model.capacity import num_gpu_blocks
    from kvsim.model.config import load_gpu, load_model

    engine = candidate.scenario(base, candidate.smallest_fleet, router).engine
    if candidate.split is not None and (problem := split_problem(engine)) is not None:
        return UnfitSearch(candidate, split_text(problem), CANNOT_SPLIT)
    try:
        num_gpu_blocks(load_model(base.model), load_gpu(candidate.gpu), engine)
    except KvsimError as error:
        return UnfitSearch(candidate, str(error))
    return None


CANNOT_SPLIT = "cannot be split"  # `UnfitSearch.cannot` of a split whose engine cannot be split (`split_problem`)


@dataclass(slots=True)
class UnfitSearch(Unsearched):
    """A candidate that cannot be planned (`unfit_search`): nothing is simulated, and its row says why."""

    reason: str
    cannot: str = "does not fit its GPU"  # what the reason stops: the engine on its GPU, or its split

    def row(self, hourly_cost: float | None) -> dict[str, Any]:
        """Infeasible, no headroom (no engine to measure it on), the reason as its limiting factor."""
        return self.candidate.unsearched_row(None, f"{self.cannot}: {self.reason}")


@dataclass(slots=True)
class StandIns:
    """Each candidate's `unfit_search` stand-in (None where it can be planned) for one plan's `base` and `router`,
    each found once: `check_candidates`, `check_plan_memory`, the plan's searches and `kvsim plan`'s lists of the
    candidates it simulates all ask, and each answer is a scenario build and a pool sizing. Candidates are compared,
    not hashed: a knob's value may be a mapping (`kv_offload`)."""

    base: Scenario
    router: str
    found: list[tuple[Candidate, UnfitSearch | None]] = dataclasses.field(default_factory=list)

    def of(self, candidate: Candidate) -> UnfitSearch | None:
        """`candidate`'s stand-in: `unfit_search`'s answer, found on the first question."""
        for asked, known in self.found:
            if asked == candidate:
                return known
        stand_in = unfit_search(self.base, candidate, self.router)
        self.found.append((candidate, stand_in))
        return stand_in
