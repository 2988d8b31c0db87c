"""A conversation's next turn carries the reply its previous turn got, as vLLM's multi-turn benchmark client sends it
(benchmarks/multi_turn/benchmark_serving_multi_turn.py, `send_turn`: the generated answer replaces the dataset's
before the next turn is sent; a failed turn has none).

Found (model31): a reply a replica cut at its max_model_len still came whole in the next turn's prompt (open and
after_reply timing alike), and a turn a disaggregated decode instance refused, or cut, after its conversation's next
turn had arrived (still prefilling then) left the whole reply asked in that next turn. Every expected prompt below is
counted by hand: the turns' messages plus the replies the client got, a cut reply being max_model_len − its prompt.
"""

from __future__ import annotations

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path

import kvsim
from kvsim.model.errors import KvsimError
from kvsim.workload.conversations import TurnBuilder
from kvsim.workload.traces import TraceRecord

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
MIXED_FLEET = ("steps: none\nengine: {max_model_len: 2048}\nrouter: {policy: round_robin}\n"
               "replicas: [{count: 1}, {count: 1, engine: {max_model_len: 8192}}]\n")


def _trace(rows: list[tuple[int, int]]) -> str:
    """An Azure trace of `rows` (prompt, output), one a second from 18:00:00."""
    return AZURE + "".join(f"2023-11-16 18:00:{i:02d}.000000,{p},{o}\n" for i, (p, o) in enumerate(rows))


def _rows(tmp_path, monkeypatch, scenario: str, trace: str) -> list[list]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(trace)
    (tmp_path / "s.yaml").write_text(scenario)
    rows = kvsim.simulate(kvsim.load_scenario("s.yaml")).requests
    return rows[["prompt_tokens", "output_tokens", "status", "replica"]].values.tolist()


@pytest.mark.parametrize("timing", ["open", "after_reply"])
def test_a_reply_cut_at_max_model_len_is_carried_as_cut(tmp_path, monkeypatch, timing):
    """Conversation 0's first turn (1,500 tokens asking 1,000) goes to replica 0 (round robin), whose max_model_len
    2,048 cuts its reply at 2,048 − 1,500 = 548 tokens (452 cut). Its second turn carries that reply: 1,500 + 548 +
    100 = 2,148 tokens, not 1,500 + 1,000 + 100 = 2,600 (the fleet's largest limit, 8,192, cuts nothing), and
    replica 1 serves it. Conversation 1 (1,000 asking 100, then 100 more) is cut nowhere: 1,000 + 100 + 100."""
    workload = ("workload: {num_requests: 4, arrival: {process: trace}, trace: {format: azure, path: t.csv}, "
                f"multi_turn: {{turns: 2, think_time_s: 1.0, timing: {timing}}}}}\n")
    rows = _rows(tmp_path, monkeypatch, MIXED_FLEET + workload, _trace([(1500, 1000), (100, 10), (1000, 100),
                                                                         (100, 10)]))
    by_prompt = sorted(rows)  # open: send order c0t0, c0t1, c1t0, c1t1; after_reply: c0t0, c1t0, c1t1, c0t1
    assert by_prompt == [[1000, 100, "finished", 1 if timing == "after_reply" else 0],
                         [1200, 10, "finished", 0 if timing == "after_reply" else 1],
                         [1500, 548, "finished", 0], [2148, 10, "finished", 1]]


DISAGG = ("steps: none\nengine: {max_model_len: 8192}\nkv_transfer_config: {kv_connector: NixlConnector, "
          "kv_link: rdma}\nreplicas:\n  - {count: 1, name: prefill, kv_role: kv_producer}\n"
          "  - {count: 1, name: decode, kv_role: kv_consumer, engine: {max_model_len: 4096}}\n")


