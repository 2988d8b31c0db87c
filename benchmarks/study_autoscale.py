"""Autoscaled vs static fleets on a trace whose rate varies: GPU-hours and SLO attainment over time.

    python benchmarks/study_autoscale.py [--static 2,3,4,6] [--set autoscaler.startup_s=60 ...] [--output F]

A study, not a speed benchmark. `scenarios/azure-autoscale.yaml` (the Azure 2023 conversation
trace's real hour, CC-BY 4.0, Patel et al., ISCA 2024) runs autoscaled, then as static fleets of
each size in `--static` (the same scenario without `autoscaler`). Every fleet is billed from t = 0
to its last request's end; SLO attainment is the share of requests (by 5-minute window of
arrivals, and overall) that finished with TTFT and TPOT within the scenario's `slo_ttft_s` and
`slo_tpot_s`. Writes `benchmarks/results/autoscale.json` (or `--output`: a new file or an earlier result of
this study, checked before the study runs; bad input is one line, exit 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from result_file import check_result_file, one_line, write_result_file

from kvsim.fleet.autoscaled import simulate_autoscaled, slo_attainment
from kvsim.fleet.driver import simulate_fleet
from kvsim.workload.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "azure-autoscale.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "autoscale.json"
RESULT_KEYS = frozenset({"scenario", "overrides", "autoscaler", "windows_s", "fleets"})


def main() -> None:
    with one_line("study_autoscale.py"):  # a bad --set or --output: one line, before the study runs
        study()


def study() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--static", default="2,3,4,6")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="a scenario override, as kvsim run --set (e.g. workload.trace.rate_scale=4)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    check_result_file("study_autoscale.py", args.output, RESULT_KEYS)  # before the study, not after
    overrides = args.overrides
    scaled_spec = load_scenario(SCENARIO, overrides)
    config = scaled_spec.autoscaler
    assert config is not None
    scaled = simulate_autoscaled(scaled_spec)
    auto = scaled.summary["autoscaling"]
    rows = [{"fleet": "autoscaled", "gpu_hours": auto["gpu_hours"], "mean_gpus": auto["mean_gpus"],
             "slo_attainment": auto["slo_attainment"], "worst_window": auto["worst_window_slo_attainment"],
             "ttft_p90_s": scaled.summary["ttft_s"]["p90"], "tpot_p90_s": scaled.summary["tpot_s"]["p90"],
             "per_window": scaled.tables["slo"]["slo_attainment"].round(4).tolist()}]
    for size in (int(n) for n in args.static.split(",")):
        spec = scaled_spec.model_copy(update={"autoscaler": None, "replicas": size})
        static = simulate_fleet(spec)
        req = static.requests
        end_s = float((req["arrival_s"] + req["e2e_s"]).max())
        slo = slo_attainment(req, config.slo_ttft_s, config.slo_tpot_s, config.slo_window_s)
        met = float((slo["slo_attainment"] * slo["num_requests"]).sum() / slo["num_requests"].sum())
        rows.append({"fleet": f"static-{size}", "gpu_hours": size * end_s / 3600, "mean_gpus": float(size),
                     "slo_attainment": met, "worst_window": float(slo["slo_attainment"].min()),
                     "ttft_p90_s": static.summary["ttft_s"]["p90"], "tpot_p90_s": static.summary["tpot_s"]["p90"],
                     "per_window": slo["slo_attainment"].round(4).tolist()})
    result = {"scenario": str(SCENARIO.relative_to(ROOT)), "overrides": overrides,
              "autoscaler": config.model_dump(mode="json"),
              "windows_s": scaled.tables["slo"]["window_start_s"].tolist(), "fleets": rows}
    write_result_file("study_autoscale.py", args.output, RESULT_KEYS, result)
    for row in rows:
        print(f"{row['fleet']:>12}  {row['gpu_hours']:6.2f} GPU-h  SLO {row['slo_attainment']:.3f} "
              f"(worst 5-min window {row['worst_window']:.3f})  TTFT p90 {row['ttft_p90_s']:.2f} s")


if __name__ == "__main__":
    main()
