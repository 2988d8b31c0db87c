"""What a newcomer meets first: the version, help that shows its defaults, tables that fit 80 columns."""

import tomllib
from pathlib import Path

from typer.testing import CliRunner

from kvsim.cli import app

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_version_is_the_packages():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["dynamic"] == ["version"]  # read from kvsim/model/version.py, one source
    version = (REPO / "kvsim" / "model" / "version.py").read_text().split('__version__ = "')[1].split('"')[0]
    assert result.output == f"kvsim {version}\n"


def test_help_keeps_text_in_square_brackets():
    """Rich markup would read "[all cores]" as a style tag and drop it."""
    result = runner.invoke(app, ["report", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "[all cores]" in result.output and "[a KV-bound built-in one]" in result.output
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert "[runs/NAME]" in result.output


def test_capacity_table_fits_80_columns_without_cutting_and_names_max_model_len():
    result = runner.invoke(app, ["capacity", "--max-model-len", "8192", "--context-lengths", "4096,8192,16384"],
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output  # folded, not truncated
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert "exceeds" in result.output and "max_model_len" in result.output
    # too wide for one table at 80 columns: one field/value table per row; the 16,384-token one says why
    # it holds nothing
    record = result.output.split("│ context_len")[3]
    assert record.split("│")[1].strip() == "16,384" and "paged_max_seqs     │ exceeds max_model_len" in record


def test_capacity_markdown_says_exceeds_and_csv_keeps_zero():
    args = ["capacity", "--max-model-len", "8192", "--context-lengths", "8192,16384"]
    markdown = runner.invoke(app, [*args, "--format", "markdown"]).output
    row = markdown.split("| 16,384 |")[1].splitlines()[0]
    # every concurrency-derived column (bf16, fp8, the capped count, the throughput) says why, none prints 0
    assert row.count("exceeds max_model_len") == 5 and "| 0 |" not in row
    csv = runner.invoke(app, [*args, "--format", "csv"]).output.splitlines()
    header, last = csv[0].split(","), csv[-1].split(",")
    assert last[header.index("context_len")] == "16384" and last[header.index("paged_max_seqs")] == "0"
