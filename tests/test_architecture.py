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
