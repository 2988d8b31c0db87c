"""How long one engine step takes: `step_time(plan) -> seconds`, and the calibration schema.

A `StepPlan` (built by the scheduler) carries only aggregates, so a step costs O(1) here:
tokens in the batch, sequences, context lengths, prefill attention work, swap bytes.

Two models implement `LatencyModel`: the roofline (`kvsim.latency.roofline.RooflineLatency`, datasheet
rates scaled by achievable fractions, no GPU needed) and the calibrated model
(`kvsim.latency.calibrated.CalibratedLatency`, interpolation in a measured profile). Both split a step
into the same terms, per tensor-parallel rank:

    linear      the transformer layers' GEMMs (qkv, o, gate_up, down) over the batch's tokens
    token ops   non-GEMM per-token work: norms, activation, rotary, residual adds, embedding
    attention   decode sequences reading their KV, prefill chunks over cached + new tokens
                (one mixed kernel when the profile measured mixed batches)
    sequence    LM head and sampler over the logits rows (`StepPlan.num_logits_rows`)
    all-reduce  two per layer when tensor_parallel_size > 1 (ring over the GPU link)
    copies      copy-on-write block copies
    overhead    CPU-side scheduling and input preparation: fixed + per sequence
    swap        bytes swapped in + out over the host link (serial, or overlapped with compute)

The calibration profile's schema is declared here once (`PROFILE_COLUMNS`, `PROFILE_KINDS`);
`kernels/calibrate.py` writes it and the importers in `kvsim.latency.profiles` convert other formats
into it. This module imports nothing heavy at load time, so the GPU harness can read the schema
on a machine without kvsim's other dependencies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from kvsim.latency.step_plan import StepPlan

if TYPE_CHECKING:
    from kvsim.latency.cudagraph import CudaGraphPadding

PROFILE_COLUMNS = (
    "kind",          # one of PROFILE_KINDS
    "op",            # gemm: qkv | o | gate_up | down | lm_head; token_op / step_op / sequence_op: the op's name
    "batch",         # decode, attention: decode sequences; sequence_op: logits rows; prefill: 1
    "context_len",   # decode: tokens per sequence; prefill, attention: the chunk's cached + new tokens
    "query_len",     # prefill, attention: new tokens of the prefill chunk (attention: 0 = pure decode)
    "num_tokens",    # gemm, token_op, step_op, moe: rows (M), the batch's tokens
    "n",             # gemm: output features
    "k",             # gemm: input features
    "block_size",
    "num_heads",     # per shard
    "num_kv_heads",  # per shard
    "head_dim",
    "dtype",         # KV dtype for attention, weight dtype for gemm
    "time_s",        # median over repetitions: one layer (attention, gemm, token_op, moe), one step
                     # (step_op, sequence_op) or one copy
    "bytes",         # bytes moved (attention: KV read; copy: read + written)
    "flops",
    "decode_context_len",  # attention: tokens per decode sequence (0 = no decodes)
    "calls",         # token_op / step_op: times the op runs per layer or per step (empty = 1)
    "num_experts",   # moe: distinct experts the tokens activate on this rank
    "skew_share",    # attention_skew: upper edge of the bucket's share of long decodes (`kvsim.latency.skew`)
    "alpha",         # attention_skew: the bucket's fitted α
)
"""Columns of a calibration profile CSV; `# key: value` lines before the header hold metadata
(`PROFILE_META_KEYS`). Files written before the last five columns existed still load."""

PROFILE_KINDS = {
    "decode": "paged decode attention of `batch` sequences of `context_len`, one layer",
    "prefill": "causal attention of one chunk of `query_len` ending at `context_len`, one layer",
    "attention": "one attention layer of a batch mixing a prefill chunk with `batch` decodes",
    "gemm": "one linear layer's GEMM over `num_tokens` rows (lm_head: once per step, logits rows)",
    "token_op": "one non-GEMM per-token op of a layer over `num_tokens`, `calls` times per layer",
    "step_op": "a per-token op run once per step (embedding, final norm) over `num_tokens`",
    "sequence_op": "a per-step op over `batch` logits rows (lm_head, sampler)",
    "moe": "one expert (MoE) layer over `num_tokens` with `num_experts` distinct experts activated",
    "copy": "a device-to-device copy of `bytes`",
    "attention_skew": "α of one bucket of the skew correction for decodes of unequal lengths (`kvsim.latency.skew`)",
}

PROFILE_META_KEYS: dict[str, type] = {
    "gpu": str,            # the device the profile was measured on (kvsim preset name or driver's name)
    "model": str,          # the model's name as the source gives it
    "tensor_parallel_size": int,
    "kv_cache_dtype": str,  # bfloat16 | float16 | fp8
    "num_layers": int, "hidden_size": int, "num_attention_heads": int, "num_kv_heads": int, "head_dim": int,
    "intermediate_size": int, "vocab_size": int,  # full-model shapes; checked against the model used
    "gated_mlp": bool,     # true | false: the MLP's kind, checked against the model used
    "source_repository": str, "source_commit": str, "source_licence": str, "source_path": str,
}
"""Metadata keys the importers record, with their value type: `kvsim.latency.profiles.check_meta` refuses an
integer key whose value is not an integer, and `check_profile` compares the integer keys and `gated_mlp` with the
scenario's model and tensor-parallel degree. Other keys are kept as they are."""


