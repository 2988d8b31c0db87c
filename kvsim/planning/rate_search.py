"""The highest request rate that still meets an objective, found by growth then bisection.

    bounds = max_passing_rates(probe, num_items=4)      # probe(rates) -> [(passed, result), ...]

No fixed grid and no ceiling short of MAX_RATE_FACTOR: each item starts at `start_rate`, doubles until a rate fails
(or halves until one passes), then bisects geometrically between the highest passing rate
and the lowest failing one until they are within `rel_tol` (5 %). Items are probed
together, one batch per round, so a sweep runner can spread each round over workers.
The objective is assumed monotone in the rate (more load never helps a latency SLO).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_RATE_FACTOR = 2.0**-20  # below start · 2^-20 even one request at a time fails: report 0
# Above start · 2^20 (about a million requests a second from 1 req/s) a finite workload arrives as good
# as all at once, so a faster rate cannot load it more: growth stops there and reports `failed=None`.
MAX_RATE_FACTOR = 2.0**20


@dataclass(slots=True)
class RateBound:
    """`passed`: the highest rate that met the objective (0 if none); `failed`: the lowest that did not
    (None if the objective held up to start · MAX_RATE_FACTOR: the workload never saturates, however fast
    it arrives); `result`: what the probe returned at `passed`."""

    passed: float = 0.0
    failed: float | None = None
    result: Any = None
    num_probes: int = 0

    def settled(self, start_rate: float, rel_tol: float) -> bool:
        if self.failed is None:
            return self.passed >= start_rate * MAX_RATE_FACTOR
        if self.passed == 0.0:
            return self.failed <= start_rate * MIN_RATE_FACTOR
        return self.failed <= self.passed * (1 + rel_tol)

    def next_rate(self, start_rate: float) -> float:
        if self.failed is None:
            return 2 * self.passed if self.passed else start_rate
        if self.passed == 0.0:
            return self.failed / 2
        return math.sqrt(self.passed * self.failed)


def max_passing_rates(probe: Callable[[Sequence[tuple[int, float]]], Sequence[tuple[bool, Any]]], num_items: int,
                      start_rate: float = 1.0, rel_tol: float = 0.05, max_rounds: int = 60) -> list[RateBound]:
    """Per item, the bracket [passed, failed] of its highest passing rate, `failed / passed <= 1 + rel_tol`.

    `probe` gets (item index, rate) pairs and returns (met the objective, result) for each.
    An item whose objective holds even at start · MAX_RATE_FACTOR settles with `failed=None`.
    `max_rounds` only guards the loop: growth and bisection settle within about 30 rounds.
    """
    bounds = [RateBound() for _ in range(num_items)]
    for _ in range(max_rounds):
        todo = [(i, b.next_rate(start_rate)) for i, b in enumerate(bounds) if not b.settled(start_rate, rel_tol)]
        if not todo:
            return bounds
        for (i, rate), (ok, result) in zip(todo, probe(todo), strict=True):
            b = bounds[i]
            b.num_probes += 1
            if ok:
                b.passed, b.result = rate, result
            else:
                b.failed = rate
    raise RuntimeError(f"rate search did not settle in {max_rounds} rounds")
