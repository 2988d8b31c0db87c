"""`kvsim validate` uses what a measured run recorded (GPU, KV pool, a bench result's engine arguments)
and reports prefill and decode speed separately. Tiny hand-made runs; expected values by hand."""

import gzip
import json

import pandas as pd
import pytest
import yaml

from kvsim.model.config import load_gpu
from kvsim.model.errors import KvsimError
from kvsim.validation.compare import PHASE_METRICS, measured_phase_rates, simulated_phase_rates
from kvsim.validation.measured import MeasuredRun
from kvsim.validation.recorded import recorded_settings
from kvsim.validation.replay import build_scenario, resolve_gpu
from kvsim.workload.traces import TraceRecord


def _run(**kw) -> MeasuredRun:
    return MeasuredRun(name="r", source="vllm-measured", model_id="meta-llama/Llama-3.1-8B",
                       requests=pd.DataFrame(), records=[TraceRecord(0.0, 10, 5)], engine={}, **kw)


def test_meta_json_gpu_and_pool_are_read_and_used(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "meta.json").write_text(json.dumps({
        "model": "meta-llama/Llama-3.1-8B", "gpu": "NVIDIA H100 80GB HBM3", "num_gpu_blocks": 27000,
        "engine_kwargs": {"tensor_parallel_size": 1}}))
    recorded = recorded_settings(tmp_path)
    assert recorded == {"gpu": "NVIDIA H100 80GB HBM3", "num_gpu_blocks": 27000}
    assert resolve_gpu(_run(hardware="somewhere"), None, recorded) == "h100-80gb"  # no --gpu needed
    assert resolve_gpu(_run(), "h100-80gb", recorded) == "h100-80gb"  # --gpu naming the run's GPU
    h100_file = tmp_path / "tuned.yaml"  # the same chip with other efficiency fractions (benchmarks/accuracy.py)
    h100_file.write_text(yaml.safe_dump({k: v for k, v in load_gpu("h100-80gb").model_dump(mode="json").items()
                                         if k != "name"} | {"efficiency": {"gemm": 0.5}}))
    assert resolve_gpu(_run(), str(h100_file), recorded) == str(h100_file)
    with pytest.raises(KvsimError, match=r"^--gpu='a100-80gb': memory_bytes=85,899,345,920, but the measured run "
                                         r"ran on 'NVIDIA H100 80GB HBM3' \(preset h100-80gb, memory_bytes="):
        resolve_gpu(_run(), "a100-80gb", recorded)  # was taken in silence: A100 timings held against an H100's
    # a hardware label alone names a family: a folder labelled H100 may be an H100 PCIe, so --gpu stands
    assert resolve_gpu(_run(hardware="H100"), None, {}) == "h100-80gb"
    assert resolve_gpu(_run(hardware="H100"), "h100-pcie", {}) == "h100-pcie"
    trace = tmp_path / "w.jsonl"
    trace.write_text("")
    scenario = build_scenario(_run(), trace, model="llama-3.1-8b", gpu="h100-80gb", recorded=recorded)
    assert scenario.engine.num_gpu_blocks_override == 27000


def test_a_recorded_device_of_another_sku_is_not_taken_for_the_folder_s_family():
    """A run recorded on an A100 80GB PCIe (1,935 GB/s, 300 W: the A100 datasheet) in a folder labelled A100
    was priced as the SXM4 preset (2,039 GB/s) in silence: the label names a family. Now --gpu is asked for."""
    recorded = {"gpu": "NVIDIA A100 80GB PCIe"}
    with pytest.raises(KvsimError, match=r"gpu=.NVIDIA A100 80GB PCIe., which matches no single preset "
                                         r"\(hardware=.A100.\); pass --gpu with a preset \(a100-40gb, "):
        resolve_gpu(_run(hardware="A100"), None, recorded)
    assert resolve_gpu(_run(hardware="A100"), "a100-80gb", recorded) == "a100-80gb"  # the planner's choice
    assert resolve_gpu(_run(hardware="A100"), None, {}) == "a100-80gb"  # no device recorded: the label


