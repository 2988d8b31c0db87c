"""`StepPlan`: what one engine step computes, written by the scheduler and priced by the latency models.

A leaf module (no kvsim imports), so the scheduler and the latency models meet here without
depending on each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StepPlan:
    """What one step computes. `scheduled` pairs each request with its new tokens per sequence."""

    scheduled: list = field(default_factory=list)  # list[tuple[Request, int]]
    num_tokens: int = 0  # Σ new tokens over all sequences (the batch size in tokens)
    num_seqs: int = 0  # sequences computing at least one token
    num_prefill_tokens: int = 0
    num_decode_seqs: int = 0
    num_logits_rows: int = 0  # hidden-state rows the LM head and sampler run on: the scheduler's count (vLLM v1:
    # every scheduled request, a partial prefill chunk too, plus one per draft verified; v0: the sequences sampling)
    sum_context_tokens: int = 0  # Σ over sequences of context after the step (KV read)
    sum_decode_context_tokens: int = 0  # the part of sum_context_tokens from decode sequences
    max_context_tokens: int = 0
    min_decode_context_tokens: int = 0  # the shortest and longest decode contexts (0 without decodes): how
    max_decode_context_tokens: int = 0  # unequal they are (a measured skew correction prices that)
    attention_work: float = 0.0  # Σ new · (past + (new + 1) / 2): causal query-key pairs
    swap_in_bytes: int = 0
    swap_out_bytes: int = 0
    num_copied_blocks: int = 0
    num_dp_group_tokens: int = 0  # tokens of every DP engine in this step (their MoE layers run together)
    num_dp_padded_tokens: int = 0  # tokens this DP rank runs, CUDA-graph padded across the group (0: not set;
    # `kvsim.latency.cudagraph`); a lone engine pads its own
    preempted: list = field(default_factory=list)  # requests preempted while planning this step
    ignored: list = field(default_factory=list)  # requests it let go, never to run again (vLLM v0's FINISHED_IGNORED)
    num_spec_decode_seqs: int = 0  # sequences verifying speculative drafts
    num_draft_tokens: int = 0  # Σ drafts they verify
    num_rejected_draft_tokens: int = 0  # Σ of those the verify rejects (drawn when planned; the drafter's later
    # passes read each context without them: `kvsim.latency.speculative`)
    num_verify_chunk_tokens: int = 0  # tokens of verify chunks of ≥ 2 tokens: in num_prefill_tokens, priced as
    num_verify_chunk_seqs: int = 0  # chunks; their sequences, not in num_decode_seqs (see `num_row_decode_seqs`)
    num_one_token_chunks: int = 0  # sequences computing one prompt (or recomputed) token after ≥ 1: priced as
    # decodes (`add`, `kvsim.sched.base.Scheduler.account`), reported as prefill (`num_row_prefill_tokens`)
    windowed_decode_context_tokens: dict[int, int] | None = None  # window → Σ min(context, window) over the
    # decodes (`decode_context_in_window`); None where not counted (the scheduler counts it for windowed models)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.swap_in_bytes and not self.swap_out_bytes

    @property
    def num_row_prefill_tokens(self) -> int:
        """Prefill tokens as a step row reports them: prompt (and recomputed) tokens only. A sequence verifying
        k drafts is a decode processing k + 1 tokens, as vLLM counts it (`IterationStats.update_from_output`,
        vllm/v1/metrics/stats.py: generation tokens once the prompt is done), though the latency models
        price its k + 1 tokens as a chunk (`num_prefill_tokens`). A chunk of one prompt token after others (the
        prompt's last, once chunked prefill or a prefix hit left one) is a prompt token, though priced as a
        decode (`num_one_token_chunks`)."""
        return self.num_prefill_tokens - self.num_verify_chunk_tokens + self.num_one_token_chunks

    @property
    def num_row_decode_seqs(self) -> int:
        """Decode sequences as a step row reports them: one-token decodes of a sampled token and verifying
        sequences."""
        return self.num_decode_seqs + self.num_verify_chunk_seqs - self.num_one_token_chunks

    def decode_context_in_window(self, window: int) -> int:
        """Σ min(context, window) over the decode sequences: what a sliding-window layer (or a chunked one, at
        most) reads. Exact where the scheduler counted it (`windowed_decode_context_tokens`); else min(Σ
        context, n · window), exact when every decode context is on one side of the window (a decode burst's
        plans: `kvsim.sched.burst` condition (f)), an upper bound otherwise."""
        exact = self.windowed_decode_context_tokens
        if exact is not None:
            return exact[window]
        return min(self.sum_decode_context_tokens, self.num_decode_seqs * window)

    def add(self, num_new: int, past: int, num_seqs: int, logits_row: bool) -> None:
        """Account `num_seqs` sequences each computing `num_new` tokens after `past` cached ones, each with a
        row of logits (its last token's) where `logits_row`: the scheduler decides (`Scheduler.account`)."""
        context = past + num_new
        self.num_tokens += num_new * num_seqs
        self.num_seqs += num_seqs
        if num_new == 1 and past > 0:
            self._decode_extremes(context, context)
            self.num_decode_seqs += num_seqs
            self.sum_decode_context_tokens += context * num_seqs
        else:
            self.num_prefill_tokens += num_new * num_seqs
        self.num_logits_rows += num_seqs if logits_row else 0
        self.sum_context_tokens += context * num_seqs
        self.max_context_tokens = max(self.max_context_tokens, context)
        self.attention_work += num_new * (past + (num_new + 1) / 2) * num_seqs

    def add_verify(self, num_new: int, past: int, num_seqs: int = 1) -> None:
        """Account `num_seqs` speculative verify steps: each sequence's last sampled token and `num_new` − 1
        drafts, computed as one chunk after `past` tokens, each with a row of logits (the target checks every
        draft), the drafter to run for it next (`kvsim.latency.speculative`)."""
        self.add(num_new, past, num_seqs, logits_row=True)
        if num_new > 1:  # `add` counted its tokens as prefill (one token after `past`: a decode)
            self.num_verify_chunk_tokens += num_new * num_seqs
            self.num_verify_chunk_seqs += num_seqs
        self.num_logits_rows += num_seqs * (num_new - 1)
        self.num_spec_decode_seqs += num_seqs
        self.num_draft_tokens += num_seqs * (num_new - 1)

    def add_decodes(self, num_seqs: int, sum_context_tokens: int, max_context_tokens: int,
                    min_context_tokens: int) -> None:
        """Account `num_seqs` one-token decodes (each after ≥ 1 cached token, each sampling) at once, of
        contexts between `min_context_tokens` and `max_context_tokens`: the same totals as
        `add(1, context − 1, 1, logits_row=True)` per sequence. Every term of `attention_work` is a
        multiple of ½ far below 2⁵³, so its float sum is exact in any order."""
        if num_seqs:
            self._decode_extremes(min_context_tokens, max_context_tokens)
        self.num_tokens += num_seqs
        self.num_seqs += num_seqs
        self.num_decode_seqs += num_seqs
        self.sum_decode_context_tokens += sum_context_tokens
        self.num_logits_rows += num_seqs
        self.sum_context_tokens += sum_context_tokens
        if max_context_tokens > self.max_context_tokens:
            self.max_context_tokens = max_context_tokens
        self.attention_work += sum_context_tokens  # decode term: 1 · (past + 1) = its context

    def _decode_extremes(self, shortest: int, longest: int) -> None:
        """Widen the decode contexts' range to include [shortest, longest] (before counting the new decodes)."""
        if not self.num_decode_seqs or shortest < self.min_decode_context_tokens:
            self.min_decode_context_tokens = shortest
        if longest > self.max_decode_context_tokens:
            self.max_decode_context_tokens = longest
