"""`steps: none | sampled | all` changes what a run keeps and writes, never its summary."""

import pandas as pd

from kvsim.engine import recorder
from kvsim.engine.simulate import simulate
from kvsim.workload.scenario import load_scenario


def run(steps=None, n=60):
    return simulate(load_scenario(None, [f"workload.num_requests={n}"]), steps=steps)


def test_modes_keep_rows_but_not_change_the_summary(monkeypatch, tmp_path):
    full = run("all")
    assert full.summary["num_steps"] == len(full.steps) > 20
    monkeypatch.setattr(recorder, "MAX_SAMPLED_STEPS", 11)
    sampled = run("sampled")
    none = run("none")
    assert sampled.summary == full.summary == none.summary
    assert none.steps.empty and list(none.steps.columns) == list(full.steps.columns)
    n = len(full.steps)
    stride = 1  # by hand: the smallest power of two whose multiples below n number at most 11 - 1
    while len(range(0, n, stride)) > 10:
        stride *= 2
    expected = sorted({*range(0, n, stride), n - 1})  # every stride-th step and the last
    assert stride > 1 and expected[0] == 0 and expected[-1] == n - 1 and len(expected) <= 11
    pd.testing.assert_frame_equal(sampled.steps, full.steps.iloc[expected].reset_index(drop=True))
    none.write(tmp_path / "none")
    full.write(tmp_path / "all")
    assert not (tmp_path / "none" / "steps.csv").exists() and (tmp_path / "all" / "steps.csv").exists()


def test_scenario_field_and_simulate_argument_agree():
    spec = load_scenario(None, ["workload.num_requests=20", "steps=none"])
    assert simulate(spec).steps.empty
    assert not simulate(spec, steps="all").steps.empty


def test_finished_requests_release_their_content():
    """A long run must not keep every request's block-hash memo alive after it finished."""
    import numpy as np

    from kvsim.engine.builder import build_engine
    from kvsim.workload.generate import build_requests

    spec = load_scenario(None, ["workload.num_requests=30"])
    rng = np.random.default_rng(spec.seed)
    parts = build_engine(spec, rng)
    requests = build_requests(spec, parts.facts["max_model_len"], rng)
    assert all(r.content is not None for r in requests)
    from kvsim.engine.loop import run_engine

    run_engine(parts.scheduler, parts.latency, requests)
    assert all(r.content is None for r in requests)
