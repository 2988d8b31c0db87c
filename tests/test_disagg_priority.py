"""A priority decode instance reserves pending transfers in its queue's order (vLLM's waiting loop takes
WAITING_FOR_REMOTE_KVS requests from its priority heap), not in hand-off order."""

import json

import pytest
import simpy
from conftest import make_request

from kvsim.engine.clock import Wakeup
from kvsim.fleet.disagg import simulate_disagg
from kvsim.fleet.disagg_checks import synchronous
from kvsim.fleet.disagg_pools import Disaggregation
from kvsim.fleet.driver import replica_engines, replica_scenarios
from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import make_scenario
from tests.test_disagg import BANDWIDTH, LINK_LATENCY_S, PROMPT_BYTES, scenario


def traced_fleet(tmp_path, rows, decode_engine):
    """A 1P1D fleet (`tests.test_disagg.scenario`) replaying `rows` of (arrival ms, priority, output tokens),
    100-token prompts each, its decode instance's engine given `decode_engine`."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 100, "output_length": o, "hash_ids": [i],
                                        "prio": p}) + "\n" for i, (t, p, o) in enumerate(rows)))
    raw = scenario(num_requests=len(rows), decode_engine=decode_engine).model_dump(mode="json")
    raw["workload"] = {"num_requests": len(rows), "arrival": {"process": "trace"}, "prompt_len": None,
                       "output_len": None, "trace": {"format": "mooncake", "path": str(path), "priority_column": "prio"}}
    return make_scenario(raw)


def run(tmp_path, policy):
    # X (priority 0) at 0 ms, A (priority 1) at 20 ms, B (priority 0) at 30 ms; 100-token prompts, 5 tokens out.
    # D's pool of 10 blocks holds one request's 7 (max_model_len 144 makes that pool legal) at a time.
    spec = traced_fleet(tmp_path, [(0, 0, 5), (20, 1, 5), (30, 0, 5)],
                        {"num_gpu_blocks_override": 10, "max_model_len": 144, "scheduling_policy": policy})
    transfers = simulate_disagg(spec, check=True).tables["transfers"]
    return dict(zip(transfers["request_id"], transfers["start_s"], strict=True))


@pytest.mark.parametrize(("policy", "first", "second"), [("priority", 2, 1), ("fcfs", 1, 2)])
def test_pending_transfers_start_in_the_decode_queues_order(tmp_path, policy, first, second):
    """T = 1 ms + 14,680,064 B / 1 GB/s = 15.680064 ms a transfer. X: P [0, 10 ms], transfer [10, 10 + T],
    5 D steps of 10 ms: done at 60 ms + T, its blocks freed. A hands off at 30 ms, B at 40 ms; both wait for
    X's blocks. Then the priority queue takes B (priority 0) before A (1): B's transfer starts at 60 + T,
    its 5 steps end at 110 + 2T, A's transfer starts then. FCFS takes them in hand-off order: A, then B."""
    t = LINK_LATENCY_S + PROMPT_BYTES / BANDWIDTH
    start = run(tmp_path, policy)
    assert start[0] == pytest.approx(0.01, rel=1e-12)
    assert start[first] == pytest.approx(0.06 + t, rel=1e-9)
    assert start[second] == pytest.approx(0.11 + 2 * t, rel=1e-9)


def decode_side():
    """A 1P1D fleet's `Disaggregation`, built but not run, and its decode instance's scheduler."""
    spec = scenario(decode_engine={"scheduling_policy": "priority"})
    specs = [synchronous(s) for s in replica_scenarios(spec)]
    parts, engines, _ = replica_engines(spec, specs, observe_kv=False)
    disagg = Disaggregation(spec, specs, parts, engines)
    disagg.env = simpy.Environment()
    return disagg, engines[1].scheduler


@pytest.mark.parametrize(("local_priority", "reserved"), [(1, True), (0, False)])
def test_a_local_request_blocks_only_the_transfers_it_precedes(local_priority, reserved):
    """D's queue holds a local request L (arrived at 0); R (priority 0, arrived at 1) waits for its blocks.
    L of priority 1 comes after R in vLLM's heap, so R's blocks are reserved now; L of priority 0 (same
    priority, earlier arrival) comes first, and R waits for L, as a FCFS queue makes it wait for any local."""
    disagg, sched = decode_side()
    local, remote = make_request(0, 0.0, 100, 5), make_request(1, 1.0, 100, 5)
    local.priority, remote.priority = local_priority, 0
    sched.waiting.add(local)
    disagg.pending[0].append((remote, 0, 1.0))
    disagg._reserve_on(0)(1.0)
    assert (1 in disagg.in_flight[0]) is reserved and (not disagg.pending[0]) is reserved


