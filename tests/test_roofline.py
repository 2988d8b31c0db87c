"""The roofline's terms and the tensor-parallel all-reduce, with numbers derived by hand or from public data."""

import csv
import gzip
import re

import pytest
from conftest import VALIDATION_SET, make_request, tiny_world

from kvsim.latency.efficiency import DATASHEET
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.collectives import allreduce_s
from kvsim.model.config import GPULink, load_gpu, load_model
from kvsim.model.engine_config import EngineConfig

LLAMA = load_model("llama-3.1-8b")
RTX = load_gpu("rtx-pro-6000")
TP1 = EngineConfig(max_model_len=8192)
PROFILE = VALIDATION_SET / "profiles" / "RTXPRO6000"


def test_ring_allreduce_by_hand():
    pcie = RTX.resolved_link  # 64 GB/s each way, 1 us per ring step; PCIe reaches 57 % in an all-reduce
    assert allreduce_s(4 * 2**20, 2, pcie) == pytest.approx(4 * 2**20 / (0.57 * 64e9) + 2 * 1e-6 + 8.4e-6)
    nvlink = load_gpu("h100-80gb").resolved_link  # 450 GB/s each way; NCCL-fitted: 73 %, 0.789 us/step, 18.26 us
    pooled = nvlink.model_copy(update={"by_num_gpus": None})  # (the form for GPU counts not measured)
    assert allreduce_s(1e6, 4, pooled) == pytest.approx(2 * 3 / 4 * 1e6 / (0.73 * 450e9) + 6 * 0.789e-6 + 18.26e-6)
    # fitted at 4 GPUs alone: 84.3 %, 30.61 us in all; at 3 GPUs (not measured) the pooled form
    assert allreduce_s(1e6, 4, nvlink) == pytest.approx(2 * 3 / 4 * 1e6 / (0.8434 * 450e9) + 30.61e-6)
    assert allreduce_s(1e6, 3, nvlink) == pytest.approx(2 * 2 / 3 * 1e6 / (0.73 * 450e9) + 4 * 0.789e-6 + 18.26e-6)
    assert allreduce_s(1e6, 1, nvlink) == 0.0
    given = GPULink(kind="pcie", bandwidth_bytes_per_s=16e9, latency_s=20e-6, efficiency=1.0)
    assert allreduce_s(1.6e6, 2, given) == pytest.approx(1.6e6 / 16e9 + 2 * 20e-6 + 8.4e-6)


@pytest.mark.parametrize(("num_bytes", "measured_us"), [(1048576, 41.04), (4194304, 124.87), (20971520, 587.09)])
def test_pcie_allreduce_matches_published_nccl_measurements(num_bytes, measured_us):
    """LLMServingSim's NCCL all-reduce on two RTX PRO 6000 over PCIe (profiler/perf/RTXPRO6000/hardware.yaml)."""
    assert allreduce_s(num_bytes, 2, RTX.resolved_link) == pytest.approx(measured_us * 1e-6, rel=0.06)


def test_tensor_parallel_adds_two_allreduces_per_layer():
    tp2 = RooflineLatency(LLAMA, RTX, EngineConfig(max_model_len=8192, tensor_parallel_size=2))
    one = 128 * 4096 * 2 / (0.57 * 64e9) + 2 * 1e-6 + 8.4e-6  # 128 tokens of a 4096-wide bf16 hidden state
    assert tp2.allreduce_s(128) == pytest.approx(2 * 32 * one)
    assert RooflineLatency(LLAMA, RTX, TP1).allreduce_s(128) == 0.0
    plan = StepPlan()
    plan.add(1, 511, 128, logits_row=True)
    assert tp2.fixed_s(plan) == pytest.approx(tp2.allreduce_s(128) + tp2.cpu_s(128))


def test_datasheet_efficiency_is_the_bare_roofline():
    bare = RooflineLatency(LLAMA, RTX, TP1, overhead_s=0.0, efficiency=DATASHEET)
    # decode reads 128 KiB of KV per token (2 · 32 layers · 8 heads · 128 · 2 bytes) at 1.597 TB/s
    assert bare.decode_s(16, 16 * 1000) == pytest.approx(16 * 1000 * 131072 / 1.597e12)
    # one layer: q, o = 4096², k, v = 4096 · 1024 each, MLP 3 · 4096 · 14336 parameters
    params = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    flops, weights = 2 * params * 2048 / 483.6e12, params * 2 / 1.597e12
    assert bare.linear_s(2048) == pytest.approx(32 * (flops**2 + weights**2) ** 0.5)
    assert bare.cpu_s(128) == 0.0


