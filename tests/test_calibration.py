"""The calibrated latency model on small synthetic profiles with known answers."""

import logging

import pytest

from kvsim.calibration import CalibratedLatency, Interp1D, Interp2D, read_profile
from kvsim.config import EngineConfig, load_gpu, load_model
from kvsim.engine import simulate
from kvsim.errors import KvsimError
from kvsim.latency import PROFILE_COLUMNS, RooflineLatency, StepPlan
from kvsim.scenario import make_scenario

MODEL = load_model("llama-3.1-8b")
ENGINE = EngineConfig(max_model_len=8192)
BATCHES, CONTEXTS = (1, 4, 16, 64), (256, 1024, 4096)


def decode_time(b, c):  # a memory-bound kernel: time ∝ KV bytes, plus launch cost
    return 5e-6 + 1e-10 * b * c


def gemm_time(t):
    return 2e-5 + 1e-8 * t


def write_synthetic(path, drop=None):
    rows = []
    shape = {"block_size": 16, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"}
    for b in BATCHES:
        for c in CONTEXTS:
            if (b, c) != drop:
                rows.append({"kind": "decode", "batch": b, "context_len": c, "time_s": decode_time(b, c), **shape})
    for q in (16, 256, 2048):
        for p in (0, 4096):
            work = q * (p + (q + 1) / 2)
            rows.append({"kind": "prefill", "batch": 1, "query_len": q, "context_len": p + q,
                         "time_s": 1e-12 * work, **shape})
    for op in ("qkv", "o", "gate_up", "down", "lm_head"):
        for t in (1, 64, 512, 4096):
            rows.append({"kind": "gemm", "op": op, "num_tokens": t, "time_s": gemm_time(t), "dtype": "bfloat16"})
    lines = ["# gpu: synthetic", ",".join(PROFILE_COLUMNS)]
    lines += [",".join(str(r.get(c, "")) for c in PROFILE_COLUMNS) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def model(tmp_path):
    roofline = RooflineLatency(MODEL, load_gpu("h200"), ENGINE, overhead_s=0.0)
    return CalibratedLatency.from_csv(write_synthetic(tmp_path / "p.csv"), MODEL, ENGINE, roofline)


def decode_plan(batch, context):
    plan = StepPlan()
    plan.add(1, context - 1, batch, samples=True)
    return plan


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("context", CONTEXTS)
def test_agrees_with_the_profile_at_measured_points(model, batch, context):
    expected = decode_time(batch, context) * 32 + gemm_time(batch) * 4 * 32 + gemm_time(batch)
    assert model.step_time(decode_plan(batch, context)) == pytest.approx(expected, rel=1e-9)


def test_monotone_in_batch_and_context(model):
    times = [[model.step_time(decode_plan(b, c)) for c in range(256, 4097, 97)] for b in range(1, 65, 3)]
    for row in times:
        assert row == sorted(row)
    for col in zip(*times, strict=True):
        assert list(col) == sorted(col)


def test_prefill_interpolates_work(model):
    plan = StepPlan()
    plan.add(256, 4096, 1, samples=True)
    expected = 1e-12 * 256 * (4096 + 257 / 2) * 32 + gemm_time(256) * 4 * 32 + gemm_time(1)
    assert model.step_time(plan) == pytest.approx(expected, rel=1e-9)


def test_outside_the_grid_falls_back_to_roofline_with_one_warning(model, caplog):
    with caplog.at_level(logging.WARNING):
        model.step_time(decode_plan(200, 1024))
        model.step_time(decode_plan(300, 1024))
    warnings = [r for r in caplog.records if "outside the profile" in r.message]
    assert len(warnings) == 1  # decode attention only (the gemm grid covers 200 and 300 tokens), once
    roof = RooflineLatency(MODEL, load_gpu("h200"), ENGINE, overhead_s=0.0)
    assert model.decode_s(200, 200 * 1024) == roof.decode_s(200 * 1024)


def test_noisy_profiles_are_made_monotone():
    f = Interp1D([1, 2, 3], [1.0, 0.5, 2.0])
    assert f(2) == 1.0 and f(1.5) == 1.0 and f(4) is None
    g = Interp2D({(1, 1): 1.0, (1, 2): 0.5, (2, 1): 0.2, (2, 2): 3.0})
    assert g(1, 2) == 1.0 and g(2, 1) == 1.0


def test_incomplete_grid_and_wrong_shape_are_errors(tmp_path):
    roofline = RooflineLatency(MODEL, load_gpu("h200"), ENGINE)
    with pytest.raises(KvsimError, match="not complete"):
        CalibratedLatency.from_csv(write_synthetic(tmp_path / "a.csv", drop=(4, 1024)), MODEL, ENGINE, roofline)
    with pytest.raises(KvsimError, match="no attention rows"):
        CalibratedLatency.from_csv(write_synthetic(tmp_path / "b.csv"), load_model("llama-2-7b"), ENGINE, roofline)
    bad = tmp_path / "c.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(KvsimError, match="expected the columns"):
        read_profile(bad)


def test_scenario_with_calibrated_latency_runs_end_to_end(tmp_path):
    write_synthetic(tmp_path / "prof.csv")
    raw = {"model": "llama-3.1-8b", "gpu": "h200", "engine": {"max_model_len": 8192},
           "latency": {"model": "calibrated", "profile": "prof.csv"},
           "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 20},
                        "prompt_len": {"dist": "fixed", "value": 300}, "output_len": {"dist": "fixed", "value": 50}}}
    summary = simulate(make_scenario(raw, base_dir=tmp_path)).summary
    assert summary["latency_model"] == "calibrated(prof: synthetic)"
    assert summary["num_finished"] == 60
    roof = simulate(make_scenario({**raw, "latency": {"model": "roofline"}}, base_dir=tmp_path)).summary
    assert summary["tpot_s"]["mean"] != roof["tpot_s"]["mean"]
