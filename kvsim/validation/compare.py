"""Hold kvsim against a real run: replay it, simulate it, and tabulate the errors.

    run = load_measured("benchmarks/validation_set/measured/RTXPRO6000/Llama-3.1-8B")
    v = validate(run, latency="roofline")           # → Validation(table rows, sim result)
    write_validation(v, "validation/llama")         # Markdown, JSON, CSV, figures, scenario

The replayed scenario keeps the measured run's arrivals (the engine's `queued_ts`, the clock
its TTFT is measured on), prompt and output lengths, token ids (so prefix-cache hits are the
real ones) and engine arguments (vLLM's names; vLLM's defaults where the run left one out).
Errors are (kvsim − measured) / measured. The peer simulator LLMServingSim's prediction of
the same run, where the folder holds it, is a second column with its own errors.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.model.config import load_gpu, load_model
from kvsim.model.errors import KvsimError, shown
from kvsim.validation.frame import series_tick_s
from kvsim.validation.measured import MeasuredRun, series_number
from kvsim.validation.recorded import recorded_settings
from kvsim.validation.replay import build_scenario, id_name, label_disagreement, resolve_gpu, resolve_model
from kvsim.workload.files import csv_rows, data_file, open_text
from kvsim.workload.scenario import Scenario
from kvsim.workload.traces import write_sharegpt_tokens

if TYPE_CHECKING:
    import pandas as pd

    from kvsim.results.run_result import RunResult

TRACE_FILE = "workload.jsonl"
PERCENTILES = {"mean": None, "p50": 50, "p90": 90, "p99": 99}


@dataclass(frozen=True)
class Validation:
    """The comparison: `rows` (one per metric: measured, kvsim, error, peer, peer error) and the run."""

    run: MeasuredRun
    scenario: Scenario
    result: RunResult
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def row(self, metric: str) -> dict[str, Any]:
        return next(r for r in self.rows if r["metric"] == metric)


# -- comparison ------------------------------------------------------------------------------

def _stat(values: np.ndarray, which: str) -> float | None:
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None
    q = PERCENTILES[which]
    return float(values.mean() if q is None else np.percentile(values, q))


def request_stats(df: pd.DataFrame) -> dict[str, float | None]:
    """Latency percentiles, makespan and output throughput of a request frame."""
    stats: dict[str, float | None] = {}
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        values = df[key].to_numpy(dtype=float)
        for which in PERCENTILES:
            stats[f"{label} {which} (s)"] = _stat(values, which)
    makespan = float(df["finish_s"].max() - df["arrival_s"].min()) if len(df) else 0.0
    stats["makespan (s)"] = makespan
    stats["output tokens/s"] = float(df["output_tokens"].sum()) / makespan if makespan > 0 else None
    return stats


def sample_steps(steps: pd.DataFrame, column: str, times_s: np.ndarray) -> np.ndarray:
    """The value of a per-step column at each instant; 0 where no step runs (idle or after the end)."""
    out = np.zeros(len(times_s))
    if not len(steps):
        return out
    start = steps["time_s"].to_numpy()
    end = start + steps["duration_s"].to_numpy()
    idx = np.clip(np.searchsorted(start, times_s, side="right") - 1, 0, None)
    inside = (times_s >= start[0]) & (times_s < end[idx])
    out[inside] = steps[column].to_numpy(dtype=float)[idx[inside]]
    return out


GAUGES = (("running mean", "vllm:num_requests_running", "running", "mean"),
          ("running max", "vllm:num_requests_running", "running", "max"),
          ("waiting max", "vllm:num_requests_waiting", "waiting", "max"),
          ("KV usage mean", "vllm:kv_cache_usage_perc", "kv_usage", "mean"))


def request_gauges(df: pd.DataFrame, times_s: np.ndarray) -> dict[str, np.ndarray]:
    """Running (first scheduled ≤ t < finish) and waiting (arrival ≤ t < first scheduled) at each
    instant, from per-request times: the gauges of a predictor that reports only requests."""
    t = times_s[:, None]
    arrival, scheduled, finish = (df[c].to_numpy()[None, :] for c in ("arrival_s", "first_scheduled_s", "finish_s"))
    return {"running": ((scheduled <= t) & (t < finish)).sum(axis=1).astype(float),
            "waiting": ((arrival <= t) & (t < scheduled)).sum(axis=1).astype(float)}


def series_stats(run: MeasuredRun, steps: pd.DataFrame) -> dict[str, dict[str, float | None]]:
    """Running / waiting / KV usage per source ("measured", "kvsim", "llmservingsim").

    vLLM's gauges are read once a second, so kvsim (and LLMServingSim, from its per-request
    times) are read at the same instants, on the same clock (seconds from the first arrival).
    Without a measured series, kvsim's figures are time-weighted over its steps and the others
    are unknown.
    """
    out: dict[str, dict[str, float | None]] = {"measured": {}, "kvsim": {}, "llmservingsim": {}}
    if "dp_rank" in steps:  # data-parallel engines step together: their gauges add up (usage: the mean)
        columns = {col: ("mean" if col == "vllm:kv_cache_usage_perc" else "sum") for _, col, _, _ in GAUGES}
        steps = steps.groupby("time_s", as_index=False).agg({"duration_s": "max", **columns})
    ts = run.timeseries
    if ts is None or not len(ts):
        dt = steps["duration_s"].to_numpy()
        for label, sim_col, _, how in GAUGES:
            sim = steps[sim_col].to_numpy(dtype=float)
            mean = float((sim * dt).sum() / dt.sum()) if dt.sum() > 0 else None
            out["kvsim"][label] = mean if how == "mean" else (float(sim.max()) if sim.size else None)
            out["measured"][label] = out["llmservingsim"][label] = None
        return out
    t = ts["t_s"].to_numpy()
    peer = run.peer
    peer_gauges = request_gauges(peer, t) if peer is not None and peer["first_scheduled_s"].notna().all() else {}
    for label, sim_col, ts_col, how in GAUGES:
        agg = np.nanmean if how == "mean" else np.nanmax
        measured = ts[ts_col].to_numpy(dtype=float)
        out["measured"][label] = None if np.isnan(measured).all() else float(agg(measured))
        out["kvsim"][label] = float(agg(sample_steps(steps, sim_col, t)))
        out["llmservingsim"][label] = float(agg(peer_gauges[ts_col])) if ts_col in peer_gauges else None
    return out


PHASE_METRICS = ("prompt tokens/s while prefilling", "generation tokens/s per running request")
SPLIT_METRICS = ("queue time mean (s)", "prefill time mean (s)")


def ttft_split(df: pd.DataFrame) -> dict[str, float]:
    """TTFT in its two parts, as vLLM's `vllm:request_queue_time_seconds` (arrival → first scheduled)
    and `vllm:request_prefill_time_seconds` (first scheduled → first token) split it, means over the
    requests; {} for a frame that does not record when each request was first scheduled (a bench JSON).
    A TTFT that matches with its parts off shows here: a prefill priced fast behind a longer queue."""
    if not len(df) or not df["first_scheduled_s"].notna().all():
        return {}
    scheduled = df["first_scheduled_s"].to_numpy(dtype=float)
    return {SPLIT_METRICS[0]: float(np.mean(scheduled - df["arrival_s"].to_numpy(dtype=float))),
            SPLIT_METRICS[1]: float(np.mean(df["first_token_s"].to_numpy(dtype=float) - scheduled))}


def measured_phase_rates(path: str | Path) -> dict[str, float | None]:
    """Prefill and decode speed separately, from vLLM's series (`vllm/timeseries.csv`, a row a tick, each second
    as the validation set reads it: `prompt_throughput`, `gen_throughput`, `running`): the mean prompt tokens/s
    over the ticks that prefilled anything, and generated tokens per second per running request (Σ gen / Σ
    running). A
    model that prices prefill slow and decode fast shows both here even when its latency means agree.
    No phase rates ({}) from a series without those columns; a cell that is not a finite number >= 0
    raises `KvsimError` naming the file, line and column. Read as `load_measured` reads the series:
    `timeseries.csv`, or its gzipped copy when only that exists."""
    series = data_file(Path(path) / "vllm" / "timeseries.csv")
    if not series.is_file():
        return {}

    with open_text(series, newline="") as f:
        reader = csv_rows(f, series)
        if not {"prompt_throughput", "gen_throughput", "running"} <= set(reader.fieldnames or []):
            return {}  # an older series without the throughput columns: no per-phase comparison
        rows = [tuple(series_number(r[c], c, f"{series}:{line_no}")
                      for c in ("prompt_throughput", "gen_throughput", "running"))
                for line_no, r in enumerate(reader, start=2)]
    prompt = [p for p, _, _ in rows if p > 0]
    running = sum(r for _, _, r in rows)
    return {PHASE_METRICS[0]: sum(prompt) / len(prompt) if prompt else None,
            PHASE_METRICS[1]: sum(g for _, g, _ in rows) / running if running else None}


def simulated_phase_rates(steps: pd.DataFrame, requests: pd.DataFrame, tick_s: float = 1.0
                          ) -> dict[str, float | None]:
    """`measured_phase_rates` of kvsim's run, binned into the same ticks of `tick_s` from the first arrival and
    counted as vLLM's logger counts them (`IterationStats.update_from_output`, vllm/v1/metrics/stats.py):
    a request's whole prompt, prefix-cache hits included, in the tick of its first token (chunks produce
    no output before it), and every token sampled as generated (`len(new_token_ids)` of each output, after
    truncation at max_tokens). The generation rate is a ratio of sums (Σ gen / Σ running), so its numerator
    is every finished request's `output_tokens` × `num_samples`: each token sampled once, its first, the
    one a recomputed request samples after a preemption, and a verify step's accepted drafts and its
    correction or bonus token included (step rows count a decoding or verifying sequence once and
    miss a recompute's token). Running is sampled at each tick's end (all data-parallel engines together). Rates
    are per second: a tick's tokens over `tick_s` (a series read every 5 s averages each 5 s, idle ones included,
    and 1-second bins of the same run prefilled faster)."""
    if not len(steps):
        return dict.fromkeys(PHASE_METRICS)
    ticks = np.floor((steps["time_s"] + steps["duration_s"]).to_numpy() / tick_s).astype(int)
    first = requests["first_token_s"].to_numpy(dtype=float)
    started = ~np.isnan(first)
    first_ticks = np.floor(first[started] / tick_s).astype(int)
    num_ticks = int(max(ticks.max(), first_ticks.max(initial=0))) + 1
    prompt = np.bincount(first_ticks, weights=requests["prompt_tokens"].to_numpy(dtype=float)[started],
                         minlength=num_ticks) / tick_s
    finished = (requests["status"] == "finished").to_numpy()
    generated = float((requests["output_tokens"].to_numpy(dtype=float) * requests["num_samples"].to_numpy())[finished]
                      .sum())
    if "dp_rank" in steps:
        steps = steps.groupby("time_s", as_index=False).agg({"duration_s": "max", "vllm:num_requests_running": "sum"})
    running = sample_steps(steps, "vllm:num_requests_running", np.arange(1, num_ticks + 1, dtype=float) * tick_s)
    busy = prompt[prompt > 0]
    return {PHASE_METRICS[0]: float(busy.mean()) if busy.size else None,
            PHASE_METRICS[1]: generated / tick_s / float(running.sum()) if running.sum() else None}


def _error_pct(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0 or math.isnan(value) or math.isnan(reference):
        return None
    return (value - reference) / reference * 100.0


def paired_requests(run: MeasuredRun, result: RunResult) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """The same requests on every side: (measured, kvsim's, LLMServingSim's or None), each the rows of the
    requests kvsim served (not rejected: a request the real engine served that kvsim's pool or `max_model_len`
    can never hold) and the run measured (not a failed request replayed for its load alone). Rows are paired by
    request index, not by position: the replay's request i is `run.records[i]`, whose `run.record_index[i]` is a
    measured row's `request_index` and the peer's row of that request (a replay ordered by send time pairs
    ties, and a closed-loop client's sends less its waits, in another order than the measured arrivals)."""
    status = result.requests.sort_values("request_id")["status"].to_numpy()
    assert len(status) == len(run.records), "one replayed request per record"
    replayed = (np.asarray(run.record_index) if run.record_index is not None
                else run.requests["request_index"].to_numpy())
    measured_index = run.requests["request_index"].to_numpy()
    served = run.requests[~np.isin(measured_index, replayed[status == "rejected"])].reset_index(drop=True)
    kept = served["request_index"].to_numpy()
    sim = result.requests.sort_values("request_id")
    sim = sim[np.isin(replayed, kept) & (status != "rejected")]
    peer = run.peer[np.isin(run.peer["request_index"].to_numpy(), kept)] if run.peer is not None else None
    return served, sim, peer


def compare(run: MeasuredRun, result: RunResult, phases: dict[str, float | None] | None = None) -> list[dict[str, Any]]:
    """One row per metric: measured, kvsim, error %, and LLMServingSim with its error % if present;
    TTFT's queue and prefill parts where the run records when each request was scheduled (`ttft_split`);
    with the measured `phases` (`measured_phase_rates`), prefill and decode speed rows as well. Every column's
    requests are the same (`paired_requests`): those kvsim served and the run measured (a rejected row, never
    scheduled, left kvsim's TTFT parts empty and its arrival began the makespan; LLMServingSim's column kept
    the requests kvsim rejected, which its own column and the measured one left out)."""
    served, kvsim_served, peer_served = paired_requests(run, result)
    measured = request_stats(served)
    simulated = request_stats(kvsim_served)
    peer = request_stats(peer_served) if peer_served is not None else {}
    gauges = series_stats(run, result.steps)
    measured.update(gauges["measured"])
    simulated.update(gauges["kvsim"])
    peer.update(gauges["llmservingsim"])
    split = ttft_split(served)
    if split:
        measured.update(split)
        simulated.update(ttft_split(kvsim_served))
        if peer_served is not None:
            peer.update(ttft_split(peer_served))
    if phases:
        measured.update(phases)
        simulated.update(simulated_phase_rates(result.steps, result.requests, series_tick_s(run.timeseries)))
    rows = []
    for metric, value in measured.items():
        row: dict[str, Any] = {"metric": metric, "measured": value, "kvsim": simulated.get(metric),
                               "kvsim_error_pct": _error_pct(simulated.get(metric), value)}
        if run.peer is not None:
            row["llmservingsim"] = peer.get(metric)
            row["llmservingsim_error_pct"] = _error_pct(peer.get(metric), value)
        rows.append(row)
    return rows


# -- run it ------------------------------------------------------------------------------------

def validate(run: MeasuredRun, *, latency: str = "roofline", profile: str | Path | None = None,
             model: str | None = None, gpu: str | None = None, overrides: list[str] | None = None,
             trace_dir: Path | None = None, measured_path: str | Path | None = None,
             cluster_link: bool = True, progress: Callable[[float, int, int], None] | None = None) -> Validation:
    """Replay `run` in kvsim and compare. The replayed workload is written to `trace_dir`
    (a temporary folder if None) as `workload.jsonl`, beside which the scenario resolves it.
    `measured_path` (the folder or bench JSON `run` was loaded from) adds what the run recorded
    (`recorded_settings`: GPU, KV pool, a bench result's engine arguments) and, for a folder, the
    per-phase speed rows (`measured_phase_rates`); `cluster_link` as in `build_scenario`;
    `progress`: the replay's `(simulated s, requests done, total)` callback, as `simulate`'s."""
    from kvsim.engine.simulate import simulate

    recorded = recorded_settings(measured_path) if measured_path is not None else {}
    phases = measured_phase_rates(measured_path) if measured_path is not None and Path(measured_path).is_dir() \
        else {}  # read before the replay: a malformed series fails in a second, not after it
    model_name = resolve_model(run, model)
    gpu_name = resolve_gpu(run, gpu, recorded)
    load_model(model_name), load_gpu(gpu_name)  # fail early, with the field named
    with tempfile.TemporaryDirectory(prefix="kvsim-validate-") as tmp:
        folder = trace_dir or Path(tmp)
        trace_path = folder / TRACE_FILE
        write_sharegpt_tokens(run.records, trace_path)
        scenario = build_scenario(run, trace_path, model=model_name, gpu=gpu_name, latency=latency,
                                  profile=profile, overrides=overrides, recorded=recorded,
                                  cluster_link=cluster_link)
        if run.speculative_config is not None and scenario.engine.speculative_config is None:  # it was dropped
            raise KvsimError(f"measured run {run.name}: engine_kwargs.speculative_config="
                             f"{shown(run.speculative_config)}: the run drafted speculatively, and vLLM records no "
                             "acceptance model to replay it with; give one with --set engine.speculative_config=...")
        result = simulate(scenario, progress=progress)
    notes = list(run.notes)
    if model is None and model_name != id_name(run.model_id):
        notes.append(f"the run's model {run.model_id} replays as preset {model_name}, its base model's architecture")
    notes += _read_notes(run, recorded, gpu, gpu_name)
    rejected = result.summary.get("num_rejected", 0)
    if rejected and rejected >= len(run.records):  # the table would be empty: every statistic "not recorded"
        why = "; ".join(f"{reason}: {n:,}" for reason, n in result.summary["reject_reasons"].items())
        raise KvsimError(f"measured run {run.name}: kvsim rejects all {len(run.records):,} of its requests ({why}), "
                         "which the run served: nothing is left to compare; check the engine settings it replays "
                         "(meta.json's engine_kwargs, --set)")
    if rejected:
        notes.append(f"kvsim rejected {rejected} of the replayed requests ({result.summary['reject_reasons']}); "
                     "the measured statistics leave the same requests out")
    if run.peer is None:
        notes.append("no LLMServingSim prediction (outputs/sim.csv) beside this run")
    if scenario.gpu_link is not None and scenario.engine.tensor_parallel_size > 1:
        link = scenario.gpu_link
        notes.append(f"tensor-parallel all-reduces cross the cluster's link as its config.json describes it "
                     f"({link.bandwidth_bytes_per_s / 2**30:g} GB/s of 2^30 bytes, as ASTRA-Sim reads it, "
                     f"{link.latency_s * 1e6:g} us per hop), "
                     "not the GPU preset's datasheet link")
    return Validation(run=run, scenario=scenario, result=result, rows=compare(run, result, phases), notes=notes)


def _read_notes(run: MeasuredRun, recorded: dict[str, Any], gpu: str | None, gpu_name: str) -> list[str]:
    """What the replay took from the run, as notes: the engine arguments its engine_kwargs gave, what it recorded
    besides (`recorded_settings`; its GPU unless `--gpu` stood for it) and, where it named no device, the hardware
    label the GPU preset came from. Each setting read is said; none is used unsaid."""
    notes = []
    if run.engine:
        notes.append("from the run's engine_kwargs: " + ", ".join(f"{k}={v}" for k, v in run.engine.items()))
    taken = ", ".join(f"{k}={v}" for k, v in recorded.items() if k != "gpu" or gpu is None)
    if taken:  # not "from what the run recorded: " and nothing, when --gpu stands for the one thing it did
        notes.append(f"from what the run recorded: {taken}" + (f" (gpu preset {gpu_name})" if gpu is None and
                                                                 "gpu" in recorded else ""))
    if gpu is None and "gpu" not in recorded:
        notes.append(f"the run names no GPU device: gpu preset {gpu_name} from its hardware label {run.hardware}")
    disagreement = label_disagreement(run, recorded, gpu_name) if gpu is None else None
    return notes + ([disagreement] if disagreement else [])


# -- output ------------------------------------------------------------------------------------

def _fmt(value: float | None, pct: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.1f} %" if pct else f"{value:,.4g}"


def table_rows(v: Validation) -> list[dict[str, str]]:
    """The error table as display strings (Markdown and the CLI's table)."""
    rows = []
    for r in v.rows:
        row = {"metric": r["metric"], "measured": _fmt(r["measured"]) if r["measured"] is not None
               else "not recorded", "kvsim": _fmt(r["kvsim"]), "kvsim error": _fmt(r["kvsim_error_pct"], True)}
        if "llmservingsim" in r:
            row["LLMServingSim"] = _fmt(r["llmservingsim"])
            row["LLMServingSim error"] = _fmt(r["llmservingsim_error_pct"], True)
        rows.append(row)
    return rows


def headline(v: Validation) -> str:
    s = v.result.summary
    return (f"{v.run.name} ({v.run.source}, {v.run.model_id}, {len(v.run.requests)} requests): kvsim "
            f"{s['model']} on {s['gpu']}, TP {v.scenario.engine.tensor_parallel_size}, latency {s['latency_model']}")


def to_json(v: Validation) -> dict[str, Any]:
    return {"case": v.run.name, "source": v.run.source, "model_id": v.run.model_id,
            "model": v.result.summary["model"], "gpu": v.result.summary["gpu"],
            "latency_model": v.result.summary["latency_model"], "profile": v.scenario.latency.profile,
            "engine": v.scenario.engine.model_dump(mode="json", exclude_defaults=True),
            "num_requests": len(v.run.requests), "rows": v.rows, "notes": v.notes}


def _figure_panels(v: Validation) -> tuple[list[dict], list[dict]]:
    steps, ts, peer = v.result.steps, v.run.timeseries, v.run.peer
    sim_t = steps["time_s"].to_numpy()
    peer_t = np.arange(0.0, float(peer["finish_s"].max()) + 0.5, 0.25) if peer is not None else np.zeros(0)
    peer_gauges = request_gauges(peer, peer_t) if peer is not None and peer["first_scheduled_s"].notna().all() \
        else {}
    gauges = []
    for title, sim_col, ts_col in (("running", "vllm:num_requests_running", "running"),
                                   ("waiting", "vllm:num_requests_waiting", "waiting"),
                                   ("KV usage", "vllm:kv_cache_usage_perc", "kv_usage")):
        series = []
        if ts is not None and not ts[ts_col].isna().all():
            series.append(("measured", ts["t_s"].to_numpy(), ts[ts_col].to_numpy()))
        series.append(("kvsim", sim_t, steps[sim_col].to_numpy()))
        if ts_col in peer_gauges:
            series.append(("LLMServingSim", peer_t, peer_gauges[ts_col]))
        gauges.append({"title": title if ts is None or not ts[ts_col].isna().all()
                       else f"{title} (not recorded in the measured run)",
                       "xlabel": "seconds from the first arrival", "ylabel": title, "series": series, "step": True})
    cdfs = []
    for key, label in (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "E2E (s)")):
        series = [("measured", None, v.run.requests[key].to_numpy()),
                  ("kvsim", None, v.result.requests[key].to_numpy())]
        if v.run.peer is not None:
            series.append(("LLMServingSim", None, v.run.peer[key].to_numpy()))
        cdfs.append({"title": f"{label} CDF", "xlabel": label, "ylabel": "fraction of requests",
                     "series": series, "cdf": True})
    return gauges, cdfs


