"""Cost per user-hour and per million output tokens, worked by hand."""

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.cost import cost_per_million_output_tokens, cost_per_user_hour, gpu_price

runner = CliRunner()


def test_formulas_by_hand():
    price = gpu_price("h200", 6.0)
    assert cost_per_user_hour(price, 2, 300) == pytest.approx(12.0 / 300)  # 2 GPUs · $6 over 300 users
    # 2 GPUs · $6 = $12 per hour buys 1,000 tok/s · 3,600 s = 3.6 M tokens: $3.33 per million
    assert cost_per_million_output_tokens(price, 2, 1000.0) == pytest.approx(12.0 / 3.6)
    assert cost_per_user_hour(price, 1, 0) is None


def test_defaults_are_dated_list_prices_and_some_gpus_have_none():
    h100 = gpu_price("h100-80gb")
    assert h100.usd_per_gpu_hour == 4.76 and "on-demand" in h100.source and "2026-03-10" in h100.source
    assert gpu_price("a100-40gb").usd_per_gpu_hour is None


def test_capacity_reports_cost_per_user_hour():
    """10,000 blocks at 4,096 tokens: 39 sequences; $3.90 per GPU-hour → $0.10 per concurrent user-hour."""
    result = runner.invoke(app, ["capacity", "--num-gpu-blocks-override", "10000", "--context-lengths", "4096",
                                 "--gpu-hourly-cost", "3.9", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["gpu_price_usd_per_gpu_hour"] == 3.9
    assert data["rows"][0]["paged_max_seqs"] == 39
    assert data["rows"][0]["usd_per_concurrent_user_hour"] == pytest.approx(0.1)


@pytest.mark.parametrize("command", ["capacity", "report"])
def test_bad_price_is_one_line(command, tmp_path):
    result = runner.invoke(app, [command, "--gpu-hourly-cost", "-3", *(["-o", str(tmp_path / "r")]
                                                                        if command == "report" else [])])
    assert result.exit_code == 2 and "gpu_hourly_cost=-3.0" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
