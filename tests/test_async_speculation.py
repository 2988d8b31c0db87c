"""Speculative decoding under async scheduling (vLLM's default for EAGLE): what vLLM's scheduler knows when it plans.

vLLM plans step k + 1 before step k's output is processed (vllm/v1/engine/core.py `step_with_batch_queue`). After
planning a verify of 1 + d tokens, `AsyncScheduler._update_after_schedule` counts all of them computed and adds
1 + d output placeholders; `update_from_output` takes the d − a rejected drafts back from `num_computed_tokens` only
when the output comes, after the next plan (vllm/v1/core/sched/scheduler.py, async_scheduler.py). So the next plan
sizes its verify from a `num_computed_tokens` still d − a too high:

* its length cap, `max_model_len − 1 − num_computed_tokens`, and its slots, `allocate_slots`'
  `num_computed_tokens + new + num_lookahead_tokens` (capped at `max_model_len`), start d − a tokens further;
* a request left no token under the cap is passed over for the step (`num_new_tokens == 0`), and a running
  request a step does not schedule loses its drafts: they live on the GPU for the requests of the step before
  (`_update_after_schedule` clears the placeholders of the requests it did not schedule), so its next step decodes
  one token.

Every expectation below steps those rules by hand: EAGLE (lookahead K), K = 3, every draft rejected (a = 0, so
each verify emits one token and vLLM's `num_computed_tokens + 2 − num_output_placeholders ≥ prompt + max_tokens`
skip sees each request's last token coming), blocks of 4 tokens, no prefix caching.
"""

from kvsim.kv import PagedAllocator
from kvsim.model.speculative_config import SpeculativeConfig
from kvsim.sched import SchedulerLimits, make_scheduler
from kvsim.sched.speculative import make_speculation
from tests.conftest import make_request, run

NUM_BLOCKS = 20  # 19 usable (block 0 is vLLM's null block)


def scheduler(max_model_len=64, budget=64, async_scheduling=True):
    config = SpeculativeConfig(method="eagle", num_speculative_tokens=3, acceptance_rates=(0.0, 0.0, 0.0))
    sched = make_scheduler("v1", PagedAllocator(NUM_BLOCKS, 4, enable_caching=False),
                           SchedulerLimits(8, budget, max_model_len), speculation=make_speculation(config))
    sched.async_scheduling = async_scheduling
    return sched


def steps(sched, requests):
    """Each plan's (request, tokens) and the blocks held right after it, to the last request's end."""
    for req in requests:
        assert sched.add(req)
    out, now = [], 0.0
    while sched.running or sched.waiting:
        plan = sched.schedule(now)
        out.append(([(r.request_id, n) for r, n in plan.scheduled], NUM_BLOCKS - 1 - sched.alloc.pool.num_free_blocks))
        now += 1.0
        sched.complete(plan, now)
        sched.check_invariants()
    return out


def test_a_verify_holds_the_slots_of_the_drafts_the_one_in_flight_rejects():
    # Prompt 4, output 5. Plan 1: prefill 4, 1 block (no lookahead on admission). Plan 2 (prefill in flight, no
    # drafts): 1 + 3 tokens from 4 computed, slots 4 + 4 + 3 = 11: 3 blocks. Plan 3: step 2's output not in yet,
    # computed 4 + 4 = 8 (its 3 drafts counted), slots 8 + 4 + 3 = 15: 4 blocks. Plan 4: computed 8 + 4 = 12 after
    # plan 3, less step 2's 3 rejected (its output came in between) = 9: slots 9 + 4 + 3 = 16, 4 blocks. Plan 5:
    # 13 − 3 = 10: slots 17, 5 blocks. Synchronously (computed 4, 5, 6, 7) the blocks would be 1, 3, 3, 4, 4.
    expected = [([(0, 4)], 1), ([(0, 4)], 3), ([(0, 4)], 4), ([(0, 4)], 4), ([(0, 4)], 5)]
    assert steps(scheduler(), [make_request(0, 0.0, 4, 5)]) == expected
    sync = steps(scheduler(async_scheduling=False), [make_request(0, 0.0, 4, 5)])
    assert [blocks for _, blocks in sync] == [1, 3, 3, 4, 4]


