"""DistServe's motivating example in kvsim: goodput per GPU, colocated vs 2 prefill + 1 decode.

    python benchmarks/study_distserve.py [--requests 600]

A study, not a speed benchmark. DistServe (Zhong et al., OSDI 2024, Fig. 1) serves a 13B model on
A100s with every prompt 512 tokens and every output 64, Poisson arrivals, SLOs P90 TTFT 0.4 s and
P90 TPOT 0.04 s, and reports the goodput (the highest rate at which 90 % of requests meet both SLOs):
about 1.6 req/s on one colocated GPU (vLLM), and 10 req/s on 2 prefill + 1 decode GPUs, 3.3 req/s per
GPU (2.1x). kvsim runs the same shapes: OPT-13B on a100-80gb, roofline latency, vLLM v1 defaults
(v1: chunked prefill, which DistServe's vLLM of 2023 did not have), NVLink between the instances, and
bisects each deployment's rate to the goodput; the colocated GPU also runs kvsim's v0 scheduler
(prefill-first batches, no chunking: the vLLM DistServe compared with). Writes `benchmarks/results/distserve.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.fleet.disagg import simulate_disagg
from kvsim.fleet.driver import simulate_fleet
from kvsim.workload.scenario import make_scenario

RESULTS = Path(__file__).resolve().parent / "results" / "distserve.json"
SLO_TTFT_S, SLO_TPOT_S, ATTAINMENT = 0.4, 0.04, 0.9
PUBLISHED = {"colocated_per_gpu": 1.6, "disagg_2p1d_total": 10.0, "disagg_2p1d_per_gpu": 3.3}


def base(num_requests: int, rate: float, scheduler: str = "v1") -> dict[str, Any]:
    return {"name": "distserve-fig1", "model": "opt-13b", "gpu": "a100-80gb", "steps": "none",
            "engine": {"max_model_len": 2048, "scheduler": scheduler},
            "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": rate},
                         "prompt_len": {"dist": "fixed", "value": 512},
                         "output_len": {"dist": "fixed", "value": 64}}}


def attainment(num_requests: int, rate: float, topology: str) -> float:
    raw = base(num_requests, rate, "v0" if topology == "colocated-v0" else "v1")
    if topology.startswith("colocated"):
        raw["replicas"] = 1
        result: Any = simulate_fleet(make_scenario(raw))
    else:
        raw["kv_transfer_config"] = {"kv_link": "nvlink"}
        raw["replicas"] = [{"count": 2, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}]
        result = simulate_disagg(make_scenario(raw))
    req = result.requests
    tpot = req["tpot_s"].to_numpy(dtype=float)
    met = (req["status"] == "finished").to_numpy() & (req["ttft_s"].to_numpy(dtype=float) <= SLO_TTFT_S) \
        & (np.isnan(tpot) | (tpot <= SLO_TPOT_S))
    return float(met.mean())


def goodput(num_requests: int, topology: str, high: float) -> float:
    """The highest rate (req/s, bisected to 2 %) at which ATTAINMENT of requests meet both SLOs."""
    low = 0.0
    while high - low > 0.02 * high:
        mid = (low + high) / 2
        if attainment(num_requests, mid, topology) >= ATTAINMENT:
            low = mid
        else:
            high = mid
    return low


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    args = parser.parse_args()
    colocated = goodput(args.requests, "colocated", 20.0)
    colocated_v0 = goodput(args.requests, "colocated-v0", 20.0)
    disagg = goodput(args.requests, "disagg", 60.0)
    rows = {"colocated_per_gpu": colocated, "colocated_v0_per_gpu": colocated_v0, "disagg_2p1d_total": disagg,
            "disagg_2p1d_per_gpu": disagg / 3, "ratio_per_gpu": disagg / 3 / colocated if colocated else None,
            "ratio_per_gpu_vs_v0": disagg / 3 / colocated_v0 if colocated_v0 else None}
    result = {"slo": {"ttft_p90_s": SLO_TTFT_S, "tpot_p90_s": SLO_TPOT_S, "attainment": ATTAINMENT},
              "requests_per_rate": args.requests, "published": PUBLISHED, "kvsim": rows}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
