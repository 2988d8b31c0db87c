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
    ("kvsim/kv/paged.py", "import kvsim.engine", "layers", "kvsim.kv.paged -> kvsim.engine"),
    ("kvsim/sched/base.py", "import kvsim.engine", "layers", "kvsim.sched.base -> kvsim.engine"),
    ("kvsim/engine/loop.py", "import kernels.paged_attention", "layers", "kvsim.engine.loop -> kernels.paged_attention"),
    ("kvsim/model/config.py", "import kvsim.cli", "layers", "kvsim.model.config -> kvsim.cli"),
    ("kvsim/results/metrics.py", "import kvsim.kv", "layers", "kvsim.results.metrics -> kvsim.kv"),  # one layer
    ("kvsim/results/metrics.py", "import simpy", "simpy", "kvsim.results.metrics -> simpy"),
    ("kvsim/engine/loop.py", "import matplotlib", "matplotlib", "kvsim.engine.loop -> matplotlib"),
    ("kvsim/latency/base.py", "import torch", "gpu", "kvsim.latency.base -> torch"),
    ("kvsim/latency/roofline.py", "import triton", "gpu", "kvsim.latency.roofline -> triton"),
    ("kvsim/kv/block_pool.py", "import pydantic", "pure-core", "kvsim.kv.block_pool -> pydantic"),
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


def import_cycles() -> list[set[str]]:
    """Strongly connected groups of kvsim and kernels modules (Tarjan), counting every import: run-time,
    function-level and type-only (`if TYPE_CHECKING:`) alike, so an annotation cannot hide a cycle."""
    grimp = pytest.importorskip("grimp")  # import-linter's graph builder
    graph = grimp.build_graph("kvsim", "kernels", exclude_type_checking_imports=False)
    ours = {m for m in graph.modules if m.split(".")[0] in ("kvsim", "kernels")}
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & ours - {m}) for m in sorted(ours)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while (w := stack.pop()) != v:
                group.add(w)
            groups.append(group | {v})

    for module in edges:
        if module not in index:
            visit(module)
    return [g for g in groups if len(g) > 1]


# Cycles still to remove (none since issue 19's redesign); this list only shrinks, and a removed cycle must leave it.
KNOWN_CYCLES: list[set[str]] = []


def test_no_new_import_cycles():
    cycles = import_cycles()
    assert [c for c in cycles if c not in KNOWN_CYCLES] == [], "a new import cycle"
    assert [c for c in KNOWN_CYCLES if c not in cycles] == [], "a cycle is gone: remove it from KNOWN_CYCLES"


def test_pure_core_imports_nothing_heavy_at_run_time():
    """The allocators and schedulers run without simpy, pydantic, pandas or GPU libraries (import-linter's
    pure-core contract checks direct imports; this checks the whole run-time closure in a fresh process)."""
    code = ("import sys, kvsim.kv, kvsim.sched, kvsim.latency.step_plan; "
            "print(sorted(m for m in ('simpy', 'pydantic', 'pandas', 'matplotlib', 'torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
