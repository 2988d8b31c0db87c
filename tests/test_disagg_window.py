"""The steady-state window test (`kvsim.planning.window`) on a disaggregated fleet's requests and transfers.

The client's row of a request carries the prefill instance's admission (`first_scheduled_s`, its `queue_s`
the wait before the prefill) and the decode instance as its `replica`: read alone, the waiting queue is the
prefill pool's. With the transfers table's hand-offs, the fleet's queue runs from arrival to first token (the
prefill and the transfer count as waiting, a bounded few), and each decode instance's own queue, hand-off to
first token, and each prefill instance's, arrival to prefill, are judged apart (`early_overload`).

A world priced by hand: a constant 10 ms step, 256-token prompts (one prefill step on P: P serves up to
100 req/s) and 20-token outputs (20 steps on D: its first step recomputes the last prompt token and yields
the first token, then 19 decodes: 0.2 s a request, so D serves max_num_seqs / 0.2 req/s).
"""

import pytest

import kvsim
from kvsim.planning.window import BACKLOGGED, OVERLOADED, STABLE, window_evidence

FIXED = {"dist": "fixed"}


def judged(result):
    return window_evidence(result.requests, transfers=result.tables["transfers"])


def split_fleet(rate_per_s, decode_max_num_seqs, num_requests, num_decode=1):
    return kvsim.simulate(
        None, workload__num_requests=num_requests, workload__arrival={"process": "poisson", "rate": rate_per_s},
        workload__prompt_len={**FIXED, "value": 256}, workload__output_len={**FIXED, "value": 20}, router=None,
        latency={"model": "constant", "step_s": 0.01}, kv_transfer_config={"kv_link": "rdma"},
        replicas=[{"count": 1, "kv_role": "kv_producer"},
                  {"count": num_decode, "kv_role": "kv_consumer", "engine": {"max_num_seqs": decode_max_num_seqs}}])


@pytest.mark.parametrize("num_decode", [1, 2])
def test_a_split_fleet_well_inside_its_capacity_reads_stable(num_decode):
    """20 req/s: P at 20 % of its 100 req/s, each D at 20/num_decode of its 8 / 0.2 = 40 req/s (50 %, 25 %).
    Stable, served ÷ offered ≈ 1, and no instance's queue outgrows its margin."""
    evidence = judged(split_fleet(20.0, 8, 2000, num_decode))
    assert evidence["verdict"] == STABLE
    assert evidence["served_over_offered"] == pytest.approx(1.0, abs=0.03)
    worst = evidence["early_overload"]["worst_replica"]  # P or a decode instance, one of them too
    assert worst["waiting_growth"] <= worst["margin"]


@pytest.fixture(scope="module")
def decode_behind():
    """D with max_num_seqs 1 serves 1 / 0.2 = 5 req/s; at 5.6 req/s it is 12 % over (P at 5.6 %)."""
    return split_fleet(5.6, 1, 4000)


def test_a_split_fleet_whose_decode_instance_falls_behind_is_not_stable(decode_behind):
    """It finishes 5 of every 5.6 arrivals (served ÷ offered ≈ 0.89, past the 5 % tolerance) and its own queue
    grows by ~0.6 requests a second, past its margin, and so does the fleet's, arrival to first token. P's
    queue alone, what the requests table's first_scheduled_s gives, does not grow at all: judged on it alone
    (without the transfers) the run reads stable."""
    evidence = judged(decode_behind)
    assert evidence["served_over_offered"] == pytest.approx(5 / 5.6, abs=0.03)
    fleet, worst = evidence["early_overload"], evidence["early_overload"]["worst_replica"]
    assert fleet["waiting_growth"] > fleet["margin"]
    assert worst["replica"] == 1 and worst["waiting_growth"] > worst["margin"]
    assert evidence["verdict"] == OVERLOADED
    prefill_only = window_evidence(decode_behind.requests)
    assert prefill_only["early_overload"]["waiting_growth"] == 0 and prefill_only["verdict"] == STABLE


def test_a_split_fleet_far_past_its_decode_capacity_is_overloaded_not_too_short():
    """At 20 req/s, 4x D's 5: its service time (first scheduled on P to finish) includes D's growing queue, so
    every run is too short by the service-time test; its decode queue's growth still says overloaded."""
    evidence = judged(split_fleet(20.0, 1, 2000))
    assert evidence["verdict"] == OVERLOADED


def test_one_prefill_instance_behind_while_the_pipeline_queue_keeps_within_its_margin():
    """2P1D, round robin: P0 takes prefill chunks of 50 tokens one request at a time (max_num_seqs 1), so a
    100-token prompt takes 2 of its 10 ms steps: 50 req/s; P1 (defaults) serves far more, and D (5 outputs,
    256 seqs) too. At 107 req/s P0 gets 53.5, 7 % over: its queue grows ~3.5 a second, ~68 over the ~19.5 s
    window of 3,000 arrivals. The pipeline queue (arrival to first token) grows as much, but its margin counts
    every arrival, ~2,100, and D's running requests: 1.96 · √2,100 ≈ 90 > 68, so alone it read stable. P0's
    own queue, its ~1,050 arrivals of c_a² 1/2 (every other one of a Poisson stream), has a margin of
    z · √(525 + ~1) ≈ 2.39 · 23 = 55 (z for 3 instances: Φ(−z) = 0.025 / 3) and outgrows it."""
    raw = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": 2, "engine": {"max_model_len": 2048},
           "workload": {"num_requests": 3000, "arrival": {"process": "poisson", "rate": 107.0},
                        "prompt_len": {**FIXED, "value": 100}, "output_len": {**FIXED, "value": 5}},
           "latency": {"model": "constant", "step_s": 0.01},
           "kv_transfer_config": {"kv_link": "rdma", "prefill_router": {"policy": "round_robin"}},
           "replicas": [{"count": 1, "kv_role": "kv_producer",
                         "engine": {"max_num_batched_tokens": 50, "max_num_seqs": 1}},
                        {"count": 1, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}]}
    evidence = judged(kvsim.simulate(raw))
    fleet, worst = evidence["early_overload"], evidence["early_overload"]["worst_replica"]
    assert 50 < fleet["waiting_growth"] <= fleet["margin"] == pytest.approx(90, abs=5)
    assert worst["replica"] == 0 and worst["margin"] == pytest.approx(55, abs=4)
    assert worst["waiting_growth"] > worst["margin"]
    assert evidence["served_over_offered"] > 0.95 and evidence["verdict"] == BACKLOGGED
