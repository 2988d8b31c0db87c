"""When a fleet adds or removes replicas: Kubernetes' Horizontal Pod Autoscaler rule, as llm-d's autoscaler uses it.

Every `sync_period_s` the autoscaler reads one metric averaged over the ready replicas (waiting requests
per replica, or KV cache usage) and recommends

    desired = ceil(current · metric / target)          (unchanged while |metric / target − 1| ≤ tolerance)

clamped to [min_replicas, max_replicas]. Recommendations are stabilised as the HPA does: a scale-down
takes the *highest* recommendation of the last `scale_down_window_s` (default 300 s, so a dip does not
drop replicas it will need again), a scale-up the *lowest* of the last `scale_up_window_s` (default 0 s:
scale up at once). Then the HPA's scaling policies bound the step (selectPolicy Max, its defaults): with
`start` the count at the beginning of the last `scale_up_period_s` (now's count less the changes made
strictly inside that period), at most max(start + scale_up_pods, ceil(start · (1 + scale_up_percent/100)))
replicas (default: double or 4 more per 15 s), and at least floor(start · (1 − scale_down_percent/100))
over `scale_down_period_s` (default 100 %: no bound). A replica added now serves only after `startup_s`
(model load: minutes); the fleet counts it from the moment it is requested, as a GPU bill does.
Pure Python: the fleet's clock calls it.
The policy's fields and their ranges are declared once, in `kvsim.workload.scenario.AutoscalerConfig`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.workload.fleet_layout import AutoscalerConfig


@dataclass(slots=True)
class Autoscaler:
    """The HPA's recommendation with its stabilisation windows. `recommend` is called once per sync period."""

    spec: AutoscalerConfig  # the scenario's policy, validated there
    # (instant, raw recommendation) of the syncs in the scale-up window whose recommendation no later one's is at
    # or below: rising, so its first is the window's lowest; and in the scale-down window falling, first the highest
    _up_lows: deque[tuple[float, int]] = field(default_factory=deque)
    _down_highs: deque[tuple[float, int]] = field(default_factory=deque)
    _changes: deque[tuple[float, int]] = field(default_factory=deque)  # (instant, replicas added) of each scaling

    def raw(self, num_current: int, metric_per_replica: float) -> int:
        """The unstabilised recommendation for `num_current` replicas reading `metric_per_replica`."""
        ratio = metric_per_replica / self.spec.target
        # capped before the ceiling: a target as small as 5e-324 made the ratio inf (an OverflowError mid-run)
        desired = num_current if abs(ratio - 1) <= self.spec.tolerance else \
            math.ceil(min(num_current * ratio, self.spec.max_replicas))
        return min(max(desired, self.spec.min_replicas), self.spec.max_replicas)

    def recommend(self, now_s: float, num_current: int, metric_per_replica: float) -> int:
        """How many replicas the fleet should have from `now_s` (stabilised; `num_current` includes starting ones)."""
        raw = self.raw(num_current, metric_per_replica)
        lowest = _window_extreme(self._up_lows, now_s, self.spec.scale_up_window_s, raw, lambda kept: kept >= raw)
        highest = _window_extreme(self._down_highs, now_s, self.spec.scale_down_window_s, raw,
                                  lambda kept: kept <= raw)
        stabilised = num_current
        if raw > num_current:
            stabilised = max(num_current, lowest)
        elif raw < num_current:
            stabilised = min(num_current, highest)
        desired = self._rate_limited(now_s, num_current, stabilised)
        if desired != num_current:
            self._changes.append((now_s, desired - num_current))
        return desired

    def _rate_limited(self, now_s: float, num_current: int, desired: int) -> int:
        """`desired` within the scaling policies (module docstring), as the HPA controller's
        `convertDesiredReplicasWithBehaviorRate` bounds it."""
        spec = self.spec
        while self._changes and self._changes[0][0] <= now_s - max(spec.scale_up_period_s, spec.scale_down_period_s):
            self._changes.popleft()
        if desired > num_current:
            start = self._at_period_start(now_s, num_current, spec.scale_up_period_s)
            # capped before the ceiling, as `raw` is (a scale_up_percent of 1.7e308 made it inf): desired is below
            limit = max(start + spec.scale_up_pods, math.ceil(min(start * (1 + spec.scale_up_percent / 100),
                                                                  spec.max_replicas)))
            return min(desired, max(limit, num_current))
        if desired < num_current:
            start = self._at_period_start(now_s, num_current, spec.scale_down_period_s)
            limit = math.floor(start * (1 - spec.scale_down_percent / 100))
            return max(desired, min(limit, num_current))
        return desired

    def _at_period_start(self, now_s: float, num_current: int, period_s: float) -> int:
        """The replica count `period_s` ago: now's less the changes made strictly after then (the HPA's
        `getReplicasChangePerPeriod` counts events after the cutoff)."""
        return num_current - sum(n for t, n in self._changes if t > now_s - period_s)


def _window_extreme(kept: deque[tuple[float, int]], now_s: float, window_s: float, raw: int,
                    dominated: Callable[[int], bool]) -> int:
    """The lowest (or highest) raw recommendation of the syncs in [`now_s` − `window_s`, `now_s`], this one's (`raw`)
    included: `kept` is a monotonic queue of them, a recommendation `dominated` by `raw` (at or above it for the
    lowest) dropped as `raw` joins (it can never be the extreme while `raw` is in the window: the later instant
    leaves last), one older than the window dropped from the front. Each sync is pushed and popped once: a scan of
    every sync in the window (as the HPA's stabilisation reads it) cost O(window / sync_period_s) a sync, and
    `sync_period_s: 0.001` under the default 300 s scale-down window took 40 s for 1,000 requests."""
    while kept and dominated(kept[-1][1]):
        kept.pop()
    kept.append((now_s, raw))
    while kept[0][0] < now_s - window_s:
        kept.popleft()
    return kept[0][1]

