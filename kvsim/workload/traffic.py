"""The scenario's `workload` section: how many requests, their lengths and arrivals (`kvsim.workload.draws`) or a
trace (`Trace`, read by `kvsim.workload.traces`), and what they share: a system prompt, conversations, priority
classes, a closed loop's concurrency. `kvsim.workload.generate` makes the requests from it.

    workload:
      num_requests: 500
      arrival: {process: poisson, rate: 8}
      prompt_len: {dist: lognormal, mean: 1024, p99: 6000}
      output_len: {dist: lognormal, mean: 256, p99: 1024}
      shared_prefix: {tokens: 2000, fraction: 0.5}
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from kvsim.model.errors import first_repeat, shown
from kvsim.model.spec import Label, Settings
from kvsim.workload.draws import Arrival, LengthDist
from kvsim.workload.traces import INT64_MAX, MAX_LENGTH, PRIORITY_RANGE, ROW_READERS


class SharedPrefix(Settings):
    """A system prompt of `tokens` tokens in front of a `fraction` of requests."""

    tokens: int = Field(gt=0, le=MAX_LENGTH)  # a prompt's length, as a drawn or read one is bounded
    fraction: float = Field(default=1.0, ge=0, le=1)
    num_prefixes: int = Field(default=1, gt=0, le=INT64_MAX)  # drawn by numpy in an int64 range


class MultiTurn(Settings):
    """Conversations of `turns` turns; each turn's prompt is the conversation so far (`timing`: when turns after
    the first are sent)."""

    turns: int = Field(gt=0)
    think_time_s: float = Field(default=10.0, ge=0)
    # left out of a written scenario when open, so a scenario that does not set it writes what it always wrote
    timing: Literal["open", "after_reply"] = Field(
        default="open", exclude_if=lambda timing: timing == "open",
        description="open: turn k arrives k think times after its conversation's first turn, whether or not the "
        "previous reply has come; after_reply: turn k + 1 is sent think_time_s after turn k ended (its last "
        "token), as vLLM's multi-turn benchmark client sends, and a rejected turn ends its conversation")


class PriorityClass(Settings):
    """One class of requests: its vLLM `priority` (smaller is served first) and its share of requests."""

    name: Label
    priority: int = Field(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])
    weight: float = Field(gt=0, description="relative share of conversations in this class")


class PriorityMix(Settings):
    """Requests carry a priority drawn from these classes by weight (a conversation keeps its class);
    `engine.scheduling_policy: priority` makes the scheduler use it. Under `fcfs` it is carried and reported
    (`by_priority`) but orders nothing, as vLLM v1 accepts a priority under FCFS and ignores it."""

    classes: list[PriorityClass] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> PriorityMix:
        names = [c.name for c in self.classes]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise ValueError(f"class name {duplicate!r} appears twice")
        return self


COLUMN_FORMATS = tuple(ROW_READERS)  # the row formats, which carry per-request columns


class Trace(Settings):
    """A real workload file; see `kvsim.workload.traces` for the formats.

    `priority_column` names a column (a JSON key) of each row holding the request's vLLM priority;
    `acceptance_column` one holding its acceptance lengths, the tokens each of its verify steps
    emitted under speculative decoding (`kvsim.sched.speculative`). Row formats only."""

    format: Literal["azure", "mooncake", "sharegpt_tokens", "lengths", "vllm_sharegpt", "servegen"]
    path: str
    rate_scale: float = Field(default=1.0, gt=0)
    start_s: float = Field(default=0.0, ge=0)
    clients: list[int] | None = None
    duration_s: float = Field(default=600.0, gt=0)
    # left out of a written scenario when unset, so a scenario without them writes what it always wrote
    priority_column: str | None = Field(default=None, min_length=1, exclude_if=lambda column: column is None)
    acceptance_column: str | None = Field(default=None, min_length=1, exclude_if=lambda column: column is None)

    @field_validator("clients")
    @classmethod
    def _clients_once(cls, clients: list[int] | None) -> list[int] | None:
        """A ServeGen client listed twice had its traffic drawn twice: twice its rate, without a word."""
        if clients is not None and (twice := first_repeat(clients)) is not None:
            raise ValueError(f"{twice} is given twice")
        return clients

    @model_validator(mode="after")
    def _columns_in_rows(self) -> Trace:
        for name in ("priority_column", "acceptance_column"):
            if getattr(self, name) is not None and self.format not in COLUMN_FORMATS:
                raise ValueError(f"{name}={getattr(self, name)!r}: format={self.format} has no per-request "
                                 f"columns (only {', '.join(COLUMN_FORMATS)})")
        return self

    @model_validator(mode="after")
    def _fields_the_format_reads(self) -> Trace:
        """`clients` and `duration_s` choose what ServeGen's per-client model samples, and `start_s` skips
        rows by their timestamps: a format that does not read one ignored it without a word. A written
        scenario carries every default, so only another value is refused."""
        self.refuse_unread("format", {"clients": ("servegen",), "duration_s": ("servegen",),
                                      "start_s": ("azure", "mooncake", "sharegpt_tokens", "servegen")}, shown)
        return self


class Workload(Settings):
    # at most int64's largest: the run's memory estimate multiplies it by floats (10**400 was an OverflowError)
    num_requests: int = Field(default=200, gt=0, le=INT64_MAX)
    arrival: Arrival = Arrival(process="poisson", rate=4.0)
    prompt_len: LengthDist | None = None
    output_len: LengthDist | None = None
    shared_prefix: SharedPrefix | None = None
    multi_turn: MultiTurn | None = None
    n: int = Field(default=1, gt=0, le=256, description="parallel samples per request")
    beam_width: int | None = Field(default=None, gt=1, le=64, description="beam search instead of sampling")
    trace: Trace | None = None
    priority: PriorityMix | None = None
    max_concurrency: int | None = Field(
        default=None, ge=1, description="closed loop: at most this many requests in flight, as `vllm bench serve "
        "--max-concurrency`; a request that arrives while they are waits in the client until one ends")

    @model_validator(mode="after")
    def _lengths_known(self) -> Workload:
        if self.beam_width is not None and self.n > 1:
            raise ValueError(f"give n={self.n} (parallel sampling) or beam_width={self.beam_width}, not both")
        if self.trace is None and (self.prompt_len is None or self.output_len is None):
            raise ValueError("give prompt_len and output_len, or a trace")
        given = [name for name in ("prompt_len", "output_len") if getattr(self, name) is not None]
        if self.trace is not None and given:  # every format gives each request's lengths: these were never read
            dist = getattr(self, given[0]).model_dump(exclude_none=True)
            raise ValueError(f"{given[0]}={shown(dist)}: the trace (format={self.trace.format}) gives each "
                             f"request's lengths, so {' and '.join(given)} would be ignored; give prompt_len and "
                             f"output_len, or a trace, not both (set {' and '.join(given)} to null to keep the "
                             "trace's)")
        if self.priority is not None and self.trace is not None and self.trace.priority_column is not None:
            raise ValueError(f"give priority (a class mix) or trace.priority_column={self.trace.priority_column!r}, "
                             "not both")
        if self.arrival.process == "trace" and (self.trace is None or self.trace.format in ("lengths",
                                                                                          "vllm_sharegpt")):
            raise ValueError("arrival.process=trace needs a trace with timestamps")
        if self.trace is not None and self.trace.format == "servegen" and self.arrival.process != "trace":
            raise ValueError(f"arrival.process={self.arrival.process}: a servegen trace makes its own arrival times "
                             "(from its clients' rates); give arrival.process=trace and scale them with "
                             "trace.rate_scale")
        return self

    @model_validator(mode="after")
    def _rate_scale_read(self) -> Workload:
        """`trace.rate_scale` divides the trace's own timestamps, which only `arrival.process: trace` replays
        (`kvsim.workload.generate._arrivals`; a servegen trace needs that process): beside a rate process, which
        keeps the trace's lengths at its own rate, it was dropped without a word (`rate_scale: 1e-300` on a
        lengths table ran at the Poisson rate). The default (written in every scenario) passes."""
        if self.trace is not None and self.arrival.process != "trace" and self.trace.rate_scale != 1.0:
            raise ValueError(f"trace.rate_scale={self.trace.rate_scale:g}: arrival.process={self.arrival.process} "
                             "does not read it (only trace, which replays the trace's timestamps); scale "
                             "arrival.rate instead")
        return self
