"""Metamorphic and independent-derivation relations, eleventh round: the planning answers a planner buys GPUs from.

`test_metamorphic8.py` held the first round on planning (capacity prices to 4 digits, the printed evidence). Here,
every expected value derived by hand or by a naive second implementation written in the test:

* queueing theory: one single-slot replica (`max_num_seqs` 1, 10 ms steps whatever they carry, a 16-token prompt:
  a request of O output tokens is O steps) is an M/G/1 queue, and its mean wait (`queue_s`) is Pollaczek–Khinchine's
  λ·E[S²] / (2(1 − ρ)): M/D/1's ρ / (2μ(1 − ρ)) = 0.075 s at 6 req/s of 0.1 s, and 0.0975 s with outputs uniform
  on 1..19 (E[S²] = 0.013 s²), within 4 batch-means standard errors of the sample; each request's wait is Lindley's
  recursion over its replica's own arrivals, to 1e-9, on one replica and on a round-robin fleet of 3 at 3× the rate;
* a round-robin fleet of N at N·r is *not* N copies of one replica at r: each replica gets every N-th arrival, an
  Erlang-N stream, smoother than Poisson, so it waits less (Kingman's bound λ(σa² + σs²) / (2(1 − ρ)) with
  σa² = 1 / (Nλ²), σs = 0: 0.0694 s for N = 3 at ρ = 0.6, against M/D/1's 0.075 s; the fleet waits 0.01 s). With
  equal service times that fleet is M/D/N itself (customer n starts when customer n − N ends), as docs/fleets-and-plan.md says;
* a plan (the toy of `tests/test_plan.py`: 20 ms a step whatever the batch, 8 slots, 256 + 64 tokens, so one
  replica serves exactly 8 / (64 · 0.02 s) = 6.25 req/s): the stability-only answer is ⌈λ / 6.25⌉ (3 at 14 req/s);
  twice the rate never needs fewer replicas; a looser SLO never needs more; twice the hourly price doubles the cost
  an hour and a million tokens and moves nothing else; USD per million tokens is the cost an hour over 3,600 × the
  output rate of the run behind the answer, its window recomputed here from its request table by the definition
  (`kvsim.planning.window`), and that rate is 64 tokens × the offered rate within the Poisson noise of the window's
  arrivals;
* an SLO below what one request alone on an idle replica takes (one 20 ms step a token: TTFT ≥ 0.02 s, E2E ≥ 64 ·
  0.02 = 1.28 s) is reported as unreachable by any fleet, before anything is simulated. It was searched instead
  (up to `max_replicas`, 64 by default, each count simulated) and reported as "misses ttft_s.p90 even at 16
  replicas", which reads as if 32 might;
* the steady-state verdict of a run does not depend on the seed within the confidence it states: at ρ = 0.75 every
  seed of four is stable, at ρ = 1.3 every one overloaded; nor does a plan's answer: seed 2 of the toy answered 4
  replicas where seeds 1, 3, 4, 5 answer 3 (the least any can: 2 replicas get 7 req/s each), because its 400-request
  probe of 3 missed p90 TTFT by noise (0.32 s, its 95 % interval 0.25–0.41 s) and nothing looked below the answer
  again; the count below is now rerun long when its probe missed within its interval;
* the latency floor itself is under every simulated request (Llama-3.1-8B under the roofline, v1 with 512-token
  chunks and no prefix cache: two steps before a 1,000-token prompt's first token; v0).

Relations tried that held and are not kept (each a plan of seconds, or covered elsewhere): `kvsim capacity`'s
closed-form concurrency, rate and prices are the same per engine with `-dp 2` as with 1 (DP scales linearly);
the replica floor of `kvsim.planning.bounds` stayed under one replica's measured capacity (Llama-3.1-8B, H100,
32 + 128 tokens: floor 1.10 replicas at 165 req/s, served 84 %); the rate search's answer varies 3–4 over five
seeds at 14 req/s, each time on a long run (3 replicas at 1.1x the traffic held or failed), a boundary case
and not a probe's noise. Kept out as wrong relations: N round-robin replicas at N·r do not queue like one at r
(above); an empty SLO is refused by `plan` (its stability-only answer uses a limit no run reaches).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvsim.fleet.run import simulate_scenario
from kvsim.planning.plan import make_plan_spec, plan
from kvsim.planning.window import OVERLOADED, STABLE, window_evidence
from kvsim.workload.scenario import make_scenario

STEP_S = 0.01  # the single-slot replica's step: S = O steps


def single_slot(rate: float, num_requests: int, output_len: dict, replicas: int | None = None, seed: int = 1):
    """One request at a time (`max_num_seqs` 1), 10 ms a step, 16-token prompts (one chunk, which samples the
    first token): a request of O output tokens is served in O steps."""
    fleet = {} if replicas is None else {"replicas": replicas, "router": {"policy": "round_robin"}}
    return make_scenario({
        **fleet, "name": "single-slot", "engine": {"max_model_len": 256, "num_gpu_blocks_override": 64, "max_num_seqs": 1},
        "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": rate},
                     "prompt_len": {"dist": "fixed", "value": 16}, "output_len": output_len},
        "latency": {"model": "constant", "step_s": STEP_S}, "seed": seed})


def lindley_waits(arrival_s: np.ndarray, service_s: np.ndarray) -> np.ndarray:
    """A FCFS single server's waits, naively: W₁ = 0, Wₙ₊₁ = max(0, Wₙ + Sₙ − (Aₙ₊₁ − Aₙ))."""
    waits = np.zeros(len(arrival_s))
    for n in range(1, len(arrival_s)):
        waits[n] = max(0.0, waits[n - 1] + service_s[n - 1] - (arrival_s[n] - arrival_s[n - 1]))
    return waits


