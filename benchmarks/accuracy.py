"""kvsim's accuracy on every public measured run: regenerates the tables of docs/accuracy.md and the JSON.

    python benchmarks/accuracy.py [--validation benchmarks/validation_set] [--no-docs]

For each case under `<validation>/measured/<hardware>/<case>/`: the measured means, kvsim with
the roofline alone, kvsim calibrated from the imported measured profile of that GPU and model
(`<validation>/profiles/...`), and the peer LLMServingSim's own prediction, each with its error
against the measurement (the JSON also keeps each replay's whole error table: percentiles,
throughput, running and waiting). Writes `benchmarks/results/accuracy.json` and rewrites the table
between the `accuracy:start` / `accuracy:end` markers in docs/accuracy.md, and the calibrated replays'
overlay figures to `docs/accuracy_<case>_{timeseries,latency_cdf}.png`, and the leave-one-GPU-out
per-op table (from `kvsim/model/presets/efficiency.yaml`, which `benchmarks/fit_efficiency.py`
regenerates) between the `logo:start` / `logo:end` markers. Deterministic: no
wall-clock time enters any number.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from kvsim.model.config import load_gpu
from kvsim.model.errors import KvsimError
from kvsim.results.render import rows_to_markdown
from kvsim.validation.compare import (
    PHASE_METRICS,
    SPLIT_METRICS,
    measured_phase_rates,
    request_stats,
    save_figures,
    ttft_split,
    validate,
)
from kvsim.validation.measured import MeasuredRun, load_measured
from kvsim.validation.replay import HARDWARE_GPUS, default_profile

REPO = Path(__file__).resolve().parents[1]
VALIDATION = REPO / "benchmarks" / "validation_set"  # the subset of ../shared/validation it needs, shipped
RESULT = REPO / "benchmarks" / "results" / "accuracy.json"
DOCS = REPO / "docs"
PAGE = DOCS / "accuracy.md"  # the page whose markers both tables are written between
METRICS = ("TTFT mean (s)", "TPOT mean (s)", "E2E mean (s)", "makespan (s)", "output tokens/s",
           *SPLIT_METRICS, *PHASE_METRICS)
START, END = "<!-- accuracy:start -->", "<!-- accuracy:end -->"
LOGO_START, LOGO_END = "<!-- logo:start -->", "<!-- logo:end -->"
EFFICIENCY = REPO / "kvsim" / "model" / "presets" / "efficiency.yaml"
LOGO_CLASSES = (("gemm", "GEMMs"), ("token_op", "norms, rotary, activation, adds (per layer)"))


@contextmanager
def _gpu_file(raw: dict[str, Any]) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="kvsim-logo-") as tmp:
        path = Path(tmp) / f"{raw['name']}.yaml"
        path.write_text(yaml.safe_dump({k: v for k, v in raw.items() if k != "name"}), encoding="utf-8")
        yield str(path)


def logo_gpu_file(run: MeasuredRun) -> Any:
    """A GPU file of the run's preset whose `efficiency` is its leave-one-GPU-out fit (a context manager
    giving the file's path), or None when the run's GPU has no held-out fit."""
    preset = HARDWARE_GPUS.get(run.hardware or "")
    logo = leave_one_gpu_out()
    if preset is None or preset not in logo:
        return None
    raw = load_gpu(preset).model_dump(mode="json")
    raw["name"] = f"{preset}-held-out"
    raw["efficiency"] = {k: v for k, v in logo[preset]["fitted"].items() if k != "source"}
    return _gpu_file(raw)


def leave_one_gpu_out() -> dict[str, Any]:
    """The leave-one-GPU-out per-op errors `benchmarks/fit_efficiency.py` stored with the fitted fractions."""
    import yaml

    return yaml.safe_load(EFFICIENCY.read_text(encoding="utf-8"))["leave_one_gpu_out"]


def logo_table(logo: dict[str, Any]) -> str:
    """One row per held-out GPU and op class: trained on, mean / p90 |error| per op, error of the summed time."""
    rows = []
    for gpu, entry in logo.items():
        for cls, label in LOGO_CLASSES:
            e = entry["errors_pct"].get(cls)
            if e is None:
                continue
            rows.append({"held-out GPU": gpu, "fitted on": ", ".join(entry["trained_on"]), "ops": label,
                         "samples": str(e["num_samples"]), "mean abs error": f"{e['mean_abs_pct']:.1f} %",
                         "p90 abs error": f"{e['p90_abs_pct']:.1f} %", "signed mean": f"{e['signed_mean_pct']:+.1f} %",
                         "summed time": f"{e['sum_pct']:+.1f} %"})
    return rows_to_markdown(rows)


def case_accuracy(run_dir: Path, figures: bool = False) -> dict[str, Any]:
    """Measured vs roofline vs calibrated vs LLMServingSim on one case (errors in %); with `figures`,
    the calibrated replay's overlay figures go to `docs/accuracy_<case>_*.png`."""
    run = load_measured(run_dir)
    entry: dict[str, Any] = {"case": run.name, "hardware": run.hardware, "model_id": run.model_id,
                             "parallelism": _parallelism(run),
                             "num_requests": len(run.requests), "predictions": {}}
    measured = {**request_stats(run.requests), **dict.fromkeys(SPLIT_METRICS), **ttft_split(run.requests),
                **dict.fromkeys(PHASE_METRICS), **measured_phase_rates(run_dir)}
    entry["measured"] = {m: measured[m] for m in METRICS}
    if run.peer is not None:
        entry["predictions"]["llmservingsim"] = _with_errors({**request_stats(run.peer), **ttft_split(run.peer)},
                                                             measured)
    profile = default_profile(run_dir, run)
    for latency in ("roofline", "calibrated"):
        try:
            v = validate(run, latency=latency, profile=profile, measured_path=run_dir)
        except KvsimError as error:
            entry["predictions"][f"kvsim_{latency}"] = {"unavailable": str(error)}
            continue
        entry["predictions"][f"kvsim_{latency}"] = _with_errors({r["metric"]: r["kvsim"] for r in v.rows}, measured)
        entry["predictions"][f"kvsim_{latency}"]["latency_model"] = v.result.summary["latency_model"]
        entry["predictions"][f"kvsim_{latency}"]["table"] = v.rows  # every metric, with LLMServingSim's
        if latency == "calibrated" and figures:
            save_figures(v, DOCS, prefix=f"accuracy_{run.name}_")
    held_out = logo_gpu_file(run)
    if held_out is not None:  # the roofline with fractions fitted on the other GPUs of this memory type
        with held_out as gpu_file:
            v = validate(run, latency="roofline", gpu=gpu_file, measured_path=run_dir)
        entry["predictions"]["kvsim_roofline_held_out"] = {
            **_with_errors({r["metric"]: r["kvsim"] for r in v.rows}, measured),
            "latency_model": v.result.summary["latency_model"],
            "fractions_fitted_on": leave_one_gpu_out()[HARDWARE_GPUS[run.hardware or ""]]["trained_on"]}
    if run.link is not None and int(run.engine.get("tensor_parallel_size", 1)) > 1:
        # the same replay over the GPU preset's own link instead of the peer's fitted cluster link
        for latency in ("roofline", "calibrated"):
            v = validate(run, latency=latency, profile=profile, measured_path=run_dir, cluster_link=False)
            entry["predictions"][f"kvsim_{latency}_preset_link"] = {
                **_with_errors({r["metric"]: r["kvsim"] for r in v.rows}, measured),
                "latency_model": v.result.summary["latency_model"]}
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


