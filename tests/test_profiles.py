"""Profile importers (LLMServingSim bundle, Vidur mlp.csv) and the compatibility checks, on tiny files."""

import logging

import pytest

from kvsim.latency.calibrated import CalibratedLatency
from kvsim.latency.profiles import gpu_matches
from kvsim.latency.profiles.loader import load_profile
from kvsim.latency.profiles.native import read_native, write_native
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import EngineConfig
from kvsim.model.errors import KvsimError

LLAMA = load_model("llama-3.1-8b")
RTX = load_gpu("rtx-pro-6000")
TP1 = EngineConfig(max_model_len=8192)
DENSE_US = {"qkv_proj": 30.0, "o_proj": 20.0, "gate_up_proj": 100.0, "down_proj": 50.0, "layernorm": 2.0,
            "rotary_emb": 3.0, "act_fn": 4.0, "embedding": 5.0, "final_layernorm": 6.0}


def write_bundle(root, tp=1, variant="bf16", gpu="NVIDIA RTX PRO 6000 Blackwell Server Edition",
                 heads=32, vocab=128256):
    """A bundle whose per-op times double from 1 to 256 tokens; attention = 10 us + 1 ns per KV token."""
    root.mkdir(parents=True)
    (root / "meta.yaml").write_text(
        f"gpu: {gpu}\nmodel: meta-llama/Llama-3.1-8B\nvariant: {variant}\ntp_degrees: [{tp}]\n"
        f"engine_effective:\n  hf_overrides:\n    num_hidden_layers: 1\n    intermediate_size: {14336 // tp}\n"
        f"    num_attention_heads: {heads // tp}\n    num_key_value_heads: {8 // tp}\n    vocab_size: {vocab // tp}\n")
    folder = root / f"tp{tp}"
    folder.mkdir()
    lines = ["layer,tokens,time_us"] + [f"{op},{t},{us * (2 if t == 256 else 1)}" for op, us in DENSE_US.items()
                                         for t in (1, 256)]
    (folder / "dense.csv").write_text("\n".join(lines) + "\n")
    (folder / "per_sequence.csv").write_text("layer,sequences,time_us\nlm_head,1,700\nlm_head,256,900\n"
                                             "sampler,1,20\nsampler,256,276\n")
    att = ["prefill_chunk,kv_prefill,n_decode,kv_decode,time_us"]
    for pc in (0, 256):
        for kp in ((0,) if pc == 0 else (0, 1024)):
            for nd in (0, 1, 16):
                for kd in ((0,) if nd == 0 else (16, 1024)):
                    if pc or nd:
                        att.append(f"{pc},{kp},{nd},{kd},{10 + 1e-3 * (pc * (kp + pc) + 3 * nd * kd)}")
    (folder / "attention.csv").write_text("\n".join(att) + "\n")
    return root


def calibrated(profile, engine=TP1):
    return CalibratedLatency(profile, LLAMA, engine, RooflineLatency(LLAMA, RTX, engine, overhead_s=0.0))


def test_bundle_rows_map_into_the_schema_and_time_a_step_by_hand(tmp_path):
    profile = load_profile(write_bundle(tmp_path / "bf16"), LLAMA, RTX, TP1)
    assert profile.kinds() == {"gemm", "token_op", "step_op", "sequence_op", "attention"}
    assert profile.meta["kv_cache_dtype"] == "bfloat16" and profile.meta["vocab_size"] == "128256"
    model = calibrated(profile)
    plan = StepPlan()
    plan.add(1, 1023, 16, logits_row=True)  # 16 decodes at context 1024: all measured points
    layer_us = 30 + 20 + 100 + 50 + 2 * 2 + 3 + 4  # four GEMMs, two norms, rotary, activation (1-token times...)
    per_token = layer_us / 255  # ...which double by 256 tokens: + layer_us per 255 tokens
    layer_at_16 = layer_us + per_token * 15
    step_ops = (5 + 6) * (1 + 15 / 255)
    attention = 10 + 1e-3 * 3 * 16 * 1024
    lm_head, sampler = 700 + 200 * 15 / 255, 20 + 256 * 15 / 255
    expected_us = 32 * (layer_at_16 + attention) + step_ops + lm_head + sampler
    assert model.step_time(plan) == pytest.approx(expected_us * 1e-6, rel=1e-9)


def test_bundle_mixed_batches_use_the_mixed_kernel(tmp_path):
    model = calibrated(load_profile(write_bundle(tmp_path / "bf16"), LLAMA, RTX, TP1))
    plan = StepPlan()
    plan.add(256, 1024, 1, logits_row=True)  # a 256-token chunk after 1024 cached tokens...
    plan.add(1, 15, 16, logits_row=True)  # ...with 16 decodes at context 16
    assert model.mixed
    assert model.attention_s(plan) == pytest.approx(32 * (10 + 1e-3 * (256 * 1280 + 3 * 16 * 16)) * 1e-6)


