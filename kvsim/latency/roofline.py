"""The roofline latency model: datasheet rates scaled by what real kernels achieve.

Per tensor-parallel rank, for a step of T tokens, S logits rows and L layers (every term is a
method, so the calibrated model can fall back to any one of them):

    linear     L · Σ_gemm (‖(2 · P · T / (ηf(T) · F),  W / (ηb · B))‖₂ + tg)   P, W: a GEMM's params, bytes
    token ops  L · Σ_op calls · (t0 · f_ref / f_clk + T · b_op · (h / ηl2 + (1 − h) / ηt) / (s_op · B))
               norms (fused with the residual adds: 4h each, `residual_norm_bytes_per_token`; gemma-2 and -3
               two more a layer on the sublayers' outputs alone, 2h each), rotary
               (q, k, the cos/sin row: `rotary_bytes_per_token`), activation; h = min(1, σ · L2 / (T · b_op)):
               the share of the op's tensors its L2 holds (`token_op_s`)
    decode     L · (t0 + n_dec · t_seq) + K_dec / (ηa · B)          K: KV bytes read by decodes (a
               sliding-window layer reads only its window, the hybrid KV manager on or off: `decode_read_bytes`)
               joining a prefill chunk: L · (t0 + n_dec · t_seq) + (heads / kv_heads) · K_dec / (ηm · B)
    prefill    L · t0 + 4 · L · heads · hd · A_pre / (ηp · F) + K_pre / (ηa · B)
               (a sliding-window layer: at most window pairs per query and window + chunk KV tokens)
    sequence   ‖(2 · V · H · S / (ηf · F),  V · H · d / (ηb · B))‖₂ + tg + S · t_sample
    all-reduce 2 · L · ring(T · H · d)                              `kvsim.model.collectives`, TP > 1
    MoE        L_moe · (‖(2 · T_g · k · P_e / g / (ηf(T_e) · F),  E_touched(T_g) · W_e / g / (ηb · B))‖₂ / ηg
                        + shared experts + router + dispatch/combine)     `kvsim.model.moe_cost`
               T_g: tokens of all DP engines in the step; g = tp · dp; T_e = T_g · k / E_touched, the rows of
               each expert's slice of the grouped GEMM; dense MLP only on the other layers
    overhead   c0 + c_seq · sequences                               CPU: schedule, prepare, sample
               (async scheduling: the step takes max(GPU terms, overhead), `RooflineLatency.overlap_cpu`)

with F, B the GPU's dense fp16 FLOP/s and memory bandwidth. ‖(a, b)‖₂ = √(a² + b²) is a smooth
roofline: it equals the larger term far from the ridge and adds up to 41 % near it, where real
GEMMs are neither purely compute- nor memory-bound. The MLP is its own method (`mlp_s`) so a
per-layer-type term (MoE experts) can replace it. T is the tokens the layers run: with CUDA graphs
(`engine.enforce_eager` false, vLLM v1's default) the step's tokens padded up to the next capture size, the same
across a lockstep data-parallel group (`kvsim.latency.cudagraph`): linear, token ops, MoE and all-reduce carry the
padding; attention, LM head and sampler see only the real rows.

Achievable fractions (`Efficiency`, per GPU: `efficiency_for`) and the per-op costs they scale
(`gemm_s`, `token_op_s`) are `kvsim.latency.efficiency`'s, each fraction there with its source.
The CPU overhead is not in any profile; its form (a fixed part plus a part per scheduled
sequence) follows the WukLab study of vLLM's scheduling overhead (2024: input preparation and
output processing grow with sequences, not tokens). Its size, 0.2 ms + 5 us per sequence, is an
assumption for vLLM v1 (whose redesign moved most of that work off the critical path) and, unlike
the fractions above, it is NOT independent of the validation runs: it was chosen among three
candidates (0; 0.3 ms + 2 us; 0.2 ms + 5 us) by their errors on the two dense RTX PRO 6000 runs,
which moved the mean TPOT there by about 2 %. No independent source fits vLLM v1: Vidur's public
CPU-overhead profiles (microsoft/vidur data/profiling/{a100,a40}/cpu_overheads.csv, not in the
validation set) time vLLM v0's schedule + prepare-inputs + process-outputs at about 1.1 ms (8
sequences) to 6.2 ms (64) per step on an A100 (Llama-2-7B, medians), an upper bound only: v1
runs the scheduler in its own process and, with async scheduling, overlaps it with the GPU step.
With async scheduling (`engine.async_scheduling`, vLLM's default since PR #27614, late 2025, and so
in the measured vLLM 0.19 runs) the scheduler plans step k + 1 and the worker prepares its inputs
while the GPU runs step k, so a step lasts max(GPU time, CPU overhead): the overhead shows only
where a step's kernels are shorter than it (small models, small batches); the validation runs' steps
(tens of ms) hide it entirely, so on them nothing depends on the constant chosen above.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvsim.latency.efficiency import (
    Efficiency,
    efficiency_for,
    gemm_s,
    residual_norm_bytes_per_token,
    rotary_bytes_per_token,
    smooth_max,
    token_op_s,
)
from kvsim.latency.step_plan import StepPlan
from kvsim.model.collectives import allreduce_s
from kvsim.model.moe_cost import MoECost
from kvsim.model.spec import attention_params_per_layer

EXACT_INT_FLOAT = 2**53  # integers below it are doubles exactly (`RooflineLatency._decode_times`)

if TYPE_CHECKING:
    from kvsim.latency.base import LatencyModel
    from kvsim.latency.cudagraph import CudaGraphPadding
    from kvsim.model.config import GPUSpec
    from kvsim.model.engine_config import EngineConfig
    from kvsim.model.kv_layout import KVLayout
    from kvsim.model.spec import ModelSpec


class RooflineLatency:
    """Roofline of one step on one tensor-parallel rank (see the module docstring for every term).

    `overhead_s`, when given, replaces the modelled CPU overhead by a constant per step. `overlap_cpu`
    (async scheduling): the CPU overhead runs beside the GPU's work, a step lasts the longer of the
    two; else it adds to it. `layout`: the model's KV layout on one GPU when the caller has resolved
    it (`kvsim.engine.builder.EngineSpec`); under speculative decoding the model's own layers are read
    (the pool's layout counts the drafter's too), so a given layout is not used then.
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig, overhead_s: float | None = None,
                 overlap_swap: bool = False, efficiency: Efficiency | None = None,
                 layout: KVLayout | None = None, overlap_cpu: bool = False,
                 padding: CudaGraphPadding | None = None) -> None:
        from kvsim.model.capacity import mlp_width, model_kv_layout

        tp = engine.tensor_parallel_size
        eff = self.eff = efficiency if efficiency is not None else efficiency_for(gpu)
        self.name = "roofline"
        self.num_layers = model.num_layers
        self.tp = tp
        self.flops = gpu.fp16_flops
        self.bandwidth = gpu.hbm_bandwidth_bytes_per_s
        self.link = gpu.host_link_bandwidth_bytes_per_s
        self.gpu_link = gpu.resolved_link
        self.overhead_s = overhead_s
        self.overlap_swap = overlap_swap
        self.overlap_cpu = overlap_cpu
        self.cudagraph_padding = padding
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
        # the non-GEMM ops of a layer as (bytes per token, calls, kind): two norms, all but the first
        # fused with the residual add (`residual_norm_bytes_per_token`: 4h each), rotary on q and k in
        # place (read + write, with the cos/sin row and position: `rotary_bytes_per_token`), the activation
        # (gated: read 2I, write I); with q/k norms
        # (`ModelSpec.has_qk_norm`) one norm kernel on q and one on k (read the heads, write them normed)
        act = (3 if model.gated_mlp else 2) * mlp_width(model) / tp
        self.gpu = gpu
        norm = residual_norm_bytes_per_token(h, d, model.num_layers)
        qk_norms = ((d * 2 * heads * model.head_dim, 1, 0), (d * 2 * kv_heads * model.head_dim, 1, 0)) \
            if model.has_qk_norm else ()
        # gemma-2 and -3 (`ModelSpec.has_sandwich_norms`) also norm the attention's and the MLP's outputs, alone
        # (vLLM's Gemma3DecoderLayer: post_attention_layernorm, post_feedforward_layernorm): read h, write h
        sandwich_norms = ((d * 2 * h, 2, 0),) if model.has_sandwich_norms else ()
        self.token_ops = ((norm, 2, 0), (rotary_bytes_per_token(heads, kv_heads, model.head_dim, d), 1, 1),
                          (d * act, 1, 2), *qk_norms, *sandwich_norms)
        self._token_ops_s: dict[int, float] = {}
        self.attn_flops_per_pair = 4 * model.num_layers * heads * model.head_dim
        # the target's layers only: a drafter's KV layers share the pool (`model_kv_layout`), but its reads are
        # priced by its own roofline (`kvsim.latency.speculative`)
        if engine.speculative_config is not None:
            engine, layout = engine.model_copy(update={"speculative_config": None}), None
        layout = layout if layout is not None else model_kv_layout(model, engine)
        self.kv_bytes_per_token = layout.bytes_per_token
        # MLA's one latent head serves every query head in one read: no ungrouped re-reads
        self.mixed_read_factor = heads / kv_heads if model.mla is None else 1.0
        per_layer = layout.bytes_per_token_per_layer
        # the windows the kernels attend over: vLLM's disable_hybrid_kv_cache_manager changes allocation only, a
        # sliding layer holding every token still attends to its window (unify_hybrid_kv_cache_specs: "The compute
        # of layers like sliding window is still saved"), so the groups the hybrid manager would make are read here
        attended = attended_layout(model, engine, layout)
        self.windowed_layers = [(g.window_tokens, g.num_layers * per_layer) for g in attended.groups
                                if g.window_tokens is not None]
        self.windowed_layer_counts = [(g.window_tokens, g.num_layers) for g in attended.groups
                                      if g.window_tokens is not None]
        self.num_full_attention_layers = self.num_layers - sum(n for _, n in self.windowed_layer_counts)
        self.full_bytes_per_token = per_layer * sum(g.num_layers for g in attended.groups if g.window_tokens is None)
        self.copy_bytes_per_block = 2 * layout.bytes_per_block
        self._gemm_bw = eff.gemm_bandwidth * self.bandwidth
        # linear_s of a dense model by token count: pure, asked again and again (every burst of n sequences)
        self._dense_linear_s: dict[int, float] = {}
        self._sequence_s: dict[int, float] = {}  # sequence_s by logits rows: pure, asked every step
        # a decode burst's constant terms by its first plan's sizes (`decode_step_times`): a few batch sizes
        self._decode_terms: dict[tuple[int, ...], tuple[float, float, float, float, float, float]] = {}

    # -- linear layers -------------------------------------------------------------------------
    def _gemm(self, params: float, rows: int) -> float:
        return gemm_s(params, rows, self.dtype_bytes, self.flops, self.bandwidth, self.eff)

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
        # a grouped GEMM runs one skinny GEMM per touched expert: its size regime is the tokens per expert
        rows = max(1, round(m.tokens_per_expert(routed)))
        experts = smooth_max(m.expert_flops(routed) / (self.eff.gemm_flops_at(rows) * self.flops),
                             m.expert_bytes_read(routed) / self._gemm_bw) / self.eff.grouped_gemm_fraction
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
        """Norms, rotary, activation and residual adds of all layers: floors plus bytes (`token_op_s`)."""
        seconds = self._token_ops_s.get(num_tokens)
        if seconds is None:
            seconds = self._token_ops_s[num_tokens] = self.num_layers * sum(
                token_op_s(num_tokens, b, calls, kind, self.gpu, self.eff) for b, calls, kind in self.token_ops)
        return seconds

    def lm_head_s(self, num_logits_rows: int) -> float:
        return self._gemm(self.lm_head_params, num_logits_rows) if num_logits_rows else 0.0

    def sampler_s(self, num_logits_rows: int) -> float:
        return num_logits_rows * self.eff.sample_per_seq_s

    def sequence_s(self, num_logits_rows: int) -> float:
        """LM head over the logits rows, then the sampler."""
        rows = num_logits_rows
        seconds = self._sequence_s.get(rows)
        if seconds is None:
            seconds = self._sequence_s[rows] = self.lm_head_s(rows) + self.sampler_s(rows)
        return seconds

    # -- attention -----------------------------------------------------------------------------
    def decode_s(self, num_decode_seqs: int, sum_decode_context: int, mixed: bool = False,
                 windowed: dict[int, int] | None = None) -> float:
        """Decode attention; `mixed` when the step also has a prefill chunk (a slower kernel path); `windowed`:
        the plan's `windowed_decode_context_tokens`."""
        if not num_decode_seqs:
            return 0.0
        floor = self.num_layers * (self.eff.kernel_floor_s + num_decode_seqs * self.eff.decode_per_seq_s)
        read = self.decode_read_bytes(num_decode_seqs, sum_decode_context, windowed)
        if mixed:  # the varlen kernel reads each KV head once per query head it serves
            return floor + read * self.mixed_read_factor / (self.eff.mixed_decode_bandwidth * self.bandwidth)
        return floor + read / (self.eff.decode_bandwidth * self.bandwidth)

    def decode_read_bytes(self, num_decode_seqs: int, sum_decode_context: int,
                          windowed: dict[int, int] | None = None) -> float:
        """KV bytes `num_decode_seqs` decodes read over `sum_decode_context` tokens of context in all layers.

        Full-attention layers read every token; a sliding-window layer only its last `window` tokens
        (a chunked-local layer at most its chunk), so those layers read Σ min(context, window): `windowed`
        (window → that sum, as `Scheduler.account` counts it for every planned step), else min(Σ context,
        n · window), exact when every context is on one side of the window, which a decode burst's steps
        are (`kvsim.sched.burst` condition (f)): contexts 100 and 3,000 with a 1,024-token window read
        1,124 tokens a sliding layer."""
        if not self.windowed_layers:
            return sum_decode_context * self.kv_bytes_per_token
        read = sum_decode_context * self.full_bytes_per_token
        for window, bytes_per_token in self.windowed_layers:
            in_window = min(sum_decode_context, num_decode_seqs * window) if windowed is None else windowed[window]
            read += in_window * bytes_per_token
        return read

    def prefill_s(self, prefill_work: float, prefill_context: int, num_prefill_tokens: int | None = None,
                  num_prefill_seqs: int = 0) -> float:
        """Causal attention of prefill chunks: `prefill_work` query-key pairs over `prefill_context` tokens
        of KV in every layer. Given the chunks' new tokens and sequences, a sliding-window layer attends
        only its window, as in decode: at most `num_prefill_tokens` · window pairs (each query sees at
        most window keys) and Σ new + `num_prefill_seqs` · window KV tokens (an upper bound, exact
        when every query is inside the window or every one beyond it)."""
        if prefill_work <= 0:
            return 0.0
        if not self.windowed_layers or num_prefill_tokens is None:
            compute = self.attn_flops_per_pair * prefill_work / (self.eff.prefill_flops * self.flops)
            read = prefill_context * self.kv_bytes_per_token / (self.eff.decode_bandwidth * self.bandwidth)
            return self.num_layers * self.eff.kernel_floor_s + compute + read
        layer_pairs = self.num_full_attention_layers * prefill_work
        for window, n in self.windowed_layer_counts:
            layer_pairs += n * min(prefill_work, num_prefill_tokens * window)
        kv_bytes = prefill_context * self.full_bytes_per_token
        for window, bytes_per_token in self.windowed_layers:
            kv_bytes += min(prefill_context, num_prefill_tokens + num_prefill_seqs * window) * bytes_per_token
        compute = self.attn_flops_per_pair / self.num_layers * layer_pairs / (self.eff.prefill_flops * self.flops)
        read = kv_bytes / (self.eff.decode_bandwidth * self.bandwidth)
        return self.num_layers * self.eff.kernel_floor_s + compute + read

    def attention_s(self, plan: StepPlan) -> float:
        decode_ctx = plan.sum_decode_context_tokens
        mixed = plan.num_prefill_tokens > 0
        return (self.decode_s(plan.num_decode_seqs, decode_ctx, mixed, plan.windowed_decode_context_tokens)
                + self.prefill_s(plan.attention_work - decode_ctx, plan.sum_context_tokens - decode_ctx,
                                 plan.num_prefill_tokens, plan.num_seqs - plan.num_decode_seqs))

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

    def run_tokens(self, plan: StepPlan) -> int:
        """Tokens the step's layers run: the plan's, CUDA-graph padded (`padding`; across a data-parallel group
        where the group set `num_dp_padded_tokens`: `kvsim.latency.cudagraph`)."""
        if plan.num_dp_padded_tokens:
            return plan.num_dp_padded_tokens
        padding = self.cudagraph_padding
        return plan.num_tokens if padding is None else padding.padded(plan.num_tokens)

    def fixed_s(self, plan: StepPlan) -> float:
        """Copies, communication and (unless it overlaps, `total_s`) the CPU overhead: terms no per-op
        profile measures."""
        gpu = plan.num_copied_blocks * self.copy_bytes_per_block / self.bandwidth + self.allreduce_s(
            self.run_tokens(plan))
        return gpu if self.overlap_cpu else gpu + self.cpu_s(plan.num_seqs)

    def total_s(self, compute_s: float, plan: StepPlan) -> float:
        """The step: with `overlap_cpu` the longer of the compute and the CPU overhead (a step that
        computes something), then swap transfers added serially or overlapped."""
        if self.overlap_cpu and plan.num_tokens:
            compute_s = max(compute_s, self.cpu_s(plan.num_seqs))
        swap = (plan.swap_in_bytes + plan.swap_out_bytes) / self.link
        return max(compute_s, swap) if self.overlap_swap else compute_s + swap

    def decode_step_times(self, first: StepPlan) -> Iterator[float] | None:
        """`step_time` of the successive steps of `kvsim.latency.base.burst_step_times` (pure decode, every
        context one token longer per step), bit for bit: the same float operations in the same
        order, with the terms that stay constant over a burst computed once per batch shape
        (`_decode_step_terms`; only the decode attention term changes). None unless `first` is pure
        decode (then price each plan)."""
        context = first.sum_decode_context_tokens
        if first.num_prefill_tokens or first.attention_work != context or first.sum_context_tokens != context:
            return None
        key = (first.num_tokens, first.num_dp_group_tokens, first.num_dp_padded_tokens, first.num_decode_seqs,
               first.num_logits_rows, first.num_seqs, first.num_copied_blocks, first.swap_in_bytes,
               first.swap_out_bytes)
        terms = self._decode_terms.get(key)
        if terms is None:
            terms = self._decode_terms[key] = self._decode_step_terms(first)
        return self._decode_times(context, first.num_decode_seqs, first.num_seqs, *terms)

    def _decode_step_terms(self, first: StepPlan) -> tuple[float, float, float, float, float, float]:
        """A pure-decode step's terms but its attention reads (they depend on its plan's sizes only): linear
        layers and token ops, the decode kernels' floor, LM head and sampler, fixed terms, the CPU overhead
        where it overlaps (else 0), swap transfers."""
        t, eff = self.run_tokens(first), self.eff
        head = self.linear_s(t, first.num_dp_group_tokens) + self.token_ops_s(t)
        floor = self.num_layers * (eff.kernel_floor_s + first.num_decode_seqs * eff.decode_per_seq_s)
        cpu = self.cpu_s(first.num_seqs) if self.overlap_cpu else 0.0  # `total_s`: hidden up to the compute
        swap = (first.swap_in_bytes + first.swap_out_bytes) / self.link
        return head, floor, self.sequence_s(first.num_logits_rows), self.fixed_s(first), cpu, swap

    def _decode_times(self, context: int, n: int, growth: int, head: float, floor: float, tail: float,
                      fixed: float, cpu: float, swap: float) -> Iterator[float]:
        """`decode_step_times`' steps from `context` (Σ decode context), each `growth` tokens longer.

        Without windowed layers the reads are Σ context · bytes per token, `attention_s`'s integer product divided
        by the bandwidth, which turns it into the double nearest to it (CPython's int-to-float rounds to nearest,
        ties to even; a float bytes per token multiplies the context turned into a double). Multiplied as doubles
        instead (a quarter cheaper a step: no big-int product, no conversion), the product is the same double while
        the context is an integer below 2^53 (`EXACT_INT_FLOAT`) and so is the bytes per token or it is a float:
        each factor is then a double exactly, and IEEE multiplication rounds the exact product to the nearest
        double, ties to even. Past that (never in practice: 2^53 tokens) the steps go on with integers."""
        bandwidth, overlap, kv_bytes_per_token = self.eff.decode_bandwidth * self.bandwidth, self.overlap_swap, \
            self.kv_bytes_per_token
        read = self.decode_read_bytes if self.windowed_layers else None  # else Σ context · bytes per token, inlined
        exact = kv_bytes_per_token < EXACT_INT_FLOAT and context >= 0 and growth >= 0
        if read is None and exact and context + growth < EXACT_INT_FLOAT:
            context_f, growth_f, bytes_f = float(context), float(growth), float(kv_bytes_per_token)
            below = float(EXACT_INT_FLOAT - growth)  # a context below it, and the next one, are below 2^53: exact
            while context_f < below:
                compute = head + (floor + context_f * bytes_f / bandwidth) + tail + fixed
                if compute < cpu:
                    compute = cpu
                yield max(compute, swap) if overlap else compute + swap
                context_f += growth_f
            context = int(context_f)  # the first context not yielded (exact)
        while True:  # attention_s = decode_s + prefill_s, and prefill_s is 0.0 here (x + 0.0 == x)
            reads = context * kv_bytes_per_token if read is None else read(n, context)
            compute = head + (floor + reads / bandwidth) + tail + fixed
            if compute < cpu:
                compute = cpu
            yield max(compute, swap) if overlap else compute + swap
            context += growth

    def step_time(self, plan: StepPlan) -> float:
        compute = 0.0
        if plan.num_tokens:
            t = self.run_tokens(plan)
            compute = (self.linear_s(t, plan.num_dp_group_tokens) + self.token_ops_s(t) + self.attention_s(plan)
                       + self.sequence_s(plan.num_logits_rows) + self.fixed_s(plan))
        return self.total_s(compute, plan)


