"""Random small whole scenarios, features combined, through the public entry points.

`test_engine_properties.py` drives the core policies at the engine level; this draws scenario files that
combine what a user can combine (allocators, schedulers v1/v0/static, token budgets, hash-chain and radix
prefix caching, preemption by recompute or swap, priority classes, speculative decoding, KV offload tiers,
data parallel, fleets behind routers, autoscaling, disaggregated prefill/decode, a closed-loop client,
conversations, shared prefixes, n > 1 and beams, hybrid sliding-window and MoE models, fp8 KV, tensor
parallel, traces) and checks each run whole:

* it runs, or is refused before it starts by one `KvsimError` line (never a traceback);
* `check=True`: every allocator's invariants after every step;
* every request ends finished or rejected, and the counts add up to the summary's;
* latencies are ordered (arrival <= first scheduled <= first token <= finish), KV usage lies in [0, 1],
  the summary holds no NaN or infinity;
* decode bursts off gives the same requests, steps, tables and summary, bit for bit (the step-by-step run
  is a second run of the same scenario and seed: a nondeterministic run would differ too).

The combinations this found broken (each with a regression test beside its fix): speculative drafts
verified after a prefill chunk (a finished request with no first token), a radix tree storing a block twice
(n > 1 recomputed after a preemption) or leaving free blocks in a locked node (EAGLE's trimmed hits), a
RuntimeError where KV offload under the priority policy deadlocks as vLLM's scheduler does.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from hypothesis import event, given, settings
from hypothesis import strategies as st

import kvsim
from kvsim.engine.simulate import simulate
from kvsim.fleet.autoscaled import simulate_autoscaled
from kvsim.fleet.disagg import simulate_disagg
from kvsim.fleet.driver import simulate_fleet
from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import Scenario, make_scenario

HYBRID = ("gpt-oss-20b",)  # sliding-window layers: the grouped pool (paged, v1, no forks, no radix)
MODELS = ("llama-3.1-8b", "llama-3.1-8b", "qwen3-30b-a3b", *HYBRID)  # dense, MoE, hybrid + MoE


@st.composite
def lengths(draw, high: int) -> dict:
    kind = draw(st.sampled_from(["fixed", "uniform", "lognormal"]))
    if kind == "fixed":
        return {"dist": "fixed", "value": draw(st.integers(1, high))}
    if kind == "uniform":
        low = draw(st.integers(1, high))
        return {"dist": "uniform", "low": low, "high": draw(st.integers(low, high))}
    mean = draw(st.integers(1, max(1, high // 2)))
    return {"dist": "lognormal", "mean": mean, "p99": mean * draw(st.sampled_from([1.5, 4.0]))}


@st.composite
def engines(draw, model: str) -> dict:
    """Engine settings that vLLM starts with (the pool holds one max_model_len request, budgets >= max_num_seqs);
    the combinations kvsim refuses as not modelled are left out, so that most draws run."""
    hybrid = model in HYBRID
    block_size = draw(st.sampled_from([16, 32] if hybrid else [1, 8, 16, 32]))
    max_model_len = draw(st.sampled_from([64, 128, 256]))
    per_request = -(-max_model_len // block_size)
    engine = {"block_size": block_size, "max_model_len": max_model_len,
              "num_gpu_blocks_override": draw(st.integers(per_request + 1, 4 * per_request + 4)) * (4 if hybrid else 1),
              "max_num_seqs": draw(st.sampled_from([1, 2, 4, 16]))}
    scheduler = "v1" if hybrid else draw(st.sampled_from(["v1", "v1", "v1", "v0", "static"]))
    allocator = "paged" if hybrid else draw(st.sampled_from(["paged", "paged", "paged", "slab-max", "slab-pow2",
                                                              "slab-oracle"]))
    engine.update(scheduler=scheduler, allocator=allocator)
    budget = draw(st.sampled_from([16, 32, 64, 512]))  # small budgets end prefill chunks anywhere
    engine["max_num_batched_tokens"] = max(budget, engine["max_num_seqs"], 0 if scheduler == "v1" else max_model_len)
    engine["enable_prefix_caching"] = draw(st.booleans())
    paged_v1 = allocator == "paged" and scheduler == "v1" and not hybrid
    if allocator == "paged" and not hybrid and draw(st.booleans()):
        engine["prefix_cache"] = "radix"
    if scheduler == "v0" and draw(st.booleans()):
        engine.update(preemption_mode=draw(st.sampled_from(["recompute", "swap"])), swap_space=1)
    if scheduler == "v1":
        engine["scheduling_policy"] = draw(st.sampled_from(["fcfs", "priority"]))
        engine["async_scheduling"] = draw(st.booleans())
    feature = draw(st.sampled_from(["none", "speculation", "offload"] if paged_v1 else ["none"]))
    if feature == "speculation":
        k = draw(st.integers(1, 4))
        engine["speculative_config"] = {"method": draw(st.sampled_from(["ngram", "eagle", "draft_model"])),
                                        "num_speculative_tokens": k,
                                        "acceptance_rates": draw(st.sampled_from([0.0, 0.6, 1.0]))}
        if engine["speculative_config"]["method"] == "draft_model":
            # a draft of the target's vocabulary (vLLM refuses another): Llama 3.1's 128,256, Qwen3's 151,936
            engine["speculative_config"]["model"] = "qwen3-8b" if model.startswith("qwen3") else "llama-3.1-8b"
        if engine["speculative_config"]["method"] == "ngram":  # vLLM refuses async n-gram drafting
            engine.pop("async_scheduling", None)
    elif feature == "offload":
        engine.update(prefix_cache="hash_chain", enable_prefix_caching=True,
                      kv_offload={"num_cpu_blocks": draw(st.integers(1, 40))})
    engine["data_parallel_size"] = draw(st.sampled_from([1, 1, 1, 2]))
    engine["tensor_parallel_size"] = draw(st.sampled_from([1, 1, 2]))
    engine["kv_cache_dtype"] = draw(st.sampled_from(["auto", "auto", "fp8"]))
    return engine


@st.composite
def scenarios(draw) -> dict:
    model = draw(st.sampled_from(MODELS))
    engine = draw(engines(model))
    max_model_len = engine["max_model_len"]
    workload = {"num_requests": draw(st.integers(1, 12)),
                "arrival": {"process": draw(st.sampled_from(["poisson", "constant"])),
                            "rate": draw(st.sampled_from([2.0, 50.0, 1e4]))},
                "prompt_len": draw(lengths(max_model_len + 16)),  # some prompts too long: rejected
                "output_len": draw(lengths(max_model_len // 2))}
    if draw(st.booleans()):
        workload["shared_prefix"] = {"tokens": draw(st.integers(1, max_model_len // 2)),
                                     "num_prefixes": draw(st.integers(1, 2))}
    if draw(st.booleans()):
        workload["multi_turn"] = {"turns": draw(st.integers(1, 3)), "think_time_s": 0.05}
    if engine["scheduler"] != "v0" and draw(st.booleans()):  # v0 refuses a nonzero priority
        workload["priority"] = {"classes": [{"name": "hi", "priority": 0, "weight": 1},
                                            {"name": "lo", "priority": 1, "weight": 2}]}
    if "speculative_config" not in engine and model not in HYBRID:
        samples = draw(st.sampled_from(["one", "one", "n", "beam"]))
        if samples == "n":
            workload["n"] = draw(st.integers(2, 3))
        elif samples == "beam":
            workload["beam_width"] = draw(st.integers(2, 3))
    raw = {"name": "fuzz", "model": model, "gpu": "h100-80gb", "seed": draw(st.integers(0, 3)),
           "engine": engine, "workload": workload,
           "latency": draw(st.sampled_from([{"model": "roofline"}, {"model": "constant", "step_s": 0.01}])),
           "steps": draw(st.sampled_from(["all", "sampled", "none"]))}
    topology = draw(st.sampled_from(["one", "one", "fleet", "disagg", "autoscaled"]))
    single_sequence = workload.get("n", 1) == 1 and "beam_width" not in workload
    if topology == "disagg" and engine["scheduler"] == "v1" and engine["allocator"] == "paged" and single_sequence:
        engine["async_scheduling"] = False
        raw["kv_transfer_config"] = {"kv_link": "rdma"}
        raw["replicas"] = [{"count": draw(st.integers(1, 2)), "kv_role": "kv_producer"},
                           {"count": draw(st.integers(1, 2)), "kv_role": "kv_consumer",
                            "engine": {"max_num_seqs": draw(st.sampled_from([1, 4]))}}]
        if model in HYBRID:
            engine["disable_hybrid_kv_cache_manager"] = True
        return raw
    if draw(st.booleans()):
        workload["max_concurrency"] = draw(st.integers(1, 4))
    if topology == "fleet":
        raw["replicas"] = [{"count": draw(st.integers(1, 2))}, {"count": 1, "engine": {"max_num_seqs": 2}}]
        raw["router"] = {"policy": draw(st.sampled_from(["round_robin", "least_outstanding", "least_kv", "affinity"]))}
    elif topology == "autoscaled":
        raw["replicas"] = 1
        raw["router"] = {"policy": draw(st.sampled_from(["least_outstanding", "least_kv"]))}
        raw["autoscaler"] = {"metric": draw(st.sampled_from(["num_requests_waiting", "kv_cache_usage_perc"])),
                             "target": 0.5, "max_replicas": 3, "sync_period_s": 0.05, "startup_s": 0.1,
                             "scale_down_window_s": 0.2}
    return raw


def run(scenario: Scenario, bursts: bool) -> kvsim.RunResult:
    """`kvsim.fleet.run.simulate_scenario`'s dispatch, with `bursts` (the step-by-step reference when False)."""
    if scenario.kv_transfer_config is not None:
        return simulate_disagg(scenario, check=True, bursts=bursts)
    if scenario.autoscaler is not None:
        return simulate_autoscaled(scenario, check=True, bursts=bursts)
    if scenario.is_fleet:
        return simulate_fleet(scenario, check=True, bursts=bursts)
    return simulate(scenario, check=True, bursts=bursts)


