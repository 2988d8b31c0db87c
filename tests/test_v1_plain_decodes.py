"""v1's plain-decode loop (`kvsim.sched.v1._schedule_plain_decodes`) is exact: a run where every request goes
through the general path (`allocate_or_preempt`, whose `allocate` writes a one-token decode as `append_token`
does) gives the same requests, steps and summary, bit for bit.

The world is the report's default scenario (Llama-3.1-8B on one L4, about 2,000 KV blocks) offered more than
it sustains, so the loop meets what stops it: tokens that need a new block, preemptions, blocked queue heads,
admissions and finishes mid-batch. Steps run one by one (no bursts), so every decode is planned by `select`.
"""

import json

import pandas as pd
import pytest

import kvsim.sched.v1
from kvsim.engine.simulate import simulate
from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_plain_decode_loop_equals_the_general_path(async_scheduling, monkeypatch):
    spec = load_scenario(None, [f"engine.async_scheduling={str(async_scheduling).lower()}",
                                "workload.num_requests=200", "workload.arrival.rate=4"], default=REPORT_SCENARIO)
    loop = kvsim.sched.v1._schedule_plain_decodes
    num_plain = []

    def counting(*args):
        num_plain.append(loop(*args))
        return num_plain[-1]

    monkeypatch.setattr(kvsim.sched.v1, "_schedule_plain_decodes", counting)
    fast = simulate(spec, bursts=False)
    monkeypatch.setattr(kvsim.sched.v1, "_schedule_plain_decodes", lambda *args: 0)
    general = simulate(spec, bursts=False)
    for name in ("requests", "steps"):
        pd.testing.assert_frame_equal(getattr(fast, name), getattr(general, name), check_exact=True)
    assert json.dumps(fast.summary, sort_keys=True) == json.dumps(general.summary, sort_keys=True)
    # the loop did the bulk of the decodes, and the general path the rest: preemptions included
    assert sum(num_plain) > 10 * fast.summary["num_steps"] and fast.summary["num_preemptions"] > 0
