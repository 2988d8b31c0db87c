"""The roofline latency model: datasheet rates scaled by what real kernels achieve.

Per tensor-parallel rank, for a step of T tokens, S sampled rows and L layers (every term is a
method, so the calibrated model can fall back to any one of them):

    linear     L · ‖(2 · P · T / (ηf · F),  W / (ηb · B))‖₂        P, W: one layer's params, bytes
    token ops  L · (k · t0 + T · b_tok / B)                         norms, rotary, activation
    decode     L · (t0 + n_dec · t_seq) + K_dec / (ηa · B)          K: KV bytes read by decodes
               (ηm instead of ηa when the step also prefills: one mixed kernel serves both)
    prefill    L · t0 + 4 · L · heads · hd · A_pre / (ηp · F) + K_pre / (ηa · B)
    sequence   ‖(2 · V · H · S / (ηf · F),  V · H · d / (ηb · B))‖₂ + S · t_sample
    all-reduce 2 · L · ring(T · H · d)                              `kvsim.model.collectives`, TP > 1
    MoE        L_moe · (‖(2 · T_g · k · P_e / g / (ηf · F),  E_touched(T_g) · W_e / g / (ηb · B))‖₂
                        + shared experts + router + dispatch/combine)     `kvsim.model.moe_cost`
               T_g: tokens of all DP engines in the step; g = tp · dp; dense MLP only on the other layers
    overhead   c0 + c_seq · sequences                               CPU: schedule, prepare, sample

with F, B the GPU's dense fp16 FLOP/s and memory bandwidth. ‖(a, b)‖₂ = √(a² + b²) is a smooth
roofline: it equals the larger term far from the ridge and adds up to 41 % near it, where real
GEMMs are neither purely compute- nor memory-bound. The MLP is its own method (`mlp_s`) so a
per-layer-type term (MoE experts) can replace it.

Achievable fractions (`Efficiency`), fitted only on public data, never on the validation runs:
the per-op RTX PRO 6000 profiles LLMServingSim published (../shared/validation/profiles: vLLM
0.19 kernels of Llama-3.1-8B and Qwen3-32B), cross-checked with published results:
    ηf = 0.82   the profile's four layer GEMMs at 2048 tokens reach 395 TFLOP/s of 483.6
                (public: 72-80 % of datasheet for linear layers on A100/H100)
    ηb = 0.89   the same GEMMs at 1 token stream 436 MB of weights in 306 us (1.43 TB/s of 1.597)
    √ form      at 128-512 tokens the profile is within 4 % of the √(a² + b²) blend, where max()
                is 12-26 % low
    ηa = 0.85   paged decode reads KV at 1.2-1.5 TB/s in the profile (batch 128, context 1k-16k);
                on HBM GPUs published kernels reach less (FlashAttention-3: 1.2-1.85 TB/s on an
                H100's 3.35), so this is the GDDR7 card's figure, not a universal one
    ηm = 0.35   decodes batched with a prefill chunk run in the mixed (varlen) kernel, which reads
                their KV far slower: 0.26-0.5 of datasheet in the profile (batch 128, context 1k-16k,
                any chunk from 16 to 2048 tokens) against 0.83 for the same decodes alone
    ηp = 0.45   causal prefill of a 2048-token chunk: 198-230 TFLOP/s in the profile
    t0 = 2.5 us the floor of one small kernel in the profile (norms, rotary, activation at 1 token)
    t_seq = 0.1 us per decode sequence (batch 128 at context 16 takes 23 us, batch 1 takes 8 us)
The CPU overhead is not in any profile; its form (a fixed part plus a part per scheduled
sequence) follows the WukLab study of vLLM's scheduling overhead (2024: input preparation and
output processing grow with sequences, not tokens). Its size, 0.2 ms + 5 us per sequence, is an
assumption for vLLM v1 (whose redesign moved most of that work off the critical path) and, unlike
the fractions above, it is NOT independent of the validation runs: it was chosen among three
candidates (0; 0.3 ms + 2 us; 0.2 ms + 5 us) by their errors on the two dense RTX PRO 6000 runs,
which moved the mean TPOT there by about 2 %.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsim.latency.step_plan import StepPlan
from kvsim.model.collectives import allreduce_s
from kvsim.model.moe_cost import MoECost
from kvsim.model.spec import attention_params_per_layer

if TYPE_CHECKING:
    from kvsim.latency.base import LatencyModel
    from kvsim.model.config import EngineConfig, GPUSpec, ModelSpec
    from kvsim.model.kv_layout import KVLayout


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achievable fractions of datasheet rates and small fixed costs (sources in the module docstring)."""

    gemm_flops: float = 0.82
    gemm_bandwidth: float = 0.89
    decode_bandwidth: float = 0.85
    mixed_decode_bandwidth: float = 0.35
    prefill_flops: float = 0.45
    kernel_floor_s: float = 2.5e-6
    decode_per_seq_s: float = 0.1e-6
    sample_per_seq_s: float = 0.5e-6
    cpu_fixed_s: float = 0.2e-3
    cpu_per_seq_s: float = 5e-6


