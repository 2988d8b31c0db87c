"""vLLM's `--speculative-config` (vllm/config/speculative.py), with the acceptance model kvsim needs.

    engine:
      speculative_config:
        method: eagle                 # ngram | eagle | eagle3 | draft_model (vLLM's names)
        num_speculative_tokens: 3     # K drafts proposed and verified per step
        acceptance_rates: [0.8, 0.7, 0.6]   # conditional: P(draft i accepted | drafts < i accepted)

A simulator has no draft/target logits, so how many drafts the target accepts is a model, given
by exactly one of:

* `acceptance_rates`: per-position *conditional* rates c_1..c_K (one number means the same rate
  at every position). kvsim's default kind of model: draft i is accepted with probability c_i
  given drafts 1..i−1 were, and verification stops at the first rejection.
* `acceptance_length`: a mean acceptance length L (tokens per step, the bonus token included,
  1 ≤ L ≤ K + 1), modelled as one conditional rate α at every position (Leviathan et al. 2023,
  i.i.d. acceptance: L = (1 − α^(K+1)) / (1 − α)).
* `synthetic_acceptance_rates` / `synthetic_acceptance_length`: vLLM's synthetic rejection
  sampler (`rejection_sample_method: synthetic`): per-position *unconditional* rates p_i =
  P(drafts 1..i all accepted), non-increasing, or a mean length resolved to vLLM's
  minimum-variance schedule [1]·⌊L−1⌋ + [frac(L−1)] + [0]·… . An integer length is a fixed
  acceptance: L = 3 with K = 3 accepts exactly 2 drafts every step.

`model` names the draft model (a preset or config.json) for `draft_model`, whose forward passes
kvsim prices; for EAGLE it is accepted, as vLLM loads the head from it, and a run warns that it is unread (the
head's cost follows the target's shape);
n-gram drafting costs no GPU time. Bad values raise one line naming the field and the value.
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from kvsim.model.errors import KvsimError
from kvsim.model.spec import Settings

SpeculativeMethod = Literal["ngram", "eagle", "eagle3", "draft_model"]
RejectionSampleMethod = Literal["strict", "probabilistic", "synthetic"]


class SpeculativeConfig(Settings):
    """One engine's speculative decoding (see the module docstring); validated once, frozen."""

    method: SpeculativeMethod
    num_speculative_tokens: int
    model: str | None = None
    rejection_sample_method: RejectionSampleMethod | None = None
    acceptance_rates: float | tuple[float, ...] | None = None
    acceptance_length: float | None = None
    synthetic_acceptance_rates: tuple[float, ...] | None = None
    synthetic_acceptance_length: float | None = None

    @field_validator("num_speculative_tokens")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:  # vLLM: "Expected num_speculative_tokens to be greater than zero"
            raise ValueError("must be greater than zero")
        return value

    @field_validator("acceptance_rates", "synthetic_acceptance_rates")
    @classmethod
    def _rates_in_unit_interval(cls, value: float | tuple[float, ...] | None) -> float | tuple[float, ...] | None:
        rates = (value,) if isinstance(value, (int, float)) else value or ()
        bad = [r for r in rates if not 0.0 <= r <= 1.0]
        if bad:
            raise ValueError(f"rates must be in [0, 1], got {bad[0]}")
        return value

    @model_validator(mode="after")
    def _one_acceptance_model(self) -> SpeculativeConfig:
        k = self.num_speculative_tokens
        given = [name for name in ("acceptance_rates", "acceptance_length", "synthetic_acceptance_rates",
                                   "synthetic_acceptance_length") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of acceptance_rates, acceptance_length, synthetic_acceptance_rates "
                             f"or synthetic_acceptance_length (got {', '.join(given) or 'none'})")
        synthetic = given[0].startswith("synthetic_")
        if synthetic and self.rejection_sample_method not in (None, "synthetic"):
            raise ValueError(f"{given[0]} is only valid with rejection_sample_method='synthetic' "
                             f"(got {self.rejection_sample_method!r}), as in vLLM")
        if not synthetic and self.rejection_sample_method == "synthetic":  # the named sampler was never modelled
            raise ValueError(f"rejection_sample_method='synthetic' takes synthetic_acceptance_rates or "
                             f"synthetic_acceptance_length (got {given[0]}, a model of another sampler)")
        rates = self.acceptance_rates
        if isinstance(rates, tuple) and len(rates) not in (1, k):
            raise ValueError(f"acceptance_rates has {len(rates)} entries, num_speculative_tokens={k}")
        unconditional = self.synthetic_acceptance_rates
        if unconditional is not None:
            if len(unconditional) != k:
                raise ValueError(f"synthetic_acceptance_rates has {len(unconditional)} entries, "
                                 f"num_speculative_tokens={k}")
            if any(b > a for a, b in zip(unconditional, unconditional[1:], strict=False)):
                raise ValueError(f"synthetic_acceptance_rates={list(unconditional)} must be non-increasing "
                                 "(P(drafts 1..i all accepted) cannot grow with i)")
        for name in ("acceptance_length", "synthetic_acceptance_length"):
            length = getattr(self, name)
            if length is not None and not 1.0 <= length <= k + 1:
                raise ValueError(f"{name}={length} must be in [1, num_speculative_tokens + 1 = {k + 1}]")
        if self.method == "draft_model" and self.model is None:
            raise ValueError("method=draft_model needs model (the draft model's preset or config.json)")
        return self

    @model_validator(mode="after")
    def _model_read_by_a_drafter(self) -> SpeculativeConfig:
        """n-gram drafting has no draft model: `{method: ngram, model: ...}` ran n-gram drafts (no GPU time)
        and dropped the model without a word."""
        self.refuse_unread("method", {"model": ("draft_model", "eagle", "eagle3")}, repr)
        return self

    @property
    def num_lookahead_tokens(self) -> int:
        """vLLM's `num_lookahead_tokens`: the KV slots a request holds past its verified tokens for the next
        step's drafts: K for EAGLE and draft models, 0 for n-gram (its drafts need no KV of a drafter)."""
        return 0 if self.method == "ngram" else self.num_speculative_tokens

    @property
    def num_draft_kv_layers(self) -> int:
        """Layers of the target's KV shape the drafter adds to the engine's KV pool (`kvsim.model.drafter`): the
        EAGLE head's one decoder layer (EAGLE and EAGLE-3 heads have `num_hidden_layers` 1); none for n-gram, which
        has no drafter on the GPU, and none for `draft_model`, whose layers have the draft's own shape
        (`KVLayout.draft_bytes_per_block`)."""
        return 1 if self.method in ("eagle", "eagle3") else 0

    @property
    def drops_last_hit_block(self) -> bool:
        """vLLM's `use_eagle`: EAGLE's drafter needs the target's hidden states of the last cached block, so a
        prefix-cache hit gives that block back to be recomputed (`FullAttentionManager.find_longest_cache_hit`,
        vllm/v1/core/single_type_kv_cache_manager.py: `if use_eagle and computed_blocks[0]: computed.pop()`)."""
        return self.method in ("eagle", "eagle3")

    def check_max_model_len(self, max_model_len: int) -> None:
        """K drafts must fit in the context (vLLM caps drafting by the model length)."""
        if self.num_speculative_tokens >= max_model_len:
            raise KvsimError(f"engine.speculative_config.num_speculative_tokens={self.num_speculative_tokens}: "
                             f"must be smaller than max_model_len={max_model_len}")

