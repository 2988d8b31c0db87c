"""Priority scheduling (vLLM's --scheduling-policy priority) on hand-built queues, and priority classes."""

import numpy as np
import pytest

import kvsim
from kvsim.engine.builder import check_engine
from kvsim.fleet.driver import simulate_fleet
from kvsim.kv import PagedAllocator
from kvsim.model.errors import KvsimError
from kvsim.sched import SchedulerLimits, make_request_queue, make_scheduler
from kvsim.workload.generate import build_requests
from kvsim.workload.scenario import resolve_scenario
from tests.conftest import make_request


def world(policy, num_blocks=4, max_num_seqs=8):
    """A pool of `num_blocks` − 1 usable blocks of 16 tokens (block 0 is vLLM's null block)."""
    alloc = PagedAllocator(num_blocks, 16, enable_caching=False)
    return make_scheduler("v1", alloc, SchedulerLimits(max_num_seqs, 64, 128), waiting=make_request_queue(policy))



def _with(req, priority):
    req.priority = priority
    return req


def test_waiting_is_served_by_priority_then_arrival():
    sched = world("priority", num_blocks=11, max_num_seqs=1)
    for rid, arrival, priority in [(0, 0.0, 1), (1, 1.0, 0), (2, 2.0, 0)]:
        sched.add(_with(make_request(rid, arrival, 8, 4), priority))
    order = []
    now = 0.0
    while sched.has_work:
        plan = sched.schedule(now)
        order += [r.request_id for r, _ in plan.scheduled if r.request_id not in order]
        now += 1.0
        sched.complete(plan, now)
    assert order == [1, 2, 0]  # priority 0 first (arrival 1 before 2), then priority 1


def three_running(policy):
    """A (priority 0, prompt 8) and B (2, prompt 8) run first; C (1, prompt 16) arrives after them and is
    admitted behind them, so `running` is A, B, C with one of the 3 usable blocks each, every one having
    sampled a token. Next step A and B write a token into their own block, C's token 17 needs a fourth
    block: someone must be preempted."""
    sched = world(policy)
    a, b, c = _with(make_request(0, 0.0, 8, 10), 0), _with(make_request(1, 0.1, 8, 10), 2), \
        _with(make_request(2, 0.2, 16, 10), 1)
    sched.add(a)
    sched.add(b)
    plan = sched.schedule(0.0)
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(0, 8), (1, 8)]
    sched.complete(plan, 1.0)
    sched.add(c)
    plan = sched.schedule(1.0)
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(0, 1), (1, 1), (2, 16)]
    sched.complete(plan, 2.0)
    assert sched.running == [a, b, c] and sched.alloc.pool.num_free_blocks == 0
    return sched, (a, b, c)


def test_priority_preempts_the_lowest_priority_and_refunds_its_scheduled_tokens():
    sched, (a, b, c) = three_running("priority")
    plan = sched.schedule(2.0)
    # victim: max (priority, arrival) = B, already scheduled this step: taken out of the plan, budget
    # refunded; its block goes to C
    assert plan.preempted == [b]
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(0, 1), (2, 1)]
    assert (plan.num_tokens, plan.num_decode_seqs, plan.sum_context_tokens) == (2, 2, 10 + 17)
    assert sched.running == [a, c] and list(sched.waiting) == [b] and b.num_computed_tokens == 0
    sched.alloc.check_invariants()
    sched.complete(plan, 3.0)
    assert (a.num_output_tokens, b.num_output_tokens, c.num_output_tokens) == (3, 2, 2)


def test_fcfs_preempts_the_last_admitted_instead():
    sched, (a, b, c) = three_running("fcfs")
    plan = sched.schedule(2.0)
    assert plan.preempted == [c]  # the most recently admitted: C itself
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(0, 1), (1, 1)]
    assert sched.running == [a, b]


