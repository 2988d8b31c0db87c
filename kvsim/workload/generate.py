"""Turn a scenario's workload section into `Request`s, all from one seeded generator.

Order of construction (each step documented where it happens):

1. base records: a trace's rows (in file order, from `start_s`, first `num_requests`), a
   length table resampled with replacement, or lengths drawn from the configured
   distributions;
2. arrivals: the trace's own timestamps divided by `rate_scale`, or a Poisson, gamma
   (coefficient of variation `cv`) or constant-rate process;
3. structure: a shared system prompt in front of a fraction of prompts; multi-turn
   conversations whose turn k prompt is every earlier prompt and reply plus a new message
   (`kvsim.workload.conversations.TurnBuilder`), turn k arriving k think times after the first
   (`timing: open`: each turn built as it arrives, and the next turn's prompt holds the reply a turn got,
   none if it was refused, cut where a replica's max_model_len cut it, `OpenTurns`) or sent by the run after
   turn k − 1 ended (`after_reply`: `Conversations`);
4. output lengths capped so that prompt + output ≤ max_model_len (a prompt that alone
   reaches max_model_len is kept and the scheduler rejects it, with the reason);
5. priorities: with a class mix, one class per conversation (every turn keeps it), drawn by
   weight after everything above, so a scenario without a mix draws exactly as before; with a
   trace's priority column, each conversation's first row's value (no draw). A trace's acceptance
   column gives each request its acceptance lengths (speculative decoding) as they are.

Each request's content lists the segments that decide its KV blocks' identities, so prefix
caching hits exactly where real requests would share tokens.

`iter_requests` draws every random number up front, in the order above, into compact
columns (about 50 bytes a request), and builds each `Request` only when the arrival process
asks for the next one: a run never holds more `Request` objects than are in flight. Requests
come out in arrival order (ties in construction order) through a heap that releases a
request once no later-constructed one can arrive before it, so the result is identical to
building the whole list and sorting it (`build_requests`).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from kvsim.model.errors import KvsimError, reading
from kvsim.workload.conversations import Conversations, OpenTurns, TurnBuilder
from kvsim.workload.draws import Arrival, Empirical, Fixed, LengthDist, Lognormal, Uniform
from kvsim.workload.request import Request
from kvsim.workload.rows_read import read_rows
from kvsim.workload.scenario import Scenario
from kvsim.workload.servegen import read_servegen
from kvsim.workload.traces import (
    MAX_LENGTH,
    READERS,
    ROW_READERS,
    TraceColumns,
    TraceRecord,
    read_lengths,
)
from kvsim.workload.traffic import Workload

Z_99 = 2.3263478740408408  # standard normal 99th percentile
log = logging.getLogger(__name__)


def lognormal_sigma(mean: float, p99: float) -> float:
    """Solve mean = e^(μ + σ²/2), p99 = e^(μ + z·σ) for σ (the smaller root)."""
    gap = math.log(p99) - math.log(mean)
    disc = Z_99**2 - 2 * gap
    if disc < 0:
        raise KvsimError(f"lognormal mean={mean} p99={p99}: no lognormal has this mean and p99")
    return Z_99 - math.sqrt(disc)


def sample_lengths(dist: LengthDist, n: int, rng: np.random.Generator, scenario: Scenario,
                   field: str) -> np.ndarray:
    """`n` positive integer lengths from a distribution, the scenario field `field` (an empirical table's
    path is named as `{field}.table` in an error)."""
    if isinstance(dist, Fixed):
        values = np.full(n, dist.value, dtype=np.float64)
    elif isinstance(dist, Uniform):
        values = rng.integers(dist.low, dist.high + 1, size=n).astype(np.float64)
    elif isinstance(dist, Lognormal):
        sigma = dist.sigma if dist.sigma is not None else lognormal_sigma(dist.mean, dist.p99 or 0.0)
        mu = math.log(dist.mean) - sigma**2 / 2
        values = rng.lognormal(mu, sigma, size=n)
    else:
        assert isinstance(dist, Empirical)
        values = rng.choice(table_column(dist, scenario, field), size=n).astype(np.float64)
    return as_lengths(values)


def as_lengths(values: np.ndarray) -> np.ndarray:
    """Drawn values as token counts: rounded, then clipped to 1 … `MAX_LENGTH` (below int64's range: a lognormal of
    mean 1e300, or a huge sigma, draws values that would wrap around to negative lengths; a length that long is
    refused per request, over max_model_len)."""
    return np.clip(np.rint(values), 1, MAX_LENGTH).astype(np.int64)


def table_column(dist: Empirical, scenario: Scenario, field: str) -> np.ndarray:
    """The lengths an empirical distribution (the scenario field `field`) resamples: its table's column, in row
    order (the table's path is named as `{field}.table` in an error)."""
    table = scenario.resolve_path(dist.table, f"{field}.table")
    with reading(table, "workload length table"):
        rows = read_lengths(table)
    return np.array([r.prompt_len if dist.column == "prompt" else r.output_len for r in rows])


def arrival_times(arrival: Arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival instants (s) of `n` requests from a renewal process starting at 0."""
    assert arrival.rate is not None
    if arrival.process == "poisson":
        gaps = rng.exponential(1.0 / arrival.rate, size=n)
    elif arrival.process == "gamma":
        shape = 1.0 / arrival.cv**2
        gaps = rng.gamma(shape, 1.0 / (arrival.rate * shape), size=n)
    else:
        gaps = np.full(n, 1.0 / arrival.rate)
    gaps[0] = 0.0
    with np.errstate(over="ignore"):  # instants past the largest float are inf, refused with the rate that gave them
        return np.cumsum(gaps)


class _SampledRecords(Sequence[TraceRecord]):
    """Drawn lengths as a sequence of records, each built when read (two int64 columns in memory)."""

    def __init__(self, prompts: np.ndarray, outputs: np.ndarray) -> None:
        self.prompts, self.outputs = prompts, outputs

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index):  # type: ignore[override]
        assert isinstance(index, int), "indexed one record at a time"
        return TraceRecord(None, int(self.prompts[index]), int(self.outputs[index]))


def _base_records(scenario: Scenario, rng: np.random.Generator) -> Sequence[TraceRecord]:
    w = scenario.workload
    trace = w.trace
    if trace is None:
        assert w.prompt_len is not None and w.output_len is not None
        prompts = sample_lengths(w.prompt_len, w.num_requests, rng, scenario, "workload.prompt_len")
        outputs = sample_lengths(w.output_len, w.num_requests, rng, scenario, "workload.output_len")
        return _SampledRecords(prompts, outputs)
    path, rows = trace_rows(scenario, rng)
    if trace.format == "servegen":
        return _fewer_than_asked(w.num_requests, rows[: w.num_requests], f"the clients of {path} send",
                                 f"in duration_s={trace.duration_s:g}")
    if rows[0].arrival_s is None:  # a length table: resample rows
        picks = rng.integers(0, len(rows), size=w.num_requests)
        return [rows[i] for i in picks]
    return _fewer_than_asked(w.num_requests, rows[: w.num_requests], f"{path} holds",
                             f"from start_s={trace.start_s:g}")


def trace_rows(scenario: Scenario, rng: np.random.Generator) -> tuple[Path, list[TraceRecord]]:
    """The scenario's trace file and the rows its runs take requests from, whatever their `num_requests`: a
    timestamped trace's rows from `start_s` on (a run takes the first `num_requests`), a length table's rows
    (without arrival times; a run resamples them) or the requests ServeGen's model draws from `rng` over
    `duration_s` (a run takes the first `num_requests`; possibly none). KvsimError naming the field where a
    trace has no row to take or lists its rows out of arrival order."""
    trace = scenario.workload.trace
    assert trace is not None
    path = scenario.resolve_path(trace.path, "workload.trace.path")
    with reading(path, "workload.trace.path"):
        if trace.format == "servegen":
            return path, read_servegen(path, rng, trace.start_s, trace.duration_s, trace.clients)
        if trace.format in ROW_READERS:
            records = read_rows(path, trace.format, TraceColumns(trace.priority_column, trace.acceptance_column))
        else:
            records = READERS[trace.format](path)
    if not records:
        raise KvsimError(f"workload.trace.path {path}: no rows")
    if records[0].arrival_s is None:
        return path, records
    arrivals = [r.arrival_s or 0.0 for r in records]
    back = next((i for i in range(1, len(arrivals)) if arrivals[i] < arrivals[i - 1]), None)
    if back is not None:  # arrivals count from the first row's: an earlier one further down arrived before it
        early = arrivals[back - 1] - arrivals[back]
        raise KvsimError(f"workload.trace.path {path}: request {back + 1} arrives {early:g} s before request {back}: "
                         "a trace lists requests in arrival order")
    kept = [r for r in records if (r.arrival_s or 0.0) >= trace.start_s]
    if not kept:
        raise KvsimError(f"workload.trace.start_s={trace.start_s}: no request of {path} arrives after it")
    return path, kept


def most_requests(scenario: Scenario) -> int | None:
    """The most requests a run of the scenario's traffic can take, whatever its `num_requests`: a timestamped
    trace's rows from `start_s` on, or the requests ServeGen's model draws over `duration_s` (the draws a run
    makes: the scenario's seed); None where any count can be run (lengths drawn from distributions, or a length
    table, whose rows are resampled). Reads the trace (`trace_rows`' errors)."""
    trace = scenario.workload.trace
    if trace is None:
        return None
    rows = trace_rows(scenario, np.random.default_rng(scenario.seed))[1]
    return len(rows) if trace.format == "servegen" or rows[0].arrival_s is not None else None


SHORT_TRACE = "workload.num_requests=%s: %s %s %s; the run has %s"
"""The warning `_fewer_than_asked` logs (its format, the record's `msg`): "... t.csv holds 2 requests from start_s=0;
the run has those 2", or of one request "holds 1 request ...; the run has only that one"."""


def _fewer_than_asked(num_requests: int, records: list[TraceRecord], source: str, window: str) -> list[TraceRecord]:
    """`records`, the first `num_requests` of a trace's, after one warning when the trace had fewer ("`source`
    N requests `window`"): the run (and its summary) has only those. A warning, not an error, as vLLM's benchmark
    takes a `--num-prompts` larger than its dataset (it repeats random rows to reach it,
    `maybe_oversample_requests`); kvsim repeats none, since a replay's rows come with their own arrival times."""
    if len(records) < num_requests:
        held = "1 request" if len(records) == 1 else f"{len(records):,} requests"  # "holds 1 requests" before
        kept = "only that one" if len(records) == 1 else f"those {len(records):,}"
        log.warning(SHORT_TRACE, f"{num_requests:,}", source, held, window, kept)
    return records


class KeptWarnings(logging.Filter):
    """Drops the warning whose format is `msg` (`said_first`: all but the first), appending the arguments of those it
    drops to `kept`, for the process that reports to say them (`_fewer_than_asked`'s here; an after_reply run's
    unsent turns, `kvsim.engine.turns.unsent_turns_kept`)."""

    def __init__(self, msg: str, said_first: bool) -> None:
        super().__init__()
        self.msg, self.say, self.kept = msg, said_first, list[tuple]()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.msg:
            return True
        say, self.say = self.say, False
        if not say:
            self.kept.append(tuple(record.args or ()))
        return say


@contextlib.contextmanager
def _short_trace_filtered(said_first: bool) -> Iterator[list[tuple]]:
    """Yields the arguments of the warnings the filter drops (none where another filter decides)."""
    if said_first and any(isinstance(f, KeptWarnings) and f.msg == SHORT_TRACE for f in log.filters):
        yield []  # inside another: it decides
        return
    gate = KeptWarnings(SHORT_TRACE, said_first)  # one that drops them all goes first: a record it drops says nothing
    log.filters.insert(len(log.filters) if said_first else 0, gate)
    try:
        yield gate.kept
    finally:
        log.removeFilter(gate)


def short_trace_said_once() -> contextlib.AbstractContextManager[list[tuple]]:
    """Inside, a trace shorter than a run asks is warned of the first time only: a command of many runs (`kvsim plan`,
    `kvsim report`) said it once per run, in whichever process ran it. Inside another, that one decides."""
    return _short_trace_filtered(said_first=True)


def short_trace_unsaid() -> contextlib.AbstractContextManager[list[tuple]]:
    """Inside, a trace shorter than a run asks is not warned of: each point of a command that has said it
    (`short_trace_said_once`) runs so, here or in a worker process. The list yielded gets each warning's
    arguments, for the process that reports to say once (`say_short_traces`): `kvsim.planning.sweep.run_many`'s
    runs, often in worker processes, said nothing, so a notebook's sweep over a short trace ran fewer requests
    without a word."""
    return _short_trace_filtered(said_first=False)


def say_short_traces(kept: Sequence[tuple]) -> None:
    """Warn here of the first of `kept` (`short_trace_unsaid`'s), unless a command around said one already."""
    with short_trace_said_once():
        for args in kept:
            log.warning(SHORT_TRACE, *args)


def _arrivals(w: Workload, records: Sequence[TraceRecord], rng: np.random.Generator) -> np.ndarray:
    if w.arrival.process == "trace" or (w.trace is not None and w.trace.format == "servegen"):
        first = records[0].arrival_s or 0.0
        scale = w.trace.rate_scale if w.trace is not None else 1.0
        return np.array([((r.arrival_s or 0.0) - first) / scale for r in records])
    return arrival_times(w.arrival, len(records), rng)


MAX_INSTANT_S = 2.0**32
"""The latest instant (s, about 136 years) a request may be sent at: below it the clock's floats keep better than a
microsecond (ulp 2**-20 s), past it a step's milliseconds lose their digits (at 1e12 s a 6.04 ms TTFT read 5.98 ms,
at 1e297 s, a Mooncake timestamp of 1e300 ms, every step took no time at all), without a word."""


def instant_shown(instant_s: float) -> str:
    """`instant_s` for an error line, with why no run's clock reaches it."""
    if math.isinf(instant_s):
        return "inf s (past the largest float)"
    return f"{instant_s:g} s (past {MAX_INSTANT_S:g} s, about 136 years, where the clock keeps no microsecond)"


def _refuse_endless_instants(w: Workload, arrivals: np.ndarray, turns: int, think_s: float) -> None:
    """KvsimError naming the field when a request would be sent past `MAX_INSTANT_S` (or at inf s): a rate of
    1e-308 spaces arrivals 1e308 s apart, a think time of 1e308 s sends turn 3 at 2e308 s (inf: the run ended in
    an AssertionError, or SimPy's 'no scheduled events left'); a trace's timestamp of 1e300 ms ran with steps that
    took no time."""
    firsts = arrivals[::turns]  # a conversation's first row's instant (the only one read, with turns > 1)
    late = firsts > MAX_INSTANT_S
    if late.any():
        first_late = int(np.argmax(late))
        if w.arrival.process == "trace" or (w.trace is not None and w.trace.format == "servegen"):
            assert w.trace is not None
            field = f"workload.trace.rate_scale={w.trace.rate_scale:g}"
        else:
            field = f"workload.arrival.rate={w.arrival.rate:g}"
        what = "request" if turns == 1 else "conversation"
        raise KvsimError(f"{field}: {what} {first_late} of {len(firsts)} would arrive at "
                         f"{instant_shown(float(firsts[first_late]))}; give a larger rate or fewer requests")
    last = float(np.max(firsts, initial=0.0)) + (turns - 1) * think_s  # turns: at most n here
    if last > MAX_INSTANT_S:
        raise KvsimError(f"workload.multi_turn.think_time_s={think_s:g}: turn {turns} of a conversation would be "
                         f"sent at {instant_shown(last)}, {turns - 1} think times after its first; give a shorter "
                         "think time")


def _priorities(w: Workload, records: Sequence[TraceRecord], turns: int,
                rng: np.random.Generator) -> np.ndarray | None:
    """Each conversation's priority: its first turn's row in the trace's priority column, or drawn from
    the class mix by weight (None with neither)."""
    n = len(records)
    if w.trace is not None and w.trace.priority_column is not None:
        return np.array([records[first].priority for first in range(0, n, turns)], dtype=np.int64)
    if w.priority is None:
        return None
    classes = w.priority.classes
    weights = np.array([c.weight for c in classes], dtype=np.float64)
    with np.errstate(over="ignore"):  # numpy's RuntimeWarning was printed on stderr: the overflow is the test here
        total = weights.sum()
    if not np.isfinite(total):  # weights of 1e308 sum to inf: they are shares, so scale them down
        weights /= weights.max()
    picks = rng.choice(len(classes), size=-(-n // turns), p=weights / weights.sum())
    return np.array([c.priority for c in classes], dtype=np.int64)[picks]


class RequestStream(Iterator[Request]):
    """A run's requests one at a time, in arrival order, built as they are taken; `arrival_s` holds
    every one's arrival instant (ascending) before any is built, so a reader can look ahead for free.
    `turns`: what builds open multi-turn conversations' turns (None without them), whose `reply_len` a run
    replaces where the engine that first takes a turn does not decide its reply (`OpenTurns`)."""

    __slots__ = ("arrival_s", "turns", "_requests")

    def __init__(self, arrival_s: np.ndarray, requests: Iterator[Request], turns: OpenTurns | None = None) -> None:
        self.arrival_s, self._requests, self.turns = arrival_s, requests, turns

    def __next__(self) -> Request:
        return next(self._requests)


def build_requests(scenario: Scenario, max_model_len: int, rng: np.random.Generator) -> list[Request]:
    """The scenario's requests, sorted by arrival, ids 0..n−1 in arrival order (all at once). Open-loop
    timing only: with `multi_turn.timing: after_reply` a follow-up's send instant is known only in a run."""
    requests = iter_requests(scenario, max_model_len, rng)
    if isinstance(requests, Conversations):
        raise KvsimError("workload.multi_turn.timing=after_reply: a follow-up turn's send instant is known only "
                         "when its previous turn ends in a run; this needs open-loop timing (timing=open)")
    return list(requests)


def iter_requests(scenario: Scenario, max_model_len: int, rng: np.random.Generator) -> RequestStream | Conversations:
    """The scenario's requests one at a time, sorted by arrival, ids 0..n−1 in arrival order; with
    `multi_turn.timing: after_reply`, its conversations, each turn built when the run sends it
    (`kvsim.workload.conversations.Conversations`; the run numbers the requests in send order).

    Every random draw happens in this call, before the first request is taken (the run's one
    generator is then free for the scheduler); the `Request` objects are built lazily. Both timings
    draw the same numbers in the same order, so they differ only in when turns after the first are sent.
    """
    w = scenario.workload
    records = _base_records(scenario, rng)
    n = len(records)
    arrivals = np.asarray(_arrivals(w, records, rng), dtype=np.float64)  # each row's instant; with turns > 1, the
    # first row of a conversation gives its first turn's (the later rows' are not read)
    prefix = w.shared_prefix
    with_prefix = rng.random(n) < prefix.fraction if prefix else np.zeros(n, bool)
    prefix_ids = rng.integers(0, prefix.num_prefixes, size=n) if prefix else None
    # a conversation holds at most the run's n requests: turns=10**23 is one conversation (and fits an int64)
    turns = min(w.multi_turn.turns, max(n, 1)) if w.multi_turn else 1
    think_s = w.multi_turn.think_time_s if w.multi_turn else 0.0
    num_samples, beam = w.beam_width or w.n, w.beam_width is not None
    priorities = _priorities(w, records, turns, rng)
    with_acceptance = w.trace is not None and w.trace.acceptance_column is not None
    builder = TurnBuilder(records, turns, max_model_len, prefix, with_prefix, prefix_ids, num_samples, beam,
                          priorities, with_acceptance)
    _refuse_endless_instants(w, arrivals, turns, think_s)
    if w.multi_turn is not None and w.multi_turn.timing == "after_reply":  # a conversation's first row's instant
        return Conversations(builder, arrivals[::turns], think_s)
    if turns > 1:  # turn k of a conversation arrives k think times after its first turn
        index = np.arange(n)
        arrival = arrivals[index - index % turns] + (index % turns).astype(np.float64) * think_s
    else:
        arrival = arrivals
    # the earliest arrival among requests not yet constructed (inf past the last one)
    later_min = np.append(np.minimum.accumulate(arrival[::-1])[::-1], np.inf) if n else np.array([np.inf])

    turns_open = OpenTurns(builder)  # each turn built as it arrives: its previous turn's reply is known

    def generate() -> Iterator[Request]:
        heap: list[tuple[float, int]] = []
        next_id = 0
        for index in range(n):
            heapq.heappush(heap, (float(arrival[index]), index))
            while heap and heap[0][0] <= later_min[index + 1]:
                arrival_s, built = heapq.heappop(heap)
                yield turns_open.request(built, next_id, arrival_s)
                next_id += 1

    return RequestStream(np.sort(arrival, kind="stable"), generate(), turns_open if turns > 1 else None)
