"""How long one engine step takes: `step_time(plan) -> seconds`.

A `StepPlan` (built by the scheduler) carries only aggregates, so a step costs O(1) here:
tokens in the batch, sequences, context lengths, prefill attention work, swap bytes.

Every model splits a step into the same terms, per tensor-parallel shard:

    gemm       linear layers of all tokens + LM head of the sampled rows
    decode     attention of the decode sequences (reads their KV)
    prefill    causal attention of prefill chunks over cached + new tokens
    copies     copy-on-write block copies
    overhead   CPU-side scheduling, sampling and launch cost of one step (`overhead_s`)
    swap       bytes swapped in + out over the host link (serial, or overlapped with compute)

Roofline model (`RooflineLatency`, no GPU needed):

    gemm     = max(2 · P_layers · T / F,  W / B) + max(2 · V · H · S / F,  V · H · d / B)
    decode   = max(4 · L · heads · hd · A_dec / F,  K_dec / B)     A_dec = Σ context of decode seqs
    prefill  = max(4 · L · heads · hd · A_pre / F,  K_pre / B)     A_pre = Σ new · (past + (new + 1) / 2)
    copies   = blocks · 2 · bytes_per_block / B
    swap     = (swap-in + swap-out bytes) / host link bandwidth

with T tokens in the batch, S sampled rows, P_layers the transformer-layer parameters and W
their bytes, F the GPU's dense fp16 FLOP/s, B its HBM bandwidth, L layers, V vocab, H hidden,
d dtype bytes, K the KV bytes read (context tokens · kv_bytes_per_token).

The calibrated model (`kvsim.calibration.CalibratedLatency`) replaces gemm, decode and
prefill by interpolation in a profile measured on a GPU, whose CSV schema is declared here
(`PROFILE_COLUMNS`) and written by `kernels/calibrate.py`.

This module imports nothing heavy at load time, so the GPU harness can read the schema on a
machine without kvsim's other dependencies.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kvsim.config import EngineConfig, GPUSpec, ModelSpec

PROFILE_COLUMNS = (
    "kind",          # decode | prefill | gemm | copy
    "op",            # gemm: qkv | o | gate_up | down | lm_head; otherwise empty
    "batch",         # decode: sequences; prefill: 1
    "context_len",   # decode: tokens per sequence; prefill: cached + new tokens
    "query_len",     # prefill: new tokens (chunk)
    "num_tokens",    # gemm: rows (M)
    "n",             # gemm: output features
    "k",             # gemm: input features
    "block_size",
    "num_heads",     # per shard
    "num_kv_heads",  # per shard
    "head_dim",
    "dtype",         # KV dtype for attention, weight dtype for gemm
    "time_s",        # median over repetitions, one layer (attention, gemm) or one copy
    "bytes",         # bytes moved (attention: KV read; copy: read + written)
    "flops",
)
"""Columns of a calibration profile CSV; `# key: value` lines before the header hold metadata
(gpu, device name, torch and triton versions, date, grid)."""


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
    sum_decode_context_tokens: int = 0  # the part of sum_context_tokens from decode sequences
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
            self.sum_decode_context_tokens += context * num_seqs
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
                    sum_decode_context_tokens=first.sum_decode_context_tokens,
                    max_context_tokens=first.max_context_tokens, attention_work=first.attention_work)
    growth = first.num_seqs
    while True:
        yield latency.step_time(plan)
        plan.sum_context_tokens += growth
        plan.sum_decode_context_tokens += growth
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
        from kvsim.capacity import kv_bytes_per_block, kv_bytes_per_token

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

    def gemm_s(self, num_tokens: int, num_sampled: int) -> float:
        return (max(2 * self.layer_params * num_tokens / self.flops, self.layer_weight_bytes / self.bandwidth)
                + max(2 * self.lm_head_params * num_sampled / self.flops, self.lm_head_bytes / self.bandwidth))

    def decode_s(self, sum_decode_context: int) -> float:
        return max(self.attn_flops_per_pair * sum_decode_context / self.flops,
                   sum_decode_context * self.kv_bytes_per_token / self.bandwidth)

    def prefill_s(self, prefill_work: float, prefill_context: int) -> float:
        return max(self.attn_flops_per_pair * prefill_work / self.flops,
                   prefill_context * self.kv_bytes_per_token / self.bandwidth)

    def fixed_s(self, plan: StepPlan) -> float:
        """Copies and the per-step overhead: terms no profile measures."""
        return plan.num_copied_blocks * self.copy_bytes_per_block / self.bandwidth + self.overhead_s

    def total_s(self, compute_s: float, plan: StepPlan) -> float:
        """Add swap transfers to the compute time, serially or overlapped."""
        swap = (plan.swap_in_bytes + plan.swap_out_bytes) / self.link
        return max(compute_s, swap) if self.overlap_swap else compute_s + swap

    def step_time(self, plan: StepPlan) -> float:
        compute = 0.0
        if plan.num_tokens:
            decode_ctx = plan.sum_decode_context_tokens
            compute = (self.gemm_s(plan.num_tokens, plan.num_sampled) + self.decode_s(decode_ctx)
                       + self.prefill_s(plan.attention_work - decode_ctx, plan.sum_context_tokens - decode_ctx)
                       + self.fixed_s(plan))
        return self.total_s(compute, plan)
