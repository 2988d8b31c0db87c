"""Decode bursts: many pure-decode engine steps planned and applied at once, exactly.

Most engine steps of a long run decode the same batch again and again: each running
request computes one token, nothing is admitted, nothing finishes. A burst plans `k` such
steps in one go (`plan_burst`), the engine advances time by the same `k` step durations,
and `apply_burst` applies them to the requests and the allocator with one call
(`KVAllocator.append_burst`). This module is the one place that decides when that is
allowed; the rest of the scheduler does not know bursts exist.

Why a burst equals `k` step-by-step iterations of `schedule` + `complete`
-------------------------------------------------------------------------
Let B be the running batch when the burst is planned. Conditions checked (`burst_batch`):

(a) the allocator supports bursts, the scheduler allows them (`allows_bursts`: FCFS, no
    speculation), every request in B is one sequence decoding (its prefill done, its first
    token sampled), nothing is swapped out, and the policy schedules all of B in one step
    (v1: |B| ≤ max_num_batched_tokens);
(b) the waiting queue is empty, or its head cannot be admitted now (`waiting_blocked`)
    and the burst does not register the block hash at which the head's prefix lookup
    stops, its first miss (`KVAllocator.burst_extends_prefix`);
(c) no request of B reaches its last token before the burst's last step
    (k ≤ min remaining output), and the burst's new blocks fit in the free memory
    (`KVAllocator.burst_fits`), so no step preempts;
(d) if the queue was empty, every step starts before `next_arrival_s`, and the engine cuts
    the burst after the step in flight when a request joins its queue (`kvsim.engine.runtime`):
    a step-by-step engine would see that request when that step ends. A single engine passes
    the run's next arrival, so nothing is cut; in a fleet the next arrival may go elsewhere.
    With async scheduling a step sees only what arrived by the start of the step before it
    (`kvsim.sched.async_steps`), so each bound moves one step later (`planned_ahead`): every
    step's previous step starts before `next_arrival_s`, and a join cuts one step after the one in flight;
(e) with async scheduling, no request that finished still holds its KV (`finishing`): it is released
    once the next step is planned, and its blocks (a partial last block goes to the free queue's
    head) would interleave with the burst's block takes; that step is planned as a single one.
(f) for each of the model's sliding windows or attention chunks w (`decode_windows`: a windowed model on
    the paged allocator, `disable_hybrid_kv_cache_manager`), every context stays on one side of w for
    the whole burst: all ≥ w, or all ≤ w through the last step (k ≤ w − max context + 1). A step's
    plan carries only Σ context, and min(Σ context, n · w) is Σ min(context, w), what `Scheduler.account`
    counts step by step (`StepPlan.decode_context_in_window`), exactly then.

By induction over the steps, assume steps 1..j−1 of the step-by-step run did exactly the
burst's work. At step j:
* Running requests: by (a) and (c) each request of B is still decoding with room for its
  next token, so `schedule` gives each exactly one token, in B's order, with no
  preemption; by (c) none finishes at the end of step j < k, and at step k exactly the
  requests whose output is complete finish, which `apply_burst` does at the same instant.
* Admission: if the queue was empty, by (d) no request joined it before step j was planned. If
  the head was blocked, it stays blocked: free memory only shrinks during a burst (blocks
  are taken, none released), `max_num_seqs` and the token budget see the same |B|, and
  by (b) the head's prefix hit cannot grow (its first miss stays missing; evicting cached
  free blocks only shortens it, and a hit on a free block costs the free block it saves,
  so a free hit block evicted, its hash then registered again in a block in use, saves
  the head no more than the free block the burst took). Arrivals join behind the
  head and admission is FCFS, so a blocked head admits nobody behind it.
* Memory: `append_burst` hands out blocks and registers filled blocks' hashes in
  (step, position) order, which is the order the k · |B| `allocate` calls would use.
* Time: the durations come from `burst_step_times`, the latency of the same plan with
  every context one token longer per step. The engine sums them as one timeout per step
  would and waits once, for the last step's end (`kvsim.engine.clock.call_at`), so the clock is
  bit-identical; where a request arrives exactly when a step ends, the order of the two
  events matters and it yields one timeout per step instead.
* What others see mid-burst (a fleet's router): requests are added (or rejected) at their
  arrival as step by step; none finishes before the last step; the KV usage after each
  step's allocation comes from `burst_occupancy` (`kvsim.engine.runtime.BurstInFlight`).
* Records: per-step rows come from the occupancy `append_burst` returns (held, filled,
  reserved after each step: `burst_occupancy` before the burst) and the waiting count
  before each step: the requests that joined the queue during the burst count from the
  first step that starts after their arrival.

`tests/test_engine_properties.py` runs every shipped scenario and random workloads both
ways (`simulate(..., bursts=False)`) and compares every row and summary value;
`tests/test_burst_exact.py` does it byte for byte on fleets of 8 and 16 replicas, every router.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Protocol

from kvsim.latency.base import LatencyModel, burst_step_times
from kvsim.latency.step_plan import StepPlan

if TYPE_CHECKING:
    from kvsim.kv.protocol import KVAllocator, Occupancy
    from kvsim.sched.request_queue import RequestQueue
    from kvsim.workload.request import Request


class BurstScheduler(Protocol):
    """What bursts need of a scheduler (`kvsim.sched.base.Scheduler` has it): its queues, its
    allocator, and two policy questions."""

    @property
    def alloc(self) -> KVAllocator: ...
    @property
    def decode_windows(self) -> tuple[int, ...]: ...
    @property
    def running(self) -> list[Request]: ...
    @property
    def waiting(self) -> RequestQueue: ...
    @property
    def swapped(self) -> Sequence[Request]: ...
    @property
    def finishing(self) -> list[Request]: ...
    num_steps_planned: int
    async_scheduling: bool

    @property
    def allows_bursts(self) -> bool:
        """False where the policy's steps are not the plain decodes and FCFS admission bursts assume."""
    def schedules_whole_decode_batch(self, num_running: int) -> bool:
        """Whether one step decodes all `num_running` requests (policies with a token budget may not)."""
    def burst_fits(self, seq_ids: list[int], num_steps: int) -> bool:
        """(c): `KVAllocator.burst_fits`, and whatever else the policy needs for no step to preempt."""
    def waiting_blocked(self) -> bool:
        """Whether the policy's next step would admit nothing from `waiting` (the batch stays)."""
    def finish(self, done: list[Request], now: float) -> list[Request]:
        """Mark requests that produced their last token finished at `now` and free their KV."""