def test_bench_json_metadata_fills_engine_arguments(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"model_id": "x", "gpu_name": "NVIDIA A100-SXM4-80GB", "tensor_parallel_size": 2,
                                 "kv_cache_dtype": "fp8", "metadata": {"num_gpu_blocks": 5000}}))
    recorded = recorded_settings(bench)
    assert recorded == {"gpu": "NVIDIA A100-SXM4-80GB", "tensor_parallel_size": 2, "kv_cache_dtype": "fp8",
                        "num_gpu_blocks": 5000}
    assert resolve_gpu(_run(), None, recorded) == "a100-80gb"
    assert recorded_settings(tmp_path / "absent.json") == {}


def test_phase_rates_by_hand(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "timeseries.csv").write_text(
        "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
        "1.0,900.0,10.0,2,0,0.0\n2.0,0.0,30.0,3,0,0.0\n3.0,300.0,20.0,5,0,0.0\n")
    measured = measured_phase_rates(tmp_path)
    assert measured == {PHASE_METRICS[0]: pytest.approx(600.0), PHASE_METRICS[1]: pytest.approx(60 / 10)}
    series = tmp_path / "vllm" / "timeseries.csv"  # gzipped, as the validation set ships large files
    series.with_name("timeseries.csv.gz").write_bytes(gzip.compress(series.read_bytes()))
    series.unlink()
    assert measured_phase_rates(tmp_path) == measured
    # kvsim: a prefill step [0, 0.5) of 100 tokens (a 100-token prompt, first token at .5), a second
    # request's 200-token prompt of which 160 hit the prefix cache, its 40 computed in [0.5, 1.2) beside one
    # decode (first token at 1.2), then a decode step [1.2, 1.9) of both. vLLM's logger counts a whole prompt
    # in the tick of its first token, and every sampled token: tick 0 → prompt 100, 1 token; tick 1 →
    # prompt 200 (hits included), 1 + 1 + 2 tokens. Running at t = 1 and 2: 2 and 0
    steps = pd.DataFrame({"time_s": [0.0, 0.5, 1.2], "duration_s": [0.5, 0.7, 0.7],
                          "num_prefill_tokens": [100, 40, 0], "num_decode_seqs": [0, 1, 2],
                          "vllm:num_requests_running": [1, 2, 2]})
    requests = pd.DataFrame({"first_token_s": [0.5, 1.2], "prompt_tokens": [100, 200], "output_tokens": [3, 2],
                             "num_samples": [1, 1], "status": ["finished", "finished"]})
    assert simulated_phase_rates(steps, requests) == {PHASE_METRICS[0]: pytest.approx((100 + 200) / 2),
                                                      PHASE_METRICS[1]: pytest.approx(5 / 2)}


def test_a_fine_tunes_id_names_its_base_models_preset():
    """Instruction and chat fine-tunes keep their base model's config.json (layers, heads, widths, vocabulary),
    so a `vllm bench serve` of meta-llama/Llama-3.1-8B-Instruct replays as llama-3.1-8b; a preset named for the
    fine-tune itself wins, and an id of neither still asks for --model."""
    from kvsim.validation.replay import resolve_model, run_model_preset

    assert run_model_preset("meta-llama/Llama-3.1-8B-Instruct") == "llama-3.1-8b"
    assert run_model_preset("google/gemma-3-27b-it") == "gemma-3-27b"
    assert run_model_preset("Qwen/Qwen2.5-7B-Instruct") == "qwen2.5-7b"
    assert run_model_preset("Qwen/Qwen3-30B-A3B-Instruct-2507") == "qwen3-30b-a3b-instruct-2507"
    assert run_model_preset("mistralai/Mistral-7B-Instruct-v0.3") is None  # a version after the suffix: not guessed
    run = MeasuredRun(name="r", source="vllm-bench", model_id="meta-llama/Llama-3.1-8B-Instruct",
                      requests=pd.DataFrame(), records=[TraceRecord(0.0, 10, 5)], engine={})
    assert resolve_model(run, None) == "llama-3.1-8b"
    with pytest.raises(KvsimError, match="preset llama-3.1-8b"):
        resolve_model(run, "opt-13b")
