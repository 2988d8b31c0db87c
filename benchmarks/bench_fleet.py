"""Fleet simulation cost: wall seconds and peak memory vs replicas × requests, on a real trace.

    python benchmarks/bench_fleet.py [--repeats 3] [--points 8x1200,16x2400,64x4800,64x19200]
    python benchmarks/bench_fleet.py --repeats 1 --steps sampled --points 64x1000000   # the 1M point

Workload: the Azure LLM 2023 conversation trace (`../shared/traces/azure_llm_2023`, CC-BY 4.0,
Patel et al., ISCA 2024), its own arrivals time-scaled so that every replica carries about
`--rate-per-replica` requests/s (the trace's mean is 5.53 req/s), first N rows; llama-3.1-8b
on h100-80gb replicas, v1 scheduler, paged KV, roofline latency, least-outstanding router.
The trace has 19,366 rows: a point that needs more replays it end to end, each copy shifted
by `LOOP_PERIOD_S` (a converted copy written once under the system's temporary folder,
never in ../shared), so 1M requests are 52 back-to-back copies of the real hour.

Each point runs as `kvsim run` runs it, its output (step rows streamed, requests, routes) written
to a temporary folder, in a fresh process (so its peak RSS is its own); the median wall time of
`--repeats` runs is kept (CPU seconds too: on a shared machine they say more than wall
seconds). The same run first measures one replica on the same per-replica load
(`--baseline-requests`), and every point states its wall and CPU time per request as a ratio
to that baseline's, which is what compares across machines and loads. `--output` gets the
curve; a point already there (same replicas, requests and rate) is replaced, others are kept,
so the 1M point can be added to an earlier curve. The result also states a linear
extrapolation to 1M requests on 64 replicas from the two largest 64-replica points, labelled
as such: it is not a measurement.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import resource
import statistics
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from result_file import check_result_file, write_result_file

TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "azure_llm_2023" / \
    "AzureLLMInferenceTrace_conv.csv"
TRACE_MEAN_RATE = 5.53  # requests/s over the trace's span (../shared/traces/README.md)
TRACE_ROWS = 19_366
LOOP_PERIOD_S = 3502  # the trace spans 3,501.7 s: each copy starts 0.28 s (about 1.5 mean gaps) after the last


def trace_for(num_requests: int) -> Path:
    """The trace itself, or (beyond its rows) a copy replayed end to end, each copy shifted by
    `LOOP_PERIOD_S` whole seconds (the 100 ns digits stay as written)."""
    copies = -(-num_requests // TRACE_ROWS)
    if copies == 1:
        return TRACE.resolve()
    path = Path(tempfile.gettempdir()) / "kvsim-bench-fleet" / f"azure_conv_x{copies}.csv"
    if path.exists():
        return path
    lines = TRACE.read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], [line.split(",", 1) for line in lines[1:] if line]
    stamps = [(datetime.fromisoformat(stamp.partition(".")[0]), stamp.partition(".")[2], rest)
              for stamp, rest in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(header + "\n")
        for copy in range(copies):
            shift = timedelta(seconds=copy * LOOP_PERIOD_S)
            f.writelines(f"{(when + shift).isoformat(sep=' ')}.{frac},{rest}\n" for when, frac, rest in stamps)
    tmp.replace(path)
    return path


def scenario_raw(replicas: int, num_requests: int, rate_per_replica: float, steps: str = "all") -> dict:
    return {
        "name": f"fleet-{replicas}x{num_requests}", "model": "llama-3.1-8b", "gpu": "h100-80gb", "steps": steps,
        "engine": {"max_model_len": 16384, "max_num_seqs": 256},
        "workload": {"num_requests": num_requests, "arrival": {"process": "trace"},
                     "trace": {"format": "azure", "path": str(trace_for(num_requests)),
                               "rate_scale": replicas * rate_per_replica / TRACE_MEAN_RATE}},
        "replicas": replicas, "router": {"policy": "least_outstanding"}, "seed": 0,
    }


def _run(args: tuple[dict, multiprocessing.Queue]) -> None:
    raw, queue = args
    from kvsim.fleet.driver import simulate_fleet
    from kvsim.workload.scenario import make_scenario

    scenario = make_scenario(raw)
    with tempfile.TemporaryDirectory() as out_dir:  # as `kvsim run` does: the step rows stream to disk
        start, cpu = time.perf_counter(), time.process_time()
        summary = simulate_fleet(scenario, out_dir=Path(out_dir) / "run").summary
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    queue.put({"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": peak_mib, "num_finished": summary["num_finished"],
               "simulated_s": summary["duration_s"], "ttft_p90_s": summary["ttft_s"]["p90"],
               "mean_running_per_replica": summary["mean_running"] / summary["num_replicas"]})


def measure(raw: dict) -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_run, args=((raw, queue),))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def parse_points(text: str) -> list[tuple[int, int]]:
    """`64x1000000,8x1200` (or `64:1000000`) -> [(replicas, requests), ...]."""
    points = []
    for item in text.split(","):
        replicas, _, requests = item.strip().replace(":", "x").partition("x")
        points.append((int(replicas), int(requests)))
    return points


def extrapolate_1m(rows: list[dict]) -> dict | None:
    """Linear in requests through the two largest measured 64-replica points (a label, not a measurement)."""
    big = sorted((r for r in rows if r["replicas"] == 64), key=lambda r: r["num_requests"])[-2:]
    if len(big) < 2 or big[1]["num_requests"] == big[0]["num_requests"] or big[1]["num_requests"] >= 1_000_000:
        return None
    (n0, t0, c0, m0), (n1, t1, c1, m1) = ((r["num_requests"], r["wall_s"], r["cpu_s"], r["peak_rss_mib"])
                                          for r in big)
    return {
        "label": "EXTRAPOLATED, not measured: linear in requests from the two largest 64-replica points",
        "from_points": [n0, n1], "replicas": 64, "num_requests": 1_000_000,
        "wall_s": t1 + (t1 - t0) / (n1 - n0) * (1_000_000 - n1),
        "cpu_s": c1 + (c1 - c0) / (n1 - n0) * (1_000_000 - n1),
        "peak_rss_mib": m1 + (m1 - m0) / (n1 - n0) * (1_000_000 - n1),
    }


# the result's keys: --output replaces only such a JSON object (result_file.py)
RESULT_KEYS = frozenset({"baseline", "benchmark", "extrapolation_1m", "machine", "measured_at", "points", "python",
                          "trace"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--points", default="8x1200,16x2400,64x4800,64x19200")
    parser.add_argument("--rate-per-replica", type=float, default=4.0)
    parser.add_argument("--baseline-requests", type=int, default=1200)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "fleet.json")
    parser.add_argument("--steps", choices=("all", "sampled", "none"), default="all",
                        help="the scenario's per-step rows kept (a 1M-request fleet keeps ~50M steps: use sampled)")
    args = parser.parse_args()
    check_result_file("bench_fleet.py", args.output, RESULT_KEYS)  # before it runs, not after
    baseline: dict | None = None
    rows = []
    for replicas, num_requests in [(1, args.baseline_requests), *parse_points(args.points)]:
        runs = [measure(scenario_raw(replicas, num_requests, args.rate_per_replica, args.steps))
                for _ in range(args.repeats)]
        row = {"replicas": replicas, "num_requests": num_requests, "repeats": args.repeats,
               "rate_per_replica": args.rate_per_replica, "steps": args.steps,
               **{k: statistics.median(r[k] for r in runs) for k in ("wall_s", "cpu_s", "peak_rss_mib")},
               **{k: runs[0][k] for k in ("num_finished", "simulated_s", "ttft_p90_s", "mean_running_per_replica")}}
        row["requests_per_wall_s"] = num_requests / row["wall_s"]
        baseline = baseline or row
        for kind in ("wall", "cpu"):
            row[f"{kind}_per_request_vs_one_replica"] = (row[f"{kind}_s"] / num_requests) / \
                (baseline[f"{kind}_s"] / baseline["num_requests"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    kept = []
    if args.output.exists():  # keep earlier points this run did not measure
        measured = {(r["replicas"], r["num_requests"], r["rate_per_replica"]) for r in rows}
        kept = [r for r in json.loads(args.output.read_text(encoding="utf-8")).get("points", [])
                if (r["replicas"], r["num_requests"], r.get("rate_per_replica", 4.0)) not in measured]
    curve = sorted(kept + rows, key=lambda r: (r["replicas"], r["num_requests"]))
    result = {"benchmark": "fleet", "baseline": "one replica on the same per-replica load, measured in the same run",
              "trace": "azure_llm_2023/AzureLLMInferenceTrace_conv.csv (replayed end to end past 19,366 rows)",
              "machine": platform.platform(), "python": platform.python_version(),
              "measured_at": datetime.now().isoformat(timespec="seconds"),
              "points": curve, "extrapolation_1m": extrapolate_1m(curve)}
    write_result_file("bench_fleet.py", args.output, RESULT_KEYS, result)
    print(json.dumps(result["extrapolation_1m"]))


if __name__ == "__main__":
    main()
