"""The design's import rules and the style checks, enforced in CI."""

import shutil
import subprocess
import sys
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


def test_mypy_is_clean():
    result = subprocess.run([tool("mypy")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]


def test_no_test_package_shadows_an_importable_package():
    """pytest imports tests/<dir>/ with an __init__.py as the top-level package <dir>: named `kernels`, it hid
    the real kernels/ whenever kvsim ran from PYTHONPATH rather than installed (the GPU session)."""
    import importlib.metadata

    project = {p.parent.name for p in REPO.glob("*/__init__.py")}
    installed = set(importlib.metadata.packages_distributions())
    test_packages = {p.parent.relative_to(REPO / "tests").parts[0] for p in (REPO / "tests").glob("*/**/__init__.py")}
    assert project >= {"kvsim", "kernels"}
    assert not test_packages & (project | installed)