def test_calibrated_tensor_parallel_adds_the_allreduces_no_profile_measures(tmp_path):
    tp2 = EngineConfig(max_model_len=8192, tensor_parallel_size=2)
    profile = load_profile(write_bundle(tmp_path / "bf16", tp=2), LLAMA, RTX, tp2)
    assert profile.meta["num_attention_heads"] == "32"  # the per-rank 16 heads times the TP degree
    model = calibrated(profile, tp2)
    plan = StepPlan()
    plan.add(1, 1023, 16, logits_row=True)
    terms = model.linear_s(16) + model.token_ops_s(16) + model.attention_s(plan) + model.sequence_s(16)
    one = 16 * 4096 * 2 / (0.57 * 64e9) + 2 * 1e-6 + 8.4e-6  # ring all-reduce of 16 tokens over PCIe
    assert model.step_time(plan) == pytest.approx(terms + 2 * 32 * one, rel=1e-12)


@pytest.mark.parametrize(("change", "engine", "gpu", "message"), [
    ({"heads": 64}, TP1, RTX, "num_attention_heads=64"),
    ({"vocab": 151936}, TP1, RTX, "vocab_size=151936"),
    ({"variant": "bf16-kvfp8"}, TP1, RTX, "kv_cache_dtype=fp8, but the scenario's KV cache is bfloat16"),
    ({}, TP1, load_gpu("h200"), "measured on gpu='NVIDIA RTX PRO 6000 Blackwell Server Edition'"),
    ({}, EngineConfig(max_model_len=8192, tensor_parallel_size=2), RTX, "measured at tp1, not tensor_parallel_size=2"),
])
def test_a_profile_for_something_else_is_refused(tmp_path, change, engine, gpu, message):
    with pytest.raises(KvsimError, match=message):
        load_profile(write_bundle(tmp_path / "bf16", **change), LLAMA, gpu, engine)


def test_fp8_profile_fits_an_fp8_cache(tmp_path):
    engine = EngineConfig(max_model_len=8192, kv_cache_dtype="fp8_e4m3")
    assert load_profile(write_bundle(tmp_path / "b", variant="bf16-kvfp8"), LLAMA, RTX, engine).meta[
        "kv_cache_dtype"] == "fp8"


def test_source_is_recorded_from_source_yaml_above_the_bundle(tmp_path):
    bundle = write_bundle(tmp_path / "perf" / "bf16")
    assert load_profile(bundle, LLAMA, RTX, TP1).meta["source_commit"] == "unrecorded"
    (tmp_path / "source.yaml").write_text("repository: casys-kaist/LLMServingSim\ncommit: 5daddb2\nlicence: MIT\n")
    meta = load_profile(bundle / "tp1", LLAMA, RTX, TP1).meta  # the tp folder itself is accepted too
    assert (meta["source_repository"], meta["source_commit"], meta["source_licence"]) == (
        "casys-kaist/LLMServingSim", "5daddb2", "MIT")


def test_an_imported_profile_round_trips_through_the_native_csv(tmp_path):
    profile = load_profile(write_bundle(tmp_path / "bf16"), LLAMA, RTX, TP1)
    again = read_native(write_native(profile, tmp_path / "out" / "llama.csv"))
    assert again.meta.pop("generator") == "kvsim import-profile"  # the tag that lets kvsim replace it later
    assert again.meta == profile.meta
    plan = StepPlan()
    plan.add(100, 0, 1, logits_row=True)
    assert calibrated(again).step_time(plan) == calibrated(profile).step_time(plan)


VIDUR_HEADER = ("n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tokens,"
                "num_tensor_parallel_workers,time_stats.attn_pre_proj.median,time_stats.attn_post_proj.median,"
                "time_stats.mlp_up_proj.median,time_stats.mlp_down_proj.median,time_stats.mlp_act.median,"
                "time_stats.input_layernorm.median,time_stats.post_attention_layernorm.median,"
                "time_stats.attn_rope.median,time_stats.add.median,time_stats.emb.median")


