"""Scheduler semantics checked against vLLM's code (third audit); each expected value is derived by hand from the
vLLM function named beside it, on a world small enough to follow on paper."""

from kvsim.engine.loop import least_loaded, run_engine
from kvsim.engine.recorder import StepRecorder
from kvsim.engine.runtime import Engine
from kvsim.kv import PagedAllocator, TokenContent
from kvsim.kv.link import LinkSpec
from kvsim.kv.offload_connector import OffloadConnector, TierSpec
from kvsim.latency.base import ConstantLatency
from kvsim.sched import SchedulerLimits, make_scheduler
from kvsim.workload.request import Request

STEP_S = 0.01
BLOCK_BYTES = 1_000_000
BANDWIDTH = 4e8  # one block over the GPU<->CPU link: 2.5 ms


def offloading_scheduler():
    """8 usable GPU blocks of 16 tokens, a CPU tier of 100 blocks, 16 tokens a step."""
    scheduler = make_scheduler("v1", PagedAllocator(9, 16), SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=16,
                                                                            max_model_len=1024))
    scheduler.offload = OffloadConnector([TierSpec("cpu", 100, LinkSpec(BANDWIDTH))], LinkSpec(BANDWIDTH), 16,
                                         BLOCK_BYTES)
    return scheduler


def req(request_id, arrival_s, tokens, output_len=1):
    return Request(request_id, arrival_s, len(tokens), output_len, TokenContent(tokens))


def test_a_request_loading_its_prefix_from_the_cpu_tier_counts_as_waiting():
    """vLLM keeps a request whose KV loads from a connector (WAITING_FOR_REMOTE_KVS) in its waiting queue: the
    admission loop of `Scheduler.schedule` (vllm/v1/core/sched/scheduler.py) pops it, puts it in
    `skipped_waiting_requests` and prepends those back, and `make_stats` reports `num_waiting_reqs=len(self.waiting)`
    (newer vLLM keeps it in `skipped_waiting` and adds `num_skipped_waiting_reqs` to the same gauge).

    A (64 tokens) is written through to the CPU tier; B (128 other tokens) takes all 8 GPU blocks, evicting A's 4
    cached ones; D (16 tokens, 20 out) decodes from 1.91 s. C (A's 64 tokens + 16 new) arrives at 1.995 s: at the
    next step the GPU misses, the CPU tier holds A's 4 blocks, C starts loading them (10 ms) while D decodes.
    That step's row: 1 running (D), 1 waiting (C), as vLLM's gauges read after it (kvsim said 0 waiting)."""
    a, b, d, new = list(range(64)), list(range(1000, 1128)), list(range(2000, 2016)), list(range(5000, 5016))
    scheduler = offloading_scheduler()
    requests = [req(0, 0.0, a), req(1, 1.0, b), req(3, 1.9, d, output_len=20), req(2, 1.995, a + new)]
    steps = run_engine(scheduler, ConstantLatency(STEP_S), requests, check=True).frame()
    first = steps[steps.time_s > 1.995].iloc[0]
    assert first["vllm:num_requests_running"] == 1
    assert first["vllm:num_requests_waiting"] == 1
    rows = scheduler.records.columns()
    assert list(rows["prefix_hit_tokens"][rows["request_id"] == 2]) == [64]  # it did load A's 4 blocks


def test_data_parallel_balancing_counts_a_loading_request_as_waiting():
    """vLLM's DP load balancer scores each engine 4 · waiting + running from the counts the engine reports
    (vllm/v1/engine/core_client.py, DPLBAsyncMPClient.get_core_engine_for_request; `Scheduler.get_request_counts`:
    `len(self.waiting)`, which holds a WAITING_FOR_REMOTE_KVS request). Engine 0 has one request loading its
    prefix and none queued (score 4); engine 1 one running request (score 1): the next request goes to engine 1."""
    loading, running = offloading_scheduler(), offloading_scheduler()
    loading.loading[7] = (req(7, 0.0, list(range(32))), 31)
    running.running.append(req(8, 0.0, list(range(32))))
    assert least_loaded([Engine(s, ConstantLatency(STEP_S), StepRecorder("all")) for s in (loading, running)]) == 1
