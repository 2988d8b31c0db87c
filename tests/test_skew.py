"""The measured skew correction for decodes of unequal lengths (`kvsim.latency.skew`), by hand on tiny tables."""

import pytest
from test_burst_exact import assert_same
from test_profiles import LLAMA, RTX, TP1, calibrated, write_bundle

import kvsim.engine.runtime
from kvsim.engine.simulate import simulate
from kvsim.latency.calibrated import CalibratedLatency
from kvsim.latency.profiles.loader import load_profile
from kvsim.latency.profiles.native import read_native, write_native
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.skew import DEFAULT_KEY, EDGES_KEY, SkewCorrection, format_edges
from kvsim.latency.step_plan import StepPlan
from kvsim.model.errors import KvsimError
from kvsim.model.spec import ModelSpec
from kvsim.workload.scenario import make_scenario

EDGES = {"batch": [2, 4, 8], "skew_share": [0.05, 0.4, 1.01], "decode_context_len": [1024, 4096],
         "context_len": [0, 512]}


def correction(rows, default=0.05):
    keyed = [{"query_len": str(pc), "batch": str(n), "skew_share": str(s), "decode_context_len": str(kv),
              "context_len": str(kp), "alpha": str(a)} for pc, n, s, kv, kp, a in rows]
    return SkewCorrection(keyed, {EDGES_KEY: format_edges(EDGES), DEFAULT_KEY: str(default)}, "test")


def test_a_step_takes_its_buckets_alpha_between_the_mean_and_longest_lookups():
    skew = correction([(0, 4, 0.4, 4096, 0, 0.1)])
    # decodes at 1000, 1000, 4000: n = 3 (bucket <= 4), mean 2000, share (2000 - 1000) / 3000 = 1/3 (<= 0.4),
    # longest 4000 (<= 4096), no prefill: alpha 0.1, so t = 10 + 0.1 · (40 - 10)
    assert skew.corrected(10.0, 40.0, 0, 3, 2000.0, 1000, 4000, 0) == pytest.approx(13.0)
    # five decodes fall in the batch bucket <= 8, which was not measured: the default 0.05
    assert skew.corrected(10.0, 40.0, 0, 5, 2000.0, 1000, 4000, 0) == pytest.approx(11.5)
    # a longest context beyond the last edge (4096) has no bucket: the default
    assert skew.alpha(0, 3, 1 / 3, 5000, 0) == 0.05


def test_no_correction_without_unequal_decodes_or_a_longer_lookup():
    skew = correction([(0, 4, 0.4, 4096, 0, 0.1)])
    assert skew.corrected(10.0, 40.0, 0, 1, 2000.0, 2000, 2000, 0) == 10.0  # one decode
    assert skew.corrected(10.0, 10.0, 0, 3, 2000.0, 2000, 2000, 0) == 10.0  # all of one length
    assert skew.corrected(10.0, None, 0, 3, 2000.0, 1000, 4000, 0) == 10.0  # longest beyond the grid
    assert skew.corrected(10.0, 9.0, 0, 3, 2000.0, 1000, 4000, 0) == 10.0  # interpolation put t_max lower


def test_a_chunk_takes_its_own_bucket_or_the_default_as_llmservingsim_keys_it():
    """LLMServingSim's `_skew_alpha` keys a step by its raw chunk (`pc={int(pc)}|n<=..|sr<=..|kvB<=..|kp..`),
    so only a chunk the sweep profiled finds a bucket; any other chunk reads the pooled α_default."""
    skew = correction([(256, 4, 0.4, 4096, 512, 0.2), (1024, 4, 0.4, 4096, 512, 0.3), (0, 4, 0.4, 4096, 0, 0.1)])
    assert skew.alpha(256, 3, 1 / 3, 4000, 100) == 0.2  # a profiled chunk: its bucket
    assert skew.alpha(1024, 3, 1 / 3, 4000, 100) == 0.3
    assert skew.alpha(0, 3, 1 / 3, 4000, 0) == 0.1  # pure decode: the pc=0 bucket
    for chunk in (1, 255, 257, 300, 700):  # between or below the profiled chunks: no bucket
        assert skew.alpha(chunk, 3, 1 / 3, 4000, 100) == 0.05
    # the peer's formula on a 300-token chunk beside decodes at 1000, 1000, 4000 (t_mean 10, t_max 40):
    # alpha_default 0.05, so t = 10 + 0.05 · (40 − 10) = 11.5, where the nearest profiled chunk (256) gave 16
    assert skew.corrected(10.0, 40.0, 300, 3, 2000.0, 1000, 4000, 100) == pytest.approx(11.5)