def batch_means_se(values: np.ndarray, num_batches: int = 20) -> float:
    """The standard error of the mean of correlated values, by non-overlapping batch means."""
    means = np.array([batch.mean() for batch in np.array_split(values, num_batches)])
    return float(means.std(ddof=1) / math.sqrt(num_batches))


@pytest.mark.parametrize(("output_len", "mean_s2"), [
    ({"dist": "fixed", "value": 10}, 0.1**2),  # M/D/1
    ({"dist": "uniform", "low": 1, "high": 19}, STEP_S**2 * sum(o * o for o in range(1, 20)) / 19),  # 0.013 s²
], ids=["md1", "mg1"])
def test_one_single_slot_replica_waits_as_pollaczek_khinchine_says(output_len, mean_s2):
    rate, mean_s = 6.0, 0.1
    rho = rate * mean_s
    requests = simulate_scenario(single_slot(rate, 2000, output_len)).requests.sort_values("arrival_s")
    service = (requests["output_tokens"] * STEP_S).to_numpy()
    assert np.allclose(requests["finish_s"] - requests["first_scheduled_s"], service, atol=1e-9)  # S = O steps
    waits = requests["queue_s"].to_numpy()
    assert np.allclose(waits, lindley_waits(requests["arrival_s"].to_numpy(), service), atol=1e-9)
    steady = waits[len(waits) // 10:]  # the queue starts empty: its first tenth left out
    expected = rate * mean_s2 / (2 * (1 - rho))  # 0.075 s (M/D/1: ρ / (2μ(1 − ρ))), 0.0975 s (uniform 1..19)
    assert abs(steady.mean() - expected) <= 4 * batch_means_se(steady)


def test_a_round_robin_fleet_is_each_replicas_own_queue_not_one_replica_at_its_share():
    """3 single-slot replicas at 18 req/s: round robin sends arrival i to replica i mod 3, and each replica's waits
    are Lindley's over its own arrivals; its stream is Erlang-3, so the fleet waits under Kingman's bound for it
    (1 / 14.4 = 0.0694 s), itself under one replica at 6 req/s (M/D/1: 0.075 s)."""
    replicas, rate = 3, 6.0
    result = simulate_scenario(single_slot(replicas * rate, 2000, {"dist": "fixed", "value": 10}, replicas=replicas))
    requests = result.requests.sort_values("arrival_s").reset_index(drop=True)
    assert (requests["replica"].to_numpy() == np.arange(len(requests)) % replicas).all()
    for _, mine in requests.groupby("replica"):
        assert np.allclose(mine["queue_s"], lindley_waits(mine["arrival_s"].to_numpy(), np.full(len(mine), 0.1)),
                           atol=1e-9)
    steady = requests["queue_s"].to_numpy()[len(requests) // 10:]
    rho, kingman = 0.6, rate * (1 / (replicas * rate**2)) / (2 * (1 - 0.6))
    assert kingman == pytest.approx(1 / 14.4)  # 0.0694 s
    assert steady.mean() + 4 * batch_means_se(steady) < kingman < rho / (2 * 10 * (1 - rho))


@pytest.mark.parametrize(("rate", "verdict"), [(4.6875, STABLE), (8.125, OVERLOADED)], ids=["rho0.75", "rho1.3"])
def test_the_steady_state_verdict_does_not_depend_on_the_seed(rate, verdict):
    """The toy replica serves 6.25 req/s (8 slots, 64 steps of 20 ms a request): at ρ = 0.75 four seeds' runs are
    all stable, at ρ = 1.3 all overloaded (a stable queue passes the margin's z = 1.96 test 95 % of the time and
    ρ = 0.75 is far inside it; at 1.3 the queue grows ~30 % of the window's arrivals, beyond any margin)."""
    verdicts = {window_evidence(simulate_scenario(toy(rate, 400, seed)).requests)["verdict"] for seed in range(1, 5)}
    assert verdicts == {verdict}


def toy(rate: float, num_requests: int = 100, seed: int = 5):
    """`tests/test_plan.py`'s toy: 20 ms a step whatever the batch, 8 slots, 256-token prompts, 64-token replies."""
    return make_scenario({
        "name": "toy", "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 400, "max_num_seqs": 8},
        "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": rate},
                     "prompt_len": {"dist": "fixed", "value": 256}, "output_len": {"dist": "fixed", "value": 64}},
        "latency": {"model": "constant", "step_s": 0.02}, "seed": seed})


