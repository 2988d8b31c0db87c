"""`workload.multi_turn.timing: after_reply`: a conversation's turn k + 1 is sent `think_time_s` after turn k
ended (its last token), as vLLM's multi-turn benchmark client sends the next turn once the response came;
request ids in send order; a rejected turn ends its conversation.

Expected values are worked out by hand from a constant step time (10 ms, synchronous v1, every prompt
prefilled in one step): a request of O output tokens takes O steps from its first scheduled step, and the
prefix cache holds a block once all 16 of its tokens have been computed (a request computes every token
but its last sampled one). Larger runs check the send rule itself on every turn (`_sends` records which
conversation each request belongs to)."""

import json

import pytest
from conftest import one_line_exit_2

from kvsim.engine.simulate import simulate
from kvsim.fleet.autoscaled import simulate_autoscaled
from kvsim.fleet.driver import simulate_fleet
from kvsim.workload.conversations import Conversations
from kvsim.workload.scenario import make_scenario

STEP_S = 0.01
THINK_S = 0.025
TOL = 1e-6  # a trace's timestamps are read to about 2e-8 s (0.2075 s comes back as 0.20749998 s)


def _trace(tmp_path, rows: list[tuple[float, int, int]]) -> str:
    """An Azure-format trace: (seconds after 46 s past the minute, prompt tokens, output tokens) per row."""
    lines = "".join(f"2023-11-16 18:15:{46 + t:09.6f},{p},{o}\n" for t, p, o in rows)
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + lines)
    return str(path)


def _hand_scenario(tmp_path, timing: str = "after_reply", **workload) -> dict:
    """Two conversations of three turns, every new message 10 tokens and every reply 10; conversation 0
    starts at 0, conversation 1 at 0.2075 s (rows 3..5: only a conversation's first row's time is read)."""
    rows = [(0.0, 10, 10)] * 3 + [(0.2075, 10, 10)] * 3
    return {"model": "llama-3.1-8b", "gpu": "h100-80gb", "steps": "none",
            "engine": {"scheduler": "v1", "async_scheduling": False, "enable_prefix_caching": True, "block_size": 16},
            "latency": {"model": "constant", "step_s": STEP_S},
            "workload": {"num_requests": 6, "arrival": {"process": "trace"},
                         "trace": {"format": "azure", "path": _trace(tmp_path, rows)},
                         "multi_turn": {"turns": 3, "think_time_s": THINK_S, "timing": timing}, **workload}}


class _Sends(list):
    """(request_id, conversation) of every request sent, in send order; `in_progress`: how many
    conversations kept a history at each send; `conversations`: the run's `Conversations`."""

    in_progress: list[int]
    conversations: Conversations | None = None


@pytest.fixture
def sends(monkeypatch):
    log = _Sends()
    log.in_progress = []
    send = Conversations.send

    def spy(self, conv, request_id, arrival_s):
        log.append((request_id, conv))
        log.in_progress.append(self.num_in_progress)
        log.conversations = self
        return send(self, conv, request_id, arrival_s)
    monkeypatch.setattr(Conversations, "send", spy)
    return log


def test_two_conversations_by_hand(tmp_path, sends):
    """Each turn takes 10 steps (100 ms): a prefill step gives the first token, 9 decode steps the rest.

    conv 0 turn 0: sent 0,        runs 0 → 0.10
    conv 0 turn 1: sent 0.125,    runs 0.125 → 0.225     (0.10 + think)
    conv 1 turn 0: sent 0.2075,   joins the step at 0.215, ends 0.315
    conv 0 turn 2: sent 0.25,     joins the step at 0.255, ends 0.355   (0.225 + think)
    conv 1 turn 1: sent 0.34,     joins the step at 0.345, ends 0.445   (0.315 + think)
    conv 1 turn 2: sent 0.47,     engine idle, ends 0.57                (0.445 + think)

    Ids in send order. Prompts: 10, then 10 + 10 + 10 = 30, then 30 + 10 + 10 = 50 tokens. Prefix hits
    (16-token blocks): turn 0 computes 19 of its 20 tokens, so block 0 (its message and 6 reply tokens) is
    cached and turn 1 hits 16; turn 1 computes 39 of 40, blocks 0 and 1, so turn 2 hits 32."""
    result = simulate(make_scenario(_hand_scenario(tmp_path)), check=True)
    r = result.requests.set_index("request_id")
    assert sends == [(0, 0), (1, 0), (2, 1), (3, 0), (4, 1), (5, 1)]
    assert r.arrival_s.tolist() == pytest.approx([0.0, 0.125, 0.2075, 0.25, 0.34, 0.47], abs=TOL)
    assert r.first_scheduled_s.tolist() == pytest.approx([0.0, 0.125, 0.215, 0.255, 0.345, 0.47], abs=TOL)
    assert r.finish_s.tolist() == pytest.approx([0.10, 0.225, 0.315, 0.355, 0.445, 0.57], abs=TOL)
    assert r.prompt_tokens.tolist() == [10, 30, 10, 50, 30, 50]
    assert r.prefix_hit_tokens.tolist() == [0, 16, 0, 32, 16, 32]
    for prev, follow in ((0, 1), (1, 3), (2, 4), (4, 5)):  # exactly the previous turn's end plus the think time
        assert r.arrival_s[follow] == r.finish_s[prev] + THINK_S
    assert (r.status == "finished").all() and "client_queue_s" not in r