def attended_layout(model: ModelSpec, engine: EngineConfig, layout: KVLayout) -> KVLayout:
    """The KV groups `model`'s attention kernels read, given the `layout` its pool is allocated in
    (`model_kv_layout(model, engine)`): that layout, or with the hybrid KV manager off the groups it would make,
    speculation aside, since vLLM's disable_hybrid_kv_cache_manager changes allocation only (`RooflineLatency`)."""
    if not engine.disable_hybrid_kv_cache_manager:
        return layout
    from kvsim.model.capacity import model_kv_layout

    return model_kv_layout(model, engine.model_copy(update={"disable_hybrid_kv_cache_manager": False,
                                                            "speculative_config": None}))


def attended_windows(model: ModelSpec, engine: EngineConfig, layout: KVLayout) -> tuple[int, ...]:
    """The distinct sliding windows and attention chunks `model`'s layers attend over, ascending (none: ()),
    given the `layout` its pool is allocated in (`attended_layout`)."""
    attended = attended_layout(model, engine, layout)
    return tuple(sorted({g.window_tokens for g in attended.groups if g.window_tokens is not None}))


def cohort_output_tokens_per_s(latency: LatencyModel, num_seqs: int, context_len: int,
                               num_speculative_tokens: int = 0, acceptance_length: float = 1.0) -> float:
    """Closed-form output tokens/s of `num_seqs` sequences of prompt c/2 + output c/2 (c = `context_len`)
    served as one cohort: all prompts prefilled (priced as one step of `num_seqs` × c/2 new tokens, which
    yields the first output token), then the other c/2 − 1 tokens in decode steps of `num_seqs` sequences at
    the mean decode context c/2 + c/4. Output: num_seqs · c/2 tokens over that time.

    Under speculative decoding (`num_speculative_tokens` K > 0) each decode step is a verify step: every
    sequence computes its last token and K drafts as one chunk (`StepPlan.add_verify`), priced by `latency`
    (pass `kvsim.latency.speculative`'s, which adds the drafter's K passes), and emits `acceptance_length`
    L tokens on average (vLLM's mean acceptance length: 1 + accepted drafts per verify step;
    `AcceptanceModel.mean_acceptance_length`), so the c/2 − 1 tokens take (c/2 − 1) / L steps (the
    expectation, the last step's cap at the output length left out); each verify rejects K + 1 − L drafts on
    average, which the drafter's passes after the first do not read (`StepPlan.num_rejected_draft_tokens`, rounded
    to whole tokens over the cohort).

    A planning estimate with no queueing, chunking or preemption (the sustained rate of a saturated engine, as
    `kvsim report` simulates it, is what to trust). 0.0 where there is no such cohort: no sequences, or a
    context of one token (no prompt to split off)."""
    prompt = context_len // 2
    output = context_len - prompt
    if num_seqs <= 0 or prompt <= 0:
        return 0.0
    prefill = StepPlan()
    prefill.add(prompt, 0, num_seqs, logits_row=True)
    decode = StepPlan()
    if num_speculative_tokens:
        decode.add_verify(1 + num_speculative_tokens, prompt + output // 2 - 1, num_seqs)
        decode.num_rejected_draft_tokens = round(num_seqs * (num_speculative_tokens + 1 - acceptance_length))
    else:
        decode.add(1, prompt + output // 2 - 1, num_seqs, logits_row=True)
    seconds = latency.step_time(prefill) + (output - 1) / acceptance_length * latency.step_time(decode)
    return num_seqs * output / seconds
