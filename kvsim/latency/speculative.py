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
                 pass j reading each context after the step plus j (`seq_lens += 1`). A step that
                 schedules only prefill chunks drafts all the same.
    draft_model  K decode passes of the draft model (`speculative_config.model`) over the verifying
                 sequences (not checked against vLLM's `DraftModelProposer`)

each priced by the roofline without the per-step CPU overhead (the drafter runs inside the target's engine
step). EAGLE's contexts are the plan's, its drafts counted as if all were accepted (the plan is priced before
the acceptance is drawn; vLLM's padded batch subtracts the rejected ones from `seq_lens` after the first
pass). Tree drafting is not modelled.
"""

from __future__ import annotations

from kvsim.latency.base import LatencyModel
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.config import EngineConfig, GPUSpec, ModelSpec, load_model
from kvsim.model.drafter import eagle_head


class SpeculativeLatency:
    """`target.step_time(plan)` plus the drafter's passes (`drafter` None: n-gram, free): with
    `drafts_over_batch` (EAGLE) a first pass over the step's tokens and K − 1 one-token passes over all its
    sequences, else K one-token passes over the plan's verifying sequences."""

    def __init__(self, target: LatencyModel, drafter: LatencyModel | None, num_speculative_tokens: int,
                 method: str, drafts_over_batch: bool = False) -> None:
        self.target, self.drafter, self.num_speculative_tokens = target, drafter, num_speculative_tokens
        self.drafts_over_batch = drafts_over_batch
        self.name = f"{target.name}+{method}"

    def step_time(self, plan: StepPlan) -> float:
        step_s = self.target.step_time(plan)
        if self.drafter is None:
            return step_s
        if self.drafts_over_batch:
            return step_s + self._batch_draft_s(self.drafter, plan) if plan.num_seqs else step_s
        if not plan.num_spec_decode_seqs:
            return step_s
        draft = StepPlan()
        draft.add_decodes(plan.num_spec_decode_seqs, plan.sum_spec_context_tokens, plan.max_context_tokens,
                          plan.min_decode_context_tokens)
        return step_s + self.num_speculative_tokens * self.drafter.step_time(draft)

    def _batch_draft_s(self, drafter: LatencyModel, plan: StepPlan) -> float:
        """EAGLE's passes for `plan` (the module docstring): the first over the plan's tokens and contexts with
        one logits row per sequence, then pass j = 1 … K − 1 one token per sequence at its context + j."""
        first = StepPlan(num_tokens=plan.num_tokens, num_seqs=plan.num_seqs,
                         num_prefill_tokens=plan.num_prefill_tokens, num_decode_seqs=plan.num_decode_seqs,
                         num_sampled=plan.num_seqs, sum_context_tokens=plan.sum_context_tokens,
                         sum_decode_context_tokens=plan.sum_decode_context_tokens,
                         max_context_tokens=plan.max_context_tokens,
                         min_decode_context_tokens=plan.min_decode_context_tokens,
                         max_decode_context_tokens=plan.max_decode_context_tokens,
                         attention_work=plan.attention_work)
        draft_s = drafter.step_time(first)
        n = plan.num_seqs
        for j in range(1, self.num_speculative_tokens):
            # the shortest context over every sequence is not tracked: the roofline reads neither extreme
            step = StepPlan()
            step.add_decodes(n, plan.sum_context_tokens + j * n, plan.max_context_tokens + j,
                             plan.max_context_tokens + j)
            draft_s += drafter.step_time(step)
        return draft_s


def speculative_latency(target: LatencyModel, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig) -> LatencyModel:
    """`target` with the drafter of `engine.speculative_config` priced on top."""
    spec = engine.speculative_config
    assert spec is not None
    drafter: LatencyModel | None = None
    if spec.method in ("eagle", "eagle3"):
        drafter = RooflineLatency(eagle_head(model), gpu, engine, overhead_s=0.0)
    elif spec.method == "draft_model":
        assert spec.model is not None
        drafter = RooflineLatency(load_model(spec.model), gpu, engine, overhead_s=0.0)
    return SpeculativeLatency(target, drafter, spec.num_speculative_tokens, spec.method,
                              drafts_over_batch=spec.method in ("eagle", "eagle3"))
