"""Fit the roofline's achievable fractions per GPU from every public per-op profile, and check them
leave-one-GPU-out. Regenerates `kvsim/model/presets/efficiency.yaml`.

    python benchmarks/fit_efficiency.py [--validation ../shared/validation]

Profiles (all public, none of them a measured serving run that kvsim is validated on):
  - LLMServingSim's RTX PRO 6000 bundles (`profiles/RTXPRO6000/<org>/<model>/bf16/tp<N>/`, MIT):
    GEMMs, token ops, and the only attention grid at hand;
  - Vidur's `mlp.csv` on H100, A100 and A40 (`profiles/vidur/compute/<gpu>/...`, MIT): GEMMs and
    token ops at TP 1, 2, 4, 8.
Each token op's bytes are what its kernel reads and writes (`LayerShape.token_op_bytes`); Vidur's kernel
times get back the half microsecond its profiler's whole-microsecond records cut off (`untruncated`); a bundle's
TP-sharded token op whose TP > 1 rows equal its TP-1 rows is a copy, not a measurement, and is left
out (`without_tp1_copies`).
Per GPU with profiles, the GEMM fractions (ηb, ηf by size regime) and the token-op fractions
(t0 at the reference clock, ηt, ηl2, σ, the speed of each op kind; one op at a time, with the GPU's
datasheet L2 size and boost clock) are fitted on that GPU's profiles. The default for a GPU
without profiles is fitted on every profiled GPU of its memory type (HBM: H100 + A100; GDDR: A40 +
RTX PRO 6000). Leave-one-GPU-out: each profiled GPU is predicted by the default fitted on the other
GPUs of its memory type.
Attention fractions come from the RTX PRO 6000 grid only (no public HBM attention profile here),
so every entry carries them with that source. Deterministic.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from kvsim.latency.efficiency import Efficiency
from kvsim.latency.fitting import (
    TOKEN_OP_CLASS,
    LayerShape,
    OpSample,
    errors,
    fit_attention,
    fit_grouped_gemm,
    fit_op_fractions,
    op_samples,
    predict,
)
from kvsim.latency.profiles.bundle import read_bundle
from kvsim.latency.profiles.vidur import VIDUR_DEVICES, read_vidur_mlp
from kvsim.model.config import PRESETS_DIR, GPUSpec, load_gpu, load_model
from kvsim.model.weights import expert_params

REPO = Path(__file__).resolve().parents[1]
VALIDATION = REPO.parent / "shared" / "validation"
OUT = PRESETS_DIR / "efficiency.yaml"
BUNDLE_GPUS = {"RTXPRO6000": "rtx-pro-6000"}
BUNDLE_MODELS = {"meta-llama/Llama-3.1-8B": "llama-3.1-8b", "Qwen/Qwen3-32B": "qwen3-32b",
                 "Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b-instruct-2507"}
SOURCES = {"h100-80gb": "Vidur mlp.csv on H100-80GB SXM (Llama-2-70B, Qwen-72B, InternLM-20B; TP 1-8)",
           "a100-80gb": "Vidur mlp.csv on A100-80GB (Llama-2-7B/70B, Llama-3-8B, CodeLlama-34B; TP 1-8)",
           "a40": "Vidur mlp.csv on A40 (Llama-2-7B/70B; TP 1-8)",
           "rtx-pro-6000": "LLMServingSim bundles on RTX PRO 6000 (Llama-3.1-8B, Qwen3-32B, Qwen3-30B-A3B; TP 1-2)"}
MEMORY_TYPES = ("hbm", "gddr")
FITTED = ("gemm_flops", "gemm_bandwidth", "gemm_flops_by_regime", "gemm_floor_s", "token_op_bandwidth",
          "token_op_l2_bandwidth", "token_op_l2_share", "token_op_speed_by_class", "token_op_floor_s",
          "kernel_floor_s")
ATTENTION = ("decode_bandwidth", "mixed_decode_bandwidth", "prefill_flops", "grouped_gemm_fraction")


KINETO_TRUNCATION_S = 0.5e-6
"""What Vidur's records of a kernel lack on average: its profiler (`record_function` traces) sums the kernels'
`dur` from the PyTorch profiler's Chrome trace, which Kineto of its day wrote as whole microseconds cut down,
not rounded (`ChromeTraceLogger`'s `us(timestamp)` is `timestamp / 1000`: "No rounding!"), so a record of
2 us is a kernel of 2-3 us (the records are whole or half microseconds, medians of 20, many with no spread at
all: a steady duration cut to the same whole number). Added back per kernel to every sample: a GEMM is one
kernel, a token op `num_kernels` (Sarathi-Serve's `rms_norm`, `rotary_embedding`, `silu_and_mul` and
PyTorch's add); on records of 1-3 us that is 17-50 % of the op."""


def untruncated(samples: list[OpSample]) -> list[OpSample]:
    """`samples` (Vidur's) with `KINETO_TRUNCATION_S` added back for each kernel they time."""
    return [replace(s, measured_s=s.measured_s + KINETO_TRUNCATION_S * (s.num_kernels if s.op_class == TOKEN_OP_CLASS
                                                                         else 1))
            for s in samples]


def vidur_samples(validation: Path) -> list[OpSample]:
    """Every op sample of Vidur's `mlp.csv` files under `validation`, `untruncated`."""
    out: list[OpSample] = []
    for path in sorted((validation / "profiles" / "vidur" / "compute").glob("*/*/*/mlp.csv")):
        gpu = VIDUR_DEVICES[path.parts[-4]]
        for tp in (1, 2, 4, 8):
            p = read_vidur_mlp(path, tp)
            m = p.meta
            heads = int(m["num_attention_heads"])
            shape = LayerShape(int(m["hidden_size"]), heads, int(m["num_kv_heads"]), int(m["head_dim"]),
                               int(m["intermediate_size"]))
            out += untruncated(op_samples(p, shape, gpu, tp))
    return out


def _bundle_shape(model_id: str, profiled_layers: int | None) -> LayerShape:
    """The model's layer (an MoE bundle's dense.csv has no MLP ops: its width is unused), with the number of
    decoder layers the profiler ran (`hf_overrides.num_hidden_layers`; the whole model when not overridden)."""
    model = load_model(BUNDLE_MODELS[model_id])
    return LayerShape(model.hidden_size, model.num_attention_heads, model.num_kv_heads, model.head_dim,
                      model.intermediate_size, model.gated_mlp, dtype_bytes=model.dtype_bytes,
                      num_layers=profiled_layers or model.num_layers)


SHARDED_TOKEN_OPS = ("qk_norm", "rotary_emb", "act_fn")
"""Token ops whose tensors shrink with TP (`LayerShape.token_op_bytes`)."""


def without_tp1_copies(profile: Any, tp1: Any) -> Any:
    """`profile` (TP > 1) without the TP-sharded token ops whose rows are exactly `tp1`'s: the TP-1 time
    written at every degree (LLMServingSim's catalog once declared qk_norm TP-stable; its later catalog says
    so, and the Qwen3 bundles' TP-2 qk_norm rows equal TP-1's to the last digit), not a time of this
    rank's smaller tensors."""
    def rows(p: Any, op: str) -> list[tuple[str, str]]:
        return [(r["num_tokens"], r["time_s"]) for r in p.rows if r["kind"] == "token_op" and r["op"] == op]

    copied = {op for op in SHARDED_TOKEN_OPS if rows(profile, op) and rows(profile, op) == rows(tp1, op)}
    return replace(profile, rows=[r for r in profile.rows if not (r["kind"] == "token_op" and r["op"] in copied)])


def bundles(validation: Path) -> list[tuple[Any, LayerShape, str, int]]:
    out = []
    for root in sorted((validation / "profiles").glob("*/*/*/bf16")):
        hardware = root.parts[-4]
        if hardware not in BUNDLE_GPUS:
            continue
        raw = yaml.safe_load((root / "meta.yaml").read_text(encoding="utf-8"))
        overrides = (raw.get("engine_effective") or {}).get("hf_overrides") or {}
        shape = _bundle_shape(raw["model"], overrides.get("num_hidden_layers"))
        tp1 = read_bundle(root, 1) if 1 in raw["tp_degrees"] else None
        for tp in raw["tp_degrees"]:
            profile = read_bundle(root, int(tp))
            if int(tp) > 1 and tp1 is not None:
                profile = without_tp1_copies(profile, tp1)
            out.append((profile, shape, BUNDLE_GPUS[hardware], int(tp)))
    return out


def attention_fractions(found: list[tuple[Any, LayerShape, str, int]], gpus: dict[str, GPUSpec],
                        own: dict[str, Efficiency]) -> dict[str, Any]:
    """Attention fractions (median over the bundles) and the grouped-GEMM fraction of the MoE bundles,
    the latter against each bundle GPU's own dense-GEMM fit."""
    fits = [fit_attention(p, shape, gpus[gpu], tp) for p, shape, gpu, tp in found]
    out: dict[str, Any] = {k: round(float(np.median([getattr(f, k) for f in fits])), 3) for k in ATTENTION[:3]}
    grouped = []
    for p, _, gpu, _ in found:
        model = load_model(BUNDLE_MODELS[p.meta["model"]])
        if model.moe is not None and any(r["kind"] == "moe" for r in p.rows):
            grouped.append(fit_grouped_gemm(p, expert_params(model), model.moe.num_experts_per_tok,
                                            model.dtype_bytes, gpus[gpu], own[gpu]))
    out["grouped_gemm_fraction"] = round(float(np.median(grouped)), 3)
    return out


def _entry(eff: Efficiency, source: str, attention: dict[str, Any], **extra: Any) -> dict[str, Any]:
    raw = asdict(eff)
    entry: dict[str, Any] = {}
    for k in FITTED:
        v = raw[k]
        entry[k] = [round(float(x), 4) for x in v] if isinstance(v, tuple) else float(f"{v:.4g}")
    return {**entry, **attention, "source": source, **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validation", type=Path, default=VALIDATION)
    args = parser.parse_args()
    found = bundles(args.validation)
    samples = vidur_samples(args.validation)
    for p, shape, gpu, tp in found:
        samples += op_samples(p, shape, gpu, tp)
    gpus = {g: load_gpu(g) for g in sorted({s.gpu for s in samples})}
    start = Efficiency()
    own = {gpu: fit_op_fractions([s for s in samples if s.gpu == gpu], gpus, start) for gpu in gpus}
    attention = attention_fractions(found, gpus, own)
    attention_source = ("attention and grouped GEMM: LLMServingSim RTX PRO 6000 attention grids (decode alone, "
                        "decodes joining a prefill chunk, prefill alone) and Qwen3-30B-A3B moe.csv, the only public "
                        "attention and MoE profiles at hand")
    per_gpu: dict[str, Any] = {}
    logo: dict[str, dict[str, Any]] = {}
    for gpu in gpus:
        mine = [s for s in samples if s.gpu == gpu]
        eff = replace(own[gpu], **attention)
        err = errors(mine, predict(mine, gpus, {gpu: eff}))
        per_gpu[gpu] = _entry(eff, f"{SOURCES[gpu]}; {attention_source}", attention, fit_errors_pct=_short(err))
    defaults = {}
    for kind in MEMORY_TYPES:
        members = [g for g in gpus if gpus[g].memory_type == kind]
        pool = [s for s in samples if s.gpu in members]
        eff = replace(fit_op_fractions(pool, gpus, start), **attention)
        for gpu in members:  # leave one GPU out: fit on the other GPUs of its memory type
            train = [g for g in members if g != gpu]
            held = replace(fit_op_fractions([s for s in samples if s.gpu in train], gpus, start), **attention)
            mine = [s for s in samples if s.gpu == gpu]
            logo[gpu] = {"trained_on": train, "memory_type": kind,
                         "fitted": _entry(held, "fitted on " + ", ".join(train), attention),
                         "errors_pct": _short(errors(mine, predict(mine, gpus, {gpu: held})))}
        worst = {cls: round(max(logo[g]["errors_pct"][cls]["mean_abs_pct"] for g in members), 1)
                 for cls in ("gemm", "token_op")}
        defaults[kind] = _entry(eff, f"fitted on every profiled {kind.upper()} GPU: {', '.join(members)}; "
                                     f"{attention_source}", attention, expected_error_pct=worst)
    text = yaml.safe_dump({"gpus": per_gpu, "defaults": defaults, "leave_one_gpu_out": logo}, sort_keys=False,
                          width=120)
    OUT.write_text("# Generated by benchmarks/fit_efficiency.py from public per-op profiles (see its docstring);\n"
                   "# do not edit by hand. gpus: fitted on that GPU's own profiles. defaults: by memory type, for a\n"
                   "# GPU without profiles; expected_error_pct: per op class, the worst leave-one-GPU-out mean\n"
                   "# per-op error.\n"
                   + text, encoding="utf-8")
    for gpu, row in logo.items():
        print(gpu, "trained on", row["trained_on"], row["errors_pct"])


def _short(err: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {cls: {k: (round(v, 2) if isinstance(v, float) else v) for k, v in e.items()} for cls, e in err.items()}


assert {f.name for f in fields(Efficiency)} >= set(FITTED) | set(ATTENTION)

if __name__ == "__main__":
    main()