@dataclass(frozen=True, slots=True)
class Burst:
    """`len(durations)` decode steps of `batch`; `durations` are the step times in seconds."""

    batch: list[Request]
    durations: list[float]
    seq_ids: list[int]  # each request's one sequence, in batch order


def burst_batch(scheduler: BurstScheduler) -> tuple[list[int], int, int, int, int] | None:
    """If conditions (a), (e), (f) and the first half of (b) hold: the running batch's sequence ids, its
    Σ, max and min context after one more token, and the most steps (c) and (f) allow."""
    running, waiting = scheduler.running, scheduler.waiting
    if (not running or scheduler.swapped or scheduler.finishing or not scheduler.alloc.supports_bursts
            or not scheduler.allows_bursts or not scheduler.schedules_whole_decode_batch(len(running))
            or waiting and not scheduler.waiting_blocked()):
        return None
    seq_ids, sum_context, max_context, max_steps = [], 0, 0, running[0].output_len
    min_context = running[0].num_computed_tokens + 1
    for req in running:  # decoding: computed = num_tokens − 1 with a token sampled (a prefill's last samples the first)
        num_output, context = req.num_output_tokens, req.num_computed_tokens + 1
        if req.num_samples > 1 or not num_output or context != req.prompt_len + num_output:
            return None
        seq_ids.append(req.seq_ids[0])
        sum_context += context
        if context > max_context:
            max_context = context
        if context < min_context:
            min_context = context
        if req.output_len - num_output < max_steps:
            max_steps = req.output_len - num_output
    for window in scheduler.decode_windows:  # (f)
        if min_context < window:
            if max_context > window:
                return None
            max_steps = min(max_steps, window - max_context + 1)
    return seq_ids, sum_context, max_context, min_context, max_steps


def plan_burst(scheduler: BurstScheduler, latency: LatencyModel, now: float, next_arrival_s: float,
               planned_ahead: bool = False) -> Burst | None:
    """The longest burst conditions (a)–(e) allow from `now`, or None (plan a single step).
    `planned_ahead` (async scheduling): each step is planned when the one before it starts, so it sees an
    arrival one step late."""
    checked = burst_batch(scheduler)
    if checked is None:
        return None
    seq_ids, sum_context, max_context, min_context, max_steps = checked
    first = StepPlan()
    first.add_decodes(len(seq_ids), sum_context, max_context, min_context)
    arrival_bound = math.inf if scheduler.waiting else next_arrival_s
    durations: list[float] = []
    if arrival_bound < math.inf:  # (d): as many steps as start (async: whose previous step starts) before it
        previous, start = -math.inf, now
        for d in islice(burst_step_times(latency, first), max_steps):
            if (previous if planned_ahead else start) >= arrival_bound:
                break
            durations.append(d)
            previous = start
            start += d
        num_steps = len(durations)
    else:  # no arrival bounds it: its length is known before its step times (under overload, far fewer are kept)
        num_steps = max_steps
    alloc = scheduler.alloc
    while num_steps and not scheduler.burst_fits(seq_ids, num_steps):
        num_steps //= 2  # (c): halve until the new blocks fit
    if not num_steps:
        return None
    if scheduler.waiting:
        head = scheduler.waiting.peek()
        if alloc.burst_extends_prefix(seq_ids, num_steps, head.content, head.num_tokens):
            return None
    if arrival_bound < math.inf:
        durations = durations[:num_steps]
    else:
        durations = list(islice(burst_step_times(latency, first), num_steps))
    return Burst(scheduler.running, durations, seq_ids)


def apply_burst(scheduler: BurstScheduler, burst: Burst, now: float) -> Occupancy:
    """Apply the burst's steps; `now` is when the last one ends. Returns the held, filled and reserved
    slots after each step (`KVAllocator.burst_occupancy` before it), for the step rows."""
    num_steps = len(burst.durations)
    occupancy = scheduler.alloc.append_burst(burst.seq_ids, num_steps)
    first = scheduler.num_steps_planned + 1
    scheduler.num_steps_planned = last = first + num_steps - 1
    in_flight = scheduler.async_scheduling  # each step decodes the token the one before sampled (`Scheduler.complete`)
    done = []
    for req in burst.batch:
        req.num_computed_tokens += num_steps
        req.num_output_tokens += num_steps
        if in_flight:
            if num_steps > 1 or req.sampled_step == first - 1:
                req.in_flight_decode_step = last
            req.sampled_step = last
        if req.num_output_tokens >= req.output_len:
            done.append(req)
    scheduler.finish(done, now)
    return occupancy
