"""v1 speculative decoding in the scheduler against a naive second implementation of vLLM's rules (property test).

The reference below steps vLLM v1's synchronous `Scheduler` (vllm/v1/core/sched/scheduler.py `schedule`,
`_preempt_request`, `update_from_output`, `update_draft_token_ids`; vllm/v1/core/kv_cache_manager.py
`allocate_slots`) with K drafts a step and a fixed acceptance (`a` drafts of each verify accepted), on a bare
block count, written from that code and not from kvsim's:

* RUNNING first: `num_tokens_with_spec − num_computed_tokens` tokens (the last sampled token and its drafts),
  cut to the budget and to `max_model_len − 1 − num_computed_tokens`; `allocate_slots` needs the blocks of
  `min(num_computed_tokens + new + num_lookahead_tokens, max_model_len)` slots (`num_lookahead_tokens`: K for
  EAGLE and draft models, 0 for n-gram); the drafts scheduled are those the cut leaves; when the blocks are not
  there FCFS preempts `running.pop()` (priority: `max(running, key=(priority, arrival))`), which frees its blocks,
  zeroes its computed tokens and drops its drafts.
* WAITING in a step that preempted nothing: the whole prompt's blocks must be free (`scheduler_reserve_full_isl`),
  the first chunk's are taken, with no lookahead (`effective_lookahead_tokens` is 0 for a request with nothing
  computed).
* `update_from_output`: a verify of d drafts accepting a of them rolls `num_computed_tokens` back by d − a and
  appends a + 1 tokens (trimmed at `max_tokens`); blocks are kept. The drafter proposes K drafts after every step
  that is not a prefill chunk (`update_draft_token_ids` ignores a prefill chunk's).

Blocks: `cdiv(slots, block_size)` a request, the pool's block 0 reserved; no prefix caching.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvsim.kv import PagedAllocator
from kvsim.model.speculative_config import SpeculativeConfig
from kvsim.sched import SchedulerLimits, make_request_queue, make_scheduler
from kvsim.sched.speculative import make_speculation
from tests.vllm_reference import RefRequest, arrive, cdiv

BLOCK = 8




def _key(req: RefRequest) -> tuple[int, float]:
    return req.priority, req.arrival_s


class _VllmSpec:
    """vLLM's scheduler state with speculative decoding: `running`, `waiting` (pop order), free blocks, and (async)
    the step in flight, whose output is processed after the next step is planned."""

    def __init__(self, policy: str, num_free_blocks: int, budget: int, max_num_seqs: int, max_model_len: int,
                 num_drafts: int, num_lookahead: int, num_accepted: int, async_scheduling: bool) -> None:
        self.policy, self.free, self.budget, self.max_num_seqs = policy, num_free_blocks, budget, max_num_seqs
        self.max_model_len, self.k, self.lookahead, self.accepted = max_model_len, num_drafts, num_lookahead, \
            num_accepted
        self.async_scheduling = async_scheduling
        self.running: list[RefRequest] = []
        self.waiting: list[RefRequest] = []
        self.in_flight: list[tuple[RefRequest, bool, int]] = []  # (request, samples, drafts verified)

    def add(self, req: RefRequest, front: bool = False) -> None:
        self.waiting.insert(0 if front else len(self.waiting), req)
        if self.policy == "priority":
            self.waiting.sort(key=lambda r: (*_key(r), r.rid))

    def _grow(self, req: RefRequest, num_slots: int) -> bool:
        need = cdiv(min(num_slots, self.max_model_len), BLOCK) - req.blocks
        if need > self.free:
            return False
        req.blocks += max(need, 0)
        self.free -= max(need, 0)
        return True

    def step(self) -> tuple[list[tuple[int, int]], list[int], int]:
        """`schedule()`, then `update_from_output` of the step in flight (async) or of this one: (scheduled
        (id, tokens) in order, preempted ids, requests finished)."""
        previous = self.in_flight
        scheduled, preempted = self._schedule()
        num_finished = self._process_output(previous if self.async_scheduling else self.in_flight)
        return scheduled, preempted, num_finished

    def finish(self) -> int:
        return self._process_output(self.in_flight) if self.async_scheduling else 0

    def _schedule(self) -> tuple[list[tuple[int, int]], list[int]]:
        budget, scheduled, preempted, spec = self.budget, {}, [], {}
        by_id = {}
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.placeholders > 0 and req.computed + 2 - req.placeholders >= req.prompt + req.max_tokens:
                i += 1
                continue
            num_new = min(req.num_tokens + req.drafts + req.placeholders - req.computed, budget,
                          self.max_model_len - 1 - req.computed)
            if num_new == 0:
                i += 1
                continue
            fits = True
            while not self._grow(req, req.computed + num_new + self.lookahead):
                if self.policy == "priority":
                    victim = max(self.running, key=_key)
                    index = self.running.index(victim)
                    self.running.remove(victim)
                    if victim.rid in scheduled:
                        budget += scheduled.pop(victim.rid)
                        spec.pop(victim.rid, None)
                    if index < i:
                        i -= 1
                else:
                    victim = self.running.pop()
                self.free += victim.blocks
                victim.blocks = victim.computed = victim.placeholders = victim.drafts = 0
                victim.running = False
                self.add(victim, front=True)
                preempted.append(victim.rid)
                if victim is req:
                    fits = False
                    break
            if not fits:
                break
            scheduled[req.rid], by_id[req.rid] = num_new, req
            budget -= num_new
            i += 1
            if req.drafts:
                spec[req.rid] = min(req.drafts,
                                    max(0, num_new + req.computed - req.num_tokens - req.placeholders))
                req.drafts = 0
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                if cdiv(req.num_tokens, BLOCK) > self.free:  # scheduler_reserve_full_isl
                    break
                num_new = min(req.num_tokens, budget)
                assert self._grow(req, num_new)
                self.running.append(self.waiting.pop(0))
                req.running = True
                scheduled[req.rid], by_id[req.rid] = num_new, req
                budget -= num_new
        self.in_flight = []
        for req in self.running:  # `AsyncScheduler._update_after_schedule`: placeholders live one step only
            if self.async_scheduling and req.rid not in scheduled:
                req.drafts = 0
        for rid, num_new in scheduled.items():  # `_update_after_schedule`
            req = by_id[rid]
            req.computed += num_new
            samples = req.computed >= req.num_tokens + req.placeholders
            if samples and self.async_scheduling:  # `AsyncScheduler`: placeholders, placeholder drafts
                req.placeholders += 1 + spec.get(rid, 0)
                req.drafts = self.k
            self.in_flight.append((req, samples, spec.get(rid, 0)))
        return list(scheduled.items()), preempted

    def _process_output(self, step: list[tuple[RefRequest, bool, int]]) -> int:
        num_finished = 0
        for req, samples, num_drafts in step:
            if req.finished or not samples:
                continue  # a prefill chunk: nothing sampled, its drafts ignored
            num_accepted = min(self.accepted, num_drafts)
            if req.computed > 0:
                req.computed -= num_drafts - num_accepted
            if req.placeholders > 0:
                req.placeholders -= num_drafts - num_accepted
            num_appended = min(num_accepted + 1, req.max_tokens - req.output)
            req.output += num_appended
            if req.running and self.async_scheduling:
                req.placeholders -= num_appended
            if req.output == req.max_tokens:
                (self.running if req.running else self.waiting).remove(req)
                self.free += req.blocks
                req.blocks = 0
                req.finished = True
                num_finished += 1
            elif not self.async_scheduling:
                req.drafts = self.k  # `update_draft_token_ids`
        return num_finished


requests_st = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4), st.integers(1, 40), st.integers(1, 30)),
                       min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(requests_st, st.sampled_from(["fcfs", "priority"]), st.sampled_from(["eagle", "ngram"]), st.integers(1, 4),
       st.integers(0, 4), st.sampled_from([4, 8, 16, 64]), st.integers(1, 4), st.sampled_from([24, 48]),
       st.integers(0, 4), st.booleans())
# EAGLE, K = 3, every draft accepted, max_model_len 24: the drafts are cut to what the length leaves
@example([(0, 0, 17, 7)], "fcfs", "eagle", 3, 3, 64, 1, 24, 0, False)
# async, every draft rejected: vLLM plans each verify still counting the rejected drafts of the one in flight
@example([(0, 0, 4, 20)], "fcfs", "eagle", 3, 0, 64, 1, 24, 0, True)
# async, every draft accepted: the verify that ends a request by its drafts is followed by a discarded one
@example([(0, 0, 4, 5), (0, 2, 8, 3)], "fcfs", "eagle", 3, 3, 64, 4, 48, 0, True)
# async, priority: a finishing request's discarded verify does not fit and it is its own victim (found by hypothesis)
@example([(0, 0, 15, 7), (0, 0, 1, 1), (0, 0, 2, 4)], "priority", "eagle", 4, 1, 8, 2, 48, 0, True)
# async: a finishing request due a discarded verify is preempted before its turn by an earlier one's verify
@example([(0, 0, 1, 5), (0, 0, 3, 6), (0, 1, 1, 3)], "fcfs", "eagle", 4, 1, 16, 3, 48, 1, True)
# async, priority: a discarded verify scheduled earlier in the step is a later verify's victim (out of the plan)
@example([(0, 1, 24, 2), (1, 0, 1, 13), (1, 0, 5, 10), (1, 1, 1, 3)], "priority", "eagle", 4, 2, 64, 3, 48, 1, True)
def test_v1_speculative_steps_as_vllm_s_rules(specs, policy, method, k, accepted, budget, max_num_seqs,
                                              max_model_len, extra_blocks, async_scheduling):
    """Every step's scheduled (request, tokens) in order, its preemptions and the free blocks equal the reference's,
    from random arrivals (at whole steps), priorities and lengths, until all finish. With async scheduling the
    reference's `running` keeps a request until the output that ends it is processed, after the next plan, so a
    verify whose accepted drafts end it is followed by one more verify (its skip rule sees only the one sure token),
    which kvsim plans for the finishing request (`V1Scheduler._wasted_verifies`)."""
    num_accepted = min(accepted, k)
    config = SpeculativeConfig(method=method, num_speculative_tokens=k,
                               acceptance_rates=(1.0,) * num_accepted + (0.0,) * (k - num_accepted))
    num_blocks = max_model_len // BLOCK + 1 + extra_blocks  # vLLM's startup check: one request of max_model_len fits
    sched = make_scheduler("v1", PagedAllocator(num_blocks, BLOCK, enable_caching=False),
                           SchedulerLimits(max_num_seqs, budget, max_model_len), waiting=make_request_queue(policy),
                           speculation=make_speculation(config))
    sched.async_scheduling = async_scheduling
    refs = [RefRequest(rid, float(step), priority, prompt, min(output, max_model_len - prompt))
            for rid, (priority, step, prompt, output) in enumerate(specs) if prompt < max_model_len]
    vllm = _VllmSpec(policy, num_blocks - 1, budget, max_num_seqs, max_model_len, k, config.num_lookahead_tokens,
                     num_accepted, async_scheduling)
    now, num_done, num_ref_done = 0, 0, 0
    while num_done < len(refs):
        assert now < 2000, "no progress"
        for ref in refs:
            if ref.arrival_s == now:
                arrive(sched, ref.rid, ref.arrival_s, ref.prompt, ref.max_tokens, ref.priority)
                vllm.add(ref)
        plan = sched.schedule(float(now))
        expected, preempted, finished = vllm.step()
        num_ref_done += finished
        assert ([(r.request_id, n) for r, n in plan.scheduled], [r.request_id for r in plan.preempted]) \
            == (expected, preempted), f"step {now}"
        if async_scheduling:  # vLLM processed the output of the step before, whose ends kvsim has counted
            assert (num_done, sched.alloc.pool.num_free_blocks) == (num_ref_done, vllm.free), f"step {now}"
        num_done += len(sched.complete(plan, now + 1.0))
        if not async_scheduling:
            assert (num_done, sched.alloc.pool.num_free_blocks) == (num_ref_done, vllm.free), f"step {now}"
        sched.check_invariants()
        now += 1
    assert num_ref_done + vllm.finish() == len(refs)
