"""A closed-loop client (`workload.max_concurrency`, as `vllm bench serve --max-concurrency`): at most N
requests in flight, a request that arrives while N are waits in the client, first come first sent, and is
sent the instant one ends; its TTFT and E2E count from the send, its wait is `client_queue_s`.

Expected values follow from that rule by hand (a constant step time) or from its invariants (the count in
flight never passes N, and with every request there at t = 0 a freed slot is refilled at once), and an
uncapped client must give the open-loop run byte for byte."""

import json

import numpy as np
import pytest
from conftest import one_line_exit_2

from kvsim.engine.simulate import simulate
from kvsim.fleet.driver import simulate_fleet
from kvsim.validation.bench import read_vllm_bench
from kvsim.validation.replay import build_scenario
from kvsim.workload.scenario import make_scenario

STEP_S = 0.01


def _all_at_once(tmp_path, num_requests: int, prompt: int = 100, output: int = 5) -> str:
    """An Azure-format trace of `num_requests` requests arriving together; returns its path."""
    rows = "".join(f"2023-11-16 18:15:46.000000,{prompt},{output}\n" for _ in range(num_requests))
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    return str(path)


def _scenario(workload: dict, **top) -> dict:
    return {"model": "llama-3.1-8b", "gpu": "h100-80gb", "steps": "none", "workload": workload, **top}


def test_two_clients_by_hand(tmp_path):
    """N = 2, five requests at t = 0, 5 output tokens, every step 10 ms, synchronous v1: a request takes its
    prefill step (the first token) and 4 decode steps, 50 ms. Requests 0 and 1 are sent at 0 and end at
    0.05; 2 and 3 are sent then and end at 0.10; 4 is sent at 0.10 and ends at 0.15."""
    raw = _scenario({"num_requests": 5, "arrival": {"process": "trace"}, "max_concurrency": 2,
                     "trace": {"format": "azure", "path": _all_at_once(tmp_path, 5)}},
                    engine={"scheduler": "v1", "async_scheduling": False},
                    latency={"model": "constant", "step_s": STEP_S})
    result = simulate(make_scenario(raw))
    r = result.requests.sort_values("request_id")
    sends = [0.0, 0.0, 0.05, 0.05, 0.10]
    assert r.arrival_s.tolist() == pytest.approx(sends, abs=1e-12)
    assert r.client_queue_s.tolist() == pytest.approx(sends, abs=1e-12)
    assert r.finish_s.tolist() == pytest.approx([s + 0.05 for s in sends], abs=1e-12)
    assert r.ttft_s.tolist() == pytest.approx([STEP_S] * 5, abs=1e-12)
    assert result.summary["client_queue_s"]["mean"] == pytest.approx(sum(sends) / 5)


def _in_flight_at_sends(requests) -> np.ndarray:
    """For each request, how many requests were in flight just after it was sent (sent at or before, not
    ended by then: one that ends at the instant of a send has freed its slot for it)."""
    sent, ended = requests.arrival_s.to_numpy(), requests.finish_s.to_numpy()
    return np.array([int(((sent <= t) & (ended > t)).sum()) for t in sent])


def test_fleet_never_passes_the_cap_and_refills_each_slot(tmp_path):
    """Eight replicas behind the default router, 400 requests all there at t = 0, N = 24: every send finds
    fewer than 24 in flight and, while requests remain, leaves exactly 24 (a freed slot is taken at once);
    requests are sent in arrival order."""
    raw = _scenario({"num_requests": 400, "arrival": {"process": "trace"}, "max_concurrency": 24,
                     "trace": {"format": "azure", "path": _all_at_once(tmp_path, 400, 300, 40)}}, replicas=8)
    r = simulate_fleet(make_scenario(raw)).requests.sort_values("request_id")
    assert (r.status == "finished").all()
    in_flight = _in_flight_at_sends(r)
    assert in_flight.max() == 24
    assert (in_flight[:len(r) - 24] == 24).all()  # the last 24 sends may leave fewer, as slots free at the end
    assert np.all(np.diff(r.arrival_s.to_numpy()) >= 0)
    assert (r.client_queue_s.to_numpy()[:24] == 0).all() and (r.client_queue_s.to_numpy()[24:] > 0).all()


def test_a_cap_never_reached_is_the_open_loop_run():
    """Poisson arrivals with a cap above the request count: byte-identical requests and summary to the run
    without it (the capped run also steps one at a time, so this is bursts against no bursts too)."""
    workload = {"num_requests": 300, "arrival": {"process": "poisson", "rate": 20.0},
                "prompt_len": {"dist": "uniform", "low": 50, "high": 900},
                "output_len": {"dist": "uniform", "low": 20, "high": 300}}
    open_loop = simulate(make_scenario(_scenario(workload)))
    capped = simulate(make_scenario(_scenario({**workload, "max_concurrency": 300})))
    assert "client_queue_s" not in capped.requests
    assert capped.requests.equals(open_loop.requests)
    assert json.dumps(capped.summary, sort_keys=True) == json.dumps(open_loop.summary, sort_keys=True)


def _bench(tmp_path, **fields) -> str:
    n = 4
    body = {"input_lens": [100] * n, "output_lens": [3] * n, "ttfts": [0.1] * n, "itls": [[0.02, 0.02]] * n,
            "errors": [""] * n, **fields}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(body))
    return str(path)


