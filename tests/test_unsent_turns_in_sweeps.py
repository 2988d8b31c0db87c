"""An after_reply multi-turn run that drops conversations warns how many turns were never sent
(`kvsim.engine.turns.UNSENT_TURNS`); a sweep's run in a worker process or on a Dask worker said it there, where
the process that called `run_many` (a notebook, a remote user's) never heard it. The sweep now carries the count
back in its result and says it in the calling process."""

import logging

import pytest

from kvsim.engine.turns import UNSENT_TURNS
from kvsim.planning.sweep import _run_one, run_many
from kvsim.workload.scenario import make_scenario

# By hand: 2 conversations of 4 turns (500-token prompts, 20-token replies): turn k's prompt is 500 k + 20 (k - 1)
# tokens: 500, 1,020, then 1,540 over max_model_len 1,100: turn 3 is rejected and turn 4 never sent, in each.
UNSENT = ("2", "8", "6")


def chats():
    return make_scenario({
        "name": "chats", "model": "llama-3.1-8b", "gpu": "h200",
        "engine": {"max_model_len": 1100, "num_gpu_blocks_override": 600},
        "workload": {"num_requests": 8, "arrival": {"process": "poisson", "rate": 1.0},
                     "prompt_len": {"dist": "fixed", "value": 500}, "output_len": {"dist": "fixed", "value": 20},
                     "multi_turn": {"turns": 4, "think_time_s": 1.0, "timing": "after_reply"}},
        "seed": 0})


def said(caplog):
    return [record.args for record in caplog.records if record.msg == UNSENT_TURNS]


def test_a_run_in_a_worker_keeps_the_count_and_says_nothing_there(caplog):
    """What a worker (process pool or Dask) runs: the warning is kept in the result, not said where it ran."""
    with caplog.at_level(logging.WARNING, logger="kvsim"):
        result = _run_one((chats(), False, False))
    assert result.unsent_turns == UNSENT and result.summary["num_requests"] == 6
    assert said(caplog) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_run_many_says_each_run_s_count_in_the_calling_process(caplog, workers):
    """workers=2 runs in a process pool: before, the calling process's logging heard nothing (the child wrote to its
    own stderr). workers=1 runs here: said once per run, as before (not twice)."""
    with caplog.at_level(logging.WARNING, logger="kvsim"):
        run_many([chats(), chats()], workers=workers)
    assert said(caplog) == [UNSENT, UNSENT]
