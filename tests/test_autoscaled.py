"""Autoscaled fleets (`kvsim.fleet.autoscaled`): a pinned policy is the static fleet; cold starts; GPU-hours."""

import pytest

from kvsim.fleet.autoscaled import simulate_autoscaled
from kvsim.fleet.driver import simulate_fleet
from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import make_scenario


def raw(num_requests=300, rate=20.0, replicas=2, autoscaler=None, policy="least_outstanding"):
    out = {
        "name": "as", "model": "llama-3.1-8b", "gpu": "h100-80gb", "engine": {"max_model_len": 4096},
        "workload": {"num_requests": num_requests, "arrival": {"process": "constant", "rate": rate},
                     "prompt_len": {"dist": "lognormal", "mean": 500, "p99": 2000},
                     "output_len": {"dist": "lognormal", "mean": 100, "p99": 400}},
        "replicas": replicas, "router": {"policy": policy},
    }
    if autoscaler is not None:
        out["autoscaler"] = autoscaler
    return out


@pytest.mark.parametrize("policy", ["least_outstanding", "least_kv"])
def test_zero_startup_instant_thresholds_pinned_at_n_is_the_static_fleet(policy):
    """min_replicas = 2 and a target never reached: the recommendation is always 2 (clamped), so the
    fleet is the static 2-replica fleet: identical requests, routes, per-replica rows and summary (less
    `autoscaling`: the third slot, never started, is no replica of it), and 2 GPUs billed over the whole run."""
    pinned = {"min_replicas": 2, "max_replicas": 3, "target": 1e9, "startup_s": 0, "scale_down_window_s": 0,
              "sync_period_s": 1.0}
    static = simulate_fleet(make_scenario(raw(policy=policy)))
    scaled = simulate_autoscaled(make_scenario(raw(autoscaler=pinned, policy=policy)))
    assert scaled.requests.equals(static.requests)
    assert scaled.tables["routes"].equals(static.tables["routes"])
    assert scaled.tables["replicas"].equals(static.tables["replicas"])
    assert {key: value for key, value in scaled.summary.items() if key != "autoscaling"} == static.summary
    auto = scaled.summary["autoscaling"]
    last_finish_s = float((static.requests["arrival_s"] + static.requests["e2e_s"]).max())
    assert auto["billed_span_s"] == pytest.approx(last_finish_s, rel=1e-12)
    assert auto["gpu_hours"] == pytest.approx(2 * last_finish_s / 3600, rel=1e-12)
    assert set(scaled.tables["scaling"]["num_ready"]) == {2}


def test_a_new_replica_serves_only_after_startup():
    """One replica overloaded at 60 req/s: the first sync that sees a queue adds a replica, which gets its
    first request no earlier than startup_s later; billing counts it from the request on."""
    policy = {"min_replicas": 1, "max_replicas": 2, "target": 1, "startup_s": 5.0, "sync_period_s": 1.0}
    result = simulate_autoscaled(make_scenario(raw(num_requests=600, rate=60.0, replicas=1, autoscaler=policy)))
    scaling = result.tables["scaling"]
    first_up_s = float(scaling.loc[scaling["num_starting"] > 0, "time_s"].min())
    routes = result.tables["routes"]
    on_new = routes[routes["replica"] == 1]
    assert len(on_new) > 0 and on_new["arrival_s"].min() >= first_up_s + 5.0
    ready_at = scaling.loc[scaling["num_ready"] == 2, "time_s"]
    assert ready_at.min() >= first_up_s + 5.0
    assert result.summary["autoscaling"]["gpu_hours"] <= 2 * result.summary["autoscaling"]["billed_span_s"] / 3600
    assert result.summary["num_finished"] + result.summary["num_rejected"] == 600


def test_a_policy_that_can_never_scale_is_refused():
    with pytest.raises(KvsimError, match="autoscaler.max_replicas=2: equals min_replicas"):
        simulate_autoscaled(make_scenario(raw(autoscaler={"min_replicas": 2, "max_replicas": 2})))


def test_affinity_is_refused_with_an_autoscaler():
    with pytest.raises(KvsimError, match="router.policy=affinity"):
        simulate_autoscaled(make_scenario(raw(autoscaler={"max_replicas": 3}, policy="affinity")))