def markdown(v: Validation, figures: bool = True) -> str:
    """The Markdown report; it links the two figures unless `figures` is false (none were drawn)."""
    from kvsim.results.render import rows_to_markdown

    lines = [f"# kvsim validation: {v.run.name}", "", headline(v) + ".", "",
             "Errors are (prediction − measured) / measured.", "", rows_to_markdown(table_rows(v))]
    if v.notes:
        lines += ["Notes:", "", *[f"- {n}" for n in v.notes], ""]
    if figures:
        lines += ["![running, waiting, KV usage](fig_timeseries.png)", "", "![latency CDFs](fig_latency_cdf.png)", ""]
    return "\n".join(lines)


def write_validation(v: Validation, out_dir: str | Path, figures: bool = True) -> Path:
    """`validation.md`, `validation.json`, `errors.csv`, two figures (unless `figures` is false: matplotlib
    is the costliest step of a small replay), and `sim/` (kvsim's run plus the replayed `scenario.yaml` and
    `workload.jsonl`, so `kvsim run sim/scenario.yaml` repeats it); the other files are the same either way.
    Written through `kvsim.results.output_dir.output_directory`: only over kvsim's own output, swapped into place
    when complete."""
    import dataclasses
    import json

    from kvsim.results.output_dir import output_directory
    from kvsim.results.render import rows_to_csv

    with output_directory(out_dir, "validation") as tmp:
        (tmp / "validation.md").write_text(markdown(v, figures), encoding="utf-8")
        (tmp / "validation.json").write_text(json.dumps(to_json(v), indent=2) + "\n", encoding="utf-8")
        (tmp / "errors.csv").write_text(rows_to_csv(v.rows), encoding="utf-8")
        v.run.requests.to_csv(tmp / "measured_requests.csv", index=False)
        # the replayed workload is written beside the scenario, which names it relative to its own folder
        replay = v.result.scenario.model_copy(update={"base_dir": str(tmp / "sim")})
        sim = dataclasses.replace(v.result, scenario=replay).write(tmp / "sim")
        write_sharegpt_tokens(v.run.records, sim / TRACE_FILE)
        if figures:
            save_figures(v, tmp)
    return Path(out_dir)


def save_figures(v: Validation, out_dir: Path, prefix: str = "fig_") -> tuple[Path, Path]:
    """`<prefix>timeseries.png` (running, waiting, KV usage over time) and `<prefix>latency_cdf.png`."""
    from kvsim.report.build import save_overlay_figure

    gauges, cdfs = _figure_panels(v)
    latency = v.result.summary["latency_model"]
    paths = out_dir / f"{prefix}timeseries.png", out_dir / f"{prefix}latency_cdf.png"
    save_overlay_figure(gauges, paths[0], f"{v.run.name}: measured vs kvsim ({latency})")
    save_overlay_figure(cdfs, paths[1], f"{v.run.name}: latency distributions, kvsim {latency}")
    return paths
