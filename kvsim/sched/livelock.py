"""A scheduling livelock said in one line: a running request that preempts itself and comes back to the same
state, with nothing left that could change it, preempts itself forever.

A v1 request is admitted when its prompt fits (vLLM asks no speculative lookahead of a request with nothing
computed), but each later chunk asks its lookahead slots too; where the requests holding KV they loaded
(a disaggregated decode instance's) leave it less than that, its last chunk preempts it (the only request
running), it goes back to the head of the queue, is admitted again and recomputes its prompt: 13,148
preemptions in 15 s of wall time and no end, where vLLM's scheduler loops the same way. A run that samples no
token for ever must drop computed tokens for ever, and the request a policy preempts last (the front of FCFS's
`running`, priority's most urgent one) is preempted by another only in corner cases (an async finished request's
discarded verify): the loops found (the reviewer's, fuzzing) all run through a self-preemption, where the check is.

The check is exact. At each self-preemption once nothing timed can reach the engine any more (`outside_state`, set
by the step loop: every arrival delivered and seen, no KV transfer or load in flight; a disaggregated decode
instance adds its hand-offs waiting for blocks and its idle prefill instances' states), the scheduler's whole
state is taken: its queues in order with every field of each request that a decision reads, the step planned so
far, the speculative and async books, the random generator's state and the allocator's (`KVAllocator.state_key`).
The engine's future is a function of that state alone then (time only stamps records), so a state seen before
repeats for ever: `SchedulingLivelock`. A state that never recurs (arrivals to come, a transfer in flight, another
request finishing, a sampled token, a new random draw) never fires. The states kept are dropped whenever a token is
sampled or a request ends (a state before that can never recur), so memory stays small. Not checked (never
fires): an allocator that cannot say its state (slabs) and KV offload on the engine (its
tiers' LRU and timed transfers; it is refused with speculation, whose lookahead makes these loops). Nothing is
taken in a run that never preempts a request by itself: no cost per step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from kvsim.model.errors import SchedulingLivelock
from kvsim.sched.fanout import request_label

if TYPE_CHECKING:
    import numpy as np

    from kvsim.kv import KVAllocator
    from kvsim.kv.offload_connector import OffloadConnector
    from kvsim.latency.step_plan import StepPlan
    from kvsim.results.records import RequestRecords
    from kvsim.sched.request_queue import RequestQueue
    from kvsim.sched.speculative import Speculation
    from kvsim.workload.request import Request


class SelfPreemptions:
    """Mixed into `kvsim.sched.base.Scheduler`, whose state it reads (`running`, `waiting`, `alloc`, ...)."""

    alloc: KVAllocator
    rng: np.random.Generator
    waiting: RequestQueue
    running: list[Request]
    finishing: list[Request]
    swapped: Iterable[Request]
    loading: dict[int, tuple[Request, int]]
    records: RequestRecords
    held_kv_tokens: dict[int, int]
    held_kv_source: str
    admission_order: dict[int, int]
    load_waiters: frozenset[int]
    speculation: Speculation | None
    offload: OffloadConnector | None
    _forked: set[int]
    if TYPE_CHECKING:
        @property
        def awaits_transfers(self) -> bool:
            """`kvsim.sched.offload.OffloadScheduling.awaits_transfers`."""
    # set by the step loop (`kvsim.engine.loop.outside_state`): what outside the scheduler its steps still read, and
    # only they change, as a hashable value; None while something timed may still reach it (an arrival, a transfer)
    outside_state: Callable[[], tuple[Any, ...] | None] | None = None
    _seen_states: set[tuple[Any, ...]] | None = None  # states at self-preemptions since the last progress
    _seen_progress: int = -1

    def note_self_preemption(self, req: Request, num_slots: int, plan: StepPlan) -> None:
        """`req` just preempted itself asking for `num_slots` slots (its tokens and lookahead): raise
        `SchedulingLivelock` where this state was seen before with nothing able to reach the engine."""
        outside = self.outside_state() if self.outside_state is not None and self.offload is None else None
        if outside is None:  # (the offload tiers' transfers and LRU are not taken)
            self._seen_states = None
            return
        allocator_state = self.alloc.state_key()
        if allocator_state is None:  # an allocator that cannot say its whole state: never fires
            return
        queues = (self.running, list(self.waiting), list(self.swapped), self.finishing,
                  [r for r, _ in self.loading.values()])
        progress = len(self.records) + sum(r.num_output_tokens for queue in queues for r in queue)
        if progress != self._seen_progress or self._seen_states is None:
            self._seen_states, self._seen_progress = set(), progress
        state = (outside, allocator_state, self._scheduler_state(queues, plan))
        if state in self._seen_states:
            raise SchedulingLivelock(self._livelock_line(req, num_slots))
        self._seen_states.add(state)

    def idle_state(self) -> tuple[Any, ...] | None:
        """The whole state of a scheduler that runs nothing (its queue's head blocked: it steps again only once
        something reaches it), hashable; None while it runs, finishes or loads a request, while its head waits for
        a KV offload store in flight (`awaits_transfers`: its end wakes it), or for an allocator that cannot say its
        state (a disaggregated decode instance's check takes its prefill instances' this way). Its offload tiers are
        not taken: with nothing in flight that wakes it, they change only in its own steps, and those come only
        after a KV transfer ends, which changes the tables it keeps for hand-offs (the state) for good."""
        if self.running or self.finishing or self.swapped or self.awaits_transfers:
            return None
        allocator_state = self.alloc.state_key()
        queue = list(self.waiting)
        return None if allocator_state is None else (allocator_state, tuple(map(_request_state, queue)),
                                                     len(self.records), repr(self.rng.bit_generator.state))

    def _scheduler_state(self, queues: tuple[list[Request], ...], plan: StepPlan) -> tuple[Any, ...]:
        """Everything of the scheduler a later decision reads, but the allocator's: the queues in order with each
        request's changing fields, admission order, the step planned so far, the books, the generator's state."""
        spec = self.speculation
        books = () if spec is None else tuple(tuple(sorted(d.items())) for d in (
            spec.pending, spec.accepted, spec.in_flight_rejected, spec.in_flight_finished))
        return (tuple(tuple(map(_request_state, queue)) for queue in queues),
                tuple(sorted(self.admission_order, key=self.admission_order.__getitem__)),
                tuple((r.request_id, n) for r, n in plan.scheduled), tuple(r.request_id for r in plan.preempted),
                tuple(sorted(self.held_kv_tokens.items())), tuple(sorted(self.load_waiters)),
                tuple(sorted(self._forked)), books, repr(self.rng.bit_generator.state))

    def _livelock_line(self, req: Request, num_slots: int) -> str:
        """The one line: who cannot fit what, and who holds the KV it would need."""
        lookahead = self.speculation.num_lookahead_slots if self.speculation is not None else 0
        asks = f"its {req.num_tokens} tokens" + (f" and the {lookahead} slots of its speculative lookahead"
                                                 if lookahead else "")
        loaded = [request_label(r.request_id) for r in self.waiting if r.request_id in self.held_kv_tokens]
        running = [request_label(r.request_id) for r in self.running]
        holders = ([f"requests [{', '.join(loaded)}] waiting behind it hold the KV they loaded from "
                    f"{self.held_kv_source}"] if loaded else []) + (
            [f"requests [{', '.join(running)}] running hold theirs"] if running else [])
        return (f"engine.scheduling_policy={self.waiting.policy}: request {request_label(req.request_id)} preempts "
                f"itself forever: it needs {self.alloc.region_slots(num_slots)} KV slots for {asks}, "
                f"{self.alloc.num_free_slots} of the KV cache's {self.alloc.num_total_slots} are free"
                + "".join(f" and {holder}" for holder in holders)
                + "; admitted again, it recomputes and preempts itself again with nothing changed, as vLLM's "
                "scheduler would loop: give the KV cache more blocks (engine.num_gpu_blocks_override, "
                "engine.gpu_memory_utilization)")


def _request_state(req: Request) -> tuple[Any, ...]:
    """The fields of a request that a scheduling decision reads and that change while it runs."""
    return (req.request_id, req.status, req.num_computed_tokens, req.num_output_tokens, req.output_len,
            req.has_drafts, req.num_rejected_draft_slots, req.num_verify_steps, tuple(req.seq_ids))
