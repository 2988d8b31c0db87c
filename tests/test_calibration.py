"""The calibrated latency model on small synthetic profiles with known answers."""

import logging

import pytest

from kvsim.engine.simulate import simulate
from kvsim.latency.base import PROFILE_COLUMNS
from kvsim.latency.calibrated import CalibratedLatency, Interp1D, NestedInterp
from kvsim.latency.profiles.native import read_native
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import EngineConfig
from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import make_scenario

MODEL = load_model("llama-3.1-8b")
ENGINE = EngineConfig(max_model_len=8192)
BATCHES, CONTEXTS = (1, 4, 16, 64), (256, 1024, 4096)


def decode_time(b, c):  # a memory-bound kernel: time ∝ KV bytes, plus launch cost
    return 5e-6 + 1e-10 * b * c


def gemm_time(t):
    return 2e-5 + 1e-8 * t


def write_synthetic(path, drop=None, gpu="h200", extra_gemm_rows=()):
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
    rows += list(extra_gemm_rows)
    lines = [f"# gpu: {gpu}", ",".join(PROFILE_COLUMNS)]
    lines += [",".join(str(r.get(c, "")) for c in PROFILE_COLUMNS) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def roofline():
    return RooflineLatency(MODEL, load_gpu("h200"), ENGINE, overhead_s=0.0)


@pytest.fixture
def model(tmp_path):
    return CalibratedLatency.from_csv(write_synthetic(tmp_path / "p.csv"), MODEL, ENGINE, roofline())


def decode_plan(batch, context):
    plan = StepPlan()
    plan.add(1, context - 1, batch, logits_row=True)
    return plan


def missing_terms(tokens, sampled):
    """What the synthetic profile lacks (token ops, sampler): the roofline's estimate of those terms."""
    roof = roofline()
    return roof.token_ops_s(tokens) + roof.sampler_s(sampled)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("context", CONTEXTS)
def test_agrees_with_the_profile_at_measured_points(model, batch, context):
    expected = (decode_time(batch, context) * 32 + gemm_time(batch) * 4 * 32 + gemm_time(batch)
                + missing_terms(batch, batch))
    assert model.step_time(decode_plan(batch, context)) == pytest.approx(expected, rel=1e-9)


def test_monotone_in_batch_and_context(model):
    times = [[model.step_time(decode_plan(b, c)) for c in range(256, 4097, 97)] for b in range(1, 65, 3)]
    for row in times:
        assert row == sorted(row)
    for col in zip(*times, strict=True):
        assert list(col) == sorted(col)


def test_prefill_reads_the_chunk_and_its_cached_tokens(model):
    plan = StepPlan()
    plan.add(256, 4096, 1, logits_row=True)
    expected = 1e-12 * 256 * (4096 + 257 / 2) * 32 + gemm_time(256) * 4 * 32 + gemm_time(1) + missing_terms(256, 1)
    assert model.step_time(plan) == pytest.approx(expected, rel=1e-9)


def test_a_profile_without_mixed_batches_adds_prefill_and_decode_kernels(model):
    plan = StepPlan()
    plan.add(256, 4096, 1, logits_row=True)
    plan.add(1, 1023, 16, logits_row=True)
    attention = (1e-12 * 256 * (4096 + 257 / 2) + decode_time(16, 1024)) * 32
    expected = attention + gemm_time(272) * 4 * 32 + gemm_time(17) + missing_terms(272, 17)
    assert model.step_time(plan) == pytest.approx(expected, rel=1e-9)


def test_missing_terms_are_named_once_at_load(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        CalibratedLatency.from_csv(write_synthetic(tmp_path / "p.csv"), MODEL, ENGINE, roofline())
    warnings = [r.getMessage() for r in caplog.records if "has no" in r.getMessage()]
    assert warnings == ["calibrated latency: profile p has no token ops, sampler; using the roofline for them"]


def test_outside_the_grid_falls_back_to_roofline_with_one_warning(model, caplog):
    with caplog.at_level(logging.WARNING):
        model.step_time(decode_plan(200, 1024))
        model.step_time(decode_plan(300, 1024))
    warnings = [r for r in caplog.records if "outside the profile" in r.message]
    assert len(warnings) == 1  # attention only (the gemm grid covers 200 and 300 tokens), once
    plan = decode_plan(200, 1024)
    assert model.attention_s(plan) == roofline().attention_s(plan)


def test_noisy_profiles_are_made_monotone():
    f = Interp1D([1, 2, 3], [1.0, 0.5, 2.0])
    assert f(2) == 1.0 and f(1.5) == 1.0 and f(4) is None


def test_a_point_measured_twice_is_averaged_not_a_crash(tmp_path):
    f = Interp1D([1, 2, 2], [1.0, 2.0, 4.0])  # the largest x twice: once a ZeroDivisionError
    assert f(2) == 3.0 and f(1.5) == 2.0
    twice = [{"kind": "gemm", "op": op, "num_tokens": 4096, "time_s": gemm_time(4096) * 3, "dtype": "bfloat16"}
             for op in ("qkv", "o", "gate_up", "down")]
    model = CalibratedLatency.from_csv(write_synthetic(tmp_path / "p.csv", extra_gemm_rows=twice), MODEL, ENGINE,
                                       roofline())
    assert model.linear_s(4096) == pytest.approx(gemm_time(4096) * 2 * 4 * 32, rel=1e-12)  # mean of t and 3t


def test_nested_interpolation_blends_linearly_and_tolerates_holes():
    one = NestedInterp([((0.0,), 1.0), ((15.0,), 5.0)])
    assert one(3.0) == pytest.approx(1.8)  # 3/15 of the way from 1 to 5
    assert one(16.0) is None
    # axis 1 at 15 has only its 0 point: the lookup at (3, 3) keeps the side that answers
    holes = NestedInterp([((0.0, 0.0), 1.0), ((0.0, 15.0), 5.0), ((15.0, 0.0), 2.0)])
    assert holes(3.0, 3.0) == pytest.approx(1.8)
    assert holes(3.0, 0.0) == pytest.approx(1.2)  # 1 + (2 - 1) · 3/15


def test_a_linear_kernel_is_interpolated_exactly_between_doubling_grid_points():
    """Decode attention is a fixed cost plus KV bytes read: t = a + b · n · c is bilinear in (n, c), so a
    linear blend on a doubling grid is exact at (3, 768), where a blend in log(1 + x) overshoots."""
    points = [((n, c), 8e-6 + 1e-9 * n * c) for n in (2.0, 4.0) for c in (512.0, 1024.0)]
    assert NestedInterp(points)(3.0, 768.0) == pytest.approx(8e-6 + 1e-9 * 3 * 768, rel=1e-12)


def test_wrong_attention_shape_and_bad_files_are_errors(tmp_path):
    with pytest.raises(KvsimError, match="no attention rows"):
        CalibratedLatency.from_csv(write_synthetic(tmp_path / "b.csv"), load_model("llama-2-7b"), ENGINE, roofline())
    bad = tmp_path / "c.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(KvsimError, match="column 'kind' is missing; expected the columns"):
        read_native(bad)


def test_a_profile_missing_a_documented_column_or_kind_names_it(tmp_path):
    """Each documented column and each row kind is checked against kvsim.latency.base's schema."""
    lines = write_synthetic(tmp_path / "p.csv").read_text().splitlines()
    header = lines[1].split(",")
    time_col = header.index("time_s")
    no_time = [lines[0], *(",".join(f for i, f in enumerate(line.split(",")) if i != time_col) for line in lines[1:])]
    (tmp_path / "no_time.csv").write_text("\n".join(no_time) + "\n")
    with pytest.raises(KvsimError, match=r"no_time.csv: column 'time_s' is missing"):
        read_native(tmp_path / "no_time.csv")
    (tmp_path / "kind.csv").write_text("\n".join([*lines[:2], "decodes" + lines[2][len("decode"):]]) + "\n")
    with pytest.raises(KvsimError, match=r"kind.csv: kind='decodes' is not one of decode, prefill"):
        read_native(tmp_path / "kind.csv")


def test_a_profile_with_a_non_integer_shape_is_an_error_not_a_traceback(tmp_path):
    from kvsim.latency.profiles.loader import load_profile

    path = write_synthetic(tmp_path / "p.csv")
    path.write_text("# num_layers: thirty-two\n" + path.read_text())
    with pytest.raises(KvsimError, match="metadata num_layers='thirty-two' is not an integer"):
        load_profile(path, MODEL, load_gpu("h200"), ENGINE)
    path.write_text(path.read_text().replace("thirty-two", "40"))
    with pytest.raises(KvsimError, match="measured with num_layers=40, but the scenario has num_layers=32"):
        load_profile(path, MODEL, load_gpu("h200"), ENGINE)


def test_profiles_written_before_the_new_columns_still_load(tmp_path):
    path = write_synthetic(tmp_path / "old.csv")
    lines = path.read_text().splitlines()
    legacy = [lines[0]] + [",".join(line.split(",")[:16]) for line in lines[1:]]
    path.write_text("\n".join(legacy) + "\n")
    model = CalibratedLatency.from_csv(path, MODEL, ENGINE, roofline())
    assert model.step_time(decode_plan(4, 1024)) == pytest.approx(
        decode_time(4, 1024) * 32 + gemm_time(4) * 4 * 32 + gemm_time(4) + missing_terms(4, 4), rel=1e-9)


def scenario_raw(profile):
    return {"model": "llama-3.1-8b", "gpu": "h200", "engine": {"max_model_len": 8192},
            "latency": {"model": "calibrated", "profile": profile},
            "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 20},
                         "prompt_len": {"dist": "fixed", "value": 300}, "output_len": {"dist": "fixed", "value": 50}}}


def test_scenario_with_calibrated_latency_runs_end_to_end(tmp_path):
    write_synthetic(tmp_path / "prof.csv")
    raw = scenario_raw("prof.csv")
    summary = simulate(make_scenario(raw, base_dir=tmp_path)).summary
    assert summary["latency_model"] == "calibrated(prof: h200)"
    assert summary["num_finished"] == 60
    roof = simulate(make_scenario({**raw, "latency": {"model": "roofline"}}, base_dir=tmp_path)).summary
    assert summary["tpot_s"]["mean"] != roof["tpot_s"]["mean"]


def test_scenario_refuses_a_profile_from_another_gpu(tmp_path):
    write_synthetic(tmp_path / "prof.csv", gpu="NVIDIA A100-SXM4-80GB")
    with pytest.raises(KvsimError, match="measured on gpu='NVIDIA A100-SXM4-80GB', but the scenario's gpu is 'h200'"):
        simulate(make_scenario(scenario_raw("prof.csv"), base_dir=tmp_path))
