"""`benchmarks/steady_verify.py`'s long-run rows on evidence without a TTFT interval."""

from conftest import benchmark_script  # tests/ is on sys.path

from kvsim.planning.steady_state import LongRun
from kvsim.planning.window import stalled_evidence


def test_a_long_run_without_a_ttft_interval_reports_it_absent():
    """A run with no window measures no request, so it has no TTFT p90 nor its interval (`metric_stats` over no
    values): the row says None for both, where `--long-only` on a tiny run (8 req/s, 400 requests) raised
    KeyError 'p90_ci'."""
    row = benchmark_script("steady_verify")._long_run(LongRun(8.0, False, stalled_evidence(400, "held KV")))
    assert row == {"rate_per_s": 8.0, "passed": False, "num_requests": 400, "verdict": "stalled", "ttft_p90_s": None,
                   "ttft_p90_ci": None, "served_over_offered": None, "backlog_trend": None, "window_s": 0.0,
                   "num_in_window": 0}