def test_class_mix_draws_one_class_per_conversation_without_disturbing_other_draws():
    raw = {"workload": {"num_requests": 400, "arrival": {"process": "poisson", "rate": 5},
                        "prompt_len": {"dist": "uniform", "low": 10, "high": 50},
                        "output_len": {"dist": "uniform", "low": 5, "high": 20},
                        "multi_turn": {"turns": 2, "think_time_s": 1.0}}}
    mix = {"classes": [{"name": "chat", "priority": 0, "weight": 1}, {"name": "batch", "priority": 5, "weight": 3}]}
    plain = build_requests(resolve_scenario(raw), 4096, np.random.default_rng(0))
    with_mix = build_requests(resolve_scenario(raw, {"workload.priority": mix}), 4096, np.random.default_rng(0))
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in plain] == \
        [(r.arrival_s, r.prompt_len, r.output_len) for r in with_mix]
    assert {r.priority for r in plain} == {0}
    share = np.mean([r.priority == 5 for r in with_mix])
    assert share == pytest.approx(0.75, abs=0.08)  # 200 conversations, weight 3 of 4
    by_conversation = {}
    for r in with_mix:  # both turns of a conversation share "user" segment ids (conv, turn)
        conv = r.content.segments[-2][0][1]
        by_conversation.setdefault(conv, set()).add(r.priority)
    assert all(len(p) == 1 for p in by_conversation.values())


def test_priority_run_reports_per_class_latency_and_fcfs_output_is_unchanged():
    base = {"workload": {"num_requests": 120, "arrival": {"process": "poisson", "rate": 200},
                         "prompt_len": {"dist": "fixed", "value": 512}, "output_len": {"dist": "fixed", "value": 64}},
            "engine": {"num_gpu_blocks_override": 400, "max_model_len": 2048}}
    plain = kvsim.simulate(base).summary
    assert "by_priority" not in plain
    mix = {"classes": [{"name": "chat", "priority": 0, "weight": 1}, {"name": "batch", "priority": 1, "weight": 1}]}
    result = kvsim.simulate(base, check=True, workload__priority=mix, engine__scheduling_policy="priority")
    classes = result.summary["by_priority"]
    assert set(classes) == {"0", "1"}
    assert classes["0"]["num_requests"] + classes["1"]["num_requests"] == 120
    assert classes["0"]["ttft_s"]["mean"] < classes["1"]["ttft_s"]["mean"]  # a burst: class 0 jumps the queue
    assert "priority" in result.requests.columns


def test_bad_priority_input_is_one_line():
    with pytest.raises(KvsimError, match=r"workload.priority.classes.0.weight=0: Input should be greater than 0"):
        resolve_scenario({"workload": {"prompt_len": {"dist": "fixed", "value": 8},
                                       "output_len": {"dist": "fixed", "value": 8},
                                       "priority": {"classes": [{"name": "a", "priority": 0, "weight": 0}]}}})
    with pytest.raises(KvsimError, match="class name 'a' appears twice"):
        resolve_scenario({"workload": {"prompt_len": {"dist": "fixed", "value": 8},
                                       "output_len": {"dist": "fixed", "value": 8},
                                       "priority": {"classes": [{"name": "a", "priority": 0, "weight": 1},
                                                                {"name": "a", "priority": 1, "weight": 1}]}}})
    with pytest.raises(KvsimError, match="scheduling_policy=priority needs scheduler v1"):
        resolve_scenario({"engine": {"scheduler": "v0", "scheduling_policy": "priority"},
                          "workload": {"prompt_len": {"dist": "fixed", "value": 8},
                                       "output_len": {"dist": "fixed", "value": 8}}})


