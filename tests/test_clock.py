"""The clock's primitives: exact instants with public SimPy timeouts, and the wake-up engines sleep on.

Expected instants are worked out by hand in binary: t = 1 + 2⁻⁵² (the double after 1, an odd
significand) and now = 2⁻⁵³ (half of t's ulp). `t − now` is exactly halfway between 1 and t and
rounds to even, 1.0; `now + 1.0` is halfway again and rounds to 1.0; the next delay, t, gives
`now + t` halfway between t and 1 + 2⁻⁵¹, which rounds to the even 1 + 2⁻⁵¹. So no delay from `now`
lands on t, and `call_at` must hop: to t/2 = 0.5 + 2⁻⁵³ (exact from now: 0.5 is exact), then t − t/2.
"""

import math

import simpy

from kvsim.engine.clock import Arrivals, Wakeup, call_at, delay_until, delivery_instants
from tests.conftest import make_request

NOW, T = 2.0**-53, 1.0 + 2.0**-52


def test_no_single_delay_reaches_the_instant_but_call_at_does():
    assert NOW + (T - NOW) != T and NOW + delay_until(NOW, T) == 1.0 + 2.0**-51  # one ulp past T
    env, seen = simpy.Environment(), []

    def process():
        yield env.timeout(NOW)
        assert env.now == NOW
        call_at(env, T, lambda: seen.append(env.now))
        call_at(env, 0.75, lambda: seen.append(env.now))  # reachable at once: one timeout

    env.process(process())
    env.run()
    assert seen == [0.75, T]


def test_call_at_now_fires_at_once_and_an_instant_is_never_missed():
    env, seen = simpy.Environment(), []
    call_at(env, 0.0, lambda: seen.append(env.now))
    env.run()
    for now, t in ((0.1, 0.3), (1e-3, 12345.678), (3.0, 3.0 + 2.0**-51)):
        env = simpy.Environment()

        def process(now=now, t=t, env=env):
            yield env.timeout(now)
            call_at(env, t, lambda: seen.append((t, env.now)))

        env.process(process())
        env.run()
    assert seen[0] == 0.0 and all(t == at for t, at in seen[1:])


def test_a_ring_wakes_the_sleeper_and_a_ring_with_nobody_asleep_is_kept():
    env, log = simpy.Environment(), []
    wakeup = Wakeup(env)

    def sleeper():
        for _ in range(2):
            yield from wakeup.wait()
            log.append(env.now)

    def ringer():
        yield env.timeout(2.0)
        wakeup.ring()
        wakeup.ring()  # a second ring before the sleeper ran is the same wake-up
        yield env.timeout(1.0)
        wakeup.ring()

    env.process(sleeper())
    env.process(ringer())
    env.run()
    assert log == [2.0, 3.0]
    early = Wakeup(env)
    early.ring()  # nobody asleep: the next wait returns at once

    def late_sleeper():
        yield from early.wait()
        log.append(env.now)

    env.process(late_sleeper())
    env.run()
    assert log[-1] == 3.0


def test_requests_are_delivered_where_delivery_instants_says():
    # 0.1 + 0.2 != 0.3 in doubles: the request arriving at 0.3 is delivered at 0.3 exactly anyway
    arrivals_s = [0.1, 0.3, 0.3, 0.7]
    assert list(delivery_instants(arrivals_s)) == arrivals_s
    env = simpy.Environment()
    arrivals = Arrivals([make_request(i, t, 10, 2) for i, t in enumerate(arrivals_s)])
    seen = []

    def process():
        while not arrivals.all_arrived:
            if (event := arrivals.wait_for_next(env)) is not None:
                yield event
            seen.append((arrivals.pop().arrival_s, env.now))

    env.process(process())
    env.run()
    assert all(at == now for at, now in seen) and not math.isinf(arrivals.horizon_s(0))
