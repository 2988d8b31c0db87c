"""kvsim and Vidur (the paper's code and the 0.0.26 package) on the same real traces, whole processes, CPU seconds.

    bash benchmarks/setup_vidur.sh          # once: vidur 0.0.26 in $VIDUR_VENV (default /work/vidur-venv)
    bash benchmarks/setup_vidur_paper.sh    # once: microsoft/vidur @ 7d47513 in $VIDUR_PAPER (/tmp/vidur-paper)
    python benchmarks/bench_vidur.py [--repeats 5] [--scenarios azure_conv mooncake_preempt_cache]

Each scenario (vidur_sides.py: the requests, what is matched, what each side writes) is converted
once into every simulator's trace format, so all simulate the identical requests. Each run is a
fresh process doing everything: interpreter start, imports, loading the trace, simulating, writing
per-request and per-step (per-batch) rows. The headline is whole-process CPU seconds (user + system
of the child, from getrusage(RUSAGE_CHILDREN)), which a machine shared with other work disturbs
less than wall time. Per repeat the sides alternate: kvsim (steps.csv), Vidur paper, kvsim
(steps.parquet), Vidur package; each Vidur run's ratio is taken to the kvsim run just before it and
to the other kvsim run of the same repeat, and the medians of those per-repeat ratios are reported
beside the ratios of medians. /proc/loadavg is recorded before and after every run. First, untimed,
every side runs the scenario's first 200 requests: Vidur trains and caches its execution-time
predictor (a one-time cost per profile), and both write their bytecode caches.

Step times come from the same per-layer terms (vidur_profile.py writes Vidur's profile tables
from kvsim's roofline). What is not matched is listed in NOT_MATCHED and per scenario. A side that
fails (vidur 0.0.26 stops on its own assertion at its first preemption) is recorded with its error
and left out of later repeats. Writes benchmarks/results/vidur.json; its top-level fields keep their
earlier meaning (azure_conv, kvsim with Parquet steps against the 0.0.26 package, wall-clock pairs);
`scenarios` and `headline` hold the rest. About 30-40 minutes with 5 repeats on 2 busy cores.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from pathlib import Path
from typing import Any

from bench_simulator import baseline  # the same interpreter-speed loop, in this run
from result_file import check_result_file, one_line, write_result_file
from vidur_profile import write_csv_profile, write_profile
from vidur_sides import (
    AZURE_TRACE,
    BLOCK_SIZE,
    MAX_SEQS,
    MAX_TOKENS,
    OUTPUT_READERS,
    PAPER_COMMIT,
    REPO,
    Scenario,
    convert_trace,
    kvsim_scenario,
    scenarios,
    vidur_package_command,
    vidur_paper_command,
)

from kvsim.model.version import __version__ as kvsim_version

TRACE = AZURE_TRACE  # the first scenario's trace (tests/test_bench_vidur.py checks for it)
WARMUP_REQUESTS = 200
SIDES = ("kvsim", "vidur_paper", "kvsim_parquet", "vidur_package")  # the order within a repeat
PAIRS = {"vidur_paper": ("kvsim", "kvsim_parquet"), "vidur_package": ("kvsim_parquet", "kvsim")}  # adjacent first
NOT_MATCHED = [
    "Vidur prices only the transformer blocks; kvsim adds the LM head, sampler and a CPU overhead per step "
    "(0.2 ms + 5 us per sequence), so kvsim's steps are slightly longer",
    "Vidur fits a random forest to the profile tables and looks decode attention up at the batch's mean "
    "context rounded up to 256 tokens (the package's default; the paper's code is given 256 instead of its "
    "default 64 so both Vidurs predict alike); kvsim evaluates the roofline at each step's exact token counts",
    "Vidur prices a prefill's attention as if its own prompt were already cached (kv_cache_size = "
    "num_kv_tokens, which includes the new tokens); kvsim counts only earlier tokens",
    "Vidur counts each request's blocks (a number per request); kvsim tracks every block as vLLM does "
    "(ids, block tables, reference counts, free queue, content hashes when caching), which is part of what "
    "it spends its time on",
    "the paper's vllm scheduler caps a prefill batch at batch size x its longest prompt <= max_tokens_in_batch "
    "(padded); vidur 0.0.26's and kvsim's v0 sum the batch's tokens",
    "Vidur's random forest grid is cut to one setting (32 trees, depth 32, 2-fold) to train in seconds on "
    "2 cores; its predictions are cached and looked up, so this does not change its simulation speed",
    "Vidur's execution-time predictor is its default Python path (the package's "
    "use_native_execution_time_predictor off; the paper's code has no native path)",
    "outputs: both Vidurs write request_metrics.csv, batch_metrics.csv (one row per batch) and plots/*.csv "
    "(per-request series, CDFs), with plots and the Chrome trace off; kvsim writes requests.csv, every step "
    "to steps.csv (the headline) or steps.parquet, and summary.json",
]
SCENARIO_NOTES = {
    "azure_conv": ["the trace's own rate: all run at 0.7x it, because at 1.0 Vidur 0.0.26 preempts and stops on "
                   "its own assertion (Request.restart() keeps _num_stage_processed_tokens)"],
    "mooncake_preempt_cache": [
        "prefix caching: kvsim caches (the trace's 512-token hash_ids decide which 16-token blocks hit); neither "
        "Vidur can: the paper's code has no prefix cache and its requests carry no content, and vidur 0.0.26's "
        "--cache_config_enable_prefix_caching is stored but read by no simulation code (passed off), so Vidur "
        "computes every prompt token and its latencies are not comparable",
        "chunked prefill: kvsim's v1 (running requests first in admission order, then waiting ones FCFS, "
        "token budget 4,096) against Vidur's sarathi scheduler (decodes, then running prefills, then new "
        "requests, chunk_size 4,096); both preempt the most recently arrived running request by recompute",
        "vidur 0.0.26 cannot finish this scenario: it stops on its own assertion "
        "(Request.on_batch_stage_end: _num_stage_processed_tokens <= total_tokens) after its first preemption",
        "Mooncake prompts (mean 12k tokens) are clipped to 4,096 - output tokens for Llama-2-7B's context; "
        "the hash_ids are cut with them, so the shared leading blocks stay shared",
    ],
}


class RunFailed(Exception):
    """A side's process exited non-zero; the message is its last stderr line."""


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _loadavg() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3]]


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """Wall and CPU seconds (user + system of the whole child process) of one fresh process,
    with the 1/5/15-minute load averages before and after; RunFailed if it exits non-zero."""
    load, cpu, start = _loadavg(), _children_cpu_s(), time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate()
    wall, cpu = time.perf_counter() - start, _children_cpu_s() - cpu
    if proc.returncode:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        raise RunFailed(f"exited {proc.returncode} after {cpu:.1f} CPU s: {' | '.join(lines[-2:])}")
    return {"wall_s": wall, "cpu_s": cpu, "loadavg_before": load, "loadavg_after": _loadavg()}