@pytest.mark.parametrize("seed", range(6))
def test_a_fleet_whose_replicas_saw_different_priorities_merges_them(seed):
    """Two replicas, two requests of random classes: one replica's requests may all be priority 0 (its table
    then has no `priority` column) while the other's are not. The fleet's table has every request's
    priority, the one the workload drew for it (the same draw as one engine's run of the same scenario),
    and its summary the per-class figures; it used to stop on a KeyError."""
    mix = ("workload.priority={classes: [{name: hi, priority: 0, weight: 1}, {name: lo, priority: 1, weight: 1}]}",
           "workload.num_requests=2", "engine.scheduling_policy=priority", f"seed={seed}", "steps=none")
    fleet = simulate_fleet(resolve_scenario(None, [*mix, "replicas=2"]))
    drawn = [r.priority for r in build_requests(resolve_scenario(None, list(mix)), 131072, np.random.default_rng(seed))]
    requests = fleet.requests.sort_values("request_id")
    if any(drawn):
        assert requests["priority"].tolist() == drawn
        assert set(fleet.summary["by_priority"]) == {str(p) for p in drawn}
    else:  # every request priority 0: the table and summary a run without priorities writes
        assert "priority" not in requests and "by_priority" not in fleet.summary


def test_ties_go_by_arrival_not_by_id_when_the_two_disagree():
    """vLLM's `Request.__lt__`: priority, then arrival_time, and the id only between equal arrivals. Ids
    5, 3, 4, 1 arrive at 2.0, 1.0, 1.0 and 0.5 with priorities 0, 0, 0, 1: the queue pops 3 and 4 (arrival
    1.0; ids decide only between these two), then 5 (arrival 2.0, a larger id than both), then 1 (priority 1,
    though the earliest arrival and the smallest id). Among running 5, 3, 4 of priority 0 the victim is the
    latest arrival, 5, not the largest id."""
    queue = make_request_queue("priority")
    requests = {rid: _with(make_request(rid, arrival, 8, 4), priority)
                for rid, arrival, priority in [(5, 2.0, 0), (3, 1.0, 0), (4, 1.0, 0), (1, 0.5, 1)]}
    for req in requests.values():
        queue.add(req)
    assert [req.request_id for req in queue] == [3, 4, 5, 1]
    assert [queue.pop().request_id for _ in range(4)] == [3, 4, 5, 1]
    running = [requests[5], requests[3], requests[4]]
    assert running[queue.victim_index(running)].request_id == 5


V0_MIX = ("--set", "engine.scheduler=v0", "--set", "workload.num_requests=20", "--set",
          "workload.priority={classes: [{name: chat, priority: 0, weight: 1}, {name: batch, priority: 5, weight: 1}]}")


def test_v0_refuses_a_nonzero_priority_before_writing_anything(tmp_path):
    """vLLM v0's `LLMEngine.add_request` raises "Got priority 5 but Priority scheduling is not enabled." for a request
    of a nonzero priority under fcfs (vllm/engine/llm_engine.py), and v0's priority policy is refused here: so a v0
    engine can serve priority 0 only. kvsim ran such a run and served the priority-5 requests as FCFS."""
    from conftest import one_line_exit_2  # tests/ is on sys.path

    line = one_line_exit_2(["run", *V0_MIX, "-o", str(tmp_path / "out")])
    assert line.startswith("workload.priority.classes.1.priority=5: scheduler v0 rejects every request of a nonzero "
                           "priority under fcfs")
    assert not (tmp_path / "out").exists()
    # v1 under fcfs accepts the priority and ignores it; v0 serves a mix of priority 0 alone
    lengths = {"prompt_len": {"dist": "fixed", "value": 64}, "output_len": {"dist": "fixed", "value": 8}}
    assert kvsim.simulate({"workload": {"num_requests": 20, **lengths, "priority": {"classes": [
        {"name": "chat", "priority": 0, "weight": 1}]}}}, engine__scheduler="v0").summary["num_requests"] == 20
    with pytest.raises(KvsimError, match=r"workload.trace.priority_column='p': scheduler v0 rejects"):
        check_engine(resolve_scenario({"engine": {"scheduler": "v0"}, "workload": {
            "trace": {"path": str(tmp_path / "t.jsonl"), "format": "lengths", "priority_column": "p"}}}))