def test_the_max_model_len_cap_counts_them_too():
    # max_model_len 12, prompt 4, output 8: the cap is 11 − computed, computed counting the drafts in flight.
    # Plan 2: 11 − 4 = 7 → 4 tokens (computed 8 after it). Plan 3: tokens 5 + 3 drafts + 4 placeholders − 8 = 4,
    # cap 11 − 8 = 3 → 3 (2 drafts), computed 11. Each later plan sees computed 11 less the drafts of the step
    # before the one in flight: plan 4: 11 − 3 = 8 → 3; plan 5: 11 − 2 = 9 → 2; plan 6: 9 → 2; plan 7: 11 − 1 = 10
    # → 1; plan 8: 10 → 1 (no draft left), its token the 8th.
    # Synchronously the cap 11 − (tokens − 1) would allow 4, 4, 4, 4, 3, 2, 1 after the prefill.
    expected = [[(0, 4)], [(0, 4)], [(0, 3)], [(0, 3)], [(0, 2)], [(0, 2)], [(0, 1)], [(0, 1)]]
    assert [plan for plan, _ in steps(scheduler(max_model_len=12), [make_request(0, 0.0, 4, 8)])] == expected
    sync = steps(scheduler(max_model_len=12, async_scheduling=False), [make_request(0, 0.0, 4, 8)])
    assert [n for plan, _ in sync for _, n in plan] == [4, 4, 4, 4, 4, 3, 2, 1]


def test_a_request_with_no_token_under_the_cap_is_passed_over_then_decodes_one_token():
    # max_model_len 12, prompt 8, output 4. Plan 1: prefill 8. Plan 2: cap 11 − 8 = 3 → 3 tokens (2 drafts),
    # computed 11. Plan 3: cap 11 − 11 = 0: passed over (vLLM's num_new_tokens == 0), and its drafts cleared as a
    # request the step leaves out. Step 2's 2 rejected come back (computed 9): plan 4 decodes 10 − 9 = 1 token;
    # plan 5: cap 11 − 10 = 1 → 1 token, its 4th output. The empty plan takes no time: the engine plans again.
    assert [plan for plan, _ in steps(scheduler(max_model_len=12), [make_request(0, 0.0, 8, 4)])] \
        == [[(0, 8)], [(0, 3)], [], [(0, 1)], [(0, 1)]]
    req = make_request(0, 0.0, 8, 4)
    rec = run(scheduler(max_model_len=12), [req])
    assert list(rec.frame()["num_batched_tokens"]) == [8, 3, 1, 1]
    assert (req.num_output_tokens, req.finish_s) == (4, 0.04)


def test_a_request_the_budget_leaves_out_loses_its_drafts():
    # Budget 4. A and B (prompt 1, output 3) are admitted in plan 1. Plan 2: A's verify takes the whole budget
    # (1 + 3), B is not scheduled and loses its drafts; plan 3 alike (A's last token comes out of step 3). Plan 4:
    # A is finishing; B decodes 1 token (no drafts: vLLM has none for it), then plan 5 verifies 1 + 3 again.
    # Synchronously B keeps its drafts (the scheduler holds them): plan 4 would verify 4.
    requests = [make_request(0, 0.0, 1, 3), make_request(1, 0.0, 1, 3)]
    assert [plan for plan, _ in steps(scheduler(budget=4), requests)] \
        == [[(0, 1), (1, 1)], [(0, 4)], [(0, 4)], [(1, 1)], [(1, 4)]]
    requests = [make_request(0, 0.0, 1, 3), make_request(1, 0.0, 1, 3)]
    assert [plan for plan, _ in steps(scheduler(budget=4, async_scheduling=False), requests)][3] == [(1, 4)]


def accepting_scheduler(num_blocks=NUM_BLOCKS, async_scheduling=True):
    """EAGLE, K = 3, every draft accepted; blocks of 4 tokens, max_model_len 128, budget 64."""
    config = SpeculativeConfig(method="eagle", num_speculative_tokens=3, acceptance_rates=(1.0, 1.0, 1.0))
    sched = make_scheduler("v1", PagedAllocator(num_blocks, 4, enable_caching=False),
                           SchedulerLimits(8, 64, 128), speculation=make_speculation(config))
    sched.async_scheduling = async_scheduling
    return sched


def plans(sched, arrivals):
    """Each plan's (request, tokens) and preempted ids, adding each of `arrivals` (step, request) before that plan."""
    out, step = [], 0
    while sched.has_work or any(s >= step for s, _ in arrivals):
        for _, req in (a for a in arrivals if a[0] == step):
            assert sched.add(req)
        plan = sched.schedule(float(step))
        out.append(([(r.request_id, n) for r, n in plan.scheduled], [r.request_id for r in plan.preempted]))
        step += 1
        sched.complete(plan, float(step))
        sched.check_invariants()
    return out