def test_bench_with_a_cap_replays_the_clients_arrivals(tmp_path):
    """With queue_times, a request came to the client at its send less its wait; the replay keeps the cap."""
    run = read_vllm_bench(tmp_path / _bench(tmp_path, max_concurrency=2, request_rate=5.0,
                                            start_times=[10.0, 10.2, 10.5, 10.6], queue_times=[0, 0, 0.2, 0.3]))
    assert run.max_concurrency == 2
    assert [r.arrival_s for r in run.records] == pytest.approx([0.0, 0.2, 0.3, 0.3])
    (tmp_path / "w.jsonl").write_text("")
    scenario = build_scenario(run, tmp_path / "w.jsonl", model="llama-3.1-8b", gpu="h100-80gb")
    assert scenario.workload.max_concurrency == 2


def test_bench_at_an_infinite_rate_hands_every_request_over_at_once(tmp_path):
    """vllm bench serve's default rate (inf): all requests reach the client at the start, sends or not."""
    for starts in (None, [0.0, 1.0, 2.0, 3.0]):
        fields = {"max_concurrency": 1, "request_rate": "inf"} | ({"start_times": starts} if starts else {})
        run = read_vllm_bench(tmp_path / _bench(tmp_path, **fields))
        assert [r.arrival_s for r in run.records] == [0.0] * 4


@pytest.mark.parametrize(("fields", "message"), [
    ({"max_concurrency": 0}, "max_concurrency=0 is not a positive whole number"),
    ({"max_concurrency": 2.5}, "max_concurrency=2.5 is not a positive whole number"),
    ({"max_concurrency": "4"}, "max_concurrency='4' is not a positive whole number"),
    ({"max_concurrency": True}, "max_concurrency=True is not a positive whole number"),
    ({"max_concurrency": 2, "start_times": [0, 1, 2, 3], "queue_times": [0, 0, -1, 0]},
     "queue_times[2]=-1 is negative; not a physical measurement"),
    ({"queue_times": [0, 0]}, "queue_times has 2 entries, input_lens has 4"),
], ids=["zero", "fraction", "text", "bool", "negative-wait", "short-waits"])
def test_bench_bad_cap_is_refused(tmp_path, fields, message):
    line = one_line_exit_2(["validate", _bench(tmp_path, **fields), "--model", "llama-3.1-8b", "--gpu",
                            "h100-80gb", "-o", str(tmp_path / "out")])
    assert message in line
    assert not (tmp_path / "out").exists()


def test_scenario_cap_refusals(tmp_path):
    """A cap below 1, one in front of a disaggregated fleet (not modelled), and one given to `plan`, which
    sizes fleets for open-loop traffic: each one line, exit 2, nothing written."""
    out = str(tmp_path / "out")
    assert "workload.max_concurrency" in one_line_exit_2(["run", "--set", "workload.max_concurrency=0", "-o", out])
    (tmp_path / "d.yaml").write_text(
        "workload: {num_requests: 10, arrival: {process: poisson, rate: 1}, max_concurrency: 4,\n"
        "  prompt_len: {dist: fixed, value: 10}, output_len: {dist: fixed, value: 10}}\n"
        "replicas: [{count: 1, kv_role: kv_producer}, {count: 1, kv_role: kv_consumer}]\n"
        "kv_transfer_config: {}\nrouter: null\n")
    assert "workload.max_concurrency=4 with kv_transfer_config" in one_line_exit_2(["run", str(tmp_path / "d.yaml"),
                                                                                   "-o", out])
    line = one_line_exit_2(["plan", "--set", "workload.max_concurrency=8", "--slo", "ttft_s.p90=2", "--gpu",
                            "h100-80gb", "--workers", "1", "-o", out])
    assert line.startswith("workload.max_concurrency=8: plan sizes a fleet for open-loop traffic")
    assert not (tmp_path / "out").exists()


def test_a_fleets_offered_rate_is_its_arrival_processes_not_its_send_rate():
    """N = 1, five requests due every 25 ms (constant 40 req/s), each 50 ms (prefill and 4 decode steps of
    10 ms): sent at 0, 50, 100, 150, 200 ms, each once the last ends. The client offered 4 / 0.1 s = 40 req/s
    (vllm bench serve's request rate); it sent at 4 / 0.2 s = 20 req/s, which the engine's completions set.
    `offered_rate_per_s` reported the send rate."""
    workload = {"num_requests": 5, "arrival": {"process": "constant", "rate": 40.0}, "max_concurrency": 1,
                "prompt_len": {"dist": "fixed", "value": 100}, "output_len": {"dist": "fixed", "value": 5}}
    raw = _scenario(workload, replicas=2, engine={"scheduler": "v1", "async_scheduling": False},
                    latency={"model": "constant", "step_s": STEP_S})
    result = simulate_fleet(make_scenario(raw))
    sends = result.requests.sort_values("request_id").arrival_s.to_numpy()
    assert sends - sends[0] == pytest.approx([0.0, 0.05, 0.10, 0.15, 0.20], abs=1e-12)
    assert result.summary["offered_rate_per_s"] == pytest.approx(40.0, rel=1e-9)
