"""Fit kvsim's all-reduce cost to Vidur's NCCL measurements and report its error per setup and GPU count.

    python benchmarks/fit_collectives.py [--validation ../shared/validation]

Data: `profiles/vidur/network/<setup>/all_reduce.csv` (microsoft/vidur, MIT): NCCL all-reduce medians
against message size (2 KiB-64 MiB) and GPU count, on 8-GPU DGX nodes (NVSwitch: `a100_dgx`,
`h100_dgx`) and on NVLink-bridged pairs (`*_pairwise_nvlink`). Only rows whose GPUs share one node
are used (`devices_per_node` >= `num_workers`): kvsim's tensor parallelism stays inside a node.

The model is `kvsim.model.collectives.allreduce_s`, NCCL's own form:

    t = 2 (p − 1) / p · n / (η · link bandwidth) + 2 (p − 1) · λ + base

linear in (1/η, λ, base), so it is fitted by least squares on relative error over every size and GPU
count of a setup at once (the pooled form, for GPU counts not measured), and again at each GPU count p
alone as (η_p, one fixed cost c_p = 2 (p − 1) λ + base): NCCL's algorithm and protocol, hence the
bandwidth it reaches, change with the count. The fitted values of the DGX setups are the `link` of
the `h100-80gb` and `a100-80gb` presets (`efficiency`, `latency_s`, `collective_latency_s`, and
`by_num_gpus`); the script checks the presets hold them and writes `benchmarks/results/collectives.json`
with the errors of the preset link against every measurement (by setup, GPU count and size band),
those of the pooled form alone and those of the datasheet link kvsim used before (η 0.80, λ 0.5 us,
base 8.4 us); the bridged pairs are a cross-check only (no fit: the presets are SXM GPUs on NVSwitch).
Deterministic.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.model.collectives import allreduce_s
from kvsim.model.config import GPULink, load_gpu

REPO = Path(__file__).resolve().parents[1]
VALIDATION = REPO.parent / "shared" / "validation"
RESULT = REPO / "benchmarks" / "results" / "collectives.json"
SETUPS = {"h100_dgx": "h100-80gb", "a100_dgx": "a100-80gb", "h100_pairwise_nvlink": "h100-80gb",
          "a100_pairwise_nvlink": "a100-80gb"}
PRESET_SETUP = {"h100-80gb": "h100_dgx", "a100-80gb": "a100_dgx"}
BANDS = (("decode-sized, <= 256 KiB", 0, 2**18), ("256 KiB - 4 MiB", 2**18, 2**22), ("> 4 MiB", 2**22, 2**40))
BEFORE = {"efficiency": 0.80, "latency_s": 0.5e-6, "collective_latency_s": 8.4e-6}


def measurements(validation: Path, setup: str) -> list[tuple[int, int, float]]:
    """(num_gpus, bytes, seconds) of one setup, GPUs joined by NVLink only: within one DGX node, or the
    two GPUs of one bridged pair (a pairwise setup's 4-GPU rows cross PCIe between pairs)."""
    path = validation / "profiles" / "vidur" / "network" / setup / "all_reduce.csv"
    pairwise = "pairwise" in setup
    with path.open(newline="", encoding="utf-8") as f:
        return [(int(r["num_workers"]), int(r["size"]), float(r["time_stats.all_reduce.median"]) * 1e-3)
                for r in csv.DictReader(f) if int(r["devices_per_node"]) >= int(r["num_workers"])
                and (not pairwise or r["num_workers"] == "2")]


def fit(rows: list[tuple[int, int, float]], bandwidth: float) -> dict[str, float]:
    """η, λ (per ring step) and base latency minimising Σ (t_model / t − 1)²."""
    p, n, t = (np.array(c, dtype=float) for c in zip(*rows, strict=True))
    columns = np.stack([2 * (p - 1) / p * n / bandwidth, 2 * (p - 1), np.ones_like(p)], axis=1) / t[:, None]
    (inv_eta, step, base), *_ = np.linalg.lstsq(columns, np.ones_like(t), rcond=None)
    return {"efficiency": float(1 / inv_eta), "latency_s": float(max(step, 0.0)), "collective_latency_s": float(base)}


def fit_by_num_gpus(rows: list[tuple[int, int, float]], bandwidth: float) -> dict[int, dict[str, float]]:
    """η_p and the fixed cost c_p at each GPU count p, minimising Σ (t_model / t − 1)² over its sizes."""
    out = {}
    for gpus in sorted({r[0] for r in rows}):
        n, t = (np.array(c, dtype=float) for c in zip(*[(b, s) for p, b, s in rows if p == gpus], strict=True))
        columns = np.stack([2 * (gpus - 1) / gpus * n / bandwidth, np.ones_like(n)], axis=1) / t[:, None]
        (inv_eta, fixed), *_ = np.linalg.lstsq(columns, np.ones_like(t), rcond=None)
        out[gpus] = {"efficiency": float(1 / inv_eta), "fixed_s": float(max(fixed, 0.0))}
    return out


def link_errors(rows: list[tuple[int, int, float]], link: GPULink) -> dict[str, Any]:
    """Mean |error| and signed mean (%) of `link`'s all-reduce per GPU count and size band."""
    out: dict[str, Any] = {}
    for gpus in sorted({r[0] for r in rows}):
        for label, lo, hi in BANDS:
            pick = [(n, t) for p, n, t in rows if p == gpus and lo <= n < hi]
            if not pick:
                continue
            rel = np.array([allreduce_s(n, gpus, link) / t - 1 for n, t in pick])
            out[f"{gpus} GPUs, {label}"] = {"mean_abs_pct": round(float(np.abs(rel).mean() * 100), 1),
                                            "signed_mean_pct": round(float(rel.mean() * 100), 1),
                                            "num_sizes": len(pick)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validation", type=Path, default=VALIDATION)
    args = parser.parse_args()
    report: dict[str, Any] = {"source": "microsoft/vidur @ 7d47513 data/profiling/network (MIT)", "setups": {}}
    mismatched = []
    for setup, preset in SETUPS.items():
        rows = measurements(args.validation, setup)
        gpu = load_gpu(preset)
        link = gpu.resolved_link
        own = setup in PRESET_SETUP.values()
        fitted = fit(rows, link.bandwidth_bytes_per_s) if own else None
        by_count = fit_by_num_gpus(rows, link.bandwidth_bytes_per_s) if own else None
        pooled = link.model_copy(update={"by_num_gpus": None})
        before = pooled.model_copy(update=BEFORE)
        report["setups"][setup] = {"preset": preset, "fitted": fitted, "fitted_by_num_gpus": by_count,
                                   "preset_link": link_errors(rows, link), "pooled": link_errors(rows, pooled),
                                   "before": link_errors(rows, before)}
        if fitted is not None and by_count is not None:
            held = {"efficiency": link.efficiency, "latency_s": link.latency_s,
                    "collective_latency_s": link.collective_latency_s}
            if any(held[k] is None or abs(held[k] / v - 1) > 0.01 for k, v in fitted.items() if v):  # type: ignore[operator]
                mismatched.append(f"{preset}: preset link {held} but the fit gives {fitted}")
            have = {p: f.model_dump() for p, f in (link.by_num_gpus or {}).items()}
            if set(have) != set(by_count) or any(abs(have[p][k] / v - 1) > 0.01
                                                 for p, f in by_count.items() for k, v in f.items() if v):
                mismatched.append(f"{preset}: preset by_num_gpus {have} but the fit gives {by_count}")
    RESULT.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({s: {"fitted": r["fitted"], "preset_link": r["preset_link"]} for s, r in report["setups"].items()},
                     indent=1))
    if mismatched:
        raise SystemExit("update kvsim/model/presets/gpus.yaml:\n" + "\n".join(mismatched))


if __name__ == "__main__":
    main()
