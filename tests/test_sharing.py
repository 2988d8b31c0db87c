"""Memory saved by sharing, against the PagedAttention paper's §6.3 (Fig. 15, ShareGPT, OPT-13B).

The paper: parallel sampling saves 16.2–30.5 %, beam search 44.3–66.3 % (widths 2–6). By hand for
parallel sampling: n samples of a prompt P share its blocks, so at output progress o the saving is
(n − 1)·P / (n·(P + o)); averaged over time, long outputs weigh most (E[o] = E[O²] / 2E[O] ≈ 301 for
the lognormal output of mean 338 and p99 1,500), so n = 2 gives 161 / (2 · 462) ≈ 17 % and n = 6 gives
5 · 161 / (6 · 462) ≈ 29 %. Runs are at 0.5 req/s so that no preemption re-starts requests (a
saturated queue keeps re-admitting fresh requests, which share a larger prompt fraction).
"""

from pathlib import Path

import pytest

from kvsim.engine import simulate
from kvsim.scenario import load_scenario

PAPER = Path(__file__).resolve().parents[1] / "scenarios" / "paper-paged.yaml"


def saving(kind: str, width: int) -> float:
    summary = simulate(load_scenario(PAPER, ["workload.num_requests=300", "workload.arrival.rate=0.5",
                                             f"workload.{kind}={width}"])).summary
    return 100 * summary["sharing_saving"]


@pytest.mark.parametrize("n", [2, 4, 6])
def test_parallel_sampling_saving_is_in_the_papers_range(n):
    assert 16.2 <= saving("n", n) <= 30.5


@pytest.mark.slow
def test_beam_search_saving_grows_with_width_near_the_papers_range():
    """Width 4 falls inside 44.3–66.3 %; widths 2 and 6 lie within 7 points of it (the beam model in
    kvsim/scheduler/beams.py coalesces a little faster than real beams as the width grows)."""
    savings = {w: saving("beam_width", w) for w in (2, 4, 6)}
    assert 44.3 <= savings[4] <= 66.3
    assert 44.3 - 7 <= savings[2] < savings[4] < savings[6] <= 66.3 + 7
    assert all(savings[w] > saving("n", w) for w in (2, 6))  # beams share generated tokens too


def test_no_sharing_saves_nothing():
    summary = simulate(load_scenario(PAPER, ["workload.num_requests=30"])).summary
    assert summary["sharing_saving"] == 0.0
