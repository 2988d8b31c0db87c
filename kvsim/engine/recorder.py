"""Per-step rows, recorded in bounded memory: typed columns filled a chunk at a time, then handed on.

Each step appends one row (`record`) to compact typed columns, 8 bytes a value; a decode
burst appends only what changes from step to step (`BurstRows`), expanded with numpy when
its chunk is flushed. Every `chunk_rows` rows the chunk goes, in order, to

    totals    the summary's streaming sums over every step (`kvsim.results.metrics.StepTotals`), always;
    and, by the scenario's `steps` mode:
      all       the writer (`kvsim.results.step_writer.StepWriter`: to disk, a row group per chunk)
                or, without a writer, a list of chunks kept in memory;
      sampled   `StepSampler`: at most `MAX_SAMPLED_STEPS` rows, without knowing the total;
      none      nothing more.

So with a writer (or `sampled`, or `none`) the recorder holds at most one chunk of rows
plus the sample, however long the run. `finish()` flushes the last chunk and closes the
writer; call it once, when the run has ended.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from kvsim.results.metrics import DRAFT_KEY, STEP_COLUMNS, STEP_FLOAT_COLUMNS, StepTotals

if TYPE_CHECKING:
    import pandas as pd

    from kvsim.kv.protocol import Occupancy
    from kvsim.latency.step_plan import StepPlan
    from kvsim.results.step_writer import StepWriter
    from kvsim.sched.burst import Burst
    from kvsim.sched.limits import SchedulerSnapshot
    from kvsim.workload.scenario import StepsMode

MAX_SAMPLED_STEPS = 100_000  # `steps: sampled` keeps at most this many rows
CHUNK_ROWS = 32_768  # rows buffered before a chunk goes to the totals and the writer (about 5 MiB)

COLUMNS = STEP_COLUMNS
FLOAT_COLUMNS = STEP_FLOAT_COLUMNS
DTYPES = {name: np.dtype(np.float64 if name in FLOAT_COLUMNS else np.int64) for name in COLUMNS}
DRAFT_DTYPES = {**DTYPES, DRAFT_KEY: np.dtype(np.float64)}  # with speculative decoding's `draft_rejected`
SINGLE_FLOATS = tuple(name for name in COLUMNS if name in FLOAT_COLUMNS)  # `record` writes them in this order
SINGLE_INTS = tuple(name for name in COLUMNS if name not in FLOAT_COLUMNS)
# a row's values as the bytes of its typed columns (`array.frombytes`): the same doubles and int64s as
# `array.extend` stores, in a third of the instructions (extend converts each value through PyArg_Parse)
PACK_FLOATS = struct.Struct(f"@{len(SINGLE_FLOATS)}d").pack
PACK_INTS = struct.Struct(f"@{len(SINGLE_INTS)}q").pack


class _Packers(dict[int, tuple]):
    """`struct` packers of `n` doubles and of `n` int64s, by `n` (a burst's number of steps): a burst's
    per-step values go into `BurstRows`' arrays with `frombytes`, for the same reason as a row's. One
    pair per burst length seen, so at most one per step count up to the longest output: bounded."""

    __slots__ = ()

    def __missing__(self, n: int) -> tuple:
        packers = self[n] = (struct.Struct(f"@{n}d").pack, struct.Struct(f"@{n}q").pack)
        return packers


_BURST_PACKERS = _Packers()

Chunk = dict[str, np.ndarray]


def empty_chunk() -> Chunk:
    return {name: np.zeros(0, dtype=dtype) for name, dtype in DTYPES.items()}


def concat(chunks: list[Chunk]) -> Chunk:
    if not chunks:
        return empty_chunk()
    return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}  # COLUMNS (+ draft_rejected)


class StepSampler:
    """Every `stride`-th step (by index from 0) and the last one, at most `cap` rows, total unknown.

    The stride starts at 1 and doubles whenever the kept rows would exceed `cap − 1` (one row
    is reserved for the last step), dropping every other kept row; so the kept rows are
    always exactly the steps whose index is a multiple of the final stride, plus the last.
    """

    def __init__(self, cap: int) -> None:
        assert cap >= 2
        self.cap, self.stride = cap, 1
        self.kept: Chunk | None = None  # the columns of the first chunk added
        self.kept_index = np.zeros(0, dtype=np.int64)
        self.last: Chunk = {}
        self.last_index = -1

    def add(self, chunk: Chunk, first_index: int) -> None:
        n = len(chunk["time_s"])
        if n == 0:
            return
        if self.kept is None:
            self.kept = {k: v[:0] for k, v in chunk.items()}
        index = np.arange(first_index, first_index + n, dtype=np.int64)
        take = index % self.stride == 0
        self.kept = {k: np.concatenate([self.kept[k], v[take]]) for k, v in chunk.items()}
        kept = self.kept
        self.kept_index = np.concatenate([self.kept_index, index[take]])
        while len(self.kept_index) > self.cap - 1:
            self.stride *= 2
            take = self.kept_index % self.stride == 0
            self.kept = kept = {k: v[take] for k, v in kept.items()}
            self.kept_index = self.kept_index[take]
        self.last = {k: v[-1:] for k, v in chunk.items()}
        self.last_index = first_index + n - 1

    def rows(self) -> Chunk:
        if self.kept is None:
            return empty_chunk()
        if self.last_index % self.stride == 0:
            return self.kept
        return {k: np.concatenate([v, self.last[k]]) for k, v in self.kept.items()}


class PendingBurst(NamedTuple):
    """What a decode burst's rows need from before it runs (`StepRecorder.begin_burst`)."""

    starts_s: list[float]
    durations_s: list[float]
    num_running: int
    num_preemptions: int
    external_slots: int
    slack_slots: int
    shared_slots: int
    total_slots: int


class BurstRows:
    """Decode bursts' rows kept compact until their chunk is flushed: per row what changes from
    step to step, per burst what does not and how many single-step rows were recorded before it.

    `merge_into` expands them and puts them in their places among the single-step rows, with the
    values `record` would have written (same integer slot counts, same divisions).
    """

    PER_BURST = 8  # num_steps, single rows before, then PendingBurst's six ints
    _PACK_PER_BURST = struct.Struct(f"@{PER_BURST}q").pack

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.starts_s, self.durations_s = array("d"), array("d")
        self.waiting, self.held, self.filled, self.reserved = array("q"), array("q"), array("q"), array("q")
        self.per_burst = array("q")

    def __len__(self) -> int:
        return len(self.starts_s)

    def add(self, pending: PendingBurst, waiting: list[int], occupancy: Occupancy, num_single_rows_before: int) -> None:
        num_steps = len(pending.starts_s)
        pack_floats, pack_ints = _BURST_PACKERS[num_steps]
        self.starts_s.frombytes(pack_floats(*pending.starts_s))
        self.durations_s.frombytes(pack_floats(*pending.durations_s))
        self.waiting.frombytes(pack_ints(*waiting))
        held, filled, reserved = occupancy
        self.held.frombytes(pack_ints(*held))
        self.filled.frombytes(pack_ints(*filled))
        self.reserved.frombytes(pack_ints(*reserved))
        self.per_burst.frombytes(self._PACK_PER_BURST(num_steps, num_single_rows_before, *pending[2:]))

    def merge_into(self, singles: Chunk) -> Chunk:
        """`singles` (the single-step rows) with the bursts' rows in their places; empties the bursts."""
        per = np.frombuffer(self.per_burst, dtype=np.int64).reshape(-1, self.PER_BURST)
        num_steps = per[:, 0]
        running, preemptions, external, slack, shared, total = (np.repeat(per[:, i], num_steps) for i in range(2, 8))
        held, filled = np.frombuffer(self.held, dtype=np.int64), np.frombuffer(self.filled, dtype=np.int64)
        reserved = np.frombuffer(self.reserved, dtype=np.int64)
        rows: dict[str, np.ndarray | int] = {
            "time_s": np.frombuffer(self.starts_s), "duration_s": np.frombuffer(self.durations_s),
            "vllm:num_requests_running": running, "vllm:num_requests_waiting": np.frombuffer(self.waiting, np.int64),
            "vllm:num_requests_swapped": 0, "num_batched_tokens": running, "num_prefill_tokens": 0,
            "num_decode_seqs": running, "vllm:kv_cache_usage_perc": 1.0 - (total - held) / total,
            "vllm:num_preemptions_total": preemptions, "swap_in_bytes": 0, "swap_out_bytes": 0,
            "held_slots": held, "shared_slots": shared, "token_state": filled / total, "reserved": reserved / total,
            "internal_frag": (held - filled - reserved - slack) / total, "slack": slack / total,
            "external_frag": external / total, "free": (total - held - external) / total,
        }
        num_rows = len(singles["time_s"]) + len(self)
        at = np.repeat(per[:, 1], num_steps) + np.arange(len(self))  # burst rows' places in the chunk
        single = np.ones(num_rows, dtype=bool)
        single[at] = False
        merged: Chunk = {}
        for name, values in singles.items():
            column = np.empty(num_rows, dtype=DRAFT_DTYPES[name])
            column[single] = values
            column[at] = rows.get(name, 0.0) if name == DRAFT_KEY else rows[name]  # a burst never verifies drafts
            merged[name] = column
        self._clear()
        return merged


class StepRecorder:
    """One engine's per-step rows (see the module docstring): `record` per step, `finish` at the end.

    `mode` is the scenario's `steps`; `writer` streams `all` rows to disk instead of keeping
    them (and gets the sample, for `sampled`, at `finish`); `tags` are constant integer columns
    added to every written row (a fleet's `replica`: several recorders may share one writer);
    `max_sampled_rows` caps `sampled` (default `MAX_SAMPLED_STEPS`; a fleet splits it among its replicas).
    `draft_column` adds speculative decoding's `draft_rejected` share (`kvsim.results.metrics.DRAFT_KEY`)
    to every row, taken out of `reserved` and `internal_frag` where the snapshot's `draft_rejected` says
    (0 for a step without it: an engine of the fleet that does not speculate, a decode burst).
    """

    COLUMNS = COLUMNS

    def __init__(self, mode: StepsMode = "all", writer: StepWriter | None = None,
                 tags: Mapping[str, int] | None = None, chunk_rows: int | None = None,
                 max_sampled_rows: int | None = None, draft_column: bool = False) -> None:
        self.mode, self.writer, self.tags = mode, writer, dict(tags or {})
        self.draft_column = draft_column
        self._draft = array("d")  # `draft_rejected` of the single-step rows, with `draft_column`
        self.chunk_rows = CHUNK_ROWS if chunk_rows is None else chunk_rows
        # single-step rows until the chunk is flushed: their float and int values, each in `COLUMNS` order
        self._floats, self._ints, self._num_rows = array("d"), array("q"), 0
        self._bursts = BurstRows()
        self.totals = StepTotals()
        self.kept: list[Chunk] = []  # `all` without a writer
        cap = MAX_SAMPLED_STEPS if max_sampled_rows is None else max_sampled_rows
        self.sampler = StepSampler(cap) if mode == "sampled" else None
        self.finished = False

    @property
    def keeps_all_rows(self) -> bool:
        """Every row stays in memory (`all` without a writer): memory grows with the run."""
        return self.mode == "all" and self.writer is None

    @property
    def num_steps(self) -> int:
        return self.totals.num_steps + self._num_rows + len(self._bursts)

    def record(self, now: float, duration_s: float, plan: StepPlan, state: SchedulerSnapshot) -> None:
        """One step's row: `plan` is what it computes, `state` the engine as it was planned (`Scheduler.snapshot`)."""
        kv = state.kv
        w = kv.waste()
        total = kv.total_slots
        reserved, internal_frag = w.reserved, w.internal_frag
        if self.draft_column:
            below, past = state.draft_rejected or (0, 0)
            reserved, internal_frag = reserved - below, internal_frag - past
            self._draft.append((below + past) / total)
        self._floats.frombytes(PACK_FLOATS(now, duration_s, kv.usage, w.token_state / total, reserved / total,
                                           internal_frag / total, w.slack / total, w.external_frag / total,
                                           w.free / total))
        self._ints.frombytes(PACK_INTS(state.num_running, state.num_waiting, state.num_swapped, plan.num_tokens,
                                       plan.num_row_prefill_tokens, plan.num_row_decode_seqs, state.num_preemptions,
                                       plan.swap_in_bytes, plan.swap_out_bytes, kv.held_slots, kv.shared_slots))
        self._num_rows += 1
        if self._num_rows + len(self._bursts) >= self.chunk_rows:
            self.flush(whole_chunks_only=True)

    def begin_burst(self, starts_s: list[float], burst: Burst, state: SchedulerSnapshot) -> PendingBurst:
        """What a decode burst's rows need from before it is applied (`starts_s`: when each of its steps
        starts, as the engine's clock reads then; `state`: the engine then); `end_burst` adds the rest
        and writes rows identical to what `record` would write step by step."""
        kv = state.kv
        return PendingBurst(starts_s, burst.durations, len(burst.batch), state.num_preemptions,
                            kv.external_frag_slots,
                            kv.slack_slots,  # constant: nothing is placed or freed inside a burst
                            kv.shared_slots,  # bursts only append unshared blocks
                            kv.total_slots)

    def end_burst(self, pending: PendingBurst, waiting: list[int], occupancy: Occupancy) -> None:
        """Append a burst's rows, with the waiting count the engine saw before each step and the held,
        filled and reserved slots after each (`Scheduler.apply_burst`). They stay compact
        (`BurstRows`) until the chunk is flushed."""
        self._bursts.add(pending, waiting, occupancy, self._num_rows)
        if self._num_rows + len(self._bursts) >= self.chunk_rows:
            self.flush(whole_chunks_only=True)

    def flush(self, whole_chunks_only: bool = False) -> None:
        """Hand the buffered rows on in chunks of `chunk_rows` rows, the last one shorter (see the module
        docstring); with `whole_chunks_only`, a shorter rest stays buffered for the next chunk.

        The chunks start at the same step indices however the rows came (step by step or in decode bursts,
        which can carry a chunk past `chunk_rows`): the totals sum each chunk in one numpy call, and a float
        sum depends on how its terms are grouped, so the summary is the step-by-step run's bit for bit."""
        if not self._num_rows and not self._bursts:
            return
        floats = np.frombuffer(self._floats).reshape(-1, len(SINGLE_FLOATS))
        ints = np.frombuffer(self._ints, dtype=np.int64).reshape(-1, len(SINGLE_INTS))
        rows = {name: (floats[:, SINGLE_FLOATS.index(name)] if name in FLOAT_COLUMNS
                       else ints[:, SINGLE_INTS.index(name)]).copy() for name in COLUMNS}
        # fresh buffers, not `del self._floats[:]`: an array whose buffer is still exported cannot be resized,
        # and a profiler or debugger reading `frame.f_locals` keeps these views alive past any `del`
        self._floats, self._ints = array("d"), array("q")
        if self.draft_column:
            rows[DRAFT_KEY] = np.array(self._draft, dtype=np.float64)
            self._draft = array("d")
        self._num_rows = 0
        if self._bursts:
            rows = self._bursts.merge_into(rows)
        num_rows = len(rows["time_s"])
        end = num_rows - num_rows % self.chunk_rows if whole_chunks_only else num_rows
        for start in range(0, end, self.chunk_rows):
            self._hand_on({name: values[start:start + self.chunk_rows] for name, values in rows.items()})
        if end < num_rows:  # back into the buffer, as `record` packs a row
            rest = {name: values[end:] for name, values in rows.items()}
            self._floats.frombytes(np.column_stack([rest[name] for name in SINGLE_FLOATS]).tobytes())
            self._ints.frombytes(np.column_stack([rest[name] for name in SINGLE_INTS]).astype(np.int64).tobytes())
            if self.draft_column:
                self._draft.frombytes(rest[DRAFT_KEY].tobytes())
            self._num_rows = num_rows - end

    def _hand_on(self, chunk: Chunk) -> None:
        """One chunk to the totals and, by the mode, to the writer, the kept rows or the sampler."""
        first_index = self.totals.num_steps
        self.totals.add(chunk)
        if self.mode == "all":
            if self.writer is not None:
                self.writer.write(self._tagged(chunk))
            else:
                self.kept.append(chunk)
        elif self.sampler is not None:
            self.sampler.add(chunk, first_index)

    def finish(self) -> None:
        """Flush the last rows and close the writer (an empty table with the header if no step ran)."""
        if self.finished:
            return
        self.flush()
        if self.writer is not None:
            if self.sampler is not None:
                self.writer.write(self._tagged(self.sampler.rows()))
            self.writer.close({**(DRAFT_DTYPES if self.draft_column else DTYPES),
                               **dict.fromkeys(self.tags, np.dtype(np.int64))})
        self.finished = True

    def _tagged(self, chunk: Chunk) -> Chunk:
        return {**chunk, **{k: np.full(len(chunk["time_s"]), v, dtype=np.int64) for k, v in self.tags.items()}}

    def kept_columns(self) -> Chunk:
        """The rows this recorder keeps in memory: every row (`all` without a writer), the sample
        (`sampled`), else none; columns int64 or float64, in `COLUMNS` order."""
        self.finish()
        if self.keeps_all_rows:
            if len(self.kept) > 1:
                self.kept = [concat(self.kept)]
            return self.kept[0] if self.kept else empty_chunk()
        if self.sampler is not None:
            return self.sampler.rows()
        return empty_chunk()

    def frame(self) -> pd.DataFrame:
        """`kept_columns()` as a DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.kept_columns())