SLO = {"ttft_s.p90": 0.3, "e2e_s.p99": 2.0}
CAPACITY_PER_S = 8 / (64 * 0.02)  # 8 slots, each request 64 steps of 20 ms: 6.25 req/s a replica


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """plan(rate, slo, price, search) → (its row, points simulated now), the points shared by every plan here."""
    folder = tmp_path_factory.mktemp("plans") / "plan"

    def run(rate: float, slo: dict, usd_per_gpu_hour: float = 2.0, search: str = "replicas"):
        spec = make_plan_spec({"slo": slo, "gpus": ["h100-80gb"], "max_replicas": 8, "router": "round_robin",
                               "verify_factor": 2, "gpu_hourly_cost": {"h100-80gb": usd_per_gpu_hour},
                               "search": search})
        (row, *_), simulated = plan(toy(rate), spec, folder)
        return row, simulated
    return run


def test_a_stability_only_plan_is_the_rate_over_one_replicas_capacity(planned):
    """With no latency SLO a fleet passes when it keeps up: ⌈λ / 6.25⌉ replicas (14 req/s: 2.24, so 3), the floor
    `kvsim.planning.bounds` gives too (every token at its best batch: 14 · 64 · 0.02 / 8 plus the prompts)."""
    row, _ = planned(14.0, {"e2e_s.p99": 1000.0})  # no SLO binds (plan asks for one)
    assert row["replicas"] == math.ceil(14.0 / CAPACITY_PER_S) == 3
    assert row["lower_bound_replicas"] <= row["replicas"]


def test_twice_the_rate_never_needs_fewer_replicas_and_a_looser_slo_never_more(planned):
    at_rate, _ = planned(14.0, SLO)
    assert planned(7.0, SLO)[0]["replicas"] <= at_rate["replicas"]
    assert planned(14.0, {k: 2 * v for k, v in SLO.items()})[0]["replicas"] <= at_rate["replicas"]


def test_twice_the_price_doubles_every_cost_and_moves_nothing_else(planned):
    row, _ = planned(14.0, SLO, 2.0)
    dear, simulated = planned(14.0, SLO, 4.0)
    assert simulated == 0  # the same points: the price is no input of a run
    assert dear["cost_per_hour"] == 2 * row["cost_per_hour"] == 2 * 2.0 * row["num_gpus"]
    assert dear["usd_per_million_output_tokens"] == pytest.approx(2 * row["usd_per_million_output_tokens"], rel=1e-12)
    costs = ("cost_per_hour", "usd_per_million_output_tokens", "price_source")
    assert {k: v for k, v in dear.items() if k not in costs} == {k: v for k, v in row.items() if k not in costs}


def test_usd_per_million_tokens_is_the_cost_over_the_answers_window_output_rate_by_hand(planned):
    """The answer's long run (2 × its probes' requests on the chosen fleet) rerun, its window recomputed from the request
    table by the definition: [t0 + max(0.2 · span, 3 · median service), t_last − 0.1 · span), output tokens of the
    requests finishing in it over its length; and that rate is 64 × the window's arrival rate within 4 Poisson
    deviations of the window's arrival count."""
    row, _ = planned(14.0, SLO)
    assert row["verified"] is True
    fleet = make_scenario({**toy(14.0, row["evidence_num_requests"]).model_dump(mode="json"), "replicas": row["replicas"],
                           "router": {"policy": "round_robin"}})
    r = simulate_scenario(fleet).requests
    arrival, finish = r["arrival_s"].to_numpy(), r["finish_s"].to_numpy()
    span = arrival.max() - arrival.min()
    start = arrival.min() + max(0.2 * span, 3 * float(np.median(finish - r["first_scheduled_s"].to_numpy())))
    end = arrival.max() - 0.1 * span
    tokens_per_s = r["output_tokens"][(finish >= start) & (finish < end)].sum() / (end - start)
    assert row["output_tokens_per_s"] == pytest.approx(tokens_per_s, rel=1e-12)
    assert row["usd_per_million_output_tokens"] == pytest.approx(
        row["replicas"] * 2.0 / (3600 * tokens_per_s) * 1e6, rel=1e-12)
    arrived = int(((arrival >= start) & (arrival < end)).sum())
    assert abs(tokens_per_s / (64 * arrived / (end - start)) - 1) <= 4 / math.sqrt(arrived)


