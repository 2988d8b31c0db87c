"""Rejected drafts after a verify step, every method: what the scheduler keeps and what the drafter reads next.

vLLM v1 (vllm/v1/core/sched/scheduler.py, `update_from_output`) rolls `num_computed_tokens` back by the drafts
the target rejected; the drafter, run right after the verify over the padded batch, subtracts them from
`seq_lens` before its one-token passes (`propose`, vllm/v1/spec_decode/eagle.py: `seq_lens -=
num_rejected_tokens_gpu`, then `seq_lens += 1` a pass). Each expectation below steps that code by hand.
"""

import pytest

from kvsim.kv import PagedAllocator
from kvsim.latency.speculative import SpeculativeLatency
from kvsim.model.speculative_config import SpeculativeConfig
from kvsim.sched import SchedulerLimits, make_scheduler
from kvsim.sched.speculative import make_speculation
from tests.conftest import make_request


class Recording:
    """A latency model that records each plan's (sequences, summed context) and costs 1 s."""

    name = "recording"
    cudagraph_padding = None

    def __init__(self):
        self.seen = []

    def step_time(self, plan):
        self.seen.append((plan.num_seqs, plan.sum_context_tokens))
        return 1.0


def scheduler(method, **acceptance):
    config = SpeculativeConfig(method=method, num_speculative_tokens=3, model="llama-3.2-1b"
                               if method == "draft_model" else None, **acceptance)
    return make_scheduler("v1", PagedAllocator(40, 4, enable_caching=False), SchedulerLimits(16, 256, 512),
                          speculation=make_speculation(config))


@pytest.mark.parametrize(("method", "appends"), [("eagle", False), ("eagle3", False), ("draft_model", True)])
def test_the_drafter_passes_after_a_verify_read_the_context_without_its_rejected_drafts(method, appends):
    # K = 3, synthetic length 3: every verify accepts 2 drafts and rejects 1. Prompt 5: step 1 prefills it and
    # samples token 1 (computed 5). Step 2 verifies it + 3 drafts: 4 tokens, seq_lens 5 + 4 = 9 in the target.
    # vLLM then keeps computed 5 + 4 - 1 = 8. EAGLE's drafter: first pass over the 4 tokens (contexts 9), then
    # seq_lens 9 - 1 = 8 and its K - 1 = 2 passes at 9 and 10. A draft model extends every query by one first
    # (seq_lens 10), so 10 - 1 = 9, passes at 10 and 11. Before the fix they read 10, 11 (EAGLE) and 11, 12.
    sched = scheduler(method, synthetic_acceptance_length=3.0)
    sched.add(make_request(0, 0.0, 5, 10))
    sched.complete(sched.schedule(0.0), 1.0)
    plan = sched.schedule(1.0)
    assert [n for _, n in plan.scheduled] == [4] and plan.num_rejected_draft_tokens == 1
    drafter = Recording()
    assert SpeculativeLatency(Recording(), drafter, 3, method, appends_next_token=appends).step_time(plan) == 4.0
    first = 9 + appends
    assert drafter.seen == [(1, first), (1, first), (1, first + 1)]  # the first pass, then 8 + 1, 8 + 2 (+ 1)
    sched.complete(plan, 2.0)
    req = sched.running[0]
    assert (req.num_computed_tokens, req.num_output_tokens) == (8, 4)  # the next step verifies after 8


def test_ngram_drafts_cost_nothing_whatever_the_verify_rejects():
    # n-gram drafting runs on the CPU: the step costs the target's verify alone, rejected drafts or not
    sched = scheduler("ngram", synthetic_acceptance_length=1.0)  # every draft rejected
    sched.add(make_request(0, 0.0, 5, 10))
    sched.complete(sched.schedule(0.0), 1.0)
    plan = sched.schedule(1.0)
    assert plan.num_rejected_draft_tokens == 3
    assert SpeculativeLatency(Recording(), None, 3, "ngram").step_time(plan) == 1.0


def test_the_acceptance_priced_is_the_acceptance_completed():
    # Random acceptance: the drafts a plan counts rejected must be those its completion discards. A verify of
    # d drafts that emits e tokens accepted e - 1 (while the output is not capped), so rejected = d - (e - 1).
    sched = scheduler("eagle", acceptance_rates=(0.6, 0.5, 0.4))
    for rid in range(4):
        sched.add(make_request(rid, 0.0, 7 + rid, 40))
    now, num_checked = 0.0, 0
    while sched.has_work:
        plan = sched.schedule(now)
        before = {r.request_id: r.num_output_tokens for r, _ in plan.scheduled}
        drafts = dict(sched.speculation.pending)
        now += 1.0
        sched.complete(plan, now)
        rejected = 0
        for req, num_new in plan.scheduled:
            if req.request_id in drafts:
                emitted = req.num_output_tokens - before[req.request_id]
                assert num_new == 1 + drafts[req.request_id]
                rejected += drafts[req.request_id] - (emitted - 1)
                num_checked += req.num_output_tokens < req.output_len
        if all(r.num_output_tokens < r.output_len for r, _ in plan.scheduled):
            assert plan.num_rejected_draft_tokens == rejected
    assert num_checked > 20
    assert sched.speculation.num_accepted_tokens < sched.speculation.num_draft_tokens  # some were rejected


def test_the_closed_form_cohort_prices_the_drafter_without_the_expected_rejected_drafts():
    # `kvsim capacity`'s closed form: 2 sequences of context 200 (prompt 100, output 100) verify 1 + 3 tokens after
    # 100 + 50 - 1 = 149, contexts 153 each, 306 in all. Mean acceptance length L = 2.5 accepts 1.5 drafts a verify
    # on average and rejects 3 - 1.5 = 1.5 per sequence, 3 over the cohort: EAGLE's two one-token passes read
    # 306 - 3 + 2 · 1 = 305 and 307 (before: 308 and 310).
    from kvsim.latency.roofline import cohort_output_tokens_per_s

    drafter = Recording()
    cohort_output_tokens_per_s(SpeculativeLatency(Recording(), drafter, 3, "eagle"), 2, 200,
                               num_speculative_tokens=3, acceptance_length=2.5)
    assert drafter.seen[-3:] == [(2, 306), (2, 305), (2, 307)]  # the verify's first pass, then the two passes
