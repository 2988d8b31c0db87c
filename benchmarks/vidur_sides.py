"""The two scenarios bench_vidur.py runs, and how each simulator is told about them and read back.

Three sides simulate every scenario from the same requests:

    side            what                                             trace file it reads
    kvsim           `kvsim run scenario.yaml -o DIR`                 Azure CSV or Mooncake JSONL
    vidur_paper     microsoft/vidur @ 7d47513 (the MLSys'24 code,    arrived_at,num_prefill_tokens,
                    ../shared/peers, unpacked by setup_vidur_paper.sh) num_decode_tokens
    vidur_package   the PyPI wheel vidur 0.0.26 (setup_vidur.sh)     Date,Time,PromptTokenCount,
                                                                     CompletionTokenCount

What each writes, per run (both Vidurs with plots and the Chrome trace off, per-batch rows on):
kvsim: requests.csv (one row per request), steps.csv or steps.parquet (one row per step, every
step), summary.json, scenario.yaml. Vidur: request_metrics.csv (one row per request),
batch_metrics.csv (one row per batch: tokens, prefill/decode tokens, size, execution time),
plots/*.csv (the per-request series and the CDFs of the batch metrics), config.json.

Scenarios:
- `azure_conv`: the first 10,000 Azure 2023 conversation requests at 0.7x the trace's rate, v0
  prefill-first batches (Vidur's `vllm` scheduler), 7,430 usable blocks: no preemption, no caching.
- `mooncake_preempt_cache`: the first 4,000 Mooncake FAST'25 conversation requests at 0.4x the
  trace's rate, v1 chunked prefill (Vidur's `sarathi` scheduler, chunk = token budget 4,096), a pool
  of 3,000 blocks (2,999 usable) so running requests are preempted (recompute), and prefix caching on
  in kvsim (the trace's 512-token hash_ids decide hits). Neither Vidur can cache prefixes: the
  paper's code has no such option and its requests carry no content; the package has a
  `--cache_config_enable_prefix_caching` flag that no simulation code reads (it is only stored in
  the native config struct) and its trace_replay requests carry no content either.

Prompts are clipped to max_model_len - output tokens (Vidur's own trace rule: the prompt gives way);
for Mooncake the hash_ids are cut to the clipped prompt's blocks, so shared prefixes stay shared.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from vidur_profile import KVSIM_GPU, KVSIM_MODEL, VIDUR_DEVICE, VIDUR_MODEL, VIDUR_NETWORK

from kvsim.model.capacity import num_gpu_blocks
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import EngineConfig
from kvsim.workload.traces import read_azure, read_mooncake

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO.parent / "shared" / "traces"
AZURE_TRACE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE_TRACE = TRACES / "mooncake_fast25" / "conversation_trace.jsonl"
PAPER_TARBALL = REPO.parent / "shared" / "peers" / "vidur-7d47513.tar.gz"
PAPER_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
MAX_TOKENS, BLOCK_SIZE, MAX_SEQS = 4096, 16, 128
RF_SETTINGS = {"num_estimators": 32, "max_depth": 32, "min_samples_split": 2, "k_fold_cv_splits": 2,
               "num_training_job_threads": 1, "prediction_max_tokens_per_request": MAX_TOKENS,
               "prediction_max_prefill_chunk_size": MAX_TOKENS, "prediction_max_batch_size": MAX_SEQS}


@dataclass(frozen=True)
class Scenario:
    """One benchmark scenario: the requests, kvsim's engine and Vidur's replica scheduler."""

    name: str
    trace: Path
    num_requests: int
    rate_scale: float  # arrival times are divided by this
    kvsim_engine: dict[str, Any]
    num_blocks: int  # usable blocks: kvsim's pool less vLLM's null block, passed to Vidur
    vidur_scheduler: str  # "vllm" (prefill-first) or "sarathi" (chunked prefill)
    watermark: float
    kvsim_format: str  # kvsim's trace format: "azure" or "mooncake"


def usable_blocks(engine: dict[str, Any]) -> int:
    """kvsim's usable KV blocks for an engine (vLLM keeps one null block)."""
    return num_gpu_blocks(load_model(KVSIM_MODEL), load_gpu(KVSIM_GPU), EngineConfig(**engine)) - 1


def scenarios(num_requests: int | None = None) -> dict[str, Scenario]:
    """Both scenarios by name; `num_requests` cuts both traces shorter (tests, quick checks)."""
    azure_engine = {
        "block_size": BLOCK_SIZE, "max_num_seqs": MAX_SEQS, "max_num_batched_tokens": MAX_TOKENS,
        "max_model_len": MAX_TOKENS, "scheduler": "v0", "allocator": "paged", "enable_prefix_caching": False,
        "preemption_mode": "recompute", "watermark": 0.01}
    azure = Scenario("azure_conv", AZURE_TRACE, num_requests or 10_000, 0.7, azure_engine,
                     usable_blocks(azure_engine), "vllm", 0.01, "azure")
    mooncake = Scenario("mooncake_preempt_cache", MOONCAKE_TRACE, num_requests or 4_000, 0.4, {
        "block_size": BLOCK_SIZE, "max_num_seqs": MAX_SEQS, "max_num_batched_tokens": MAX_TOKENS,
        "max_model_len": MAX_TOKENS, "scheduler": "v1", "allocator": "paged", "enable_prefix_caching": True,
        "preemption_mode": "recompute", "num_gpu_blocks_override": 3000,
        "async_scheduling": False},  # Vidur's Sarathi steps are planned when they start, as kvsim's without it
        2999, "sarathi", 0.0, "mooncake")
    return {s.name: s for s in (azure, mooncake)}