@pytest.mark.parametrize(("slo", "key", "floor_s"), [({"ttft_s.p90": 0.015}, "ttft_s.p90", 0.02),
                                                     ({"ttft_s.p90": 0.3, "e2e_s.p50": 1.2}, "e2e_s.p50", 1.28)],
                         ids=["ttft", "e2e"])
@pytest.mark.parametrize("search", ["replicas", "rate"])
def test_an_slo_below_one_request_alone_is_unreachable_and_nothing_is_simulated(planned, slo, key, floor_s, search):
    """One 20 ms step a token, each after its request's arrival: TTFT ≥ 0.02 s, E2E ≥ 64 · 0.02 = 1.28 s for every
    request on any fleet. Before, the replica search simulated 1, 2, 4, 8 and 16 replicas (of `max_replicas` 16) and
    said "misses ttft_s.p90 even at 16 replicas", the rate search "over 16 replicas; misses ttft_s.p90 at 0.913
    req/s per replica", as if more replicas might."""
    row, simulated = planned(14.0, slo, search=search)
    assert simulated == 0 and row["feasible"] is False and row["replicas"] is None
    assert row["limiting_factor"].startswith(f"no fleet can meet {key} <= {slo[key]:g} s (at least {floor_s:.4g} s)")
    assert row["headroom"] == pytest.approx((slo[key] - floor_s) / slo[key])
    at_floor, _ = planned(14.0, {**slo, key: floor_s}, search=search)  # a limit at the floor itself is searched (and met or not)
    assert not at_floor["limiting_factor"].startswith("no fleet can meet")


@pytest.mark.parametrize("engine", [{"enable_prefix_caching": False, "max_num_batched_tokens": 512, "max_num_seqs": 64},
                                    {"scheduler": "v0"}], ids=["v1-chunked-no-cache", "v0"])
def test_the_latency_floor_is_under_every_requests_latency(engine):
    """Llama-3.1-8B under the roofline, 1,000-token prompts at 200 req/s: every request's TTFT, TPOT and E2E is at
    least its floor (v1 with 512-token chunks and no cache: two steps before the first token)."""
    from kvsim.planning.slo_floor import slo_floor

    scenario = make_scenario({"name": "floor", "engine": {"max_model_len": 4096, **engine}, "seed": 3,
                              "workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 200.0},
                                           "prompt_len": {"dist": "fixed", "value": 1000},
                                           "output_len": {"dist": "fixed", "value": 8}}})
    floor = slo_floor(scenario)
    assert floor is not None and floor.ttft_s == pytest.approx((2 if "max_num_batched_tokens" in engine else 1)
                                                               * floor.step_s)
    r = simulate_scenario(scenario).requests
    assert r["ttft_s"].min() >= floor.ttft_s and r["tpot_s"].min() >= floor.tpot_s
    assert r["e2e_s"].min() >= floor.e2e_s == pytest.approx(8 * floor.step_s)


def test_a_probe_that_missed_within_its_noise_does_not_add_a_replica(tmp_path):
    """Seed 2 of the toy at 14 req/s (200 requests, probes doubled to 400 as too short): the 400-request probe of
    3 replicas missed p90 TTFT <= 0.3 s with 0.32 s, its 95 % interval 0.25–0.41 s reaching the limit, and the
    plan answered 4 where seeds 1, 3, 4 and 5 answer 3. 3 is the least any seed can answer (2 replicas get 7 req/s
    each, over the 6.25 one serves), and the long run of 3 replicas (10 × 400 requests) meets both SLOs."""
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8, "router": "round_robin"})
    (row, *_), simulated = plan(toy(14.0, 200, seed=2), spec, tmp_path / "plan")
    assert CAPACITY_PER_S < 14.0 / 2
    assert row["replicas"] == 3 and row["verified"] is True and row["evidence_num_requests"] == 4000
    assert row["verify_ttft_s.p90"] <= SLO["ttft_s.p90"] and row["verify_e2e_s.p99"] <= SLO["e2e_s.p99"]
    # the rerun is the very run the verification of 3 reads, by its key: one line of points.jsonl, simulated once
    # (so a plan resumed from any prefix of the file replays the same searches and answers the same)
    names = [json.loads(line)["name"] for line in (tmp_path / "plan" / "points.jsonl").read_text().splitlines()]
    assert simulated == len(names) and [n for n in names if n.endswith("/x3")] == [
        "toy/verify400/h100-80gb_tp1/x3", "toy/verify400/verify4000/h100-80gb_tp1/x3"]  # its probe, its long run