def test_cpu_overhead_is_fixed_plus_per_sequence_unless_given():
    assert RooflineLatency(LLAMA, RTX, TP1).cpu_s(100) == pytest.approx(0.2e-3 + 100 * 5e-6)
    assert RooflineLatency(LLAMA, RTX, TP1, overhead_s=0.002).cpu_s(100) == 0.002


def test_decodes_batched_with_a_prefill_read_kv_slower():
    """Alone, decodes read each KV head once; joining a prefill chunk, the varlen kernel reads it once per
    query head (Llama-3.1-8B: 32 query heads over 8 KV heads, 4 reads), at the fitted fractions."""
    roof = RooflineLatency(LLAMA, RTX, TP1)
    eff = roof.eff
    floor = 32 * (eff.kernel_floor_s + 64 * eff.decode_per_seq_s)
    kv_bytes = 64 * 1024 * 131072
    assert roof.decode_s(64, 64 * 1024) == pytest.approx(floor + kv_bytes / (eff.decode_bandwidth * 1.597e12))
    assert roof.decode_s(64, 64 * 1024, mixed=True) == pytest.approx(
        floor + 4 * kv_bytes / (eff.mixed_decode_bandwidth * 1.597e12))


@pytest.mark.skipif(not PROFILE.is_dir(), reason="needs ../shared/validation")
@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Qwen3-32B"])
def test_mixed_step_attention_matches_the_measured_grid(model):
    """One layer's attention for decodes joining a prefill chunk, against the bundle's measured 4-D grid
    (prefill_chunk 16-2048, kv_prefill 0, n_decode 32-256, kv_decode 1k-16k): the summed time within 10 %,
    every point within a factor 2 (0.67-1.85 today: the grid's apparent read rate rises at small batches, whose KV
    partly stays in the 128 MB L2; one fraction cannot follow that)."""
    org = "meta-llama" if model.startswith("Llama") else "Qwen"
    path = PROFILE / org / model / "bf16" / "tp1" / "attention.csv.gz"
    with gzip.open(path, "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["kv_prefill"] == "0" and int(r["prefill_chunk"]) > 0
                and int(r["n_decode"]) >= 32 and int(r["kv_decode"]) >= 1024]
    spec = load_model(model.lower())
    roof = RooflineLatency(spec, RTX, TP1)
    predicted, measured = [], []
    for r in rows:
        plan = StepPlan()
        plan.add(int(r["prefill_chunk"]), 0, 1, logits_row=True)
        plan.add(1, int(r["kv_decode"]) - 1, int(r["n_decode"]), logits_row=True)
        predicted.append(roof.attention_s(plan) / spec.num_layers)
        measured.append(float(r["time_us"]) * 1e-6)
    assert len(rows) > 100
    assert sum(predicted) == pytest.approx(sum(measured), rel=0.10)
    assert all(1 / 2 < p / m < 2 for p, m in zip(predicted, measured, strict=True))


def _profile_us(layers, tokens):
    path = PROFILE / "meta-llama" / "Llama-3.1-8B" / "bf16" / "tp1" / "dense.csv.gz"
    with gzip.open(path, "rt") as f:
        return sum(float(r["time_us"]) for r in csv.DictReader(f) if r["layer"] in layers and r["tokens"] == str(tokens))


