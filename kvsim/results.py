"""A finished run and how it is written to disk (see `kvsim.output_dir`: only over kvsim's own output, atomically)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsim.errors import KvsimError
from kvsim.output_dir import output_directory

if TYPE_CHECKING:
    import pandas as pd

    from kvsim.scenario import Scenario


@dataclass(frozen=True, slots=True, repr=False)
class RunResult:
    """`requests` and `steps` DataFrames (see `kvsim.metrics`) and the `summary` dict.

    A run that streamed its steps to disk (`simulate(..., out_dir=...)`) keeps no `step_rows`;
    its `steps` are read from `steps_path` each time they are asked for.
    """

    scenario: Scenario
    requests: pd.DataFrame
    step_rows: pd.DataFrame | None
    summary: dict[str, Any]
    steps_path: Path | None = None

    @property
    def steps(self) -> pd.DataFrame:
        """The per-step rows the run kept (`scenario.steps`): in memory, or read from `steps_path`."""
        import pandas as pd

        if self.step_rows is not None:
            return self.step_rows
        assert self.steps_path is not None, "a RunResult has step_rows or a steps_path"
        if self.steps_path.suffix == ".parquet":
            return pd.read_parquet(self.steps_path)
        return pd.read_csv(self.steps_path)

    def __repr__(self) -> str:
        """One line: the scenario, the table sizes and three headline numbers (print `summary` for all)."""
        s = self.summary

        def mean(key: str) -> str:
            value = (s.get(key) or {}).get("mean")
            return "-" if value is None else f"{value:.4g}"

        return (f"RunResult(scenario={self.scenario.name!r}, requests={len(self.requests):,}, "
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
            (tmp / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        return Path(out_dir)

    def write(self, out_dir: str | Path) -> Path:
        """Write `requests.csv`, `steps.csv` (unless the scenario keeps no steps), `summary.json`
        and `scenario.yaml` into `out_dir`.

        `out_dir` must be new or an earlier kvsim run (else `KvsimError`); the files go to a
        temporary sibling folder that is swapped into place only when all are complete.
        """
        with output_directory(out_dir, "run") as tmp:
            write_run_files(tmp, self, steps=self.scenario.steps != "none")
        return Path(out_dir)


def write_run_files(folder: Path, result: RunResult, steps: bool) -> None:
    """`requests.csv`, `summary.json`, `scenario.yaml` and, if `steps`, `steps.csv` into `folder`
    (a temporary folder of `output_directory`)."""
    import yaml

    from kvsim.step_writer import frame_to_csv

    frame_to_csv(result.requests, folder / "requests.csv")
    if steps:
        frame_to_csv(result.steps, folder / "steps.csv")
    (folder / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
    (folder / "scenario.yaml").write_text(yaml.safe_dump(result.scenario.model_dump(mode="json"), sort_keys=False))
