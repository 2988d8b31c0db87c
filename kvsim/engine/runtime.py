"""One engine at run time: its scheduler, latency model and step recorder, the wake-up it sleeps on
when idle, and the decode burst it runs now, if any: the engine side of `kvsim.sched.burst`.

A burst (several pure-decode steps priced and booked at once) is exact only if nobody can tell
it from the steps it stands for, and that is this module's contract:

* the clock: the burst ends on the very float instants its steps would (`call_at`), waited for
  in one event, or one timeout per step where a delivery falls exactly on a step's end;
* requests that arrive meanwhile are added (or rejected) at once (`deliver`), as step by step:
  a router counting outstanding requests sees the same numbers. A burst planned with an empty
  queue is cut after the step in flight when one joins (the next step would admit it);
* the KV usage a router reads mid-burst is the usage after the allocation of the step in
  flight (`kv_usage`), from the allocator's `burst_occupancy`;
* the step rows: the waiting count before each step counts the requests that joined by then;
* a burst that ends before anything else is due in the simulation (SimPy's next event) is booked
  without waiting for it, and the next one is planned from its end: nobody could have seen it run.

With async scheduling (`engine.async_scheduling`, vLLM's default: `kvsim.sched.async_steps`) vLLM plans
each step while the one before it runs, so a request that arrives while a step runs is first seen by the
step after the next one. An engine keeps such requests in its `inbox` (accepted, not yet queued) and
queues them when the step that can see them is planned (`see_arrivals`): the step starting now was
planned when the previous one started, so it sees what had arrived by then, and everything that arrived
by now if the engine was idle (vLLM's pipeline was empty). A burst is cut one step later than it would
be without async scheduling, and its steps are bounded by the arrival one step later (`plan_burst`'s
`planned_ahead`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from kvsim.engine.clock import ArrivalClock, Wakeup, at_instant, call_at, past_the_clock
from kvsim.engine.recorder import StepRecorder
from kvsim.latency.base import LatencyModel
from kvsim.sched import Scheduler, SchedulerSnapshot
from kvsim.sched.burst import Burst, apply_burst
from kvsim.workload.generate import MAX_INSTANT_S
from kvsim.workload.request import Request


@dataclass(slots=True, eq=False)
class BurstInFlight:
    """A burst an engine runs now: its steps' end instants and how many of them will run."""

    env: simpy.Environment
    starts_s: list[float]
    ends_s: list[float]
    num_steps: int
    cut_on_join: bool  # planned with an empty queue: a request joining it ends the burst after the step in flight
    planned_ahead: bool  # async scheduling: a step is planned when the one before it starts (`Engine.deliver`)
    one_wait: bool  # waited for in one event: no delivery falls on one of its step ends
    usage_after_step: list[float] | None  # kv_cache_usage_perc after each step's allocation (if a router reads it)
    done: simpy.Event  # fires when its last step (after a cut: the step in flight) has ended
    joined_s: list[float] = field(default_factory=list)  # when each request that joined the queue meanwhile did
    steps_done: int = 0  # steps ended, counted by the engine (one timeout per step)
    _timer: object = None  # the pending end (a cut replaces it; the replaced one is ignored)

    def steps_ended(self, now: float) -> int:
        """Steps ended by `now`: in one wait no step ends exactly at a delivery, so none ends now."""
        return bisect.bisect_right(self.ends_s, now) if self.one_wait else self.steps_done

    def end_after(self, num_steps: int) -> None:
        """Run `num_steps` steps (fewer than planned: a cut)."""
        self.num_steps = num_steps
        if self.one_wait:
            token = self._timer = object()
            call_at(self.env, self.ends_s[num_steps - 1], lambda: self._ring(token))

    def _ring(self, token: object) -> None:
        if token is self._timer:
            self.done.succeed()

    def join(self, now: float, num_requests: int = 1) -> None:
        """`num_requests` requests joined the engine's queue at `now` (a v1 request with n > 1 samples is n)."""
        self.joined_s.extend([now] * num_requests)
        if self.cut_on_join:
            self.cut(now)

    def cut(self, now: float) -> None:
        """End the burst (if before its planned end) before the first step that sees a request joining at
        `now`: the step after the one in flight; with async scheduling the first whose previous step
        starts at or after `now` (by the clock alone: the order of events at one instant plays no part)."""
        last = bisect.bisect_left(self.starts_s, now) + 1 if self.planned_ahead else self.steps_ended(now) + 1
        if last < self.num_steps:
            self.end_after(last)


