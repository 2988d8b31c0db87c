"""The step loop and the one driver: `plan = scheduler.schedule(now)` → wait `latency.step_time(plan)` →
`scheduler.complete`, for N engines behind a dispatcher; a single engine is a fleet of one.

    arrivals:  for each request: wait until it arrives → dispatch(req, now) → engine.deliver (queue, wake)
    a group:   loop: if idle, sleep on the group's wake-up (no polling)
                     a decode burst if the engine can run one (`Engine.run_burst`), else
                     plan = schedule(now) on every member   (a group of one: one engine)
                     yield timeout(max step_time)             (a lockstep data-parallel group: the slowest)
                     complete(plan, now) on every member
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import simpy

from kvsim.engine.clock import ArrivalClock, Arrivals, Wakeup, call_at, past_the_clock
from kvsim.engine.recorder import StepRecorder
from kvsim.engine.runtime import Engine
from kvsim.engine.turns import TurnArrivals
from kvsim.latency.base import LatencyModel
from kvsim.latency.cudagraph import coordinate_dp_group
from kvsim.model.errors import HeldKvStall, expect_function
from kvsim.sched import Scheduler
from kvsim.sched.burst import Burst, plan_burst
from kvsim.workload.conversations import Conversations
from kvsim.workload.generate import MAX_INSTANT_S
from kvsim.workload.request import Request

ProgressFn = Callable[[float, int, int], None]  # (simulated seconds, requests done, requests total)
PROGRESS_EVERY_STEPS = 64  # steps between progress calls: a step can take milliseconds of wall time (a large batch)

Dispatch = Callable[[Request, float], int]  # which engine an arriving request goes to (called at its arrival, now)


def step_loop(env: simpy.Environment, group: Sequence[Engine], arrivals: ArrivalClock, check: bool = False,
              progress: Callable[[float], None] | None = None, bursts: bool = True, num_engines: int = 1,
              ) -> Generator:
    """The step loop of one engine, or of data-parallel engines whose MoE layers step together (vLLM
    runs every DP rank in lockstep for MoE models, idle ranks on a dummy batch): each member plans its
    own step, every plan learns the group's token count (`StepPlan.num_dp_group_tokens`), and the
    step lasts as long as the slowest member's. Idle until the group's wake-up rings (never polls).

    A lone engine may run decode bursts (`kvsim.sched.burst`), planned up to the `num_engines`-th
    next arrival (the dispatcher decides where each goes only when it arrives) and cut when a
    request joins its queue (`Engine.run_burst`): this is the one place they are run.
    An engine's `at_step_boundary` (if set) is called before each of its steps is planned and after
    each wake-up (a disaggregated decode instance reserves KV for pending transfers there).
    Each scheduler is told what outside it can still change it (`outside_state`), for its livelock check
    (`kvsim.sched.livelock`: `SchedulingLivelock` where a self-preemption comes back to a state seen before).
    """
    steps, next_progress = 0, PROGRESS_EVERY_STEPS
    wakeup, lone = group[0].wakeup, group[0] if len(group) == 1 else None
    boundaries = [engine.at_step_boundary for engine in group if engine.at_step_boundary is not None]
    for engine in group:
        engine.scheduler.outside_state = outside_state(engine, arrivals)
    next_burst = None
    if lone is not None and not boundaries and lone.scheduler.hand_off is None:
        def next_burst(now: float) -> Burst | None:  # booked back to back while nothing else is due
            return plan_burst(lone.scheduler, lone.latency, now, arrivals.horizon_s(num_engines),
                              lone.scheduler.async_scheduling)
    while True:
        for at_boundary in boundaries:
            at_boundary(env.now)
        if progress is not None and steps >= next_progress:  # here, so that decode bursts count too
            next_progress = steps + PROGRESS_EVERY_STEPS
            progress(env.now)
        for engine in group:
            if engine.inbox:  # async scheduling: requests that arrived meanwhile
                engine.see_arrivals(env.now)
        if not any(engine.scheduler.has_work or engine.inbox for engine in group):
            if arrivals.all_arrived:
                for engine in group:  # the callback refers to its engine: leave no reference cycle behind
                    engine.scheduler.outside_state = None
                return
            yield from wakeup.wait()
            continue
        if bursts and lone is not None and not lone.inbox:
            burst = plan_burst(lone.scheduler, lone.latency, env.now, arrivals.horizon_s(num_engines),
                               lone.scheduler.async_scheduling)
            if burst is not None:
                steps += yield from lone.run_burst(env, burst, arrivals, next_burst, check)
                if check:
                    lone.scheduler.check_invariants()
                continue
        releasing = any(engine.scheduler.finishing for engine in group)  # async: KV freed once this plan is made
        plans = []
        for engine in group:
            scheduler = engine.scheduler
            if scheduler.has_work:
                plans.append((engine, scheduler.schedule(env.now, engine.planned_at_s(env.now))))
        busy = [(engine, plan) for engine, plan in plans if not plan.is_empty]
        if not busy:
            # plan again now where the empty plan changed something: preemptions (or, async, finished requests' KV
            # released) freed memory, or it let requests go (v0); async, requests arrived meanwhile; a verify passed
            # over at max_model_len (`V1Scheduler.select`) runs in the next plan
            if (releasing or any(plan.preempted or plan.ignored for _, plan in plans)
                    or any(engine.inbox or (engine.scheduler.running and engine.scheduler.speculation is not None)
                           for engine in group)):
                for engine in group:
                    engine.ran_empty_step(env.now)
                continue
            if arrivals.all_arrived and not any(engine.scheduler.awaits_transfers for engine in group):
                raise_held_kv_stall(group)  # a deadlock vLLM's scheduler has too: said in one line
                num_waiting = sum(len(engine.scheduler.waiting) for engine in group)
                raise RuntimeError(f"scheduler stalled at t={env.now:.3f}s with {num_waiting} waiting and "
                                   "nothing runnable")
            yield from wakeup.wait()
            continue
        if lone is None:  # the ranks' MoE layers run together, CUDA-graph padded alike (`kvsim.latency.cudagraph`)
            coordinate_dp_group([plan for _, plan in busy], len(group),
                                busy[0][0].latency.cudagraph_padding)
        duration = max(engine.latency.step_time(plan) for engine, plan in busy)
        if env.now + duration > MAX_INSTANT_S:
            raise past_the_clock(f"latency={busy[0][0].latency.name}: a step of {duration:g} s", env.now + duration)
        for engine, plan in busy:
            engine.recorder.record(env.now, duration, plan, engine.snapshot())
            engine.step_start_s, engine.step_end_s = env.now, env.now + duration
        yield env.timeout(duration)
        for engine, plan in busy:
            engine.scheduler.complete(plan, env.now)
            if check:
                engine.scheduler.check_invariants()
        steps += 1


def outside_state(engine: Engine, arrivals: ArrivalClock) -> Callable[[], tuple[Any, ...] | None]:
    """`Scheduler.outside_state` for `engine`: None while something timed may still reach it (an arrival to come
    or not yet seen, a KV transfer or load it waits for in flight); else what outside its scheduler its steps
    still read, and only its steps change: () for an engine every request has reached, a disaggregated decode
    instance's hand-offs waiting for its blocks (`Engine.upstream_state`, None while a prefill instance may still
    hand one off or a transfer is in flight)."""
    scheduler, upstream = engine.scheduler, engine.upstream_state
    if upstream is not None:
        return lambda: None if engine.inbox or scheduler.awaits_transfers else upstream()
    return lambda: (() if arrivals.all_arrived and not engine.inbox and not scheduler.num_remote_waiting
                    and not scheduler.awaits_transfers else None)


def raise_held_kv_stall(engines: Iterable[Engine]) -> None:
    """Raise `HeldKvStall` with the first engine's line where one is in vLLM's held-KV deadlock
    (`Scheduler.held_kv_stall`); return otherwise."""
    for engine in engines:
        if (reason := engine.scheduler.held_kv_stall()) is not None:
            raise HeldKvStall(reason) from None  # raised while simpy's RuntimeError is handled, too


@dataclass(slots=True)
class LateEngines:
    """Engines that join a run while it goes (`run_engines`' `late`: an autoscaler builds a replica when it first
    starts it, not up front). `run_engines` sets `start(engine, clock)`: the engine joins as a group of its own
    (its wake-up, its offload and client hooks, its step loop begun now), exactly as if it had been there idle from
    the start: an idle loop only waits, and every loop plans its decode bursts up to the `num_engines`-th next
    arrival, the count of every engine the run may have. The run ends when every loop, a late one's too, has."""

    num_engines: int
    start: Callable[[Engine, ArrivalClock], None] | None = None


