"""Whole runs: determinism, conservation, the seed's lab and the paper check."""

import re
from pathlib import Path

import pytest
from conftest import sized

from kvsim.engine.simulate import simulate
from kvsim.model.capacity import num_gpu_blocks
from kvsim.model.config import load_gpu, load_model
from kvsim.workload.scenario import load_scenario, make_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def run(name, *overrides, **kwargs):
    return simulate(load_scenario(SCENARIOS / f"{name}.yaml", list(overrides)), **kwargs).summary


def test_same_seed_same_results():
    scenario = load_scenario(None, ["workload.num_requests=150"])
    a, b = simulate(scenario), simulate(scenario)
    assert a.summary == b.summary
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    c = simulate(load_scenario(None, ["workload.num_requests=150", "seed=1"]))
    assert c.summary != a.summary


@pytest.mark.parametrize("name", ["paper-paged", "preemption-swap", "lab-5-system-prompt-caching",
                                  "paper-slab-pow2"])
def test_bursts_change_nothing(name):
    scenario = load_scenario(SCENARIOS / f"{name}.yaml", ["workload.num_requests=120"])
    a, b = simulate(scenario, bursts=False), simulate(scenario, bursts=True)
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)


def capped(path, max_blocks=2048, max_len=16384):
    """Overrides that shrink a scenario's KV pool to `max_blocks` and max_model_len to `max_len`
    (where larger): `check_invariants()` walks the whole pool and every block table each step."""
    spec = load_scenario(path)
    model = load_model(spec.model)
    overrides = []
    if spec.engine.resolved_max_model_len(model) > max_len:
        overrides.append(f"engine.max_model_len={max_len}")
    if num_gpu_blocks(model, load_gpu(spec.gpu), spec.engine) > max_blocks:
        overrides.append(f"engine.num_gpu_blocks_override={max_blocks}")
    return overrides


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_conserves_requests_and_blocks(path):
    num_requests = sized(60, 200)
    overrides = sized(capped(path), []) + [f"workload.num_requests={num_requests}"]
    spec = load_scenario(path, overrides)
    if spec.is_fleet:  # a disaggregated or autoscaled fleet: kvsim.simulate runs it (no pool-wide waste shares)
        import kvsim

        fleet = kvsim.simulate(spec, check=True)
        assert fleet.summary["num_finished"] + fleet.summary["num_rejected"] == num_requests
        assert sorted(fleet.requests["request_id"]) == list(range(num_requests))
        return
    result = simulate(spec, check=True)
    s = result.summary
    assert s["num_finished"] + s["num_rejected"] == s["num_requests"] == num_requests
    finished = result.requests[result.requests.status == "finished"]
    assert (finished.first_token_s >= finished.arrival_s).all()
    assert (finished.finish_s >= finished.first_token_s).all()
    assert abs(sum(s["waste"].values()) - 1) < 1e-9


def test_lab_slab_concurrency_follows_max_model_len():
    long = run("lab-1-max-len-8192", "engine.allocator=slab-max")
    short = run("lab-2-max-len-1024", "engine.allocator=slab-max")
    assert 6 <= short["max_running"] / long["max_running"] <= 11  # about 8×


@pytest.mark.parametrize("name", ["lab-1-max-len-8192", "lab-2-max-len-1024", "lab-3-fp8-kv"])
def test_lab_description_states_the_slabs_that_fit(name):
    """Each lab scenario's description says how many max_model_len slabs its pool holds (lab-2 and lab-3 said
    "~4", lab-1's figure, where 31 and 63 fit). By hand: a slab of max_model_len takes max_model_len / 16
    blocks of the whole pool (Orca's contiguous regions keep no null block back, vLLM v1's paged pool does), so
    floor(num_gpu_blocks / (max_model_len / 16)); the saturated slab-max run reaches exactly that many at once."""
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    stated = int(re.search(r"hold (?:only|at most) (\d+) sequences", scenario.description).group(1))
    s = run(name, "engine.allocator=slab-max")
    assert stated == s["num_gpu_blocks"] // (s["max_model_len"] // 16) == s["max_running"]


def test_lab_paged_concurrency_follows_actual_lengths():
    long, short = run("lab-1-max-len-8192"), run("lab-2-max-len-1024")
    assert abs(long["mean_running"] - short["mean_running"]) <= 0.15 * short["mean_running"]
    assert long["mean_running"] > 10 * run("lab-1-max-len-8192", "engine.allocator=slab-max")["mean_running"]


