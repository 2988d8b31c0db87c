"""Cost curve of the default scenario: requests vs wall seconds and peak RSS, end to end.

    python benchmarks/bench_scale.py [--sizes 1000 10000 100000 1000000] [--steps all]
                                     [--steps-format auto] [--repeats 1] [--output FILE]

Each size runs in a fresh child process exactly as `kvsim run` does (import kvsim, simulate
with the per-step rows streaming into the output's temporary folder, write requests.csv and
summary.json, swap the folder in), so its peak RSS (`ru_maxrss`) is that run's alone. The
child reports the split: `import_s`, `simulate_s` (the simulation without the time spent
writing step chunks), `write_s` (step chunks plus the final files and the swap), the RSS
right after importing (`import_rss_mib`) and at its peak. Also measured in the same run: the
overload pair of issue 9 (20 req/s, 1024 + 1024 tokens, llama-2-7b on an a100-80gb, 1,000
requests, prefix caching on vs off) and a pure-Python baseline loop, so that times are
reported as ratios comparable across machines. Writes `benchmarks/results/scale.json`.
Vidur is not run here: benchmarks/bench_vidur.py runs it side by side (`vidur` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from result_file import check_result_file, write_result_file

OVERLOAD = {
    "name": "overload", "model": "llama-2-7b", "gpu": "a100-80gb",
    "engine": {"block_size": 16, "max_num_seqs": 128, "scheduler": "v1", "allocator": "paged", "max_model_len": 4096},
    "workload": {"num_requests": 1000, "arrival": {"process": "poisson", "rate": 20.0},
                 "prompt_len": {"dist": "fixed", "value": 1024}, "output_len": {"dist": "fixed", "value": 1024}},
    "seed": 0,
}
VIDUR = ("run side by side by benchmarks/bench_vidur.py (setup: benchmarks/setup_vidur.sh), same 10k-request "
         "Azure trace, results in benchmarks/results/vidur.json")


def child_default(num_requests: int, steps: str, steps_format: str) -> dict:
    """One end-to-end run in this process, as `kvsim run` does it. Called in a fresh child."""
    import resource
    import tempfile

    def rss_mib() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    start = time.perf_counter()
    from kvsim.engine.recorder import StepRecorder
    from kvsim.engine.simulate import simulate_single
    from kvsim.results.output_dir import output_directory
    from kvsim.results.run_result import write_run_files
    from kvsim.results.step_writer import StepWriter
    from kvsim.workload.scenario import load_scenario

    spec = load_scenario(None, [f"workload.num_requests={num_requests}", f"steps={steps}"])
    imported = time.perf_counter()
    import_rss = rss_mib()
    with tempfile.TemporaryDirectory() as tmp, output_directory(final := Path(tmp) / "run", "run") as folder:
        writer = StepWriter(folder, steps_format) if steps != "none" else None  # as simulate(out_dir=...) does
        steps_path = None if writer is None else final / writer.path.name
        result = simulate_single(spec, False, None, True, None, StepRecorder(steps, writer), steps_path)
        simulated = time.perf_counter()
        write_run_files(folder, result, steps=False, final=final)
    written = time.perf_counter()
    steps_write_s = writer.write_s if writer is not None else 0.0
    return {"num_requests": num_requests, "steps": steps, "steps_format": writer.format if writer else None,
            "num_steps": result.summary["num_steps"], "wall_s": written - start, "import_s": imported - start,
            "simulate_s": simulated - imported - steps_write_s, "write_s": written - simulated + steps_write_s,
            "import_rss_mib": import_rss, "peak_rss_mib": rss_mib()}


def child_overload(caching: bool) -> dict:
    from kvsim.engine.simulate import simulate
    from kvsim.workload.scenario import make_scenario

    raw = {**OVERLOAD, "engine": {**OVERLOAD["engine"], "enable_prefix_caching": caching}}
    start = time.perf_counter()
    summary = simulate(make_scenario(raw), steps="none").summary
    return {"enable_prefix_caching": caching, "simulate_s": time.perf_counter() - start,
            "num_steps": summary["num_steps"], "num_preemptions": summary["num_preemptions"]}


def in_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# the result's keys: --output replaces only such a JSON object (result_file.py)
RESULT_KEYS = frozenset({"baseline_loop_s", "benchmark", "curve", "machine", "note", "overload", "python",
                          "scenario", "steps", "steps_format", "vidur"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--steps", choices=["none", "sampled", "all"], default="all")
    parser.add_argument("--steps-format", choices=["auto", "parquet", "csv"], default="auto",
                        help="file the steps stream to (auto: parquet with pyarrow installed)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per size (median reported)")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "scale.json")
    parser.add_argument("--note", default="", help="conditions of this measurement, kept in the JSON")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, value, *rest = args.child
        result = child_default(int(value), *rest) if kind == "default" else child_overload(value == "on")
        print(json.dumps(result))
        return
    check_result_file("bench_scale.py", args.output, RESULT_KEYS)  # before it runs, not after
    from bench_simulator import baseline  # the same interpreter-speed loop (imports kvsim: not in the children)

    base = statistics.median(baseline(200_000, 64) for _ in range(3))  # 200k steps of a 64-request batch
    overload = {mode: [in_child("overload", mode) for _ in range(max(args.repeats, 3))] for mode in ("on", "off")}
    over_s = {mode: statistics.median(r["simulate_s"] for r in runs) for mode, runs in overload.items()}
    curve = []
    for size in args.sizes:
        runs = [in_child("default", str(size), args.steps, args.steps_format) for _ in range(args.repeats)]
        row = {**runs[len(runs) // 2], "runs_wall_s": [r["wall_s"] for r in runs]}
        row["wall_s"] = statistics.median(r["wall_s"] for r in runs)
        row["wall_ratio_to_baseline"] = row["wall_s"] / base
        row["peak_rss_under_1_gib"] = row["peak_rss_mib"] < 1024  # issue 9 item 3's bound
        curve.append(row)
        print(f"{size:>9,} requests: {row['wall_s']:8.1f} s ({row['write_s']:.1f} s writing), "
              f"{row['num_steps']:,} steps, peak RSS {row['peak_rss_mib']:,.0f} MiB "
              f"({row['import_rss_mib']:,.0f} after import)", flush=True)
    out = {
        "benchmark": "scale", "scenario": "built-in default (kvsim run)", "python": platform.python_version(),
        "machine": platform.machine(), "steps": args.steps, "steps_format": args.steps_format,
        "baseline_loop_s": base, "curve": curve,
        "overload": {"runs": overload, "median_s": over_s, "caching_on_over_off": over_s["on"] / over_s["off"],
                     "ratio_to_baseline": {m: s / base for m, s in over_s.items()}},
        "vidur": VIDUR, "note": args.note,
    }
    write_result_file("bench_scale.py", args.output, RESULT_KEYS, out)
    print(f"overload, prefix caching on / off: {out['overload']['caching_on_over_off']:.2f}x "
          f"({over_s['on']:.1f} s / {over_s['off']:.1f} s); baseline loop {base:.2f} s")


if __name__ == "__main__":
    main()