def burst_step_times(latency: LatencyModel, first: StepPlan) -> Iterator[float]:
    """Durations of successive decode steps of one unchanged batch whose first step is `first`.

    Each step every sequence's context grows by one token: Σ context and the attention work
    grow by the number of sequences, the shortest and longest contexts by one. The caller stops iterating.
    A model with `decode_step_times(first)` (the same floats, its constant terms computed once)
    gives them when it can; otherwise every step's plan is priced with `step_time`.
    """
    fast = getattr(latency, "decode_step_times", None)
    times = fast(first) if fast is not None else None
    return times if times is not None else _priced_step_times(latency, first)


def _priced_step_times(latency: LatencyModel, first: StepPlan) -> Iterator[float]:
    """`burst_step_times` by pricing every step's plan with `step_time`."""
    plan = StepPlan(num_tokens=first.num_tokens, num_seqs=first.num_seqs, num_decode_seqs=first.num_decode_seqs,
                    num_logits_rows=first.num_logits_rows, sum_context_tokens=first.sum_context_tokens,
                    sum_decode_context_tokens=first.sum_decode_context_tokens,
                    max_context_tokens=first.max_context_tokens, attention_work=first.attention_work,
                    min_decode_context_tokens=first.min_decode_context_tokens,
                    max_decode_context_tokens=first.max_decode_context_tokens)
    growth = first.num_seqs
    while True:
        yield latency.step_time(plan)
        plan.sum_context_tokens += growth
        plan.sum_decode_context_tokens += growth
        plan.attention_work += growth
        plan.max_context_tokens += 1
        plan.min_decode_context_tokens += 1
        plan.max_decode_context_tokens += 1


class LatencyModel(Protocol):
    """Prices a step (`step_time`). `cudagraph_padding`: the CUDA-graph capture sizes its steps are padded to
    (`kvsim.latency.cudagraph`), which a data-parallel group, a drafter and the planning floor read; None when its
    steps are not padded."""

    name: str
    cudagraph_padding: CudaGraphPadding | None

    def step_time(self, plan: StepPlan) -> float: ...


class ConstantLatency:
    """Every step takes `step_s` (plus swap time): for hand-computed timeline tests."""

    def __init__(self, step_s: float, host_link_bandwidth_bytes_per_s: float = float("inf")) -> None:
        self.name = f"constant({step_s}s)"
        self.cudagraph_padding: CudaGraphPadding | None = None  # no step is padded
        self.step_s = step_s
        self.link = host_link_bandwidth_bytes_per_s

    def step_time(self, plan: StepPlan) -> float:
        return self.step_s + (plan.swap_in_bytes + plan.swap_out_bytes) / self.link
