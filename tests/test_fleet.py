"""Fleets: replicas behind a router in one simulation.

Expected values are reasoned, not copied: a fleet of one is the single engine; round robin
over N identical replicas under N× a constant rate hands each replica a constant-rate stream
at the single rate, so with fixed lengths each replica *is* the single run shifted in time,
and with random lengths it differs only by which lengths it drew (sampling noise, bounded
below from the single run's own spread).
"""

import math

import numpy as np
import pytest

from kvsim.engine.simulate import simulate
from kvsim.fleet.driver import replica_scenarios, simulate_fleet
from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import make_scenario

H100_8B = {"model": "llama-3.1-8b", "gpu": "h100-80gb"}


def scenario(**overrides):
    raw = {
        "name": "f", **H100_8B,
        "engine": {"max_model_len": 4096, "num_gpu_blocks_override": 2000},
        "workload": {"num_requests": 40, "arrival": {"process": "constant", "rate": 4.0},
                     "prompt_len": {"dist": "fixed", "value": 300}, "output_len": {"dist": "fixed", "value": 50}},
        "seed": 3,
    }
    for key, value in overrides.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and isinstance(raw.get(key), dict) else value
    return make_scenario(raw)


def test_a_fleet_of_one_is_the_single_engine():
    single = scenario(workload={"arrival": {"process": "poisson", "rate": 6.0},
                                "prompt_len": {"dist": "lognormal", "mean": 400, "p99": 2000},
                                "output_len": {"dist": "lognormal", "mean": 80, "p99": 400}})
    fleet = single.model_copy(update={"replicas": 1, "router": single.router.model_copy(update={"policy": "affinity"})})
    alone = simulate(single).summary
    result = simulate_fleet(fleet)
    replica = result.replicas[0].summary
    assert {k: v for k, v in replica.items() if k != "scenario"} == {k: v for k, v in alone.items() if k != "scenario"}
    assert result.summary["ttft_s"] == alone["ttft_s"] and result.summary["num_finished"] == alone["num_finished"]


def test_round_robin_over_n_replicas_at_n_times_the_rate_repeats_the_single_run_exactly():
    # Constant arrivals every 1/(3λ) s dealt in turn to 3 replicas: replica j sees j/(3λ) + m/λ,
    # the single run's stream m/λ shifted by j/(3λ); fixed lengths make every request identical.
    n, rate = 30, 4.0
    single = simulate(scenario(workload={"num_requests": n, "arrival": {"process": "constant", "rate": rate}}))
    fleet = simulate_fleet(scenario(replicas=3, workload={"num_requests": 3 * n,
                                                          "arrival": {"process": "constant", "rate": 3 * rate}}))
    assert fleet.summary["requests_per_replica"] == {"min": n, "max": n, "mean": float(n)}
    for run in fleet.replicas:
        for column in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
            np.testing.assert_allclose(run.requests[column], single.requests[column], rtol=1e-9, atol=1e-12)
        assert run.summary["max_running"] == single.summary["max_running"]


def test_round_robin_replicas_match_the_single_run_within_sampling_noise():
    # Lengths now random: each replica draws its own n lengths. Its mean latency differs from
    # the single run's by the difference of two sample means of n requests, whose standard
    # error is sqrt(2)·sd/sqrt(n) with sd the single run's per-request spread; 4 standard errors.
    n, rate, replicas = 150, 3.0, 4
    lengths = {"prompt_len": {"dist": "lognormal", "mean": 600, "p99": 3000},
               "output_len": {"dist": "lognormal", "mean": 120, "p99": 600}}
    single = simulate(scenario(workload={"num_requests": n, "arrival": {"process": "constant", "rate": rate},
                                         **lengths}))
    fleet = simulate_fleet(scenario(replicas=replicas, workload={
        "num_requests": replicas * n, "arrival": {"process": "constant", "rate": replicas * rate}, **lengths}))
    for column in ("ttft_s", "tpot_s", "e2e_s"):
        values = single.requests[column].dropna()
        tolerance = 4 * math.sqrt(2) * values.std() / math.sqrt(len(values))
        for run in fleet.replicas:
            assert len(run.requests) == n
            assert abs(run.requests[column].mean() - values.mean()) < tolerance, (column, run.summary["scenario"])


