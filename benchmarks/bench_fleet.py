"""Fleet simulation cost: wall seconds and peak memory vs replicas × requests, on a real trace.

    python benchmarks/bench_fleet.py [--repeats 3] [--points 8:1200,16:2400,64:4800,64:9600]

Workload: the Azure LLM 2023 conversation trace (`../shared/traces/azure_llm_2023`, CC-BY 4.0,
Patel et al., ISCA 2024), its own arrivals time-scaled so that every replica carries about
`--rate-per-replica` requests/s (the trace's mean is 5.53 req/s), first N rows; llama-3.1-8b
on h100-80gb replicas, v1 scheduler, paged KV, roofline latency, least-outstanding router.

Each point runs in a fresh process (so its peak RSS is its own); the median wall time of
`--repeats` runs is kept. The same run first measures one replica on the same per-replica
load (`--baseline-requests`), and every point states its wall time per request as a ratio to
that baseline's, which is what compares across machines and loads. The result also states a
linear extrapolation to 1M requests on 64 replicas from the two largest 64-replica points,
labelled as such: it is not a measurement.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import resource
import statistics
import time
from pathlib import Path

TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "azure_llm_2023" / \
    "AzureLLMInferenceTrace_conv.csv"
TRACE_MEAN_RATE = 5.53  # requests/s over the trace's span (../shared/traces/README.md)


def scenario_raw(replicas: int, num_requests: int, rate_per_replica: float) -> dict:
    return {
        "name": f"fleet-{replicas}x{num_requests}", "model": "llama-3.1-8b", "gpu": "h100-80gb",
        "engine": {"max_model_len": 16384, "max_num_seqs": 256},
        "workload": {"num_requests": num_requests, "arrival": {"process": "trace"},
                     "trace": {"format": "azure", "path": str(TRACE.resolve()),
                               "rate_scale": replicas * rate_per_replica / TRACE_MEAN_RATE}},
        "replicas": replicas, "router": {"policy": "least_outstanding"}, "seed": 0,
    }


def _run(args: tuple[dict, multiprocessing.Queue]) -> None:
    raw, queue = args
    from kvsim.fleet import simulate_fleet
    from kvsim.scenario import make_scenario

    scenario = make_scenario(raw)
    start = time.perf_counter()
    summary = simulate_fleet(scenario).summary
    wall = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    queue.put({"wall_s": wall, "peak_rss_mib": peak_mib, "num_finished": summary["num_finished"],
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--points", default="8:1200,16:2400,64:4800,64:9600")
    parser.add_argument("--rate-per-replica", type=float, default=4.0)
    parser.add_argument("--baseline-requests", type=int, default=1200)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "fleet.json")
    args = parser.parse_args()
    rows = []
    points = [(1, args.baseline_requests)] + [tuple(int(x) for x in p.split(":")) for p in args.points.split(",")]
    for replicas, num_requests in points:
        runs = [measure(scenario_raw(replicas, num_requests, args.rate_per_replica)) for _ in range(args.repeats)]
        row = {"replicas": replicas, "num_requests": num_requests, "repeats": args.repeats,
               "wall_s": statistics.median(r["wall_s"] for r in runs),
               "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs),
               **{k: runs[0][k] for k in ("num_finished", "simulated_s", "ttft_p90_s", "mean_running_per_replica")}}
        row["requests_per_wall_s"] = num_requests / row["wall_s"]
        row["wall_per_request_vs_one_replica"] = (row["wall_s"] / num_requests) / \
            (rows[0]["wall_s"] / rows[0]["num_requests"]) if rows else 1.0
        rows.append(row)
        print(json.dumps(row))
    big = sorted((r for r in rows if r["replicas"] == 64), key=lambda r: r["num_requests"])[-2:]
    extrapolation = None
    if len(big) == 2 and big[1]["num_requests"] > big[0]["num_requests"]:
        (n0, t0, m0), (n1, t1, m1) = ((r["num_requests"], r["wall_s"], r["peak_rss_mib"]) for r in big)
        slope_s, slope_mib = (t1 - t0) / (n1 - n0), (m1 - m0) / (n1 - n0)
        extrapolation = {
            "label": "EXTRAPOLATED, not measured: linear in requests from the two largest 64-replica points",
            "replicas": 64, "num_requests": 1_000_000,
            "wall_s": t1 + slope_s * (1_000_000 - n1), "peak_rss_mib": m1 + slope_mib * (1_000_000 - n1),
        }
    result = {"benchmark": "fleet", "baseline": "the first point: one replica on the same per-replica load",
              "trace": "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
              "rate_per_replica": args.rate_per_replica, "machine": platform.platform(),
              "python": platform.python_version(), "points": rows, "extrapolation_1m": extrapolation}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(extrapolation))


if __name__ == "__main__":
    main()
