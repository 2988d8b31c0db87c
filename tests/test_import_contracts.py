"""The import contracts catch what they promise to: each kind of violation, injected into a copy of the
package, breaks the contract that forbids it (import-linter reports the offending import); and every
module of kvsim and the kernels package sits in a layer, so a new module cannot slip past them."""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONTRACTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]

# (file, line appended, contract id, "importer -> imported" as import-linter prints it)
VIOLATIONS = [
    ("kvsim/memory/paged.py", "import kvsim.engine", "layers", "kvsim.memory.paged -> kvsim.engine"),
    ("kvsim/scheduler/base.py", "import kvsim.engine", "layers", "kvsim.scheduler.base -> kvsim.engine"),
    ("kvsim/engine.py", "import kernels.paged_attention", "layers", "kvsim.engine -> kernels.paged_attention"),
    ("kvsim/config.py", "import kvsim.cli", "layers", "kvsim.config -> kvsim.cli"),
    ("kvsim/metrics.py", "import kvsim.workload", "layers", "kvsim.metrics -> kvsim.workload"),  # one layer
    ("kvsim/metrics.py", "import simpy", "simpy", "kvsim.metrics -> simpy"),
    ("kvsim/engine.py", "import matplotlib", "matplotlib", "kvsim.engine -> matplotlib"),
    ("kvsim/latency.py", "import torch", "gpu", "kvsim.latency -> torch"),
    ("kvsim/roofline.py", "import triton", "gpu", "kvsim.roofline -> triton"),
    ("kvsim/memory/block_pool.py", "import pydantic", "pure-core", "kvsim.memory.block_pool -> pydantic"),
]


def lint_imports() -> str:
    path = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail("lint-imports is not installed: ./dev test installs the dev extra")
    return path


def test_every_contract_has_an_injected_violation():
    assert {c["id"] for c in CONTRACTS} == {v[2] for v in VIOLATIONS}


def test_each_injected_violation_breaks_its_contract(tmp_path):
    for name in ("kvsim", "kernels"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "data", "presets"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    clean = subprocess.run([lint_imports(), "--no-cache"], cwd=tmp_path, capture_output=True, text=True)
    assert clean.returncode == 0, clean.stdout[-2000:]  # the copy itself is clean
    for file, line, _, _ in VIOLATIONS:
        with open(tmp_path / file, "a") as f:
            f.write(f"\n{line}  # injected\n")
    for contract in CONTRACTS:
        result = subprocess.run([lint_imports(), "--no-cache", "--contract", contract["id"]], cwd=tmp_path,
                                capture_output=True, text=True)
        report = re.sub(r"\s+", " ", result.stdout)
        assert result.returncode == 1 and "BROKEN" in report, f"{contract['id']}: {result.stdout[-1500:]}"
        for _, _, contract_id, chain in VIOLATIONS:
            if contract_id == contract["id"]:
                assert chain in report, f"{contract['id']} missed {chain}: {result.stdout[-1500:]}"


def test_every_module_sits_in_a_layer():
    """import-linter cannot check this for a layers contract without containers, so it is checked here."""
    (layers,) = [c["layers"] for c in CONTRACTS if c["type"] == "layers"]
    listed = {name.strip() for layer in layers for name in layer.split("|")}
    modules = {f"kvsim.{p.stem}" for p in (REPO / "kvsim").glob("*.py") if p.stem != "__init__"}
    modules |= {f"kvsim.{p.parent.name}" for p in (REPO / "kvsim").glob("*/__init__.py")}
    modules.add("kernels")
    assert modules - listed == set(), "add these modules to the layers contract in pyproject.toml"
    assert listed - modules == set(), "the layers contract names modules that do not exist"
