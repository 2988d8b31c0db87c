"""DistServe's motivating example in kvsim: goodput per GPU, colocated vs 2 prefill + 1 decode.

    python benchmarks/study_distserve.py [--requests 1000]

A study, not a speed benchmark. The published figures (DistServe, Zhong et al., OSDI 2024, arXiv
2401.09670 v3, section 1 and Fig. 1; re-read in the paper's text): "a 13B LLM" served by vLLM on one
A100-80GB, every prompt 512 tokens and every output 64; at 90 % SLO attainment the colocated GPU's goodput
is about 1.6 req/s, "constrained by the more stringent one of TTFT and TPOT"; a GPU serving only the
prefill phase reaches 5.6 req/s and one serving only decoding 10 req/s, so "ideally" 2 prefill GPUs + 1
decode GPU serve min(2 x 5.6, 10) = 10 req/s, 3.3 per GPU, 2.1x. That 2P1D figure is composed from the two
single-phase measurements, not measured as a 2P1D system. The SLOs (P90 TTFT 0.4 s, P90 TPOT 0.04 s) and
the Poisson arrivals are stated in the authors' blog post (hao-ai-lab.github.io/blogs/distserve), not in
the paper's text. kvsim runs the same shapes: OPT-13B (the paper's evaluation family; Fig. 1 does not name
the model) on a100-80gb, roofline latency, NVLink between the instances, and bisects each deployment's
rate to the goodput: colocated with the v1 scheduler (chunked prefill, which DistServe's vLLM of 2023 did
not have) and the v0 one (prefill-first batches, no chunking: the vLLM DistServe compared with); the
single-phase goodputs the paper composes (prefill only: every output 1 token, TTFT SLO only; decode only:
the decode instance of a 4P1D fleet, so prefill never binds, TPOT SLO only), their composition as the
paper does it, and a measured 2P1D fleet. Writes `benchmarks/results/distserve.json` (the tracked result), or
`--output FILE`, as the other benchmarks do: a new file or an earlier result of this study, checked before the
study runs (a folder or a user's file there is refused in one line, exit 2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from result_file import check_result_file, write_result_file

from kvsim.fleet.disagg import simulate_disagg
from kvsim.fleet.driver import simulate_fleet
from kvsim.workload.scenario import make_scenario

RESULTS = Path(__file__).resolve().parent / "results" / "distserve.json"
RESULT_KEYS = frozenset({"slo", "requests_per_rate", "published", "sources", "kvsim"})
SLO_TTFT_S, SLO_TPOT_S, ATTAINMENT = 0.4, 0.04, 0.9
PUBLISHED = {"colocated_per_gpu": 1.6, "prefill_only_per_gpu": 5.6, "decode_only_per_gpu": 10.0,
             "ideal_2p1d_total": 10.0, "ideal_2p1d_per_gpu": 3.3, "ratio_per_gpu": 2.1}
SOURCES = ["https://arxiv.org/abs/2401.09670 (v3, section 1 and Fig. 1)",
           "https://hao-ai-lab.github.io/blogs/distserve/ (the SLOs and Poisson arrivals)"]


def base(num_requests: int, rate: float, scheduler: str = "v1", output_len: int = 64) -> dict[str, Any]:
    return {"name": "distserve-fig1", "model": "opt-13b", "gpu": "a100-80gb", "steps": "none",
            "engine": {"max_model_len": 2048, "scheduler": scheduler},
            "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": rate},
                         "prompt_len": {"dist": "fixed", "value": 512},
                         "output_len": {"dist": "fixed", "value": output_len}}}


def attainment(num_requests: int, rate: float, topology: str) -> float:
    """Share of requests meeting the SLOs that `topology` is judged by (module docstring)."""
    raw = base(num_requests, rate, "v0" if topology == "colocated-v0" else "v1",
               1 if topology == "prefill-only" else 64)
    if topology.startswith("colocated") or topology == "prefill-only":
        raw["replicas"] = 1
        result: Any = simulate_fleet(make_scenario(raw))
    else:
        num_prefill = 4 if topology == "decode-only" else 2
        raw["kv_transfer_config"] = {"kv_link": "nvlink"}
        raw["replicas"] = [{"count": num_prefill, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}]
        result = simulate_disagg(make_scenario(raw))
    req = result.requests
    tpot = req["tpot_s"].to_numpy(dtype=float)
    ttft_met = req["ttft_s"].to_numpy(dtype=float) <= SLO_TTFT_S
    tpot_met = np.isnan(tpot) | (tpot <= SLO_TPOT_S)
    met = {"prefill-only": ttft_met, "decode-only": tpot_met}.get(topology, ttft_met & tpot_met)
    return float(((req["status"] == "finished").to_numpy() & met).mean())


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
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    check_result_file("study_distserve.py", args.output, RESULT_KEYS)  # before the study, not after
    colocated = goodput(args.requests, "colocated", 20.0)
    colocated_v0 = goodput(args.requests, "colocated-v0", 20.0)
    prefill_only = goodput(args.requests, "prefill-only", 40.0)
    decode_only = goodput(args.requests, "decode-only", 200.0)
    ideal = min(2 * prefill_only, decode_only)
    disagg = goodput(args.requests, "disagg", 60.0)
    rows = {"colocated_per_gpu": colocated, "colocated_v0_per_gpu": colocated_v0,
            "prefill_only_per_gpu": prefill_only, "decode_only_per_gpu": decode_only,
            "ideal_2p1d_total": ideal, "ideal_2p1d_per_gpu": ideal / 3,
            "ideal_ratio_per_gpu_vs_v0": ideal / 3 / colocated_v0 if colocated_v0 else None,
            "disagg_2p1d_total": disagg, "disagg_2p1d_per_gpu": disagg / 3,
            "ratio_per_gpu": disagg / 3 / colocated if colocated else None,
            "ratio_per_gpu_vs_v0": disagg / 3 / colocated_v0 if colocated_v0 else None}
    result = {"slo": {"ttft_p90_s": SLO_TTFT_S, "tpot_p90_s": SLO_TPOT_S, "attainment": ATTAINMENT},
              "requests_per_rate": args.requests, "published": PUBLISHED, "sources": SOURCES, "kvsim": rows}
    write_result_file("study_distserve.py", args.output, RESULT_KEYS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
