"""A speculative-decoding step's time: the target's verify step plus the drafter's own passes.

The target prices the step as planned: each verifying sequence computes its last token and its K
drafts as one (K + 1)-token chunk (`kvsim.sched.v1`), with a row of logits per position. The
drafter then proposes the next K drafts:

    ngram        nothing on the GPU (prompt lookup on the CPU): no cost
    eagle/eagle3 one decoder layer of the target's shape plus the LM head (EAGLE's head reuses the
                 target's embedding and LM head), run as vLLM's `EagleProposer.propose`
                 (vllm/v1/spec_decode/eagle.py) runs it: a first pass over every token the step
                 scheduled (`GPUModelRunner.propose_draft_token_ids` passes `input_ids[:num_scheduled_tokens]`,
                 prefill chunks included, so the head writes its KV for them; with the default padded drafter
                 batch the rejected drafts stay in as padding) with one logits row per request
                 (`last_token_indices`), then K − 1 one-token passes over every request of the batch
                 (`batch_size = next_token_ids.shape[0]`: a prefill chunk drafts too, its drafts discarded),
                 pass j reading each context after the step without its rejected drafts, plus j
                 (`seq_lens -= num_rejected_tokens_gpu` once, then `seq_lens += 1` a pass). A step that
                 schedules only prefill chunks drafts all the same.
    draft_model  the draft model (`speculative_config.model`, in the target's dtype: `kvsim.model.drafter.draft_model`)
                 run the same way: vLLM's `DraftModelProposer` (vllm/v1/spec_decode/draft_model.py) is a
                 `SpecDecodeBaseProposer`, fed by `propose_draft_token_ids` as EAGLE is, whose
                 `set_inputs_first_pass` appends each request's next token after its scheduled ones
                 (`num_tokens = target_token_ids.shape[0] + batch_size`, `extend_all_queries_by_1`: every query
                 and `seq_lens` one longer), so its first pass computes the step's tokens plus one per
                 sequence, each sequence's n + 1 tokens after its past p, a chunk (causal pairs
                 (n + 1)(p + (n + 2)/2) = n(p + (n + 1)/2) + (p + n) + 1: the plan's work plus each context after
                 the step plus one), one logits row per request; then K − 1 one-token passes over every
                 request, pass j at its context after the step without its rejected drafts, plus 1 + j

each priced by the roofline without the per-step CPU overhead (the drafter runs inside the target's engine
step), CUDA-graph padded as the target's steps are (`kvsim.latency.cudagraph`): vLLM's proposer pads its first
pass's tokens and each later pass's batch with the target's capture sizes (`EagleProposer.propose`:
`vllm_config.pad_for_cudagraph`, a piecewise graph, where the count is at most `max_cudagraph_capture_size`).
The first pass reads the plan's contexts, rejected drafts included (vLLM's padded drafter batch keeps them
as padding); the later passes read the contexts the verify leaves: the scheduler draws each verify's acceptance
when it plans the step (`SpeculativeSteps.draw_verify_outcomes`) and the plan carries the drafts rejected
(`StepPlan.num_rejected_draft_tokens`), subtracted from the summed context. The longest context of those passes
is the plan's plus j, an upper bound (which sequence holds it is not tracked). Tree drafting is not modelled.
"""

from __future__ import annotations

from kvsim.latency.base import LatencyModel
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.config import GPUSpec
from kvsim.model.drafter import draft_model, eagle_head
from kvsim.model.engine_config import EngineConfig
from kvsim.model.spec import ModelSpec


class SpeculativeLatency:
    """`target.step_time(plan)` plus the drafter's passes (`drafter` None: n-gram, free): a first pass over the
    step's tokens (with `appends_next_token`, a draft model's, one more per sequence) and K − 1 one-token passes
    over all its sequences."""

    def __init__(self, target: LatencyModel, drafter: LatencyModel | None, num_speculative_tokens: int,
                 method: str, appends_next_token: bool = False) -> None:
        self.target, self.drafter, self.num_speculative_tokens = target, drafter, num_speculative_tokens
        self.appends_next_token = appends_next_token
        self.cudagraph_padding = target.cudagraph_padding  # the target's steps' (a DP group's)
        self.name = f"{target.name}+{method}"

    def step_time(self, plan: StepPlan) -> float:
        step_s = self.target.step_time(plan)
        if self.drafter is None or not plan.num_seqs:
            return step_s
        return step_s + self._draft_s(self.drafter, plan)

    def _draft_s(self, drafter: LatencyModel, plan: StepPlan) -> float:
        """The drafter's passes for `plan` (the module docstring): the first over the plan's tokens and contexts
        (a draft model's each one longer, every sequence a chunk) with one logits row per sequence, then pass
        j = 1 … K − 1 one token per sequence at its context less its rejected drafts, + j (+ 1 for a draft
        model)."""
        n = plan.num_seqs
        if self.appends_next_token:
            extra = 1
            first = StepPlan(num_tokens=plan.num_tokens + n, num_seqs=n, num_prefill_tokens=plan.num_tokens + n,
                             num_logits_rows=n, sum_context_tokens=plan.sum_context_tokens + n,
                             max_context_tokens=plan.max_context_tokens + 1,
                             attention_work=plan.attention_work + plan.sum_context_tokens + n)
        else:
            extra = 0
            first = StepPlan(num_tokens=plan.num_tokens, num_seqs=n, num_prefill_tokens=plan.num_prefill_tokens,
                             num_decode_seqs=plan.num_decode_seqs, num_logits_rows=n,
                             sum_context_tokens=plan.sum_context_tokens,
                             sum_decode_context_tokens=plan.sum_decode_context_tokens,
                             max_context_tokens=plan.max_context_tokens,
                             min_decode_context_tokens=plan.min_decode_context_tokens,
                             max_decode_context_tokens=plan.max_decode_context_tokens,
                             attention_work=plan.attention_work)
        draft_s = drafter.step_time(first)
        verified_context = plan.sum_context_tokens - plan.num_rejected_draft_tokens
        for j in range(1 + extra, self.num_speculative_tokens + extra):
            # the shortest context over every sequence is not tracked: the roofline reads neither extreme
            step = StepPlan()
            step.add_decodes(n, verified_context + j * n, plan.max_context_tokens + j, plan.max_context_tokens + j)
            draft_s += drafter.step_time(step)
        return draft_s


def speculative_latency(target: LatencyModel, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig) -> LatencyModel:
    """`target` with the drafter of `engine.speculative_config` priced on top, padded as `target`'s steps are
    (its `cudagraph_padding`, where it has one)."""
    spec = engine.speculative_config
    assert spec is not None
    drafter: LatencyModel | None = None
    draft = draft_model(model, spec)
    padding = target.cudagraph_padding  # the drafter's graphs are captured at the target's sizes
    if spec.method in ("eagle", "eagle3"):
        drafter = RooflineLatency(eagle_head(model), gpu, engine, overhead_s=0.0, padding=padding)
    elif draft is not None:
        drafter = RooflineLatency(draft, gpu, engine, overhead_s=0.0, padding=padding)
    return SpeculativeLatency(target, drafter, spec.num_speculative_tokens, spec.method,
                              appends_next_token=draft is not None)
