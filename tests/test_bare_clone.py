"""A bare clone (no `../shared` beside it) passes its own suite: the guards that keep it so.

The validation subset the accuracy table and validation tests read ships in
`benchmarks/validation_set/`, small and with the licence notice its MIT licence asks for; every
test that reads `../shared` goes through conftest's `shared`/`traces` fixtures, which skip where it
is absent and honour `KVSIM_SHARED=none` (the switch `.ci/run` reruns them with).
"""

import gzip
import re
from pathlib import Path

from conftest import REPO, VALIDATION_SET

TESTS = Path(__file__).resolve().parent
SHARED_PATH = re.compile(r'/\s*"shared"|parents\[2\]|"\.\./shared/')  # building a path into ../shared
MAX_SET_BYTES = 3 * 2**20
CASES = ("Llama-3.1-8B", "Qwen3-32B", "Qwen3-30B-A3B-Instruct-2507")


def test_no_test_reaches_shared_but_through_the_fixture():
    offenders = [f"{path.name}:{n}" for path in sorted(TESTS.glob("*.py")) if path.name != "conftest.py"
                 for n, line in enumerate(path.read_text().splitlines(), start=1) if SHARED_PATH.search(line)]
    assert offenders == [], "use conftest's `shared` fixture (it skips on a bare clone): " + ", ".join(offenders)


def test_the_accuracy_table_reads_the_shipped_set():
    source = (REPO / "benchmarks" / "accuracy.py").read_text()
    assert 'VALIDATION = REPO / "benchmarks" / "validation_set"' in source


def test_the_shipped_set_is_small_whole_and_attributed():
    files = [p for p in VALIDATION_SET.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < MAX_SET_BYTES
    licence = (VALIDATION_SET / "LICENSE.LLMServingSim").read_text()
    assert "Copyright (c) 2024, CASYS Lab at KAIST" in licence and "MIT License" in licence
    readme = (VALIDATION_SET / "README.md").read_text()
    assert "5daddb21a545658d5150b535712d0494584b5278" in readme and "LICENSE.LLMServingSim" in readme
    for case in CASES:
        run = VALIDATION_SET / "measured" / "RTXPRO6000" / case
        for name in ("config.json", "vllm/meta.json", "vllm/requests.jsonl.gz", "vllm/timeseries.csv",
                     "outputs/sim.csv.gz", "validation/summary.txt"):
            assert (run / name).is_file(), (case, name)
    for path in files:  # compressed without a name or time stamp (gzip -9n): the same bytes on every copy
        if path.suffix == ".gz":
            head = path.read_bytes()[:10]
            assert head[4:8] == b"\0\0\0\0" and not head[3] & 0x08, path
            with gzip.open(path) as f:
                f.read(1)
