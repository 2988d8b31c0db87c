"""Parameter counts and weight bytes by component: what a GPU stores and what a token touches.

    attention (per layer)   q, o = hidden · heads · head_dim; k, v = hidden · kv_heads · head_dim
                            MLA: q (q_lora: hidden · q_lora + q_lora · heads · (nope + rope),
                                 else hidden · heads · (nope + rope)) + kv_a = hidden · (kv_lora + rope)
                                 + kv_b = kv_lora · heads · (nope + v) + o = heads · v · hidden
    dense MLP (per layer)   (3 if gated else 2) · hidden · intermediate       (non-MoE layers)
    experts (per MoE layer) num_experts · 3 · hidden · expert_intermediate     (all stored)
    shared (per MoE layer)  3 · hidden · shared_expert_intermediate
    router (per MoE layer)  hidden · num_experts
    embeddings              vocab · hidden (· 2 when the LM head is untied) + OPT's learned positions
    norms                   2 · hidden per layer + the final norm

Biases, MLA's latent norms and quantization scales other than MXFP4's are left out (each well
under 0.1 % of the total). Weight bytes: `dtype` bytes per parameter, except fp8 checkpoints
(every linear layer of the decoder, i.e. attention, MLPs and experts, at 1 byte; embeddings,
router and norms in `dtype`) and MXFP4 (gpt-oss: the experts at 4 bits plus one 8-bit scale per
32 values = 17/32 byte; the rest in `dtype`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.model.config import ModelSpec

MXFP4_BYTES_PER_PARAM = Fraction(17, 32)  # 4-bit value + an 8-bit shared exponent per 32 values


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameters of the whole model (all layers) by component."""

    attention: int
    dense_mlp: int
    experts: int
    shared_experts: int
    router: int
    embeddings: int
    norms: int

    @property
    def total(self) -> int:
        return (self.attention + self.dense_mlp + self.experts + self.shared_experts + self.router
                + self.embeddings + self.norms)


def attention_params_per_layer(m: ModelSpec) -> int:
    h = m.hidden_size
    if m.mla is not None:
        a = m.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = h * a.q_lora_rank + a.q_lora_rank * m.num_attention_heads * qk if a.q_lora_rank else \
            h * m.num_attention_heads * qk
        kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * m.num_attention_heads * (
            a.qk_nope_head_dim + a.v_head_dim)
        return q + kv + m.num_attention_heads * a.v_head_dim * h
    return 2 * h * m.num_attention_heads * m.head_dim + 2 * h * m.num_kv_heads * m.head_dim


def expert_params(m: ModelSpec) -> int:
    """Parameters of one routed expert (gate, up and down projections)."""
    assert m.moe is not None
    return 3 * m.hidden_size * m.moe.expert_intermediate_size


def param_counts(m: ModelSpec) -> ParamCounts:
    h = m.hidden_size
    moe = m.moe
    moe_layers = moe.num_moe_layers if moe else 0
    dense_layers = m.num_layers - moe_layers
    embed = m.vocab_size * h * (1 if m.tie_word_embeddings else 2)
    if not m.gated_mlp:  # OPT's learned positions
        embed += m.max_position_embeddings * h
    return ParamCounts(
        attention=m.num_layers * attention_params_per_layer(m),
        dense_mlp=dense_layers * (3 if m.gated_mlp else 2) * h * m.intermediate_size,
        experts=moe_layers * moe.num_experts * expert_params(m) if moe else 0,
        shared_experts=moe_layers * 3 * h * moe.shared_expert_intermediate_size if moe else 0,
        router=moe_layers * h * moe.num_experts if moe else 0,
        embeddings=embed,
        norms=(2 * m.num_layers + 1) * h,
    )


def active_params_per_token(m: ModelSpec) -> int:
    """Parameters one token computes with: all but the routed experts it is not sent to.

    Counted as model cards count "activated parameters" (both embedding tables included):
    Mixtral-8x7B 12.9B of 46.7B, Qwen3-30B-A3B 3.3B of 30.5B, DeepSeek-V3 37B of 671B.
    """
    c = param_counts(m)
    if m.moe is None:
        return c.total
    idle = m.moe.num_experts - m.moe.num_experts_per_tok
    return c.total - m.moe.num_moe_layers * idle * expert_params(m)


def weights_bytes_by_component(m: ModelSpec) -> dict[str, int]:
    """Bytes of the whole model's weights (one copy, no parallelism) by component."""
    c = param_counts(m)
    d = m.dtype_bytes
    linear = 1 if m.weight_quant == "fp8" else d
    experts = c.experts * (MXFP4_BYTES_PER_PARAM if m.weight_quant == "mxfp4" else linear)
    return {
        "attention": c.attention * linear,
        "dense_mlp": c.dense_mlp * linear,
        "experts": int(experts),
        "shared_experts": c.shared_experts * linear,
        "router": c.router * d,
        "embeddings": c.embeddings * d,
        "norms": c.norms * d,
    }


def total_weights_bytes(m: ModelSpec) -> int:
    """All weights' bytes; a given `num_params` (no breakdown known) counts at `dtype` bytes each."""
    assert m.num_params is not None
    by_component = weights_bytes_by_component(m)
    if m.num_params != param_counts(m).total:
        return m.num_params * m.dtype_bytes
    return sum(by_component.values())