def expect_progress(progress: object) -> None:
    """Refuse a `progress` that is neither None nor a function taking (simulated seconds, requests done, requests in
    all) in one `KvsimError` line (`expect_function`): `progress=5` stopped the run at its first report, a TypeError
    traceback (the fleet APIs' too, which `run_engines` checks for)."""
    expect_function(progress, "progress", 3, "a function (simulated_s, done, total) or None")


def run_engines(groups: Sequence[Sequence[Engine]], requests: Iterable[Request] | Conversations, dispatch: Dispatch,
                check: bool = False, progress: ProgressFn | None = None, bursts: bool = True,
                clocks: Callable[[simpy.Environment, ArrivalClock], Sequence[ArrivalClock]] | None = None,
                max_in_flight: int | None = None, fan_out: Callable[[Request], list[Request]] | None = None,
                late: LateEngines | None = None) -> None:
    """Run engine groups (one engine each, or a lockstep data-parallel group) in one simulated clock;
    each arriving request goes to engine `dispatch(req, now)` (an index into the groups' engines, in order),
    or, with `fan_out`, each of the requests `fan_out(req)` sends in its place, in order (a data-parallel
    front end fans a parallel-sampling request out into children before its balancer routes each one).

    `requests` in arrival order, a list or a lazy iterator (`kvsim.workload.generate.iter_requests`):
    it is read only as far as the arrivals go, and no request is kept after it ends (its numbers
    go to its scheduler's `records`). The dispatcher runs inside the arrival process, at the
    request's arrival instant, so it sees every engine's state at that moment (a router; KV usage
    through `Engine.kv_usage`). Every request ends finished or rejected, or the run raises `HeldKvStall` for
    vLLM's held-KV deadlock (`Scheduler.held_kv_stall`: an engine whose clock has every arrival says it;
    one still fed, a decode instance with transfers pending, once no event is left). `bursts=True` runs
    stretches of pure decode several steps at a time (`kvsim.sched.burst`); results are identical
    to `bursts=False`, which plans every step. Every engine's recorder is finished when the run
    ends. `progress`'s total is the number of requests the run sends (a trace shorter than the scenario's
    `num_requests` sends its rows: the total was `num_requests`, `10/10 requests` for a run of 3).
    `clocks(env, arrivals)`, if given, is called once the clock exists and returns the arrival clock
    each group's loop reads (default: the run's arrivals): engines fed by other engines, not by arrivals.
    `max_in_flight` (a closed-loop client, `workload.max_concurrency`): a request that arrives while that many
    are in flight (sent and not yet finished or rejected, over every engine) waits in the client, first come
    first sent, until one ends; it is then sent at that instant, which becomes its `arrival_s` (the wait is its
    `client_queue_s`), as `vllm bench serve --max-concurrency` sends. Every engine wakes the client at each of
    its step boundaries (`Engine.at_step_boundary`, which must be unset), and decode bursts are off: their
    look-ahead knows the arrival instants, not when a slot frees.
    `requests` as `Conversations` (`workload.multi_turn.timing: after_reply`): a chat client sends each
    conversation's next turn after the previous one ended (`kvsim.engine.turns.TurnArrivals`: request ids in
    send order; every engine's `at_step_boundary` is its, and decode bursts are off), behind `max_in_flight`
    too if given.
    """
    expect_progress(progress)
    env = simpy.Environment()
    groups = list(groups)  # a late engine joins as a group of its own (`late`)
    engines = [engine for group in groups for engine in group]
    turns = TurnArrivals(env, requests, engines) if isinstance(requests, Conversations) else None
    arrivals = turns if turns is not None else Arrivals(cast(Iterable[Request], requests))
    total = len(arrivals)
    slot_freed = Wakeup(env)  # rung only for a closed-loop client
    if turns is not None or max_in_flight is not None:
        bursts = False

    def wire(group: Sequence[Engine]) -> None:
        """The group's wake-up, rung by an offload load's end too; a closed-loop client's step boundaries."""
        wakeup = Wakeup(env)
        for engine in group:
            engine.wakeup = wakeup
            if engine.scheduler.offload is not None:
                engine.scheduler.offload.on_next_load_end = _ring_at(env, wakeup)
            if turns is None and max_in_flight is not None:
                assert engine.at_step_boundary is None, "a closed-loop client's engines mark no other step boundary"
                engine.at_step_boundary = lambda now: slot_freed.ring()

    for group in groups:
        wire(group)

    def send(req: Request) -> None:
        for each in fan_out(req) if fan_out is not None else (req,):
            engines[dispatch(each, env.now)].deliver(env.now, each)

    def arrival_process() -> Generator:
        if turns is not None:
            yield from turns.client(send, max_in_flight)
        else:
            assert isinstance(arrivals, Arrivals)
            num_sent = 0

            def num_in_flight() -> int:  # sent and not yet ended (an engine records each request that ends)
                return num_sent - sum(len(engine.scheduler.records) for engine in engines)

            while not arrivals.all_arrived:
                if (delivery := arrivals.wait_for_next(env)) is not None:
                    yield delivery
                while max_in_flight is not None and num_in_flight() >= max_in_flight:
                    yield from slot_freed.wait()
                held_back = env.now > arrivals.next_delivery_s
                req = arrivals.pop()
                if held_back:  # sent now: vllm bench serve's TTFT and E2E count from the send, its queue_times the wait
                    req.client_queue_s, req.arrival_s = env.now - req.arrival_s, env.now
                send(req)
                num_sent += 1
        for group in groups:  # idle engines learn that nothing more will come, and end
            group[0].wakeup.ring()

    def report(now: float) -> None:
        assert progress is not None
        progress(now, sum(len(engine.scheduler.records) for engine in engines), total)

    num_engines = late.num_engines if late is not None else len(engines)
    starting, loops = list(groups), []  # the groups given; every group's loop, a late one's too

    def loop(group: Sequence[Engine], clock: ArrivalClock) -> simpy.Process:
        return env.process(step_loop(env, group, clock, check, report if progress is not None else None, bursts,
                                     num_engines))

    def start_late(engine: Engine, clock: ArrivalClock) -> None:
        wire([engine])
        groups.append([engine])
        engines.append(engine)  # the client's list too (`TurnArrivals`, which sees the engine join)
        if turns is not None:
            turns.join(engine)
        loops.append(loop([engine], clock))

    if late is not None:
        late.start = start_late
    env.process(arrival_process())
    group_clocks = clocks(env, arrivals) if clocks is not None else [arrivals] * len(starting)
    loops += [loop(group, clock) for group, clock in zip(starting, group_clocks, strict=True)]
    try:
        env.run(until=loops[0] if len(loops) == 1 else env.all_of(loops))
        while not all(each.processed for each in loops):  # loops that began while it ran (`late`)
            env.run(until=env.all_of(loops))
    except RuntimeError:
        if env.peek() < math.inf:  # not simpy's "no scheduled events left": every loop waits for good
            raise
        raise_held_kv_stall(engines)  # on an engine still fed (a decode instance, its transfers pending)
        raise
    for engine in engines:
        engine.recorder.finish()
    if progress is not None:
        progress(env.now, total, total)