TABLE_METRICS = (*METRICS[:4], *SPLIT_METRICS, *PHASE_METRICS)


def _cell(value: float | None, error: float | None = None) -> str:
    if value is None:
        return "—"
    return f"{value:.4g}" if error is None else f"{value:.4g} ({error:+.1f} %)"


def markdown_table(entries: list[dict[str, Any]]) -> str:
    """One row per case and predictor: the three latency means, makespan, TTFT's queue and prefill parts
    (vLLM's scheduled_ts splits them), and the prefill and decode speeds (from the measured per-second
    series), value (error)."""
    rows = []
    for e in entries:
        rows.append({"case": f"{e['case']} ({e['parallelism']})", "predictor": "measured (vLLM 0.19)",
                     **{m: _cell(e["measured"][m]) for m in TABLE_METRICS}})
        for key, label in (("kvsim_roofline", "kvsim roofline"), ("kvsim_calibrated", "kvsim calibrated"),
                           ("kvsim_roofline_held_out", "kvsim roofline, fractions fitted on other GPUs"),
                           ("kvsim_roofline_preset_link", "kvsim roofline, GPU preset's link"),
                           ("kvsim_calibrated_preset_link", "kvsim calibrated, GPU preset's link"),
                           ("llmservingsim", "LLMServingSim")):
            p = e["predictions"].get(key)
            if p is None:
                continue
            if "unavailable" in p:
                why = "MoE not yet modelled" if "MoE" in p["unavailable"] else "unavailable (see JSON)"
                rows.append({"case": "", "predictor": f"{label}: {why}", **{m: "—" for m in TABLE_METRICS}})
                continue
            rows.append({"case": "", "predictor": label,
                         **{m: _cell(p[m], p[m + " error %"]) if p[m + " error %"] is not None else "—"
                            for m in TABLE_METRICS}})
    return rows_to_markdown(rows)


def update_page(table: str, page: Path = PAGE, start: str = START, end: str = END) -> None:
    """Replace what lies between the `start` and `end` markers of `page` by `table` (read and written in UTF-8)."""
    text = page.read_text(encoding="utf-8")
    if start not in text or end not in text:
        raise SystemExit(f"{page}: markers {start} / {end} not found")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    page.write_text(f"{head}{start}\n{table}{end}{tail}", encoding="utf-8")


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (`argv`, else `sys.argv`'s): `--validation` and `--no-docs` (named `--no-readme` while the
    tables were in README.md; they are in docs/accuracy.md)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validation", type=Path, default=VALIDATION)
    parser.add_argument("--no-docs", action="store_true",
                        help="write only the JSON (no docs/accuracy.md tables, no figures)")
    return parser.parse_args(argv)


def main() -> None:
    args = arguments()
    entries = [case_accuracy(d, figures=not args.no_docs)
               for d in sorted((args.validation / "measured").glob("*/*")) if d.is_dir()]
    logo = leave_one_gpu_out()
    RESULT.write_text(json.dumps({"validation_set": "../shared/validation (LLMServingSim @ 5daddb2, MIT)",
                                  "metrics": list(METRICS), "cases": entries,
                                  "leave_one_gpu_out": {
                                      g: {k: e[k] for k in ("trained_on", "memory_type", "errors_pct")}
                                      for g, e in logo.items()}}, indent=2) + "\n", encoding="utf-8")
    table = markdown_table(entries)
    print(table)
    print(logo_table(logo))
    if not args.no_docs:
        update_page(table)
        update_page(logo_table(logo), start=LOGO_START, end=LOGO_END)


if __name__ == "__main__":
    main()
