"""`workload.multi_turn.timing: after_reply` against two independent derivations.

1. A naive second implementation (`_reference`): a synchronous v1 engine of constant step time, every waiting
   request admitted at the next step (no budget binds, no preemption), one token per running request per step,
   and a chat client that sends turn k + 1 at finish(turn k) + think. A prompt is the conversation so far; it
   hits every full 16-token block its previous turn computed (all its prompt and reply tokens but the last
   sampled one). Its tie rule is kvsim's, stated: a send due exactly when a busy engine ends a step is made
   after the step planned at that instant (it joins the one after); an idle engine wakes at the send. With a
   constant step time such ties are common, not rare: an engine that restarts on a follow-up steps on the grid
   finish + think that every other follow-up of the same grid is also sent on.
2. A fixed point on a pool that preempts: the run's sends (ids, instants, contents) replayed through the
   open-loop path give the very same table, so every turn's timing follows from the engine alone.
"""

import copy
import heapq
import random

import numpy as np
import pytest

import kvsim.engine.simulate as simulate_module
from kvsim.engine.simulate import simulate
from kvsim.workload.conversations import Conversations
from kvsim.workload.generate import RequestStream
from kvsim.workload.scenario import make_scenario

BLOCK = 16
STEP_S = 0.0125


def _reference(first_s: list[float], lengths: list[list[tuple[int, int]]], step_s: float,
               think_s: float) -> dict[int, dict]:
    """Every request's row by id (ids in send order): conversation, arrival, first scheduled, finish, prompt,
    prefix hit. `lengths[c][k]`: (new message tokens, output tokens) of turn k of conversation c."""
    due = [(s, 1, c) for c, s in enumerate(first_s)]  # (instant, 0 follow-up / 1 first turn, conversation)
    heapq.heapify(due)
    turn, context, cached = [0] * len(first_s), [0] * len(first_s), [0] * len(first_s)
    rows: dict[int, dict] = {}
    waiting: list[list[int]] = []
    running: list[list[int]] = []  # [id, conversation, tokens still to generate]

    def send() -> None:
        at_s, _, c = heapq.heappop(due)
        message, output = lengths[c][turn[c]]
        prompt = context[c] + message
        rows[len(rows)] = {"conv": c, "arrival_s": at_s, "prompt": prompt, "output": output,
                           "hit": min(cached[c], (prompt - 1) // BLOCK * BLOCK)}
        waiting.append([len(rows) - 1, c, output])

    now = 0.0
    while due or waiting or running:
        if not waiting and not running:  # idle: wake at the next send, with every send due then
            now = due[0][0]
            while due and due[0][0] <= now:
                send()
        for request in waiting:
            rows[request[0]]["first_scheduled_s"] = now
        running += waiting
        waiting = []
        end = now + step_s
        while due and due[0][0] < end:  # sent while the step runs (one due at `end` exactly: after the next plan)
            send()
        now = end
        for request in running:
            request[2] -= 1
            if request[2] == 0:
                row, c = rows[request[0]], request[1]
                row["finish_s"] = now
                context[c] = row["prompt"] + row["output"]
                cached[c] = (context[c] - 1) // BLOCK * BLOCK
                turn[c] += 1
                if turn[c] < len(lengths[c]):
                    heapq.heappush(due, (now + think_s, 0, c))
        running = [request for request in running if request[2] > 0]
    return rows


def _azure(tmp_path, rows: list[tuple[float, int, int]]) -> str:
    lines = "".join(f"2023-11-16 18:{(46 + t) // 60:02.0f}:{(46 + t) % 60:09.6f},{p},{o}\n" for t, p, o in rows)
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + lines)
    return str(path)


@pytest.mark.parametrize(("seed", "think_s"), [(5, 0.05371234567), (9, 0.05371234567), (2, 0.0), (3, 3 * STEP_S)])
def test_every_request_matches_a_naive_reference(tmp_path, seed, think_s):
    """20 conversations of 3 turns, Poisson starts, random lengths: every request's id, arrival, first
    scheduled step, finish, prompt and prefix hit as the reference gives them. Seeds 5 and 9 send follow-ups
    exactly on a busy engine's step end; a think time of 0 or of whole steps does so on every busy engine."""
    rnd = random.Random(seed)
    first_s, lengths, rows = [], [], []
    start_s = 0.0
    for c in range(20):
        start_s = round(start_s + (rnd.expovariate(5.0) if c else 0.0), 6)
        first_s.append(start_s)
        lengths.append([(rnd.randint(5, 200), rnd.randint(1, 60)) for _ in range(3)])
        rows += [(start_s, message, output) for message, output in lengths[-1]]
    raw = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "steps": "none",
           "engine": {"scheduler": "v1", "async_scheduling": False, "enable_prefix_caching": True, "block_size": BLOCK,
                      "max_num_batched_tokens": 65536, "max_model_len": 8192,
                      "num_gpu_blocks_override": 4000},  # all 60 turns' blocks (< 1,200): nothing is evicted
           "latency": {"model": "constant", "step_s": STEP_S},
           "workload": {"num_requests": 60, "arrival": {"process": "trace"},
                        "trace": {"format": "azure", "path": _azure(tmp_path, rows)},
                        "multi_turn": {"turns": 3, "think_time_s": think_s, "timing": "after_reply"}}}
    got = simulate(make_scenario(raw), check=True).requests.set_index("request_id").sort_index()
    want = _reference(first_s, lengths, STEP_S, think_s)
    assert list(got.index) == list(want)
    for column, key in (("arrival_s", "arrival_s"), ("first_scheduled_s", "first_scheduled_s"),
                        ("finish_s", "finish_s")):  # the trace's instants are read to about 2e-8 s
        assert got[column].tolist() == pytest.approx([want[i][key] for i in want], abs=1e-6), column
    for column, key in (("prompt_tokens", "prompt"), ("output_tokens", "output"), ("prefix_hit_tokens", "hit")):
        assert got[column].tolist() == [want[i][key] for i in want], column
    assert got.prefix_hit_tokens.sum() > 0


