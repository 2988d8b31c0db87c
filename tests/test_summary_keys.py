"""Every key of a run's summary is documented in docs/metrics.md (beside vLLM's name) and follows its one style."""

import re
from pathlib import Path

import kvsim

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def documented_keys() -> set[str]:
    keys: set[str] = set()
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            keys |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


def test_every_summary_key_is_documented_in_one_style():
    summary = kvsim.simulate(None, workload__num_requests=20).summary
    assert set(summary) - documented_keys() == set()
    assert [k for k in summary if not re.fullmatch(r"[a-z][a-z0-9_]*", k)] == []  # no "vllm:" or mixed case