def test_lab_fp8_admits_about_twice_the_sequences():
    auto, fp8 = run("lab-2-max-len-1024"), run("lab-3-fp8-kv")
    assert fp8["num_gpu_blocks"] == 2 * auto["num_gpu_blocks"]
    assert 1.6 <= fp8["max_running"] / auto["max_running"] <= 2.2


def test_lab_prefix_caching_cuts_ttft_and_kv():
    off, on = run("lab-4-system-prompt-no-caching"), run("lab-5-system-prompt-caching")
    assert on["ttft_s"]["mean"] < 0.1 * off["ttft_s"]["mean"]
    assert on["prefix_cache_hit_rate"] > 0.8 and off["prefix_cache_hit_rate"] == 0


@pytest.mark.parametrize("caching", [True, False])
def test_shared_prompt_kv_grows_sublinearly_only_with_caching(caching):
    def peak_blocks(n):
        result = simulate(load_scenario(SCENARIOS / "shared-prompt-5000x100.yaml", [
            f"workload.num_requests={n}", "workload.arrival.rate=100000",
            f"engine.enable_prefix_caching={str(caching).lower()}"]))
        return result.steps["held_slots"].max() // 16

    # each request: 5,100 prompt + 199 stored output tokens = 332 blocks, 312 of them the shared prompt
    if caching:
        assert (peak_blocks(10), peak_blocks(40)) == (312 + 10 * 20, 312 + 40 * 20)
    else:
        assert peak_blocks(40) / peak_blocks(10) > 3.5


def test_shared_prompt_stored_once():
    s = run("shared-prompt-5000x100", "workload.arrival.rate=100000")
    # 100 requests of 5,100 prompt tokens: all but the first hit the 312 shared full blocks
    assert s["num_prefix_cache_hit_tokens"] == 99 * 312 * 16


def test_paper_paged_vs_slab_max():
    paged, slab = run("paper-paged"), run("paper-slab-max")
    assert paged["waste_of_allocated"]["token_state"] >= 0.95
    assert slab["waste_of_allocated"]["token_state"] < 0.35  # paper: 20.4 %
    assert paged["mean_running"] >= 3 * slab["mean_running"]


@pytest.mark.parametrize("arrival", [{"process": "constant", "rate": 8.0}, {"process": "poisson", "rate": 7.7}])
def test_bursts_waited_at_once_equal_step_by_step_with_arrivals_behind_a_blocked_head(arrival, monkeypatch):
    # A single engine waits for a whole burst in one event; requests that arrive meanwhile join the
    # queue behind its blocked head and count as waiting from the next step that starts after them.
    # A request arriving exactly when a step ends makes the burst run one event per step instead
    # (the order of the two events decides what the engine sees): dyadic step times (1/16 s) and
    # arrivals every 1/8 s make such ties constant; Poisson arrivals make none. A 200-block pool
    # (about 10 prompts of 300 tokens) keeps the queue's head blocked.
    import kvsim.engine.clock
    import kvsim.engine.runtime

    seen = {"joined": 0, "ties": 0}
    join, none_at = kvsim.engine.runtime.BurstInFlight.join, kvsim.engine.clock.Arrivals.none_delivered_at

    def counting_join(flight, now, num_requests=1):
        seen["joined"] += num_requests
        return join(flight, now, num_requests)

    def counting_none_at(arrivals, instants_s):
        result = none_at(arrivals, instants_s)
        seen["ties"] += not result
        return result

    monkeypatch.setattr(kvsim.engine.runtime.BurstInFlight, "join", counting_join)
    monkeypatch.setattr(kvsim.engine.clock.Arrivals, "none_delivered_at", counting_none_at)
    spec = make_scenario({"name": "ties", "model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": 3,
                          "engine": {"max_model_len": 1024, "num_gpu_blocks_override": 200},
                          "latency": {"model": "constant", "step_s": 0.0625},
                          "workload": {"num_requests": 80, "arrival": arrival,
                                       "prompt_len": {"dist": "fixed", "value": 300},
                                       "output_len": {"dist": "uniform", "low": 5, "high": 120}}})
    step_by_step, bursts = simulate(spec, bursts=False), simulate(spec, check=True)
    assert step_by_step.requests.equals(bursts.requests) and step_by_step.steps.equals(bursts.steps)
    assert seen["ties" if arrival["process"] == "constant" else "joined"] > 0
