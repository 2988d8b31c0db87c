"""What every scheduling policy shares: queues, the step's plan, preemption, step completion.

A scheduler is pure Python, driven by two calls per engine step:

    plan = scheduler.schedule(now)     # which requests compute how many tokens; may preempt
                                       # (async scheduling: `schedule(now, planned_s)`, decided earlier)
    scheduler.complete(plan, now)      # tokens computed: sample, finish, free KV

`schedule` is the policy's `select` (v1, v0, static: the (request, new tokens) pairs, in order) and
then `account`, the one place a step's token totals are written.

Requests that can never be served are rejected on `add` with a recorded reason (`kvsim.sched.admission`);
nothing is dropped silently. n > 1 samples fork off the first sequence once it is prefilled (`SampleForks`), as
in vLLM v0; the v1 policy fans them out into n requests, as vLLM v1 does (`kvsim.sched.fanout`).
Every request that ends (finished or rejected) is copied into `records`
(`kvsim.results.records.RequestRecords`, columnar) and the scheduler keeps no reference to it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from kvsim.kv import (
    KVAllocator,
    PrefixCacheStats,
    occupancy,
)
from kvsim.kv.offload_connector import OffloadConnector
from kvsim.latency.step_plan import StepPlan
from kvsim.model.errors import KvsimError
from kvsim.results.metrics import EngineCounters, SpecDecodeCounters
from kvsim.results.records import RequestRecords
from kvsim.sched.admission import Admission
from kvsim.sched.async_steps import AsyncSteps
from kvsim.sched.forks import SampleForks
from kvsim.sched.limits import SchedulerLimits, SchedulerSnapshot
from kvsim.sched.livelock import SelfPreemptions
from kvsim.sched.offload import OffloadScheduling
from kvsim.sched.request_queue import FCFSQueue, RequestQueue
from kvsim.sched.speculative import Speculation
from kvsim.sched.speculative_steps import SpeculativeSteps
from kvsim.workload.request import Request, RequestStatus


class Scheduler(Admission, OffloadScheduling, SpeculativeSteps, AsyncSteps, SampleForks, SelfPreemptions):
    """Base class: subclasses implement `select` (v1, v0, static); refusal on arrival and admission are
    `Admission`, KV offload's half is `OffloadScheduling`, speculative decoding's `SpeculativeSteps`, async
    scheduling's `AsyncSteps`, parallel sampling's and beam search's `SampleForks`, the livelock check at a
    self-preemption `SelfPreemptions`."""

    name = "base"
    decode_windows: tuple[int, ...] = ()  # the model's sliding windows and attention chunks (the builder's)
    logits_every_request = False  # a logits row for each scheduled request, a partial prefill chunk's too
    # (vLLM v1: `V1Scheduler`); else only for the sequences that sample (v0's `do_sample`)

    def __init__(self, allocator: KVAllocator, limits: SchedulerLimits, rng: np.random.Generator | None = None,
                 waiting: RequestQueue | None = None) -> None:
        self.alloc = allocator
        self.rng = rng if rng is not None else np.random.default_rng(0)  # beam search picks survivors
        self.limits = limits
        # the scheduling policy: the waiting order and the preemption victim (default FCFS, vLLM's default)
        self.waiting: RequestQueue = waiting if waiting is not None else FCFSQueue()
        self.speculation: Speculation | None = None  # speculative decoding (v1 only): set by `make_scheduler`
        self.running: list[Request] = []
        self.finishing: list[Request] = []  # finished, KV released after the next decision (`AsyncSteps`)
        self.swapped: deque[Request] = deque()
        self.records = RequestRecords()  # every request that ended (finished or rejected), columnar
        self.num_preemptions = self.num_swapped_out_bytes = 0
        self.num_steps_planned = 0  # a decode burst's steps each (`kvsim.sched.async_steps`: which step sampled what)
        self.num_recomputed_tokens = 0  # tokens computed again after a preemption dropped their KV (`Request.drop_kv`)
        # when the step being planned was decided: vLLM's SCHEDULED timestamp of the requests it admits
        # (`schedule`'s `planned_s`; with async scheduling the previous step's start)
        self.planned_s = 0.0
        self.prefix_stats = PrefixCacheStats()  # recorded at each admission (`admit`)
        self._forked: set[int] = set()  # request ids whose samples have been forked
        self.admission_order: dict[int, int] = {}  # request id -> admissions counted when it was last admitted
        self._num_admissions = 0
        # Disaggregated prefill/decode (`kvsim.fleet.disagg`); both stay empty otherwise.
        # A decode instance: requests that join the queue with their KV already held here (loaded from a
        # prefill instance): request id -> tokens held, admitted as computed (vLLM's remote-prefill requests).
        self.held_kv_tokens: dict[int, int] = {}
        # A prefill instance: called with each request it finishes, whose KV it keeps (not freed) until
        # the transfer to a decode instance ends; the callee frees it (`free_request`).
        self.hand_off: Callable[[Request, float], None] | None = None
        self._beam_scores: dict[int, np.ndarray] = {}  # request id -> cumulative log-prob of each beam slot
        # KV offload (`engine.kv_offload`, v1 only; `kvsim.kv.offload_connector`), set by the builder: requests
        # whose prefix loads from a lower tier wait in `loading` (id -> (request, tokens it will hold)), out of
        # `waiting`, as vLLM's WAITING_FOR_REMOTE_KVS; each request's next block to offer to the tiers.
        self.offload: OffloadConnector | None = None
        self.loading: dict[int, tuple[Request, int]] = {}
        self._next_stored_block: dict[int, int] = {}

    # ---------------------------------------------------------------- queues
    def counters(self) -> EngineCounters:
        """The run-long counters a summary reports (`kvsim.results.metrics.summarize`)."""
        stats, spec = self.prefix_stats, self.speculation
        spec_counters = None if spec is None else SpecDecodeCounters(
            spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens, spec.rejected_slot_s,
            self.alloc.num_total_slots)
        return EngineCounters(self.num_preemptions, stats.num_query_tokens, stats.num_hit_tokens,
                              stats.num_preempted_query_tokens, stats.num_preempted_hit_tokens,
                              self.num_swapped_out_bytes, self.alloc.num_copy_on_writes, self.num_recomputed_tokens,
                              stats.num_query_blocks, stats.num_hit_blocks, spec_counters)

    def snapshot(self) -> SchedulerSnapshot:
        """The queues and the KV pool now (a step row's state)."""
        return SchedulerSnapshot(len(self.running), self.num_waiting, len(self.swapped), self.num_preemptions,
                                 occupancy(self.alloc, self.next_request_slots()),
                                 None if self.speculation is None else self.draft_rejected_slots())

    def next_request_slots(self) -> int | None:
        """The region the next waiting request needs (slabs' external fragmentation is relative to it)."""
        if not self.waiting:
            return None
        head = self.waiting.peek()
        return self.alloc.region_slots(head.kv_len, head.prompt_len)

    @property
    def kv_usage(self) -> float:
        """vLLM's `kv_cache_usage_perc` now."""
        return self.alloc.usage

    @property
    def num_held_slots(self) -> int:
        """KV slots held now (0 once every request has ended)."""
        return self.alloc.num_held_slots

    def check_invariants(self) -> None:
        """The allocator's books balance (`KVAllocator.check_invariants`); raises AssertionError if not."""
        self.alloc.check_invariants()
        if self.offload is not None:
            self.offload.check_invariants()
            assert set(self.loading) == set(self.offload.loading_ids), "a load without its request, or the reverse"

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped or self.loading or self.finishing)

    def add(self, req: Request) -> bool:
        """Queue a request, or reject it (recording why) if it can never be served."""
        if not self.accept(req):
            return False
        self.enqueue(req)
        return True

    def enqueue(self, req: Request) -> None:
        """Queue a request `accept` took (in the waiting order of the policy)."""
        self.waiting.add(req)

    def num_running_seqs(self) -> int:
        """Sequences running, as `max_num_seqs` counts them: every sample of a request.

        vLLM v0 counts `seq_group.get_max_num_running_seqs()` (n for parallel sampling, from the
        prefill on: vllm/core/scheduler.py); v1's children have one sample each (`kvsim.sched.fanout`).
        With async scheduling a request that finished still holds its slot until the next decision.
        """
        return sum([r.num_samples for r in self.running]) + self.num_finishing_seqs()  # a list: faster than a generator

    def computing_seqs(self, req: Request) -> int:
        """The sequences a scheduled `req` computes (`_sequences`): its beams or samples once forked, else one."""
        return _sequences(req, self._forked)

    # ------------------------------------------------------------ allocation
    def active_seq_ids(self, req: Request) -> list[int]:
        return req.seq_ids + req.child_seq_ids() if req.request_id in self._forked else req.seq_ids

    def try_allocate(self, req: Request, num_tokens_total: int | None, plan: StepPlan, hold_slots: int = 0) -> bool:
        """Grow every active sequence of `req` to `num_tokens_total` slots, all or none; the blocks
        copied on the way are the plan's (`StepPlan.num_copied_blocks`). A single sequence also holds
        `hold_slots` slots (a speculative verify step's, `KVAllocator.hold`), and only those when
        `num_tokens_total` is None (a finished request's discarded verify writes nothing it keeps)."""
        seq_ids = self.active_seq_ids(req)
        if len(seq_ids) == 1:
            if hold_slots and not self.alloc.hold(seq_ids[0], hold_slots):
                return False
            if num_tokens_total is None:
                return True
            result = self.alloc.allocate(seq_ids[0], num_tokens_total, req.kv_len, req.content)
            if result is None:
                return False
            plan.num_copied_blocks += result.num_copied_blocks
            return True
        assert num_tokens_total is not None, "only a single sequence holds slots alone"
        needed = self.alloc.slots_needed(seq_ids, num_tokens_total)
        if needed and needed > self.alloc.num_free_slots:
            return False
        for seq_id in seq_ids:
            grown = self.alloc.allocate(seq_id, num_tokens_total)
            assert grown is not None
            plan.num_copied_blocks += grown.num_copied_blocks
        return True

    # ------------------------------------------------------------ the step's plan
    def schedule(self, now: float, planned_s: float | None = None) -> StepPlan:
        """The step starting at `now`: the policy's choice (`select`), then its token totals (`account`).
        `planned_s` (default `now`): when vLLM made that choice, the time it stamps on the requests it
        admits (`first_scheduled_s`, whence `queue_s`); with async scheduling, while the step before ran."""
        self.planned_s = now if planned_s is None else planned_s
        self.num_steps_planned += 1
        plan = self.select(now)
        self.account(plan)
        if self.speculation is not None:
            self.draw_verify_outcomes(plan)
        self.release_finished()
        return plan

    def select(self, now: float) -> StepPlan:  # pragma: no cover - abstract
        """The policy: `plan.scheduled`, the (request, new tokens per sequence) pairs the step computes, in
        order, with the plan's preemptions, swaps and copies; its token totals are left to `account`."""
        raise NotImplementedError

    def account(self, plan: StepPlan) -> None:
        """Write the token totals of every (request, new tokens) of `plan.scheduled` (`StepPlan.add`): the
        one place a step's accounting is written, once the policy's choice is final.

        A step's logits rows (`StepPlan.num_logits_rows`, what the LM head and sampler run on): one per
        sequence that samples (its chunk reaches `num_tokens`) or, under `logits_every_request`, per scheduled
        sequence; each verifying sequence one per token it verifies (`StepPlan.add_verify`).

        A plain decode (one token after ≥ 1 computed, sampling, one sequence: most entries of most
        steps) is summed here and added with the others at once (`StepPlan.add_decodes`, the same totals);
        a speculative verify step has its own totals (`StepPlan.add_verify`). Exact because planning never
        changes a scheduled request's `num_computed_tokens` afterwards: a request preempted after it was
        scheduled is taken out of `plan.scheduled` (v1's priority victims; FCFS victims are never
        scheduled yet, they come after it in `running`). Hot: every scheduled request of every step.
        """
        num_decodes = sum_context = max_context = 0
        min_context = -1
        forked, add, every = self._forked, plan.add, self.logits_every_request
        verifying = self.speculation.pending if self.speculation is not None else None
        for req, num_new in plan.scheduled:
            past = req.num_computed_tokens
            if verifying is not None and req.request_id in verifying:
                plan.add_verify(num_new, past)
            elif (num_new == 1 and past and past + 1 == req.prompt_len + req.num_output_tokens
                  and (req.num_samples == 1 or req.request_id not in forked)):
                if not req.num_output_tokens:  # the prompt's last token: priced as a decode, reported as prefill
                    plan.num_one_token_chunks += 1
                num_decodes += 1
                sum_context += past + 1
                if past >= max_context:
                    max_context = past + 1
                if past < min_context or min_context < 0:  # past < min ⟺ past + 1 ≤ min
                    min_context = past + 1
            else:
                num_seqs = _sequences(req, forked)
                if num_new == 1 and past and past + 1 < req.prompt_len + req.num_output_tokens:  # a chunk of one
                    plan.num_one_token_chunks += num_seqs  # (`add` prices it as a decode)
                add(num_new, past, num_seqs, every or past + num_new == req.num_tokens)
                self.num_recomputed_tokens += req.num_recomputed(past, num_new) * num_seqs
        if num_decodes:
            plan.add_decodes(num_decodes, sum_context, max_context, min_context)
        if self.decode_windows and plan.num_decode_seqs:
            plan.windowed_decode_context_tokens = self._decode_context_in_windows(plan)

    def _decode_context_in_windows(self, plan: StepPlan) -> dict[int, int]:
        """Σ min(context, window) for each of `decode_windows` over what `account` counted as decodes (one
        token after ≥ 1 computed, each sequence of a forked request): a second pass, for windowed models only."""
        sums = dict.fromkeys(self.decode_windows, 0)
        forked = self._forked
        for req, num_new in plan.scheduled:
            past = req.num_computed_tokens
            if num_new == 1 and past:
                num_seqs = _sequences(req, forked)
                for window in sums:
                    sums[window] += min(past + 1, window) * num_seqs
        return sums

    # ------------------------------------------------------------ preemption
    def allocate_or_preempt(self, req: Request, num_tokens_total: int | None, plan: StepPlan,
                            hold_slots: int = 0) -> bool:
        """Grow `req` (`try_allocate`), preempting the policy's victims (`RequestQueue.victim_index`; FCFS: from
        the back of `running`) until it fits.

        Returns False when `req` itself was preempted (`note_self_preemption` raises `SchedulingLivelock` where
        that loops forever). FCFS never picks a request scheduled
        earlier in this step (those precede `req` in `running`); a policy that can must take
        the victim out of `plan` itself. With async scheduling the victim may be a request that
        just finished and still holds its KV (`AsyncSteps.finishing_victim`), as in vLLM, `req` itself
        when it is one (its discarded verify: `kvsim.sched.v1.V1Scheduler.select`).
        """
        running = self.running
        while not self.try_allocate(req, num_tokens_total, plan, hold_slots):
            finished = self.finishing_victim() if self.finishing else None
            if finished is not None:
                self.preempt_finishing(finished, plan)
                if finished is req:
                    return False
                continue
            victim = running.pop(self.waiting.victim_index(running))
            self.preempt(victim, plan)
            if victim is req:
                self.note_self_preemption(req, max(num_tokens_total or 0, hold_slots), plan)
                return False
        return True

    def free_request(self, req: Request) -> None:
        """Free the request's KV and its per-request state; the offload tiers' next block to store is kept (a
        preempted request's too, as vLLM's connector keeps `next_stored_block_idx`) until it finishes (`finish`)."""
        for seq_id in req.seq_ids + req.child_seq_ids():
            if self.alloc.holds(seq_id):
                self.alloc.free(seq_id)
        self._forked.discard(req.request_id)
        self.admission_order.pop(req.request_id, None)
        self._beam_scores.pop(req.request_id, None)

    def preempt(self, req: Request, plan: StepPlan) -> None:
        """Recompute (free all, back to the queue front) or swap out, as the policy says.

        A swap the CPU swap space cannot hold ends the run with a `KvsimError`: vLLM v0 aborts the
        engine there (`Scheduler._swap_out`: "Aborted due to the lack of CPU swap space"), so no run of
        this configuration completes and its latencies would describe nothing vLLM does."""
        self.num_preemptions += 1
        req.num_preemptions += 1
        plan.preempted.append(req)
        if self.use_swap(req):
            result = self.alloc.swap_out(self.active_seq_ids(req))
            if result is None:
                raise KvsimError(
                    f"engine.swap_space={self.limits.swap_space_gib:g}: the CPU swap space cannot hold request "
                    f"{req.request_id} when it is preempted by swap ({self.num_preemptions} preemptions so far), "
                    "and vLLM v0 aborts the engine there ('Aborted due to the lack of CPU swap space'); "
                    "raise engine.swap_space or set engine.preemption_mode=recompute")
            req.status = RequestStatus.SWAPPED
            self.swapped.append(req)
            plan.swap_out_bytes += result.num_bytes
            self.num_swapped_out_bytes += result.num_bytes
            return
        self.forget_in_flight_hash(req, plan)
        self.forget_draft_hashes(req, plan)
        self.free_request(req)
        req.drop_kv()
        self.waiting.prepend(req)

    def use_swap(self, req: Request) -> bool:
        """Whether preempting `req` swaps its KV out rather than dropping it: never, but in v0 (`V0Scheduler`)."""
        return False

    # ------------------------------------------------------------ completion
    def complete(self, plan: StepPlan, now: float) -> list[Request]:
        """Apply a finished step: advance progress, sample tokens, fork samples, finish and free."""
        done, running, spec = [], RequestStatus.RUNNING, self.speculation
        step, in_flight = self.num_steps_planned, self.async_scheduling  # vLLM sees this step's tokens a plan late
        if spec is not None:
            spec.integrate_rejected_slots(now)
        for req, num_new in plan.scheduled:
            if req.status is not running:
                continue  # preempted later in the same planning pass
            if spec is not None and req.request_id in spec.pending:
                if self._complete_verify(spec, req, spec.pending[req.request_id], spec.accepted[req.request_id]):
                    done.append(req)
                continue
            req.num_computed_tokens = computed = req.num_computed_tokens + num_new
            if spec is not None and req.request_id in spec.overwriting:  # its step wrote over rejected drafts
                req.num_rejected_draft_slots = max(0, req.num_rejected_draft_slots - num_new)
            num_output = req.num_output_tokens
            if computed < req.prompt_len + num_output:
                continue  # a prefill chunk: nothing sampled yet
            req.num_output_tokens = num_output = num_output + 1
            if in_flight:
                if req.sampled_step == step - 1:
                    req.in_flight_decode_step = step
                req.sampled_step = step
            if req.first_token_s is None:
                req.first_token_s = now
            if spec is not None:
                req.has_drafts = True  # the drafter proposes after every step that samples
            if req.num_samples > 1 and req.request_id not in self._forked:
                self._fork_samples(req)
            elif req.beam and num_output < req.output_len:
                self._reselect_beams(req)
            if num_output >= req.output_len:
                done.append(req)
        if spec is not None:
            spec.pending.clear()
            spec.accepted.clear()
            spec.overwriting.clear()
        if self.offload is not None:
            self._store_computed(plan, now)
        return self.finish(done, now)

    def finish(self, done: list[Request], now: float) -> list[Request]:
        """Mark requests that produced their last token finished at `now` and free their KV (with async
        scheduling, once the next step is planned: `AsyncSteps`)."""
        hand_off, next_stored = self.hand_off, self._next_stored_block
        finished, running = RequestStatus.FINISHED, RequestStatus.RUNNING  # an Enum member lookup costs ~0.1 µs
        for req in done:
            req.status, req.finish_s = finished, now
            if next_stored:
                next_stored.pop(req.request_id, None)
            if hand_off is None:
                self._end_kv(req)
        if done:
            self.running = [r for r in self.running if r.status is running]
            self.record_rows(done)  # the scheduler keeps no finished Request: memory stays bounded
            if hand_off is not None:
                for req in done:
                    hand_off(req, now)
        return done

    def record_rows(self, done: list[Request]) -> None:
        """Write the rows of requests that just finished (v1: a parent's once its last child has)."""
        self.records.extend(done)

    # ------------------------------------------- decode bursts (`kvsim.sched.burst`)
    @property
    def allows_bursts(self) -> bool:
        """False under the priority policy (a later arrival can outrank a blocked head and be admitted:
        burst condition (b) holds for FCFS admission only), with speculative decoding (a verify step
        is not a one-token decode) and with KV offload (every step's stores and loads are timed)."""
        return self.waiting.policy == "fcfs" and self.speculation is None and self.offload is None

    def burst_fits(self, seq_ids: list[int], num_steps: int) -> bool:  # v0 asks more (`V0Scheduler.burst_fits`)
        return self.alloc.burst_fits(seq_ids, num_steps)

    def schedules_whole_decode_batch(self, num_running: int) -> bool:
        """Whether one step decodes all `num_running` requests (policies with a token budget may not)."""
        return True

    def waiting_blocked(self) -> bool:  # pragma: no cover - abstract
        """Whether the policy's next step would admit nothing from `waiting` (the batch stays)."""
        raise NotImplementedError


def _sequences(req: Request, forked: set[int]) -> int:
    """The sequences a scheduled request computes: its samples once forked, else one."""
    return req.num_samples if req.num_samples > 1 and req.request_id in forked else 1
