"""Simulation speed of this checkout against a reference revision, measured side by side in one run.

    python benchmarks/bench_speedup.py [--reference REV] [--num-requests 10000] [--repeats 3]

Each run is a fresh child process that simulates the built-in default scenario (`kvsim run`'s:
llama-3.1-8b on an h100-80gb, v1, paged, prefix caching) with `--num-requests` requests and
no per-step rows kept (`steps=none`), and times `simulate` alone (import and writing excluded).
The reference revision is exported with `git archive` to a temporary folder and imported from
there (`PYTHONPATH`); runs alternate between the two so that machine load hits both alike.
Also measured here: the overload pair of issue 9 (`bench_scale.OVERLOAD`, prefix caching on vs
off) for this checkout, and the pure-Python baseline loop, so times are also given as ratios.
Both runs must produce the same summary (the speed-up is only worth something if exact).
Writes `benchmarks/results/speedup.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_scale import OVERLOAD
from bench_simulator import baseline
from result_file import check_result_file, write_result_file

ROOT = Path(__file__).resolve().parent.parent
PINNED_REFERENCE = "4cfa5bb"  # main before the hot-path work of issue 9 item 4 (append_token, burst trims)
CHILD = """
import json, sys, time
from kvsim.engine.simulate import simulate
from kvsim.workload.scenario import load_scenario, make_scenario
kind, value = sys.argv[1], sys.argv[2]
if kind == "default":
    spec = load_scenario(None, [f"workload.num_requests={value}", "steps=none"])
else:
    raw = json.loads(value)
    spec = make_scenario(raw)
start = time.perf_counter()
summary = simulate(spec).summary
elapsed = time.perf_counter() - start
keep = ("num_steps", "num_preemptions", "duration_s", "vllm:prefix_cache_hits_total")
print(json.dumps({"simulate_s": elapsed, **{k: summary[k] for k in keep if k in summary}}))
"""


def run_child(source: Path, kind: str, value: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(source)}
    out = subprocess.run([sys.executable, "-c", CHILD, kind, value], check=True, capture_output=True, text=True,
                         env=env, cwd=source)
    return json.loads(out.stdout.strip().splitlines()[-1])


def export(rev: str, into: Path) -> Path:
    """The tree of `rev` (this repository) written under `into`, with `../shared` beside it as in a checkout."""
    tree = into / "ref"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    shared = ROOT.parent / "shared"
    if shared.exists():
        (into / "shared").symlink_to(shared.resolve())
    return tree


# the result's keys: --output replaces only such a JSON object (result_file.py)
RESULT_KEYS = frozenset({"baseline_loop_s", "benchmark", "machine", "median_s", "num_requests",
                          "overload_caching_on_over_off", "overload_median_s", "python", "ratio_to_baseline",
                          "reference_commit", "repeats", "runs_s", "same_summary", "scenario", "speedup", "summary",
                          "this_commit"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", default=PINNED_REFERENCE,
                        help=f"git revision to compare with (default: {PINNED_REFERENCE}, the pinned baseline)")
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "speedup.json")
    args = parser.parse_args()
    check_result_file("bench_speedup.py", args.output, RESULT_KEYS)  # before it runs, not after
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.reference], check=True, capture_output=True,
                         text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    runs: dict[str, list[dict]] = {"this": [], "reference": []}
    with tempfile.TemporaryDirectory() as tmp:
        reference = export(rev, Path(tmp))
        for _ in range(args.repeats):
            for name, source in (("reference", reference), ("this", ROOT)):
                runs[name].append(run_child(source, "default", str(args.num_requests)))
    for name in runs:
        summaries = {json.dumps({k: v for k, v in r.items() if k != "simulate_s"}) for r in runs[name]}
        assert len(summaries) == 1, f"{name}: runs differ"
    this_summary = {k: v for k, v in runs["this"][0].items() if k != "simulate_s"}
    ref_summary = {k: v for k, v in runs["reference"][0].items() if k != "simulate_s"}
    median = {name: statistics.median(r["simulate_s"] for r in rs) for name, rs in runs.items()}
    overload = {}
    for caching in (True, False):
        raw = {**OVERLOAD, "engine": {**OVERLOAD["engine"], "enable_prefix_caching": caching}}
        times = [run_child(ROOT, "overload", json.dumps(raw))["simulate_s"] for _ in range(args.repeats)]
        overload["on" if caching else "off"] = statistics.median(times)
    base = statistics.median(baseline(200_000, 64) for _ in range(3))  # as in bench_scale
    result = {
        "benchmark": "speedup", "scenario": "built-in default (kvsim run), steps=none, simulate only",
        "num_requests": args.num_requests, "repeats": args.repeats, "python": platform.python_version(),
        "machine": platform.machine(), "this_commit": head, "reference_commit": rev,
        "runs_s": {name: [r["simulate_s"] for r in rs] for name, rs in runs.items()}, "median_s": median,
        "speedup": median["reference"] / median["this"], "same_summary": this_summary == ref_summary,
        "summary": this_summary, "baseline_loop_s": base,
        "ratio_to_baseline": {name: s / base for name, s in median.items()},
        "overload_median_s": overload, "overload_caching_on_over_off": overload["on"] / overload["off"],
    }
    write_result_file("bench_speedup.py", args.output, RESULT_KEYS, result)
    print(f"{args.num_requests:,} requests: {median['this']:.2f} s here, {median['reference']:.2f} s at "
          f"{rev[:10]}: {result['speedup']:.2f}x faster, same summary: {result['same_summary']}; overload "
          f"caching on/off {result['overload_caching_on_over_off']:.2f}x")


if __name__ == "__main__":
    main()