def _pool(seed: int, timing: str, **engine) -> dict:
    return {"model": "llama-3.1-8b", "gpu": "h100-80gb", "steps": "none", "seed": seed,
            "engine": {"enable_prefix_caching": True, "max_model_len": 4096, "num_gpu_blocks_override": 500, **engine},
            "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 40.0},
                         "prompt_len": {"dist": "uniform", "low": 20, "high": 600},
                         "output_len": {"dist": "uniform", "low": 5, "high": 120},
                         "multi_turn": {"turns": 3, "think_time_s": 0.05, "timing": timing}}}


@pytest.mark.parametrize(("seed", "engine"), [(3, {}), (1, {"async_scheduling": False})])  # seeds that preempt
def test_replaying_the_sends_open_loop_gives_the_same_run(monkeypatch, seed, engine):
    """A pool of 500 blocks preempts; the sends of the after_reply run, fed to the open-loop path as a stream
    (the same draws made first, so the run's generator is where it was), give an identical requests table."""
    sent = []
    send = Conversations.send

    def spy(self, conv, request_id, arrival_s):
        req = send(self, conv, request_id, arrival_s)
        sent.append(copy.deepcopy(req))  # before the run hashes its content
        return req
    monkeypatch.setattr(Conversations, "send", spy)
    after = simulate(make_scenario(_pool(seed, "after_reply", **engine)), check=True)
    assert after.summary["num_preemptions"] > 0 and after.summary["num_prefix_cache_hit_tokens"] > 0
    iter_requests = simulate_module.iter_requests

    def replay(scenario, max_model_len, rng):
        iter_requests(scenario, max_model_len, rng)
        return RequestStream(np.array([req.arrival_s for req in sent]), iter(sent))
    monkeypatch.setattr(simulate_module, "iter_requests", replay)
    again = simulate(make_scenario(_pool(seed, "open", **engine)), check=True)
    assert again.requests.equals(after.requests)


def test_one_turn_is_the_open_run():
    """Conversations of one turn: after_reply sends exactly what open timing sends (Poisson arrivals and
    step times from the roofline, so no send falls on a step's end)."""
    runs = []
    for timing in ("open", "after_reply"):
        raw = _pool(4, timing)
        raw["workload"]["multi_turn"]["turns"] = 1
        runs.append(simulate(make_scenario(raw)))
    assert runs[0].requests.equals(runs[1].requests)
    assert runs[0].summary == runs[1].summary
