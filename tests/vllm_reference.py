"""What the second implementations of vLLM's v1 scheduler (tests/test_async_reference.py,
tests/test_spec_reference.py, tests/test_priority_reference.py) share: a request's state as vLLM keeps it, on a
bare block count, and how a test hands the same arrivals to kvsim's scheduler. Written from vLLM's code
(vllm/v1/request.py, vllm/v1/core/sched/scheduler.py), not from kvsim's."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.sched.base import Scheduler
from tests.conftest import make_request


@dataclass(eq=False)
class RefRequest:
    """vLLM's `Request`, as far as a block count needs it: `computed` is `num_computed_tokens`, `placeholders`
    async scheduling's tokens of the step in flight (sampled and drafts, counted computed), `output` the tokens
    its processed outputs appended, `drafts` the drafts proposed for its next verify."""

    rid: int
    arrival_s: float
    priority: int
    prompt: int
    max_tokens: int
    computed: int = 0
    placeholders: int = 0
    output: int = 0
    drafts: int = 0
    blocks: int = 0
    running: bool = False
    finished: bool = False

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.output


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def arrive(sched: Scheduler, rid: int, arrival_s: float, prompt: int, max_tokens: int, priority: int) -> None:
    """Hand kvsim's scheduler the request the reference admits to its waiting queue."""
    req = make_request(rid, arrival_s, prompt, max_tokens)
    req.priority = priority
    assert sched.add(req)


def key(req: RefRequest) -> tuple[int, float]:
    return req.priority, req.arrival_s


class VllmV1:
    """vLLM v1's scheduler state, with K = `num_drafts` drafts a step (0: no speculative decoding) accepting
    `num_accepted` each: `running`, `waiting` (pop order), free blocks, and (async) the step in flight, whose output
    is processed after the next step is planned. The rules: tests/test_spec_reference.py and
    tests/test_async_reference.py."""

    def __init__(self, policy: str, num_free_blocks: int, budget: int, max_num_seqs: int, max_model_len: int,
                 num_drafts: int, num_lookahead: int, num_accepted: int, async_scheduling: bool,
                 block_size: int) -> None:
        self.policy, self.free, self.budget, self.max_num_seqs = policy, num_free_blocks, budget, max_num_seqs
        self.max_model_len, self.k, self.lookahead, self.accepted = max_model_len, num_drafts, num_lookahead, \
            num_accepted
        self.async_scheduling, self.block_size = async_scheduling, block_size
        self.running: list[RefRequest] = []
        self.waiting: list[RefRequest] = []
        self.in_flight: list[tuple[RefRequest, bool, int]] = []  # (request, samples, drafts verified)

    def add(self, req: RefRequest, front: bool = False) -> None:
        self.waiting.insert(0 if front else len(self.waiting), req)
        if self.policy == "priority":
            self.waiting.sort(key=lambda r: (*key(r), r.rid))

    def _grow(self, req: RefRequest, num_slots: int) -> bool:
        need = cdiv(min(num_slots, self.max_model_len), self.block_size) - req.blocks
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
                    victim = max(self.running, key=key)
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
                if cdiv(req.num_tokens, self.block_size) > self.free:  # scheduler_reserve_full_isl
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


def run_against_reference(sched: Scheduler, vllm: VllmV1, refs: list[RefRequest]) -> None:
    """Step kvsim's scheduler and the reference side by side, arrivals at whole steps, until every request ends:
    each step's scheduled (request, tokens) in order and its preemptions equal, and the requests ended and the free
    blocks after each output the reference processed (async: the output of the step before)."""
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
        if vllm.async_scheduling:  # vLLM processed the output of the step before, whose ends kvsim has counted
            assert (num_done, sched.alloc.pool.num_free_blocks) == (num_ref_done, vllm.free), f"step {now}"
        num_done += len(sched.complete(plan, now + 1.0))
        if not vllm.async_scheduling:
            assert (num_done, sched.alloc.pool.num_free_blocks) == (num_ref_done, vllm.free), f"step {now}"
        sched.check_invariants()
        now += 1
    assert num_ref_done + vllm.finish() == len(refs) and not vllm.running and not vllm.waiting
