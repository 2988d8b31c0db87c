"""The step loop: `plan = scheduler.schedule(now)` → wait `latency.step_time(plan)` → `scheduler.complete`,
for one engine, N engines behind a dispatcher, or a lockstep data-parallel group.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import TYPE_CHECKING

import simpy

from kvsim.engine.clock import Alarm, Arrivals, Inbox, waiting_before_steps
from kvsim.engine.recorder import StepRecorder
from kvsim.latency.base import LatencyModel
from kvsim.sched import Scheduler
from kvsim.sched.burst import Burst
from kvsim.workload.request import Request

if TYPE_CHECKING:
    pass



ProgressFn = Callable[[float, int, int], None]  # (simulated seconds, requests done, requests total)
PROGRESS_EVERY_STEPS = 2000

Dispatch = Callable[[Request], int]  # which engine an arriving request goes to (called at its arrival)


def step_loop(env: simpy.Environment, scheduler: Scheduler, latency: LatencyModel, recorder: StepRecorder,
              arrivals: Arrivals, wake: list[simpy.Event], check: bool = False,
              progress: Callable[[float], None] | None = None, bursts: bool = True,
              observed: bool = False, inbox: Inbox | None = None, num_engines: int = 1) -> Generator:
    """One engine's step loop: plan, time, complete; idle until `wake[0]` is triggered (never polls).

    Decode bursts (`kvsim.sched.burst`) stop before the run's next arrival (to any engine:
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
            rows = recorder.begin_burst(instants_s[:-1], burst, scheduler.snapshot()) if inbox is None else None
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
                rows = recorder.begin_burst(instants_s[:len(waiting)], burst, scheduler.snapshot())
            assert rows is not None
            recorder.end_burst(rows, waiting, scheduler.apply_burst(burst, env.now))
            if inbox is not None:
                inbox.end_burst()
                for req in inbox.requests:
                    scheduler.add(req)
                inbox.requests.clear()
            if check:
                scheduler.check_invariants()
            steps += len(burst.durations)
            continue
        plan = scheduler.schedule(env.now)
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
        recorder.record(env.now, duration, plan, scheduler.snapshot())
        yield env.timeout(duration)
        scheduler.complete(plan, env.now)
        if check:
            scheduler.check_invariants()
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

    `requests` in arrival order, a list or a lazy iterator (`kvsim.workload.generate.iter_requests`):
    it is read only as far as the engines look ahead, and no request is kept after it ends
    (its numbers go to its scheduler's `records`). The dispatcher runs inside the arrival
    process, at the request's arrival instant, so it sees every engine's state at that moment
    (a router). Every request ends finished or rejected. `bursts=True` runs stretches of pure
    decode several steps at a time (`kvsim.sched.burst`); results are identical to
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
            recorders[i].record(env.now, duration, p, schedulers[i].snapshot())
        yield env.timeout(duration)
        for i, p in busy:
            schedulers[i].complete(p, env.now)
            if check:
                schedulers[i].check_invariants()