def test_affinity_raises_the_prefix_cache_hit_rate_on_conversations():
    # Turn k's prompt holds turns 0..k−1 and their replies. Affinity keeps a conversation on the
    # replica that cached them; round robin sends the next turn to the cache with probability ~1/4.
    conversations = scenario(
        replicas=4, engine={"enable_prefix_caching": True},
        workload={"num_requests": 160, "arrival": {"process": "poisson", "rate": 8.0},
                  "prompt_len": {"dist": "fixed", "value": 200}, "output_len": {"dist": "fixed", "value": 40},
                  "multi_turn": {"turns": 4, "think_time_s": 2.0}})
    rates = {}
    for policy in ("round_robin", "affinity"):
        spec = conversations.model_copy(update={"router": conversations.router.model_copy(update={"policy": policy})})
        result = simulate_fleet(spec)
        rates[policy] = result.summary["prefix_cache_hit_rate"]
        if policy == "affinity":
            reasons = result.summary["route_reasons"]
            assert reasons["new_prefix"] == 40 and reasons["affinity"] + reasons.get("over_bound", 0) == 120
    # Affinity: every later turn hits its whole history. Of all prompt tokens (turns of 200,
    # 440, 680, 920) the history is (0 + 240 + 480 + 720) / 2240 ≈ 64 % (less a block per turn).
    assert 0.55 < rates["affinity"] < 0.65
    assert rates["round_robin"] < rates["affinity"] / 2


def test_least_outstanding_sends_the_next_request_to_the_idle_replica():
    spec = scenario(replicas=2, router={"policy": "least_outstanding"}, latency={"model": "constant", "step_s": 0.01},
                    workload={"num_requests": 3, "arrival": {"process": "constant", "rate": 10.0},
                              "prompt_len": {"dist": "fixed", "value": 16}, "output_len": {"dist": "fixed", "value": 100}})
    routes = simulate_fleet(spec).tables["routes"]
    # t=0: both idle, the rotation starts at 0; t=0.1: replica 0 is busy (100 steps of 10 ms);
    # t=0.2: one each, tie broken by the rotation (third decision starts at 0).
    assert list(routes["replica"]) == [0, 1, 0]


def test_the_load_bound_spreads_one_hot_prefix():
    spec = scenario(replicas=4, router={"policy": "affinity", "load_bound": 1.25, "load_slack": 2},
                    engine={"enable_prefix_caching": True},
                    workload={"num_requests": 200, "arrival": {"process": "poisson", "rate": 40.0},
                              "shared_prefix": {"tokens": 1024}})
    summary = simulate_fleet(spec).summary
    assert summary["route_reasons"]["over_bound"] > 0
    assert summary["requests_per_replica"]["min"] > 0
    assert summary["prefix_cache_hit_rate"] > 0.5  # still mostly served where the prompt is cached


def test_replica_groups_get_their_own_settings_and_bad_ones_name_the_group():
    spec = scenario(replicas=[{"count": 2}, {"count": 1, "name": "small", "engine": {"max_num_seqs": 4}}])
    specs = replica_scenarios(spec)
    assert [s.name for s in specs] == ["f/g0-0", "f/g0-1", "f/small-0"]
    assert [s.engine.max_num_seqs for s in specs] == [spec.engine.max_num_seqs] * 2 + [4]
    result = simulate_fleet(spec)
    assert result.summary["num_replicas"] == 3 and result.summary["num_finished"] == 40
    assert result.replicas[2].summary["max_running"] <= 4
    bad = scenario(replicas=[{"count": 1, "engine": {"max_num_seqs": -1}}])
    with pytest.raises(KvsimError, match=r"replicas\[0\].*max_num_seqs"):
        replica_scenarios(bad)


@pytest.mark.parametrize("policy", ["round_robin", "least_outstanding", "least_kv", "affinity"])
def test_results_are_deterministic_and_burst_mode_changes_nothing(policy):
    # Bursts run past other replicas' arrivals and are cut when one arrives for their replica
    # (least_kv reads a bursting replica's KV usage after the steps done by then); step-by-step
    # is the reference.
    spec = scenario(replicas=3, router={"policy": policy}, engine={"enable_prefix_caching": True},
                    workload={"num_requests": 90, "arrival": {"process": "poisson", "rate": 9.0},
                              "output_len": {"dist": "uniform", "low": 10, "high": 200},
                              "multi_turn": {"turns": 3, "think_time_s": 1.0}})
    a, b = simulate_fleet(spec), simulate_fleet(spec)
    assert a.summary == b.summary
    step_by_step = simulate_fleet(spec, bursts=False)
    assert list(step_by_step.tables["routes"]["replica"]) == list(a.tables["routes"]["replica"])
    for column in ("first_token_s", "finish_s", "prefix_hit_tokens"):
        np.testing.assert_allclose(step_by_step.requests[column], a.requests[column], rtol=1e-12)
    assert len(step_by_step.steps) == len(a.steps)
    np.testing.assert_allclose(step_by_step.steps["vllm:kv_cache_usage_perc"], a.steps["vllm:kv_cache_usage_perc"])
    np.testing.assert_array_equal(step_by_step.steps["vllm:num_requests_waiting"], a.steps["vllm:num_requests_waiting"])


