"""A finished run and how it is written to disk (atomically: a half-written run never looks done)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from kvsim.scenario import Scenario


@contextmanager
def atomic_directory(out_dir: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of `out_dir` to fill; it replaces `out_dir` only if the block succeeds."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@dataclass(frozen=True, slots=True)
class RunResult:
    """`requests` and `steps` DataFrames (see `kvsim.metrics`) and the `summary` dict."""

    scenario: Scenario
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict[str, Any]

    def write(self, out_dir: str | Path) -> Path:
        """Write `requests.csv`, `steps.csv`, `summary.json` and `scenario.yaml` into `out_dir`.

        Files go to a temporary sibling directory that is renamed into place only when all
        are complete; an existing `out_dir` is replaced.
        """
        import yaml

        with atomic_directory(out_dir) as tmp:
            self.requests.to_csv(tmp / "requests.csv", index=False)
            self.steps.to_csv(tmp / "steps.csv", index=False)
            (tmp / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
            (tmp / "scenario.yaml").write_text(yaml.safe_dump(self.scenario.model_dump(mode="json"),
                                                              sort_keys=False))
        return Path(out_dir)