def test_equal_priorities_in_the_decode_queue_go_in_hand_off_order():
    """A (client arrival 0 s) and B (0.5 s), both priority 0, reach D in the other order: B's prefill ends at
    1 s, A's at 2 s. D's frontend stamps vLLM's `Request.arrival_time` when the proxy hands the request over,
    so D's heap holds B (1 s) before A (2 s). D's 10 blocks hold one 100-token request's 7 (cdiv(104, 16)):
    B's transfer starts, A waits. By the client's arrival A went first."""
    spec = scenario(decode_engine={"scheduling_policy": "priority", "num_gpu_blocks_override": 10,
                                   "max_model_len": 144})
    specs = [synchronous(s) for s in replica_scenarios(spec)]
    parts, engines, _ = replica_engines(spec, specs, observe_kv=False)
    disagg = Disaggregation(spec, specs, parts, engines)
    disagg.env = simpy.Environment()
    engines[1].wakeup = Wakeup(disagg.env)  # as the run loop gives it
    a, b = make_request(0, 0.0, 100, 5), make_request(1, 0.5, 100, 5)
    for req, handoff_s in ((b, 1.0), (a, 2.0)):
        disagg.output_len[req.request_id] = 5
        req.output_len = 1
        disagg._hand_off_from(0)(req, handoff_s)
    disagg._reserve_on(0)(2.0)
    assert list(disagg.in_flight[0]) == [1]
    assert [req.request_id for req, _, _ in disagg.pending[0]] == [0]


def test_a_stalled_priority_decode_instance_names_the_prefill_instance_its_held_kv_came_from(tmp_path):
    """Regression: with a transfer still pending the stall was a bare simpy RuntimeError ('No scheduled events
    left'), and without one its line said the held KV was 'loaded from engine.kv_offload's tiers' on a decode
    instance with no tier. By hand (10 ms steps, transfers of T = 15.680064 ms, D's 14 usable blocks of 16):
    L (priority 0, 60 tokens out) prefills in [0, 10] ms, moves in [10, 10 + T], and D computes its prompt's
    last token in step 1, [10 + T, 20 + T], then position 100 + j in step j + 2. H (priority 1, at 120 ms)
    prefills in [120, 130]; D, running L, reserves H's 7 blocks at its boundary 120 + T (D full: 7 each), and
    H's KV lands T later, inside step 13. Z (priority 1, at 130 ms) prefills in [130, 140] and finds no free
    block at D's next boundaries: pending. Step 14 (140 + T) computes L's position 112, its 8th block: none is
    free, so L, the only one running, is preempted and frees its 7; it heads the priority queue ((0, 10 ms), its
    hand-off, before H's (1, 130 ms)) and needs 8 blocks (113 tokens) where 7 are free, while H keeps its 7:
    nothing runs and nothing can, vLLM's stall. FCFS admits H, which holds its KV, first; L comes back once H ends and Z
    once L ends (L's 10 blocks and Z's 7 do not fit together): L is preempted once."""
    rows, decode = [(0, 0, 60), (120, 1, 5), (130, 1, 5)], {"num_gpu_blocks_override": 15, "max_model_len": 200}
    fcfs = simulate_disagg(traced_fleet(tmp_path, rows, {**decode, "scheduling_policy": "fcfs"}), check=True)
    t = LINK_LATENCY_S + PROMPT_BYTES / BANDWIDTH
    assert fcfs.tables["transfers"]["start_s"].tolist()[:2] == pytest.approx([0.01, 0.01 + t + 0.11], rel=1e-12)
    requests = fcfs.requests.sort_values("request_id")
    assert requests.num_preemptions.tolist() == [1, 0, 0] and set(requests.status) == {"finished"}
    with pytest.raises(KvsimError) as stall:
        simulate_disagg(traced_fleet(tmp_path, rows, {**decode, "scheduling_policy": "priority"}), check=True)
    message = str(stall.value)
    assert "request 0 (priority 0) heads the queue" in message and "requests [1] behind it" in message
    assert "loaded from a prefill instance (kv_transfer_config)" in message and "kv_offload" not in message


def test_a_preempted_decode_request_keeps_its_hand_off_stamp():
    """vLLM's decode instance keeps one `Request` through a preemption, so its `arrival_time` stays the hand-off
    its frontend stamped: the priority victim is max (priority, arrival_time) and the preempted request goes back
    into the heap by that stamp. A (client 0 s, handed off at 2 s) and B (0.5 s, at 1 s) run, C (0.2 s, at 1.5 s)
    waits, all priority 0: the victim is A (2 s > 1 s; by the client's arrival it was B), and back in the queue A
    comes after C (2 s > 1.5 s; by the client's arrival A, 0 s, went first)."""
    disagg, sched = decode_side()
    engines = disagg.engines
    engines[1].wakeup = Wakeup(disagg.env)  # as the run loop gives it
    a, b, c = make_request(0, 0.0, 100, 5), make_request(1, 0.5, 100, 5), make_request(2, 0.2, 100, 5)
    for req, handoff_s in ((b, 1.0), (c, 1.5), (a, 2.0)):
        disagg.output_len[req.request_id] = 5
        req.output_len = 1
        disagg._hand_off_from(0)(req, handoff_s)
    running = [b, a]  # B admitted first
    victim = running.pop(sched.waiting.victim_index(running))
    assert victim is a
    victim.drop_kv()  # `Scheduler.preempt` by recompute: its KV dropped, back to the queue
    sched.waiting.add(c)
    sched.waiting.prepend(victim)
    assert [sched.waiting.pop().request_id for _ in range(2)] == [2, 0]


