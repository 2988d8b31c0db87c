"""A data-parallel group's step rows, one stream in (time_s, dp_rank) order, in bounded memory.

vLLM steps a DP group of an MoE model in lockstep (their expert layers run together: `DPEngineCoreProc`),
and runs the ranks of a dense model as independent engines ("Non-MoE DP ranks are completely
independent", vllm/v1/engine/core.py, `run_engine_core`). Either way the rows are recorded as the steps
start, so they come in time order, and each chunk is put in (`time_s`, `dp_rank`) order (ranks starting a
step at one instant may record it in any order). Each engine records through a `RankRecorder` into the
group's `LockstepRecorder`, which buffers the rows (a `StepRecorder` holding them) with their `dp_rank`,
and every `chunk_rows` rows, when a new instant begins, hands the chunk on:

    totals    the deployment's streaming sums, always: lockstep, the chunk's steps as one row each
              (`kvsim.results.together.dp_group_steps`); independent, the same over the intervals between
              the instants a step starts or ends (`kvsim.results.together.dp_interval_steps`; the steps still
              running when the chunk ends are cut again with the next chunk), counting each engine's steps;
    and, by the scenario's `steps` mode, as `StepRecorder` does:
      all       the writer (to disk, a row group per chunk) or, without one, chunks kept in memory;
      sampled   `StepSampler` over the rows (at most `MAX_SAMPLED_STEPS`, as for one engine);
      none      nothing more.

A run whose rows fit in one chunk gets the totals of the whole table at once, so its summary is the
same as from `dp_group_steps` (independent: of `dp_interval_steps`) over every row; a longer one sums
chunk by chunk, as a lone engine does.
"""

from __future__ import annotations

import sys
from array import array
from typing import TYPE_CHECKING

import numpy as np

from kvsim.engine import recorder
from kvsim.engine.recorder import DTYPES, MAX_SAMPLED_STEPS, Chunk, StepRecorder, StepSampler
from kvsim.results.metrics import StepTotals
from kvsim.results.together import dp_group_steps, dp_interval_steps

if TYPE_CHECKING:
    import pandas as pd

    from kvsim.latency.step_plan import StepPlan
    from kvsim.results.step_writer import StepWriter
    from kvsim.sched.limits import SchedulerSnapshot
    from kvsim.workload.scenario import StepsMode

GROUP_DTYPES = {**DTYPES, "dp_rank": np.dtype(np.int64)}  # the group's step table: an engine's columns, then dp_rank


class LockstepRecorder:
    """The step rows of `num_engines` data-parallel engines, in `lockstep` or independent (see the module
    docstring); `rank(i)` is the recorder engine `i` steps with, `finish` ends the stream (once; later calls
    do nothing)."""

    def __init__(self, mode: StepsMode, num_engines: int, writer: StepWriter | None = None,
                 chunk_rows: int | None = None, lockstep: bool = True) -> None:
        self.mode, self.num_engines, self.writer, self.lockstep = mode, num_engines, writer, lockstep
        self._running: pd.DataFrame | None = None  # independent: steps running on past the last chunk
        self.chunk_rows = recorder.CHUNK_ROWS if chunk_rows is None else chunk_rows  # rows across the engines
        self._rows = StepRecorder("all", chunk_rows=sys.maxsize)  # the buffer: flushed only by `_flush`
        self._ranks = array("q")
        self._now: float | None = None
        self._preemptions = [0] * num_engines  # each engine's cumulative preemptions at its last row handed on
        self.num_rows = 0  # rows handed on
        self.totals = StepTotals()  # over the deployment's steps (lockstep) or intervals (independent)
        self.kept: list[Chunk] = []  # `all` without a writer
        self.sampler = StepSampler(MAX_SAMPLED_STEPS) if mode == "sampled" else None
        self.finished = False

    @property
    def keeps_all_rows(self) -> bool:
        return self.mode == "all" and self.writer is None

    def rank(self, dp_rank: int) -> RankRecorder:
        return RankRecorder(self, dp_rank)

    def record(self, dp_rank: int, now: float, duration_s: float, plan: StepPlan, state: SchedulerSnapshot) -> None:
        """Engine `dp_rank`'s row of the step at `now` (see `StepRecorder.record`)."""
        if now != self._now and len(self._ranks) >= self.chunk_rows:
            self._flush(now)  # a new instant begins: the chunk holds whole lockstep steps
        self._now = now
        self._rows.record(now, duration_s, plan, state)
        self._ranks.append(dp_rank)

    def _flush(self, until_s: float = np.inf) -> None:
        """Hand on the rows so far; no row still to come starts before `until_s`."""
        if not self._ranks:
            return
        self._rows.flush()
        chunk = {**self._rows.kept.pop(), "dp_rank": np.frombuffer(self._ranks, dtype=np.int64).copy()}
        self._ranks = array("q")  # fresh, not emptied in place: see `StepRecorder.flush`
        order = np.lexsort((chunk["dp_rank"], chunk["time_s"]))
        chunk = {name: column[order] for name, column in chunk.items()}
        import pandas as pd  # only on the data-parallel run path: dp_group_steps regroups the steps

        rows = pd.DataFrame(chunk)
        if self.lockstep:
            self.totals.add(dp_group_steps(rows, self.num_engines, self._preemptions))
        else:
            if self._running is not None:
                rows = pd.concat([self._running, rows], ignore_index=True)
            cut, self._running = dp_interval_steps(rows, until_s)
            group = dp_group_steps(cut, self.num_engines, self._preemptions)
            self.totals.add(group)
            self.totals.num_steps += len(order) - len(group)  # each engine's steps, not the intervals
        ranks, preemptions = chunk["dp_rank"], chunk["vllm:num_preemptions_total"]
        for r in np.unique(ranks).tolist():
            self._preemptions[r] = int(preemptions[ranks == r][-1])
        if self.mode == "all":
            if self.writer is not None:
                self.writer.write(chunk)
            else:
                self.kept.append(chunk)
        elif self.sampler is not None:
            self.sampler.add(chunk, self.num_rows)
        self.num_rows += len(ranks)

    def finish(self) -> None:
        """Hand on the last rows and close the writer (an empty table with the header if no step ran)."""
        if self.finished:
            return
        self._flush()
        if self.writer is not None:
            if self.sampler is not None and self.sampler.kept is not None:
                self.writer.write(self.sampler.rows())
            self.writer.close(GROUP_DTYPES)
        self.finished = True

    def kept_columns(self) -> Chunk:
        """The rows kept in memory: every row (`all` without a writer), the sample (`sampled`), else none."""
        self.finish()
        if self.keeps_all_rows and self.kept:
            return {name: np.concatenate([c[name] for c in self.kept]) for name in GROUP_DTYPES}
        if self.sampler is not None and self.sampler.kept is not None:
            return self.sampler.rows()
        return {name: np.zeros(0, dtype=dtype) for name, dtype in GROUP_DTYPES.items()}


class RankRecorder(StepRecorder):
    """What one engine of a data-parallel group records with: its rows go to the group's `LockstepRecorder`
    (its own buffer stays empty; a group runs no decode bursts)."""

    def __init__(self, group: LockstepRecorder, dp_rank: int) -> None:
        super().__init__("none")
        self.group, self.dp_rank = group, dp_rank

    def record(self, now: float, duration_s: float, plan: StepPlan, state: SchedulerSnapshot) -> None:
        self.group.record(self.dp_rank, now, duration_s, plan, state)

    def finish(self) -> None:
        self.group.finish()
        super().finish()