@pytest.mark.parametrize("tokens", [1, 128, 512, 2048])
def test_roofline_linear_layers_match_the_public_profile(tokens):
    """The RTX PRO 6000's fitted fractions (pooled over Llama-3.1-8B, Qwen3-32B and Qwen3-30B-A3B at TP 1
    and 2) reproduce Llama-3.1-8B's measured GEMMs within 15 % (the fit's mean per-op error on this GPU is
    in kvsim/model/presets/efficiency.yaml)."""
    measured = 32 * _profile_us({"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}, tokens) * 1e-6
    assert RooflineLatency(LLAMA, RTX, TP1).linear_s(tokens) == pytest.approx(measured, rel=0.15)


MEASURED = PROFILE.parents[1] / "measured" / "RTXPRO6000"


def _fit_collectives_script():
    from conftest import benchmark_script

    return benchmark_script("fit_collectives")


@pytest.mark.parametrize(("setup", "preset"), [("h100_dgx", "h100-80gb"), ("a100_dgx", "a100-80gb")])
def test_nvlink_presets_hold_the_fit_to_vidurs_nccl_all_reduce(setup, preset, shared):
    """The preset link's (efficiency, per-step, base latency) are the least-squares fit to Vidur's DGX
    all-reduce (2-8 GPUs, 2 KiB-64 MiB), its `by_num_gpus` the fit at each GPU count alone, and
    messages above 4 MiB are within 15 % on average at every GPU count."""
    script = _fit_collectives_script()
    rows = script.measurements(shared / "validation", setup)
    link = load_gpu(preset).resolved_link
    fitted = script.fit(rows, link.bandwidth_bytes_per_s)
    assert (link.efficiency, link.latency_s, link.collective_latency_s) == pytest.approx(
        (fitted["efficiency"], fitted["latency_s"], fitted["collective_latency_s"]), rel=0.01)
    by_count = script.fit_by_num_gpus(rows, link.bandwidth_bytes_per_s)
    assert link.by_num_gpus is not None and set(link.by_num_gpus) == set(by_count) == {2, 4, 8}
    for gpus, fit in by_count.items():
        assert (link.by_num_gpus[gpus].efficiency, link.by_num_gpus[gpus].fixed_s) == pytest.approx(
            (fit["efficiency"], fit["fixed_s"]), rel=0.01)
    for key, e in script.link_errors(rows, link).items():
        if key.endswith("> 4 MiB"):
            assert e["mean_abs_pct"] <= 15.0, key


@pytest.mark.parametrize(("fields", "message"), [
    ({"link_bw": "abc"}, "link_bw='abc' is not a number"),
    ({"link_bw": True}, "link_bw=True is not a number"),
    ({"link_bw": float("inf")}, "link_bw=inf is not a number"),
    ({"link_bw": 0}, "link_bw=0 must be > 0 (GB/s)"),
    ({"link_bw": -16}, "link_bw=-16 must be > 0 (GB/s)"),
    ({"link_bw": 16, "link_latency": -1}, "link_latency=-1 must be >= 0 (ns)"),
    ({"link_bw": 16, "link_latency": "20us"}, "link_latency='20us' is not a number"),
])
def test_a_cluster_configs_bad_link_is_named(tmp_path, fields, message):
    """A measured run's config.json link that is not a usable number is an error naming the field, not a
    link silently dropped (the preset's would be used) or a free all-reduce (inf)."""
    import json

    from kvsim.model.errors import KvsimError
    from kvsim.validation.measured import _link

    config = tmp_path / "config.json"
    config.write_text(json.dumps(fields))
    with pytest.raises(KvsimError, match=re.escape(message)):
        _link(config)
    config.write_text(json.dumps({"link_bw": 2, "link_latency": 500}))  # 2 GiB/s, 500 ns a hop
    assert _link(config) == {"bandwidth_bytes_per_s": 2 * 1024**3, "latency_s": pytest.approx(5e-7)}
    config.write_text(json.dumps({"nodes": []}))
    assert _link(config) is None


def test_validate_uses_the_measured_clusters_link_for_tensor_parallel_runs(tmp_path):
    from kvsim.validation.measured import load_measured
    from kvsim.validation.replay import build_scenario

    qwen = load_measured(MEASURED / "Qwen3-32B")  # LLMServingSim's config.json: link_bw 16 (GB/s), 20000 ns
    # ASTRA-Sim, which the peer feeds that config to, reads a GB as 2^30 bytes (bw_GBps_to_Bpns)
    assert qwen.link == {"bandwidth_bytes_per_s": 16 * 1024**3, "latency_s": pytest.approx(20e-6)}
    trace = tmp_path / "w.jsonl"
    trace.write_text("")
    link = build_scenario(qwen, trace, model="qwen3-32b", gpu="rtx-pro-6000").gpu_link
    assert link is not None and (link.efficiency, link.collective_latency_s) == (1.0, 0.0)
    assert allreduce_s(1.6e6, 2, link) == pytest.approx(1.6e6 / (16 * 1024**3) + 2 * 20e-6)  # ASTRA-sim's 2-GPU ring
    llama = load_measured(MEASURED / "Llama-3.1-8B")
    assert build_scenario(llama, trace, model="llama-3.1-8b", gpu="rtx-pro-6000").gpu_link is None


@pytest.mark.parametrize(("model", "tp", "overhead_s", "overlap_swap"), [
    ("llama-3.1-8b", 1, None, False), ("llama-3.1-8b", 2, 0.003, True), ("mixtral-8x7b", 2, None, False),
    ("gemma-3-27b", 1, None, False),  # sliding-window layers: reads through decode_read_bytes
])
def test_burst_step_times_equal_step_time_of_each_step_bit_for_bit(model, tp, overhead_s, overlap_swap):
    """`decode_step_times` computes a burst's constant terms once: compared exactly (==) against
    `step_time` of each step's plan, built independently with `StepPlan.add` per sequence."""
    from itertools import islice

    from kvsim.latency.base import burst_step_times

    latency = RooflineLatency(load_model(model), load_gpu("h100-80gb"),
                              EngineConfig(max_model_len=8192, tensor_parallel_size=tp), overhead_s, overlap_swap)
    for contexts in ([17], [3001, 2999, 5, 40, 700, 12, 9000], [812 + i for i in range(200)]):
        fast = list(islice(burst_step_times(latency, decode_plan(contexts)), 300))
        assert fast == [latency.step_time(decode_plan([c + j for c in contexts])) for j in range(300)]
    prefill = decode_plan([100])
    prefill.add(50, 0, 1, logits_row=True)
    assert latency.decode_step_times(prefill) is None  # not pure decode: priced plan by plan


def test_burst_step_times_past_exact_products_and_past_2_to_53_bit_for_bit():
    """`_decode_times` multiplies Σ context by the bytes per token as doubles: the same double as the integer
    product `step_time` divides (both round the exact product to nearest, ties to even) where the product is far
    past 2^53 and rounds (contexts of 2^40: llama-3.1-8b's 131,072 bytes per token make ~2^57). From Σ context
    2^53 - 5 growing by 3 a step it goes on with integers (past 2^53 a double holds even integers only: summed as
    doubles, the context would drift by a token a step); there `step_time` itself is no reference (its other terms
    lose the integers), so the steps are checked against the integer formula with the burst's constant terms."""
    from itertools import islice

    from kvsim.latency.base import burst_step_times
    from kvsim.latency.roofline import EXACT_INT_FLOAT

    latency = RooflineLatency(load_model("llama-3.1-8b"), load_gpu("h100-80gb"), EngineConfig(max_model_len=8192))
    assert (2**40 + 3) * latency.kv_bytes_per_token > EXACT_INT_FLOAT  # the product rounds
    for contexts in ([2**40 + 3], [2**40 + 1, 2**39 + 7, 3], [2**36 + 5, 3, 9]):
        fast = list(islice(burst_step_times(latency, decode_plan(contexts)), 64))
        assert fast == [latency.step_time(decode_plan([c + j for c in contexts])) for j in range(64)]
    first = decode_plan([EXACT_INT_FLOAT - 9, 2, 2])
    head, floor, tail, fixed, cpu, swap = latency._decode_step_terms(first)
    bandwidth = latency.eff.decode_bandwidth * latency.bandwidth
    expected = [max(head + (floor + (EXACT_INT_FLOAT - 5 + 3 * j) * latency.kv_bytes_per_token / bandwidth) + tail
                    + fixed, cpu) + swap for j in range(64)]
    assert list(islice(burst_step_times(latency, first), 64)) == expected


def decode_plan(contexts):
    """One step decoding one token of each sequence, `contexts` its tokens after the step."""
    plan = StepPlan()
    for context in contexts:
        plan.add(1, context - 1, 1, logits_row=True)
    return plan


def test_sliding_window_layers_prefill_only_their_window():
    """gemma-3-27b: 52 of 62 layers attend a 1,024-token window. A 16,384-token prompt's full layers
    see 16,384 · 16,385 / 2 query-key pairs; each windowed layer at most 1,024 per query (and reads
    at most the chunk plus a window of KV, here the chunk itself)."""
    gemma = load_model("gemma-3-27b")
    h100 = load_gpu("h100-80gb")
    roof = RooflineLatency(gemma, h100, EngineConfig(max_model_len=32768), efficiency=DATASHEET)
    n = 16384
    plan = StepPlan()
    plan.add(n, 0, 1, logits_row=True)
    full_pairs, window_pairs = n * (n + 1) / 2, n * 1024
    flops = 4 * 32 * 128 * (10 * full_pairs + 52 * window_pairs)  # 4 · heads · head_dim per pair and layer
    kv_read = 62 * n * 2 * 16 * 128 * 2  # every layer reads the chunk's K and V (16 KV heads of 128, bf16)
    assert roof.attention_s(plan) == pytest.approx(flops / 989e12 + kv_read / 3.35e12, rel=1e-12)
    # without the window (an unknown chunk), every layer would span the whole prompt
    assert roof.prefill_s(plan.attention_work, n) == pytest.approx(
        4 * 32 * 128 * 62 * full_pairs / 989e12 + kv_read / 3.35e12, rel=1e-12)


@pytest.mark.parametrize("disable_hybrid", [False, True])
def test_sliding_window_layers_read_their_window_whatever_the_kv_manager(disable_hybrid):
    """`disable_hybrid_kv_cache_manager` allocates every layer for the whole context, but vLLM still attends
    only the window ("The compute of layers like sliding window is still saved", unify_hybrid_kv_cache_specs).
    The roofline took its windows from the allocation's groups, so with the flag gpt-oss-20b's sliding layers
    read the whole context: 10 % more TTFT at a 6,000-token prompt. gpt-oss-20b: 12 of 24 layers attend 128
    tokens, 2 · 8 KV heads · 64 · 2 B = 2,048 B per token per layer; one decode at 4,096 tokens reads
    12 · 4,096 + 12 · 128 tokens of KV, and a 4,096-token prefill 12 · 4,096 · 4,097 / 2 + 12 · 4,096 · 128 pairs."""
    gpt_oss = load_model("gpt-oss-20b")
    engine = EngineConfig(max_model_len=8192, disable_hybrid_kv_cache_manager=disable_hybrid)
    roof = RooflineLatency(gpt_oss, load_gpu("h100-80gb"), engine, efficiency=DATASHEET)
    assert roof.decode_read_bytes(1, 4096) == (12 * 4096 + 12 * 128) * 2048
    n = 4096
    plan = StepPlan()
    plan.add(n, 0, 1, logits_row=True)
    flops = 4 * 64 * 64 * (12 * n * (n + 1) / 2 + 12 * n * 128)  # 64 query heads of 64 per pair and layer
    kv_read = 24 * n * 2048  # every layer reads the chunk's K and V
    assert roof.attention_s(plan) == pytest.approx(flops / 989e12 + kv_read / 3.35e12, rel=1e-12)


def test_a_v1_step_of_one_partial_chunk_prices_one_lm_head_row_and_v0s_none():
    """vLLM v1 takes a logits row at each scheduled request's last token, a partial prefill chunk's too
    (`GPUModelRunner._prepare_inputs`: `logits_indices = query_start_loc[1:] - 1`), and samples it; v0 takes
    none for a chunk that does not finish its prompt (`do_sample`). A step holding only a chunk of 32 tokens
    of a 100-token prompt: v1's costs v0's plus the LM head over one row and the sampler of one row.
    Llama-3.1-8B's LM head: vocab 128,256 × hidden 4,096 = 525,336,576 bf16 weights, 1,050,673,152 bytes
    read once; one row is 2 · 525,336,576 FLOPs. On the RTX PRO 6000 (1.597 TB/s, 483.6 dense bf16 TFLOP/s):
      datasheet  √((1.0507e9 / 483.6e12)² + (1.0507e9 / 1.597e12)²) = √(2.173² + 657.9²) us = 657.9 us
      fitted     √((1.0507e9 / (0.6902 · 483.6e12))² + (1.0507e9 / (0.95 · 1.597e12))²) + 3.797 us (GEMM floor)
                 + 0.5 us (sampler, one row) = √(3.148² + 692.5²) + 4.297 us = 696.8 us
    (efficiency.yaml's rtx-pro-6000 fit: gemm_flops_by_regime[0] 0.6902 below 16 rows, gemm_bandwidth 0.95,
    gemm_floor_s 3.797e-06; sample_per_seq_s the default 0.5e-6)."""
    plans = {}
    for policy in ("v1", "v0"):
        plans[policy] = StepPlan(scheduled=[(make_request(0, 0.0, 100, 5), 32)])
        tiny_world(policy).account(plans[policy])
    assert (plans["v1"].num_logits_rows, plans["v0"].num_logits_rows) == (1, 0)
    lm_head_bytes, lm_head_flops = 128256 * 4096 * 2, 2 * 128256 * 4096
    bare = RooflineLatency(LLAMA, RTX, TP1, overhead_s=0.0, efficiency=DATASHEET)
    added = bare.step_time(plans["v1"]) - bare.step_time(plans["v0"])
    assert added == pytest.approx(((lm_head_flops / 483.6e12) ** 2 + (lm_head_bytes / 1.597e12) ** 2) ** 0.5)
    assert added == pytest.approx(657.9e-6, abs=0.05e-6)
    fitted = RooflineLatency(LLAMA, RTX, TP1)
    added = fitted.step_time(plans["v1"]) - fitted.step_time(plans["v0"])
    by_hand = ((lm_head_flops / (0.6902 * 483.6e12)) ** 2 + (lm_head_bytes / (0.95 * 1.597e12)) ** 2) ** 0.5
    assert added == pytest.approx(by_hand + 3.797e-6 + 0.5e-6)
    assert added == pytest.approx(696.8e-6, abs=0.05e-6)