@pytest.mark.parametrize("policy", ["round_robin", "least_outstanding", "least_kv", "affinity"])
def test_bursts_equal_step_by_step_when_arrivals_tie_with_step_ends(policy):
    # A burst is waited for in one event, but not when a request arrives exactly when one of its
    # steps ends: then the order of the two events decides what the router and the replica see.
    # Dyadic step times (1/16 s) and arrivals every 1/8 s make such ties happen all the time.
    spec = scenario(replicas=4, router={"policy": policy}, latency={"model": "constant", "step_s": 0.0625},
                    workload={"num_requests": 80, "arrival": {"process": "constant", "rate": 8.0},
                              "output_len": {"dist": "uniform", "low": 5, "high": 120}})
    bursts, step_by_step = simulate_fleet(spec), simulate_fleet(spec, bursts=False)
    assert list(step_by_step.tables["routes"]["replica"]) == list(bursts.tables["routes"]["replica"])
    for column in ("first_token_s", "finish_s"):
        np.testing.assert_array_equal(step_by_step.requests[column], bursts.requests[column])
    for column in ("time_s", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        np.testing.assert_array_equal(step_by_step.steps[column], bursts.steps[column])


def test_the_single_engine_refuses_a_fleet_scenario():
    with pytest.raises(KvsimError, match="replicas=2"):
        simulate(scenario(replicas=2))


def test_a_fleets_steps_setting_bounds_its_rows_and_leaves_its_summary_alone(monkeypatch):
    # `steps` is a fleet-wide setting: none keeps no row, sampled at most MAX_SAMPLED_STEPS over all
    # replicas (each replica keeps every k-th row of its own, k doubling at its share of the cap);
    # the summary is made from every step in each case. A cap of 10 rows makes 3 replicas sample.
    import kvsim.fleet.driver

    monkeypatch.setattr(kvsim.fleet.driver, "MAX_SAMPLED_STEPS", 10)
    runs = {mode: simulate_fleet(scenario(replicas=3, steps=mode)) for mode in ("all", "sampled", "none")}
    every = runs["all"].steps
    assert len(every) > 3 * 10 and len(runs["none"].steps) == 0
    sampled = runs["sampled"].steps
    assert 0 < len(sampled) <= 3 * (10 // 3)  # each replica keeps at most its 3 of the 10
    for replica, rows in sampled.groupby("replica"):  # each kept row is one of that replica's steps
        all_rows = every[every["replica"] == replica]
        assert set(rows["time_s"]) <= set(all_rows["time_s"]) and rows["time_s"].iloc[-1] == all_rows["time_s"].iloc[-1]
    assert runs["sampled"].summary == runs["all"].summary == runs["none"].summary


def test_router_null_drops_the_router():
    """A single-engine scenario naming a router is refused (nothing to route); `router: null` drops it, so a
    fleet scenario turns into one engine with `replicas=null router=null` (as `kvsim plan` bases take it)."""
    from kvsim.workload.fleet_layout import Router
    from kvsim.workload.scenario import load_scenario

    with pytest.raises(KvsimError, match=r"drop the router \(router=null\)"):
        load_scenario(None, ["router.policy=affinity"])
    one = load_scenario(None, ["replicas=2", "router.policy=affinity", "replicas=null", "router=null"])
    assert one.replicas is None and one.router == Router()


def test_a_fleet_of_speculating_replicas_sums_their_counters_and_derives_its_rates_from_the_sums():
    # Output 61: after the prefill's first token, 60 more. Synthetic length 3 of K = 3 accepts exactly 2 drafts
    # a verify (3 tokens a step): 20 verifies, 60 drafts, 40 accepted a request; length 4 accepts all 3 (4 a
    # step): 15 verifies, 45 drafts, 45 accepted. Round robin hands each of the 3 replicas 10 of 30 requests.
    def spec(length):
        return {"method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": length}

    groups = [{"count": 1, "engine": {"speculative_config": spec(3)}},
              {"count": 1, "engine": {"speculative_config": spec(4)}}, {"count": 1}]
    fleet = simulate_fleet(scenario(replicas=groups, router={"policy": "round_robin"},
                                    workload={"num_requests": 30, "output_len": {"dist": "fixed", "value": 61}}))
    got = fleet.summary["spec_decode"]
    assert (got["num_drafts"], got["num_draft_tokens"], got["num_accepted_tokens"]) == (
        10 * 20 + 10 * 15, 10 * 60 + 10 * 45, 10 * 40 + 10 * 45)
    assert got["mean_acceptance_length"] == pytest.approx(1 + 850 / 350)  # not (3 + 4) / 2
    assert got["draft_acceptance_rate"] == pytest.approx(850 / 1050)  # not (2/3 + 1) / 2
    # Rejected drafts: only the length-3 replica's; its slot-seconds over the two speculating pools (equal
    # ones) for the fleet's run. The third replica does not speculate: its pool is not counted.
    first = fleet.replicas[0].summary
    assert "spec_decode" not in fleet.replicas[2].summary
    assert got["draft_rejected_share"] == pytest.approx(
        first["spec_decode"]["draft_rejected_share"] * first["duration_s"] / (2 * fleet.summary["duration_s"]))
    assert got["draft_rejected_share"] > 0
