"""How long the converged steady-state rate search takes, and whether its answer holds 10× longer.

    python benchmarks/bench_steady.py [--first 400] [--verify-factor 10]

The search (`kvsim.planning.steady_state.SteadyRateSearch`) on the report's default scenario
(Llama-3.1-8B on one L4, Poisson arrivals, TTFT p90 ≤ 2 s), started from `--first` requests a
probe and doubled until the rate moves < 2 %, then, as the report runs it, verified: the answer
re-run with `--verify-factor` × the converged run length and backed off 3 % until that long run
holds (0: the search alone). Records wall and CPU seconds, probes, requests simulated in all, the
search's rate, each run length's answer, the long runs and the verified rate.
Writes benchmarks/results/steady_state.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from kvsim.planning.steady_state import search_rates
from kvsim.planning.sweep import run_evidence
from kvsim.report.studies import poisson, variant
from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario

RESULTS = Path(__file__).resolve().parent / "results" / "steady_state.json"
SLO = {"ttft_s.p90": 2.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=400, help="requests a probe at the first run length")
    parser.add_argument("--max-requests", type=int, default=25_600)
    parser.add_argument("--verify-factor", type=int, default=10, help="long-run length, x the converged one")
    args = parser.parse_args()
    base = variant(load_scenario(None, default=REPORT_SCENARIO), "steps=none")
    simulated = [0]

    def make(_: int, rate: float, n: int):
        simulated[0] += n
        return variant(base, poisson(rate), f"workload.num_requests={n}")

    wall, cpu = time.perf_counter(), time.process_time()
    (search,) = search_rates(make, 1, SLO, partial(run_evidence, workers=1), num_requests=args.first,
                             max_requests=args.max_requests, verify_factor=args.verify_factor,
                             max_verify_requests=10 * args.max_requests)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    summary = search.summary()
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.machine(),
           "python": platform.python_version(), "scenario": "report default (llama-3.1-8b, l4)", "slo": SLO,
           "first_requests": args.first, "rate_per_s": summary["rate_per_s"],
           "search_rate_per_s": summary["search_rate_per_s"], "converged": summary["converged"],
           "capped": summary["capped"], "rates_by_length": summary["rates_by_length"],
           "num_probes": summary["num_probes"], "verify_factor": args.verify_factor,
           "long_runs": [{"rate_per_s": r.rate, "passed": r.passed, "num_requests": r.evidence["num_requests"],
                          "verdict": r.evidence["verdict"], "ttft_p90_s": r.evidence["ttft_s"]["p90"],
                          "ttft_p90_ci": r.evidence["ttft_s"]["p90_ci"]} for r in search.long_runs],
           "verified": summary["verified"], "requests_simulated": simulated[0], "wall_s": round(wall, 2),
           "cpu_s": round(cpu, 2)}
    RESULTS.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