@dataclasses.dataclass(frozen=True)
class Setup:
    """Where each side's interpreter, code and caches are."""

    kvsim: Path
    package_python: Path | None
    paper_root: Path | None  # unpacked source with venv/ beside src/
    work: Path
    env: dict[str, str]

    def commands(self, scenario: Scenario, work: Path) -> dict[str, tuple[Any, Path]]:
        """side -> (function of the output folder returning the command, the folder to run it in)."""
        files = convert_trace(scenario, work)
        (work / "scenario.yaml").write_text(json.dumps(kvsim_scenario(scenario, files.kvsim)), encoding="utf-8")
        kvsim = [str(self.kvsim), "run", str(work / "scenario.yaml")]
        out: dict[str, tuple[Any, Path]] = {
            "kvsim": (lambda o: [*kvsim, "-o", str(o), "--steps-format", "csv"], work),
            "kvsim_parquet": (lambda o: [*kvsim, "-o", str(o), "--steps-format", "parquet"], work)}
        if self.paper_root is not None:
            profile = write_csv_profile(self.paper_root / "profiles", BLOCK_SIZE, MAX_TOKENS, MAX_SEQS)
            python, cache = self.paper_root / "venv" / "bin" / "python", self.paper_root / "cache"
            out["vidur_paper"] = (lambda o: vidur_paper_command(python, scenario, files.vidur_paper, o, profile, cache),
                                  self.paper_root / "src")
        if self.package_python is not None:
            cache = self.package_python.parent.parent / "vidur-cache"
            datasets = write_profile(cache, BLOCK_SIZE, MAX_TOKENS, MAX_SEQS)
            out["vidur_package"] = (lambda o: vidur_package_command(
                self.package_python, scenario, files.vidur_package, o, datasets, cache), work)
        return out


