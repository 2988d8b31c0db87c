"""Speculative decoding under every run mode: a run is the same with `--check` and without decode bursts, and
every request's tokens add up to what its verifies emitted.

Since model24 the scheduler draws each verify's acceptance when it plans the step
(`SpeculativeSteps.draw_verify_outcomes`), from the run's one generator, which a fleet's replicas and a DP
group's ranks share. The draws must not depend on how the run is driven: `check=True` (invariants after every
step) and `bursts=False` (every step planned alone; a replica that does not speculate bursts otherwise, and
its bursts change the order of SimPy's events) give the same requests, steps and summary bit for bit.

The token books follow vLLM's rejection sampler and stop check: a verify of d drafts that accepts a of them
emits a + 1 tokens (the accepted drafts and the correction or bonus token), capped at the tokens the request
still owes (`max_tokens`); the drafts it rejects are d − a, which the plan counts for the drafter's later
passes (`StepPlan.num_rejected_draft_tokens`), never more than the context those passes read. Every
request's emitted tokens, with the one its prefill samples, sum to its output length, and the summary's
counters are the sums over verifies (vllm/v1/spec_decode/metrics.py).
"""

import json
from unittest import mock

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.engine.simulate import simulate as simulate_engine
from kvsim.fleet.disagg import simulate_disagg
from kvsim.fleet.driver import simulate_fleet
from kvsim.sched import burst
from kvsim.sched.base import Scheduler
from kvsim.workload.request import RequestStatus
from kvsim.workload.scenario import make_scenario

TOPOLOGIES = ["single", "fleet", "dp-moe", "disagg"]


def mooncake_trace(path, num_requests, num_speculative_tokens, seed):
    """A Mooncake JSONL of `num_requests` rows whose acceptance column (`accepted`) gives some of each request's
    verify steps, some past K + 1 (capped at the drafts verified), drawn from `seed`."""
    rng = np.random.default_rng(seed)
    rows, timestamp_ms = [], 0
    for i in range(num_requests):
        accepted = rng.integers(1, num_speculative_tokens + 3, size=int(rng.integers(0, 6))).tolist()
        timestamp_ms += int(rng.integers(0, 60))
        rows.append({"timestamp": timestamp_ms, "input_length": int(rng.integers(8, 120)),
                     "output_length": int(rng.integers(2, 40)), "hash_ids": [i], "accepted": accepted})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def scenario(topology, method, rates, async_scheduling, priority, seed, trace_dir=None):
    spec = {"method": method, "num_speculative_tokens": len(rates), "acceptance_rates": list(rates)}
    engine = {"max_model_len": 256, "num_gpu_blocks_override": 24, "block_size": 16,
              "async_scheduling": async_scheduling, "speculative_config": spec}
    raw = {"name": "spec-modes", "model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": seed, "engine": engine,
           "workload": {"num_requests": 14, "arrival": {"process": "poisson", "rate": 40.0},
                        "prompt_len": {"dist": "uniform", "low": 8, "high": 120},
                        "output_len": {"dist": "uniform", "low": 2, "high": 40}}}
    if trace_dir is not None:  # a trace's acceptance lengths, then the model's draws
        path = mooncake_trace(trace_dir / f"{seed}-{len(rates)}.jsonl", 14, len(rates), seed)
        raw["workload"] = {"num_requests": 14, "arrival": {"process": "trace"},
                           "trace": {"format": "mooncake", "path": str(path), "acceptance_column": "accepted"}}
    if priority:
        engine["scheduling_policy"] = "priority"
        raw["workload"]["priority"] = {"classes": [{"name": "hi", "priority": 0, "weight": 1.0},
                                                   {"name": "lo", "priority": 1, "weight": 2.0}]}
    if topology == "fleet":  # a group that does not speculate runs decode bursts beside two that do
        raw["replicas"] = [{"count": 2}, {"count": 1, "engine": {"speculative_config": None, "scheduling_policy": "fcfs"}}]
        raw["router"] = {"policy": "least_outstanding"}
    elif topology == "dp-moe":  # MoE ranks step in lockstep, drawing from one generator
        raw["model"] = "qwen3-30b-a3b"
        spec["method"] = "ngram"
        engine["data_parallel_size"] = 2
    elif topology == "disagg":
        raw["kv_transfer_config"] = {"kv_connector": "NixlConnector", "kv_link": "rdma"}
        raw["replicas"] = [{"count": 1, "name": "prefill", "kv_role": "kv_producer"},
                           {"count": 2, "name": "decode", "kv_role": "kv_consumer"}]
    # vLLM refuses to schedule n-grams asynchronously; a disaggregated instance is modelled synchronous
    engine["async_scheduling"] = async_scheduling and spec["method"] != "ngram" and topology != "disagg"
    return make_scenario(raw)


