"""kvsim and Vidur side by side on the same 10k-request real trace, end to end, on one machine.

    bash benchmarks/setup_vidur.sh          # once: Vidur in its own venv ($VIDUR_VENV, /work/vidur-venv)
    python benchmarks/bench_vidur.py [--repeats 3] [--num-requests 10000] [--rate-scale 0.7]

The first `--num-requests` requests of the Azure LLM 2023 conversation trace (../shared/traces,
CC-BY 4.0, Patel et al., ISCA'24), arrivals divided by `--rate-scale`, prompts shortened so that
prompt + output fit Llama-2-7B's 4,096 tokens (Vidur's own rule), are written once as an Azure
CSV for kvsim and as Vidur's trace_replay CSV (Date, Time, PromptTokenCount,
CompletionTokenCount), so both simulate the identical requests. Each run is a fresh process doing
all of it: interpreter start, imports, loading the trace, simulating, writing its usual outputs
(`kvsim run -o DIR`: requests.csv, steps.csv with every step, summary; `python -m vidur.main`:
request and batch metrics CSVs and its Chrome trace; wandb off and plots off, as they need a
wandb project and kaleido). The runs alternate kvsim, Vidur, `--repeats` times; medians are
reported with the pure-Python baseline loop of bench_simulator.py measured in the same run, so
ratios compare across machines (`paired_vidur_over_kvsim` gives each adjacent pair's ratio and
`vidur_over_kvsim_cpu` the ratio of CPU seconds, both less disturbed by a busy machine). First,
untimed, Vidur runs the first 200 requests to train and cache its execution-time predictor (a
one-time cost per profile; `vidur_warmup_s`).

Matched: model (Llama-2-7B), GPU (A100-80GB), TP 1, block size 16, KV pool (kvsim's usable
blocks passed to Vidur's num_blocks), 1 % admission watermark, max_num_seqs = batch_size_cap = 128,
max_num_batched_tokens = max_tokens_in_batch = 4,096, no chunked prefill and no prefix caching
(kvsim scheduler v0; Vidur's vLLM scheduler, prefill-first), recompute preemption, and the
per-layer step-time terms (see vidur_profile.py). Not matched: see NOT_MATCHED. Writes
benchmarks/results/vidur.json. Takes about 3 minutes on an idle 2-core machine at today's speeds
(a Vidur run is ~35 CPU seconds, a kvsim run ~5), 7-10 minutes on one shared by busy sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from bench_simulator import baseline  # the same interpreter-speed loop, in this run
from vidur_profile import KVSIM_GPU, KVSIM_MODEL, VIDUR_DEVICE, VIDUR_MODEL, VIDUR_NETWORK, write_profile

from kvsim.model.capacity import num_gpu_blocks
from kvsim.model.config import EngineConfig, load_gpu, load_model
from kvsim.model.version import __version__ as kvsim_version
from kvsim.workload.traces import read_azure

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
MAX_TOKENS, BLOCK_SIZE, MAX_SEQS = 4096, 16, 128
# Arrivals slowed to 0.7x the trace's rate (3.9 req/s over these 10k requests): at 1.0 both queue for
# minutes, and Vidur 0.0.26 preempts there, which trips its own assertion (Request.restart() keeps
# _num_stage_processed_tokens), so the run would not finish.
RATE_SCALE = 0.7
WARMUP_REQUESTS = 200
ENGINE: dict[str, Any] = {
    "block_size": BLOCK_SIZE, "max_num_seqs": MAX_SEQS, "max_num_batched_tokens": MAX_TOKENS,
    "max_model_len": MAX_TOKENS, "scheduler": "v0", "allocator": "paged", "enable_prefix_caching": False,
    "preemption_mode": "recompute", "watermark": 0.01}
NOT_MATCHED = [
    "Vidur prices only the transformer blocks; kvsim adds the LM head, sampler and a CPU overhead per step "
    "(0.2 ms + 5 us per sequence), so kvsim's steps are slightly longer",
    "Vidur fits a random forest to the profile tables and looks decode attention up at the batch's mean "
    "context rounded up to 256 tokens; kvsim evaluates the roofline at each step's exact token counts",
    "Vidur prices a prefill's attention as if its own prompt were already cached (kv_cache_size = "
    "num_kv_tokens, which includes the new tokens); kvsim counts only earlier tokens",
    "Vidur counts each request's blocks (a number per request); kvsim tracks every block as vLLM does "
    "(ids, block tables, reference counts, free queue), which is part of what it spends its time on",
    "the trace's own rate: both run at 0.7x it, because at 1.0 Vidur 0.0.26 preempts and stops on its own "
    "assertion (Request.restart() keeps _num_stage_processed_tokens)",
    "Vidur's random forest grid is cut to one setting (32 trees, depth 32, 2-fold) to train in seconds on "
    "2 cores; its predictions are cached and looked up, so this does not change its simulation speed",
    "Vidur's execution-time predictor is its default Python path (use_native_execution_time_predictor off)",
]


def convert_trace(num_requests: int, rate_scale: float, work: Path) -> tuple[Path, Path, list[dict]]:
    """The first `num_requests` rows as kvsim's Azure CSV and Vidur's trace_replay CSV."""
    records = read_azure(TRACE)[:num_requests]
    if len(records) < num_requests:
        raise SystemExit(f"bench_vidur: {TRACE} has {len(records)} rows, fewer than --num-requests {num_requests}")
    rows: list[dict[str, Any]] = []
    for rec in records:
        assert rec.arrival_s is not None  # every Azure row has a timestamp
        prompt = max(1, min(rec.prompt_len, MAX_TOKENS - rec.output_len))  # Vidur's max_tokens rule
        # rounded to microseconds: both simulators read the same number
        rows.append({"arrival_s": round(rec.arrival_s / rate_scale, 6), "prompt": prompt, "output": rec.output_len})
    start = datetime(2023, 11, 16)
    kvsim_csv, vidur_csv = work / "kvsim_trace.csv", work / "vidur_trace.csv"
    with kvsim_csv.open("w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for r in rows:
            stamp = start + timedelta(microseconds=round(r["arrival_s"] * 1e6))
            f.write(f"{stamp:%Y-%m-%d %H:%M:%S.%f},{r['prompt']},{r['output']}\n")
    with vidur_csv.open("w") as f:
        f.write("Date,Time,PromptTokenCount,CompletionTokenCount\n")
        for r in rows:
            f.write(f"2023-11-16,{r['arrival_s']!r},{r['prompt']},{r['output']}\n")
    return kvsim_csv, vidur_csv, rows


def usable_blocks() -> int:
    """kvsim's usable KV blocks for the matched engine (vLLM keeps one null block)."""
    engine = EngineConfig(**ENGINE)
    return num_gpu_blocks(load_model(KVSIM_MODEL), load_gpu(KVSIM_GPU), engine) - 1


