"""The simulation: the only module that knows about time (SimPy).

Two processes share one `simpy.Environment`:

    arrivals:  for each request: wait until its arrival → scheduler.add → wake the engine
    engine:    loop: if idle, wait on the wake event (no polling)
                     plan = scheduler.schedule(now)
                     yield timeout(latency.step_time(plan))
                     scheduler.complete(plan, now)

`simulate(scenario)` builds the allocator, scheduler, latency model and workload from a
validated `Scenario` and returns a `RunResult` (DataFrames + summary). Same scenario and
seed → identical results: the only randomness is one `numpy.random.Generator(seed)`.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from array import array
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from kvsim.budget import check_run_memory
from kvsim.capacity import (
    kv_bytes_per_block,
    kv_bytes_per_token,
    model_kv_layout,
    model_max_concurrency,
    num_gpu_blocks,
)
from kvsim.config import EngineConfig, load_gpu, load_model
from kvsim.errors import KvsimError
from kvsim.latency import ConstantLatency, LatencyModel
from kvsim.memory import GroupedPagedAllocator, KVAllocator, PagedAllocator, SlabAllocator
from kvsim.metrics import dp_group_steps, summarize
from kvsim.output_dir import check_output_dir, output_directory
from kvsim.recorder import StepRecorder, kept_step_index
from kvsim.request import Request
from kvsim.results import RunResult, write_run_files
from kvsim.roofline import RooflineLatency
from kvsim.scenario import Scenario, StepsMode
from kvsim.scheduler import Scheduler, SchedulerLimits, make_scheduler
from kvsim.scheduler.burst import Burst
from kvsim.step_writer import StepsFormat, StepWriter, frame_columns
from kvsim.workload import iter_requests

if TYPE_CHECKING:
    from kvsim.config import GPUSpec, ModelSpec

ProgressFn = Callable[[float, int, int], None]  # (simulated seconds, requests done, requests total)
PROGRESS_EVERY_STEPS = 2000


def make_allocator(model: ModelSpec, gpu: GPUSpec, engine: EngineConfig) -> KVAllocator:
    """The KV allocator of `engine.allocator`, sized by the capacity math (same bytes for all kinds).

    Paged pools keep vLLM's null block (`num_gpu_blocks − 1` usable blocks); slab pools, the
    paper's Orca, have none: all `num_gpu_blocks · block_size` slots (OPT-13B in 12 GiB: 15,728).
    """
    num_blocks = num_gpu_blocks(model, gpu, engine)
    if num_blocks < 2 and engine.allocator == "paged":
        raise KvsimError(f"num_gpu_blocks={num_blocks}: need at least 2 (one is vLLM's null block)")
    bytes_per_block = kv_bytes_per_block(model, engine)
    layout = model_kv_layout(model, engine)
    if any(g.kind in ("sliding_window", "chunked_local") for g in layout.groups):
        if engine.allocator != "paged" or engine.scheduler != "v1":
            raise KvsimError(f"model={model.name}: sliding-window/chunked KV groups need allocator=paged and "
                             "scheduler=v1 (vLLM's hybrid KV cache manager); or set "
                             "engine.disable_hybrid_kv_cache_manager=true")
        mnbt = engine.resolved_max_num_batched_tokens(engine.resolved_max_model_len(model), gpu)
        return GroupedPagedAllocator(num_blocks, layout, mnbt, engine.enable_prefix_caching, bytes_per_block)
    swap_bytes = int(engine.swap_space * 2**30)
    if engine.allocator == "paged":
        return PagedAllocator(num_blocks, engine.block_size, enable_caching=engine.enable_prefix_caching,
                              num_cpu_blocks=swap_bytes // bytes_per_block, bytes_per_block=bytes_per_block)
    bytes_per_token = kv_bytes_per_token(model, engine)
    return SlabAllocator(num_blocks * engine.block_size, engine.resolved_max_model_len(model),
                         policy=engine.allocator.removeprefix("slab-"),  # type: ignore[arg-type]
                         num_cpu_slots=swap_bytes // bytes_per_token, bytes_per_token=bytes_per_token,
                         placement=engine.slab_placement)


def make_latency(scenario: Scenario, model: ModelSpec, gpu: GPUSpec) -> LatencyModel:
    cfg = scenario.latency
    if cfg.model == "constant":
        return ConstantLatency(cfg.step_s, gpu.host_link_bandwidth_bytes_per_s)
    roofline = RooflineLatency(model, gpu, scenario.engine, cfg.overhead_s, cfg.overlap_swap)
    if cfg.model == "roofline":
        return roofline
    from kvsim.calibration import CalibratedLatency
    from kvsim.profiles import load_profile

    assert cfg.profile is not None
    profile = load_profile(scenario.resolve_path(cfg.profile), model, gpu, scenario.engine)
    return CalibratedLatency(profile, model, scenario.engine, roofline)


def make_limits(engine: EngineConfig, gpu: GPUSpec, max_model_len: int,
                allocator: KVAllocator) -> SchedulerLimits:
    watermark_slots = 0
    if engine.resolved_watermark:
        bs = engine.block_size
        watermark_slots = int(engine.resolved_watermark * allocator.num_total_slots / bs) * bs
    return SchedulerLimits(
        max_num_seqs=engine.resolved_max_num_seqs(gpu),
        max_num_batched_tokens=engine.resolved_max_num_batched_tokens(max_model_len, gpu),
        max_model_len=max_model_len,
        watermark_slots=watermark_slots,
        preemption_mode=engine.preemption_mode,
    )


def delay_until(now: float, t: float) -> float:
    """The smallest float delay with `now + delay >= t`: `t - now` can fall an ulp short, and a
    request must never be seen before it arrives."""
    delay = t - now
    while now + delay < t:
        delay = math.nextafter(delay, math.inf)
    return delay


class Alarm(simpy.Event):
    """An event that fires at the absolute instant `at_s`, as a `simpy.Timeout` fires after a delay.

    A burst waited for at once must end on the very float instant its last step would end step
    by step, and no delay may give it: `now + delay` rounds, and for some `now` the sum never
    equals `at_s`. So this schedules the event the way `Environment.schedule` does, with the
    instant in place of `now + delay` (simpy 4's `_queue` heap of `(time, priority, id, event)`).
    """

    def __init__(self, env: simpy.Environment, at_s: float) -> None:
        super().__init__(env)
        assert at_s >= env.now
        self._ok = True
        self._value = None
        heapq.heappush(env._queue, (at_s, simpy.events.NORMAL, next(env._eid), self))  # type: ignore[attr-defined]


def delivery_instants(arrivals_s: Iterable[float]) -> array:
    """When the arrival process delivers each request (arrivals ascending): at its arrival, or a few
    ulps later where no float delay from the previous delivery reaches it exactly (`delay_until`);
    a request arriving at or before the previous delivery comes with it."""
    out, last = array("d"), 0.0  # simpy starts at 0
    for at_s in arrivals_s:
        if at_s > last:
            last += delay_until(last, at_s)  # where `env.timeout(delay)` from `last` fires
        out.append(last)
    return out


class Arrivals:
    """The run's requests in arrival order, each built (drawn from its source) only when needed.

    Every engine of a run reads it; the arrival process `pop`s each request at its arrival.
    The arrival instants are known up front (8 bytes a request: a `RequestStream`'s
    `arrival_s`, or read off a list), and so are the instants the arrival process delivers
    them (`delivery_instants`), so looking ahead (`horizon_s`, `none_delivered_at`) builds no
    request. Nothing here keeps a request after it arrived, so with a lazy stream
    (`kvsim.workload.iter_requests`) only the requests in flight exist at any time.
    """

    __slots__ = ("_source", "_ahead", "_times", "_delivered", "num_arrived")

    def __init__(self, requests: Iterable[Request]) -> None:
        times = getattr(requests, "arrival_s", None)
        if times is None:
            requests = list(requests)
            times = [req.arrival_s for req in requests]
        self._source: Iterator[Request] = iter(requests)
        self._ahead: deque[Request] = deque()  # drawn from the source, not arrived yet
        self._times = array("d", times)  # ascending: requests come in arrival order
        self._delivered = delivery_instants(self._times)
        self.num_arrived = 0

    @property
    def all_arrived(self) -> bool:
        return self.num_arrived == len(self._times)

    @property
    def next_arrival_s(self) -> float:
        return self._times[self.num_arrived] if self.num_arrived < len(self._times) else math.inf

    def wait_for_next(self, env: simpy.Environment) -> simpy.Event | None:
        """The event an arrival process yields before `pop`ping the next request: it fires at that
        request's delivery instant (`delivery_instants`, the instants every look-ahead here uses);
        None when it is delivered now."""
        at_s = self._delivered[self.num_arrived]
        return Alarm(env, at_s) if at_s > env.now else None

    def horizon_s(self, num_ahead: int) -> float:
        """When the `num_ahead`-th next request arrives (inf past the last one)."""
        index = self.num_arrived + num_ahead - 1
        return self._times[index] if index < len(self._times) else math.inf

    def pop(self) -> Request:
        """The next request, now arriving (`next_arrival_s` says when)."""
        req = self._ahead.popleft() if self._ahead else next(self._source)
        assert req.arrival_s == self._times[self.num_arrived], "requests out of arrival order"
        self.num_arrived += 1
        return req

    def none_delivered_at(self, instants_s: Sequence[float]) -> bool:
        """No request still to arrive is delivered exactly at one of `instants_s` (ascending): at such
        a tie the order of the two events decides what the engine sees."""
        delivered, first = self._delivered, self.num_arrived
        upcoming = delivered[first:bisect.bisect_right(delivered, instants_s[-1], first)]
        return not upcoming or set(instants_s).isdisjoint(upcoming)

    def delivered_until(self, last_s: float) -> list[tuple[Request, float]]:
        """The requests still to arrive that the arrival process delivers at or before `last_s`, each with
        that instant, in order (the requests up to it are drawn now)."""
        first = self.num_arrived
        num = bisect.bisect_right(self._delivered, last_s, first) - first
        while len(self._ahead) < num:
            self._ahead.append(next(self._source))
        return list(zip(itertools.islice(self._ahead, num), self._delivered[first:first + num], strict=True))


def waiting_before_steps(waiting: deque[Request], num_before: int, starts_s: list[float],
                         delivered: list[tuple[Request, float]]) -> list[int]:
    """The waiting count before each step a burst ran in one wait, as a step-by-step engine records it.

    `num_before` were waiting when it began; the requests that joined since are the queue's tail
    (a burst admits and preempts nothing), each counted from the first step that starts after its
    delivery (`delivered` has their instants; none falls on a step start but the first, `none_delivered_at`).
    """
    num_joined = len(waiting) - num_before
    if not num_joined:
        return [num_before] * len(starts_s)
    joined = {id(req) for req in itertools.islice(reversed(waiting), num_joined)}
    joined_s = [at_s for req, at_s in delivered if id(req) in joined]
    assert len(joined_s) == num_joined, "a request joined the queue outside the burst's arrivals"
    return [num_before + bisect.bisect_left(joined_s, start) for start in starts_s]


@dataclass(slots=True)
class Inbox:
    """Requests dispatched to an engine while it runs a decode burst; it takes them when the step in flight ends.

    With an inbox an engine plans bursts past arrivals to other engines and cuts a burst
    after the step during which a request arrives for it: exactly where a step-by-step
    engine would first see that request. Until then the request counts as waiting.
    """

    requests: list[Request] = field(default_factory=list)
    in_burst: bool = False
    # a burst waited for at once (`wait_burst`): its steps' end instants, how many of them run, and
    # the pending alarm (the latest one rings; an earlier one, superseded by a cut, is ignored)
    step_ends_s: list[float] | None = None
    num_steps: int = 0
    alarm: simpy.Event | None = None
    resume: simpy.Event | None = None
    # a router reads this engine's KV usage (`kv_usage`): the burst's usage after each step, and
    # how many steps a burst run one event per step has done
    observe_kv: bool = False
    usage_after_step: list[float] | None = None
    steps_done: int = 0

    def kv_usage(self, alloc_usage: float, now: float) -> float:
        """`kv_cache_usage_perc` as a step-by-step engine shows it now (`alloc_usage`: the allocator's,
        which a burst brings up to date only when it ends): a step allocates when it is scheduled,
        so the usage after the allocation of the step in flight."""
        usage = self.usage_after_step
        if not self.in_burst or usage is None:
            return alloc_usage
        ends = self.step_ends_s
        done = bisect.bisect_right(ends, now) if ends is not None else self.steps_done  # no step ends exactly now
        return usage[min(done, len(usage) - 1)]

    def wait_burst(self, env: simpy.Environment, step_ends_s: list[float]) -> simpy.Event:
        """Start a burst whose steps end at `step_ends_s`; the event to yield fires when the last one
        ends, or when the step in flight at this engine's next arrival ends (`deliver`)."""
        self.in_burst = True
        self.step_ends_s = step_ends_s
        self.num_steps = len(step_ends_s)
        self.resume = env.event()
        self._set_alarm(env, step_ends_s[-1])
        return self.resume

    def deliver(self, env: simpy.Environment, req: Request) -> None:
        """A request arrives during the burst: it waits here, and a burst waited for at once is cut
        after the step in flight, which a step-by-step engine would end before seeing it."""
        self.requests.append(req)
        ends = self.step_ends_s
        if ends is not None and len(self.requests) == 1:
            in_flight = bisect.bisect_right(ends, env.now) + 1  # no step ends exactly now (`none_delivered_at`)
            if in_flight < self.num_steps:
                self.num_steps = in_flight
                self._set_alarm(env, ends[in_flight - 1])

    def _set_alarm(self, env: simpy.Environment, at_s: float) -> None:
        alarm = self.alarm = Alarm(env, at_s)
        alarm.callbacks.append(self._ring)  # type: ignore[union-attr]

    def _ring(self, alarm: simpy.Event) -> None:
        if alarm is self.alarm:
            assert self.resume is not None
            self.resume.succeed()

    def end_burst(self) -> None:
        self.in_burst = False
        self.step_ends_s = self.alarm = self.resume = self.usage_after_step = None
        self.steps_done = 0


Dispatch = Callable[[Request], int]  # which engine an arriving request goes to (called at its arrival)


def step_loop(env: simpy.Environment, scheduler: Scheduler, latency: LatencyModel, recorder: StepRecorder,
              arrivals: Arrivals, wake: list[simpy.Event], check: bool = False,
              progress: Callable[[float], None] | None = None, bursts: bool = True,
              observed: bool = False, inbox: Inbox | None = None, num_engines: int = 1) -> Generator:
    """One engine's step loop: plan, time, complete; idle until `wake[0]` is triggered (never polls).

    Decode bursts (`kvsim.scheduler.burst`) stop before the run's next arrival (to any engine:
    the dispatcher decides only when it arrives) unless the queue's head is blocked;
    `observed` (a router reads this engine's KV state at arrivals) makes them end before it too.
    With an `inbox` a burst is planned up to the `num_engines`-th next arrival and cut when
    a request arrives for this engine (see `Inbox`).
    """
    steps, next_progress = 0, PROGRESS_EVERY_STEPS
    while True:
        if not scheduler.has_work:
            if arrivals.all_arrived:
                return
            yield wake[0]
            wake[0] = env.event()
            continue
        horizon_s = arrivals.next_arrival_s if inbox is None else arrivals.horizon_s(num_engines)
        burst = scheduler.plan_burst(latency, env.now, horizon_s, observed) if bursts else None
        if burst is not None:
            num_waiting = len(scheduler.waiting)
            # each step's start, then the last one's end, summed as one timeout per step would (`t += d`)
            instants_s = list(itertools.accumulate(burst.durations, initial=env.now))
            rows = recorder.begin_burst(instants_s[:-1], burst, scheduler) if inbox is None else None
            if inbox is not None and inbox.observe_kv:  # usage after each step, as `record` would write it
                held, _, _ = scheduler.alloc.burst_occupancy(burst.seq_ids, len(burst.durations))
                total = scheduler.alloc.num_total_slots
                inbox.usage_after_step = [1.0 - (total - h) / total for h in held]
            ends_s = instants_s[1:]
            if not arrivals.none_delivered_at(ends_s):  # its order needs one event per step
                waiting = []
                if inbox is not None:
                    inbox.in_burst = True
                for d in burst.durations:  # one timeout per step keeps env.now bit-identical to step-by-step
                    waiting.append(len(scheduler.waiting))  # requests may arrive behind a blocked head
                    yield env.timeout(d)
                    if inbox is not None:
                        inbox.steps_done += 1
                        if inbox.requests:
                            break
            elif inbox is not None:  # one wait for the whole burst (it ends at the same instants)
                yield inbox.wait_burst(env, ends_s)
                waiting = [num_waiting] * inbox.num_steps  # arrivals waited in the inbox
            else:  # one wait; arrivals joined the queue behind a blocked head at their instants
                delivered = arrivals.delivered_until(ends_s[-1])  # drawn now: they arrive during the wait
                yield Alarm(env, ends_s[-1])
                waiting = waiting_before_steps(scheduler.waiting, num_waiting, instants_s[:-1], delivered)
            if inbox is not None:  # cut after the step in flight; arrivals waited in the inbox
                burst = Burst(burst.batch, burst.durations[:len(waiting)], burst.seq_ids)
                rows = recorder.begin_burst(instants_s[:len(waiting)], burst, scheduler)
            assert rows is not None
            recorder.end_burst(rows, waiting, scheduler.apply_burst(burst, env.now))
            if inbox is not None:
                inbox.end_burst()
                for req in inbox.requests:
                    scheduler.add(req)
                inbox.requests.clear()
            if check:
                scheduler.alloc.check_invariants()
            steps += len(burst.durations)
            continue
        copies_before = scheduler.alloc.num_copy_on_writes
        plan = scheduler.schedule(env.now)
        plan.num_copied_blocks = scheduler.alloc.num_copy_on_writes - copies_before
        if plan.is_empty:
            if plan.preempted:
                continue  # preemptions freed memory; plan again at the same instant
            if arrivals.all_arrived:
                raise RuntimeError(f"scheduler stalled at t={env.now:.3f}s with "
                                   f"{len(scheduler.waiting)} waiting and nothing runnable")
            yield wake[0]
            wake[0] = env.event()
            continue
        duration = latency.step_time(plan)
        recorder.record(env.now, duration, plan, scheduler)
        yield env.timeout(duration)
        scheduler.complete(plan, env.now)
        if check:
            scheduler.alloc.check_invariants()
        steps += 1
        if progress is not None and steps >= next_progress:
            next_progress += PROGRESS_EVERY_STEPS
            progress(env.now)


def run_engines(engines: Sequence[tuple[Scheduler, LatencyModel]], requests: Iterable[Request],
                dispatch: Dispatch, check: bool = False, progress: ProgressFn | None = None,
                bursts: bool = True, inboxes: Sequence[Inbox] | None = None,
                recorders: Sequence[StepRecorder] | None = None, num_requests: int | None = None,
                ) -> list[StepRecorder]:
    """Run several engines in one simulated clock; each arriving request goes to `dispatch(req)`.

    `requests` in arrival order, a list or a lazy iterator (`kvsim.workload.iter_requests`):
    it is read only as far as the engines look ahead, and no request is kept after it ends
    (its numbers go to its scheduler's `records`). The dispatcher runs inside the arrival
    process, at the request's arrival instant, so it sees every engine's state at that moment
    (a router). Every request ends finished or rejected. `bursts=True` runs stretches of pure
    decode several steps at a time (`kvsim.scheduler.burst`); results are identical to
    `bursts=False`, which plans every step. `inboxes` (one per engine) let bursts run past
    other engines' arrivals; a dispatcher that reads KV state must read it through
    `Inbox.kv_usage` (with `observe_kv` set), since a burst applies its KV growth to the
    allocator only when it ends. `recorders`: one per engine (default: every step kept in
    memory), finished when the run ends. `num_requests`: the total for `progress` (default
    `len(requests)`).
    """
    env = simpy.Environment()
    arrivals = Arrivals(requests)
    total = num_requests if num_requests is not None else len(requests)  # type: ignore[arg-type]
    wakes = [[env.event()] for _ in engines]
    schedulers = [scheduler for scheduler, _ in engines]

    def arrival_process() -> Generator:
        while not arrivals.all_arrived:
            if (delivery := arrivals.wait_for_next(env)) is not None:
                yield delivery
            req = arrivals.pop()
            index = dispatch(req)
            if inboxes is not None and inboxes[index].in_burst:
                inboxes[index].deliver(env, req)
            else:
                schedulers[index].add(req)
            if not wakes[index][0].triggered:
                wakes[index][0].succeed()
        for wake in wakes:  # idle engines learn that nothing more will come, and end
            if not wake[0].triggered:
                wake[0].succeed()

    def report(now: float) -> None:
        assert progress is not None
        progress(now, sum(len(s.records) for s in schedulers), total)

    if recorders is None:
        recorders = [StepRecorder() for _ in engines]
    env.process(arrival_process())
    observed = len(engines) > 1 and inboxes is None
    loops = [env.process(step_loop(env, scheduler, latency, recorder, arrivals, wake, check,
                                   report if progress is not None else None, bursts, observed,
                                   inboxes[i] if inboxes is not None else None, len(engines)))
             for i, ((scheduler, latency), recorder, wake) in enumerate(zip(engines, recorders, wakes, strict=True))]
    env.run(until=loops[0] if len(loops) == 1 else env.all_of(loops))
    for recorder in recorders:
        recorder.finish()
    if progress is not None:
        progress(env.now, total, total)
    return list(recorders)


def run_engine(scheduler: Scheduler, latency: LatencyModel, requests: Iterable[Request], check: bool = False,
               progress: ProgressFn | None = None, bursts: bool = True, recorder: StepRecorder | None = None,
               num_requests: int | None = None) -> StepRecorder:
    """Run arrivals and one engine's step loop to completion (`run_engines` with one engine)."""
    return run_engines([(scheduler, latency)], requests, lambda req: 0, check, progress, bursts,
                       recorders=None if recorder is None else [recorder], num_requests=num_requests)[0]


@dataclass(frozen=True, slots=True)
class EngineParts:
    """One engine built from a scenario: its scheduler (with the KV allocator), latency model and facts."""

    scheduler: Scheduler
    latency: LatencyModel
    facts: dict[str, Any]


def build_engine(scenario: Scenario, rng: np.random.Generator, memory_limit_bytes: int | None = None,
                 steps_in_memory: bool = True) -> EngineParts:
    """The allocator, scheduler and latency model of `scenario`'s model, GPU and engine settings,
    once the run is known to fit in `memory_limit_bytes` (see `kvsim.budget`; `steps_in_memory`:
    the run keeps every step row in memory rather than streaming them or keeping a sample)."""
    model, gpu, engine = load_model(scenario.model), load_gpu(scenario.gpu), scenario.engine
    if scenario.gpu_link is not None:
        gpu = gpu.model_copy(update={"link": scenario.gpu_link})
    max_model_len = engine.resolved_max_model_len(model)
    engine.check_vllm_startup(max_model_len, gpu)
    check_run_memory(scenario, model, gpu, engine, num_gpu_blocks(model, gpu, engine),
                     kv_bytes_per_block(model, engine), memory_limit_bytes, steps_in_memory)
    allocator = make_allocator(model, gpu, engine)
    scheduler = make_scheduler(engine.scheduler, allocator, make_limits(engine, gpu, max_model_len, allocator), rng)
    latency = make_latency(scenario, model, gpu)
    num_blocks = num_gpu_blocks(model, gpu, engine)
    facts = {
        "scenario": scenario.name, "model": model.name, "gpu": gpu.name, "allocator": engine.allocator,
        "scheduler": engine.scheduler, "latency_model": latency.name, "seed": scenario.seed,
        "block_size": engine.block_size, "max_model_len": max_model_len, "num_gpu_blocks": num_blocks,
        "kv_cache_dtype": engine.kv_cache_dtype,
        "vllm_max_concurrency": model_max_concurrency(model, gpu, engine, num_blocks, max_model_len),
    }
    return EngineParts(scheduler, latency, facts)


def engine_result(scenario: Scenario, parts: EngineParts, recorder: StepRecorder, num_requests: int | None = None,
                  steps_path: Path | None = None) -> RunResult:
    """The finished engine's tables and summary, from its scheduler's `records` (every request it was
    given, `num_requests` if known) and its recorder's totals over every step. `steps_path`: where
    the recorder's writer put the rows (they are read from there on access)."""
    scheduler = parts.scheduler
    assert num_requests is None or len(scheduler.records) == num_requests, "a request went missing"
    assert scheduler.alloc.num_held_slots == 0, "KV still held after the run"
    recorder.finish()
    request_columns = scheduler.records.columns()
    summary = summarize(request_columns, recorder.totals, scheduler, parts.facts)
    rows = None if steps_path is not None and scenario.steps == "all" else recorder.kept_columns()
    return RunResult(scenario=scenario, request_columns=request_columns, step_columns=rows, summary=summary,
                     steps_path=steps_path)


def least_loaded(schedulers: Sequence[Scheduler]) -> int:
    """vLLM's DP load balancing: the engine with the lowest `4 · waiting + running`, the first on a
    tie (vllm/v1/engine/core_client.py, DPLBAsyncMPClient.get_core_engine_for_request)."""
    scores = [4 * len(s.waiting) + len(s.running) for s in schedulers]
    return scores.index(min(scores))


def lockstep_loop(env: simpy.Environment, schedulers: Sequence[Scheduler], latencies: Sequence[LatencyModel],
                  recorders: Sequence[StepRecorder], arrivals: Arrivals, wake: list[simpy.Event],
                  check: bool = False) -> Generator:
    """Data-parallel engines whose MoE layers step together (vLLM runs every DP rank in lockstep
    for MoE models, idle ranks on a dummy batch): each engine plans its own step, every plan
    learns the group's token count (`StepPlan.num_dp_group_tokens`), and the step lasts as long
    as the slowest engine's."""
    while True:
        if not any(s.has_work for s in schedulers):
            if arrivals.all_arrived:
                return
            yield wake[0]
            wake[0] = env.event()
            continue
        plans = [s.schedule(env.now) if s.has_work else None for s in schedulers]
        busy = [(i, p) for i, p in enumerate(plans) if p is not None and not p.is_empty]
        if not busy:
            if any(p is not None and p.preempted for p in plans):
                continue
            if arrivals.all_arrived:
                raise RuntimeError(f"DP engines stalled at t={env.now:.3f}s")
            yield wake[0]
            wake[0] = env.event()
            continue
        group_tokens = sum(p.num_tokens for _, p in busy)
        for _, p in busy:
            p.num_dp_group_tokens = group_tokens
        duration = max(latencies[i].step_time(p) for i, p in busy)
        for i, p in busy:
            recorders[i].record(env.now, duration, p, schedulers[i])
        yield env.timeout(duration)
        for i, p in busy:
            schedulers[i].complete(p, env.now)
            if check:
                schedulers[i].alloc.check_invariants()


def simulate_data_parallel(scenario: Scenario, check: bool = False) -> RunResult:
    """`data_parallel_size` engines, each with its own scheduler and KV pool, behind vLLM's DP
    load balancer, stepping in lockstep (`lockstep_loop`). The result holds every request
    (column `dp_rank`) and the engines' steps (those `scenario.steps` keeps); the summary describes
    the deployment: running and waiting counts and scheduler counters summed over the engines, pool
    shares averaged over them (`kvsim.metrics.dp_group_steps`)."""
    import pandas as pd  # only here on the run path: concatenating and regrouping the engines' tables

    rng = np.random.default_rng(scenario.seed)
    parts = [build_engine(scenario, rng) for _ in range(scenario.engine.data_parallel_size)]
    schedulers = [p.scheduler for p in parts]
    env = simpy.Environment()
    arrivals = Arrivals(iter_requests(scenario, parts[0].facts["max_model_len"], rng))
    wake = [env.event()]

    def arrival_process() -> Generator:
        while not arrivals.all_arrived:
            if (delivery := arrivals.wait_for_next(env)) is not None:
                yield delivery
            schedulers[least_loaded(schedulers)].add(arrivals.pop())
            if not wake[0].triggered:
                wake[0].succeed()
        if not wake[0].triggered:
            wake[0].succeed()

    recorders = [StepRecorder() for _ in parts]
    env.process(arrival_process())
    env.run(until=env.process(lockstep_loop(env, schedulers, [p.latency for p in parts], recorders, arrivals,
                                            wake, check)))
    every_step = scenario.model_copy(update={"steps": "all"})
    results = [engine_result(every_step, p, recorder) for p, recorder in zip(parts, recorders, strict=True)]
    assert sum(len(r.requests) for r in results) == arrivals.num_arrived, "a request went missing"
    requests_df = pd.concat([r.requests.assign(dp_rank=i) for i, r in enumerate(results)]).sort_values(
        "request_id", kind="stable").reset_index(drop=True)
    steps_df = pd.concat([r.steps.assign(dp_rank=i) for i, r in enumerate(results)]).sort_values(
        ["time_s", "dp_rank"], kind="stable").reset_index(drop=True)
    summary = summarize(requests_df, dp_group_steps(steps_df, len(parts)), schedulers[0],
                        {**parts[0].facts, "data_parallel_size": len(parts)})
    for key, attr in (("num_preemptions", "num_preemptions"), ("num_prefix_cache_query_tokens",
                      "num_prefix_query_tokens"), ("num_prefix_cache_hit_tokens", "num_prefix_hit_tokens"),
                      ("num_prefix_cache_preempted_query_tokens", "num_preempted_query_tokens"),
                      ("num_prefix_cache_preempted_hit_tokens", "num_preempted_hit_tokens"),
                      ("swapped_out_bytes", "num_swapped_out_bytes")):
        summary[key] = sum(getattr(s, attr) for s in schedulers)
    summary["num_copy_on_writes"] = sum(s.alloc.num_copy_on_writes for s in schedulers)
    queries = summary["num_prefix_cache_query_tokens"]
    summary["prefix_cache_hit_rate"] = summary["num_prefix_cache_hit_tokens"] / queries if queries else 0.0
    kept = kept_step_index(len(steps_df), scenario.steps)
    if kept is not None:
        steps_df = steps_df.iloc[kept].reset_index(drop=True)
    return RunResult(scenario=scenario, request_columns=frame_columns(requests_df),
                     step_columns=frame_columns(steps_df), summary=summary)


def simulate(scenario: Scenario, check: bool = False, progress: ProgressFn | None = None,
             bursts: bool = True, steps: StepsMode | None = None,
             memory_limit_bytes: int | None = None, out_dir: str | Path | None = None,
             steps_format: StepsFormat = "auto") -> RunResult:
    """Simulate a scenario end to end. `check=True` runs `check_invariants()` after every step.

    With `engine.data_parallel_size` > 1, the DP engines run together (`simulate_data_parallel`).
    `steps` overrides the scenario's `steps` (which per-step rows the result keeps and writes).
    A run that cannot fit in `memory_limit_bytes` [the machine's memory] is refused up front.

    `out_dir`: write the run there as it goes (`RunResult.write`'s files and rules: new or an
    earlier kvsim run, swapped in complete). The per-step rows then stream to disk in chunks
    (`steps.parquet` with pyarrow, else `steps.csv`; `steps_format` chooses) instead of staying
    in memory, and the result's `steps` reads them back from there when asked.
    """
    if steps is not None:
        scenario = scenario.model_copy(update={"steps": steps})
    if scenario.replicas is not None:
        raise KvsimError(f"replicas={scenario.replicas!r}: a fleet scenario; use kvsim.fleet.simulate_fleet")
    if scenario.engine.data_parallel_size > 1:
        result = simulate_data_parallel(scenario, check)  # its steps are kept in memory
        if out_dir is not None:
            with output_directory(out_dir, "run") as tmp:
                if scenario.steps != "none":  # the same file a single engine's run streams to
                    assert result.step_columns is not None, "data-parallel steps are kept in memory"
                    dp_writer = StepWriter(tmp, steps_format)
                    dp_writer.write(result.step_columns)
                    dp_writer.close()
                write_run_files(tmp, result, steps=False)
        return result
    if out_dir is None:
        return simulate_single(scenario, check, progress, bursts, memory_limit_bytes, StepRecorder(scenario.steps))
    final = check_output_dir(out_dir, "run")  # refused before simulating, not after
    with output_directory(out_dir, "run") as tmp:
        writer = StepWriter(tmp, steps_format) if scenario.steps != "none" else None
        result = simulate_single(scenario, check, progress, bursts, memory_limit_bytes,
                                 StepRecorder(scenario.steps, writer),
                                 None if writer is None else final / writer.path.name)
        write_run_files(tmp, result, steps=False)
    return result


def simulate_single(scenario: Scenario, check: bool, progress: ProgressFn | None, bursts: bool,
                    memory_limit_bytes: int | None, recorder: StepRecorder, steps_path: Path | None = None,
                    ) -> RunResult:
    """One engine, its requests drawn lazily (`iter_requests`), its steps into `recorder` (whose writer,
    if any, puts them at `steps_path` once the output is swapped in)."""
    rng = np.random.default_rng(scenario.seed)  # the run's only source of randomness
    parts = build_engine(scenario, rng, memory_limit_bytes, steps_in_memory=recorder.keeps_all_rows)
    requests = iter_requests(scenario, parts.facts["max_model_len"], rng)
    num_requests = scenario.workload.num_requests  # an upper bound for progress (a trace may hold fewer)
    run_engine(parts.scheduler, parts.latency, requests, check=check, progress=progress, bursts=bursts,
               recorder=recorder, num_requests=num_requests)
    return engine_result(scenario, parts, recorder, steps_path=steps_path)
