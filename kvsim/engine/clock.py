"""The arrival clock and the wake-ups: when requests reach the engines, exact instants, sleeping engines.

Everything here uses SimPy's public API only: `Environment.timeout`, `Environment.event`,
`Event.succeed` and `Event.callbacks`.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Protocol

import simpy

from kvsim.model.errors import KvsimError
from kvsim.workload.generate import instant_shown
from kvsim.workload.request import Request

STEP_FIGURES = "the GPU's figures (flops, bandwidths, link, efficiency)"
"""What sets a step's time, for `past_the_clock`."""


def past_the_clock(what: str, end_s: float, figures: str = STEP_FIGURES) -> KvsimError:
    """The error for `what` (a step, a KV transfer: the field and value that set its time, and the time) that
    would end at `end_s`, past `MAX_INSTANT_S`: the callers check `end_s > MAX_INSTANT_S` before its timer.
    Hardware figures far below any GPU's (`fp16_flops: 1`, a 1 B/s link, an efficiency of 1e-300) made steps
    and transfers of years to 1e300 s, which ran on past the clock's microseconds or the largest float without
    a word."""
    return KvsimError(f"{what} would end at {instant_shown(end_s)}; no GPU step or KV transfer takes that long: "
                      f"check {figures}")


def delay_until(now: float, t: float) -> float:
    """The smallest float delay with `now + delay >= t`: `t - now` can fall an ulp short, and a
    request must never be seen before it arrives."""
    delay = t - now
    while now + delay < t:
        delay = math.nextafter(delay, math.inf)
    return delay


def call_at(env: simpy.Environment, at_s: float, callback: Callable[[], None]) -> None:
    """Call `callback()` when the clock reads exactly `at_s` (>= now), with public timeouts only.

    A burst waited for at once must end on the very float instant its last step would end step
    by step (a sum of step durations), and `now + (at_s − now)` rounds: for some `now` no delay
    at all lands on `at_s`. Then a first timeout goes to the first reachable instant at or past
    `at_s / 2`; from there `at_s − there` is exact (Sterbenz: the two are within a factor of 2),
    so a second timeout lands on `at_s` exactly.
    """
    now = env.now
    delay = at_s - now
    assert delay >= 0.0
    if now + delay == at_s:
        env.timeout(delay).callbacks.append(lambda _: callback())
        return
    hop = delay_until(now, at_s / 2)  # now < at_s / 2 here: from at_s / 2 on the difference is exact
    assert now + hop <= at_s
    env.timeout(hop).callbacks.append(lambda _: call_at(env, at_s, callback))


def at_instant(env: simpy.Environment, at_s: float) -> simpy.Event:
    """An event that fires when the clock reads exactly `at_s` (>= now; `call_at`)."""
    event = env.event()

    def fire() -> None:
        event.succeed()
    call_at(env, at_s, fire)
    return event


class Wakeup:
    """A process sleeps on `yield from wakeup.wait()` until another one `ring()`s.

    A ring while nobody sleeps is kept: the next `wait()` returns at once (after the events
    already due now). Idle engines sleep on one, so they never poll.
    """

    __slots__ = ("_env", "_event")

    def __init__(self, env: simpy.Environment) -> None:
        self._env = env
        self._event = env.event()

    def wait(self, timer: simpy.Event | None = None) -> Generator[simpy.Event, None, None]:
        """Sleep until a ring, or until `timer` fires if given (a ring not taken then stays kept)."""
        yield self._event if timer is None else self._env.any_of([self._event, timer])
        if self._event.triggered:
            self._event = self._env.event()

    def ring(self) -> None:
        if not self._event.triggered:
            self._event.succeed()


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


class ArrivalClock(Protocol):
    """What a step loop reads of the requests still to come to its engines (`Arrivals` for the run's
    arrivals; a disaggregated decode pool's handoffs, `kvsim.fleet.disagg`)."""

    @property
    def all_arrived(self) -> bool:
        """Nothing more will join these engines' queues."""
        ...

    def horizon_s(self, num_ahead: int) -> float:
        """A bound on when the `num_ahead`-th next request can join (inf: none known)."""
        ...

    def none_delivered_at(self, instants_s: Sequence[float]) -> bool:
        """No request joins exactly at one of `instants_s` (ascending)."""
        ...


class Arrivals:
    """The run's requests in arrival order, each built (drawn from its source) only when it arrives.

    The arrival instants are known up front (8 bytes a request: a `RequestStream`'s
    `arrival_s`, or read off a list), and so are the instants the arrival process delivers
    them (`delivery_instants`), so looking ahead (`horizon_s`, `none_delivered_at`) builds no
    request. Nothing here keeps a request after it arrived, so with a lazy stream
    (`kvsim.workload.generate.iter_requests`) only the requests in flight exist at any time.
    """

    __slots__ = ("_source", "_times", "_delivered", "num_arrived")

    def __init__(self, requests: Iterable[Request]) -> None:
        times = getattr(requests, "arrival_s", None)
        if times is None:
            requests = list(requests)
            times = [req.arrival_s for req in requests]
        self._source: Iterator[Request] = iter(requests)
        self._times = array("d", times)  # ascending: requests come in arrival order
        self._delivered = delivery_instants(self._times)
        self.num_arrived = 0

    def __len__(self) -> int:
        return len(self._times)

    @property
    def all_arrived(self) -> bool:
        return self.num_arrived == len(self._times)

    def wait_for_next(self, env: simpy.Environment) -> simpy.Event | None:
        """The event an arrival process yields before `pop`ping the next request: it fires at that
        request's delivery instant (the instant every look-ahead here uses); None when it is
        delivered now. The process yields it from the previous delivery, so the timeout lands
        where `delivery_instants` says."""
        at_s = self._times[self.num_arrived]
        return env.timeout(delay_until(env.now, at_s)) if at_s > env.now else None

    @property
    def next_delivery_s(self) -> float:
        """When the arrival process delivers the next request, unless something holds it back (`delivery_instants`)."""
        return self._delivered[self.num_arrived]

    def horizon_s(self, num_ahead: int) -> float:
        """When the `num_ahead`-th next request arrives (inf past the last one)."""
        index = self.num_arrived + num_ahead - 1
        return self._times[index] if index < len(self._times) else math.inf

    def pop(self) -> Request:
        """The next request, now arriving."""
        req = next(self._source)
        assert req.arrival_s == self._times[self.num_arrived], "requests out of arrival order"
        self.num_arrived += 1
        return req

    def none_delivered_at(self, instants_s: Sequence[float]) -> bool:
        """No request still to arrive is delivered exactly at one of `instants_s` (ascending): at such
        a tie the order of the two events decides what the engines and the dispatcher see."""
        delivered, first = self._delivered, self.num_arrived
        upcoming = delivered[first:bisect.bisect_right(delivered, instants_s[-1], first)]
        return not upcoming or set(instants_s).isdisjoint(upcoming)
