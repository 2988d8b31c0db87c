"""Does the report's sustainable rate hold when the traffic lasts? N vs 4N, and a run 10× longer.

    python benchmarks/steady_verify.py [--setting NAME ...] [--plan]
    python benchmarks/steady_verify.py --plan-only | --long-only N [--setting NAME ...]

For the report's default scenario (Llama-3.1-8B on one L4) and the three heavy settings of issue 20
(Qwen3-32B on one H100; Llama-3.1-70B on 2×H200, TP 2, max_model_len 8,192; Qwen3-30B-A3B on one H100),
Poisson arrivals and TTFT p90 ≤ 2 s, as `kvsim report` searches them (`kvsim.report.studies.StudyConfig`'s
defaults, paged KV):

- the search as the report runs it: first run length N = 400 requests a probe, doubled until the rate
  moves < 2 %, then the answer re-run with 10× its run length (at most 128,000 requests), backed off while
  that long run fails and stepped up while it holds (`kvsim.planning.steady_state.SteadyRateSearch`);
- the same search started from 4N = 1,600 requests a probe (no verification): its rate against N's;
- with `--plan`, `kvsim plan` (replica-count search) for traffic at 2.5× the verified rate (400 requests a
  probe, p90 TTFT ≤ 2 s), whose chosen fleet is re-run with 10× the requests and re-searched upwards
  while that long run fails (`kvsim.planning.plan`).

`--plan-only` adds the plan to a stored setting; `--long-only N` runs its stored rate with N requests
(backed off 3 % until it holds) and stores them as `long_runs_N` beside the search's own `long_runs`.
The 70B and 30B-A3B searches are capped at 12,800 requests a probe, so their 10× run has 128,000.

Each setting's evidence is merged into benchmarks/results/steady_verify.json (one key per setting), so
settings can run as separate processes.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from kvsim.planning.steady_state import search_rates
from kvsim.planning.sweep import run_evidence
from kvsim.report.studies import StudyConfig, poisson, variant
from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario

RESULTS = Path(__file__).resolve().parent / "results" / "steady_verify.json"
SETTINGS = {
    "llama-3.1-8b/l4 (report default)": [],
    "qwen3-32b/h100-80gb": ["model=qwen3-32b", "gpu=h100-80gb"],
    "llama-3.1-70b/2xh200 tp2 max_model_len 8192": ["model=llama-3.1-70b", "gpu=h200",
                                                    "engine.tensor_parallel_size=2", "engine.max_model_len=8192"],
    "qwen3-30b-a3b/h100-80gb": ["model=qwen3-30b-a3b", "gpu=h100-80gb"],
}
SLO_S = 2.0
PLAN_LOAD = 2.5  # the plan's traffic, in verified single-replica rates


def _long_run(run: Any) -> dict[str, Any]:
    """One long run's row; `ttft_p90_ci` None where no request was measured in a window (a run too short for one,
    or stalled: `kvsim.planning.window.metric_stats` gives no interval over no values; it was a KeyError)."""
    ev = run.evidence
    return {"rate_per_s": round(run.rate, 4), "passed": run.passed, "num_requests": ev["num_requests"],
            "verdict": ev["verdict"], "ttft_p90_s": ev["ttft_s"]["p90"], "ttft_p90_ci": ev["ttft_s"].get("p90_ci"),
            "served_over_offered": ev["served_over_offered"], "backlog_trend": ev["backlog_trend"],
            "window_s": ev["window_s"], "num_in_window": ev["num_in_window"]}


def rate_evidence(sets: list[str], cfg: StudyConfig) -> dict[str, Any]:
    """The report's search from N and from 4N requests a probe, and the long runs of N's answer."""
    base = variant(load_scenario(None, sets, default=REPORT_SCENARIO), "steps=none", "engine.allocator=paged")
    slo = {"ttft_s.p90": SLO_S}

    def search(first: int, verify_factor: int) -> tuple[Any, float]:
        wall = time.perf_counter()
        (s,) = search_rates(lambda _, rate, n: variant(base, poisson(rate), f"workload.num_requests={n}"), 1, slo,
                            partial(run_evidence, workers=1), num_requests=first, max_requests=cfg.rate_max_requests,
                            verify_factor=verify_factor, max_verify_requests=cfg.rate_max_verify_requests)
        return s, time.perf_counter() - wall

    n_search, n_wall = search(cfg.rate_requests, cfg.rate_verify_factor)
    four_search, four_wall = search(4 * cfg.rate_requests, 0)
    n_rate, four_rate = n_search.search_rate, four_search.search_rate
    return {
        "overrides": sets,
        "n": {"first_requests": cfg.rate_requests, "search_rate_per_s": round(n_rate, 4),
              "rates_by_length": {k: round(v, 4) for k, v in n_search.summary()["rates_by_length"].items()},
              "converged": n_search.converged, "capped": n_search.capped,
              "num_probes": n_search.summary()["num_probes"], "wall_s": round(n_wall, 1)},
        "four_n": {"first_requests": 4 * cfg.rate_requests, "search_rate_per_s": round(four_rate, 4),
                   "rates_by_length": {k: round(v, 4) for k, v in four_search.summary()["rates_by_length"].items()},
                   "converged": four_search.converged, "capped": four_search.capped,
                   "num_probes": four_search.summary()["num_probes"], "wall_s": round(four_wall, 1)},
        "n_vs_four_n_rel_diff": round(abs(n_rate - four_rate) / four_rate, 4) if four_rate else None,
        "long_runs": [_long_run(r) for r in n_search.long_runs],
        "reported_rate_per_s": round(n_search.rate, 4), "verified": n_search.verified,
        "reported_vs_search_rel_diff": round(1 - n_search.rate / n_rate, 4) if n_rate else None,
    }


def long_evidence(sets: list[str], rate_per_s: float, num_requests: int, max_tries: int = 8) -> list[dict[str, Any]]:
    """The stored answer run with `num_requests` requests, backed off 3 % a time until it holds (as the
    search's verification does, each run judged as its long runs are: `long_run_evidence`): for a search capped
    at 12,800 a probe whose first long run the 64,000 cap of an earlier commit made only 5x longer."""
    from kvsim.planning.slo import probe_passes
    from kvsim.planning.steady_state import LongRun
    from kvsim.planning.verify import long_run_evidence

    base = variant(load_scenario(None, sets, default=REPORT_SCENARIO), "steps=none", "engine.allocator=paged")
    runs: list[dict[str, Any]] = []
    rate = rate_per_s
    for _ in range(max_tries):
        (ran,) = run_evidence([variant(base, poisson(rate), f"workload.num_requests={num_requests}")], workers=1)
        evidence = long_run_evidence(ran)
        passed = probe_passes(evidence, {"ttft_s.p90": SLO_S})
        runs.append(_long_run(LongRun(rate, passed, evidence)))
        if passed:
            break
        rate *= 0.97
    return runs


def plan_evidence(sets: list[str], rate_per_s: float) -> dict[str, Any]:
    """`kvsim plan` (replica search, verification and re-search) for `PLAN_LOAD` × the verified rate."""
    from kvsim.planning.plan import plan
    from kvsim.planning.spec import make_plan_spec

    base = variant(load_scenario(None, sets, default=REPORT_SCENARIO), "steps=none", "engine.allocator=paged",
                   poisson(PLAN_LOAD * rate_per_s), "workload.num_requests=400")
    gpu = base.gpu
    spec = make_plan_spec({"slo": {"ttft_s.p90": SLO_S}, "gpus": [gpu],
                           "tensor_parallel_sizes": [base.engine.tensor_parallel_size], "max_replicas": 16})
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        (row,), _ = plan(base, spec, Path(out) / "plan")
    keep = ("replicas", "searched_replicas", "verified", "verify_num_requests", "verify_verdict",
            "verify_ttft_s.p90", "verify_ttft_s.p90_ci", "search_verdict", "search_ttft_s.p90", "lower_bound_replicas",
            "bound_binds", "gap_breakdown", "verify_attempts")
    return {"traffic_rate_per_s": round(PLAN_LOAD * rate_per_s, 4), "probe_requests": 400,
            **{k: row.get(k) for k in keep}, "wall_s": round(time.perf_counter() - wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", action="append", choices=list(SETTINGS), help="[all]")
    parser.add_argument("--plan", action="store_true", help="also size a fleet for 2.5x the verified rate")
    parser.add_argument("--plan-only", action="store_true", help="only the plan, from the stored verified rate")
    parser.add_argument("--long-only", type=int, metavar="N", help="only a long run of N requests at the stored rate")
    args = parser.parse_args()
    cfg = StudyConfig()
    for name in args.setting or list(SETTINGS):
        if args.long_only:
            stored = json.loads(RESULTS.read_text(encoding="utf-8"))[name]
            runs = long_evidence(SETTINGS[name], stored["reported_rate_per_s"], args.long_only)
            results = json.loads(RESULTS.read_text(encoding="utf-8"))
            results[name][f"long_runs_{args.long_only}"] = runs
            RESULTS.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
            print(json.dumps({name: runs}, indent=2), flush=True)
            continue
        if args.plan_only:
            stored = json.loads(RESULTS.read_text(encoding="utf-8"))[name]
            plan_out = plan_evidence(SETTINGS[name], stored["reported_rate_per_s"])
            # read again: another setting may have landed meanwhile
            results = json.loads(RESULTS.read_text(encoding="utf-8"))
            results[name]["plan"] = plan_out
            RESULTS.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
            print(json.dumps({name: plan_out}, indent=2), flush=True)
            continue
        out = rate_evidence(SETTINGS[name], cfg)
        if args.plan and out["reported_rate_per_s"]:
            out["plan"] = plan_evidence(SETTINGS[name], out["reported_rate_per_s"])
        out["date"] = datetime.now(UTC).isoformat(timespec="seconds")
        results = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.exists() else {}
        results.update({"machine": platform.machine(), "python": platform.python_version(),
                        "slo": {"ttft_s.p90": SLO_S}, name: out})
        RESULTS.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(json.dumps({name: out}, indent=2), flush=True)


if __name__ == "__main__":
    main()