def assert_finite(node, path="summary"):
    if isinstance(node, float):
        assert math.isfinite(node), f"{path}={node}"
    elif isinstance(node, dict):
        for key, value in node.items():
            assert_finite(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            assert_finite(value, f"{path}[{i}]")


def check_run(result: kvsim.RunResult) -> None:
    summary, requests = result.summary, result.requests
    assert_finite(summary)
    status = requests["status"]
    assert set(status) <= {"finished", "rejected"}
    assert (status == "finished").sum() == summary["num_finished"]
    assert (status == "rejected").sum() == summary["num_rejected"]
    assert summary["num_finished"] + summary["num_rejected"] == summary["num_requests"] == len(requests)
    assert requests["request_id"].is_unique
    done = requests[status == "finished"]
    times = [done[c].to_numpy(dtype=float) for c in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s")]
    for earlier, later in zip(times, times[1:], strict=False):
        assert not np.isnan(later).any() and (earlier <= later).all()
    assert (done["output_tokens"] >= 1).all() and (done["prefix_hit_tokens"] <= done["prompt_tokens"]).all()
    if result.scenario.steps != "none" and len(result.steps):
        usage = result.steps["vllm:kv_cache_usage_perc"].to_numpy(dtype=float)
        assert ((usage >= 0) & (usage <= 1)).all()


def assert_same(a: kvsim.RunResult, b: kvsim.RunResult) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    if a.scenario.steps != "none":
        pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    assert a.tables.keys() == b.tables.keys()
    for name in a.tables:
        pd.testing.assert_frame_equal(a.tables[name], b.tables[name], check_exact=True)
    assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)


@settings(max_examples=50, deadline=None)
@given(raw=scenarios())
def test_random_scenarios_run_whole_or_are_refused_in_one_line(raw):
    try:
        scenario = make_scenario(raw)
        result = run(scenario, bursts=True)
    except KvsimError as error:  # refused at validation or when the engines are built: one line
        assert "\n" not in str(error) and "=" in str(error), str(error)
        event(f"refused: {str(error)[:60]}")
        return
    event("ran")
    check_run(result)
    assert_same(result, run(scenario, bursts=False))