@dataclass(frozen=True)
class TraceFiles:
    kvsim: Path
    vidur_paper: Path
    vidur_package: Path
    rows: list[dict[str, Any]]  # arrival_s, prompt, output per request, as all three files hold them


def convert_trace(scenario: Scenario, work: Path) -> TraceFiles:
    """The scenario's first requests, clipped and rescaled once, in each simulator's format."""
    if scenario.kvsim_format == "azure":
        records = read_azure(scenario.trace)[:scenario.num_requests]
    else:
        records = read_mooncake(scenario.trace)[:scenario.num_requests]
    if len(records) < scenario.num_requests:
        raise SystemExit(f"bench_vidur: {scenario.trace} has {len(records)} rows, "
                         f"fewer than {scenario.num_requests}")
    rows: list[dict[str, Any]] = []
    for rec in records:
        assert rec.arrival_s is not None  # both formats carry arrival times
        prompt = max(1, min(rec.prompt_len, MAX_TOKENS - rec.output_len))  # Vidur's max_tokens rule
        # rounded to microseconds: every simulator reads the same number
        rows.append({"arrival_s": round(rec.arrival_s / scenario.rate_scale, 6), "prompt": prompt,
                     "output": rec.output_len})
    work.mkdir(parents=True, exist_ok=True)
    files = TraceFiles(work / f"kvsim_trace.{'csv' if scenario.kvsim_format == 'azure' else 'jsonl'}",
                       work / "vidur_paper_trace.csv", work / "vidur_package_trace.csv", rows)
    if scenario.kvsim_format == "azure":
        _write_azure(rows, files.kvsim)
    else:
        _write_mooncake(rows, scenario.trace, files.kvsim)
    with files.vidur_paper.open("w", encoding="utf-8") as f:
        f.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        f.writelines(f"{r['arrival_s']!r},{r['prompt']},{r['output']}\n" for r in rows)
    with files.vidur_package.open("w", encoding="utf-8") as f:
        f.write("Date,Time,PromptTokenCount,CompletionTokenCount\n")
        f.writelines(f"2023-11-16,{r['arrival_s']!r},{r['prompt']},{r['output']}\n" for r in rows)
    return files


def _write_azure(rows: list[dict[str, Any]], path: Path) -> None:
    start = datetime(2023, 11, 16)
    with path.open("w", encoding="utf-8") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for r in rows:
            stamp = start + timedelta(microseconds=round(r["arrival_s"] * 1e6))
            f.write(f"{stamp:%Y-%m-%d %H:%M:%S.%f},{r['prompt']},{r['output']}\n")


def _write_mooncake(rows: list[dict[str, Any]], source: Path, path: Path) -> None:
    """Mooncake JSONL with the clipped prompts, their leading hash_ids and the rescaled arrivals (ms)."""
    with source.open(encoding="utf-8") as src, path.open("w", encoding="utf-8") as f:
        for r, line in zip(rows, src, strict=False):
            hash_ids = json.loads(line)["hash_ids"][:math.ceil(r["prompt"] / 512)]
            f.write(json.dumps({"timestamp": r["arrival_s"] * 1000, "input_length": r["prompt"],
                                "output_length": r["output"], "hash_ids": hash_ids}) + "\n")


def kvsim_scenario(scenario: Scenario, trace: Path) -> dict[str, Any]:
    """kvsim's scenario file (JSON is YAML) for the converted trace."""
    return {"name": f"vidur-side-by-side-{scenario.name}", "model": KVSIM_MODEL, "gpu": KVSIM_GPU,
            "engine": scenario.kvsim_engine,
            "workload": {"num_requests": scenario.num_requests, "arrival": {"process": "trace"},
                         "trace": {"format": scenario.kvsim_format, "path": str(trace)}},
            "seed": 0, "steps": "all"}