def test_a_verify_that_ends_its_request_by_accepted_drafts_is_followed_by_a_discarded_verify():
    """vLLM's running loop skips a request with placeholders only when `num_computed_tokens + 2 −
    num_output_placeholders ≥ num_prompt_tokens + max_tokens` (the one token the verify in flight surely emits ends
    it). A: prompt 4, output 5. Plan 1 prefills 4 (1 block); plan 2 verifies 1 + 3 (computed 4 → 8, placeholders
    1 + 4 − 1 = 4 once step 1's token is in: slots 4 + 4 + 3 = 11, 3 blocks). Step 2 accepts all 3: 4 tokens,
    A's 5th ends it. Plan 3 is made before that output: 8 + 2 − 4 = 6 < 4 + 5, so A gets one more verify: tokens
    5 + 3 placeholder drafts + 4 − 8 = 4, slots 8 + 4 + 3 = 15, 4 blocks (19 usable − 4 = 15 free). B (prompt 64:
    16 blocks) arrives for plan 3 and does not fit beside it: admitted in plan 4 once A's blocks are freed (right
    after plan 3, when step 2's output ends A). Plan 3's batch is A's 4 discarded tokens, priced as a verify.
    Synchronously, or without that verify, A's blocks are free by plan 3 (3 held: 16 free) and B is admitted then."""
    arrivals = [(0, make_request(0, 0.0, 4, 5)), (2, make_request(1, 2.0, 64, 1))]
    sched = accepting_scheduler()
    out = plans(sched, arrivals)
    assert out[:4] == [([(0, 4)], []), ([(0, 4)], []), ([(0, 4)], []), ([(1, 64)], [])]
    assert sched.speculation.num_drafts == 1 and sched.speculation.num_draft_tokens == 3  # vLLM's metrics: not it
    sync = plans(accepting_scheduler(async_scheduling=False),
                 [(0, make_request(0, 0.0, 4, 5)), (2, make_request(1, 2.0, 64, 1))])
    assert sync[2] == ([(1, 64)], [])


def test_the_discarded_verify_s_blocks_can_preempt_a_running_request():
    """7 usable blocks. A (prompt 4, output 5) and B (prompt 4, output 20) are admitted together (1 block each),
    each verifies 1 + 3 in plan 2 (3 blocks each: 1 free). Step 2 ends A (all accepted). Plan 3: A, first in vLLM's
    `running`, gets its discarded verify and the last free block (15 slots: 4 blocks); B's verify needs a 4th block,
    and FCFS preempts `running.pop()`, B itself: the step runs A's discarded tokens alone. Plan 4 recomputes B's
    prompt and 5 outputs, 9 tokens (3 blocks: A's freed). Without the discarded verify B verifies in plan 3."""
    def arrivals():
        return [(0, make_request(0, 0.0, 4, 5)), (0, make_request(1, 0.0, 4, 20))]
    out = plans(accepting_scheduler(num_blocks=8), arrivals())
    assert out[:4] == [([(0, 4), (1, 4)], []), ([(0, 4), (1, 4)], []), ([(0, 4)], [1]), ([(1, 9)], [])]
    assert plans(accepting_scheduler(num_blocks=8, async_scheduling=False), arrivals())[2] == ([(1, 4)], [])


def test_the_plan_after_a_pass_over_sees_every_arrival_so_far():
    """vLLM's batch queue (`EngineCore.step_with_batch_queue`, two deep under async scheduling): plan k + 1 is made
    while step k runs; an empty one (A passed over at the cap) fills the queue without a step, so the engine core
    blocks on step k's output, processes it, takes the requests that arrived meanwhile (its input queue, between
    two `step` calls) and plans k + 2 at step k's end, seeing them. Constant steps of 10 ms, max_model_len 12.
    A (prompt 8, output 4) at 0: plan 1 prefills 8 (step 1, 0 → 0.01); plan 2, made at 0 (async), verifies 3
    (step 2, 0.01 → 0.02); plan 3, made at 0.01, passes A over (computed 11, cap 11 − 11 = 0) and is empty.
    B (prompt 4, output 1) arrives at 0.015, during step 2: plan 4, made at 0.02, decodes A's token and admits B
    (its prompt, 4 tokens): B first scheduled at 0.02, its token out of step 4 at 0.03. Planned as of step 2's
    start (0.01), plan 4 would miss B, admitted a step later (0.03, its token at 0.04)."""
    a, b = make_request(0, 0.0, 8, 4), make_request(1, 0.015, 4, 1)
    rec = run(scheduler(max_model_len=12), [a, b])
    assert list(rec.frame()["num_batched_tokens"]) == [8, 3, 5, 1]
    assert (b.first_scheduled_s, b.finish_s) == (0.02, 0.03)
    assert (a.num_output_tokens, a.finish_s) == (4, 0.04)
