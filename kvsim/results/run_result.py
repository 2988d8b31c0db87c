"""A finished run, of one engine, a data-parallel group or a fleet, and the one writer of its files.

    RunResult ─┬─ requests, steps        every request (a fleet's with its `replica`), the kept step rows
               ├─ summary                the run's headline numbers (`summary.json`)
               ├─ replicas               a fleet's per-replica sections, each a one-engine RunResult
               └─ tables                 a fleet's other tables by name: routes, replicas (per-replica
                                         rows), a disaggregated fleet's transfers and pools, an
                                         autoscaled fleet's scaling and slo; each written as NAME.csv

A single engine is a fleet of one with no sections and no tables of its own: every run has the same
type, and `write_run_files` writes every run's files. Only over kvsim's own output, atomically: see
`kvsim.results.output_dir`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsim.model.errors import KvsimError
from kvsim.results.output_dir import output_directory

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from kvsim.results.metrics import EngineCounters, StepTotals
    from kvsim.results.step_writer import StepsFormat
    from kvsim.workload.scenario import Scenario


@dataclass(frozen=True, slots=True, repr=False)
class RunResult:
    """`requests` and `steps` DataFrames (see `kvsim.results.metrics`), the `summary` dict and, for a
    fleet, its per-replica sections (`replicas`) and its other `tables`.

    Both main tables are held as columns (`request_columns`, `step_columns`: name → numpy array) and
    made DataFrames on first access: a run that only writes its files (`kvsim run`) never imports
    pandas. A run that streamed every step to disk (`kvsim.fleet.run.simulate_scenario(..., out_dir=...)`,
    as `kvsim run` calls it; `kvsim.simulate` takes no output folder) keeps no `step_columns`; its `steps` are
    read from `steps_path` each time they are asked for.
    A fleet's result is built from its DataFrames (`of_frames`), which `requests`/`steps` then return.
    """

    scenario: Scenario
    request_columns: Mapping[str, np.ndarray]
    step_columns: Mapping[str, np.ndarray] | None
    summary: dict[str, Any]
    steps_path: Path | None = None
    replicas: tuple[RunResult, ...] = ()  # a fleet's replicas in replica order; () for one engine or DP group
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)  # name → table, written as NAME.csv
    totals: StepTotals | None = None  # an engine's (a DP group's) sums over its steps, not written; a fleet's: None
    counters: EngineCounters | None = None  # an engine's (a DP group's: combined) run-long counters; a fleet's: None
    _frames: dict[str, pd.DataFrame] = field(default_factory=dict, init=False, compare=False)

    @classmethod
    def of_frames(cls, scenario: Scenario, requests: pd.DataFrame, steps: pd.DataFrame | None,
                  summary: dict[str, Any], replicas: Sequence[RunResult], tables: Mapping[str, pd.DataFrame],
                  steps_path: Path | None = None) -> RunResult:
        """A fleet's result from its `requests` and `steps` DataFrames (or `steps_path`, where its step
        rows were streamed): the frames are kept, so `requests`/`steps` return these same objects."""
        from kvsim.results.step_writer import frame_columns

        assert (steps is None) != (steps_path is None), "a fleet's steps are in memory or at steps_path"
        result = cls(scenario, frame_columns(requests), None if steps is None else frame_columns(steps), summary,
                     steps_path, tuple(replicas), dict(tables))
        result._frames["requests"] = requests
        if steps is not None:
            result._frames["steps"] = steps
        return result

    def _frame(self, name: str, columns: Mapping[str, np.ndarray]) -> pd.DataFrame:
        """`columns` as a DataFrame, built on first access and kept (the same object every time)."""
        if name not in self._frames:
            import pandas as pd

            self._frames[name] = pd.DataFrame(dict(columns))
        return self._frames[name]

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request, in arrival order (`kvsim.results.records`' columns; a fleet's: `replica` too)."""
        return self._frame("requests", self.request_columns)

    @property
    def steps(self) -> pd.DataFrame:
        """The per-step rows the run kept (`scenario.steps`): in memory, or read from `steps_path`."""
        if self.step_columns is not None:
            return self._frame("steps", self.step_columns)
        import pandas as pd

        assert self.steps_path is not None, "a RunResult has step_columns or a steps_path"
        if self.steps_path.suffix == ".parquet":
            return pd.read_parquet(self.steps_path)
        return pd.read_csv(self.steps_path)

    def __repr__(self) -> str:
        """One line: the scenario, the table sizes and three headline numbers (print `summary` for all)."""
        s = self.summary

        def mean(key: str) -> str:
            value = (s.get(key) or {}).get("mean")
            return "-" if value is None else f"{value:.4g}"

        return (f"RunResult(scenario={self.scenario.name!r}, requests={len(self.request_columns['request_id']):,}, "
                f"steps={len(self.steps):,}, finished={s.get('num_finished', 0):,}, "
                f"ttft_s.mean={mean('ttft_s')}, tpot_s.mean={mean('tpot_s')})")

    def to_parquet(self, out_dir: str | Path) -> Path:
        """Write `requests.parquet` and `steps.parquet` (columns and dtypes kept) and `summary.json`.

        Same safety as `write`: a new folder or an earlier kvsim output, swapped in complete. Needs
        pyarrow (`pip install 'kvsim[parquet]'`).
        """
        try:
            import pyarrow  # noqa: F401  (pandas' parquet engine)
        except ImportError:
            raise KvsimError("to_parquet needs pyarrow: pip install 'kvsim[parquet]'") from None
        with output_directory(out_dir, "run") as tmp:
            self.requests.to_parquet(tmp / "requests.parquet", index=False)
            self.steps.to_parquet(tmp / "steps.parquet", index=False)
            (tmp / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n", encoding="utf-8")
        return Path(out_dir)

    def write(self, out_dir: str | Path, steps_format: StepsFormat = "csv") -> Path:
        """Write `write_run_files`' files, the steps included (`steps.csv`, or `steps.parquet` as
        `steps_format` chooses: `kvsim.results.step_writer.resolve_format`) unless the scenario keeps no
        steps, into `out_dir`.

        `out_dir` must be new or an earlier kvsim run (else `KvsimError`); the files go to a
        temporary sibling folder that is swapped into place only when all are complete.
        """
        from kvsim.results.step_writer import resolve_format

        resolve_format(steps_format)  # refused before any file is written, steps kept or not
        with output_directory(out_dir, "run") as tmp:
            write_run_files(tmp, self, steps=self.scenario.steps != "none", final=Path(out_dir),
                            steps_format=steps_format)
        return Path(out_dir)


def write_run_files(folder: Path, result: RunResult, steps: bool, final: Path,
                    steps_format: StepsFormat = "csv") -> None:
    """`requests.csv`, `summary.json`, `scenario.yaml`, every table of `result.tables` as NAME.csv and,
    if `steps`, the steps as `steps.csv` or `steps.parquet` (`steps_format`) into `folder` (a temporary
    folder of `output_directory`, which becomes `final`; `scenario.yaml` reruns from there:
    `Scenario.dump_into`). Every CSV is `DataFrame.to_csv`'s text (`kvsim.results.step_writer.write_csv`),
    written in bounded memory."""
    import yaml

    from kvsim.results.step_writer import StepWriter, frame_columns, write_csv

    write_csv(result.request_columns, folder / "requests.csv")
    if steps:
        columns = result.step_columns if result.step_columns is not None else frame_columns(result.steps)
        writer = StepWriter(folder, steps_format)
        writer.write(columns)
        writer.close()
    for name, table in result.tables.items():
        write_csv(frame_columns(table), folder / f"{name}.csv")
    (folder / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n", encoding="utf-8")
    (folder / "scenario.yaml").write_text(yaml.safe_dump(result.scenario.dump_into(final), sort_keys=False),
                                          encoding="utf-8")