def _median_ratio(num: list[dict], den: list[dict], key: str) -> float | None:
    ratios = [n[key] / d[key] for n, d in zip(num, den, strict=False)]
    return statistics.median(ratios) if ratios else None


def run_scenario(scenario: Scenario, setup: Setup, repeats: int) -> dict[str, Any]:
    """Warm-up, then `repeats` rounds of the sides in SIDES order; medians and per-repeat ratios."""
    work = setup.work / scenario.name
    commands = setup.commands(scenario, work)
    warm = setup.commands(dataclasses.replace(scenario, num_requests=WARMUP_REQUESTS), work / "warmup")
    warmup_s, failures, outputs = {}, {}, {}
    for side in commands:
        try:
            warmup_s[side] = timed(warm[side][0](work / "warmup" / side), setup.env, warm[side][1])["wall_s"]
        except RunFailed as e:  # the predictor is trained and cached before simulating starts
            warmup_s[side] = f"failed: {e}"
    runs: dict[str, list[dict]] = {side: [] for side in SIDES if side in commands}
    for i in range(repeats):
        for side in runs:
            if side in failures:
                continue
            out = work / f"{side}-{i}"
            try:
                runs[side].append(timed(commands[side][0](out), setup.env, commands[side][1]))
            except RunFailed as e:
                failures[side] = str(e)
                print(f"{scenario.name} {side} failed: {e}", flush=True)
                continue
            r = runs[side][-1]
            print(f"{scenario.name} {side} run {i + 1}: {r['cpu_s']:.1f} CPU s, {r['wall_s']:.1f} s wall, "
                  f"load {r['loadavg_before'][0]:.1f} -> {r['loadavg_after'][0]:.1f}", flush=True)
            if i == 0:
                outputs[side] = OUTPUT_READERS[side](out)
            shutil.rmtree(out)
    rows = convert_trace(scenario, work / "rows").rows
    result: dict[str, Any] = {
        "trace": {"file": str(scenario.trace.relative_to(REPO.parent)), "num_requests": scenario.num_requests,
                  "rate_scale": scenario.rate_scale, "span_s": rows[-1]["arrival_s"],
                  "mean_prompt_tokens": statistics.mean(r["prompt"] for r in rows),
                  "mean_output_tokens": statistics.mean(r["output"] for r in rows)},
        "kvsim_engine": scenario.kvsim_engine, "num_blocks": scenario.num_blocks,
        "vidur_scheduler": scenario.vidur_scheduler, "vidur_watermark_blocks_fraction": scenario.watermark,
        "not_matched": SCENARIO_NOTES[scenario.name], "warmup_s": warmup_s, "failures": failures,
        "runs": {side: rs for side, rs in runs.items() if rs},
        "median_cpu_s": {side: statistics.median(r["cpu_s"] for r in rs) for side, rs in runs.items() if rs},
        "median_wall_s": {side: statistics.median(r["wall_s"] for r in rs) for side, rs in runs.items() if rs},
        "outputs": outputs}
    cpu = result["median_cpu_s"]
    result["cpu_ratio_of_medians"] = {f"{v}/{k}": cpu[v] / cpu[k] for v, ks in PAIRS.items() for k in ks
                                      if v in cpu and k in cpu}
    result["median_paired_cpu_ratio"] = {f"{v}/{k}": _median_ratio(runs[v], runs[k], "cpu_s")
                                         for v, ks in PAIRS.items() for k in ks if runs.get(v) and runs.get(k)}
    result["paired_cpu_ratios"] = {f"{v}/{k}": [n["cpu_s"] / d["cpu_s"] for n, d in zip(runs[v], runs[k],
                                                                                        strict=False)]
                                   for v, ks in PAIRS.items() for k in ks if runs.get(v) and runs.get(k)}
    return result


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def _legacy(azure: dict[str, Any], base: float) -> dict[str, Any]:
    """The fields vidur.json had before the paper's code joined: azure_conv, kvsim (Parquet steps,
    its default with pyarrow) against vidur 0.0.26, wall-clock pairs."""
    k, v = azure["runs"]["kvsim_parquet"], azure["runs"]["vidur_package"]
    median = {"kvsim": azure["median_wall_s"]["kvsim_parquet"], "vidur": azure["median_wall_s"]["vidur_package"]}
    median_cpu = {"kvsim": azure["median_cpu_s"]["kvsim_parquet"], "vidur": azure["median_cpu_s"]["vidur_package"]}
    return {"runs_s": {"kvsim": [r["wall_s"] for r in k], "vidur": [r["wall_s"] for r in v]},
            "runs_cpu_s": {"kvsim": [r["cpu_s"] for r in k], "vidur": [r["cpu_s"] for r in v]},
            "median_cpu_s": median_cpu, "vidur_over_kvsim_cpu": median_cpu["vidur"] / median_cpu["kvsim"],
            "median_s": median, "kvsim_over_vidur": median["kvsim"] / median["vidur"],
            "vidur_over_kvsim": median["vidur"] / median["kvsim"],
            "paired_vidur_over_kvsim": [b["wall_s"] / a["wall_s"] for a, b in zip(k, v, strict=False)],
            "vidur_warmup_s": azure["warmup_s"].get("vidur_package"), "vidur_warmup_requests": WARMUP_REQUESTS,
            "ratio_to_baseline": {n: s / base for n, s in median.items()},
            "outputs": {"kvsim": azure["outputs"]["kvsim_parquet"], "vidur": azure["outputs"]["vidur_package"]}}


