"""Achievable fractions of datasheet rates per GPU, and the per-op costs they scale (the roofline's
building blocks, `kvsim.latency.roofline`; the fit that writes them, `kvsim.latency.fitting`).

Achievable fractions (`Efficiency`, per GPU: `efficiency_for`), fitted only on public per-op
profiles, never on the measured serving runs kvsim is validated on, by `benchmarks/fit_efficiency.py`
(the fit: `kvsim.latency.fitting`) into `kvsim/model/presets/efficiency.yaml`, each entry with its
source: Vidur's mlp.csv on H100, A100 and A40 (TP 1-8) and LLMServingSim's RTX PRO 6000 bundles
(vLLM 0.19 kernels). A preset with profiles gets its own fit; any other GPU the default of its
`memory_type`, fitted on the profiled GPUs of that type, with its leave-one-GPU-out error.
    ηf(T)      GEMM FLOP/s fraction by size regime (16 ... 4096 tokens, linear in log T, never falling
               with T): skinny GEMMs fill few tiles (H100: 0.65 up to 1024 tokens, 0.75 at 4096; the GDDR
               default 0.28 at 16 tokens to 0.76; public: 72-80 % for large linear layers on A100/H100)
    ηb, tg     weight-read fraction and fixed cost per GEMM kernel (H100 about 0.9 and 7 us: the fixed
               cost is what makes small TP-8 shards slow)
    token ops  non-GEMM ops, fitted one op at a time (not per layer): ηt the DRAM fraction, ηl2 the rate
               (as a fraction of DRAM's datasheet B) of an op whose tensors sit in L2 (the profilers
               time an op again and again on the same tensors, and in a real step the previous op has
               just written them), σ the share of the L2 (`GPUSpec.l2_cache_bytes`) that holds them,
               s_op the speed of rotary, activation and residual add relative to a norm (different
               kernels: a norm reduces over the row first), t0 the floor of one kernel at the
               reference clock f_ref = 1.5 GHz, scaled by the GPU's boost clock (a kernel too small to
               stream costs a fixed number of cycles). Fitted on one HBM GPU, these predict the other
               within 10 % per layer (leave-one-GPU-out, docs/accuracy.md); the former single ηt and t0 missed
               by 14-15 %, biased by the GPUs' different clocks and L2 sizes
    ηa         paged decode alone: KV read at about 0.88 of datasheet in the bundles (batch >= 32,
               context >= 1k)
    ηm         decodes joining a prefill chunk run in the varlen kernel, whose extra time in the bundles
               grows with query heads, not KV heads (Qwen3-32B, 64 query heads, 1.9x Llama-3.1-8B's 32 at
               the same 8 KV heads): the KV is read once per query head, partly from L2 (ηm about 1.5 of
               the datasheet on those re-reads), summed over the measured 4-D grid
    ηp         causal prefill of the largest measured chunk (2048): about 0.41 of datasheet
    ηg         the fused-MoE (grouped) GEMM against the dense-GEMM roofline at the same tokens per
               expert: about 0.86, summed over the Qwen3-30B-A3B bundle's moe.csv (tokens 1-2048 x
               activated experts 8-128)
    t_seq      0.1 us per decode sequence (batch 128 at context 16 takes 23 us, batch 1 takes 8 us)
Attention fractions and ηg come from the RTX PRO 6000 only (no public attention or MoE profile of an
HBM GPU is at hand), so every GPU carries them with that source.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from kvsim.model.errors import KvsimError, shown
from kvsim.model.units import is_number
from kvsim.model.yaml_io import TEXT_ENCODING, load_shipped_yaml

if TYPE_CHECKING:
    from kvsim.model.config import GPUSpec


GEMM_REGIME_TOKENS = (16, 64, 256, 1024, 4096)
"""Token counts at which `Efficiency.gemm_flops_by_regime` gives the GEMMs' FLOP/s fraction."""


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achievable fractions of datasheet rates and small fixed costs (sources in the module docstring).

    `gemm_flops_by_regime`, when given, is the GEMMs' FLOP/s fraction at each of
    `GEMM_REGIME_TOKENS` (linear in log tokens between them, constant outside): skinny GEMMs
    fill few tiles and waves; empty means `gemm_flops` at every size. The defaults are round
    figures of the RTX PRO 6000 fit; the roofline takes a GPU's from `efficiency_for`.
    """

    gemm_flops: float = 0.82
    gemm_bandwidth: float = 0.89
    gemm_flops_by_regime: tuple[float, ...] = ()
    gemm_floor_s: float = 0.0
    token_op_bandwidth: float = 1.0
    token_op_l2_bandwidth: float = 1.0
    token_op_l2_share: float = 0.5
    token_op_speed_by_class: tuple[float, ...] = ()  # rotary, activation, add; a norm is 1; empty: all 1
    token_op_floor_s: float = 2.5e-6  # at REFERENCE_CLOCK_HZ
    grouped_gemm_fraction: float = 1.0
    decode_bandwidth: float = 0.88
    mixed_decode_bandwidth: float = 1.48  # of the KV bytes read once per query head (see ηm)
    prefill_flops: float = 0.41
    kernel_floor_s: float = 2.5e-6
    decode_per_seq_s: float = 0.1e-6
    sample_per_seq_s: float = 0.5e-6
    cpu_fixed_s: float = 0.2e-3
    cpu_per_seq_s: float = 5e-6
    source: str = "kvsim defaults"

    def gemm_flops_at(self, num_tokens: int) -> float:
        """The GEMMs' FLOP/s fraction at `num_tokens` rows (see the class docstring)."""
        regime = self.gemm_flops_by_regime
        if not regime:
            return self.gemm_flops
        if num_tokens <= GEMM_REGIME_TOKENS[0]:
            return regime[0]
        if num_tokens >= GEMM_REGIME_TOKENS[-1]:
            return regime[-1]
        i = bisect.bisect_right(GEMM_REGIME_TOKENS, num_tokens) - 1
        lo, hi = GEMM_REGIME_TOKENS[i], GEMM_REGIME_TOKENS[i + 1]
        w = (math.log(num_tokens) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return regime[i] + (regime[i + 1] - regime[i]) * w


DATASHEET = Efficiency(gemm_flops=1.0, gemm_bandwidth=1.0, decode_bandwidth=1.0, mixed_decode_bandwidth=1.0,
                       prefill_flops=1.0,
                       kernel_floor_s=0.0, token_op_floor_s=0.0, decode_per_seq_s=0.0, sample_per_seq_s=0.0,
                       cpu_fixed_s=0.0, cpu_per_seq_s=0.0)
"""The bare datasheet roofline (every fraction 1, no floors, no CPU overhead): for tests and comparisons."""

TOKEN_OP_CLASSES = ("norm", "rotary", "activation", "add")
"""Kinds of non-GEMM op; `Efficiency.token_op_speed_by_class` gives the speed of the last three
relative to a norm."""

REFERENCE_CLOCK_HZ = 1.5e9
"""The clock `Efficiency.token_op_floor_s` is stated at; a GPU's floor is scaled by reference / boost."""


def smooth_max(a: float, b: float) -> float:
    """√(a² + b²): the roofline's blend of a compute and a memory time (see the module docstring)."""
    return math.hypot(a, b)


def gemm_s(params: float, rows: int, dtype_bytes: float, flops: float, bandwidth: float, eff: Efficiency) -> float:
    """One GEMM of `params` weights over `rows` tokens: ‖(compute, weight read)‖₂ at the fitted fractions,
    plus the fixed cost of a GEMM kernel (launch, prologue, tail)."""
    return smooth_max(2 * params * rows / (eff.gemm_flops_at(rows) * flops),
                      params * dtype_bytes / (eff.gemm_bandwidth * bandwidth)) + eff.gemm_floor_s


def token_op_floor_s(gpu: GPUSpec, eff: Efficiency) -> float:
    """The floor of one small non-GEMM kernel on `gpu`: `token_op_floor_s` at the reference clock, scaled
    by the GPU's boost clock (unscaled when the GPU file gives none)."""
    return eff.token_op_floor_s * (REFERENCE_CLOCK_HZ / gpu.boost_clock_hz if gpu.boost_clock_hz else 1.0)


def token_op_s(num_tokens: int, bytes_per_token: float, calls: int, op_class: int, gpu: GPUSpec,
               eff: Efficiency) -> float:
    """`calls` runs of one non-GEMM op over `num_tokens` tokens, each moving `bytes_per_token` per token
    (read + write), of kind `TOKEN_OP_CLASSES[op_class]`: a clock-scaled floor per call plus its bytes,
    the share h its L2 holds at ηl2 · B and the rest at ηt · B (see the module docstring)."""
    working_set = num_tokens * bytes_per_token
    if working_set <= 0:
        return calls * token_op_floor_s(gpu, eff)
    b = gpu.hbm_bandwidth_bytes_per_s
    hit = min(1.0, eff.token_op_l2_share * gpu.l2_cache_bytes / working_set)
    speed = eff.token_op_speed_by_class[op_class - 1] if op_class and eff.token_op_speed_by_class else 1.0
    per_byte = (hit / eff.token_op_l2_bandwidth + (1 - hit) / eff.token_op_bandwidth) / (b * speed)
    return calls * (token_op_floor_s(gpu, eff) + working_set * per_byte)


POSITION_BYTES = 8
"""Bytes of one token's position id as the rotary kernels read it (int64 in Sarathi-Serve and vLLM)."""


def rotary_bytes_per_token(num_heads: int, num_kv_heads: int, head_dim: int, dtype_bytes: float) -> float:
    """Bytes per token of one rotary-embedding call on this rank's heads, as the kernel moves them
    (Sarathi-Serve's and vLLM's `rotary_embedding`: one thread block per token): q and k rotated in
    place (read and write, 2 · (heads + kv_heads) · head_dim values), plus the token's position id
    (`POSITION_BYTES`) and its row of the cos/sin cache (`rot_dim` values, cos then sin, at the
    activations' dtype; the full head here). The row is read once per token, not once per head: the
    heads' repeated reads of it hit the caches."""
    return dtype_bytes * (2 * (num_heads + num_kv_heads) * head_dim + head_dim) + POSITION_BYTES


def residual_norm_bytes_per_token(hidden_size: int, dtype_bytes: float, num_layers: int) -> float:
    """Bytes per token of one RMSNorm call, averaged over the 2 · `num_layers` norms of a vLLM decoder
    stack (input and post-attention norm of each layer): the first layer's input norm has no residual
    yet (`rms_norm`: read the hidden state, write the normed one, 2h), every other norm is
    `fused_add_rms_norm` (read the hidden state and the residual, write the new residual and the
    normed state, 4h). The weight (h, read once per call, not per token) is left out."""
    calls = 2 * num_layers
    return dtype_bytes * hidden_size * (2 + 4 * (calls - 1)) / calls


EFFICIENCY_FILE = "efficiency.yaml"
"""Fitted fractions per GPU preset and defaults per memory type (written by benchmarks/fit_efficiency.py)."""


@cache
def _fitted() -> dict[str, Any]:
    from kvsim.model.config import PRESETS_DIR

    return load_shipped_yaml((PRESETS_DIR / EFFICIENCY_FILE).read_text(encoding=TEXT_ENCODING))


def efficiency_for(gpu: GPUSpec) -> Efficiency:
    """The fractions fitted on `gpu`'s own public profiles when the preset has them, else the default
    for its memory type (HBM or GDDR), fitted on the profiled GPUs of that type (sources in the file);
    a GPU file's own `efficiency` mapping overrides any of them."""
    raw = _fitted()
    entry = {**(raw["gpus"].get(gpu.name) or raw["defaults"][gpu.memory_type]), **(gpu.efficiency or {})}
    unknown = sorted(set(gpu.efficiency or {}) - set(Efficiency.__slots__))
    if unknown:
        raise KvsimError(f"gpu {gpu.name}: efficiency.{unknown[0]} is not a roofline fraction "
                         f"(expected one of {', '.join(Efficiency.__slots__)})")
    for name, value in (gpu.efficiency or {}).items():
        problem = _efficiency_problem(name, value)
        if problem is not None:
            raise KvsimError(f"gpu {gpu.name}: efficiency.{name}={shown(value)}: {problem}")
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()
                              if k in Efficiency.__slots__}
    try:
        return Efficiency(**fields)
    except TypeError as error:
        raise KvsimError(f"gpu {gpu.name}: efficiency: {error}") from None


