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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.workload.fleet_layout import AutoscalerConfig


@dataclass(slots=True)
class Autoscaler:
    """The HPA's recommendation with its stabilisation windows. `recommend` is called once per sync period."""

    spec: AutoscalerConfig  # the scenario's policy, validated there
    _history: deque[tuple[float, int]] = field(default_factory=deque)  # (instant, raw recommendation)
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
        self._history.append((now_s, raw))
        horizon_s = max(self.spec.scale_up_window_s, self.spec.scale_down_window_s)
        while self._history and self._history[0][0] < now_s - horizon_s:
            self._history.popleft()
        stabilised = num_current
        if raw > num_current:
            up = [r for t, r in self._history if t >= now_s - self.spec.scale_up_window_s]
            stabilised = max(num_current, min(up))
        elif raw < num_current:
            down = [r for t, r in self._history if t >= now_s - self.spec.scale_down_window_s]
            stabilised = min(num_current, max(down))
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