def _replica(scheduler_prefix: str, scenario: Scenario) -> list[str]:
    """Model, device, one replica at TP 1, and the scheduler's batch limits (flags both Vidurs share)."""
    budget = (["--vllm_scheduler_config_max_tokens_in_batch", str(MAX_TOKENS)] if scenario.vidur_scheduler == "vllm"
              else ["--sarathi_scheduler_config_chunk_size", str(MAX_TOKENS)])
    return ["--seed", "0", "--log_level", "warning", "--replica_config_model_name", VIDUR_MODEL,
            "--replica_config_device", VIDUR_DEVICE, "--replica_config_network_device", VIDUR_NETWORK,
            "--replica_config_tensor_parallel_size", "1", "--replica_config_num_pipeline_stages", "1",
            "--cluster_config_num_replicas", "1", "--replica_scheduler_config_type", scenario.vidur_scheduler,
            f"--{scheduler_prefix}_batch_size_cap", str(MAX_SEQS), *budget,
            "--request_generator_config_type", "trace_replay",
            "--trace_request_generator_config_max_tokens", str(MAX_TOKENS),
            "--trace_request_generator_config_prefill_scale_factor", "1",
            "--trace_request_generator_config_decode_scale_factor", "1",
            "--trace_request_generator_config_time_scale_factor", "1",
            "--execution_time_predictor_config_type", "random_forrest",
            *(f for k, v in RF_SETTINGS.items() for f in (f"--random_forrest_execution_time_predictor_config_{k}",
                                                          str(v))),
            "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace",
            "--metrics_config_keep_individual_batch_metrics"]


def vidur_paper_command(python: Path, scenario: Scenario, trace: Path, out: Path, profile: tuple[Path, Path],
                        cache: Path) -> list[str]:
    """`python -m vidur.main` of the paper's code (run from its unpacked root). Its pool, block
    size and watermark are scheduler flags; the decode-attention lookup granularity is set to the
    package's default of 256 tokens (the paper's default is 64) so both Vidurs predict alike."""
    rf, sched = "--random_forrest_execution_time_predictor_config_", f"{scenario.vidur_scheduler}_scheduler_config"
    return [str(python), "-m", "vidur.main", *_replica(sched, scenario),
            f"--{sched}_block_size", str(BLOCK_SIZE), f"--{sched}_num_blocks", str(scenario.num_blocks),
            f"--{sched}_watermark_blocks_fraction", str(scenario.watermark),
            "--trace_request_generator_config_trace_file", str(trace),
            rf + "compute_input_file", str(profile[0]), rf + "attention_input_file", str(profile[1]),
            # read only at TP > 1, PP > 1 or with CPU-overhead modelling (all off); no defaults ship
            rf + "all_reduce_input_file", "unused", rf + "send_recv_input_file", "unused",
            rf + "cpu_overhead_input_file", "unused", rf + "kv_cache_prediction_granularity", "256",
            "--metrics_config_output_dir", str(out), "--metrics_config_cache_dir", str(cache)]


def vidur_package_command(python: Path, scenario: Scenario, trace: Path, out: Path, datasets: tuple[str, str],
                          cache: Path) -> list[str]:
    """`python -m vidur.main` of vidur 0.0.26: the pool is a cache_config flag and the profiles
    are Hugging Face datasets, found offline in `cache` (vidur_profile.write_profile)."""
    rf, sched = "--random_forrest_execution_time_predictor_config_", f"{scenario.vidur_scheduler}_scheduler_config"
    return [str(python), "-m", "vidur.main", *_replica(sched, scenario),
            "--cache_config_block_size", str(BLOCK_SIZE), "--cache_config_num_blocks", str(scenario.num_blocks),
            "--cache_config_watermark_blocks_fraction", str(scenario.watermark),
            "--no-cache_config_enable_prefix_caching",  # the flag exists, but nothing simulates it
            "--trace_request_generator_config_trace_file", str(trace),
            "--trace_request_generator_config_date", "2023-11-16",
            rf + "model_profiling_dataset", datasets[0], rf + "network_profiling_dataset", datasets[1],
            rf + "cache_dir", str(cache), "--metrics_config_output_dir", str(out)]


def kvsim_outputs(out: Path) -> dict[str, Any]:
    """What kvsim computed: request latencies, steps, preemptions, prefix hits, and the files."""
    df = pd.read_csv(out / "requests.csv")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return {"num_requests": len(df), "mean_ttft_s": df["ttft_s"].mean(), "mean_e2e_s": df["e2e_s"].mean(),
            "p99_e2e_s": df["e2e_s"].quantile(0.99), "num_steps": summary["num_steps"],
            "num_preemptions": summary["num_preemptions"], "prefix_cache_hit_rate": summary["prefix_cache_hit_rate"],
            "files": sorted(p.name for p in out.iterdir())}


def vidur_outputs(out: Path) -> dict[str, Any]:
    """The same numbers from Vidur's request_metrics.csv and batch_metrics.csv (one row per batch)."""
    run = next(p for p in out.iterdir() if p.is_dir())
    df = pd.read_csv(next(run.rglob("request_metrics.csv")))
    batches = pd.read_csv(next(run.rglob("batch_metrics.csv")))
    return {"num_requests": len(df), "mean_ttft_s": df["prefill_e2e_time"].mean(),
            "mean_e2e_s": df["request_e2e_time"].mean(), "p99_e2e_s": df["request_e2e_time"].quantile(0.99),
            "num_steps": len(batches), "num_preemptions": int(df["request_num_restarts"].sum()),
            "prefix_cache_hit_rate": None,
            "files": sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())}


OUTPUT_READERS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "kvsim": kvsim_outputs, "kvsim_parquet": kvsim_outputs, "vidur_paper": vidur_outputs,
    "vidur_package": vidur_outputs}