@dataclass(slots=True, eq=False)
class Engine:
    """One engine's run-time state (`kvsim.engine.loop.run_engines` gives it its `wakeup`).

    `observe_kv`: a dispatcher reads this engine's KV usage at arrivals (`kv_usage`), so a burst
    works out the usage after each of its steps before it runs.
    """

    scheduler: Scheduler
    latency: LatencyModel
    recorder: StepRecorder
    observe_kv: bool = False
    at_step_boundary: Callable[[float], None] | None = None  # see `kvsim.engine.loop.step_loop`
    # what still feeds the engine once its clock's arrivals cannot say it: a disaggregated decode instance's hand-offs
    # waiting for its blocks (`kvsim.engine.loop.outside_state`)
    upstream_state: Callable[[], tuple[Any, ...] | None] | None = None
    wakeup: Wakeup = field(init=False)
    burst: BurstInFlight | None = field(default=None, init=False)
    inbox: list[tuple[float, Request]] = field(default_factory=list, init=False)  # (delivered at, request)
    step_start_s: float = field(default=-1.0, init=False)  # the last step's start and end (the loop sets them)
    step_end_s: float = field(default=-1.0, init=False)

    def deliver(self, now: float, req: Request) -> None:
        """A request arrives for this engine at `now`: rejected at once if it can never be served, else
        queued (with async scheduling: kept in the inbox until a step that can see it is planned,
        `see_arrivals`); then the engine is woken."""
        scheduler = self.scheduler
        if scheduler.async_scheduling:
            accepted = scheduler.accept(req)
            if accepted:
                self.inbox.append((now, req))
        else:
            accepted = scheduler.add(req)
        if accepted and self.burst is not None:
            self.burst.join(now, scheduler.num_queued(req))
        self.wakeup.ring()

    def planned_at_s(self, now: float) -> float:
        """When vLLM decided the step that starts at `now`: with async scheduling, at the start of the step
        that ends now, if one does (it planned this one while that one ran, even when that step computes the
        last token of every request: it passes them over, and if nothing it had seen by then is admitted, the
        plan is empty and the loop plans again at once, with their KV and slots released, `ran_empty_step`);
        else now (nothing in flight: it plans and runs at once)."""
        if self.step_end_s == now and self.scheduler.async_scheduling:
            return self.step_start_s
        return now

    def ran_empty_step(self, now: float) -> None:
        """The step planned at `now` was empty, and the next is planned at once. With async scheduling vLLM's
        empty plan fills its batch queue without a step: the engine core then processes the output of the step
        in flight, takes the requests that arrived meanwhile and plans again (`EngineCore.step_with_batch_queue`),
        so the next plan is made now, after that output, and sees every arrival so far: an empty step from
        `now` to `now` (`planned_at_s`)."""
        self.step_start_s = self.step_end_s = now
        self.see_arrivals(now, everything=True)

    def see_arrivals(self, now: float, everything: bool = False) -> None:
        """Queue the inbox's requests the step planned at `now` can see: those delivered by the time vLLM
        planned it (`planned_at_s`), or with `everything` (nothing else can be planned now) all delivered
        by now. Only async scheduling keeps an inbox."""
        inbox = self.inbox
        cutoff = now if everything else self.planned_at_s(now)
        num_seen = 0
        for delivered_s, req in inbox:
            if delivered_s > cutoff:
                break
            self.scheduler.enqueue(req)
            num_seen += 1
        del inbox[:num_seen]

    @property
    def num_waiting(self) -> int:
        """`vllm:num_requests_waiting` as kvsim reports it: the scheduler's (`num_waiting`) and the inbox (its
        requests have arrived; each counted as the requests it will queue as, `Scheduler.num_queued`)."""
        scheduler, inbox = self.scheduler, self.inbox
        if not inbox:
            return scheduler.num_waiting
        return scheduler.num_waiting + sum(scheduler.num_queued(req) for _, req in inbox)

    def snapshot(self) -> SchedulerSnapshot:
        """The scheduler's state for a step row, the inbox counted as waiting (`num_waiting`)."""
        snapshot = self.scheduler.snapshot()
        if self.inbox:
            snapshot = snapshot._replace(num_waiting=self.num_waiting)
        return snapshot

    def kv_usage(self, now: float) -> float:
        """`kv_cache_usage_perc` as a step-by-step engine shows it at `now`: a step allocates when it is
        scheduled, so mid-burst the usage after the allocation of the step in flight."""
        burst = self.burst
        if burst is None or burst.usage_after_step is None:
            return self.scheduler.kv_usage
        usage = burst.usage_after_step
        return usage[min(burst.steps_ended(now), len(usage) - 1)]

    def run_burst(self, env: simpy.Environment, burst: Burst, arrivals: ArrivalClock,
                  next_burst: Callable[[float], Burst | None] | None = None,
                  check: bool = False) -> Generator[simpy.Event, None, int]:
        """Run a planned burst (`kvsim.sched.burst.plan_burst`) to its end, or to a cut, and book it; returns
        the steps planned.

        `next_burst(now)`: the burst this engine would plan at `now` (None: a single step). A burst that
        ends before SimPy's next event (`env.peek()`) can neither be cut nor observed: nothing happens in
        the simulation until it has ended. It is booked at once, as it would be at its end, and the next
        one is planned from there, and so on; the clock then moves once, to the last end (exactly, with
        `call_at`), before a burst that something may interrupt runs. Only for an engine whose bookings
        start no SimPy activity (no `hand_off`). `check`: check_invariants() after each booked burst.
        """
        scheduler, recorder = self.scheduler, self.recorder
        num_steps, now = 0, env.now
        planned: Burst | None = burst
        if next_burst is not None:
            while planned is not None:
                instants_s = list(itertools.accumulate(planned.durations, initial=now))
                if not instants_s[-1] < env.peek():
                    break
                num_waiting = self.num_waiting  # nobody arrives meanwhile
                pending = recorder.begin_burst(instants_s[:-1], planned, scheduler.snapshot())
                now = instants_s[-1]
                num_planned = len(planned.durations)
                recorder.end_burst(pending, [num_waiting] * num_planned, apply_burst(scheduler, planned, now))
                self.step_start_s, self.step_end_s = instants_s[-2], now
                if check:
                    scheduler.check_invariants()
                num_steps += num_planned
                planned = next_burst(now)
            if now != env.now:
                yield at_instant(env, now)
            if planned is None:
                return num_steps
            burst = planned
        durations = burst.durations
        # each step's start, then the last one's end, summed as one timeout per step would (`t += d`)
        instants_s = list(itertools.accumulate(durations, initial=env.now))
        if instants_s[-1] > MAX_INSTANT_S:
            raise past_the_clock(f"latency={self.latency.name}: a step of {max(durations):g} s", instants_s[-1])
        ends_s = instants_s[1:]
        pending = recorder.begin_burst(instants_s[:-1], burst, scheduler.snapshot())
        usage = None
        if self.observe_kv:  # usage after each step, as `record` would write it
            held, _, _ = scheduler.alloc.burst_occupancy(burst.seq_ids, len(durations))
            total = scheduler.alloc.num_total_slots
            usage = [1.0 - (total - h) / total for h in held]
        num_waiting = self.num_waiting  # a request a prefill instance still holds is none in the queue:
        queue_empty = num_waiting == scheduler.num_remote_waiting  # its delivery cuts the burst
        flight = self.burst = BurstInFlight(env, instants_s[:-1], ends_s, len(durations), queue_empty,
                                            scheduler.async_scheduling, arrivals.none_delivered_at(ends_s), usage,
                                            env.event())
        if flight.one_wait:
            flight.end_after(len(durations))
            yield flight.done
            waiting = [num_waiting + bisect.bisect_left(flight.joined_s, start)
                       for start in instants_s[:flight.num_steps]]
        else:  # one timeout per step: the order of a step's end and a delivery at that instant matters
            waiting = []
            for d in durations:
                waiting.append(self.num_waiting)
                yield env.timeout(d)
                flight.steps_done += 1
                if flight.steps_done == flight.num_steps:
                    break
        self.burst = None
        num_run, num_planned = flight.num_steps, len(durations)
        self.step_start_s, self.step_end_s = instants_s[num_run - 1], env.now
        if num_run < num_planned:  # cut after the step in flight
            burst = Burst(burst.batch, durations[:num_run], burst.seq_ids)
            pending = pending._replace(starts_s=instants_s[:num_run], durations_s=burst.durations)
        recorder.end_burst(pending, waiting, apply_burst(scheduler, burst, env.now))
        return num_steps + num_planned
