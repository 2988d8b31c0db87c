"""What one step's mixture-of-experts layers read, compute and send, on one GPU.

A token is routed to k of E experts. Taking routing as uniform and independent across tokens,
an expert is untouched by T tokens with probability (1 − k/E)^T, so a step touches

    E_touched(T) = E · (1 − (1 − k/E)^T)        (1 token: k; grows with T; → E)

distinct experts, and reads each touched expert's weights once (grouped GEMM), while computing
2 · T · k · expert_params FLOPs. With data parallelism the MoE layers of the DP engines run
together (vLLM steps every DP rank in lockstep for MoE models, idle ones on a dummy batch):
their experts are split over tp · dp GPUs, as whole experts with expert parallelism
(`enable_expert_parallel`) or as tensor-parallel shards without it (vLLM's MoE layers then
form a TP group of size dp · tp; docs: data_parallel_deployment), and the tokens T are those
of all DP engines in the step. Either way a GPU reads E_touched / (tp · dp) experts' bytes and
computes 1 / (tp · dp) of the FLOPs on average. Tokens reach their experts' GPUs as vLLM's
default all2all backend moves them (allgather_reducescatter, vllm/distributed/device_communicators/
all2all.py): an all-gather of the group's hidden states before the experts and a reduce-scatter
of their outputs after, per MoE layer, each a ring over the g = tp · dp GPUs moving
(g − 1) / g · T_group · hidden · dtype_bytes per GPU (`ring_collective_s`, the ring formula of
`kvsim.model.collectives` with g − 1 steps).

Shared experts (DeepSeek, Llama 4) see every token: a dense GEMM. The router is a small GEMM
(hidden × E) on every GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsim.model.collectives import BASE_LATENCY_S, LINK_EFFICIENCY
from kvsim.model.spec import expert_params
from kvsim.model.weights import MXFP4_BYTES_PER_PARAM

if TYPE_CHECKING:
    from kvsim.model.config import GPULink
    from kvsim.model.engine_config import EngineConfig
    from kvsim.model.spec import ModelSpec


def expected_experts_touched(num_experts: int, top_k: int, num_tokens: int) -> float:
    """E · (1 − (1 − k/E)^T): distinct experts T uniformly routed tokens activate."""
    if num_tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def ring_collective_s(num_bytes: float, num_gpus: int, link: GPULink) -> float:
    """Seconds for a ring all-gather or reduce-scatter of `num_bytes` in all over `num_gpus` GPUs."""
    if num_gpus <= 1 or num_bytes <= 0:
        return 0.0
    efficiency = link.efficiency if link.efficiency is not None else LINK_EFFICIENCY[link.kind]
    base = link.collective_latency_s if link.collective_latency_s is not None else BASE_LATENCY_S
    steps = num_gpus - 1
    return steps / num_gpus * num_bytes / (efficiency * link.bandwidth_bytes_per_s) + steps * link.latency_s + base


@dataclass(frozen=True, slots=True)
class MoECost:
    """The MoE layers' shapes as one GPU sees them."""

    num_layers: int
    num_experts: int
    top_k: int
    expert_params: int  # one whole expert (gate, up, down)
    expert_bytes_per_param: float
    shared_params: int  # per layer, this GPU's share (TP)
    router_params: int
    num_gpus: int  # tp · dp: the GPUs the experts are spread over
    hidden_bytes: int  # one token's hidden state

    @classmethod
    def of(cls, model: ModelSpec, engine: EngineConfig) -> MoECost:
        assert model.moe is not None
        moe, tp = model.moe, engine.tensor_parallel_size
        per_param: float = model.dtype_bytes
        if model.weight_quant == "fp8":
            per_param = 1
        elif model.weight_quant == "mxfp4":
            per_param = float(MXFP4_BYTES_PER_PARAM)
        return cls(num_layers=moe.num_moe_layers, num_experts=moe.num_experts, top_k=moe.num_experts_per_tok,
                   expert_params=expert_params(model), expert_bytes_per_param=per_param,
                   shared_params=3 * model.hidden_size * moe.shared_expert_intermediate_size // tp,
                   router_params=model.hidden_size * moe.num_experts,
                   num_gpus=tp * engine.data_parallel_size, hidden_bytes=model.hidden_size * model.dtype_bytes)

    def expert_bytes_read(self, group_tokens: int) -> float:
        """Expert weight bytes one GPU reads in one MoE layer for the DP group's `group_tokens`."""
        touched = expected_experts_touched(self.num_experts, self.top_k, group_tokens)
        return touched * self.expert_params * self.expert_bytes_per_param / self.num_gpus

    def tokens_per_expert(self, group_tokens: int) -> float:
        """Mean rows of each touched expert's GEMM: T · k / E_touched(T) (1 token: 1; → T · k / E)."""
        touched = expected_experts_touched(self.num_experts, self.top_k, group_tokens)
        return group_tokens * self.top_k / touched if touched else 0.0

    def expert_flops(self, group_tokens: int) -> float:
        """FLOPs one GPU computes in one MoE layer: 2 · T · k · expert_params / (tp · dp)."""
        return 2 * group_tokens * self.top_k * self.expert_params / self.num_gpus

    def exchange_s(self, group_tokens: int, link: GPULink) -> float:
        """All-gather of the group's hidden states and reduce-scatter of the outputs, one MoE layer."""
        return 2 * ring_collective_s(group_tokens * self.hidden_bytes, self.num_gpus, link)
