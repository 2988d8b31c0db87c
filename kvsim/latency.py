"""How long one engine step takes: `step_time(plan) -> seconds`.

A `StepPlan` (built by the scheduler) carries only aggregates, so a step costs O(1) here:
tokens in the batch, sequences, context lengths, prefill attention work, swap bytes.

Roofline model (`RooflineLatency`, no GPU needed), per tensor-parallel shard:

    linear    = max(2 · P_layers · T / F,  W / B)           weights read once per step
              + max(2 · V · H · S / F, V · H · d / B)          LM head for the S sampled rows
    attention = max(4 · L · heads · hd · A / F,  K / B)       A = Σ new · (past + (new + 1) / 2)
                                                              K = Σ context · kv_bytes_per_token
    compute   = linear + attention + overhead
    step      = compute + swap   (or max(compute, swap) with overlap_swap)
    swap      = (bytes swapped in + out) / host link bandwidth
    copies    = copy-on-write blocks · 2 · bytes_per_block / B (read + write), added to compute

with T tokens in the batch, P_layers the transformer-layer parameters, W their bytes, F the
GPU's dense fp16 FLOP/s, B its HBM bandwidth, L layers, V vocab, H hidden, d dtype bytes.
`overhead_s` stands for the CPU-side scheduling, sampling and launch cost of one step.

The calibrated model (`kvsim.calibration`) reads a measured profile and plugs in here too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from kvsim.capacity import kv_bytes_per_block, kv_bytes_per_token
from kvsim.config import EngineConfig, GPUSpec, ModelSpec


@dataclass(slots=True)
class StepPlan:
    """What one step computes. `scheduled` pairs each request with its new tokens per sequence."""

    scheduled: list = field(default_factory=list)  # list[tuple[Request, int]]
    num_tokens: int = 0  # Σ new tokens over all sequences (the batch size in tokens)
    num_seqs: int = 0  # sequences computing at least one token
    num_prefill_tokens: int = 0
    num_decode_seqs: int = 0
    num_sampled: int = 0  # sequences that sample a token at the end of the step (logit rows)
    sum_context_tokens: int = 0  # Σ over sequences of context after the step (KV read)
    max_context_tokens: int = 0
    attention_work: float = 0.0  # Σ new · (past + (new + 1) / 2): causal query-key pairs
    swap_in_bytes: int = 0
    swap_out_bytes: int = 0
    num_copied_blocks: int = 0
    preempted: list = field(default_factory=list)  # requests preempted while planning this step

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.swap_in_bytes and not self.swap_out_bytes

    def add(self, num_new: int, past: int, num_seqs: int, samples: bool) -> None:
        """Account `num_seqs` sequences each computing `num_new` tokens after `past` cached ones."""
        context = past + num_new
        self.num_tokens += num_new * num_seqs
        self.num_seqs += num_seqs
        if num_new == 1 and past > 0:
            self.num_decode_seqs += num_seqs
        else:
            self.num_prefill_tokens += num_new * num_seqs
        self.num_sampled += num_seqs if samples else 0
        self.sum_context_tokens += context * num_seqs
        self.max_context_tokens = max(self.max_context_tokens, context)
        self.attention_work += num_new * (past + (num_new + 1) / 2) * num_seqs


def burst_step_times(latency: LatencyModel, first: StepPlan) -> Iterator[float]:
    """Durations of successive decode steps of one unchanged batch whose first step is `first`.

    Each step every sequence's context grows by one token: Σ context and the attention work
    grow by the number of sequences, the longest context by one. The caller stops iterating.
    """
    plan = StepPlan(num_tokens=first.num_tokens, num_seqs=first.num_seqs, num_decode_seqs=first.num_decode_seqs,
                    num_sampled=first.num_sampled, sum_context_tokens=first.sum_context_tokens,
                    max_context_tokens=first.max_context_tokens, attention_work=first.attention_work)
    growth = first.num_seqs
    while True:
        yield latency.step_time(plan)
        plan.sum_context_tokens += growth
        plan.attention_work += growth
        plan.max_context_tokens += 1


class LatencyModel(Protocol):
    name: str

    def step_time(self, plan: StepPlan) -> float: ...


class ConstantLatency:
    """Every step takes `step_s` (plus swap time): for hand-computed timeline tests."""

    def __init__(self, step_s: float, host_link_bandwidth_bytes_per_s: float = float("inf")) -> None:
        self.name = f"constant({step_s}s)"
        self.step_s = step_s
        self.link = host_link_bandwidth_bytes_per_s

    def step_time(self, plan: StepPlan) -> float:
        return self.step_s + (plan.swap_in_bytes + plan.swap_out_bytes) / self.link


class RooflineLatency:
    """Datasheet roofline of one step (see the module docstring for every term)."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig,
                 overhead_s: float = 0.002, overlap_swap: bool = False) -> None:
        tp = engine.tensor_parallel_size
        self.name = "roofline"
        self.flops = gpu.fp16_flops
        self.bandwidth = gpu.hbm_bandwidth_bytes_per_s
        self.link = gpu.host_link_bandwidth_bytes_per_s
        self.overhead_s = overhead_s
        self.overlap_swap = overlap_swap
        assert model.num_params is not None
        lm_head_params = model.vocab_size * model.hidden_size
        embed_params = lm_head_params * (1 if model.tie_word_embeddings else 2)
        self.layer_params = (model.num_params - embed_params) / tp
        self.layer_weight_bytes = self.layer_params * model.dtype_bytes
        self.lm_head_params = lm_head_params / tp
        self.lm_head_bytes = self.lm_head_params * model.dtype_bytes
        heads = max(1, model.num_attention_heads // tp)
        self.attn_flops_per_pair = 4 * model.num_layers * heads * model.head_dim
        self.kv_bytes_per_token = kv_bytes_per_token(model, engine)
        self.copy_bytes_per_block = 2 * kv_bytes_per_block(model, engine)

    def step_time(self, plan: StepPlan) -> float:
        compute = 0.0
        if plan.num_tokens:
            compute += max(2 * self.layer_params * plan.num_tokens / self.flops,
                           self.layer_weight_bytes / self.bandwidth)
            compute += max(2 * self.lm_head_params * plan.num_sampled / self.flops,
                           self.lm_head_bytes / self.bandwidth)
            compute += max(self.attn_flops_per_pair * plan.attention_work / self.flops,
                           plan.sum_context_tokens * self.kv_bytes_per_token / self.bandwidth)
            compute += plan.num_copied_blocks * self.copy_bytes_per_block / self.bandwidth
            compute += self.overhead_s
        swap = (plan.swap_in_bytes + plan.swap_out_bytes) / self.link
        return max(compute, swap) if self.overlap_swap else compute + swap