DATASHEET = Efficiency(gemm_flops=1.0, gemm_bandwidth=1.0, decode_bandwidth=1.0, mixed_decode_bandwidth=1.0,
                       prefill_flops=1.0,
                       kernel_floor_s=0.0, decode_per_seq_s=0.0, sample_per_seq_s=0.0,
                       cpu_fixed_s=0.0, cpu_per_seq_s=0.0)
"""The bare datasheet roofline (every fraction 1, no floors, no CPU overhead): for tests and comparisons."""

NUM_TOKEN_KERNELS = 4
"""Non-GEMM kernels per layer: two RMSNorms (with their residual adds), rotary, the gated activation."""


def smooth_max(a: float, b: float) -> float:
    """√(a² + b²): the roofline's blend of a compute and a memory time (see the module docstring)."""
    return math.hypot(a, b)


class RooflineLatency:
    """Roofline of one step on one tensor-parallel rank (see the module docstring for every term).

    `overhead_s`, when given, replaces the modelled CPU overhead by a constant per step. `layout`: the
    model's KV layout on one GPU when the caller has resolved it (`kvsim.engine.builder.EngineSpec`).
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig, overhead_s: float | None = None,
                 overlap_swap: bool = False, efficiency: Efficiency = Efficiency(),
                 layout: KVLayout | None = None) -> None:
        from kvsim.model.capacity import mlp_width, model_kv_layout

        tp = engine.tensor_parallel_size
        eff = self.eff = efficiency
        self.name = "roofline"
        self.num_layers = model.num_layers
        self.tp = tp
        self.flops = gpu.fp16_flops
        self.bandwidth = gpu.hbm_bandwidth_bytes_per_s
        self.link = gpu.host_link_bandwidth_bytes_per_s
        self.gpu_link = gpu.resolved_link
        self.overhead_s = overhead_s
        self.overlap_swap = overlap_swap
        d = model.dtype_bytes
        h = model.hidden_size
        heads = max(1, model.num_attention_heads // tp)
        kv_heads = max(1, model.num_kv_heads // tp)
        attn_params: float = h * (heads + 2 * kv_heads) * model.head_dim + heads * model.head_dim * h
        if model.mla is not None:  # MLA's projections are not q/k/v/o of head_dim (kvsim.model.weights)
            attn_params = attention_params_per_layer(model) / tp
        mlp_params = (3 if model.gated_mlp else 2) * h * model.intermediate_size / tp
        self.moe = MoECost.of(model, engine) if model.moe is not None else None
        self.num_dense_mlp_layers = model.num_layers - (self.moe.num_layers if self.moe else 0)
        self.attn_proj_params, self.mlp_params = attn_params, mlp_params
        self.lm_head_params = model.vocab_size * h / tp
        self.dtype_bytes = d
        self.hidden_size = h
        # bytes one token moves through the non-GEMM ops of a layer: two norms and the residual
        # adds (read + write the hidden state), rotary on q and k, the gated activation (read 2I, write I)
        act = (3 if model.gated_mlp else 2) * mlp_width(model) / tp
        self.token_op_bytes = d * (2 * 3 * h + 2 * (heads + kv_heads) * model.head_dim + act)
        self.attn_flops_per_pair = 4 * model.num_layers * heads * model.head_dim
        layout = layout if layout is not None else model_kv_layout(model, engine)
        self.kv_bytes_per_token = layout.bytes_per_token
        self.copy_bytes_per_block = 2 * layout.bytes_per_block
        self._gemm_flops = eff.gemm_flops * self.flops
        self._gemm_bw = eff.gemm_bandwidth * self.bandwidth
        # linear_s of a dense model by token count: pure, asked again and again (every burst of n sequences)
        self._dense_linear_s: dict[int, float] = {}

    # -- linear layers -------------------------------------------------------------------------
    def _gemm(self, params: float, rows: int) -> float:
        return smooth_max(2 * params * rows / self._gemm_flops, params * self.dtype_bytes / self._gemm_bw)

    def attn_proj_s(self, num_tokens: int) -> float:
        """qkv and o projections of all layers."""
        return self.num_layers * self._gemm(self.attn_proj_params, num_tokens)

    def mlp_s(self, num_tokens: int, group_tokens: int = 0) -> float:
        """The dense MLP of the non-MoE layers, plus `moe_s` for the MoE layers."""
        dense = self.num_dense_mlp_layers * self._gemm(self.mlp_params, num_tokens)
        return dense + self.moe_s(num_tokens, group_tokens) if self.moe is not None else dense

    def moe_s(self, num_tokens: int, group_tokens: int = 0) -> float:
        """All MoE layers: routed experts for the DP group's tokens (at least this engine's),
        shared experts and router for this engine's, and the dispatch/combine exchange."""
        m = self.moe
        if m is None or not num_tokens:
            return 0.0
        routed = max(num_tokens, group_tokens)
        experts = smooth_max(m.expert_flops(routed) / self._gemm_flops, m.expert_bytes_read(routed) / self._gemm_bw)
        shared = self._gemm(m.shared_params, num_tokens) if m.shared_params else 0.0
        per_layer = experts + shared + self._gemm(m.router_params, num_tokens) + m.exchange_s(routed,
                                                                                               self.gpu_link)
        return m.num_layers * per_layer

    def linear_s(self, num_tokens: int, group_tokens: int = 0) -> float:
        if self.moe is not None:  # the DP group's tokens count too
            return self.attn_proj_s(num_tokens) + self.mlp_s(num_tokens, group_tokens)
        seconds = self._dense_linear_s.get(num_tokens)
        if seconds is None:
            seconds = self._dense_linear_s[num_tokens] = self.attn_proj_s(num_tokens) + self.mlp_s(num_tokens)
        return seconds

    def token_ops_s(self, num_tokens: int) -> float:
        """Norms, rotary, activation and residual adds of all layers: launch floors plus bytes."""
        per_layer = NUM_TOKEN_KERNELS * self.eff.kernel_floor_s + num_tokens * self.token_op_bytes / self.bandwidth
        return self.num_layers * per_layer

    def lm_head_s(self, num_sampled: int) -> float:
        return self._gemm(self.lm_head_params, num_sampled) if num_sampled else 0.0

    def sampler_s(self, num_sampled: int) -> float:
        return num_sampled * self.eff.sample_per_seq_s

    def sequence_s(self, num_sampled: int) -> float:
        """LM head over the sampled rows, then the sampler."""
        return self.lm_head_s(num_sampled) + self.sampler_s(num_sampled)

    # -- attention -----------------------------------------------------------------------------
    def decode_s(self, num_decode_seqs: int, sum_decode_context: int, mixed: bool = False) -> float:
        """Decode attention; `mixed` when the step also has a prefill chunk (a slower kernel path)."""
        if not num_decode_seqs:
            return 0.0
        eff = self.eff.mixed_decode_bandwidth if mixed else self.eff.decode_bandwidth
        floor = self.num_layers * (self.eff.kernel_floor_s + num_decode_seqs * self.eff.decode_per_seq_s)
        return floor + sum_decode_context * self.kv_bytes_per_token / (eff * self.bandwidth)

    def prefill_s(self, prefill_work: float, prefill_context: int) -> float:
        if prefill_work <= 0:
            return 0.0
        compute = self.attn_flops_per_pair * prefill_work / (self.eff.prefill_flops * self.flops)
        read = prefill_context * self.kv_bytes_per_token / (self.eff.decode_bandwidth * self.bandwidth)
        return self.num_layers * self.eff.kernel_floor_s + compute + read

    def attention_s(self, plan: StepPlan) -> float:
        decode_ctx = plan.sum_decode_context_tokens
        mixed = plan.num_prefill_tokens > 0
        return (self.decode_s(plan.num_decode_seqs, decode_ctx, mixed)
                + self.prefill_s(plan.attention_work - decode_ctx, plan.sum_context_tokens - decode_ctx))

    # -- communication, CPU, copies, swap ------------------------------------------------------
    def allreduce_s(self, num_tokens: int) -> float:
        """Two all-reduces of the hidden state per layer (after o_proj and after down_proj)."""
        if self.tp == 1:
            return 0.0
        return 2 * self.num_layers * allreduce_s(num_tokens * self.hidden_size * self.dtype_bytes, self.tp,
                                                 self.gpu_link)

    def cpu_s(self, num_seqs: int) -> float:
        if self.overhead_s is not None:
            return self.overhead_s
        return self.eff.cpu_fixed_s + num_seqs * self.eff.cpu_per_seq_s

    def fixed_s(self, plan: StepPlan) -> float:
        """Copies, communication and the CPU overhead: terms no per-op profile measures."""
        return (plan.num_copied_blocks * self.copy_bytes_per_block / self.bandwidth
                + self.allreduce_s(plan.num_tokens) + self.cpu_s(plan.num_seqs))

    def total_s(self, compute_s: float, plan: StepPlan) -> float:
        """Add swap transfers to the compute time, serially or overlapped."""
        swap = (plan.swap_in_bytes + plan.swap_out_bytes) / self.link
        return max(compute_s, swap) if self.overlap_swap else compute_s + swap

    def decode_step_times(self, first: StepPlan) -> Iterator[float] | None:
        """`step_time` of the successive steps of `kvsim.latency.base.burst_step_times` (pure decode, every
        context one token longer per step), bit for bit: the same float operations in the same
        order, with the terms that stay constant over a burst computed once (only the decode
        attention term changes). None unless `first` is pure decode (then price each plan)."""
        context = first.sum_decode_context_tokens
        if first.num_prefill_tokens or first.attention_work != context or first.sum_context_tokens != context:
            return None
        t, eff = first.num_tokens, self.eff
        head = self.linear_s(t, first.num_dp_group_tokens) + self.token_ops_s(t)
        floor = self.num_layers * (eff.kernel_floor_s + first.num_decode_seqs * eff.decode_per_seq_s)
        per_token, bandwidth = self.kv_bytes_per_token, eff.decode_bandwidth * self.bandwidth
        tail, fixed = self.sequence_s(first.num_sampled), self.fixed_s(first)
        swap = (first.swap_in_bytes + first.swap_out_bytes) / self.link
        growth, overlap = first.num_seqs, self.overlap_swap

        def times(context: int) -> Iterator[float]:
            while True:  # attention_s = decode_s + prefill_s, and prefill_s is 0.0 here (x + 0.0 == x)
                compute = head + (floor + context * per_token / bandwidth) + tail + fixed
                yield max(compute, swap) if overlap else compute + swap
                context += growth

        return times(context)

    def step_time(self, plan: StepPlan) -> float:
        compute = 0.0
        if plan.num_tokens:
            t = plan.num_tokens
            compute = (self.linear_s(t, plan.num_dp_group_tokens) + self.token_ops_s(t) + self.attention_s(plan)
                       + self.sequence_s(plan.num_sampled) + self.fixed_s(plan))
        return self.total_s(compute, plan)


def cohort_output_tokens_per_s(latency: LatencyModel, num_seqs: int, context_len: int) -> float:
    """Closed-form output tokens/s of `num_seqs` sequences of prompt c/2 + output c/2 (c = `context_len`)
    served as one cohort: all prompts prefilled (priced as one step of `num_seqs` × c/2 new tokens), then
    c/2 decode steps of `num_seqs` sequences at the mean decode context c/2 + c/4. Output: num_seqs · c/2
    tokens over that time. A planning estimate with no queueing, chunking or preemption (the sustained
    rate of a saturated engine, as `kvsim report` simulates it, is what to trust)."""
    prompt = context_len // 2
    output = context_len - prompt
    if num_seqs <= 0 or output <= 0:
        return 0.0
    prefill = StepPlan()
    prefill.add(prompt, 0, num_seqs, samples=True)
    decode = StepPlan()
    decode.add(1, prompt + output // 2 - 1, num_seqs, samples=True)
    seconds = latency.step_time(prefill) + (output - 1) * latency.step_time(decode)
    return num_seqs * output / seconds