@pytest.mark.parametrize("think_s", [0.001, 100.0])
def test_a_decode_instances_verdict_is_the_next_turns_even_when_it_comes_first(tmp_path, monkeypatch, think_s):
    """Prefill 8,192, decode 4,096. Conversation 0: 5,000 tokens asking 500 prefill, then the decode instance refuses
    them (5,000 ≥ 4,096): no reply, so turn 2 is 5,000 + 100 = 5,100 tokens (refused too), not 5,600. Conversation
    1: 1,000 asking 3,500, cut on the decode instance at 4,096 − 1,000 = 3,096: turn 2 is 1,000 + 3,096 + 10 = 4,106
    (refused: ≥ 4,096), not 4,510. With a think time of 1 ms each next turn arrives while its previous turn still
    prefills (5,000 and 1,000 tokens take longer than that on an H100; the transfer table shows conversation 1's
    hand-off after it), before the decode side decides: the same prompts as with 100 s, when it has decided."""
    workload = ("workload: {num_requests: 4, arrival: {process: trace}, trace: {format: azure, path: t.csv}, "
                f"multi_turn: {{turns: 2, think_time_s: {think_s}}}}}\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(_trace([(5000, 500), (100, 10), (1000, 3500), (10, 10)]))
    (tmp_path / "s.yaml").write_text(DISAGG + workload)
    result = kvsim.simulate(kvsim.load_scenario("s.yaml"))
    rows = result.requests[["prompt_tokens", "output_tokens", "status"]].values.tolist()
    assert sorted(rows) == [[1000, 3096, "finished"], [4106, 10, "rejected"], [5000, 500, "rejected"],
                            [5100, 10, "rejected"]]
    (handoff_s,) = result.tables["transfers"]["handoff_s"]  # conversation 1's first turn, the one served
    assert (handoff_s > 2.0 + think_s) == (think_s < 1)  # its next turn came before (1 ms) or after the hand-off


def test_decode_instances_that_could_answer_a_turn_differently_are_refused_with_multi_turn(tmp_path, monkeypatch):
    """Two decode instances of max_model_len 4,096 and 8,192 could refuse or serve the same turn, and the router
    picks one only after the prefill, which the conversation's next turn may precede: one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(_trace([(100, 10), (100, 10)]))
    scenario = (DISAGG + "  - {count: 1, name: big, kv_role: kv_consumer}\n"
                "workload: {num_requests: 2, arrival: {process: trace}, trace: {format: azure, path: t.csv}, "
                "multi_turn: {turns: 2}}\n")
    (tmp_path / "s.yaml").write_text(scenario)
    line = one_line_exit_2(["run", "s.yaml", "-o", str(tmp_path / "out")])
    assert line.startswith("replicas (")
    assert "max_model_len 8192" in line and "has 4096" in line and "decode instances must answer alike" in line
    assert not (tmp_path / "out").exists()
    (tmp_path / "s.yaml").write_text(scenario.replace("multi_turn: {turns: 2}", "multi_turn: {turns: 1}"))
    assert len(kvsim.simulate(kvsim.load_scenario("s.yaml")).requests) == 2  # one turn: no next turn to carry it
    (tmp_path / "s.yaml").write_text(scenario)
    with pytest.raises(KvsimError, match="decode instances must answer alike"):
        kvsim.simulate(kvsim.load_scenario("s.yaml"))


@pytest.mark.parametrize(("num_blocks", "alike"), [(257, True), (256, False)])
def test_decode_pools_that_differ_answer_alike_where_each_holds_a_whole_sequence(tmp_path, monkeypatch, num_blocks,
                                                                                 alike):
    """Both decode instances at max_model_len 4,096; the second's pool is `num_blocks` blocks of 16, one of them
    vLLM's null block. A sequence of 4,095 tokens (a prompt and a reply cut at 4,096, less the last token) takes 256
    blocks: 256 usable hold it, so neither pool refuses what the other serves and the run goes on (turn 2: 100 + 10
    + 100 = 210 tokens); 255 usable (4,080 slots) cannot hold one 4,096-token request (256 blocks), so that engine
    does not start, as vLLM's startup check, which reserves the null block (PR #47272), refuses it: one line naming
    the second."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(_trace([(100, 10), (100, 10)]))
    (tmp_path / "s.yaml").write_text(
        DISAGG + "  - {count: 1, name: small, kv_role: kv_consumer, engine: {max_model_len: 4096, "
        f"num_gpu_blocks_override: {num_blocks}}}}}\nworkload: {{num_requests: 2, arrival: {{process: trace}}, "
        "trace: {format: azure, path: t.csv}, multi_turn: {turns: 2}}\n")
    if alike:
        assert kvsim.simulate(kvsim.load_scenario("s.yaml")).requests["prompt_tokens"].tolist() == [100, 210]
    else:
        with pytest.raises(KvsimError, match=r"^replicas\[2\]: max_model_len=4096: .* \(256 blocks, one of them v1's null"):
            kvsim.simulate(kvsim.load_scenario("s.yaml"))


def test_a_token_level_reply_cut_keeps_its_first_tokens():
    """A token-id conversation: turn 0 is ids 1 2 3 and its reply 4 5 6. A reply cut to one token leaves 1 2 3 4
    (the start of the reply asked, as vLLM generates it), a refused turn 1 2 3, an uncut one the history itself."""
    builder = TurnBuilder([TraceRecord(None, 3, 3, token_ids=(1, 2, 3, 4, 5, 6))] * 2, 2, 100, None,
                          [False, False], None, 1, False, None, False)
    prompt_len, output_len, _, history = builder.content(0, ())
    assert (prompt_len, output_len, history) == (3, 3, (1, 2, 3, 4, 5, 6))
    assert builder.answered(history, 3, 1) == (1, 2, 3, 4)
    assert builder.answered(history, 3, 0) == (1, 2, 3)
    assert builder.answered(history, 3, 3) is history


def test_decode_pools_of_one_size_in_other_block_sizes_answer_alike(tmp_path, monkeypatch):
    """max_model_len 4,096 everywhere; decode pools of 257 blocks of 16 and 129 of 32, one of each vLLM's null block:
    4,096 usable tokens each, a multiple of both block sizes, each the fewest vLLM's startup check accepts (PR
    #47272 reserves the null block): they serve the same turns, and the run goes on (review33: they were refused for
    their block sizes). Conversation 0, 4,000 tokens asking 97, gets the 96 that max_model_len leaves, served by the
    first decode instance (least outstanding, a tie: the first); its next turn, arriving 1 ms later while it
    prefills, is 4,000 + 96 + 10 = 4,106 ≥ 4,096, refused. Conversation 1, 4,000 asking 98, gets 96 too, served by
    the second (the first has a request outstanding); its next turn, 4,106 tokens, is refused alike. (At
    max_model_len 4,100 these pools no longer start: 257 blocks of 16 are needed besides the null block.)"""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(_trace([(4000, 97), (10, 5), (4000, 98), (10, 5)]))
    (tmp_path / "s.yaml").write_text(
        "steps: none\nengine: {max_model_len: 4096}\nkv_transfer_config: {kv_connector: NixlConnector, "
        "kv_link: rdma}\nreplicas:\n  - {count: 1, name: prefill, kv_role: kv_producer}\n"
        "  - {count: 1, name: d16, kv_role: kv_consumer, engine: {num_gpu_blocks_override: 257}}\n"
        "  - {count: 1, name: d32, kv_role: kv_consumer, engine: {block_size: 32, num_gpu_blocks_override: 129}}\n"
        "workload: {num_requests: 4, arrival: {process: trace}, trace: {format: azure, path: t.csv}, "
        "multi_turn: {turns: 2, think_time_s: 0.001}}\n")
    result = kvsim.simulate(kvsim.load_scenario("s.yaml"))
    rows = result.requests[["prompt_tokens", "output_tokens", "status"]].values.tolist()
    assert rows == [[4000, 96, "finished"], [4106, 5, "rejected"], [4000, 96, "finished"], [4106, 5, "rejected"]]
    routes = result.tables["routes"]
    decode = routes[routes["pool"] == "decode"].set_index("request_id")["replica"]
    assert decode[0] == 1 and decode[2] == 2  # each pool decided one conversation's first turn
