"""kvsim's accuracy on every public measured run: regenerates the README table and the JSON.

    python benchmarks/accuracy.py [--validation benchmarks/validation_set] [--no-readme]

For each case under `<validation>/measured/<hardware>/<case>/`: the measured means, kvsim with
the roofline alone, kvsim calibrated from the imported measured profile of that GPU and model
(`<validation>/profiles/...`), and the peer LLMServingSim's own prediction, each with its error
against the measurement (the JSON also keeps each replay's whole error table: percentiles,
throughput, running and waiting). Writes `benchmarks/results/accuracy.json` and rewrites the table
between the `accuracy:start` / `accuracy:end` markers in README.md, and the calibrated replays'
overlay figures to `docs/accuracy_<case>_{timeseries,latency_cdf}.png`. Deterministic: no
wall-clock time enters any number.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvsim.model.errors import KvsimError
from kvsim.results.render import rows_to_markdown
from kvsim.validation.compare import default_profile, request_stats, save_figures, validate
from kvsim.validation.measured import MeasuredRun, load_measured

REPO = Path(__file__).resolve().parents[1]
VALIDATION = REPO / "benchmarks" / "validation_set"  # the subset of ../shared/validation it needs, shipped
RESULT = REPO / "benchmarks" / "results" / "accuracy.json"
DOCS = REPO / "docs"
METRICS = ("TTFT mean (s)", "TPOT mean (s)", "E2E mean (s)", "makespan (s)", "output tokens/s")
START, END = "<!-- accuracy:start -->", "<!-- accuracy:end -->"


def case_accuracy(run_dir: Path, figures: bool = False) -> dict[str, Any]:
    """Measured vs roofline vs calibrated vs LLMServingSim on one case (errors in %); with `figures`,
    the calibrated replay's overlay figures go to `docs/accuracy_<case>_*.png`."""
    run = load_measured(run_dir)
    entry: dict[str, Any] = {"case": run.name, "hardware": run.hardware, "model_id": run.model_id,
                             "parallelism": _parallelism(run),
                             "num_requests": len(run.requests), "predictions": {}}
    measured = request_stats(run.requests)
    entry["measured"] = {m: measured[m] for m in METRICS}
    if run.peer is not None:
        entry["predictions"]["llmservingsim"] = _with_errors(request_stats(run.peer), measured)
    profile = default_profile(run_dir, run)
    for latency in ("roofline", "calibrated"):
        try:
            v = validate(run, latency=latency, profile=profile)
        except KvsimError as error:
            entry["predictions"][f"kvsim_{latency}"] = {"unavailable": str(error)}
            continue
        entry["predictions"][f"kvsim_{latency}"] = _with_errors({r["metric"]: r["kvsim"] for r in v.rows}, measured)
        entry["predictions"][f"kvsim_{latency}"]["latency_model"] = v.result.summary["latency_model"]
        entry["predictions"][f"kvsim_{latency}"]["table"] = v.rows  # every metric, with LLMServingSim's
        if latency == "calibrated" and figures:
            save_figures(v, DOCS, prefix=f"accuracy_{run.name}_")
    entry["profile"] = str(profile.relative_to(run_dir.resolve().parents[2])) if profile else None
    return entry


def _parallelism(run: MeasuredRun) -> str:
    text = f"TP {run.engine.get('tensor_parallel_size', 1)}"
    if run.data_parallel_size > 1:
        text += f", DP {run.data_parallel_size}"
    return text + (", EP" if run.expert_parallel else "")


def _with_errors(predicted: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in METRICS:
        value, reference = predicted.get(m), measured[m]
        out[m] = value
        out[f"{m} error %"] = None if value is None or not reference else (value - reference) / reference * 100
    return out


def markdown_table(entries: list[dict[str, Any]]) -> str:
    """One row per case and predictor: the three latency means and makespan, value (error)."""
    rows = []
    for e in entries:
        rows.append({"case": f"{e['case']} ({e['parallelism']})", "predictor": "measured (vLLM 0.19)",
                     **{m: f"{e['measured'][m]:.4g}" for m in METRICS[:4]}})
        for key, label in (("kvsim_roofline", "kvsim roofline"), ("kvsim_calibrated", "kvsim calibrated"),
                           ("llmservingsim", "LLMServingSim")):
            p = e["predictions"].get(key)
            if p is None:
                continue
            if "unavailable" in p:
                why = "MoE not yet modelled" if "MoE" in p["unavailable"] else "unavailable (see JSON)"
                rows.append({"case": "", "predictor": f"{label}: {why}", **{m: "—" for m in METRICS[:4]}})
                continue
            rows.append({"case": "", "predictor": label,
                         **{m: f"{p[m]:.4g} ({p[m + ' error %']:+.1f} %)" for m in METRICS[:4]}})
    return rows_to_markdown(rows)


def update_readme(table: str, readme: Path = REPO / "README.md") -> None:
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme}: markers {START} / {END} not found")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{table}{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validation", type=Path, default=VALIDATION)
    parser.add_argument("--no-readme", action="store_true", help="write only the JSON (no README, no figures)")
    args = parser.parse_args()
    entries = [case_accuracy(d, figures=not args.no_readme)
               for d in sorted((args.validation / "measured").glob("*/*")) if d.is_dir()]
    RESULT.write_text(json.dumps({"validation_set": "../shared/validation (LLMServingSim @ 5daddb2, MIT)",
                                  "metrics": list(METRICS), "cases": entries}, indent=2) + "\n")
    table = markdown_table(entries)
    print(table)
    if not args.no_readme:
        update_readme(table)


if __name__ == "__main__":
    main()