SKEW_META = """skew_fit:
  enabled: {enabled}
  bucket_axes:
    n_bins: [0, 2, 4, 8, 1000000]
    n_labels: [n<=2, n<=4, n<=8, n>8]
    skew_rate_bins: [-0.01, 0.05, 0.4, 1.01]
    skew_rate_labels: [sr<=5%, sr<=40%, sr>40%]
    kv_big_bins: [0, 1024, 1000000000]
    kv_big_labels: [kvB<=1k, kvB>1k]
    kp_bins: [-1, 0, 1000000000]
    kp_labels: [kp=0, kp>0]
  per_tp:
    1:
      alpha_default: 0.05
      bucket_table: tp1/skew_fit.csv
"""


def skew_bundle(root, enabled="true", label="n<=4"):
    write_bundle(root)
    with (root / "meta.yaml").open("a") as f:
        f.write(SKEW_META.format(enabled=enabled))
    (root / "tp1" / "skew_fit.csv").write_text(
        "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples\n"
        f"0,{label},sr<=40%,kvB<=1k,kp=0,0.5,4\n256,n<=4,sr<=40%,kvB<=1k,kp=0,0.25,4\n")
    return root


def skewed_decodes(plan):
    plan.add(1, 15, 3, logits_row=True)  # three decodes at context 16 and one at 1024
    plan.add(1, 1023, 1, logits_row=True)
    return plan


def test_an_imported_bundle_corrects_decodes_of_unequal_lengths_by_hand(tmp_path):
    """write_bundle's attention: 10 us + 1 ns · (chunk · (cached + chunk) + 3 · decodes · their context), bilinear
    in the decodes and their context, so the grid lookups are exact."""
    profile = load_profile(skew_bundle(tmp_path / "bf16"), LLAMA, RTX, TP1)
    assert "attention_skew" in profile.kinds() and profile.meta[DEFAULT_KEY] == "0.05"
    model = calibrated(profile)
    plan = skewed_decodes(StepPlan())
    assert (plan.min_decode_context_tokens, plan.max_decode_context_tokens) == (16, 1024)
    # mean context (3 · 16 + 1024) / 4 = 268; share (268 − 16) / (1024 − 16) = 0.25: bucket pc=0, n<=4, sr<=40 %,
    # kvB<=1k, kp=0, alpha 0.5
    t_mean, t_max = 10 + 3e-3 * 4 * 268, 10 + 3e-3 * 4 * 1024
    assert model.attention_s(plan) == pytest.approx(32 * (t_mean + 0.5 * (t_max - t_mean)) * 1e-6, rel=1e-12)
    # the same decodes beside a 256-token prompt chunk: the pc=256 bucket, alpha 0.25
    mixed = StepPlan()
    mixed.add(256, 0, 1, logits_row=True)
    skewed_decodes(mixed)
    t_mean, t_max = (10 + 1e-3 * (256 * 256 + 3 * 4 * kd) for kd in (268, 1024))
    assert model.attention_s(mixed) == pytest.approx(32 * (t_mean + 0.25 * (t_max - t_mean)) * 1e-6, rel=1e-12)
    # beside a 128-token chunk, which the skew sweep did not profile: no bucket (LLMServingSim's raw-pc key), so
    # alpha_default 0.05; the grid blends pc 0 and 256 halfway: 10 + 1 ns · (256 · 256 / 2 + 3 · 4 · context)
    off_grid = StepPlan()
    off_grid.add(128, 0, 1, logits_row=True)
    skewed_decodes(off_grid)
    t_mean, t_max = (10 + 1e-3 * (256 * 256 / 2 + 3 * 4 * kd) for kd in (268, 1024))
    assert model.attention_s(off_grid) == pytest.approx(32 * (t_mean + 0.05 * (t_max - t_mean)) * 1e-6, rel=1e-12)
    # written out and read back as kvsim's own CSV, the correction is the same
    again = calibrated(read_native(write_native(profile, tmp_path / "p.csv")))
    assert again.attention_s(plan) == model.attention_s(plan)


def test_a_disabled_skew_fit_is_not_imported_and_a_bad_label_is_named(tmp_path):
    assert "attention_skew" not in load_profile(skew_bundle(tmp_path / "a", enabled="false"), LLAMA, RTX,
                                                TP1).kinds()
    with pytest.raises(KvsimError, match="n_label='n<=5' is not one of meta.yaml's n_labels"):
        load_profile(skew_bundle(tmp_path / "b", label="n<=5"), LLAMA, RTX, TP1)


def test_the_plan_keeps_the_decode_contexts_range_over_both_ways_of_adding_them():
    plan = StepPlan()
    plan.add(100, 0, 1, logits_row=True)  # a prefill chunk is not a decode
    plan.add_decodes(3, 3 * 500, 900, 200)
    plan.add(1, 99, 1, logits_row=True)
    assert (plan.min_decode_context_tokens, plan.max_decode_context_tokens) == (100, 900)


