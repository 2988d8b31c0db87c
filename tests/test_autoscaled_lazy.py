"""An autoscaled fleet builds a replica's engine when it first starts it (`kvsim.fleet.autoscaled`), through
`kvsim.engine.loop.LateEngines`: an engine joined while the run goes is exactly one that was there idle from the
start. `max_replicas: 4096` built every engine up front (100 s, 2.9 GB before the first step of the shipped
azure-autoscale scenario at that maximum); the shipped scenarios' outputs are byte-identical (checked file by
file, before and after, at 16, 64 and 4096 slots, steps all or sampled, a closed-loop and a multi-turn client)."""

import numpy as np
from conftest import make_request, tiny_world  # tests/ is on sys.path

from kvsim.engine.loop import LateEngines, run_engines
from kvsim.engine.recorder import StepRecorder
from kvsim.engine.runtime import Engine
from kvsim.fleet.autoscaled import simulate_autoscaled
from kvsim.latency.base import ConstantLatency
from kvsim.workload.scenario import make_scenario


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def _engines(num):
    return [Engine(tiny_world(num_blocks=40), ConstantLatency(0.01), StepRecorder()) for _ in range(num)]


def _run(join_late):
    """40 requests, 20 ms apart, over 3 engines: the first 10 go to engines 0 and 1 in turn, the rest to all three.
    Engine 2 is either given from the start (idle until its first request) or joins at the 5th arrival, before
    any request is routed to it, as an autoscaler starts a replica a startup time before it serves."""
    engines = _engines(3)
    late = LateEngines(3) if join_late else None
    requests = [make_request(i, 0.02 * i, 20 + 7 * (i % 5), 5 + 3 * (i % 4)) for i in range(40)]

    def dispatch(req, now):
        if late is not None and req.request_id == 4:
            assert late.start is not None
            late.start(engines[2], clock)
        return req.request_id % (2 if req.request_id < 10 else 3)

    def clocks(env, arrivals):
        nonlocal clock
        clock = arrivals
        return [arrivals] * (2 if join_late else 3)

    clock = None
    run_engines([[e] for e in (engines[:2] if join_late else engines)], requests, dispatch, check=True,
                clocks=clocks, late=late)
    return engines


def test_an_engine_joined_late_runs_as_one_idle_from_the_start():
    """Every engine's requests (their timelines) and step rows are equal, to the bit."""
    for eager, joined in zip(_run(join_late=False), _run(join_late=True), strict=True):
        for name, column in eager.scheduler.records.columns().items():
            assert _same(column, joined.scheduler.records.columns()[name]), name
        rows, joined_rows = eager.recorder.kept_columns(), joined.recorder.kept_columns()
        assert rows.keys() == joined_rows.keys()
        assert all(_same(rows[key], joined_rows[key]) for key in rows)
    assert len(_run(join_late=False)[2].scheduler.records) == 10  # requests 10..39 with id % 3 == 2


def test_an_autoscaled_fleet_builds_only_the_replicas_it_starts():
    """`max_replicas: 4096`: the slots are started lowest first, so a slot is built only when every one before it
    is up (STARTING, READY or DRAINING); the slots built are the most ever up at once, which the scaling table
    gives at each sync (the only instants a slot starts). They were all 4096."""
    raw = {"name": "lazy", "model": "llama-3.1-8b", "gpu": "h100-80gb", "engine": {"max_model_len": 4096},
           "workload": {"num_requests": 60, "arrival": {"process": "constant", "rate": 60.0},
                        "prompt_len": {"dist": "fixed", "value": 500}, "output_len": {"dist": "fixed", "value": 100}},
           "replicas": 1, "router": {"policy": "least_outstanding"},
           "autoscaler": {"max_replicas": 4096, "target": 1, "startup_s": 0.5, "sync_period_s": 0.25}}
    result = simulate_autoscaled(make_scenario(raw))
    scaling = result.tables["scaling"]
    most_up = int((scaling["num_ready"] + scaling["num_starting"] + scaling["num_draining"]).max())
    assert 1 < most_up < 4096
    assert len(result.replicas) == most_up
    assert result.summary["num_finished"] == 60