def vidur_command(venv: Path, trace: Path, out: Path, datasets: tuple[str, str], num_blocks: int) -> list[str]:
    rf = "--random_forrest_execution_time_predictor_config_"
    return [
        str(venv / "bin" / "python"), "-m", "vidur.main", "--seed", "0", "--log_level", "warning",
        "--replica_config_model_name", VIDUR_MODEL, "--replica_config_device", VIDUR_DEVICE,
        "--replica_config_network_device", VIDUR_NETWORK, "--replica_config_tensor_parallel_size", "1",
        "--replica_config_num_pipeline_stages", "1", "--cluster_config_num_replicas", "1",
        "--replica_scheduler_config_type", "vllm", "--vllm_scheduler_config_batch_size_cap", str(MAX_SEQS),
        "--vllm_scheduler_config_max_tokens_in_batch", str(MAX_TOKENS),
        "--cache_config_block_size", str(BLOCK_SIZE), "--cache_config_num_blocks", str(num_blocks),
        "--cache_config_watermark_blocks_fraction", "0.01", "--no-cache_config_enable_prefix_caching",
        "--request_generator_config_type", "trace_replay", "--trace_request_generator_config_trace_file", str(trace),
        "--trace_request_generator_config_date", "2023-11-16",
        "--trace_request_generator_config_prefill_scale_factor", "1",
        "--trace_request_generator_config_decode_scale_factor", "1",
        "--trace_request_generator_config_time_scale_factor", "1",
        "--trace_request_generator_config_max_tokens", str(MAX_TOKENS),
        "--execution_time_predictor_config_type", "random_forrest",
        rf + "model_profiling_dataset", datasets[0], rf + "network_profiling_dataset", datasets[1],
        rf + "cache_dir", str(venv / "vidur-cache"), rf + "prediction_max_tokens_per_request", str(MAX_TOKENS),
        rf + "prediction_max_prefill_chunk_size", str(MAX_TOKENS), rf + "prediction_max_batch_size", str(MAX_SEQS),
        rf + "num_estimators", "32", rf + "max_depth", "32", rf + "min_samples_split", "2",
        rf + "k_fold_cv_splits", "2", rf + "num_training_job_threads", "1",
        "--metrics_config_output_dir", str(out), "--no-metrics_config_store_plots",
    ]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> dict:
    """Wall and CPU seconds (user + system, which a busy machine disturbs less) of one fresh
    process; exits with its last stderr line if it fails."""
    cpu, start = _children_cpu_s(), time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate()
    wall, cpu = time.perf_counter() - start, _children_cpu_s() - cpu
    if proc.returncode:
        raise SystemExit(f"bench_vidur: `{' '.join(cmd[:3])} ...` exited {proc.returncode}: "
                         f"{stderr.strip().splitlines()[-1] if stderr.strip() else ''}")
    return {"wall_s": wall, "cpu_s": cpu}


