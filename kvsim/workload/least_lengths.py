"""The least prompt and output a servable request of a scenario's traffic can have, at any run length: from the
workload's definition, not from the requests one run draws.

    least = least_lengths(scenario, max_model_len)   # None where no request can be served

A plan runs one traffic at many lengths (probes doubled up to `max_probe_requests`, verification runs
`verify_factor` times longer), and a longer run takes other requests: a synthetic workload's later draws, a trace's
later rows. The least over one run's requests bounds nothing longer (the default scenario's lognormal outputs:
21 tokens the least over 1,000 draws, 3 over 32,000, 1 over 320,000). So, as `kvsim.workload.generate` makes
requests:

* a distribution draws (after rounding and clipping to 1 … `MAX_LENGTH`, `as_lengths`): fixed, its value;
  uniform, every integer from low to high; lognormal, every length from 1 to `MAX_LENGTH` (its density is positive
  everywhere: rare is not impossible); empirical, each value of its table's column;
* a trace gives the rows its runs take (`trace_rows`: a timestamped trace's from `start_s` to its end, a length
  table's every row, ServeGen's draws over `duration_s`), each row its own prompt and output;
* a conversation's first turn has its least prompt: the row's own prompt behind a system prompt
  (`shared_prefix.tokens`, in front of every first turn at fraction 1, of none at 0, of some in between); a later
  turn's prompt holds every earlier prompt and reply besides its own;
* a request is servable when prompt + output ≤ max_model_len: its output is capped to max_model_len − prompt (at
  least 1, `TurnBuilder`), a prompt of max_model_len or more is rejected.

The least prompt is exact: some request of the traffic has it (the least first-turn prompt under max_model_len).
So is the least output of single-turn traffic (the least over servable first turns of min(output, max_model_len −
prompt)). A later turn's prompt is only bounded: below, by the system prompt, two of the least prompts and a
reply's token (none is servable once that reaches max_model_len), above, by the system prompt and `turns` of the
longest prompts and `turns` − 1 of the longest replies. So conversations' least output is a bound (min(least
output, max_model_len − the upper bound), 1 once that reaches max_model_len): no request has less, one may not
have it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvsim.workload.draws import Empirical, Fixed, LengthDist, Lognormal, Uniform
from kvsim.workload.generate import as_lengths, table_column, trace_rows
from kvsim.workload.scenario import Scenario
from kvsim.workload.traces import MAX_LENGTH, TraceRecord
from kvsim.workload.traffic import SharedPrefix


@dataclass(frozen=True, slots=True)
class LeastLengths:
    """The least prompt and the least output (tokens, the output after its cap) of a servable request."""

    prompt_len: int
    output_len: int


@dataclass(frozen=True, slots=True)
class DrawnLengths:
    """The lengths a distribution draws: `values` (ascending, distinct), or every integer from `low` to `high`
    (`values` None)."""

    low: int
    high: int
    values: np.ndarray | None = None

    def largest_at_most(self, limit: int) -> int | None:
        """The largest length drawn that is at most `limit` (None: every one is longer)."""
        if self.values is None:
            return min(self.high, limit) if limit >= self.low else None
        below = int(np.searchsorted(self.values, limit, side="right"))
        return int(self.values[below - 1]) if below else None


def drawn_lengths(dist: LengthDist, scenario: Scenario, field: str) -> DrawnLengths:
    """Every length `dist` (the scenario field `field`) can draw, as `kvsim.workload.generate.sample_lengths`
    draws and clips them."""
    if isinstance(dist, Fixed):
        return DrawnLengths(dist.value, dist.value)
    if isinstance(dist, Uniform):
        return DrawnLengths(dist.low, dist.high)
    if isinstance(dist, Lognormal):
        return DrawnLengths(1, MAX_LENGTH)
    assert isinstance(dist, Empirical)
    values = np.unique(as_lengths(table_column(dist, scenario, field)))
    return DrawnLengths(int(values[0]), int(values[-1]), values)


def system_prompt_lens(prefix: SharedPrefix | None) -> tuple[int, ...]:
    """The system prompt lengths a conversation's first turn can start with (0: none)."""
    if prefix is None or prefix.fraction == 0:
        return (0,)
    return (prefix.tokens,) if prefix.fraction == 1 else (0, prefix.tokens)


def least_lengths(scenario: Scenario, max_model_len: int) -> LeastLengths | None:
    """The least prompt and output of a servable request of `scenario`'s traffic, at any `num_requests` (the
    module's docstring says how each is found, and which is exact); None where no request can be served (every
    first turn's prompt reaches `max_model_len`)."""
    w = scenario.workload
    systems = system_prompt_lens(w.shared_prefix)
    if w.trace is None:
        assert w.prompt_len is not None and w.output_len is not None
        prompts = drawn_lengths(w.prompt_len, scenario, "workload.prompt_len")
        outputs = drawn_lengths(w.output_len, scenario, "workload.output_len")
        first = _least_first_turn(prompts, outputs, systems, max_model_len)
        least_prompt, longest_prompt = prompts.low, prompts.high
        least_output, longest_output = outputs.low, outputs.high
    else:
        rows = trace_rows(scenario, np.random.default_rng(scenario.seed))[1]
        turns = w.multi_turn.turns if w.multi_turn is not None else 1
        # a run takes rows in order, row i turn i % turns of its conversation (a run of n < turns requests is one
        # conversation); a length table's rows are resampled, so any is a first turn
        firsts = rows if rows[0].arrival_s is None else rows[::turns]
        first = _least_first_turn_rows(firsts, systems, max_model_len)
        least_prompt, longest_prompt = min(r.prompt_len for r in rows), max(r.prompt_len for r in rows)
        longest_output, least_output = max(r.output_len for r in rows), min(r.output_len for r in rows)
    if first is None or w.multi_turn is None or w.multi_turn.turns == 1:
        return first
    if min(systems) + 2 * least_prompt + 1 >= max_model_len:  # a later turn holds two prompts and a reply token
        return first  # or more: none is servable
    turns = w.multi_turn.turns
    longest_later = max(systems) + turns * longest_prompt + (turns - 1) * longest_output  # Python ints: no overflow
    later = min(least_output, max_model_len - min(longest_later, max_model_len - 1))
    return LeastLengths(first.prompt_len, min(first.output_len, later))


def _least_first_turn(prompts: DrawnLengths, outputs: DrawnLengths, systems: tuple[int, ...],
                      max_model_len: int) -> LeastLengths | None:
    """The least servable first turn of drawn lengths: prompt and output are drawn apart, so its least output is
    the least drawn, or what the cap leaves the longest servable prompt."""
    least_prompt = min(prompts.low + system for system in systems)
    if least_prompt >= max_model_len:
        return None
    longest = max(fit + system for system in systems
                  if (fit := prompts.largest_at_most(max_model_len - 1 - system)) is not None)
    return LeastLengths(least_prompt, min(outputs.low, max_model_len - longest))


def _least_first_turn_rows(rows: Sequence[TraceRecord], systems: tuple[int, ...],
                           max_model_len: int) -> LeastLengths | None:
    """The least servable first turn of trace rows, each behind each system prompt length."""
    own = np.array([r.prompt_len for r in rows], dtype=np.int64)  # at most 2**53 each: a system prompt's more fits
    replies = np.array([r.output_len for r in rows], dtype=np.int64)
    prompts = np.concatenate([own + system for system in systems])
    servable = prompts < max_model_len
    if not servable.any():
        return None
    capped = np.minimum(np.tile(replies, len(systems)), max_model_len - prompts)
    return LeastLengths(int(prompts[servable].min()), int(capped[servable].min()))
