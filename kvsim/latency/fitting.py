"""Fit the roofline's achievable fractions (`Efficiency`) to measured per-op profiles, and check them.

A profile (`kvsim.latency.profiles.Profile`: LLMServingSim's bundles, Vidur's `mlp.csv`) times
each op of one decoder layer against the step's token count. `op_samples` turns it into one
`OpSample` per (op, token count) with the op's shape on one tensor-parallel rank; the same
roofline terms the simulator prices (`kvsim.latency.efficiency.gemm_s`, `token_op_s`) then
predict each sample from the GPU's datasheet and a candidate `Efficiency`:

    GEMM       ‖(2 · P · T / (ηf(T) · F),  P · d / (ηb · B))‖₂ + tg   ηf(T): by size regime
    token op   calls · (t0 · f_ref / f_clk + T · b · (h / ηl2 + (1 − h) / ηt) / (s · B))
               one op (norm, rotary, activation, add) at a time; h: the share of its tensors in L2

`fit_gemm` and `fit_token_ops` choose the fractions that minimise the mean squared log error
over the samples given (coordinate descent, each coordinate by golden-section search in a
physical range; deterministic). `fit_attention` reads a bundle's attention grid (decode alone,
prefill alone, and decodes joining a prefill chunk) for the decode, mixed-decode and prefill
fractions, `fit_grouped_gemm` a bundle's MoE grid for the fused-MoE kernel's speed. `errors` reports
a prediction's per-op errors (the leave-one-GPU-out loop is the script's). Nothing here reads files:
the caller imports the profiles (`benchmarks/fit_efficiency.py` does, from ../shared/validation/profiles).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.latency.efficiency import (
    GEMM_REGIME_TOKENS,
    REFERENCE_CLOCK_HZ,
    TOKEN_OP_CLASSES,
    Efficiency,
    residual_norm_bytes_per_token,
    rotary_bytes_per_token,
)

if TYPE_CHECKING:
    from kvsim.latency.profiles import Profile
    from kvsim.model.config import GPUSpec

GEMM_OPS = ("qkv", "o", "gate_up", "down")
TOKEN_OP_CLASS = "token_op"
OP_KINDS = {"rotary_emb": 1, "act_fn": 2, "add": 3}  # index in TOKEN_OP_CLASSES; every other token op is a norm


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One decoder layer's shapes for the whole model (divided by TP per rank). `num_layers`: the decoder
    layers the profiler ran (a bundle's `layernorm` is the mean over all their norms)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    gated_mlp: bool = True
    dtype_bytes: int = 2
    num_layers: int = 1

    def gemm_params(self, op: str, tp: int) -> float:
        h, hd = self.hidden_size, self.head_dim
        heads, kv = max(1, self.num_heads // tp), max(1, self.num_kv_heads // tp)
        mlp = self.intermediate_size / tp
        return {"qkv": h * (heads + 2 * kv) * hd, "o": heads * hd * h,
                "gate_up": (2 if self.gated_mlp else 1) * h * mlp, "down": mlp * h}[op]

    def token_op_bytes(self, op: str, tp: int) -> float:
        """Bytes one token moves through one call of a non-GEMM op, as its kernel reads and writes them:

        rotary_emb            q and k of this rank's heads, read and written in place, plus the
                              token's position and cos/sin row (`rotary_bytes_per_token`: the kernel
                              reads them for every call; at most a tenth of the op, Llama-3-8B at TP 8)
        qk_norm               q and k of this rank's heads, read and written
        act_fn                gated (SiLU-and-mul): read gate and up, 2I/tp, write I/tp; else read and
                              write I/tp
        add                   Vidur's residual add (PyTorch): read both summands, write the sum, 3h
        layernorm             a bundle's (vLLM) norm: the mean over the profiled layers' norms, the
                              first plain, the rest fused with the residual add
                              (`residual_norm_bytes_per_token`: 3h for the bundles' one layer)
        any other norm        Vidur's input / post-attention RMSNorm (Sarathi's `rms_norm`, the
                              residual add timed apart): read and write the hidden state, 2h
        """
        heads, kv = max(1, self.num_heads // tp), max(1, self.num_kv_heads // tp)
        h, d = self.hidden_size, self.dtype_bytes
        if op == "rotary_emb":
            return rotary_bytes_per_token(heads, kv, self.head_dim, d)
        if op == "qk_norm":
            return 2 * (heads + kv) * self.head_dim * d
        if op == "act_fn":
            return (3 if self.gated_mlp else 2) * self.intermediate_size / tp * d
        if op == "add":
            return 3 * h * d
        if op == "layernorm":
            return residual_norm_bytes_per_token(h, d, self.num_layers)
        return 2 * h * d


@dataclass(frozen=True, slots=True)
class OpSample:
    """One measured op at one token count on one tensor-parallel rank of `gpu` (a preset name)."""

    gpu: str
    profile: str
    tp: int
    op: str
    op_class: str  # "gemm" | "token_op" (one non-GEMM op, all its calls in a layer)
    num_tokens: int
    measured_s: float
    params: float = 0.0  # GEMM: weights on this rank
    bytes_per_token: float = 0.0  # token ops: moved by one call
    num_kernels: int = 0  # token ops: calls per layer
    dtype_bytes: int = 2
    token_kind: int = 0  # token ops: index in TOKEN_OP_CLASSES


def op_samples(profile: Profile, shape: LayerShape, gpu: str, tp: int) -> list[OpSample]:
    """GEMM samples (one per op and token count) and token-op samples (one per op and token count,
    at the token counts where every token op of the layer was measured, so `errors` can sum a layer)."""
    out: list[OpSample] = []
    token: dict[int, list[tuple[str, float, int]]] = {}
    ops_seen: set[str] = set()
    for r in profile.rows:
        if r["kind"] == "gemm" and r["op"] in GEMM_OPS:
            out.append(OpSample(gpu, profile.name, tp, r["op"], "gemm", int(r["num_tokens"]), float(r["time_s"]),
                                params=shape.gemm_params(r["op"], tp), dtype_bytes=shape.dtype_bytes))
        elif r["kind"] == "token_op":
            calls = int(r.get("calls") or 1)
            ops_seen.add(r["op"])
            token.setdefault(int(r["num_tokens"]), []).append((r["op"], float(r["time_s"]), calls))
    for tokens, ops in sorted(token.items()):
        if {op for op, _, _ in ops} != ops_seen:
            continue
        out += [OpSample(gpu, profile.name, tp, op, TOKEN_OP_CLASS, tokens, t * calls,
                         bytes_per_token=shape.token_op_bytes(op, tp), num_kernels=calls,
                         dtype_bytes=shape.dtype_bytes, token_kind=OP_KINDS.get(op, 0)) for op, t, calls in ops]
    return out


# -- vectorised predictions (the same formulas as kvsim.latency.roofline, over arrays) ------------

def _regime_flops(eff: Efficiency, tokens: np.ndarray) -> np.ndarray:
    if not eff.gemm_flops_by_regime:
        return np.full(tokens.shape, eff.gemm_flops)
    return np.interp(np.log(tokens), np.log(GEMM_REGIME_TOKENS), eff.gemm_flops_by_regime)


def predict(samples: Sequence[OpSample], gpus: dict[str, GPUSpec], effs: dict[str, Efficiency]) -> np.ndarray:
    """Predicted seconds of each sample on its GPU with that GPU's `Efficiency`."""
    out = np.zeros(len(samples))
    for gpu in {s.gpu for s in samples}:
        idx = np.array([i for i, s in enumerate(samples) if s.gpu == gpu])
        out[idx] = _predict_columns(_columns(samples, idx), gpus[gpu], effs[gpu])
    return out


