"""vLLM's async scheduling (`engine.async_scheduling`, `kvsim.sched.async_steps`): hand timelines with a
constant 10 ms step, the CPU overhead hidden behind the GPU's step, and vLLM's defaults.

vLLM plans the step that starts at t_k+1 at t_k, when step k starts (right after step k − 1's output),
so that step sees the arrivals up to t_k and still counts a request that finishes in step k in its
`max_num_seqs` slot and KV (vllm/v1/engine/core.py `step_with_batch_queue`, vllm/v1/core/sched/
async_scheduler.py). Each expected time below follows from that rule alone. A request's
`first_scheduled_s` is when the step that first schedules it was planned, as vLLM stamps its SCHEDULED
event (`scheduled_ts`, whence `vllm:request_queue_time_seconds`) in that plan: the start of the step
before the one that runs it while a step runs, the step's own start when the engine was idle.
"""

import pytest
from pydantic import ValidationError

from kvsim.engine.simulate import simulate
from kvsim.fleet.disagg import simulate_disagg
from kvsim.latency.base import burst_step_times
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import EngineConfig
from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import load_scenario
from tests.conftest import REPO, make_request, run, tiny_world


def times(req):
    return (round(req.first_scheduled_s, 9), round(req.first_token_s, 9), round(req.finish_s, 9))


def async_world(**kwargs):
    scheduler = tiny_world(**kwargs)
    scheduler.async_scheduling = True
    return scheduler


@pytest.mark.parametrize("bursts", [True, False])
def test_a_request_arriving_mid_step_joins_the_step_after_the_next(bursts):
    a = make_request(0, 0.0, prompt=10, output=5)
    b = make_request(1, 0.015, prompt=5, output=2)
    rec = run(async_world(), [a, b], bursts=bursts)
    # A prefills in [0, .01) and decodes one token a step to .05. B arrives at .015, inside the step
    # [.01, .02): the step at .02 was planned at .01, before B came; the one at .03, planned at .02, takes it.
    assert times(a) == (0.0, 0.01, 0.05)
    assert times(b) == (0.02, 0.04, 0.05)  # scheduled when planned (.02), prefilled in [.03, .04)
    frame = rec.frame()
    assert list(frame["time_s"]) == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04])
    assert list(frame["num_batched_tokens"]) == [10, 1, 1, 6, 2]
    assert list(frame["vllm:num_requests_waiting"]) == [0, 0, 1, 0, 0]  # arrived, not yet seen: waiting


def test_without_async_scheduling_the_next_step_takes_it():
    a = make_request(0, 0.0, prompt=10, output=5)
    b = make_request(1, 0.015, prompt=5, output=2)
    run(tiny_world(), [a, b])
    assert times(b) == (0.02, 0.03, 0.04)


@pytest.mark.parametrize(("max_num_seqs", "b_times"), [(2, (0.02, 0.04, 0.04)), (3, (0.01, 0.03, 0.03))])
def test_a_finished_request_keeps_its_slot_while_the_next_step_is_planned(max_num_seqs, b_times):
    # A and C prefill at 0; B arrives at .005 (seen by the step planned at .01, which starts at .02).
    # A's second and last token comes out of the step [.01, .02): the step at .02 was planned at .01 with
    # A still in its slot, so with 2 slots (A and C) B must wait for the step planned at .02 (starting at
    # .03), after A's output freed its slot; with 3 slots B takes the step at .02 (planned at .01).
    a = make_request(0, 0.0, prompt=4, output=2)
    c = make_request(2, 0.0, prompt=4, output=6)
    b = make_request(1, 0.005, prompt=4, output=1)
    run(async_world(max_num_seqs=max_num_seqs), [a, c, b])
    assert times(a) == (0.0, 0.01, 0.02)
    assert times(b) == b_times


def test_an_idle_engine_plans_at_once():
    a = make_request(0, 0.0, prompt=4, output=1)
    b = make_request(1, 5.0, prompt=4, output=1)
    rec = run(async_world(), [a, b])
    assert times(b) == (5.0, 5.01, 5.01)
    assert list(rec.frame()["time_s"]) == pytest.approx([0.0, 5.0])  # no polling steps in between