def test_open_timing_misses_what_after_reply_hits(tmp_path):
    """Open timing sends conversation 0's turn 1 at 0 + 0.025 s, while turn 0 has computed 12 of its tokens
    (admitted at the step at 0.03: prefill 10, then one decode token a step): no block of its history is
    full yet, so it hits nothing where after_reply's turn 1 hits 16 (above)."""
    result = simulate(make_scenario(_hand_scenario(tmp_path, timing="open")), check=True)
    r = result.requests.set_index("request_id")
    assert r.arrival_s[1] == pytest.approx(THINK_S)
    assert r.prompt_tokens[1] == 30 and r.prefix_hit_tokens[1] == 0


def test_behind_a_closed_loop_cap_by_hand(tmp_path):
    """With max_concurrency 1 a due turn waits for the one slot, first due first sent:
    c0t0 0 → 0.10; c0t1 due 0.125, sent then → 0.225; c1t0 due 0.2075, sent at 0.225 → 0.325;
    c0t2 due 0.25, sent at 0.325 → 0.425; c1t1 due 0.35, sent at 0.425 → 0.525; c1t2 due 0.55 → 0.65."""
    result = simulate(make_scenario(_hand_scenario(tmp_path, max_concurrency=1)), check=True)
    r = result.requests.set_index("request_id")
    assert r.arrival_s.tolist() == pytest.approx([0.0, 0.125, 0.225, 0.325, 0.425, 0.55], abs=TOL)
    assert r.client_queue_s.tolist() == pytest.approx([0.0, 0.0, 0.0175, 0.075, 0.075, 0.0], abs=TOL)
    assert r.finish_s.tolist() == pytest.approx([0.10, 0.225, 0.325, 0.425, 0.525, 0.65], abs=TOL)


def test_a_rejected_turn_ends_its_conversation(tmp_path, sends):
    """max_model_len 45: conversation 0's turn 2 (a 50-token prompt) is rejected on arrival, as vLLM refuses
    it, and the benchmark client drops the conversation; conversation 1 is not touched by it. Turn 1's
    output is capped to 45 − 30 = 15 ≥ 10, so it is unchanged."""
    raw = _hand_scenario(tmp_path)
    raw["engine"]["max_model_len"] = 45
    rows = [(0.0, 10, 10)] * 3 + [(0.2075, 10, 10), (0.2075, 10, 10)]  # conversation 1: two turns only
    raw["workload"].update(num_requests=5, trace={"format": "azure", "path": _trace(tmp_path, rows)})
    r = simulate(make_scenario(raw), check=True).requests.set_index("request_id")
    assert sends == [(0, 0), (1, 0), (2, 1), (3, 0), (4, 1)]
    assert r.status.tolist() == ["finished", "finished", "finished", "rejected", "finished"]
    raw["workload"]["num_requests"] = 6  # a third turn for conversation 1: rejected too, nothing after either
    raw["workload"]["trace"] = {"format": "azure", "path": _trace(tmp_path, rows + [(0.2075, 10, 10)])}
    r = simulate(make_scenario(raw), check=True).requests
    assert len(r) == 6 and (r.status == "rejected").sum() == 2


SMALL_POOL = {"enable_prefix_caching": True, "max_model_len": 4096, "num_gpu_blocks_override": 600}  # preempts


def _random_workload(**extra) -> dict:
    return {"num_requests": 160, "arrival": {"process": "poisson", "rate": 30.0},
            "prompt_len": {"dist": "uniform", "low": 20, "high": 600},
            "output_len": {"dist": "uniform", "low": 5, "high": 120},
            "multi_turn": {"turns": 4, "think_time_s": 0.05, "timing": "after_reply"}, **extra}


def _check_sends(requests, sends, think_s: float | None) -> None:
    """Every turn after a conversation's first is sent at its previous turn's finish plus `think_s` exactly
    (None: at or after that instant, behind a cap), ids are in send order, and every request ended."""
    r = requests.set_index("request_id")
    assert sorted(r.index) == list(range(len(r))) and [i for i, _ in sends] == list(range(len(r)))
    assert (r.arrival_s.diff().dropna() >= 0).all()
    assert set(r.status) <= {"finished", "rejected"}
    last: dict[int, int] = {}
    for request_id, conv in sends:
        if conv in last:
            prev = last[conv]
            assert r.status[prev] == "finished"
            due = r.finish_s[prev] + 0.05
            assert r.arrival_s[request_id] == due if think_s is not None else r.arrival_s[request_id] >= due
        last[conv] = request_id


