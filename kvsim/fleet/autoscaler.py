"""When a fleet adds or removes replicas: Kubernetes' Horizontal Pod Autoscaler rule, as llm-d's autoscaler uses it.

Every `sync_period_s` the autoscaler reads one metric averaged over the ready replicas (waiting requests
per replica, or KV cache usage) and recommends

    desired = ceil(current · metric / target)          (unchanged while |metric / target − 1| ≤ tolerance)

clamped to [min_replicas, max_replicas]. Recommendations are stabilised as the HPA does: a scale-down
takes the *highest* recommendation of the last `scale_down_window_s` (default 300 s, so a dip does not
drop replicas it will need again), a scale-up the *lowest* of the last `scale_up_window_s` (default 0 s:
scale up at once). A replica added now serves only after `startup_s` (model load: minutes); the fleet
counts it from the moment it is requested, as a GPU bill does. Pure Python: the fleet's clock calls it.
The policy's fields and their ranges are declared once, in `kvsim.workload.scenario.AutoscalerConfig`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.workload.scenario import AutoscalerConfig


@dataclass(slots=True)
class Autoscaler:
    """The HPA's recommendation with its stabilisation windows. `recommend` is called once per sync period."""

    spec: AutoscalerConfig  # the scenario's policy, validated there
    _history: deque[tuple[float, int]] = field(default_factory=deque)  # (instant, raw recommendation)

    def raw(self, num_current: int, metric_per_replica: float) -> int:
        """The unstabilised recommendation for `num_current` replicas reading `metric_per_replica`."""
        ratio = metric_per_replica / self.spec.target
        desired = num_current if abs(ratio - 1) <= self.spec.tolerance else math.ceil(num_current * ratio)
        return min(max(desired, self.spec.min_replicas), self.spec.max_replicas)

    def recommend(self, now_s: float, num_current: int, metric_per_replica: float) -> int:
        """How many replicas the fleet should have from `now_s` (stabilised; `num_current` includes starting ones)."""
        raw = self.raw(num_current, metric_per_replica)
        self._history.append((now_s, raw))
        horizon_s = max(self.spec.scale_up_window_s, self.spec.scale_down_window_s)
        while self._history and self._history[0][0] < now_s - horizon_s:
            self._history.popleft()
        if raw > num_current:
            up = [r for t, r in self._history if t >= now_s - self.spec.scale_up_window_s]
            return max(num_current, min(up))
        if raw < num_current:
            down = [r for t, r in self._history if t >= now_s - self.spec.scale_down_window_s]
            return min(num_current, max(down))
        return num_current
