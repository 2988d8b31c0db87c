"""How many of K drafted tokens the target model accepts in one verify step: the acceptance model.

Each decode step of a speculating sequence verifies K + 1 tokens (the last accepted token and K
drafts). Verification walks the drafts in order and stops at the first rejection; the target then
emits one more token of its own (the correction after a rejection, or the bonus token after K
acceptances). So a step that accepts `a` drafts emits a + 1 tokens, 1 ≤ a + 1 ≤ K + 1:

    drafts      d1   d2   d3          K = 3, conditional rates c = (c1, c2, c3)
    accepted?   yes  yes  no          P = c1 · c2 · (1 − c3)
    emitted     d1   d2   t3          a = 2 drafts accepted, 3 tokens this step

`AcceptanceModel` holds the conditional rates c_i = P(draft i accepted | drafts < i accepted)
whatever form the user gave (`kvsim.model.speculative_config` lists them); `sample` draws the
accepted count of each sequence from the run's seeded generator, and draws nothing when every rate
is 0 or 1 (a fixed acceptance: vLLM's synthetic sampler with an integer acceptance length), so
such runs consume no random numbers. A request may bring its own acceptance lengths (a trace's
acceptance column, `kvsim.workload.traces`): its verify steps take them in order while they last,
and the model still draws for it, so a trace changes no other request's draws. Pure Python and numpy.

n-gram drafting is modelled as drafting K tokens at every decode step; vLLM's is not. Its `NgramProposer`
(vllm/v1/spec_decode/ngram_proposer.py) drafts only when the context's last n tokens (prompt_lookup_min ≤ n ≤
prompt_lookup_max) occur earlier in it, and then at most the K tokens that followed the match (fewer near its end);
without a match the request drafts nothing and its next step is a one-token decode. vLLM's spec-decode counters see
only the steps that drafted (`Scheduler.update_from_output` observes a draft `if scheduled_spec_token_ids`), so its
acceptance rate is accepted ÷ drafts proposed and its mean acceptance length 1 + accepted ÷ steps that drafted.
Given here, those would hold for every decode step: more tokens a step than vLLM emits wherever contexts lack
matches. For n-gram the acceptance must describe every decode step: `acceptance_length` = (G − R) ÷ (G − R − A),
with G the output tokens, R the requests (each one's first token comes from its prefill) and A the accepted drafts
(`vllm:generation_tokens_total`, the request count, `vllm:spec_decode_num_accepted_tokens_total`), so that a step
without a match counts as one that accepted none; the mean then matches vLLM's, the spread need not. Each step is
still priced as a (K + 1)-token verify (`kvsim.latency.speculative`), where vLLM computes one token for a step
without a match: an over-estimate, small while decode is memory-bound, larger as the batch makes it compute-bound.
kvsim has no match probability to draw from, and none is invented.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvsim.model.speculative_config import SpeculativeConfig


@dataclass(frozen=True, slots=True)
class AcceptanceModel:
    """Per-position conditional acceptance rates, one per draft (`len(conditional_rates)` = K)."""

    conditional_rates: tuple[float, ...]

    def __post_init__(self) -> None:
        assert self.conditional_rates and all(0.0 <= c <= 1.0 for c in self.conditional_rates)

    @property
    def num_speculative_tokens(self) -> int:
        return len(self.conditional_rates)

    @property
    def unconditional_rates(self) -> tuple[float, ...]:
        """p_i = P(drafts 1..i all accepted) = c_1 · … · c_i (vLLM's synthetic_acceptance_rates)."""
        return tuple(float(p) for p in np.cumprod(self.conditional_rates))

    @property
    def mean_accepted_drafts(self) -> float:
        """E[a] = Σ_i p_i: the expected number of drafts accepted per step."""
        return float(sum(self.unconditional_rates))

    @property
    def mean_acceptance_length(self) -> float:
        """E[a] + 1: tokens emitted per verify step (vLLM's mean acceptance length)."""
        return 1.0 + self.mean_accepted_drafts

    @property
    def is_fixed(self) -> bool:
        """Every rate is 0 or 1: each step accepts the same number of drafts, no random draw."""
        return all(c in (0.0, 1.0) for c in self.conditional_rates)

    def sample(self, rng: np.random.Generator, num_seqs: int) -> np.ndarray:
        """Drafts accepted by each of `num_seqs` sequences this step (ints in [0, K]).

        One uniform per sequence and position, row by row: sequence s accepts draft i while
        u[s, i] < c_i for every earlier i (a fixed model draws nothing).
        """
        if self.is_fixed:
            accepted = 0
            while accepted < len(self.conditional_rates) and self.conditional_rates[accepted] == 1.0:
                accepted += 1
            return np.full(num_seqs, accepted, dtype=np.int64)
        draws = rng.random((num_seqs, len(self.conditional_rates)))
        ok = draws < np.asarray(self.conditional_rates)
        return np.cumprod(ok, axis=1).sum(axis=1).astype(np.int64)


def acceptance_model(config: SpeculativeConfig) -> AcceptanceModel:
    """The conditional rates of whichever acceptance form `config` gives (exactly one is set)."""
    k = config.num_speculative_tokens
    if config.acceptance_rates is not None:
        rates = config.acceptance_rates
        conditional = (float(rates),) * k if isinstance(rates, (int, float)) else tuple(rates) * (k // len(rates))
        return AcceptanceModel(conditional)
    if config.acceptance_length is not None:
        return AcceptanceModel((constant_rate_for_length(config.acceptance_length, k),) * k)
    if config.synthetic_acceptance_rates is not None:
        return AcceptanceModel(conditional_from_unconditional(config.synthetic_acceptance_rates))
    assert config.synthetic_acceptance_length is not None
    return AcceptanceModel(conditional_from_unconditional(
        min_variance_schedule(config.synthetic_acceptance_length, k)))


def min_variance_schedule(length: float, k: int) -> tuple[float, ...]:
    """vLLM's `_acceptance_length_to_rates`: unconditional rates [1]·⌊L−1⌋ + [frac(L−1)] + [0]·…,
    the least-variance way to accept L − 1 drafts a step on average."""
    drafts = length - 1.0
    full = min(int(drafts), k)
    rates = [1.0] * full + ([drafts - full] if full < k else [])
    return tuple(rates + [0.0] * (k - len(rates)))


def conditional_from_unconditional(unconditional: tuple[float, ...]) -> tuple[float, ...]:
    """c_i = p_i / p_{i−1} (p_0 = 1; 0 once a p is 0), vLLM's `unconditional_to_conditional_rates`."""
    previous = (1.0, *unconditional[:-1])
    return tuple(p / q if q > 0.0 else 0.0 for p, q in zip(unconditional, previous, strict=True))


def constant_rate_for_length(length: float, k: int) -> float:
    """α with (1 − α^(K+1)) / (1 − α) = L: i.i.d. acceptance of mean length L (bisection; the
    left side grows with α from 1 at α = 0 to K + 1 at α = 1)."""
    assert 1.0 <= length <= k + 1
    low, high = 0.0, 1.0
    for _ in range(100):  # 2^-100: exact to double precision
        mid = (low + high) / 2
        if sum(mid**i for i in range(k + 1)) < length:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclass(slots=True)
class Speculation:
    """One engine's speculative decoding: its acceptance model, lookahead and run-long counters.

    `num_lookahead_slots` is vLLM's `num_lookahead_tokens`: K for EAGLE and draft models (the
    drafter writes its drafts' KV in the target's blocks), 0 for n-gram (vllm/v1/core/sched/
    scheduler.py). Counters follow vLLM's `vllm:spec_decode_*` metrics: `num_drafts` verify steps
    with at least one draft, `num_draft_tokens` drafts verified, `num_accepted_tokens` accepted.
    `drops_last_hit_block`: EAGLE's, whose prefix hits recompute their last block (vLLM's `use_eagle`).
    `rejected_slot_s` integrates, over time, the slots holding drafts the last verify rejected
    (held until the next step overwrites them); `pending` maps each request verifying drafts in
    the step being planned to its number of drafts, `accepted` to the drafts it accepts (drawn when the
    step is planned, before it is priced: the drafter's passes after the first read the contexts the
    verify leaves, `kvsim.sched.speculative_steps.SpeculativeSteps.draw_verify_outcomes`). `in_flight_rejected`
    maps each request whose verify the last completed step was to the drafts it rejected, until the next plan: with
    async scheduling vLLM makes that plan before the step's output is processed, still counting them as computed
    (`kvsim.sched.v1.V1Scheduler.select`). `in_flight_finished` likewise maps each request that verify ended by
    accepted drafts (async only) to the tokens vLLM still counts computed past its own (the verify's 1 + d less
    the tokens it emitted): vLLM, not sure it ends, plans one more verify for it, output discarded.
    `overwriting` holds the requests the step being planned decodes without a verify while drafts a verify
    rejected still sit after their computed tokens (async scheduling passed them over once and dropped their new
    drafts, `kvsim.sched.v1.V1Scheduler._drop_unscheduled_drafts`): that step writes over the first of those
    slots, as a verify does.
    """

    model: AcceptanceModel
    num_lookahead_slots: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_rejected_slots: int = 0
    rejected_slot_s: float = 0.0
    last_complete_s: float = 0.0
    pending: dict[int, int] = field(default_factory=dict)
    accepted: dict[int, int] = field(default_factory=dict)
    in_flight_rejected: dict[int, int] = field(default_factory=dict)
    in_flight_finished: dict[int, int] = field(default_factory=dict)
    overwriting: set[int] = field(default_factory=set)
    drops_last_hit_block: bool = False  # EAGLE: a prefix hit recomputes its last block (`Scheduler.lookup`)

    @property
    def num_speculative_tokens(self) -> int:
        return self.model.num_speculative_tokens

    def integrate_rejected_slots(self, now: float) -> None:
        """The slots the previous step's rejected drafts held, integrated up to `now` (a step's end); they start
        over (the step ending now sets them again, `SpeculativeSteps._complete_verify`)."""
        self.rejected_slot_s += self.num_rejected_slots * (now - self.last_complete_s)
        self.last_complete_s, self.num_rejected_slots = now, 0

    def record_verify(self, num_drafts: int, num_accepted: int) -> None:
        self.num_drafts += num_drafts > 0
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted


def make_speculation(config: SpeculativeConfig) -> Speculation:
    """The runtime state of `config` (its acceptance model; vLLM's lookahead, `num_lookahead_tokens`)."""
    return Speculation(acceptance_model(config), config.num_lookahead_tokens,
                       drops_last_hit_block=config.drops_last_hit_block)
