"""Sweep 19: input handling left by earlier sweeps (one line naming the field and value, exit 2, nothing written)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
BENCHES = ("allocators", "disagg", "fleet", "scale", "simulator", "speedup", "startup", "vidur")


def _bench(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(BENCHMARKS / f"bench_{name}.py"), *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.mark.parametrize("name", BENCHES)
def test_a_bench_refuses_to_overwrite_a_file_it_did_not_write(tmp_path, name):
    """`bench_*.py --output notes.json` replaced any file; now only an earlier result of the same bench (a JSON
    object of its keys), refused before the bench runs (each exits in about its import time here)."""
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": 1}\n')
    done = _bench(name, "--output", str(mine))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "notes.json" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"bench_{name}.py: error: ")
    assert mine.read_text() == '{"mine": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json"]


@pytest.mark.parametrize("name", BENCHES)
def test_a_bench_may_replace_its_committed_result(name):
    """The committed benchmarks/results/NAME.json is a JSON object of exactly the keys the bench writes, so
    re-running the bench with its default --output replaces it (the keys are read from the committed file)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        module = importlib.import_module(f"bench_{name}")
    finally:
        sys.path.remove(str(BENCHMARKS))
    committed = json.loads((BENCHMARKS / "results" / f"{name}.json").read_text())
    assert frozenset(committed) == module.RESULT_KEYS
