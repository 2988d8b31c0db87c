"""The HPA rule, derived by hand from Kubernetes' documented algorithm: desired = ceil(current · metric / target),
a tolerance band, clamping, and the stabilisation windows (scale down to the highest recent recommendation)."""

import pytest
from pydantic import ValidationError

from kvsim.fleet.autoscaler import Autoscaler
from kvsim.model.errors import from_validation_error
from kvsim.workload.fleet_layout import AutoscalerConfig


def test_ceil_of_current_times_ratio():
    a = Autoscaler(AutoscalerConfig(target=4, max_replicas=32))
    assert a.raw(num_current=3, metric_per_replica=10) == 8  # ceil(3 · 10 / 4) = ceil(7.5)
    assert a.raw(num_current=3, metric_per_replica=4.3) == 3  # 4.3 / 4 = 1.075, inside the 10 % tolerance
    assert a.raw(num_current=3, metric_per_replica=4.5) == 4  # 1.125 > 1.1: ceil(3.375)
    assert a.raw(num_current=10, metric_per_replica=0) == 1  # clamped at min_replicas
    assert a.raw(num_current=10, metric_per_replica=100) == 32  # clamped at max_replicas


def test_scale_up_at_once_scale_down_after_the_window():
    a = Autoscaler(AutoscalerConfig(target=4, scale_down_window_s=300, sync_period_s=15))
    assert a.recommend(0, num_current=2, metric_per_replica=8) == 4  # up at once: ceil(2 · 2)
    # load drops: raw recommendations 1, but the highest of the last 300 s (4, at t=0) holds until t > 300
    assert a.recommend(15, num_current=4, metric_per_replica=0) == 4
    assert a.recommend(300, num_current=4, metric_per_replica=0) == 4  # t=0 still inside [0, 300]
    assert a.recommend(315, num_current=4, metric_per_replica=0) == 1  # only raw 1s left in [15, 315]


def test_a_dip_inside_the_window_does_not_remove_replicas():
    a = Autoscaler(AutoscalerConfig(target=4, scale_down_window_s=60))
    for t in range(0, 120, 15):
        assert a.recommend(t, num_current=4, metric_per_replica=4) == 4
    assert a.recommend(120, num_current=4, metric_per_replica=1) == 4  # the last 60 s held raw 4s
    assert a.recommend(135, num_current=4, metric_per_replica=4) == 4


@pytest.mark.parametrize(("field", "kwargs"), [
    ("target", {"target": 0}), ("min_replicas", {"min_replicas": 0}),
    ("max_replicas", {"min_replicas": 4, "max_replicas": 2}), ("startup_s", {"startup_s": -1}),
    ("sync_period_s", {"sync_period_s": 0}), ("target", {"metric": "kv_cache_usage_perc", "target": 80}),
])
def test_a_policy_that_cannot_work_is_one_error_naming_the_field(field, kwargs):
    with pytest.raises(ValidationError) as refused:
        AutoscalerConfig(**kwargs)
    assert str(from_validation_error(refused.value, "autoscaler")).startswith(f"autoscaler.{field}=")


def test_scale_up_is_bounded_by_the_hpa_default_policies():
    """Kubernetes' defaults (behavior.scaleUp: 100 % or 4 pods per 15 s, selectPolicy Max): from 1 replica a
    recommendation of 16 becomes max(1 + 4, 2 · 1) = 5; the count at the start of the 15 s period is what the
    bound grows from, so syncs every 5 s inside one period stay at 5; then max(5 + 4, 10) = 10; then 16."""
    a = Autoscaler(AutoscalerConfig(target=1, max_replicas=16, sync_period_s=5))
    assert a.recommend(0, num_current=1, metric_per_replica=50) == 5
    assert a.recommend(5, num_current=5, metric_per_replica=50) == 5  # the period began at 1 (t = 0 is inside it)
    assert a.recommend(10, num_current=5, metric_per_replica=50) == 5
    assert a.recommend(15, num_current=5, metric_per_replica=50) == 10  # t = 0 is no longer after 15 - 15
    assert a.recommend(30, num_current=10, metric_per_replica=50) == 16  # max(14, 20), clamped at max_replicas


def test_scale_down_is_bounded_by_a_percent_policy():
    """scaleDown 50 % per 60 s, no stabilisation window: from 8, floor(8 · 0.5) = 4; within that 60 s the
    period began at 8, so 4 holds; after it, floor(4 · 0.5) = 2. The default (100 %) does not bound at all."""
    a = Autoscaler(AutoscalerConfig(target=4, scale_down_window_s=0, scale_down_percent=50, scale_down_period_s=60))
    assert a.recommend(0, num_current=8, metric_per_replica=0) == 4
    assert a.recommend(15, num_current=4, metric_per_replica=0) == 4
    assert a.recommend(60, num_current=4, metric_per_replica=0) == 2
    assert Autoscaler(AutoscalerConfig(target=4, scale_down_window_s=0)).recommend(0, 8, 0) == 1


def test_policies_that_can_never_grow_the_fleet_are_refused():
    with pytest.raises(ValidationError) as refused:
        AutoscalerConfig(scale_up_pods=0, scale_up_percent=0)
    assert str(from_validation_error(refused.value, "autoscaler")).startswith("autoscaler.scale_up_percent=0")
