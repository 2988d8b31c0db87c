"""A chat client that sends a conversation's next turn after the previous reply has come
(`workload.multi_turn.timing: after_reply`), as vLLM's multi-turn benchmark client does: the arrival side
of `kvsim.engine.loop.run_engines` for such a run.

    first turns   at the arrival process's instants (`Conversations.first_arrival_s`, known up front)
    turn k + 1    at finish_s(turn k) + think_time_s: known only once turn k has ended, in the run
    turn k        rejected: its conversation ends there (its later turns are never sent, said in one warning
                  line once the client ends, `UNSENT_TURNS`: the summary counts the turns sent)
    request ids   0, 1, ... in send order; at one instant, follow-ups before first turns, and either
                  in conversation order (a conversation's number is its first turn's place in arrival order)

How the client learns that a turn ended: every engine rings it at each step boundary where it recorded a
request that ended since the client last looked (`Engine.at_step_boundary`, which must be unset), and the
client reads those rows (`RequestRecords.ends`). A request finishes at a step's end and the step loop
calls its boundary at that very instant, so the client sees every ending when it happens; a turn rejected
on arrival is recorded while the client delivers it. The client waits for the earlier of a ring and the
next send instant, on one timer per instant (`at_instant`, exact: a follow-up's `arrival_s` is exactly
`finish_s + think_time_s`); SimPy's public API only.

With a closed-loop cap as well (`workload.max_concurrency`), a turn due while the cap's requests are in
flight waits in the client (first due, first sent) as any request does there: it is sent when one ends,
that instant its `arrival_s` and the wait its `client_queue_s`.

Decode bursts are off in such a run (as behind a closed-loop cap): their look-ahead needs the next arrival
instants, and a follow-up's is not known before its previous turn ends.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import math
from collections.abc import Callable, Generator, Iterator, Sequence

import simpy

from kvsim.engine.clock import Wakeup, at_instant
from kvsim.engine.runtime import Engine
from kvsim.workload.conversations import Conversations
from kvsim.workload.generate import KeptWarnings
from kvsim.workload.request import Request

log = logging.getLogger(__name__)

UNSENT_TURNS = ("workload.multi_turn.timing=after_reply: %s of %s turns were never sent (a rejected turn ends its "
                "conversation, as vLLM's multi-turn benchmark client drops it); the run has the %s sent")
"""The warning the client logs when it ends (`TurnArrivals.client`) having sent fewer turns than its conversations
hold: the summary counts the requests sent ("2 finished, 2 rejected of 4"), which read as a whole run of 4."""


@contextlib.contextmanager
def unsent_turns_kept() -> Iterator[list[tuple]]:
    """Inside, the `UNSENT_TURNS` warning is not said; the list yielded gets its arguments, for the process that
    reports to say (`say_unsent_turns`): a run in a worker process or on a Dask worker said it there, where a
    notebook's or a remote user's process never heard it (`kvsim.planning.sweep.run_many`)."""
    gate = KeptWarnings(UNSENT_TURNS, said_first=False)
    log.addFilter(gate)
    try:
        yield gate.kept
    finally:
        log.removeFilter(gate)


def say_unsent_turns(args: tuple) -> None:
    """Say here the `UNSENT_TURNS` warning a run kept (`unsent_turns_kept`), as the run would have said it."""
    log.warning(UNSENT_TURNS, *args)


class TurnArrivals:
    """The run's sends for `after_reply` conversations (module docstring); an `ArrivalClock` for the step
    loops. Only the conversations in progress hold state (`Conversations`), and a pending follow-up is
    two numbers (its send instant and its conversation) until it is sent."""

    __slots__ = ("conversations", "num_arrived", "ended", "_env", "_engines", "_next_first", "_pending", "_in_flight",
                 "_seen")

    def __init__(self, env: simpy.Environment, conversations: Conversations, engines: Sequence[Engine]) -> None:
        self.conversations = conversations
        self.num_arrived = 0  # requests sent: the next one's id
        self.ended = Wakeup(env)  # rung when an engine recorded a request that ended since the client looked
        self._env, self._engines = env, engines
        self._next_first = 0  # the next conversation to start
        self._pending: list[tuple[float, int]] = []  # (send instant, conversation): follow-ups in their think time
        self._in_flight: dict[int, int] = {}  # request id -> its conversation: sent, not seen to end
        self._seen = [0] * len(engines)  # rows of each engine's records the client has read
        for i, engine in enumerate(engines):
            assert engine.at_step_boundary is None, "a multi-turn client's engines mark no other step boundary"
            engine.at_step_boundary = functools.partial(self._at_boundary, i)

    def join(self, engine: Engine) -> None:
        """An engine that joined the run after the others (`kvsim.engine.loop.LateEngines`), already last in the
        engines list the client was given: read as those are."""
        assert engine is self._engines[-1] and engine.at_step_boundary is None
        self._seen.append(0)
        engine.at_step_boundary = functools.partial(self._at_boundary, len(self._seen) - 1)

    def __len__(self) -> int:
        return len(self.conversations)

    def _at_boundary(self, i: int, now: float) -> None:
        if len(self._engines[i].scheduler.records) > self._seen[i]:
            self.ended.ring()

    @property
    def all_arrived(self) -> bool:
        """Nothing more will be sent: every conversation has started and ended."""
        return self._next_first == self.conversations.num_conversations and not self._pending and not self._in_flight

    def horizon_s(self, num_ahead: int) -> float:
        """Now, while anything may still be sent (a turn in flight may end now and be followed at once); inf
        once nothing will. A bound only: decode bursts, which read it, are off in such a run."""
        return math.inf if self.all_arrived else self._env.now

    def none_delivered_at(self, instants_s: Sequence[float]) -> bool:
        """Promised only once nothing more will be sent (a follow-up's instant is not known ahead)."""
        return self.all_arrived

    def client(self, deliver: Callable[[Request], None], max_in_flight: int | None = None) -> Generator:
        """The client's process: send each turn when it is due (`deliver` hands it to an engine), until every
        conversation has ended. `max_in_flight`: a closed-loop cap on requests sent and not yet ended."""
        env = self._env
        timer: simpy.Event | None = None
        timer_s = math.nan  # the instant `timer` fires at
        while True:
            self._collect()
            if self.all_arrived:
                if self.num_arrived < len(self.conversations):
                    log.warning(UNSENT_TURNS, f"{len(self.conversations) - self.num_arrived:,}",
                                f"{len(self.conversations):,}", f"{self.num_arrived:,}")
                return
            due_s, conv, follow_up = self._next_due()
            if due_s > env.now:
                if due_s != timer_s:
                    timer, timer_s = (at_instant(env, due_s) if due_s < math.inf else None), due_s
                yield from self.ended.wait(timer)
                continue
            if max_in_flight is not None and len(self._in_flight) >= max_in_flight:
                yield from self.ended.wait()
                continue
            if follow_up:
                heapq.heappop(self._pending)
            else:
                self._next_first += 1
            req = self.conversations.send(conv, self.num_arrived, due_s)
            if env.now > due_s:  # held back by the cap: sent now, its wait counted apart (as the closed loop's)
                req.client_queue_s, req.arrival_s = env.now - due_s, env.now
            self._in_flight[req.request_id] = conv
            self.num_arrived += 1
            deliver(req)

    def _next_due(self) -> tuple[float, int, bool]:
        """(send instant, conversation, whether a follow-up) of the next turn due; inf while none is known."""
        firsts = self.conversations.first_arrival_s
        first_s = float(firsts[self._next_first]) if self._next_first < len(firsts) else math.inf
        if self._pending and self._pending[0][0] <= first_s:
            due_s, conv = self._pending[0]
            return due_s, conv, True
        return first_s, self._next_first, False

    def _collect(self) -> None:
        """Read the requests that ended since the client last looked; book each finished turn's follow-up."""
        think_s = self.conversations.think_time_s
        for i, engine in enumerate(self._engines):
            records = engine.scheduler.records
            if len(records) == self._seen[i]:
                continue
            for request_id, finished, finish_s in records.ends(self._seen[i]):
                conv = self._in_flight.pop(request_id)
                if self.conversations.ended(conv, finished):
                    heapq.heappush(self._pending, (finish_s + think_s, conv))
            self._seen[i] = len(records)