def test_sliding_window_layers_look_the_grid_up_at_contexts_capped_by_their_window(tmp_path):
    """Half the layers keep a 512-token window: 16 decodes at context 1024 cost t(16, 1024) in each full layer
    and t(16, 512) in each windowed one (write_bundle's attention is bilinear: exact between its points)."""
    windowed = ModelSpec(**{**LLAMA.model_dump(), "name": "llama-3.1-8b-windowed", "sliding_window": 512,
                            "layer_types": ("sliding_attention", "full_attention") * 16})
    profile = load_profile(write_bundle(tmp_path / "bf16"), LLAMA, RTX, TP1)
    model = CalibratedLatency(profile, windowed, TP1, RooflineLatency(windowed, RTX, TP1, overhead_s=0.0))
    plan = StepPlan()
    plan.add(1, 1023, 16, logits_row=True)
    full_us, window_us = 10 + 3e-3 * 16 * 1024, 10 + 3e-3 * 16 * 512
    assert model.attention_s(plan) == pytest.approx(16 * (full_us + window_us) * 1e-6, rel=1e-12)
    # a 256-token chunk after 1024 cached tokens: the windowed layers see 512 of them
    prefill = StepPlan()
    prefill.add(256, 1024, 1, logits_row=True)
    full_us, window_us = (10 + 1e-3 * 256 * (cached + 256) for cached in (1024, 512))
    assert model.attention_s(prefill) == pytest.approx(16 * (full_us + window_us) * 1e-6, rel=1e-12)


def test_an_alpha_that_is_not_a_number_is_named(tmp_path):
    root = skew_bundle(tmp_path / "bf16")
    table = root / "tp1" / "skew_fit.csv"
    table.write_text(table.read_text().replace(",0.25,", ",fast,"))
    with pytest.raises(KvsimError, match=r"row \d+ \(attention_skew\): alpha='fast' is not a number"):
        load_profile(root, LLAMA, RTX, TP1)


def test_decode_bursts_price_the_skew_as_the_step_by_step_run_does(tmp_path, monkeypatch):
    """A burst prices its steps from the first plan, the shortest and longest contexts growing by one a
    step (`kvsim.latency.base.burst_step_times`): the same requests and steps, bit for bit, as planning
    every step, on a world small enough to stay inside the tiny grid so every correction comes from it."""
    skew_bundle(tmp_path / "bf16")
    spec = make_scenario({
        "model": "llama-3.1-8b", "gpu": "rtx-pro-6000", "seed": 3,
        "engine": {"max_model_len": 1024, "max_num_seqs": 16, "max_num_batched_tokens": 256},
        "latency": {"model": "calibrated", "profile": "bf16"},
        "workload": {"num_requests": 200, "arrival": {"process": "poisson", "rate": 20},
                     "prompt_len": {"dist": "lognormal", "mean": 100, "p99": 400},
                     "output_len": {"dist": "lognormal", "mean": 40, "p99": 300}}}, base_dir=tmp_path)
    corrected, bursts = [0], [0]
    skew_step, run_burst = SkewCorrection.corrected, kvsim.engine.runtime.Engine.run_burst

    def counting(self, t_mean, *args):
        t = skew_step(self, t_mean, *args)
        corrected[0] += t != t_mean
        return t

    def counting_burst(self, *args):
        bursts[0] += 1
        return run_burst(self, *args)

    monkeypatch.setattr(SkewCorrection, "corrected", counting)
    monkeypatch.setattr(kvsim.engine.runtime.Engine, "run_burst", counting_burst)
    step_by_step = simulate(spec, bursts=False)
    assert corrected[0] > 100 and bursts[0] == 0
    assert_same(simulate(spec), step_by_step, ("requests", "steps"))
    assert bursts[0] > 10


def test_the_default_calibration_grid_reaches_every_presets_window():
    """`kvsim calibrate` plans a windowed model's attention as full attention, and the calibrated model prices its
    windowed layers at contexts capped by the window (above): those lookups fall inside the grid only if its
    shortest context is at most the window. The windows are the presets' config values (gpt-oss 128, gemma-3 1024,
    mistral-7b 4096, llama-4-scout's 8192-token chunks)."""
    from kernels.grid import DEFAULT_GRID
    from kvsim.model.config import load_model, model_presets
    from kvsim.model.engine_config import make_engine
    from kvsim.model.kv_layout import layer_kinds

    windows = {name: window for name in model_presets()
               for _, window in layer_kinds(load_model(name), make_engine()) if window is not None}
    assert windows.keys() >= {"gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b", "mistral-7b", "llama-4-scout"}
    assert min(DEFAULT_GRID.contexts) <= min(windows.values()) == 128