def test_the_last_running_request_finishing_leaves_nothing_to_wait_for():
    # B arrives during A's last step: vLLM's step planned at .01 is empty (A is skipped, B not yet seen),
    # takes no time, and the next plan, made at once, takes B: it starts at .02 as without async.
    a = make_request(0, 0.0, prompt=4, output=2)
    b = make_request(1, 0.015, prompt=4, output=1)
    run(async_world(), [a, b])
    assert times(b) == (0.02, 0.03, 0.03)


@pytest.mark.parametrize(("b_arrival_s", "b_times", "c_times"), [
    # B and C arrive during A's last step: the plan made at .01 (A skipped, nothing seen) is empty; A's output, at
    # .02, frees its slot before the next plan, made at once, which takes both B and C into the step at .02
    (0.015, (0.02, 0.03, 0.03), (0.02, 0.03, 0.03)),
    # B arrives before A's last step: the plan made at .01 takes B beside A (still in its slot) into the step at .02;
    # C, seen by the plan made at .02 (A's slot free, B's still held), runs at .03
    (0.005, (0.01, 0.03, 0.03), (0.02, 0.04, 0.04)),
])
def test_the_last_running_request_finishing_frees_its_slot_before_a_plan_made_after_its_output(
        b_arrival_s, b_times, c_times):
    a = make_request(0, 0.0, prompt=4, output=2)
    b = make_request(1, b_arrival_s, prompt=4, output=1)
    c = make_request(2, 0.015, prompt=4, output=1)
    run(async_world(max_num_seqs=2), [a, b, c])
    assert (times(b), times(c)) == (b_times, c_times)


def roofline(**kwargs):
    return RooflineLatency(load_model("llama-3.1-8b"), load_gpu("h100-80gb"), EngineConfig(), **kwargs)


def plans():
    decode, prefill = StepPlan(), StepPlan()
    decode.add_decodes(8, 8 * 1000, 1000, 1000)
    prefill.add(512, 0, 1, logits_row=True)
    return decode, prefill


@pytest.mark.parametrize("overhead_s", [1e-6, 2e-4, 1.0])
def test_the_cpu_overhead_hides_behind_the_gpu_step(overhead_s):
    """A step lasts max(GPU terms, CPU overhead) with async scheduling, GPU + CPU without: the GPU terms
    are the step of an engine with no overhead at all."""
    gpu_only = roofline(overhead_s=0.0)
    hidden = roofline(overhead_s=overhead_s, overlap_cpu=True)
    serial = roofline(overhead_s=overhead_s)
    for plan in plans():
        gpu_s = gpu_only.step_time(plan)
        assert hidden.step_time(plan) == max(gpu_s, overhead_s)
        assert serial.step_time(plan) == pytest.approx(gpu_s + overhead_s, rel=1e-12)
    assert hidden.step_time(StepPlan()) == 0.0  # a step that computes nothing takes no time either way


@pytest.mark.parametrize("overhead_s", [1e-6, 1.0])
def test_burst_step_times_hide_the_overhead_bit_for_bit(overhead_s):
    latency = roofline(overhead_s=overhead_s, overlap_cpu=True)
    first = plans()[0]
    times_s = burst_step_times(latency, first)
    for i in range(5):
        plan = StepPlan()
        plan.add_decodes(8, 8 * (1000 + i), 1000 + i, 1000 + i)
        assert next(times_s) == latency.step_time(plan)


@pytest.mark.parametrize(("engine", "expected"), [
    ({}, True), ({"scheduler": "v0"}, False), ({"scheduler": "static"}, False), ({"async_scheduling": False}, False),
    ({"speculative_config": {"method": "eagle", "num_speculative_tokens": 2, "acceptance_length": 2.0}}, True),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "acceptance_length": 2.0}}, False),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "acceptance_length": 2.0}, "async_scheduling": False}, False),
])
def test_vllms_default(engine, expected):
    """On for the v1 engine (vLLM PR #27614), with speculative decoding for EAGLE drafts only (PR #31998)."""
    assert EngineConfig(**engine).resolved_async_scheduling is expected


