"""The arrival clock: when requests reach an engine, and how an idle or bursting engine is woken (SimPy events).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import simpy

from kvsim.workload.request import Request

if TYPE_CHECKING:
    from kvsim.sched.request_queue import RequestQueue



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
    (`kvsim.workload.generate.iter_requests`) only the requests in flight exist at any time.
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


def waiting_before_steps(waiting: RequestQueue, num_before: int, starts_s: list[float],
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