def _probe(python: Path, cwd: Path, env: dict[str, str]) -> str | None:
    """Vidur's version if `python -m vidur.main` imports there, else None."""
    if not python.exists():
        return None
    code = "import vidur.main, vidur; print(getattr(vidur, '__version__', 'paper'))"
    probe = subprocess.run([str(python), "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    return probe.stdout.strip() if probe.returncode == 0 else None


# the result's keys: --output replaces only such a JSON object (result_file.py)
RESULT_KEYS = frozenset({"baseline_loop_s", "benchmark", "cpus", "duration_s", "headline", "kvsim_commit",
                          "kvsim_over_vidur", "kvsim_tree_dirty", "kvsim_version", "loadavg_end", "loadavg_start",
                          "machine", "matched", "median_cpu_s", "median_s", "not_matched", "outputs",
                          "paired_vidur_over_kvsim", "python", "ratio_to_baseline", "repeats", "runs_cpu_s",
                          "runs_s", "scenarios", "started_utc", "trace", "vidur_over_kvsim", "vidur_over_kvsim_cpu",
                          "vidur_paper_commit", "vidur_version", "vidur_warmup_requests", "vidur_warmup_s"})


def write_scenarios(folder: Path, names: list[str], num_requests: int | None) -> None:
    """`--write-scenarios DIR`: each scenario's traces and kvsim scenario.yaml under DIR/NAME, DIR new or this
    option's earlier output, replaced whole when all are written (it wrote over any files there), else exit 2."""
    from kvsim.results.output_checks import check_output_dir
    from kvsim.results.output_dir import output_directory

    with one_line("bench_vidur.py", "--write-scenarios"):
        final = check_output_dir(folder, "vidur-scenarios")  # where output_directory puts it: `gone/../out` is `out`
        with output_directory(folder, "vidur-scenarios") as tmp:
            for name in names:
                scenario = scenarios(num_requests)[name]
                files = convert_trace(scenario, tmp / name)
                trace = final / name / files.kvsim.name  # where it will be once the folder is in place
                (tmp / name / "scenario.yaml").write_text(json.dumps(kvsim_scenario(scenario, trace)), encoding="utf-8")
    for name in names:
        print(final / name / "scenario.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scenarios", nargs="+", choices=["azure_conv", "mooncake_preempt_cache"],
                        default=["azure_conv", "mooncake_preempt_cache"])
    parser.add_argument("--num-requests", type=int, default=None, help="cut every trace to this many requests")
    parser.add_argument("--vidur-venv", type=Path, default=Path(os.environ.get("VIDUR_VENV", "/work/vidur-venv")))
    parser.add_argument("--vidur-paper", type=Path, default=Path(os.environ.get("VIDUR_PAPER", "/tmp/vidur-paper")))
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "vidur.json")
    parser.add_argument("--write-scenarios", type=Path, metavar="DIR",
                        help="only write each scenario's traces and kvsim scenario.yaml under DIR (to profile "
                             "kvsim on exactly these runs) and exit")
    args = parser.parse_args()
    if args.write_scenarios:
        write_scenarios(args.write_scenarios, args.scenarios, args.num_requests)
        return
    check_result_file("bench_vidur.py", args.output, RESULT_KEYS)  # before it runs, not after
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # the warm-up writes every side's bytecode caches (a user's installed package has them): an inherited
    # PYTHONDONTWRITEBYTECODE would make each timed run recompile its own modules from source instead
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    package = _probe(args.vidur_venv / "bin" / "python", REPO, env)
    paper = _probe(args.vidur_paper / "venv" / "bin" / "python", args.vidur_paper / "src", env)
    if package is None or paper is None:
        sys.exit(f"bench_vidur: Vidur missing (package in {args.vidur_venv}: {package}, paper code in "
                 f"{args.vidur_paper}: {paper}); run benchmarks/setup_vidur.sh and setup_vidur_paper.sh first")
    kvsim = REPO / ".venv" / "bin" / "kvsim" if (REPO / ".venv" / "bin" / "kvsim").exists() else Path(
        shutil.which("kvsim") or "kvsim")
    load_start, started = _loadavg(), time.time()
    with tempfile.TemporaryDirectory(prefix="bench-vidur-") as tmp:
        setup = Setup(kvsim, args.vidur_venv / "bin" / "python", args.vidur_paper, Path(tmp), env)
        base = statistics.median(baseline(200_000, 64) for _ in range(3))  # as bench_scale.py
        chosen = scenarios(args.num_requests)
        results = {name: run_scenario(chosen[name], setup, args.repeats) for name in args.scenarios}
    headline = {"metric": "whole-process CPU seconds (user + sys of the child, getrusage RUSAGE_CHILDREN); "
                          "median over repeats of each Vidur run's ratio to the kvsim run just before it "
                          "(kvsim writing every step to steps.csv, as Vidur writes CSV)",
                "target_vidur_paper_over_kvsim": 10.0}
    for name, res in results.items():
        ratios = res["median_paired_cpu_ratio"]
        headline[name] = {"vidur_paper_over_kvsim_cpu": ratios.get("vidur_paper/kvsim"),
                          "vidur_package_over_kvsim_cpu": ratios.get("vidur_package/kvsim"),
                          "vidur_package_failed": res["failures"].get("vidur_package")}
    result = {
        "benchmark": "vidur side by side", "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "kvsim_version": kvsim_version, "kvsim_commit": _git("rev-parse", "HEAD"),
        "kvsim_tree_dirty": bool(_git("status", "--porcelain", "--", "kvsim")), "vidur_version": package,
        "vidur_paper_commit": PAPER_COMMIT, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "loadavg_start": load_start, "loadavg_end": _loadavg(), "duration_s": time.time() - started,
        "repeats": args.repeats, "baseline_loop_s": base, "headline": headline,
        "matched": {"model": "llama-2-7b = meta-llama/Llama-2-7b-hf", "gpu": "a100-80gb = a100", "tp": 1,
                    "block_size": BLOCK_SIZE, "max_num_seqs = batch_size_cap": MAX_SEQS,
                    "max_num_batched_tokens = max_tokens_in_batch or chunk_size": MAX_TOKENS,
                    "max_model_len = max_tokens": MAX_TOKENS, "preemption": "recompute",
                    "profile": "kvsim roofline per-layer terms (benchmarks/vidur_profile.py), the same tables "
                               "as a Hugging Face dataset for the package and as CSVs for the paper's code"},
        "not_matched": NOT_MATCHED, "scenarios": results,
    }
    if "azure_conv" in results and {"kvsim_parquet", "vidur_package"} <= results["azure_conv"]["runs"].keys():
        result["trace"] = results["azure_conv"]["trace"]
        result.update(_legacy(results["azure_conv"], base))
    result.update(dict.fromkeys(RESULT_KEYS - result.keys()))  # null where not measured: always RESULT_KEYS
    write_result_file("bench_vidur.py", args.output, RESULT_KEYS, result)
    for name in results:
        print(f"{name}: {json.dumps(headline[name])}; median CPU s {json.dumps(results[name]['median_cpu_s'])}")


if __name__ == "__main__":
    main()