def test_a_random_run_keeps_the_rule_and_is_deterministic(sends):
    """Poisson first turns into a small pool (it preempts): every follow-up exactly at its previous turn's
    end plus the think time; the same run twice gives the same tables; behind a cap of 4 a due turn may wait,
    never less. Only the conversations in progress keep their history."""
    raw = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "steps": "none", "engine": SMALL_POOL,
           "workload": _random_workload()}
    first = simulate(make_scenario(raw), check=True)
    _check_sends(first.requests, sends, 0.05)
    assert len(first.requests) == 160 and len({c for _, c in sends}) == 40
    assert first.summary["num_preemptions"] > 0 and first.summary["num_prefix_cache_hit_tokens"] > 0
    # only conversations in progress keep their history (kept for ever, the last start would see 39), none at the end
    assert max(sends.in_progress) < 39 and sends.conversations.num_in_progress == 0
    again = simulate(make_scenario(raw))
    assert again.requests.equals(first.requests)
    assert json.dumps(again.summary, sort_keys=True) == json.dumps(first.summary, sort_keys=True)
    sends.clear()
    capped = simulate(make_scenario({**raw, "workload": _random_workload(max_concurrency=4)}), check=True)
    _check_sends(capped.requests, sends, None)
    assert (capped.requests.client_queue_s > 0).any()


@pytest.mark.parametrize("where", ["data_parallel", "fleet", "autoscaled"])
def test_groups_and_fleets(where, sends):
    """Two DP ranks, two replicas behind the default router, an autoscaled fleet: the same rule, and the
    invariants hold after every step."""
    raw = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "steps": "none", "workload": _random_workload(),
           "engine": dict(SMALL_POOL)}
    if where == "data_parallel":
        raw["engine"]["data_parallel_size"] = 2
        result = simulate(make_scenario(raw), check=True)
    elif where == "fleet":
        result = simulate_fleet(make_scenario({**raw, "replicas": 2, "router": {"policy": "affinity"}}),
                                check=True)
    else:
        raw.update(replicas=1, router={"policy": "least_outstanding"},
                   autoscaler={"max_replicas": 3, "startup_s": 0.5, "sync_period_s": 0.5, "target": 1})
        result = simulate_autoscaled(make_scenario(raw), check=True)
    _check_sends(result.requests, sends, 0.05)
    assert len(result.requests) == 160


def test_open_is_left_out_of_a_written_scenario(tmp_path):
    """A scenario that does not set timing writes what it always wrote (no new line in `scenario.yaml`);
    after_reply is written and read back."""
    for timing in ("open", "after_reply"):
        written = make_scenario(_hand_scenario(tmp_path, timing=timing)).dump_into(tmp_path)
        assert ("timing" in written["workload"]["multi_turn"]) is (timing == "after_reply")
        assert make_scenario(written).workload.multi_turn.timing == timing


def _disagg(tmp_path) -> str:
    path = tmp_path / "d.yaml"
    path.write_text(
        "workload: {num_requests: 10, arrival: {process: poisson, rate: 1},\n"
        "  multi_turn: {turns: 2, timing: after_reply},\n"
        "  prompt_len: {dist: fixed, value: 10}, output_len: {dist: fixed, value: 10}}\n"
        "replicas: [{count: 1, kv_role: kv_producer}, {count: 1, kv_role: kv_consumer}]\n"
        "kv_transfer_config: {}\nrouter: null\n")
    return str(path)


AFTER_REPLY = ["--set", "workload.multi_turn={turns: 2, timing: after_reply}"]


@pytest.mark.parametrize(("command", "message"), [
    (["run", "--set", "workload.multi_turn={turns: 2, timing: closed}"], "workload.multi_turn.timing"),
    (["run", "DISAGG"], "workload.multi_turn.timing=after_reply with kv_transfer_config: a client that waits for "
                        "each reply in front of a disaggregated fleet is not modelled"),
    (["plan", *AFTER_REPLY, "--slo", "ttft_s.p90=2", "--gpu", "h100-80gb", "--workers", "1"],
     "workload.multi_turn.timing=after_reply: plan sizes a fleet for open-loop traffic"),
    (["report", *AFTER_REPLY, "--quick"],
     "workload.multi_turn.timing=after_reply: kvsim report studies open-loop traffic at several rates"),
], ids=["bad-value", "disagg", "plan", "report"])
def test_refusals(tmp_path, command, message):
    """One line, exit 2, nothing written."""
    command = [_disagg(tmp_path) if arg == "DISAGG" else arg for arg in command]
    out = tmp_path / "out"
    assert message in one_line_exit_2([*command, "-o", str(out)])
    assert not out.exists()
