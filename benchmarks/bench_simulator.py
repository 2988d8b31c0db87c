"""Simulator speed on a fixed workload, as simulated requests, tokens and engine steps per wall-second.

    python benchmarks/bench_simulator.py [--repeats 5] [--num-requests 10000]

Workload (the issue's reference point, comparable with Vidur's ~16 s on a 2-core machine):
10,000 requests of 512 prompt + 256 output tokens, Poisson 6 req/s, llama-2-7b on an
a100-80gb, scheduler v1, paged allocator, block size 16, max_num_seqs 128. Every block
is tracked exactly. Writes medians over `--repeats` runs, with a same-run baseline (a
pure-Python loop of the same number of steps doing a dict update per running request)
so that the ratio is comparable across machines.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

from result_file import check_result_file, write_result_file

from kvsim.engine.simulate import simulate
from kvsim.workload.scenario import make_scenario

SCENARIO = {
    "name": "bench-10k",
    "model": "llama-2-7b",
    "gpu": "a100-80gb",
    "engine": {"block_size": 16, "max_num_seqs": 128, "scheduler": "v1", "allocator": "paged",
               "max_model_len": 4096},
    "workload": {"num_requests": 10_000, "arrival": {"process": "poisson", "rate": 6.0},
                 "prompt_len": {"dist": "fixed", "value": 512}, "output_len": {"dist": "fixed", "value": 256}},
    "seed": 0,
}


def baseline(num_steps: int, mean_running: float) -> float:
    """Wall time of a loop that touches `mean_running` dict entries per step (interpreter speed)."""
    state = dict.fromkeys(range(int(mean_running)), 0)
    start = time.perf_counter()
    for _ in range(num_steps):
        for key in state:
            state[key] += 1
    return time.perf_counter() - start


# the result's keys: --output replaces only such a JSON object (result_file.py)
RESULT_KEYS = frozenset({"baseline_loop_s", "benchmark", "machine", "mean_running", "median_s", "num_steps",
                          "python", "ratio_to_baseline", "repeats", "requests_per_wall_s", "runs_s", "scenario",
                          "simulated_duration_s", "steps_per_wall_s", "tokens_per_wall_s"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "simulator.json")
    args = parser.parse_args()
    check_result_file("bench_simulator.py", args.output, RESULT_KEYS)  # before it runs, not after
    raw = {**SCENARIO, "workload": {**SCENARIO["workload"], "num_requests": args.num_requests}}
    scenario = make_scenario(raw)
    times, summary = [], {}
    for _ in range(args.repeats):
        start = time.perf_counter()
        summary = simulate(scenario).summary
        times.append(time.perf_counter() - start)
    wall = statistics.median(times)
    steps = summary["num_steps"]
    tokens = args.num_requests * (512 + 256)
    base = statistics.median(baseline(steps, summary["mean_running"]) for _ in range(args.repeats))
    result = {
        "benchmark": "simulator", "scenario": raw, "python": platform.python_version(),
        "machine": platform.machine(), "repeats": args.repeats, "runs_s": times, "median_s": wall,
        "num_steps": steps, "requests_per_wall_s": args.num_requests / wall, "tokens_per_wall_s": tokens / wall,
        "steps_per_wall_s": steps / wall, "baseline_loop_s": base, "ratio_to_baseline": wall / base,
        "simulated_duration_s": summary["duration_s"], "mean_running": summary["mean_running"],
    }
    write_result_file("bench_simulator.py", args.output, RESULT_KEYS, result)
    print(f"median {wall:.2f} s for {args.num_requests:,} requests, {steps:,} steps: "
          f"{result['requests_per_wall_s']:,.0f} req/s, {result['tokens_per_wall_s']:,.0f} tok/s, "
          f"{result['steps_per_wall_s']:,.0f} steps/s (baseline loop {base:.2f} s)")


if __name__ == "__main__":
    main()
