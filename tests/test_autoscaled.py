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
    finished = static.requests[static.requests["status"] == "finished"]
    tokens = float((finished["output_tokens"] * finished["num_samples"]).sum())
    assert auto["gpu_hours_per_million_output_tokens"] == pytest.approx(2 * last_finish_s / 3600 / (tokens / 1e6),
                                                                        rel=1e-12)


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


def test_kv_usage_counts_a_pool_only_while_its_replica_is_up():
    """By hand: engine A (100 blocks) steps over [0, 10) at 50 % usage, up throughout; engine B (300 blocks) is
    up from t = 4 and steps over [6, 10) at 25 %. Blocks in use: 50 · 10 + 75 · 4 = 800 block-seconds; blocks up
    while either steps ([0, 10)): 100 · 10 + 300 · 6 = 2,800, so KV usage is 800 / 2,800 = 2/7 (counting B's pool
    for the whole 10 s, as before, gave 800 / 4,000 = 0.2). Without up periods the static figure stands."""
    from kvsim.results.metrics import StepTotals
    from kvsim.results.together import means_together

    a = StepTotals(dt=10.0, usage_dt=0.5 * 10.0)
    a.busy_periods.extend([0.0, 10.0])
    b = StepTotals(dt=4.0, usage_dt=0.25 * 4.0)
    b.busy_periods.extend([6.0, 10.0])
    up = [[0.0, float("inf")], [4.0, float("inf")]]
    assert means_together([a, b], [100, 300], up)["kv_cache_usage_mean"] == pytest.approx(2 / 7, rel=1e-12)
    assert means_together([a, b], [100, 300])["kv_cache_usage_mean"] == pytest.approx(0.2, rel=1e-12)
    # B switched off at t = 8 and its steps end there: 50 · 10 + 75 · 2 = 650 over 100 · 10 + 300 · 4 = 2,200
    b = StepTotals(dt=2.0, usage_dt=0.25 * 2.0)
    b.busy_periods.extend([6.0, 8.0])
    down_at_8 = [[0.0, float("inf")], [4.0, 8.0]]
    assert means_together([a, b], [100, 300], down_at_8)["kv_cache_usage_mean"] == pytest.approx(650 / 2200, rel=1e-12)


def test_an_autoscaled_fleet_s_kv_usage_is_over_the_pools_up_at_the_time():
    """One replica overloaded, a second ready at a sync + startup_s (never scaled down in a 300 s window): the
    fleet's KV usage is Σ blocks in use · dt over Σ blocks of the replicas up · dt, over the time any replica
    steps, computed here naively on a grid of every step boundary from the step rows and the ready time."""
    import numpy as np

    policy = {"min_replicas": 1, "max_replicas": 2, "target": 1, "startup_s": 5.0, "sync_period_s": 1.0}
    result = simulate_autoscaled(make_scenario(raw(num_requests=600, rate=60.0, replicas=1, autoscaler=policy)))
    scaling = result.tables["scaling"]
    ready_s = float(scaling.loc[scaling["num_starting"] > 0, "time_s"].min()) + 5.0
    assert set(scaling["num_ready"]) == {1, 2} and (scaling["num_draining"] == 0).all()
    blocks = [run.summary["num_gpu_blocks"] for run in result.replicas[:2]]
    steps = result.steps
    start = steps["time_s"].to_numpy()
    end = start + steps["duration_s"].to_numpy()
    grid = np.unique(np.concatenate([start, end, [ready_s]]))
    mid = (grid[:-1] + grid[1:]) / 2
    busy = ((start[None, :] <= mid[:, None]) & (mid[:, None] < end[None, :])).any(axis=1)
    up_blocks = blocks[0] + blocks[1] * (mid >= ready_s)
    used = (steps["vllm:kv_cache_usage_perc"].to_numpy() * np.asarray(blocks)[steps["replica"].to_numpy()]
            * steps["duration_s"].to_numpy()).sum()
    expected = used / (up_blocks * np.diff(grid) * busy).sum()
    assert result.summary["kv_cache_usage_mean"] == pytest.approx(expected, rel=1e-9)
    # billed: slot 0 over the whole run, slot 1 from its request (startup_s before it was ready) to the end
    auto, tokens = result.summary["autoscaling"], float(result.requests["output_tokens"].sum())
    gpu_hours = (auto["billed_span_s"] + auto["billed_span_s"] - (ready_s - 5.0)) / 3600
    assert auto["gpu_hours"] == pytest.approx(gpu_hours, rel=1e-12)
    assert auto["gpu_hours_per_million_output_tokens"] == pytest.approx(gpu_hours / (tokens / 1e6), rel=1e-12)
    every_slot_all_along = used / (sum(blocks) * (np.diff(grid) * busy).sum())
    assert expected > every_slot_all_along * 1.05  # what it said before: the second pool counted from t = 0