def test_async_ngram_drafting_is_refused_as_vllm_refuses_it():
    """vllm/config/vllm.py `VllmConfig.__post_init__`: an explicit `async_scheduling=True` with a `method` that is
    not an EAGLE/MTP type (nor `ngram_gpu`) raises ValueError; only the default (None) falls back to synchronous."""
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "acceptance_length": 2.0}
    with pytest.raises(ValidationError, match="async_scheduling=true with speculative_config.method=ngram"):
        EngineConfig(speculative_config=ngram, async_scheduling=True)
    assert EngineConfig(speculative_config=ngram).resolved_async_scheduling is False


def test_async_scheduling_is_v1s():
    with pytest.raises(ValidationError, match="async_scheduling=true needs scheduler v1 \\(got v0\\)"):
        EngineConfig(scheduler="v0", async_scheduling=True)


def test_the_default_scenario_runs_async_and_can_be_told_not_to():
    on = simulate(load_scenario(None, {"workload.num_requests": 200}))
    off = simulate(load_scenario(None, {"workload.num_requests": 200, "engine.async_scheduling": False}))
    # the same requests; async plans later (TTFT up by about a step) and hides the CPU overhead (TPOT down)
    assert on.summary["ttft_s"]["mean"] > off.summary["ttft_s"]["mean"]
    assert on.summary["tpot_s"]["mean"] < off.summary["tpot_s"]["mean"]


def test_a_disaggregated_instance_steps_synchronously():
    path = REPO / "scenarios" / "disagg-1p1d.yaml"
    with pytest.raises(KvsimError, match="engine.async_scheduling=true: a disaggregated instance"):
        simulate_disagg(load_scenario(path, {"engine.async_scheduling": True, "workload.num_requests": 20}))
    assert simulate_disagg(load_scenario(path, {"workload.num_requests": 20})).summary["num_finished"] == 20


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_request_whose_last_token_is_in_flight_is_the_preemption_victim_not_a_running_one(policy):
    """vLLM's `running` still lists a request whose last token is being computed (it leaves when that output is
    processed), and FCFS preempts `running.pop()`: the most recently admitted, finishing or not (priority: the
    lowest priority, here the latest arrival). Blocks of 4, 2 usable; A (prompt 4, output 4) then B (prompt 4,
    output 1) both admitted in step 1: one block each, none free. B's only token comes out of step 1. Planning
    step 2, A's first decode writes its 5th token into a new block: none is free, so vLLM preempts B (its KV
    freed at once, one preemption) and A decodes; A keeps its progress. A then decodes in steps 3 and 4."""
    from kvsim.kv import PagedAllocator
    from kvsim.sched import SchedulerLimits, make_scheduler
    from kvsim.sched.request_queue import make_request_queue

    sched = make_scheduler("v1", PagedAllocator(3, 4, enable_caching=False), SchedulerLimits(8, 64, 64),
                           waiting=make_request_queue(policy))
    sched.async_scheduling = True
    a, b = make_request(0, 0.0, prompt=4, output=4), make_request(1, 0.001, prompt=4, output=1)
    assert sched.add(a) and sched.add(b)
    plan = sched.schedule(0.0)
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(0, 4), (1, 4)]
    sched.complete(plan, 1.0)
    assert b.finish_s == 1.0 and sched.finishing == [b]
    steps = []
    now = 1.0
    while sched.running or sched.waiting:
        plan = sched.schedule(now)
        steps.append(([(r.request_id, n) for r, n in plan.scheduled], [r.request_id for r in plan.preempted]))
        now += 1.0
        sched.complete(plan, now)
        sched.check_invariants()
    assert steps == [([(0, 1)], [1]), ([(0, 1)], []), ([(0, 1)], [])]
    assert sched.num_preemptions == 1 and a.num_preemptions == 0 and a.finish_s == 4.0
    assert sched.records.count(b.status) == 2  # both finished
    rows = sched.records.columns()  # B's row, written when it finished, counts the preemption after it
    assert list(rows["num_preemptions"]) == [0, 1] and list(rows["status"]) == ["finished", "finished"]
