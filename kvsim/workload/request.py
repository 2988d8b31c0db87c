"""A request and its lifecycle, as the scheduler sees it.

    WAITING ──admit──▶ RUNNING ──last token──▶ FINISHED
       ▲                 │  │
       └──recompute──────┘  └──swap out──▶ SWAPPED ──swap in──▶ RUNNING
    (PREEMPTED: back at the front of the queue, to recompute prompt + generated tokens)

    arriving: REJECTED (with a reason) if it can never be served

Token bookkeeping follows vLLM v1: `num_tokens` = prompt + generated so far;
`num_computed_tokens` catches up to it (a prefill chunk, or 1 token when decoding); when
it does, one token is sampled. The KV of the last sampled token is never computed, so a
request holds at most `kv_len = prompt_len + output_len − 1` slots per sequence.
A request with `num_samples = n > 1` runs n sequences that share the prompt: under the v0 and
static policies one request of n sequences (vLLM v0's parallel sampling: one prefill, then `fork`);
under v1, n child requests of one sequence each, whose row is the request's (vLLM v1's fan-out,
`kvsim.sched.fanout`). With `beam` (every policy) they are beams that re-fork from the surviving
beams after every step, so they share more than the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from kvsim.workload.content import Content

MAX_SAMPLES = 256  # sequence ids are request_id · MAX_SAMPLES + sample index


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"


@dataclass(slots=True)
class Request:
    """One user request: lengths, content for prefix caching, progress and timestamps (seconds)."""

    request_id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    content: Content | None = None
    num_samples: int = 1
    beam: bool = False  # beam search: after each step, beams re-fork from the surviving ones
    priority: int = 0  # vLLM's request priority: smaller is served first under the `priority` policy
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    first_scheduled_s: float | None = None  # when the step first scheduling it was planned (vLLM's SCHEDULED)
    first_token_s: float | None = None
    finish_s: float | None = None
    num_preemptions: int = 0  # on the engine serving it now (its scheduler counts a re-admission by it)
    # on engines it left: a disaggregated request's prefill instance (its row shows the sum, the request's total)
    num_prior_preemptions: int = 0
    num_prefix_hit_tokens: int = 0
    reject_reason: str | None = None
    seq_ids: list[int] = field(default_factory=list)
    # speculative decoding: tokens each verify step emits, from a trace (None: the acceptance model draws)
    acceptance_lengths: tuple[int, ...] | None = None
    num_verify_steps: int = 0
    num_rejected_draft_slots: int = 0  # slots after its computed tokens holding drafts its last verify rejected
    # its last step sampled a token, so the drafter proposed drafts for the next step to verify (vLLM's non-empty
    # `spec_token_ids`): a prefill chunk's drafts are dropped, a preemption clears them
    has_drafts: bool = False
    client_queue_s: float = 0.0  # closed loop: how long it waited in the client for a free slot before `arrival_s`
    # when the engine serving it now took it, where that is not `arrival_s`: a disaggregated decode instance's
    # hand-off (vLLM's frontend stamps `Request.arrival_time` on receipt; the proxy sends D the request after P)
    engine_arrival_s: float | None = None
    # the most tokens a preemption by recompute dropped the KV of (`drop_kv`): computing them again is recompute
    num_dropped_kv_tokens: int = 0
    # output tokens it asked for beyond max_model_len: vLLM ends it there, finish_reason "length" (`cap_output`)
    num_length_capped_tokens: int = 0
    # async scheduling (`kvsim.sched.async_steps.AsyncSteps.forget_in_flight_hash`): the step (its scheduler's
    # `num_steps_planned` then) that sampled its newest token, and the last step that decoded a token the step
    # before it had sampled (planned while that token was still in flight)
    sampled_step: int = -1
    in_flight_decode_step: int = -1
    # the drafts its last verify accepted (`SpeculativeSteps.forget_draft_hashes`)
    num_accepted_drafts: int = 0

    @property
    def queue_arrival_s(self) -> float:
        """Its arrival as its engine's queue orders it (vLLM's `Request.arrival_time`): `engine_arrival_s`, else
        the client's `arrival_s`."""
        return self.arrival_s if self.engine_arrival_s is None else self.engine_arrival_s

    def __post_init__(self) -> None:
        assert self.prompt_len > 0 and self.output_len > 0 and 0 < self.num_samples <= MAX_SAMPLES
        self.seq_ids = [self.request_id * MAX_SAMPLES]

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output_tokens

    @property
    def kv_len(self) -> int:
        """Slots each sequence of this request holds at most: every token but the last sampled."""
        return self.prompt_len + self.output_len - 1

    def drop_kv(self) -> None:
        """Preempted by recompute (vLLM's `_preempt_request`), its KV freed by the caller: PREEMPTED, it computes
        from its next prefix hit on as if new (no token computed, no drafts); the tokens it had computed are kept
        in `num_dropped_kv_tokens`."""
        self.num_dropped_kv_tokens = max(self.num_dropped_kv_tokens, self.num_computed_tokens)
        self.num_computed_tokens = self.num_rejected_draft_slots = 0
        self.has_drafts = False
        self.status = RequestStatus.PREEMPTED

    def num_recomputed(self, past: int, num_new: int) -> int:
        """Of `num_new` tokens computed after `past`, those whose KV it had computed before a preemption dropped it
        (`drop_kv`): the work the preemption costs. The newest sampled token, which vLLM's re-admission computes
        with them, is not among them: its KV was never computed, a decode step would have computed it anyway."""
        return max(0, min(past + num_new, self.num_dropped_kv_tokens) - past)

    def cap_output(self, max_model_len: int) -> None:
        """Cap the output so that prompt + output ≤ `max_model_len`, the limit of the engine that serves it, as
        vLLM ends a request whose tokens reach it (`FINISHED_LENGTH_CAPPED`). A single engine's requests come
        capped already (`kvsim.workload.generate`); a fleet's are capped where they are served, since its
        replicas' limits may differ (a conversation's next turn carries the reply as capped here,
        `kvsim.workload.conversations.served_reply_len`). The tokens cut are added to `num_length_capped_tokens`.
        A prompt that alone reaches the limit, for the scheduler to refuse, gets back the output asked where a
        larger limit had cut it (a fleet's largest: a smaller replica refuses it): a refused row keeps the
        request's own lengths and no length cap (docs/metrics.md)."""
        room = max_model_len - self.prompt_len
        if room <= 0:
            self.output_len += self.num_length_capped_tokens
            self.num_length_capped_tokens = 0
        elif room < self.output_len:
            self.num_length_capped_tokens += self.output_len - room
            self.output_len = room

    def child_seq_ids(self) -> list[int]:
        """The sequence ids of samples 1 .. n − 1 (a beam search's: asked several times a step, hence a range)."""
        base = self.request_id * MAX_SAMPLES
        return list(range(base + 1, base + self.num_samples))