def test_a_plan_point_that_stalls_is_a_failed_point_not_the_plan_s_end(tmp_path):
    """A `kvsim plan` point whose run hits the held-KV stall (the fleet of the test above, by hand) stopped the
    whole plan with its line; vLLM's scheduler waits forever there, so that deployment holds no SLO at that load
    and the point fails: verdict stalled, no probe passes, and a longer run of the same traffic stalls too. Its
    rate is what its 3 arrivals offered, by hand (3 − 1) / 0.13 s; its line is kept."""
    from kvsim.model.errors import HeldKvStall
    from kvsim.planning.point import point_metrics
    from kvsim.planning.slo import probe_passes, shortage, why_failed
    from kvsim.planning.window import early_overloaded

    rows, decode = [(0, 0, 60), (120, 1, 5), (130, 1, 5)], {"num_gpu_blocks_override": 15, "max_model_len": 200}
    stalling = traced_fleet(tmp_path, rows, {**decode, "scheduling_policy": "priority"})
    with pytest.raises(HeldKvStall):  # `kvsim run` still stops with the line (a KvsimError: exit 2)
        simulate_disagg(stalling)
    metrics = point_metrics(stalling)
    evidence = metrics["evidence"]
    assert evidence["verdict"] == "stalled" and metrics["num_requests"] == evidence["num_requests"] == 3
    assert "request 0 (priority 0) heads the queue" in evidence["stall"]
    assert metrics["offered_rate_per_s"] == pytest.approx(2 / 0.13, rel=1e-12)
    assert not probe_passes(evidence, {"ttft_s.p90": 1e9}) and not probe_passes(evidence, {})
    assert early_overloaded(evidence) and why_failed(evidence, {}) == "is stalled"
    assert shortage(evidence, metrics["num_preemptions"]).startswith("KV memory (stalled")
    assert json.loads(json.dumps(metrics)) == metrics  # JSON-safe, as points.jsonl stores it


def test_a_sweep_probe_that_stalls_is_a_failed_probe_and_the_rest_are_kept(tmp_path):
    """The rate searches over `run_evidence` (`capacity --sustained`, the report's) read a stalled run as `kvsim
    plan` does: the priority fleet above stalls (by hand, above), so its evidence is verdict stalled with its line
    and no probe passes on it; the same rows under FCFS all finish, 3 requests, under the 50 a window needs: too
    short. Asked for summaries alone, a sweep still stops with the line, as `kvsim run` does."""
    from kvsim.model.errors import HeldKvStall
    from kvsim.planning.slo import probe_passes
    from kvsim.planning.sweep import run_evidence, run_many

    rows, decode = [(0, 0, 60), (120, 1, 5), (130, 1, 5)], {"num_gpu_blocks_override": 15, "max_model_len": 200}
    stalling = traced_fleet(tmp_path, rows, {**decode, "scheduling_policy": "priority"})
    fcfs = traced_fleet(tmp_path, rows, {**decode, "scheduling_policy": "fcfs"})
    stalled, finished = run_evidence([stalling, fcfs], workers=1)
    assert (stalled["verdict"], finished["verdict"]) == ("stalled", "too short")
    assert stalled["num_requests"] == finished["num_requests"] == 3 and not probe_passes(stalled, {})
    assert "request 0 (priority 0) heads the queue" in stalled["stall"]
    with pytest.raises(HeldKvStall):
        run_many([stalling], workers=1)


def test_a_request_s_row_counts_its_preemptions_on_the_prefill_instance_too():
    """docs/metrics.md: a request's `num_preemptions` is the times it was preempted, and a disaggregated fleet's
    summary sums both pools'. The hand-off zeroed the count (D's vLLM `Request` is new: its first admission there
    is no re-admission), so a request preempted twice on P and once on D showed 1. By definition: 2 + 1 = 3,
    while D's own count starts at 0."""
    from kvsim.results.records import RequestRecords

    disagg, _ = decode_side()
    disagg.engines[1].wakeup = Wakeup(disagg.env)  # as the run loop gives it
    req = make_request(0, 0.0, 100, 5)
    req.num_preemptions = 2  # on P, as `Scheduler.preempt` counts them
    disagg.output_len[req.request_id] = 5
    req.output_len = 1
    disagg._hand_off_from(0)(req, 1.0)
    assert req.num_preemptions == 0  # D's scheduler reads it: a re-admission only after a preemption on D
    req.num_preemptions += 1  # preempted once on D
    records = RequestRecords()
    records.add(req)
    assert records.columns()["num_preemptions"].tolist() == [3]