def run(s, check, bursts):
    if s.kv_transfer_config is not None:
        return simulate_disagg(s, check=check, bursts=bursts)
    if s.is_fleet:
        return simulate_fleet(s, check=check, bursts=bursts)
    return simulate_engine(s, check=check, bursts=bursts)


class Books:
    """Every verify's outcome and every step's sampled tokens, per request, as a run completes its steps."""

    def __init__(self):
        self.verifies = []  # (num_drafts, num_accepted)
        self.emitted = {}  # request id → tokens its steps emitted (a disaggregated request's on both instances)
        self.num_bursts = 0

    def complete(self, original):
        books = self

        def complete(scheduler, plan, now):
            spec = scheduler.speculation
            pending = dict(spec.pending) if spec is not None else {}
            accepted = dict(spec.accepted) if spec is not None else {}
            rejected = sum(d - accepted[rid] for rid, d in pending.items())
            assert plan.num_rejected_draft_tokens == rejected
            before = {id(r): (r.num_output_tokens, r.output_len, r.num_computed_tokens, r.status)
                      for r, _ in plan.scheduled}
            result = original(scheduler, plan, now)
            for req, num_new in plan.scheduled:
                out, output_len, past, status = before[id(req)]
                if status is not RequestStatus.RUNNING:
                    continue  # preempted later in the same planning pass: `complete` skips it too
                gained = req.num_output_tokens - out
                if req.request_id in pending:
                    drafts, taken = pending[req.request_id], accepted[req.request_id]
                    assert 0 <= taken <= drafts and num_new == 1 + drafts
                    assert past + num_new - (drafts - taken) >= past + 1  # the drafter's later passes' context
                    assert gained == min(taken + 1, output_len - out)
                    books.verifies.append((drafts, taken))
                else:
                    assert gained in (0, 1)
                books.emitted[req.request_id] = books.emitted.get(req.request_id, 0) + gained
            return result

        return complete


def booked_run(s, check, bursts):
    books = Books()
    original_burst = burst.apply_burst

    def counting_burst(*args, **kwargs):
        books.num_bursts += 1
        return original_burst(*args, **kwargs)

    with mock.patch.object(Scheduler, "complete", books.complete(Scheduler.complete)), \
            mock.patch("kvsim.engine.runtime.apply_burst", counting_burst):
        result = run(s, check, bursts)
    return result, books


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=st.sampled_from(TOPOLOGIES), method=st.sampled_from(["eagle", "eagle3", "ngram"]),
       rates=st.lists(st.sampled_from([0.0, 0.3, 0.6, 0.9, 1.0]), min_size=1, max_size=4),
       async_scheduling=st.booleans(), priority=st.booleans(), trace=st.booleans(), seed=st.integers(0, 2**16))
def test_a_speculative_run_is_the_same_under_check_and_without_bursts_and_its_tokens_add_up(
        tmp_path_factory, topology, method, rates, async_scheduling, priority, trace, seed):
    # a fleet's group that does not speculate refuses a trace's acceptance column
    trace_dir = tmp_path_factory.getbasetemp() if trace and topology != "fleet" else None
    s = scenario(topology, method, rates, async_scheduling, priority, seed, trace_dir)
    plain, plain_books = booked_run(s, check=False, bursts=True)
    checked, checked_books = booked_run(s, check=True, bursts=False)
    pd.testing.assert_frame_equal(plain.requests, checked.requests)
    pd.testing.assert_frame_equal(plain.steps, checked.steps)
    assert plain.summary == checked.summary
    assert checked_books.num_bursts == 0 and (plain_books.num_bursts > 0 or topology != "fleet")
    assert plain_books.verifies == checked_books.verifies
    # bursts apply their tokens without `complete`: the step-by-step run's books hold every token
    finished = checked.requests[checked.requests["status"] == "finished"]
    assert checked_books.emitted == dict(zip(finished["request_id"], finished["output_tokens"], strict=True))
    counters = plain.summary["spec_decode"]
    assert counters["num_draft_tokens"] == sum(d for d, _ in plain_books.verifies)
    assert counters["num_accepted_tokens"] == sum(a for _, a in plain_books.verifies)
    assert counters["num_drafts"] == sum(d > 0 for d, _ in plain_books.verifies)
