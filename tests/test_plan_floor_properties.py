"""Properties of what `kvsim plan` decides before and after it simulates, over many small configurations drawn
by hypothesis (v1/v0/static, chunked prefill or whole prompts, prefix caching on and off, async scheduling,
tensor parallel, colocated fleets and xPyD splits, CPU offload tiers, priority classes, sliding-window and MoE
models, the constant and roofline latency models with and without a fixed CPU overhead, shared prefixes,
conversations, parallel samples):

* the latency floor (`kvsim.planning.slo_floor`) is under every simulated servable request's TTFT, TPOT and E2E:
  a floor above one would make `plan` call a reachable SLO unreachable by any fleet and simulate nothing;
* every point `point_metrics` makes, as points.jsonl stores it (JSON), passes the strict check a resumed plan reads
  it with (`point_problem`): a false refusal simulates that point again on every resume.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvsim.fleet.run as fleet_run
from kvsim.planning.point import point_metrics, point_problem, stalled_metrics
from kvsim.planning.slo_floor import slo_floor
from kvsim.workload.scenario import make_scenario

FULL_ATTENTION = ("llama-3.1-8b", "qwen3-30b-a3b")  # every scheduler and allocator serves these
HYBRID = ("gemma-3-27b", "gpt-oss-20b", "mistral-7b")  # sliding-window groups: scheduler v1 only, no split


@st.composite
def small_plan_points(draw: st.DrawFn) -> dict:
    """A small fleet scenario as `Candidate.scenario` makes one (replicas given), valid by construction."""
    model = draw(st.sampled_from(FULL_ATTENTION + HYBRID))
    scheduler = draw(st.sampled_from(("v1", "v0", "static"))) if model in FULL_ATTENTION else "v1"
    engine: dict = {"max_model_len": draw(st.sampled_from((512, 1024))), "scheduler": scheduler,
                    "enable_prefix_caching": draw(st.booleans()), "max_num_seqs": draw(st.sampled_from((4, 32)))}
    split = scheduler == "v1" and model in FULL_ATTENTION and draw(st.booleans())
    if scheduler == "v1":
        if draw(st.booleans()):  # chunked prefill with chunks shorter than many prompts
            engine["max_num_batched_tokens"] = draw(st.sampled_from((64, 256)))
        if not split:
            engine["async_scheduling"] = draw(st.booleans())
            engine["scheduling_policy"] = draw(st.sampled_from(("fcfs", "priority")))
            if engine["enable_prefix_caching"] and model == "llama-3.1-8b" and draw(st.booleans()):
                engine["kv_offload"] = {"num_cpu_blocks": 200}
    if draw(st.booleans()):
        engine["tensor_parallel_size"] = 2
    latency = draw(st.sampled_from(({"model": "constant", "step_s": 0.01}, {"model": "roofline"},
                                    {"model": "roofline", "overhead_s": 0.002})))
    workload: dict = {"num_requests": draw(st.sampled_from((1, 2, 30))),
                      "arrival": {"process": draw(st.sampled_from(("poisson", "constant"))),
                                  "rate": draw(st.sampled_from((5.0, 500.0)))},
                      "prompt_len": draw(st.sampled_from(({"dist": "fixed", "value": 1}, {"dist": "fixed", "value": 300},
                                                          {"dist": "uniform", "low": 1, "high": 800}))),
                      "output_len": draw(st.sampled_from(({"dist": "fixed", "value": 1}, {"dist": "fixed", "value": 9},
                                                          {"dist": "uniform", "low": 1, "high": 60})))}
    if draw(st.booleans()):
        workload["shared_prefix"] = {"tokens": 64, "fraction": 0.5}
    if draw(st.booleans()):
        workload["multi_turn"] = {"turns": 2, "think_time_s": 0.1}
    if scheduler == "v1" and draw(st.booleans()):
        workload["priority"] = {"classes": [{"name": "a", "priority": 0, "weight": 1},
                                            {"name": "b", "priority": 1, "weight": 1}]}
    if not split and draw(st.booleans()):
        workload["n"] = 2
    raw = {"name": "p", "model": model, "gpu": "h100-80gb", "engine": engine, "latency": latency,
           "workload": workload, "seed": draw(st.integers(0, 3)), "replicas": draw(st.sampled_from((1, 2)))}
    if split:
        raw["kv_transfer_config"] = {"kv_connector": "NixlConnector", "kv_link": "rdma"}
        raw["replicas"] = [{"count": 1, "name": "prefill", "kv_role": "kv_producer"},
                           {"count": draw(st.sampled_from((1, 2))), "name": "decode", "kv_role": "kv_consumer"}]
    return raw


@pytest.mark.slow  # 20 drawn fleets, each simulated once (30 requests at most): about 1-2 s on one core
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=small_plan_points())
def test_the_floor_is_under_every_request_and_every_point_passes_the_resume_check(raw):
    """Each drawn fleet once: the floor under each servable request (the run's own table), and its point as
    points.jsonl holds it passes `point_problem` (so does the stalled point `stalled_metrics` would make of it)."""
    scenario = make_scenario(raw)
    runs = []
    simulate = fleet_run.simulate_scenario

    def kept(*args, **kwargs):  # the run point_metrics makes, kept for its request table
        runs.append(simulate(*args, **kwargs))
        return runs[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fleet_run, "simulate_scenario", kept)
        metrics = point_metrics(scenario)
    assert point_problem(json.loads(json.dumps(metrics))) is None, metrics
    assert point_problem(json.loads(json.dumps(stalled_metrics(scenario, "held KV")))) is None
    floor = slo_floor(scenario)
    if floor is None or not runs:  # no floor claimed, or the run stalled
        return
    requests = runs[0].requests
    servable = np.asarray(requests["status"]) != "rejected"
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        values = np.asarray(requests[metric], float)[servable]
        values = values[~np.isnan(values)]  # a one-token reply has no TPOT
        assert not len(values) or values.min() >= getattr(floor, metric) * (1 - 1e-9), (metric, values.min(), floor)
