"""A speculative-decoding step's time: the target's verify step plus the drafter's own passes.

The target prices the step as planned: each verifying sequence computes its last token and its K
drafts as one (K + 1)-token chunk (`kvsim.sched.v1`), with a row of logits per position. The
drafter then proposes the next K drafts for those sequences, one position at a time:

    ngram        nothing on the GPU (prompt lookup on the CPU): no cost
    eagle/eagle3 K passes of one decoder layer of the target's shape plus the LM head (EAGLE's
                 head reuses the target's embedding and LM head) over the verifying sequences
    draft_model  K decode passes of the draft model (`speculative_config.model`)

each priced by the roofline as a decode step of those sequences at their contexts, without the
per-step CPU overhead (the drafter runs inside the target's engine step). A first-order model:
EAGLE's first pass re-reads the accepted tokens and tree drafting is not modelled.
"""

from __future__ import annotations

from kvsim.latency.base import LatencyModel
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.config import EngineConfig, GPUSpec, ModelSpec, load_model
from kvsim.model.drafter import eagle_head


class SpeculativeLatency:
    """`target.step_time(plan)` plus `num_speculative_tokens` drafter passes over the plan's verifying
    sequences (`drafter` None: n-gram, free)."""

    def __init__(self, target: LatencyModel, drafter: LatencyModel | None, num_speculative_tokens: int,
                 method: str) -> None:
        self.target, self.drafter, self.num_speculative_tokens = target, drafter, num_speculative_tokens
        self.name = f"{target.name}+{method}"

    def step_time(self, plan: StepPlan) -> float:
        step_s = self.target.step_time(plan)
        if self.drafter is None or not plan.num_spec_decode_seqs:
            return step_s
        draft = StepPlan()
        draft.add_decodes(plan.num_spec_decode_seqs, plan.sum_spec_context_tokens, plan.max_context_tokens,
                          plan.min_decode_context_tokens)
        return step_s + self.num_speculative_tokens * self.drafter.step_time(draft)


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
    return SpeculativeLatency(target, drafter, spec.num_speculative_tokens, spec.method)
