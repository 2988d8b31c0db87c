"""Metamorphic and differential relations, eighth round: the planning answers (what a planner buys GPUs from).

`test_metamorphic.py` to `test_metamorphic7.py` hold the earlier rounds; `test_plan*.py`, `test_steady*.py`,
`test_report*.py` and `test_cost.py` the plan's own. Here:

* every price `kvsim capacity` prints scales with the GPU's hourly price, to its printed 4 significant digits:
  they were rounded to 4 decimals, so a cheap GPU-hour's prices kept one or two digits (2 GPUs at $0.10 an hour
  over 156 sequences, $0.001282 per user-hour, printed 0.0013: 1.4 % off, and not a tenth of $1.00's 0.0128);
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()


def capacity_rows(*args: str) -> list[dict]:
    result = runner.invoke(app, ["capacity", "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["rows"]


@pytest.mark.parametrize("usd_per_gpu_hour", [0.1, 0.37, 2.0, 123.0])
def test_capacity_prices_scale_with_the_hourly_price_to_four_digits(usd_per_gpu_hour):
    """10,000 blocks of 16 tokens (9,999 usable: v1's null block), 1,024-token sequences: 9,999 // 64 = 156 at once
    (under max_num_seqs), 2,048: 78, on 2 GPUs (TP 2): USD per user-hour = 2 · price / sequences, and per million
    output tokens 2 · price / (the row's closed-form tokens/s · 3,600) · 10^6, each to 4 significant digits."""
    rows = capacity_rows("--num-gpu-blocks-override", "10000", "--context-lengths", "1024,2048", "-tp", "2",
                         "--gpu-hourly-cost", str(usd_per_gpu_hour))
    assert [row["concurrent_sequences"] for row in rows] == [156, 78]
    for row in rows:
        user_hour = 2 * usd_per_gpu_hour / row["concurrent_sequences"]
        per_million = 2 * usd_per_gpu_hour / (row["output_tokens_per_s_closed_form"] * 3600) * 1e6
        assert row["usd_per_concurrent_user_hour"] == pytest.approx(user_hour, rel=5e-4)
        assert row["usd_per_million_output_tokens"] == pytest.approx(per_million, rel=5e-4)