def _columns(samples: Sequence[OpSample], idx: np.ndarray) -> dict[str, np.ndarray]:
    pick = [samples[i] for i in idx]
    return {"tokens": np.array([s.num_tokens for s in pick], dtype=float),
            "params": np.array([s.params for s in pick]), "bytes": np.array([s.bytes_per_token for s in pick]),
            "kernels": np.array([s.num_kernels for s in pick], dtype=float),
            "d": np.array([s.dtype_bytes for s in pick], dtype=float),
            "kind": np.array([s.token_kind for s in pick]),
            "gemm": np.array([s.op_class == "gemm" for s in pick])}


def _predict_columns(c: dict[str, np.ndarray], gpu: GPUSpec, eff: Efficiency) -> np.ndarray:
    f, b = gpu.fp16_flops, gpu.hbm_bandwidth_bytes_per_s
    compute = 2 * c["params"] * c["tokens"] / (_regime_flops(eff, c["tokens"]) * f)
    memory = c["params"] * c["d"] / (eff.gemm_bandwidth * b)
    gemm = np.sqrt(compute * compute + memory * memory) + eff.gemm_floor_s
    return np.where(c["gemm"], gemm, _token_op_columns(c, gpu, eff))


def _token_op_columns(c: dict[str, np.ndarray], gpu: GPUSpec, eff: Efficiency) -> np.ndarray:
    """`kvsim.latency.efficiency.token_op_s` over arrays."""
    working_set = np.maximum(c["tokens"] * c["bytes"], 1.0)
    hit = np.minimum(1.0, eff.token_op_l2_share * gpu.l2_cache_bytes / working_set)
    speed = np.ones(working_set.shape)
    for kind, s in enumerate(eff.token_op_speed_by_class, start=1):
        speed = np.where(c["kind"] == kind, s, speed)
    per_byte = (hit / eff.token_op_l2_bandwidth + (1 - hit) / eff.token_op_bandwidth) / (
        gpu.hbm_bandwidth_bytes_per_s * speed)
    floor = eff.token_op_floor_s * (REFERENCE_CLOCK_HZ / gpu.boost_clock_hz if gpu.boost_clock_hz else 1.0)
    return c["kernels"] * (floor + working_set * per_byte)


