"""Mixture-of-experts step cost and data-parallel engines stepping together.

Bounds and expected counts are derived here from the published config (Qwen/Qwen3-30B-A3B:
48 MoE layers, 128 experts of 3 · 2048 · 768 parameters, top-8, bf16) and the roofline's stated
efficiencies, not from kvsim's output.
"""

from __future__ import annotations

import math

import pytest

from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import make_engine
from kvsim.model.moe_cost import expected_experts_touched

E, K, LAYERS, EXPERT_PARAMS = 128, 8, 48, 3 * 2048 * 768


def decode_plan(batch: int, context: int = 1000) -> StepPlan:
    plan = StepPlan()
    for _ in range(batch):
        plan.add(1, context - 1, 1, True)
    return plan


def test_expected_distinct_experts() -> None:
    assert expected_experts_touched(E, K, 1) == pytest.approx(8)
    assert expected_experts_touched(E, K, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))  # 15.5
    assert expected_experts_touched(E, K, 10_000) == pytest.approx(128)


def test_moe_step_time_grows_with_batch_and_stays_under_dense_reads_of_all_experts() -> None:
    model, gpu = load_model("qwen3-30b-a3b"), load_gpu("h100-80gb")
    roof = RooflineLatency(model, gpu, make_engine())
    eff = roof.eff  # the H100's fitted fractions
    times = [roof.step_time(decode_plan(b)) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))
    for tokens in (1, 4, 32, 256, 2048):
        # A dense reading of the same layers: every expert's weights read each step.
        all_experts_bytes = E * EXPERT_PARAMS * 2
        flops = 2 * tokens * K * EXPERT_PARAMS
        # each expert's grouped-GEMM slice has tokens · k / E_touched rows: that size regime's FLOP/s fraction
        rows = max(1, round(tokens * K / expected_experts_touched(E, K, tokens)))
        # (at the fused-MoE kernel's fitted speed ηg against the dense-GEMM roofline)
        dense_equivalent = LAYERS * math.hypot(flops / (eff.gemm_flops_at(rows) * gpu.fp16_flops),
                                               all_experts_bytes / (eff.gemm_bandwidth * gpu.hbm_bandwidth_bytes_per_s)
                                               ) / eff.grouped_gemm_fraction
        router = LAYERS * (math.hypot(2 * tokens * 2048 * E / (eff.gemm_flops_at(tokens) * gpu.fp16_flops),
                                      2048 * E * 2 / (eff.gemm_bandwidth * gpu.hbm_bandwidth_bytes_per_s))
                           + eff.gemm_floor_s)
        assert roof.moe_s(tokens) <= (dense_equivalent + router) * (1 + 1e-12)  # equal once all experts are touched
    # One token reads its 8 experts only: 48 layers · 8 · 9.4 MB at the H100's fitted ηb of 3.35 TB/s
    # plus the router, one small GEMM per layer that costs about its fixed GEMM time
    one = LAYERS * 8 * EXPERT_PARAMS * 2 / (eff.gemm_bandwidth * gpu.hbm_bandwidth_bytes_per_s) / eff.grouped_gemm_fraction
    router = LAYERS * (2048 * E * 2 / (eff.gemm_bandwidth * gpu.hbm_bandwidth_bytes_per_s) + eff.gemm_floor_s)
    assert roof.moe_s(1) == pytest.approx(one + router, rel=0.02)


def test_data_parallel_group_tokens_drive_the_expert_reads() -> None:
    model, gpu = load_model("qwen3-30b-a3b"), load_gpu("h100-80gb")
    roof = RooflineLatency(model, gpu, make_engine(data_parallel_size=2, enable_expert_parallel=True))
    alone, together = roof.moe_s(4), roof.moe_s(4, group_tokens=64)
    assert together > alone  # the other engine's tokens touch more of this GPU's experts
    # Each GPU holds half the experts: 4 tokens touch E(1 − (1 − k/E)^4) experts, half of them here.
    eff = roof.eff
    reads = LAYERS * expected_experts_touched(E, K, 4) / 2 * EXPERT_PARAMS * 2
    assert alone > reads / (eff.gemm_bandwidth * gpu.hbm_bandwidth_bytes_per_s)


def test_dp_engines_step_together_with_their_own_pools() -> None:
    from kvsim.engine.simulate import simulate
    from kvsim.workload.scenario import load_scenario

    # check=True walks each pool's books every step: 4,096 blocks a rank (of 27,188) hold these 40 requests
    # with no preemption and the same 1,036 steps, in a quarter of the time
    result = simulate(load_scenario(None, ["model=qwen3-30b-a3b", "gpu=h100-80gb", "engine.max_model_len=4096",
                                           "workload.num_requests=40", "workload.arrival.rate=20",
                                           "engine.data_parallel_size=2", "engine.enable_expert_parallel=true",
                                           "engine.num_gpu_blocks_override=4096"]),
                      check=True)
    assert result.summary["num_preemptions"] == 0
    requests, steps = result.requests, result.steps
    assert result.summary["num_finished"] == 40
    assert set(requests["dp_rank"]) == {0, 1}
    # Lockstep: whenever both engines step, they start at the same instant and last equally long.
    both = steps.groupby("time_s").filter(lambda g: len(g) == 2)
    assert len(both) > 0
    assert (both.groupby("time_s")["duration_s"].nunique() == 1).all()


def test_dp_summary_is_the_deployments_and_steps_mode_is_honoured() -> None:
    """Running counts add up over the DP engines (vllm:num_requests_running summed over engine
    labels); `steps: none` keeps no rows and changes no summary number."""
    from kvsim.engine.simulate import simulate
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario(None, ["model=qwen3-30b-a3b", "gpu=h100-80gb", "engine.max_model_len=4096",
                                    "workload.num_requests=60", "workload.arrival.rate=40",
                                    "engine.data_parallel_size=2", "engine.enable_expert_parallel=true"])
    result = simulate(scenario)
    steps, summary = result.steps, result.summary
    per_step = steps.groupby("time_s").agg(running=("vllm:num_requests_running", "sum"),
                                           dt=("duration_s", "first"))
    assert summary["max_running"] == per_step["running"].max() > steps["vllm:num_requests_running"].max()
    assert summary["mean_running"] == pytest.approx((per_step["running"] * per_step["dt"]).sum() / per_step["dt"].sum())
    assert summary["num_steps"] == len(per_step)
    none = simulate(scenario, steps="none")
    assert len(none.steps) == 0 and none.summary == summary
