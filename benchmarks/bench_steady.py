"""How long the converged steady-state rate search takes, and whether its answer holds 10× longer.

    python benchmarks/bench_steady.py [--first 400] [--verify]

The search (`kvsim.planning.steady_state.SteadyRateSearch`) on the report's default scenario
(Llama-3.1-8B on one L4, Poisson arrivals, TTFT p90 ≤ 2 s), started from `--first` requests a
probe and doubled until the rate moves < 2 %: wall and CPU seconds, probes, requests simulated in
all, the rate and each run length's answer. `--verify` then runs the answer with 10× the converged
run length and records its windowed p90 TTFT and verdict. Writes benchmarks/results/steady_state.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

from kvsim.planning.steady_state import probe_passes, search_rates
from kvsim.planning.sweep import run_many
from kvsim.report.studies import poisson, variant
from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario

RESULTS = Path(__file__).resolve().parent / "results" / "steady_state.json"
SLO = {"ttft_s.p90": 2.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=400, help="requests a probe at the first run length")
    parser.add_argument("--max-requests", type=int, default=25_600)
    parser.add_argument("--verify", action="store_true", help="also run the answer 10x longer")
    args = parser.parse_args()
    base = variant(load_scenario(None, default=REPORT_SCENARIO), "steps=none")
    simulated = [0]

    def make(_: int, rate: float, n: int):
        simulated[0] += n
        return variant(base, poisson(rate), f"workload.num_requests={n}")

    def run(scenarios):
        return [r.evidence for r in run_many(scenarios, workers=1, evidence=True)]

    wall, cpu = time.perf_counter(), time.process_time()
    (search,) = search_rates(make, 1, SLO, run, num_requests=args.first, max_requests=args.max_requests)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    summary = search.summary()
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.machine(),
           "python": platform.python_version(), "scenario": "report default (llama-3.1-8b, l4)", "slo": SLO,
           "first_requests": args.first, "rate_per_s": summary["rate_per_s"], "converged": summary["converged"],
           "capped": summary["capped"], "rates_by_length": summary["rates_by_length"],
           "num_probes": summary["num_probes"], "requests_simulated": simulated[0], "wall_s": round(wall, 2),
           "cpu_s": round(cpu, 2)}
    if args.verify:
        n = 10 * summary["num_requests"]
        (result,) = run_many([variant(base, poisson(search.rate), f"workload.num_requests={n}")], workers=1,
                             evidence=True)
        ev = result.evidence
        assert ev is not None
        out["verify"] = {"num_requests": n, "verdict": ev["verdict"], "ttft_p90_s": ev["ttft_s"]["p90"],
                         "ttft_p90_ci": ev["ttft_s"]["p90_ci"], "passes": probe_passes(ev, SLO)}
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