def kvsim_outputs(out: Path) -> dict:
    df = pd.read_csv(out / "requests.csv")
    summary = json.loads((out / "summary.json").read_text())
    return {"num_requests": len(df), "mean_ttft_s": df["ttft_s"].mean(), "mean_e2e_s": df["e2e_s"].mean(),
            "p99_e2e_s": df["e2e_s"].quantile(0.99), "num_steps": summary["num_steps"],
            "num_preemptions": summary["num_preemptions"], "files": sorted(p.name for p in out.iterdir())}


def vidur_outputs(out: Path) -> dict:
    run = next(p for p in out.iterdir() if p.is_dir())
    df = pd.read_csv(next(run.rglob("request_metrics.csv")))
    trace = json.loads((run / "chrome_trace.json").read_text())["traceEvents"]  # one event per batch
    return {"num_requests": len(df), "mean_ttft_s": df["prefill_e2e_time"].mean(),
            "mean_e2e_s": df["request_e2e_time"].mean(), "p99_e2e_s": df["request_e2e_time"].quantile(0.99),
            "num_steps": sum(e.get("ph") == "X" for e in trace),
            "num_preemptions": int(df["request_num_restarts"].sum()),
            "files": sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--rate-scale", type=float, default=RATE_SCALE,
                        help="divide the trace's arrival times by this (default: %(default)s)")
    parser.add_argument("--vidur-venv", type=Path, default=Path(os.environ.get("VIDUR_VENV", "/work/vidur-venv")))
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "vidur.json")
    args = parser.parse_args()
    venv = args.vidur_venv
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import vidur.main, vidur; print(vidur.__version__)"],
                           env=env, capture_output=True, text=True) if (venv / "bin" / "python").exists() else None
    if probe is None or probe.returncode:
        sys.exit(f"bench_vidur: no working Vidur in {venv} (VIDUR_VENV); run `bash benchmarks/setup_vidur.sh` first")
    vidur_version = probe.stdout.strip()
    kvsim = REPO / ".venv" / "bin" / "kvsim" if (REPO / ".venv" / "bin" / "kvsim").exists() else Path(
        shutil.which("kvsim") or "kvsim")
    with tempfile.TemporaryDirectory(prefix="bench-vidur-") as tmp:
        work = Path(tmp)
        kvsim_trace, vidur_trace, rows = convert_trace(args.num_requests, args.rate_scale, work)
        scenario = {"name": "vidur-side-by-side", "model": KVSIM_MODEL, "gpu": KVSIM_GPU, "engine": ENGINE,
                    "workload": {"num_requests": args.num_requests, "arrival": {"process": "trace"},
                                 "trace": {"format": "azure", "path": str(kvsim_trace)}},
                    "seed": 0, "steps": "all"}
        (work / "scenario.yaml").write_text(json.dumps(scenario))  # JSON is YAML
        datasets = write_profile(venv / "vidur-cache", BLOCK_SIZE, MAX_TOKENS, MAX_SEQS)
        num_blocks = usable_blocks()
        runs: dict[str, list[dict]] = {"kvsim": [], "vidur": []}
        commands = {
            "kvsim": lambda out: [str(kvsim), "run", str(work / "scenario.yaml"), "-o", str(out)],
            "vidur": lambda out: vidur_command(venv, vidur_trace, out, datasets, num_blocks),
        }
        (work / "warmup").mkdir()  # a short run trains and caches Vidur's predictor, untimed
        warmup_trace = convert_trace(WARMUP_REQUESTS, args.rate_scale, work / "warmup")[1]
        warmup = timed(vidur_command(venv, warmup_trace, work / "warmup" / "out", datasets, num_blocks), env,
                       work)["wall_s"]
        base = statistics.median(baseline(200_000, 64) for _ in range(3))  # as bench_scale.py
        outputs = {}
        for i in range(args.repeats):
            for name in ("kvsim", "vidur"):
                out = work / f"{name}-{i}"
                runs[name].append(timed(commands[name](out), env, work))
                print(f"{name} run {i + 1}: {runs[name][-1]['wall_s']:.1f} s ({runs[name][-1]['cpu_s']:.1f} s CPU)",
                      flush=True)
                if i == 0:
                    outputs[name] = kvsim_outputs(out) if name == "kvsim" else vidur_outputs(out)
                shutil.rmtree(out)
    median = {name: statistics.median(r["wall_s"] for r in rs) for name, rs in runs.items()}
    median_cpu = {name: statistics.median(r["cpu_s"] for r in rs) for name, rs in runs.items()}
    result = {
        "benchmark": "vidur side by side", "python": platform.python_version(), "machine": platform.machine(),
        "kvsim_version": kvsim_version, "vidur_version": vidur_version,
        "trace": {"file": str(TRACE.relative_to(REPO.parent)), "num_requests": args.num_requests,
                  "rate_scale": args.rate_scale, "span_s": rows[-1]["arrival_s"],
                  "mean_prompt_tokens": statistics.fmean(r["prompt"] for r in rows),
                  "mean_output_tokens": statistics.fmean(r["output"] for r in rows)},
        "matched": {"model": f"{KVSIM_MODEL} = {VIDUR_MODEL}", "gpu": f"{KVSIM_GPU} = {VIDUR_DEVICE}",
                    "kvsim_engine": ENGINE, "num_blocks": num_blocks, "vidur_scheduler": "vllm",
                    "profile": f"{datasets[0]} (kvsim roofline per-layer terms, benchmarks/vidur_profile.py)"},
        "not_matched": NOT_MATCHED,
        "repeats": args.repeats, "runs_s": {n: [r["wall_s"] for r in rs] for n, rs in runs.items()},
        "runs_cpu_s": {n: [r["cpu_s"] for r in rs] for n, rs in runs.items()}, "median_cpu_s": median_cpu,
        "vidur_over_kvsim_cpu": median_cpu["vidur"] / median_cpu["kvsim"],
        "median_s": median, "kvsim_over_vidur": median["kvsim"] / median["vidur"],
        "vidur_over_kvsim": median["vidur"] / median["kvsim"],
        "paired_vidur_over_kvsim": [v["wall_s"] / k["wall_s"]
                                    for k, v in zip(runs["kvsim"], runs["vidur"], strict=True)],
        "vidur_warmup_s": warmup, "vidur_warmup_requests": WARMUP_REQUESTS,
        "baseline_loop_s": base, "ratio_to_baseline": {n: s / base for n, s in median.items()},
        "outputs": outputs,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"kvsim {median['kvsim']:.1f} s, Vidur {median['vidur']:.1f} s end to end (medians of {args.repeats}): "
          f"kvsim is {result['vidur_over_kvsim']:.1f}x faster ({result['vidur_over_kvsim_cpu']:.1f}x in CPU "
          f"seconds); baseline loop {base:.2f} s")


if __name__ == "__main__":
    main()