_LISTS = {"gemm_flops_by_regime": len(GEMM_REGIME_TOKENS), "token_op_speed_by_class": len(TOKEN_OP_CLASSES) - 1}
"""The `Efficiency` fields that are lists, by the number of values one holds (or none)."""


def _efficiency_problem(name: str, value: Any) -> str | None:
    """Why `value` cannot be the `Efficiency` field `name` a GPU file gives, or None. A GPU file's mapping was
    taken unchecked: `prefill_flops: 0` was a ZeroDivisionError mid-run, a one-value `token_op_speed_by_class` an
    IndexError, text a TypeError, and `gemm_flops: -1` or `cpu_fixed_s: -1` ran on negative times."""
    from kvsim.model.config import MAX_FIXED_COST_S

    if name == "source":
        return None if isinstance(value, str) else "expected text"
    if name in _LISTS:
        size = _LISTS[name]
        if not isinstance(value, list) or len(value) not in (0, size) or not all(is_number(v) and v > 0 for v in value):
            return f"expected a list of {size} positive numbers (or none)"
        return None
    if name.endswith("_s"):
        return None if is_number(value) and 0 <= value <= MAX_FIXED_COST_S else \
            f"expected seconds, 0 to {MAX_FIXED_COST_S:g}"
    if name == "token_op_l2_share":
        return None if is_number(value) and 0 <= value <= 1 else "expected a share, 0 to 1"
    return None if is_number(value) and value > 0 else "expected a positive fraction of the datasheet rate"
