"""`kvsim validate` compares like for like: every column over the same requests, paired by request index.

The measured rows, the replay's requests and LLMServingSim's predictions are paired by the request's number
(vLLM's `bench-N`, a bench JSON's list position, LLMServingSim's `request id`), never by position in sorted
order, and a failed request replayed for its load is in no column. Expected values are read off the files.
"""

import json

import pytest
from test_validate import CONSTANT, bench_json, write_run

from kvsim.validation.compare import validate
from kvsim.validation.measured import load_measured


def test_a_closed_loop_replay_pairs_by_request_not_by_send_order(tmp_path):
    """A closed-loop client (max_concurrency 1, every request handed over at once): each send less its wait is the
    same instant up to rounding, here 1 and 2 ns earlier for requests 1 and 2, so the replay's order (by that
    instant) is 2, 1, 0 while the measured rows (by send) are 0, 1, 2. kvsim rejects request 2 (a 3,000-token
    prompt over max_model_len 1,024): the measured TTFT mean is requests 0 and 1's, (0.01 + 0.02) / 2 = 0.015 s.
    Pairing by position dropped request 0 instead: (0.02 + 0.5) / 2 = 0.26 s."""
    path = bench_json(tmp_path / "bench.json", input_lens=[16, 32, 3000], output_lens=[5, 3, 4],
                      ttfts=[0.01, 0.02, 0.5], itls=[[0.01] * 4, [0.02, 0.02], [0.01] * 3],
                      latencies=[0.05, 0.06, 0.53], errors=["", "", ""], request_rate="inf", max_concurrency=1,
                      start_times=[1000.0, 1000.05, 1000.1], queue_times=[0.0, 0.05 + 1e-9, 0.1 + 2e-9])
    run = load_measured(path)
    assert run.record_index == (2, 1, 0)
    v = validate(run, model="llama-3.1-8b", gpu="h100-80gb", overrides=[*CONSTANT, "engine.max_model_len=1024"])
    assert v.result.summary["num_rejected"] == 1
    assert v.row("TTFT mean (s)")["measured"] == pytest.approx(0.015)
    assert v.row("E2E mean (s)")["measured"] == pytest.approx((0.05 + 0.06) / 2)


def test_a_failed_request_that_streamed_is_replayed_for_its_load_alone(tmp_path):
    """Request 0's stream broke after 1 + 3 chunks: the replay carries it (its 16-token prompt and 4 tokens), so
    request 1, arriving beside it, shares the engine with it, but kvsim's column is request 1's alone, as the
    measured one is (vLLM's means leave failures out): kvsim's TTFT mean is its request 1's TTFT."""
    path = bench_json(tmp_path / "bench.json", input_lens=[16, 32], output_lens=[0, 3], ttfts=[0.01, 0.02],
                      itls=[[0.01] * 3, [0.02, 0.02]], latencies=[0.04, 0.06], start_times=[1000.0, 1000.005],
                      errors=["stream broke", ""])
    v = validate(load_measured(path), model="llama-3.1-8b", gpu="h100-80gb", overrides=CONSTANT)
    sim = v.result.requests.sort_values("request_id")
    assert list(sim.prompt_tokens) == [16, 32] and list(sim.status) == ["finished", "finished"]
    assert v.row("TTFT mean (s)")["measured"] == pytest.approx(0.02)
    assert v.row("TTFT mean (s)")["kvsim"] == pytest.approx(float(sim.ttft_s.iloc[1]))


def test_llmservingsims_column_leaves_out_the_requests_kvsim_rejected(tmp_path):
    """The two-request folder with LLMServingSim's prediction (rows in the file's order 1, 0, arriving together,
    TTFT 50 ms for request 1 and 10 ms for request 0). max_model_len 24 rejects request 1 (a 32-token prompt):
    the measured and kvsim columns are request 0's, and so must the peer's be: 10 ms, not (10 + 50) / 2 = 30 ms.
    Its makespan is request 0's, 0.05 s (end at 50 ms)."""
    run_dir = write_run(tmp_path)
    (run_dir / "outputs").mkdir()
    header = "instance id,request id,model,input,output,arrival,end_time,latency,queuing_delay,TTFT,TPOT,ITL\n"
    rows = ["0,1,m,32,3,0,90000000,90000000,0,50000000,20000000,\"[]\"\n",
            "0,0,m,16,5,0,50000000,50000000,0,10000000,10000000,\"[]\"\n"]
    (run_dir / "outputs" / "sim.csv").write_text(header + "".join(rows))
    v = validate(load_measured(run_dir), gpu="h100-80gb", overrides=[*CONSTANT, "engine.max_model_len=24"])
    assert v.result.summary["num_rejected"] == 1
    assert v.row("TTFT mean (s)")["measured"] == pytest.approx(0.01)
    assert v.row("TTFT mean (s)")["llmservingsim"] == pytest.approx(0.01)
    assert v.row("makespan (s)")["llmservingsim"] == pytest.approx(0.05)
    assert json.loads(json.dumps(v.rows, default=str))  # the table stays JSON-safe
