"""What a review of the closed-loop client (`workload.max_concurrency`) found, each pinned by an invariant or a
value worked out by hand, never by kvsim's own output.

A capped run plans every step (decode bursts are off), so "a cap never reached is the open-loop run, byte for
byte" is also "bursts are exact", across the recorder's chunks of rows too."""

import json

import pytest

import kvsim.engine.recorder as recorder_module
from kvsim.engine.simulate import simulate
from kvsim.workload.scenario import load_scenario, make_scenario


def _json(summary: dict) -> str:
    return json.dumps(summary, sort_keys=True)


def test_bursts_give_the_step_by_step_summary_across_chunks(monkeypatch):
    """Chunks of 7 rows, so that decode bursts carry a chunk past its size: the totals sum each chunk at once,
    and a float sum depends on how its terms are grouped, so the chunks must start at the same steps as a
    step-by-step run's. The summary (time-weighted means of running, KV usage and waste) was a few ulps off
    (a 63,000-step run without the patch, 400 requests of 200 tokens at 0.5 req/s, showed it too)."""
    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 7)
    spec = load_scenario(None, ["workload.num_requests=60"])
    bursts, step_by_step = simulate(spec), simulate(spec, bursts=False)
    assert bursts.summary["num_steps"] > 7 * 10
    assert _json(bursts.summary) == _json(step_by_step.summary)


def test_a_cap_never_reached_is_the_open_loop_run_across_chunks(monkeypatch):
    """The same with a closed-loop client whose cap is never reached: requests and summary byte-identical."""
    monkeypatch.setattr(recorder_module, "CHUNK_ROWS", 7)
    open_loop = simulate(load_scenario(None, ["workload.num_requests=60"]))
    capped = simulate(load_scenario(None, ["workload.num_requests=60", "workload.max_concurrency=60"]))
    assert capped.requests.equals(open_loop.requests)
    assert _json(capped.summary) == _json(open_loop.summary)


def test_a_rejected_request_frees_its_slot_at_once_and_its_wait_is_not_in_the_summary(tmp_path):
    """N = 1, three requests at t = 0 (every step 10 ms, synchronous v1, max_model_len 1024), the second's
    1,100-token prompt over max_model_len. By hand: request 0 is sent at 0, prefills in one step (its first
    token) and decodes 4 more, ending at 0.05; request 1 is sent then and rejected at once, which frees the
    slot at that instant, so request 2 is sent at 0.05 too and ends at 0.10. The summary's client_queue_s is
    over the finished requests (0 and 2: waits 0 and 0.05), as vllm bench serve's "Client Queue Time" is over
    its successful ones; the table keeps every request's wait."""
    rows = "".join(f"2023-11-16 18:15:46.000000,{prompt},5\n" for prompt in (100, 1100, 100))
    (tmp_path / "trace.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    result = simulate(make_scenario({
        "model": "llama-3.1-8b", "gpu": "h100-80gb", "steps": "none",
        "engine": {"scheduler": "v1", "async_scheduling": False, "max_model_len": 1024},
        "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": 3, "arrival": {"process": "trace"}, "max_concurrency": 1,
                     "trace": {"format": "azure", "path": str(tmp_path / "trace.csv")}}}))
    r = result.requests.sort_values("request_id")
    assert r.status.tolist() == ["finished", "rejected", "finished"]
    assert r.arrival_s.tolist() == pytest.approx([0.0, 0.05, 0.05], abs=1e-12)
    assert r.client_queue_s.tolist() == pytest.approx([0.0, 0.05, 0.05], abs=1e-12)
    assert r.finish_s.iloc[[0, 2]].tolist() == pytest.approx([0.05, 0.10], abs=1e-12)
    assert result.summary["client_queue_s"]["mean"] == pytest.approx((0.0 + 0.05) / 2, abs=1e-12)