# -- fitting ----------------------------------------------------------------------------------

def _golden(f: Callable[[float], float], lo: float, hi: float, iterations: int = 40) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    x1, x2 = b - g * (b - a), a + g * (b - a)
    f1, f2 = f(x1), f(x2)
    for _ in range(iterations):
        if f1 < f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - g * (b - a)
            f1 = f(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + g * (b - a)
            f2 = f(x2)
    return (a + b) / 2


def _fit(samples: Sequence[OpSample], gpus: dict[str, GPUSpec], start: Efficiency,
         coordinates: dict[str, tuple[float, float]], sweeps: int = 6) -> Efficiency:
    """Coordinate descent on the mean squared log error of `samples` (pooled over their GPUs, which
    share the fractions: that is what carries over to a GPU without a profile)."""
    groups = []
    for gpu in sorted({s.gpu for s in samples}):
        idx = np.array([i for i, s in enumerate(samples) if s.gpu == gpu])
        groups.append((_columns(samples, idx), gpus[gpu], np.log([samples[i].measured_s for i in idx])))

    def loss(eff: Efficiency) -> float:
        total, n = 0.0, 0
        for c, gpu, log_t in groups:
            e = np.log(_predict_columns(c, gpu, eff)) - log_t
            total, n = total + float(e @ e), n + e.size
        return total / max(n, 1)

    eff = start
    for _ in range(sweeps):
        for name, (lo, hi) in coordinates.items():
            best = _golden(lambda x, e=eff, n=name: loss(_with(e, n, x)), lo, hi)  # type: ignore[misc]
            eff = _with(eff, name, best)
    return eff


def _with(eff: Efficiency, name: str, value: float) -> Efficiency:
    """`eff` with one coordinate changed: a field, `regime<i>` (the i-th GEMM size regime) or `kind<i>`
    (the speed of the i-th non-norm token-op kind)."""
    if name.startswith("kind"):
        speeds = list(eff.token_op_speed_by_class)
        speeds[int(name.removeprefix("kind"))] = value
        return replace(eff, token_op_speed_by_class=tuple(speeds))
    if name.startswith("regime"):
        values = list(eff.gemm_flops_by_regime)
        values[int(name.removeprefix("regime"))] = value
        # larger GEMMs never run at a smaller fraction (and a memory-bound regime cannot float up)
        return replace(eff, gemm_flops_by_regime=tuple(accumulate(values, max)))
    changes: dict[str, Any] = {name: value}
    return replace(eff, **changes)


def fit_gemm(samples: Sequence[OpSample], gpus: dict[str, GPUSpec], start: Efficiency) -> Efficiency:
    """ηb and ηf per size regime (`GEMM_REGIME_TOKENS`) from the GEMM samples."""
    gemms = [s for s in samples if s.op_class == "gemm"]
    start = replace(start, gemm_flops_by_regime=start.gemm_flops_by_regime or (0.5,) * len(GEMM_REGIME_TOKENS))
    coords = {"gemm_bandwidth": (0.3, 1.0), "gemm_floor_s": (0.0, 20e-6),
              **{f"regime{i}": (0.02, 1.0) for i in range(len(GEMM_REGIME_TOKENS))}}
    eff = _fit(gemms, gpus, start, coords)
    return replace(eff, gemm_flops=eff.gemm_flops_by_regime[-1])


def fit_token_ops(samples: Sequence[OpSample], gpus: dict[str, GPUSpec], start: Efficiency) -> Efficiency:
    """The non-GEMM ops' floor t0 (at the reference clock), DRAM fraction ηt (at most 1), L2 rate ηl2 and
    share σ, and the speed of each non-norm kind; `kernel_floor_s` (the attention kernels' floor) becomes
    t0 at the samples' GPU clock when they share one (the same small-kernel cost), else t0 itself."""
    ops = [s for s in samples if s.op_class == TOKEN_OP_CLASS]
    kinds = len(TOKEN_OP_CLASSES) - 1
    start = replace(start, token_op_speed_by_class=start.token_op_speed_by_class or (1.0,) * kinds)
    coords = {"token_op_floor_s": (0.3e-6, 15e-6), "token_op_bandwidth": (0.1, 1.0),
              "token_op_l2_bandwidth": (0.2, 4.0), "token_op_l2_share": (0.05, 1.0),
              **{f"kind{i}": (0.3, 4.0) for i in range(kinds)}}
    eff = _fit(ops, gpus, start, coords)
    clocks = {gpus[s.gpu].boost_clock_hz for s in ops}
    clock = clocks.pop() if len(clocks) == 1 else None
    return replace(eff, kernel_floor_s=eff.token_op_floor_s * (REFERENCE_CLOCK_HZ / clock if clock else 1.0))


@dataclass(frozen=True, slots=True)
class AttentionFit:
    """Fractions read off one bundle's attention grid (medians over the grid points used)."""

    decode_bandwidth: float
    mixed_decode_bandwidth: float
    prefill_flops: float
    num_points: int


def fit_attention(profile: Profile, shape: LayerShape, gpu: GPUSpec, tp: int) -> AttentionFit:
    """From a bundle's one-layer attention grid (rows of kind `attention`), as fractions of the
    datasheet bandwidth B or FLOP/s F:

    decode   KV bytes read / time, decodes alone at batch ≥ 32 and context ≥ 1024
    mixed    the time decodes add when they join a prefill chunk (same chunk alone subtracted; summed
             over the grid, so the large batches and contexts that dominate a step weigh most),
             against the KV bytes read once per *query* head (`heads / kv_heads` times the KV):
             the grid shows the mixed (varlen) kernel's extra time growing with query heads, not
             KV heads (Qwen3-32B, 64 query heads, takes 1.9x Llama-3.1-8B's 32 at the same 8 KV
             heads), so it reads the KV as if ungrouped; the fraction exceeds 1 because the
             repeated reads of one KV head hit the L2 cache
    prefill  causal FLOPs 4 · heads · hd · chunk² / 2 / time of the largest chunk measured alone
             (the kernel's efficiency grows with the chunk; the largest is the one that dominates
             a prefill's time)
    """
    kv_heads, heads = max(1, shape.num_kv_heads // tp), max(1, shape.num_heads // tp)
    kv_per_token = 2 * kv_heads * shape.head_dim * shape.dtype_bytes
    grid: dict[tuple[int, int, int, int], float] = {}
    for r in profile.rows:
        if r["kind"] != "attention":
            continue
        chunk = int(r["query_len"])
        key = (chunk, int(r["context_len"]) - chunk, int(r["batch"] or 0), int(r["decode_context_len"] or 0))
        grid[key] = float(r["time_s"])
    b, f = gpu.hbm_bandwidth_bytes_per_s, gpu.fp16_flops
    decode, mixed_read, mixed_s = [], 0.0, 0.0
    for (chunk, cached, n, ctx), t in grid.items():
        if n >= 32 and ctx >= 1024:
            read = n * ctx * kv_per_token / b
            alone = grid.get((chunk, 0, 0, 0))
            if chunk == 0:
                decode.append(read / t)
            elif cached == 0 and alone is not None and t > alone:
                mixed_read, mixed_s = mixed_read + read * heads / kv_heads, mixed_s + t - alone
    largest = max(c for c, cached, n, _ in grid if n == 0 and cached == 0)
    prefill = 4 * heads * shape.head_dim * largest * largest / 2 / f / grid[(largest, 0, 0, 0)]
    return AttentionFit(float(np.median(decode)), mixed_read / mixed_s, prefill, len(decode) + 1)


def fit_grouped_gemm(profile: Profile, expert_params: float, top_k: int, dtype_bytes: int, gpu: GPUSpec,
                     eff: Efficiency) -> float:
    """The fused-MoE kernel's speed against the dense-GEMM roofline, from a bundle's `moe` rows (one MoE
    layer: T tokens routed to E activated experts): Σ roofline / Σ measured, the roofline being
    ‖(2 · T · k · P_e / (ηf(T · k / E) · F),  E · P_e · d / (ηb · B))‖₂ at `eff` (dense GEMM fractions)."""
    predicted = measured = 0.0
    for r in profile.rows:
        if r["kind"] != "moe":
            continue
        tokens, experts = int(r["num_tokens"]), float(r["num_experts"])
        rows = max(1, round(tokens * top_k / experts))
        compute = 2 * tokens * top_k * expert_params / (eff.gemm_flops_at(rows) * gpu.fp16_flops)
        read = experts * expert_params * dtype_bytes / (eff.gemm_bandwidth * gpu.hbm_bandwidth_bytes_per_s)
        predicted += math.hypot(compute, read)
        measured += float(r["time_s"])
    return predicted / measured


# -- checking ---------------------------------------------------------------------------------

def errors(samples: Sequence[OpSample], predicted: np.ndarray) -> dict[str, dict[str, float]]:
    """Per op class: mean and p90 of |predicted / measured − 1| (%), the signed mean (%), the
    error of the summed time (%), and the number of samples. GEMMs count one by one; token ops are
    summed per layer first (all of a layer's norms, rotary, activation and adds at one token count)."""
    out: dict[str, dict[str, float]] = {}
    gemm = [(p, s.measured_s) for s, p in zip(samples, predicted, strict=True) if s.op_class == "gemm"]
    layers: dict[tuple[str, str, int, int], list[float]] = {}
    for s, p in zip(samples, predicted, strict=True):
        if s.op_class == TOKEN_OP_CLASS:
            pair = layers.setdefault((s.gpu, s.profile, s.tp, s.num_tokens), [0.0, 0.0])
            pair[0], pair[1] = pair[0] + float(p), pair[1] + s.measured_s
    for cls, pairs in (("gemm", gemm), (TOKEN_OP_CLASS, [tuple(v) for v in layers.values()])):
        if not pairs:
            continue
        pred, measured = np.array([p for p, _ in pairs]), np.array([m for _, m in pairs])
        rel = pred / measured - 1
        out[cls] = {"mean_abs_pct": float(np.mean(np.abs(rel)) * 100),
                    "p90_abs_pct": float(np.percentile(np.abs(rel), 90) * 100),
                    "signed_mean_pct": float(np.mean(rel) * 100),
                    "sum_pct": float((pred.sum() / measured.sum() - 1) * 100),
                    "num_samples": len(pairs)}
    return out


def fit_op_fractions(samples: Sequence[OpSample], gpus: dict[str, GPUSpec], start: Efficiency) -> Efficiency:
    """GEMM and token-op fractions fitted over `samples` (all their GPUs pooled)."""
    return fit_token_ops(samples, gpus, fit_gemm(samples, gpus, start))
