"""Disaggregated vs colocated fleet: simulator wall time per request, as a ratio measured in one run.

    python benchmarks/bench_disagg.py [--replicas 8] [--requests 4000] [--repeats 3]

The same workload (the shipped Azure conversation sample `builtin:azure_conv`, its arrivals scaled so
each GPU carries about 2 req/s; llama-3.1-8b on h100-80gb, roofline latency) runs on `replicas` GPUs
colocated (least_outstanding) and split half prefill, half decode (kv_transfer_config, rdma link).
Both are timed alternately in this process; the median of `--repeats` wall times is kept and the
ratio disaggregated / colocated is written to `benchmarks/results/disagg.json`. Speed only: nothing
here says which deployment serves better.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from kvsim.fleet.disagg import simulate_disagg
from kvsim.fleet.driver import simulate_fleet
from kvsim.workload.scenario import make_scenario

AZURE_MEAN_RATE = 5.53  # requests/s of the Azure 2023 conversation trace (../shared/traces/README.md)
RESULTS = Path(__file__).parent / "results" / "disagg.json"


def scenarios(num_replicas: int, num_requests: int) -> tuple[dict, dict]:
    base = {
        "model": "llama-3.1-8b", "gpu": "h100-80gb", "engine": {"max_model_len": 8192}, "steps": "none",
        "workload": {"num_requests": num_requests, "arrival": {"process": "trace"},
                     "trace": {"format": "azure", "path": "builtin:azure_conv",
                               "rate_scale": 2.0 * num_replicas / AZURE_MEAN_RATE}},
    }
    colocated = {**base, "name": "colocated", "replicas": num_replicas, "router": {"policy": "least_outstanding"}}
    half = num_replicas // 2
    disagg = {**base, "name": "disagg", "kv_transfer_config": {"kv_link": "rdma"},
              "replicas": [{"count": half, "kv_role": "kv_producer"},
                           {"count": num_replicas - half, "kv_role": "kv_consumer"}]}
    return colocated, disagg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    colocated, disagg = (make_scenario(raw) for raw in scenarios(args.replicas, args.requests))
    times: dict[str, list[float]] = {"colocated": [], "disagg": []}
    for _ in range(args.repeats):
        runs = (("colocated", lambda: simulate_fleet(colocated)), ("disagg", lambda: simulate_disagg(disagg)))
        for name, run in runs:
            start = time.perf_counter()
            summary = run().summary
            times[name].append(time.perf_counter() - start)
            times.setdefault(f"{name}_finished", []).append(summary["num_finished"])
    medians = {name: statistics.median(times[name]) for name in ("colocated", "disagg")}
    result = {
        "replicas": args.replicas, "requests": args.requests, "repeats": args.repeats,
        "wall_s": medians, "ratio_disagg_over_colocated": medians["disagg"] / medians["colocated"],
        "num_finished": {name: times[f"{name}_finished"][0] for name in ("colocated", "disagg")},
        "machine": platform.platform(), "python": platform.python_version(),
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
