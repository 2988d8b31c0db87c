"""benchmarks/bench_vidur.py's inputs: both simulators get the same requests, Vidur's profile is the roofline.

Runs without Vidur: only the trace conversion and the profile tables are checked (the side-by-side
run itself is a benchmark, `python benchmarks/bench_vidur.py`).
"""

from __future__ import annotations

import csv
import json
import lzma
import math
import sys
from datetime import datetime
from pathlib import Path

import pytest

from kvsim.workload.traces import read_azure

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_vidur
        import vidur_profile
    finally:
        sys.path.remove(str(BENCHMARKS))
    return bench_vidur, vidur_profile


def test_both_trace_files_hold_the_same_requests(bench, tmp_path):
    bench_vidur, _ = bench
    if not bench_vidur.TRACE.exists():
        pytest.skip("../shared/traces is not beside the checkout")
    with bench_vidur.TRACE.open(newline="") as f:
        raw = [row for _, row in zip(range(400), csv.DictReader(f), strict=False)]
    kvsim_csv, vidur_csv, _ = bench_vidur.convert_trace(400, 0.5, tmp_path)
    kvsim_rows = read_azure(kvsim_csv)
    with vidur_csv.open(newline="") as f:
        vidur_rows = list(csv.DictReader(f))
    assert len(kvsim_rows) == len(vidur_rows) == 400
    clipped = 0
    for source, k, v in zip(raw, kvsim_rows, vidur_rows, strict=True):
        output = int(source["GeneratedTokens"])
        prompt = min(int(source["ContextTokens"]), 4096 - output)  # Vidur's rule: the prompt gives way
        clipped += prompt < int(source["ContextTokens"])
        assert (k.prompt_len, k.output_len) == (prompt, output) == (int(v["PromptTokenCount"]),
                                                                     int(v["CompletionTokenCount"]))
        assert k.arrival_s == pytest.approx(float(v["Time"]), abs=2e-6)
        assert v["Date"] == "2023-11-16"
    assert clipped > 0, "the first 400 conv requests include prompts over 4,096 - output tokens"
    # rate_scale 0.5 doubles every gap: the 400th arrival of the raw trace, at twice its offset
    first, last = (datetime.fromisoformat(raw[i]["TIMESTAMP"][:26]) for i in (0, -1))
    span = (last - first).total_seconds() * 2
    assert float(vidur_rows[-1]["Time"]) == pytest.approx(span, abs=1e-5)


def test_profile_tables_are_the_roofline_in_vidurs_columns(bench, tmp_path):
    _, vidur_profile = bench
    compute_id, network_id = vidur_profile.write_profile(tmp_path, 16, 256, 4)
    root = tmp_path / "profiling_data" / "compute" / f"datasets--{compute_id.replace('/', '--')}"
    snapshot = root / "snapshots" / (root / "refs" / "main").read_text()
    assert json.loads((snapshot / "config.json").read_text()) == {"model": "meta-llama/Llama-2-7b-hf",
                                                                   "device_sku": "a100"}
    net = tmp_path / "profiling_data" / "network" / f"datasets--{network_id.replace('/', '--')}"
    assert json.loads((net / "snapshots" / (net / "refs" / "main").read_text() / "config.json").read_text()) == {
        "sku": "a100_dgx"}
    mlp = list(csv.DictReader(lzma.decompress((snapshot / "mlp.csv.xz").read_bytes()).decode().splitlines()))
    assert [int(r["num_tokens"]) for r in mlp] == list(range(1, 257))
    one = mlp[0]
    assert (one["n_head"], one["n_kv_head"], one["n_embd"], one["n_expanded_embd"], one["use_gated_mlp"],
            one["num_tensor_parallel_workers"]) == ("32", "32", "4096", "11008", "True", "1")
    # qkv of Llama-2-7B at 1 token, by hand: 4096 x (3 x 4096) fp16 weights, read at the A100's fitted ηb of
    # 2.039 TB/s, blended with 2 FLOP per weight at its fitted ηf(1 token) of 312 TFLOP/s, plus the fixed
    # cost of a GEMM (kvsim/latency/roofline.py; fractions in kvsim/model/presets/efficiency.yaml)
    from kvsim.latency.roofline import efficiency_for
    from kvsim.model.config import load_gpu

    eff = efficiency_for(load_gpu("a100-80gb"))
    eta_b, eta_f = eff.gemm_bandwidth, eff.gemm_flops_at(1)
    params = 4096 * 3 * 4096
    read_s, compute_s = 2 * params / (eta_b * 2.039e12), 2 * params / (eta_f * 312e12)
    assert float(one["time_stats.attn_pre_proj.median"]) == pytest.approx(
        (math.hypot(read_s, compute_s) + eff.gemm_floor_s) * 1e3)
    assert float(one["time_stats.mlp_down_proj.median"]) == pytest.approx(
        (math.hypot(2 * 4096 * 11008 / (eta_b * 2.039e12), 2 * 4096 * 11008 / (eta_f * 312e12))
         + eff.gemm_floor_s) * 1e3)
    attn = list(csv.DictReader(lzma.decompress((snapshot / "attention.csv.xz").read_bytes()).decode().splitlines()))
    decode = [r for r in attn if r["prefill_chunk_size"] == "0"]
    prefill = [r for r in attn if r["prefill_chunk_size"] != "0"]
    assert {int(r["batch_size"]) for r in decode} == {1, 2, 3, 4}
    assert {int(r["prefill_chunk_size"]) for r in prefill} == set(range(32, 257, 32))
    assert {int(r["kv_cache_size"]) for r in attn} == {0, 256}  # Vidur's 256-token grid
    assert all(float(r["time_stats.attn_prefill.median"]) > 0 for r in prefill)
    # two decodes at 256 tokens of context, one layer: the fitted kernel floor + 0.1 us per sequence,
    # then 512 tokens x 2 (K, V) x 32 heads x 128 x 2 bytes read at the fitted ηa of 2.039 TB/s
    (two,) = [r for r in decode if (r["batch_size"], r["kv_cache_size"]) == ("2", "256")]
    expected_s = eff.kernel_floor_s + 2 * 0.1e-6 + 512 * 2 * 32 * 128 * 2 / (eff.decode_bandwidth * 2.039e12)
    assert float(two["time_stats.attn_decode.median"]) == pytest.approx(expected_s * 1e3)
