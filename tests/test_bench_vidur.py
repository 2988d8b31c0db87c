"""benchmarks/bench_vidur.py's inputs: all simulators get the same requests, Vidur's profile is the roofline.

Runs without Vidur: only the trace conversions, the paper's flags (against its config source, when
../shared/peers is there) and the profile tables are checked (the side-by-side run itself is a
benchmark, `python benchmarks/bench_vidur.py`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import lzma
import math
import sys
import tarfile
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvsim.workload.traces import read_azure, read_mooncake

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
KVSIM = BENCHMARKS.parent / "kvsim"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_vidur
        import vidur_profile
        import vidur_sides
    finally:
        sys.path.remove(str(BENCHMARKS))
    return SimpleNamespace(bench_vidur=bench_vidur, profile=vidur_profile, sides=vidur_sides)


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_all_three_trace_files_hold_the_same_requests(bench, tmp_path):
    vidur_sides = bench.sides
    # the benchmark reads ../shared's Azure conversation trace; kvsim ships an unchanged copy of it
    trace = KVSIM / "workload" / "data" / "azure_conv.csv"
    with trace.open(newline="") as f:
        raw = [row for _, row in zip(range(400), csv.DictReader(f), strict=False)]
    scenario = dataclasses.replace(vidur_sides.scenarios(400)["azure_conv"], rate_scale=0.5, trace=trace)
    files = vidur_sides.convert_trace(scenario, tmp_path)
    kvsim_rows = read_azure(files.kvsim)
    paper_rows, package_rows = _read_csv(files.vidur_paper), _read_csv(files.vidur_package)
    assert len(kvsim_rows) == len(paper_rows) == len(package_rows) == 400
    clipped = 0
    for source, k, p, v in zip(raw, kvsim_rows, paper_rows, package_rows, strict=True):
        output = int(source["GeneratedTokens"])
        prompt = min(int(source["ContextTokens"]), 4096 - output)  # Vidur's rule: the prompt gives way
        clipped += prompt < int(source["ContextTokens"])
        assert (k.prompt_len, k.output_len) == (prompt, output) == (int(v["PromptTokenCount"]),
                                                                     int(v["CompletionTokenCount"]))
        assert (int(p["num_prefill_tokens"]), int(p["num_decode_tokens"])) == (prompt, output)
        assert k.arrival_s == pytest.approx(float(v["Time"]), abs=2e-6)
        assert p["arrived_at"] == v["Time"]
        assert v["Date"] == "2023-11-16"
    assert clipped > 0, "the first 400 conv requests include prompts over 4,096 - output tokens"
    # rate_scale 0.5 doubles every gap: the 400th arrival of the raw trace, at twice its offset
    first, last = (datetime.fromisoformat(raw[i]["TIMESTAMP"][:26]) for i in (0, -1))
    span = (last - first).total_seconds() * 2
    assert float(package_rows[-1]["Time"]) == pytest.approx(span, abs=1e-5)


def test_mooncake_prompts_are_clipped_with_their_hash_ids(bench, tmp_path, traces):
    vidur_sides = bench.sides
    trace = traces / vidur_sides.MOONCAKE_TRACE.relative_to(vidur_sides.TRACES)
    with trace.open() as f:
        raw = [json.loads(line) for _, line in zip(range(300), f, strict=False)]
    scenario = dataclasses.replace(vidur_sides.scenarios(300)["mooncake_preempt_cache"], trace=trace)
    files = vidur_sides.convert_trace(scenario, tmp_path)
    converted = [json.loads(line) for line in files.kvsim.read_text().splitlines()]
    kvsim_rows, paper_rows = read_mooncake(files.kvsim), _read_csv(files.vidur_paper)
    assert len(converted) == len(kvsim_rows) == len(paper_rows) == 300
    clipped = 0
    for source, c, k, p in zip(raw, converted, kvsim_rows, paper_rows, strict=True):
        prompt = min(source["input_length"], 4096 - source["output_length"])
        clipped += prompt < source["input_length"]
        blocks = -(-prompt // 512)  # one id per started 512-token block of the clipped prompt
        assert c["hash_ids"] == source["hash_ids"][:blocks]
        assert (k.prompt_len, k.output_len) == (prompt, source["output_length"])
        assert (int(p["num_prefill_tokens"]), int(p["num_decode_tokens"])) == (prompt, source["output_length"])
        # arrivals slowed to 0.4x the trace's rate: ms / 1000 / 0.4
        assert k.arrival_s == pytest.approx(float(p["arrived_at"]), abs=2e-6)
        assert k.arrival_s == pytest.approx(source["timestamp"] / 1000 / 0.4, abs=2e-6)
    assert clipped > 150, "most Mooncake prompts are longer than Llama-2-7B's 4,096 tokens"
    assert all(c["hash_ids"][0] == 0 for c in converted), "every request shares block id 0 (the README)"


def test_paper_flags_are_fields_of_the_papers_config(bench, tmp_path, shared):
    vidur_sides = bench.sides
    tarball = shared / vidur_sides.PAPER_TARBALL.relative_to(vidur_sides.TRACES.parent)
    with tarfile.open(tarball) as tar:
        config = tar.extractfile("vidur-7d47513/vidur/config/config.py").read().decode()
    prefixes = ("random_forrest_execution_time_predictor_config_", "vllm_scheduler_config_",
                "sarathi_scheduler_config_", "trace_request_generator_config_", "metrics_config_",
                "replica_config_", "cluster_config_", "replica_scheduler_config_",
                "execution_time_predictor_config_", "request_generator_config_")
    for scenario in vidur_sides.scenarios(10).values():
        cmd = vidur_sides.vidur_paper_command(Path("python"), scenario, tmp_path / "t.csv", tmp_path / "out",
                                              (tmp_path / "mlp.csv", tmp_path / "attention.csv"), tmp_path)
        flags = [c.removeprefix("--").removeprefix("no-") for c in cmd if c.startswith("--")]
        assert f"--{scenario.vidur_scheduler}_scheduler_config_num_blocks" in cmd
        for flag in flags:
            if flag in ("seed", "log_level"):
                continue
            prefix = next(p for p in prefixes if flag.startswith(p))
            field = flag.removeprefix(prefix)
            assert f"    {field}: " in config or field == "type", f"--{flag} names no field of the paper's config"


def test_profile_tables_are_the_roofline_in_vidurs_columns(bench, tmp_path):
    vidur_profile = bench.profile
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
    from kvsim.latency.efficiency import efficiency_for
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


def test_paper_csvs_are_the_package_tables(bench, tmp_path):
    vidur_profile = bench.profile
    mlp, attention = vidur_profile.write_csv_profile(tmp_path / "paper", 16, 64, 2)
    compute_id, _ = vidur_profile.write_profile(tmp_path / "package", 16, 64, 2)
    root = tmp_path / "package" / "profiling_data" / "compute" / f"datasets--{compute_id.replace('/', '--')}"
    snapshot = root / "snapshots" / (root / "refs" / "main").read_text()
    assert mlp.read_bytes() == lzma.decompress((snapshot / "mlp.csv.xz").read_bytes())
    assert attention.read_bytes() == lzma.decompress((snapshot / "attention.csv.xz").read_bytes())
    assert mlp.parent.name.endswith(compute_id.rsplit("-", 1)[1])  # the same digest names both
