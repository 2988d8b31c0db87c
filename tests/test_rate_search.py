"""Growth then bisection for the highest rate meeting an objective, checked against known thresholds."""

import pytest

from kvsim.planning.rate_search import max_passing_rates


def threshold_probe(thresholds, calls):
    def probe(batch):
        calls.append(list(batch))
        return [(rate <= thresholds[i], rate) for i, rate in batch]
    return probe


@pytest.mark.parametrize("threshold", [0.013, 1.0, 3.7, 11.0, 900.0])
def test_brackets_the_threshold_within_five_percent(threshold):
    calls = []
    (bound,) = max_passing_rates(threshold_probe([threshold], calls), 1, start_rate=1.0)
    assert bound.passed <= threshold < bound.failed <= 1.05 * bound.passed
    assert bound.result == bound.passed
    # Grows past 8 req/s when the threshold is higher: no grid ceiling
    assert max(rate for batch in calls for _, rate in batch) > threshold


def test_items_are_probed_together_each_round():
    calls = []
    bounds = max_passing_rates(threshold_probe([2.0, 5.0, 40.0], calls), 3)
    assert [round(b.passed, 3) <= t < b.failed for b, t in zip(bounds, [2.0, 5.0, 40.0], strict=True)] == [True] * 3
    assert all(len({i for i, _ in batch}) == len(batch) for batch in calls)  # one probe per item per round


def test_nothing_passes_reports_zero():
    (bound,) = max_passing_rates(lambda batch: [(False, None) for _ in batch], 1)
    assert bound.passed == 0.0 and bound.failed is not None


def test_an_objective_that_never_fails_stops_growing_and_says_so():
    """A workload too small to saturate (it meets the SLO even arriving all at once) is no error:
    growth stops at start · 2^20 (20 doublings from 1 req/s) with no failing rate."""
    calls = []
    (bound,) = max_passing_rates(threshold_probe([float("inf")], calls), 1, start_rate=1.0)
    assert bound.failed is None and bound.passed == 2.0**20
    assert bound.num_probes == 21  # 1, 2, 4, ..., 2^20


def test_a_loop_that_cannot_settle_is_still_an_error():
    with pytest.raises(RuntimeError, match="did not settle"):
        max_passing_rates(lambda batch: [(True, None) for _ in batch], 1, max_rounds=10)