def write_vidur(tmp_path):
    folder = tmp_path / "data" / "profiling" / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf"
    folder.mkdir(parents=True)
    rows = [VIDUR_HEADER]
    for tokens, scale in ((1, 1.0), (512, 2.0), (512, 4.0), (4096, 8.0)):  # 512 measured twice, as Vidur does
        for tp in (1, 2):
            ms = [0.05, 0.04, 0.2, 0.1, 0.01, 0.005, 0.005, 0.004, 0.003, 0.002]
            rows.append(f"32,32,4096,11008,32768,True,{tokens},{tp}," + ",".join(str(m * scale / tp) for m in ms))
    path = folder / "mlp.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_vidur_mlp_csv_imports_its_ops_and_falls_back_for_the_rest(tmp_path, caplog):
    model = load_model("llama-2-7b")
    gpu = load_gpu("a100-80gb")
    engine = EngineConfig(max_model_len=4096)
    profile = load_profile(write_vidur(tmp_path), model, gpu, engine)
    assert (profile.meta["gpu"], profile.meta["model"], profile.meta["source_repository"]) == (
        "a100-80gb", "meta-llama/Llama-2-7b-hf", "microsoft/vidur")  # Vidur's a100 folder: an 80 GB A100
    roof = RooflineLatency(model, gpu, engine, overhead_s=0.0)
    with caplog.at_level(logging.WARNING):
        latency = CalibratedLatency(profile, model, engine, roof)
    assert any("has no attention, LM head, sampler" in r.getMessage() for r in caplog.records)
    # at 512 tokens every op is the mean of its two measurements: 3x its 1-token time
    assert latency.linear_s(512) == pytest.approx(32 * 3 * (0.05 + 0.04 + 0.2 + 0.1) * 1e-3)
    per_layer_ops = 0.01 + 0.005 + 0.005 + 0.004 + 0.003  # act, both norms, rope, add
    assert latency.token_ops_s(512) == pytest.approx((32 * 3 * per_layer_ops + 3 * 0.002) * 1e-3)
    plan = StepPlan()
    plan.add(1, 511, 8, logits_row=True)
    assert latency.attention_s(plan) == roof.attention_s(plan)


def test_a_vidur_profile_is_for_the_chip_vidur_measured(tmp_path):
    """Vidur's `a100` folder is an 80 GB A100 (its docs/profiling.md): an A100 40GB, with 1.555 TB/s where the
    80 GB card has 2.039, is another chip, refused as any profile of another GPU is (it matched the bare name)."""
    with pytest.raises(KvsimError, match="measured on gpu='a100-80gb', but the scenario's gpu is 'a100-40gb'"):
        load_profile(write_vidur(tmp_path), load_model("llama-2-7b"), load_gpu("a100-40gb"),
                     EngineConfig(max_model_len=4096))


def test_vidur_without_the_tp_degree_is_refused(tmp_path):
    engine = EngineConfig(max_model_len=4096, tensor_parallel_size=4)
    with pytest.raises(KvsimError, match="num_tensor_parallel_workers 1, 2, not tensor_parallel_size=4"):
        load_profile(write_vidur(tmp_path), load_model("llama-2-7b"), load_gpu("a100-80gb"), engine)


@pytest.mark.parametrize(("device", "preset", "same"), [
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000", True),
    ("NVIDIA H100 80GB HBM3", "h100-80gb", True),
    ("a100", "a100-80gb", True),
    ("NVIDIA H100 80GB HBM3", "h200", False),
    ("NVIDIA GeForce RTX 4090", "rtx-pro-6000", False),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb", True),
    ("NVIDIA H200", "h200", True),
    ("NVIDIA GeForce RTX 4090", "rtx-4090", True),
    # other SKUs of a preset's chip (datasheets): the A100 80GB PCIe reads 1,935 GB/s against the SXM4's
    # 2,039; the H200 NVL runs at up to 600 W against the SXM's 700; the RTX PRO 6000 Workstation Edition
    # has 1,792 GB/s against the Server Edition's 1,597; the RTX 4090 D has fewer SMs
    ("NVIDIA A100 80GB PCIe", "a100-80gb", False),
    ("NVIDIA H200 NVL", "h200", False),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000", False),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "rtx-pro-6000", False),
    ("NVIDIA GeForce RTX 4090 D", "rtx-4090", False),
    ("NVIDIA GeForce RTX 4090 Laptop GPU", "rtx-4090", False),
])
def test_gpu_names_match_by_words(device, preset, same):
    assert gpu_matches(device, load_gpu(preset)) is same


def test_missing_profile_path_is_an_error(tmp_path):
    with pytest.raises(KvsimError, match="no such file or folder"):
        load_profile(tmp_path / "nope", LLAMA, RTX, TP1)


def test_cli_imports_a_bundle_with_its_source(tmp_path):
    from typer.testing import CliRunner

    from kvsim.cli import app

    bundle = write_bundle(tmp_path / "bf16")
    out = tmp_path / "llama.csv"
    args = ["import-profile", str(bundle), "-o", str(out), "--model", "llama-3.1-8b", "--gpu", "rtx-pro-6000",
            "--source-repository", "casys-kaist/LLMServingSim", "--source-commit", "5daddb2", "--source-licence", "MIT"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    meta = read_native(out).meta
    assert (meta["source_repository"], meta["source_commit"], meta["source_licence"]) == (
        "casys-kaist/LLMServingSim", "5daddb2", "MIT")
    refused = CliRunner().invoke(app, [*args[:3], str(tmp_path / "other.csv"), "--gpu", "h200"])
    assert refused.exit_code == 2 and "measured on gpu=" in refused.output
    assert not (tmp_path / "other.csv").exists()