def _ring_at(env: simpy.Environment, wakeup: Wakeup) -> Callable[[float], None]:
    """An offload connector's `on_next_load_end`: ring `wakeup` at the instant given, the latest only (a new
    instant replaces the older one), so an engine idle while a load (or a store a request awaits) is in flight
    wakes when it ends."""
    latest: list[object] = [None]

    def arm(at_s: float) -> None:
        token = latest[0] = object()

        def ring() -> None:
            if token is latest[0]:
                wakeup.ring()
        call_at(env, max(at_s, env.now), ring)
    return arm


def run_engine(scheduler: Scheduler, latency: LatencyModel, requests: Iterable[Request] | Conversations,
               check: bool = False, progress: ProgressFn | None = None, bursts: bool = True,
               recorder: StepRecorder | None = None, max_in_flight: int | None = None) -> StepRecorder:
    """Run arrivals and one engine's step loop to completion (`run_engines` with one engine)."""
    engine = Engine(scheduler, latency, recorder if recorder is not None else StepRecorder())
    run_engines([[engine]], requests, lambda req, now: 0, check, progress, bursts, max_in_flight=max_in_flight)
    return engine.recorder


def least_loaded(engines: Sequence[Engine]) -> int:
    """vLLM's DP load balancing: the engine with the lowest `4 · waiting + running`, the first on a
    tie (vllm/v1/engine/core_client.py, DPLBAsyncMPClient.get_core_engine_for_request), from the counts each
    engine reports (`Scheduler.get_request_counts`: a request loading its KV is waiting) and the requests
    sent to it that its scheduler has not seen yet (`Engine.num_waiting`: an async engine's inbox), as the
    client adds each request it sends to its engine's waiting count at once. Without them, requests that
    arrived together under async scheduling, vLLM's default, all went to engine 0."""
    scores = [4 * e.num_waiting + len(e.scheduler.running) for e in engines]
    return scores.index(min(scores))
