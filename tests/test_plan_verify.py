"""`kvsim plan` rows carry their evidence: the window, a 10× verification run, the floor and the price."""

import pytest

from kvsim.planning.cost import gpu_price
from kvsim.planning.plan import make_plan_spec, plan
from tests.test_plan import SLO, toy


@pytest.mark.parametrize("search", ["replicas", "rate"])
def test_rows_carry_window_evidence_a_long_verification_run_and_the_floor(tmp_path, search):
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8, "search": search,
                           "probe_requests": 100})
    (row,) = plan(toy(), spec, tmp_path)[0]
    assert row["feasible"] and row["verdict"] == "stable"
    probe = 100  # the toy's workload has 100 requests; a rate-search probe 100 (and 200, ... as it converges)
    assert spec.verify_factor == 10 and row["verify_num_requests"] >= spec.verify_factor * probe
    assert row["verified"] in (True, False) and row["verify_verdict"] in ("stable", "backlogged", "overloaded")
    assert "ttft_s.p90_ci" in row and "verify_ttft_s.p90" in row
    assert 1 <= row["lower_bound_replicas"] <= row["replicas"]
    assert row["replicas_over_bound"] == pytest.approx(row["replicas"] / row["lower_bound_replicas"], rel=1e-3)
    price = gpu_price("h100-80gb")  # no --gpu-hourly-cost: the shipped list price
    assert row["cost_per_hour"] == pytest.approx(row["num_gpus"] * price.usd_per_gpu_hour)
    assert row["price_source"] == price.source and "as of" in price.source


def test_tp_counts_in_gpus_and_cost(tmp_path):
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "tensor_parallel_sizes": [2], "max_replicas": 8,
                           "gpu_hourly_cost": {"h100-80gb": 2.0}})
    (row,) = plan(toy(), spec, tmp_path)[0]
    assert row["num_gpus"] == 2 * row["replicas"] and row["cost_per_hour"] == pytest.approx(4.0 * row["replicas"])
