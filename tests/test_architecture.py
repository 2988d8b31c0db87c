"""The design's import rules and the style checks, enforced in CI."""

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def tool(name):
    path = shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.skip(f"{name} not installed")
    return path


def test_import_contracts_hold():
    result = subprocess.run([tool("lint-imports")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:]


def test_ruff_is_clean():
    result = subprocess.run([tool("ruff"), "check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:]


def test_every_text_file_is_opened_as_utf8():
    """kvsim, the benchmarks and the kernels state UTF-8 wherever they open, read or write a text file (pylint's
    unspecified-encoding, a ruff preview rule): the locale's encoding was used otherwise, so under an ASCII locale
    (LC_ALL=C with PYTHONUTF8=0) `benchmarks/accuracy.py` failed reading the README (its '—') and a Latin-1 one
    would have written it back re-encoded. The tests may use the locale's."""
    result = subprocess.run([tool("ruff"), "check", "--preview", "--select", "PLW1514", "kvsim", "benchmarks",
                             "kernels"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:]


MYPY_CACHE = Path(tempfile.gettempdir()) / f"kvsim-mypy-cache-{os.getuid()}"
"""mypy's incremental cache for `test_mypy_is_clean`, shared by every clone and run on this machine."""


def mypy_run(root, files, cache_dir):
    """mypy over `files` of the tree at `root`, each named by its absolute path, with its cache in `cache_dir`.

    mypy reuses a cached module without reading its source when the path, size and mtime (whole seconds) it
    recorded match. Named relatively (pyproject.toml's `files`), the path is the same in every clone, so a file two
    clones hold in versions of one size, checked out in the same second, matched the other clone's entry: one
    clone's type error was hidden by a clean run of the other. By absolute path, an entry another clone recorded
    makes mypy hash the source, and recheck it (and what depends on it) where it differs."""
    return subprocess.run([tool("mypy"), "--cache-dir", str(cache_dir), *(str(root / name) for name in files)],
                          cwd=root, capture_output=True, text=True)


def test_mypy_is_clean():
    """mypy over the package (pyproject.toml's `files`), with its cache in `MYPY_CACHE`, not the clone's
    .mypy_cache: a fresh clone (CI's) had none and checked every module and the libraries' stubs from scratch
    (~10 CPU s); now it rechecks only what differs from the last run here (~0.5 s). mypy keys each cached module
    by its source's hash, mypy's version and the options, and rechecks whatever depends on a changed interface,
    so the verdict is a cold run's (`mypy_run`). The lock serializes suites running at once (the cache is SQLite)."""
    import tomllib

    files = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]["files"]
    MYPY_CACHE.mkdir(exist_ok=True)
    with (MYPY_CACHE / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = mypy_run(REPO, files, MYPY_CACHE)
    assert result.returncode == 0, result.stdout[-3000:]


def test_a_shared_mypy_cache_does_not_hide_another_clone_s_type_error(tmp_path):
    """Two clones' versions of one module, of one size and mtime: `-> str` in the first, `-> int` (a type error)
    in the second. Checked one after the other with one cache, the second is rechecked and fails (before,
    named relatively, it passed on the first clone's entry)."""
    for clone, returned in (("first", "str"), ("second", "int")):
        (tmp_path / clone / "probe").mkdir(parents=True)
        (tmp_path / clone / "probe" / "__init__.py").write_text("", encoding="utf-8")
        (tmp_path / clone / "probe" / "m.py").write_text(f'def f() -> {returned}:\n    return "x"\n', encoding="utf-8")
        os.utime(tmp_path / clone / "probe" / "m.py", (1_700_000_000, 1_700_000_000))
    assert mypy_run(tmp_path / "first", ["probe"], tmp_path / "cache").returncode == 0
    second = mypy_run(tmp_path / "second", ["probe"], tmp_path / "cache")
    assert second.returncode == 1 and "Incompatible return value type" in second.stdout, second.stdout


def test_no_test_package_shadows_an_importable_package():
    """pytest imports tests/<dir>/ with an __init__.py as the top-level package <dir>: named `kernels`, it hid
    the real kernels/ whenever kvsim ran from PYTHONPATH rather than installed (the GPU session)."""
    import importlib.metadata

    project = {p.parent.name for p in REPO.glob("*/__init__.py")}
    installed = set(importlib.metadata.packages_distributions())
    test_packages = {p.parent.relative_to(REPO / "tests").parts[0] for p in (REPO / "tests").glob("*/**/__init__.py")}
    assert project >= {"kvsim", "kernels"}
    assert not test_packages & (project | installed)


def test_the_package_top_level_holds_at_most_12_entries():
    """Issue 19's target: at most 12 top-level entries under `kvsim/`, the layers' subpackages plus `cli`
    (DESIGN.md §2). A package's own plumbing, `__init__.py` and `__main__.py` (`python -m kvsim`), is the
    package itself, not an entry; anything else at the top (a module, a data folder) counts."""
    plumbing = {"__init__.py", "__main__.py", "__pycache__", "py.typed"}
    entries = sorted(p.name for p in (REPO / "kvsim").iterdir() if p.name not in plumbing)
    assert len(entries) <= 12, entries
    assert all((REPO / "kvsim" / name / "__init__.py").is_file() for name in entries), entries  # all packages


MAX_MODULE_LINES = 500  # DESIGN.md §6: "about 300 lines is normal, 500 is a reason to split"


def test_no_module_is_past_500_lines():
    """Two modules grew past 500 lines in one afternoon's fixes and were split by concept (the overrides out
    of `workload/scenario.py`, ServeGen out of `workload/traces.py`): the rule is checked, not remembered."""
    long = {str(path.relative_to(REPO)): n for path in sorted((REPO / "kvsim").rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, long
