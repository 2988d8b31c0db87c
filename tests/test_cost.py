"""Cost per user-hour and per million output tokens, worked by hand."""

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.planning.cost import cost_per_million_output_tokens, cost_per_user_hour, gpu_price

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


def test_capacity_prices_a_million_output_tokens_at_the_cohort_rate():
    """Closed form by hand with a constant 10 ms step: 10 sequences of prompt 50 + output 50 take one prefill
    step and 49 decode steps, 0.5 s, for 500 tokens: 1,000 tokens/s. At $3.60 per GPU-hour (1 GPU) a million
    tokens take 1,000 s: $1.00."""
    from kvsim.latency.base import ConstantLatency
    from kvsim.latency.roofline import cohort_output_tokens_per_s
    from kvsim.planning.cost import add_capacity_costs

    latency = ConstantLatency(0.01, 32e9)
    assert cohort_output_tokens_per_s(latency, 10, 100) == pytest.approx(1000.0)
    price = gpu_price("l4", 3.6)
    plan = {"rows": [{"context_len": 100, "paged_max_seqs": 10}, {"context_len": 100, "paged_max_seqs": 300},
                     {"context_len": 200_000, "paged_max_seqs": 0}]}
    rows = add_capacity_costs(plan, price, 1, 256, lambda s, c: cohort_output_tokens_per_s(latency, s, c))["rows"]
    assert rows[0]["usd_per_million_output_tokens"] == pytest.approx(1.0)
    assert rows[0]["usd_per_concurrent_user_hour"] == pytest.approx(0.36)
    # 300 fit in KV but max_num_seqs runs 256: 256 · 50 tokens in 0.5 s = 25,600 tokens/s
    assert rows[1]["concurrent_sequences"] == 256
    assert rows[1]["output_tokens_per_s_closed_form"] == pytest.approx(25_600.0)
    assert rows[1]["usd_per_million_output_tokens"] == pytest.approx(3.6 / (25_600 * 3600) * 1e6, rel=1e-3)
    assert rows[2]["usd_per_million_output_tokens"] is None  # nothing runs beyond max_model_len


def test_capacity_cli_prints_both_costs():
    result = runner.invoke(app, ["capacity", "--gpu", "l4", "--max-model-len", "4096", "--num-gpu-blocks-override",
                                 "1000", "--context-lengths", "1024", "--format", "json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["rows"][0]
    assert row["concurrent_sequences"] == 1000 // 64  # 1,000 blocks, 64 blocks of 16 per 1,024-token sequence
    tokens = row["output_tokens_per_s_closed_form"]
    assert tokens > 0 and row["usd_per_million_output_tokens"] == pytest.approx(0.78 / (tokens * 3600) * 1e6,
                                                                                 rel=1e-3)
