"""Weight bytes by component: what a GPU stores and what a token touches.

Parameter counts by component come from the shapes (`kvsim.model.spec.param_counts`). Bytes:
`dtype` bytes per parameter, except fp8 checkpoints (every linear layer of the decoder, i.e.
attention, MLPs and experts, at 1 byte; embeddings, router and norms in `dtype`) and MXFP4
(gpt-oss: the experts at 4 bits plus one 8-bit scale per 32 values = 17/32 byte; the rest in `dtype`).
"""

from __future__ import annotations

from fractions import Fraction

from kvsim.model.spec import ModelSpec, expert_params, param_counts
from kvsim.model.units import ceil_div

MXFP4_BYTES_PER_PARAM = Fraction(17, 32)  # 4-bit value + an 8-bit shared exponent per 32 values


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


def weights_bytes(model: ModelSpec, tensor_parallel_size: int = 1, expert_parallel_size: int = 1,
                  whole_experts: bool = False) -> int:
    """Weight bytes on one GPU: experts split over `g = tp · ep` GPUs, everything else over `tp`.

    `expert_parallel_size` is the data-parallel size (`kvsim.model.capacity.engine_weights_bytes`). With
    `whole_experts` (expert parallelism) the GPU is the busiest one: vLLM places whole experts, E // g on each
    GPU and one more on the first E % g (`determine_expert_map`), so ⌈E / g⌉ experts' weights; otherwise 1/g
    of every expert (tensor-parallel shards).
    """
    by_component = weights_bytes_by_component(model)
    total = total_weights_bytes(model)
    experts = by_component["experts"] if total == sum(by_component.values()) else 0
    num_gpus = tensor_parallel_size * expert_parallel_size
    if whole_experts and model.moe is not None:
        num_experts = model.moe.num_experts
        expert_share = ceil_div(experts * ceil_div(num_experts, num_gpus), num_experts)
    else:
        expert_share = ceil_div(experts, num_gpus)
    return ceil_div(total - experts, tensor_parallel_size) + expert_share
