"""vLLM v1's parallel sampling (`kvsim.sched.fanout`): a request with n > 1 samples runs as n child requests,
each admitted, counted, preempted and finished on its own, sharing the prompt only through the prefix cache;
its one row is the client's view (first child's first token, last child's finish). Expected values are
derived by hand from vLLM v1's code (vllm/v1/core/kv_cache_manager.py `get_computed_blocks`, `allocate_slots`),
each step of the derivation in the test's docstring."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.kv import PagedAllocator, SegmentContent, TokenContent
from kvsim.sched import SchedulerLimits, make_scheduler
from kvsim.sched.fanout import (
    SampleGroups,
    child_request_id,
    parent_request_id,
    request_label,
    sample_content,
)
from kvsim.sched.request_queue import make_request_queue
from kvsim.workload.request import Request, RequestStatus
from tests.conftest import make_request, run, tiny_world


def block_tables(scheduler, parent_id, n):
    """The children's block tables, child 0 first."""
    return [scheduler.alloc.seqs[child_request_id(parent_id, i) * 256].block_table for i in range(n)]


@pytest.mark.parametrize("caching", [True, False])
def test_three_samples_of_a_40_token_prompt_in_blocks_of_16(caching):
    """Prompt 40, output 5, n = 3, blocks of 16 (10 usable, the null block is 0), a 256-token budget.

    Caching on: child 0 computes 40 tokens in blocks 1, 2 (full: cached as allocated) and 3 (8 tokens). Child
    1, admitted next in the same step, looks up at most 39 tokens: blocks 1 and 2, 32 tokens; it computes the
    other 8 into block 4 of its own; child 2 likewise into block 5. Step 1: 40 + 8 + 8 = 56 tokens, 5 blocks
    held; prefix-cache queries 3 × 40 = 120 tokens, hits 2 × 32 = 64. Caching off: 3 × 40 = 120 tokens in
    9 blocks, nothing queried. Each child samples its first token at .01 and its 5th at .05: one row, TTFT
    .01, E2E .05, TPOT (.05 − .01) / 4 = .01; three requests running, as vLLM's engine core sees them."""
    s = tiny_world(caching=caching, max_num_batched_tokens=256)
    req = make_request(0, 0.0, prompt=40, output=5, n=3)
    assert s.add(req)
    plan = s.schedule(0.0)
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(child_request_id(0, 0), 40),
                                                             (child_request_id(0, 1), 40 - 32 * caching),
                                                             (child_request_id(0, 2), 40 - 32 * caching)]
    tables = block_tables(s, 0, 3)
    assert tables == ([[1, 2, 3], [1, 2, 4], [1, 2, 5]] if caching else [[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    assert plan.num_prefill_tokens == (56 if caching else 120)
    assert s.alloc.usage == pytest.approx(0.5 if caching else 0.9)
    assert s.snapshot().num_running == 3
    stats = s.counters()
    assert (stats.num_prefix_query_tokens, stats.num_prefix_hit_tokens) == ((120, 64) if caching else (0, 0))
    assert stats.num_copy_on_writes == 0  # nothing is forked
    now = 0.0
    while s.has_work:
        now = round(now + 0.01, 9)
        s.complete(plan, now)
        s.check_invariants()
        plan = s.schedule(now)
    rows = s.records.columns()
    assert len(rows["request_id"]) == 1 and rows["request_id"][0] == 0 and rows["num_samples"][0] == 3
    assert (rows["first_token_s"][0], rows["finish_s"][0]) == (0.01, 0.05)
    assert rows["ttft_s"][0] == 0.01 and rows["tpot_s"][0] == pytest.approx(0.01)
    assert rows["prefix_hit_tokens"][0] == 0 and rows["output_tokens"][0] == 5
    assert req.status is RequestStatus.FINISHED and req.num_output_tokens == 5
    assert s.alloc.num_held_slots == 0 and not s.samples.groups


def test_a_prompt_on_a_block_boundary_recomputes_its_last_block():
    """Prompt 32 = two full blocks: a child's lookup stops at 31 tokens, so it hits one block (16 tokens) and
    computes the second again, into a block of its own (vLLM: "we must recompute the last token to obtain
    logits", which costs the whole block). Step 1: 32 + 16 + 16 = 64 tokens; blocks [1, 2], [1, 3], [1, 4]."""
    s = tiny_world(max_num_batched_tokens=256)
    assert s.add(make_request(0, 0.0, prompt=32, output=2, n=3))
    plan = s.schedule(0.0)
    assert [n for _, n in plan.scheduled] == [32, 16, 16] and plan.num_prefill_tokens == 64
    assert block_tables(s, 0, 3) == [[1, 2], [1, 3], [1, 4]]


def test_more_samples_than_max_num_seqs_run_in_turns():
    """n = 3 under max_num_seqs = 2: vLLM v1 refuses nothing (each child is one request); children 0 and 1 run
    first (40 + 8 tokens in step 1, first tokens at .01, last at .05); child 2 is admitted at .05, once they
    have finished: their freed blocks are still cached, so it hits 32 tokens, computes 8, samples at .06 and
    finishes at .10. The row: TTFT .01, E2E .10, TPOT (.10 − .01) / 4."""
    s = tiny_world(max_num_seqs=2, max_num_batched_tokens=256)
    req = make_request(0, 0.0, prompt=40, output=5, n=3)
    rec = run(s, [req])
    frame = rec.frame()
    assert list(frame["vllm:num_requests_running"]) == [2] * 5 + [1] * 5
    assert list(frame["num_batched_tokens"]) == [48, 2, 2, 2, 2, 8, 1, 1, 1, 1]
    assert s.counters().num_prefix_hit_tokens == 64
    assert (req.first_scheduled_s, req.first_token_s, req.finish_s) == (0.0, 0.01, pytest.approx(0.10))
    assert s.records.columns()["tpot_s"][0] == pytest.approx(0.0225)


def test_one_child_is_preempted_alone():
    """Prompt 20, output 20, n = 2, blocks of 16, 4 usable (blocks 1–4), caching on.

    Step 1 (.00): child 0 computes 20 tokens into blocks 1 (full, cached) and 2; child 1 hits block 1 and
    computes 4 into block 3; block 4 is free. Step k ≥ 2 computes position 20 + (k − 2) of each. At step 14
    (position 32) each needs a third block: child 0 takes block 4, child 1 finds none and is its own victim
    (the most recently admitted): preempted alone, its 13 tokens kept, its block 3 (positions 16–31, full)
    freed but still cached. Child 0 runs on to its 20th token at .20; meanwhile child 1 (33 tokens: 32 hit
    in blocks 1 and 3, one new) waits for two free blocks (block 3 leaves the free queue, one new), which
    it gets when child 0 finishes: at step 21 (.20) it computes one token (a one-token query: a decode), then
    its 15th–20th tokens in steps 22–27, the last at .27. A v0 group would have been preempted whole."""
    s = tiny_world(num_blocks=5, max_num_batched_tokens=256)
    req = make_request(0, 0.0, prompt=20, output=20, n=2)
    rec = run(s, [req])
    frame = rec.frame()
    assert list(frame["vllm:num_requests_running"]) == [2] * 13 + [1] * 14
    assert list(frame["vllm:num_requests_waiting"]) == [0] * 13 + [1] * 7 + [0] * 7
    assert list(frame["num_batched_tokens"]) == [24] + [2] * 12 + [1] * 14
    assert list(frame["num_prefill_tokens"]) == [24] + [0] * 26
    assert s.num_preemptions == 1 and req.num_preemptions == 1
    assert (req.first_token_s, req.finish_s) == (0.01, pytest.approx(0.27))
    c = s.counters()
    assert (c.num_prefix_query_tokens, c.num_prefix_hit_tokens) == (40, 16)
    assert (c.num_preempted_query_tokens, c.num_preempted_hit_tokens) == (33, 32)
    assert s.records.columns()["num_preemptions"].tolist() == [1]


@pytest.mark.parametrize("bursts", [False, True])
def test_a_finished_child_preempted_before_its_kv_is_released_counts_on_its_parents_row(bursts):
    """Async scheduling: a finished request keeps its KV until the next plan is made and may be preempted then
    (`AsyncSteps`). Blocks of 4, 2 usable, max_num_seqs 2, caching off; A (prompt 4, output 4), then B
    (prompt 4, output 1, n = 2). Step 1 (.00): A and B's child 0, one block each; child 1 waits for a slot.
    Child 0 finishes at .01. Planning step 2, A needs a block: the victim is child 0, finishing: freed, one
    preemption, counted on child 0 since B's row is not written yet. A decodes to its 4th token at .04; then
    child 1 (admitted at .04, once A's KV is released) computes 4 tokens and finishes at .05. B's row: first
    token .01 (child 0's), finish .05 (child 1's), one preemption."""
    sched = make_scheduler("v1", PagedAllocator(3, 4, enable_caching=False), SchedulerLimits(2, 64, 64))
    sched.async_scheduling = True
    a, b = make_request(0, 0.0, prompt=4, output=4), make_request(1, 0.0, prompt=4, output=1, n=2)
    run(sched, [a, b], bursts=bursts)
    rows = sched.records.columns()
    assert rows["num_preemptions"].tolist() == [0, 1] and sched.num_preemptions == 1
    assert rows["first_scheduled_s"].tolist() == [0.0, 0.0]
    assert rows["first_token_s"].tolist() == [0.01, 0.01]
    assert rows["finish_s"].tolist() == pytest.approx([0.04, 0.05])


def test_a_late_preemption_after_the_parents_row_is_written_goes_to_that_row():
    """Blocks of 4, 3 usable, caching off, async: A (prompt 4, output 4) and B (prompt 4, output 1, n = 2) all
    admitted in step 1; both children finish then, writing B's row. Planning step 2, A needs a block, none
    is free: the victim is B's child 1 (admitted last), finishing: one preemption, added to B's written row."""
    sched = make_scheduler("v1", PagedAllocator(4, 4, enable_caching=False), SchedulerLimits(8, 64, 64))
    sched.async_scheduling = True
    a, b = make_request(0, 0.0, prompt=4, output=4), make_request(1, 0.0, prompt=4, output=1, n=2)
    assert sched.add(a) and sched.add(b)
    plan = sched.schedule(0.0)
    assert [n for _, n in plan.scheduled] == [4, 4, 4]
    sched.complete(plan, 1.0)
    assert b.status is RequestStatus.FINISHED and sched.records.columns()["num_preemptions"].tolist() == [0]
    plan = sched.schedule(1.0)
    assert [r.request_id for r in plan.preempted] == [child_request_id(1, 1)]
    assert sched.records.columns()["num_preemptions"].tolist() == [1]


def test_rejected_only_for_what_one_child_cannot_get():
    """v1 refuses a fanned-out request only if one child could never run: a 64-token prompt reaches
    max_model_len 64 and is refused (one row, n kept); n = 16 > max_num_seqs 8 is served in turns, where v0
    refuses it. 40 + 30 tokens, past max_model_len, are served capped to 64 − 40 = 24 output tokens (vLLM ends
    a request whose tokens reach max_model_len), as the workload caps them for one engine; it was refused."""
    s = tiny_world(max_model_len=64)
    too_long = make_request(0, 0.0, prompt=64, output=2, n=4)
    many = make_request(1, 0.0, prompt=8, output=2, n=16)
    capped = make_request(2, 0.0, prompt=40, output=30, n=4)
    run(s, [too_long, many, capped])
    assert too_long.status is RequestStatus.REJECTED and "max_model_len" in too_long.reject_reason
    assert many.status is RequestStatus.FINISHED
    assert capped.status is RequestStatus.FINISHED and capped.output_len == 24
    assert s.records.columns()["num_samples"].tolist() == [4, 16, 4]
    v0 = tiny_world(policy="v0", max_model_len=64)
    assert not v0.add(make_request(1, 0.0, prompt=8, output=2, n=16))


def test_beams_and_v0_still_fork():
    """Beam search is not fanned out under v1, and v0 forks parallel samples: one request in `running`."""
    for policy, beam in (("v1", True), ("v0", False)):
        s = tiny_world(policy=policy, max_num_batched_tokens=256)
        req = make_request(0, 0.0, prompt=20, output=4, n=3)
        req.beam = beam
        assert s.add(req)
        s.schedule(0.0)
        assert s.running == [req] and s.num_running_seqs() == 3


def test_children_ids_and_contents():
    """Child ids are negative, increase with the index and give back their parent; a later child's segment
    output is renamed, its token output replaced by its id; child 0 keeps the request's content."""
    ids = [child_request_id(7, i) for i in range(3)]
    assert all(i < 0 for i in ids) and ids == sorted(ids) and len(set(ids)) == 3
    assert {parent_request_id(child_request_id(p, i)) for p in (0, 7) for i in (0, 255)} == {0, 7}
    segments = SegmentContent([("sys", 16), (("reply", 3), 8)])
    parent = Request(3, 0.5, 16, 8, content=segments, num_samples=2, priority=2)
    groups = SampleGroups()
    children = groups.fan_out(parent)
    assert [(c.request_id, c.arrival_s, c.priority, c.num_samples) for c in children] == [
        (child_request_id(3, 0), 0.5, 2, 1), (child_request_id(3, 1), 0.5, 2, 1)]
    assert children[0].content is segments
    assert children[1].content.segments == (("sys", 16), ((("reply", 3), 1), 8))
    assert groups.row_id(children[0]) is None
    tokens = Request(3, 0.5, 16, 8, content=TokenContent(range(24)), num_samples=2)
    assert sample_content(tokens, 1).token_ids == (*range(16), *[child_request_id(3, 1)] * 8)


@pytest.mark.parametrize("content", ["segments", "tokens"])
def test_a_preempted_child_of_token_content_finds_its_own_output_again(content):
    """The preemption of `test_one_child_is_preempted_alone`, with the request's content given as token ids:
    child 1's output is placeholder tokens of its own, so its re-admission (33 tokens) hits the prompt's first
    block and its own full output block (32 tokens), as with segments. Its token content once stopped at the
    prompt, and that lookup beyond it failed an assertion ("hashing beyond the known content")."""
    s = tiny_world(num_blocks=5, max_num_batched_tokens=256)
    req = make_request(0, 0.0, prompt=20, output=20, n=2)
    if content == "tokens":
        req = Request(0, 0.0, 20, 20, content=TokenContent(range(40)), num_samples=2)
    run(s, [req])
    c = s.counters()
    assert (c.num_preempted_query_tokens, c.num_preempted_hit_tokens) == (33, 32)
    assert (req.num_preemptions, req.first_token_s, req.finish_s) == (1, 0.01, pytest.approx(0.27))


REQUEST = st.tuples(
    st.floats(0, 0.1, allow_nan=False),  # arrival (s)
    st.integers(1, 50),  # prompt
    st.integers(1, 30),  # output
    st.integers(1, 4),  # samples
    st.sampled_from([0, 0, 16, 20]),  # shared prefix tokens
    st.integers(0, 1),  # priority
)


@settings(max_examples=80, deadline=None)
@given(specs=st.lists(REQUEST, min_size=1, max_size=8), num_blocks=st.integers(6, 30),
       block_size=st.sampled_from([4, 16]), budget=st.sampled_from([16, 64, 256]), caching=st.booleans(),
       max_num_seqs=st.integers(1, 6), policy=st.sampled_from(["fcfs", "priority"]), async_=st.booleans(),
       tokens=st.booleans())
def test_random_fan_outs_keep_one_row_per_request(specs, num_blocks, block_size, budget, caching, max_num_seqs,
                                                  policy, async_, tokens):
    """Random v1 workloads with n ≤ 4 (beside tests/test_engine_properties.py's, with async scheduling, the
    priority policy, max_num_seqs below n and content as segments or token ids): the books balance after every step (`check_invariants`, the
    sample groups' included), decode bursts change nothing, and every request ends in exactly one row; a
    finished request's row has all its tokens and ordered times; the rows' preemptions sum to the engine's;
    with caching on, each child queries its prompt once at its first admission, so the queries not counted
    as re-admissions sum to n × prompt over the requests served."""
    results = []
    for bursts in (False, True):
        alloc = PagedAllocator(num_blocks, block_size, enable_caching=caching)
        s = make_scheduler("v1", alloc, SchedulerLimits(max_num_seqs, budget, 128),
                           waiting=make_request_queue(policy))
        s.async_scheduling = async_
        reqs = []
        for rid, (arrival, prompt, output, n, prefix, priority) in enumerate(sorted(specs)):
            req = make_request(rid, arrival, max(prompt, prefix + 1), output, n=n, prefix=prefix)
            if tokens:  # the shared prefix's tokens, then the request's own
                own = range(10_000 * (rid + 1), 10_000 * (rid + 1) + req.prompt_len - prefix + output)
                req.content = TokenContent([*range(prefix), *own])
            req.priority = priority
            reqs.append(req)
        run(s, reqs, bursts=bursts)
        rows = s.records.columns()
        assert sorted(rows["request_id"].tolist()) == list(range(len(reqs))) and not s.samples.groups
        assert s.alloc.num_held_slots == 0
        assert int(rows["num_preemptions"].sum()) == s.num_preemptions
        served = [r for r in reqs if r.status is RequestStatus.FINISHED]
        assert len(served) + sum(r.status is RequestStatus.REJECTED for r in reqs) == len(reqs)
        for r in served:
            assert r.num_output_tokens == r.output_len
            assert r.arrival_s <= r.first_scheduled_s <= r.first_token_s <= r.finish_s
        if caching:
            assert s.counters().num_prefix_query_tokens == sum(r.num_samples * r.prompt_len for r in served)
        results.append(pd.DataFrame(rows))
    assert results[0].equals(results[1])



def test_priority_ties_between_parents_follow_vllms_child_ids():
    """Three requests of equal priority and arrival, n = 2, priority policy, max_num_seqs = 2 (review13).
    vLLM's priority heap breaks such ties by request id (`Request.__lt__`), and v1's child ids are the strings
    f"{index}_{parent}": sorted, "0_0" < "0_1" < "0_2" < "1_0" < ..., so the first step admits child 0 of
    requests 0 and 1. kvsim admitted both children of request 2 (the last to arrive), where three plain
    requests so tied admit requests 0 and 1."""
    parents = range(3)
    vllm_ids = sorted(f"{i}_{p}" for p in parents for i in range(2))
    expected = [tuple(int(x) for x in s.split("_")) for s in vllm_ids[:2]]  # (index, parent)
    alloc = PagedAllocator(41, 16, enable_caching=True, bytes_per_block=1000)
    s = make_scheduler("v1", alloc, SchedulerLimits(2, 256, 128, 0, None), waiting=make_request_queue("priority"))
    for rid in parents:
        assert s.add(make_request(rid, 0.0, prompt=20, output=3, n=2))
    admitted = [r.request_id for r, _ in s.schedule(0.0).scheduled]
    assert admitted == [child_request_id(parent, index) for index, parent in expected]
    assert [parent_request_id(rid) for rid in admitted] == [0, 1]


def test_a_childs_prompt_tail_is_no_recomputed_token():
    """Prompt 40, n = 3, blocks of 16, caching on, nothing preempted: 40 + 8 + 8 = 56 prompt tokens computed,
    but no KV was ever dropped, so no token is computed again (review13: the module docstring said plan's
    recomputed tokens counted the siblings' 16 tail tokens; `num_recomputed_tokens` counts preemptions only)."""
    s = tiny_world(max_num_batched_tokens=256)
    assert s.add(make_request(0, 0.0, prompt=40, output=3, n=3))
    plan, now = s.schedule(0.0), 0.0
    assert plan.num_prefill_tokens == 56
    while s.has_work:
        now = round(now + 0.01, 9)
        s.complete(plan, now)
        plan = s.schedule(now)
    assert s.num_preemptions == 0 and s.counters().num_recomputed_tokens == 0


def test_a_message_names_a_child_by_its_parent_and_index():
    """review13: a child's id is a large negative number only kvsim uses (the priority stall's message printed it);
    a message names it as vLLM's `f"{index}_{parent}"` does, parent 3 and index 1, a user request as its id."""
    assert request_label(child_request_id(3, 1)) == "3 (sample 1)"
    assert request_label(child_request_id(0, 255)) == "0 (sample 255)"
    assert request_label(7) == "7"
