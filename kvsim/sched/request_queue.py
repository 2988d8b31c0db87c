"""The waiting queue and the preemption victim: one scheduling policy, FCFS or priority.

As vLLM v1's `vllm/v1/core/sched/request_queue.py` (`--scheduling-policy fcfs | priority`):

    fcfs      arrival order; a preempted request goes back to the front (`prepend`)
    priority  smallest (priority, arrival, request_id) first, a heap as vLLM's (its
              `Request.__lt__`: priority, arrival_time, then the request id string); `prepend` is
              `add`: a heap has no front

The third key only decides requests that arrive at the same instant. vLLM stamps `arrival_time` with
`time.time()` as its frontend takes each request in (vllm/v1/engine/processor.py, `process_inputs`),
so distinct client requests tie only if stamped alike, and then the order is that of its ids, random
strings behind the OpenAI server (`cmpl-<uuid>`); the ties it reaches by design are n > 1 children, who
share their parent's arrival and are ordered by their `f"{index}_{parent}"` ids, which kvsim's child ids
keep (`kvsim.sched.fanout.child_request_id`). kvsim's other ties (trace rows of one timestamp, a closed
loop's first sends) are sends of one instant, and the lower id is the earlier send, the order the frontend
would take them in and stamp them; a random order, as uuid ids give, is not drawn. The arrival is the one
the engine stamped (`Request.queue_arrival_s`): a disaggregated decode instance's frontend takes the request
when the proxy hands it over after prefill, so its queue orders by the hand-off, not the client's send.

The policy that orders the queue also picks whom to preempt when a running request cannot
get its KV (`victim_index`, vLLM's `Scheduler.schedule`):

    fcfs      the most recently admitted running request (the end of `running`)
    priority  the lowest-priority one: max (priority, arrival), the first such in `running`
              (Python's `max`, as vLLM calls it)

Contract (both queues): `peek` and `pop` raise IndexError on an empty queue; `remove` raises
ValueError for a request not queued; `len`, truth and iteration (in pop order, without popping)
are those of the requests queued. A scheduler that may preempt a request it already scheduled in
the same step (priority can pick any running request) must take that request's tokens out of its
step plan, as vLLM refunds them. Pure Python, no kvsim imports but `Request`.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Literal

from kvsim.workload.request import Request

SchedulingPolicy = Literal["fcfs", "priority"]


class RequestQueue:
    """What a scheduler uses of its waiting queue (see the module docstring for the contract)."""

    __slots__ = ()
    policy: SchedulingPolicy

    def add(self, req: Request) -> None:  # pragma: no cover - abstract
        """Queue a request where the policy orders it."""
        raise NotImplementedError

    def pop(self) -> Request:  # pragma: no cover - abstract
        """Remove and return the next request to admit."""
        raise NotImplementedError

    def peek(self) -> Request:  # pragma: no cover - abstract
        """The next request to admit, left queued."""
        raise NotImplementedError

    def prepend(self, req: Request) -> None:  # pragma: no cover - abstract
        """Queue a preempted request: at the front (FCFS), or where the policy orders it."""
        raise NotImplementedError

    def remove(self, req: Request) -> None:  # pragma: no cover - abstract
        """Take a queued request out (an abort)."""
        raise NotImplementedError

    def victim_index(self, running: Sequence[Request]) -> int:  # pragma: no cover - abstract
        """The index in `running` (admission order, not empty) of the request to preempt."""
        raise NotImplementedError

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def __iter__(self) -> Iterator[Request]:  # pragma: no cover - abstract
        """The queued requests in pop order."""
        raise NotImplementedError

    def __reversed__(self) -> Iterator[Request]:
        """The queued requests in reverse pop order (FCFS: the latest arrivals first)."""
        return reversed(list(self))


class FCFSQueue(RequestQueue):
    """First come, first served: a deque; preempted requests go back to its front."""

    __slots__ = ("_queue",)
    policy: SchedulingPolicy = "fcfs"

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._queue.append(req)

    def pop(self) -> Request:
        return self._queue.popleft()

    def peek(self) -> Request:
        if not self._queue:
            raise IndexError("peek from an empty queue")
        return self._queue[0]

    def prepend(self, req: Request) -> None:
        self._queue.appendleft(req)

    def remove(self, req: Request) -> None:
        self._queue.remove(req)

    def victim_index(self, running: Sequence[Request]) -> int:
        """The most recently admitted: the end of `running`."""
        assert running, "no running request to preempt"
        return len(running) - 1

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)

    def __reversed__(self) -> Iterator[Request]:
        return reversed(self._queue)


def priority_key(req: Request) -> tuple[int, float, int]:
    """The priority policy's order: smallest (priority, arrival, request_id) first (vLLM's `Request.__lt__`), the
    arrival its engine stamped (`Request.queue_arrival_s`: a disaggregated decode instance's is the hand-off)."""
    return req.priority, req.queue_arrival_s, req.request_id


class PriorityQueue(RequestQueue):
    """Smallest `priority_key` first: a heap of those keys with the request."""

    __slots__ = ("_heap",)
    policy: SchedulingPolicy = "priority"

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []  # request ids are unique: no tie reaches the Request

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (*priority_key(req), req))

    def pop(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty queue")
        return heapq.heappop(self._heap)[3]

    def peek(self) -> Request:
        if not self._heap:
            raise IndexError("peek from an empty queue")
        return self._heap[0][3]

    def prepend(self, req: Request) -> None:
        """A heap has no front: the request goes where its key puts it (as vLLM's)."""
        self.add(req)

    def remove(self, req: Request) -> None:
        for index, entry in enumerate(self._heap):
            if entry[3] is req:
                self._heap[index] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return
        raise ValueError(f"request {req.request_id} is not queued")

    def victim_index(self, running: Sequence[Request]) -> int:
        """The lowest priority: the first request with the largest (priority, arrival) (`Request.queue_arrival_s`)."""
        assert running, "no running request to preempt"
        return max(range(len(running)), key=lambda i: (running[i].priority, running[i].queue_arrival_s))

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in sorted(self._heap))


QUEUES: dict[str, type[RequestQueue]] = {"fcfs": FCFSQueue, "priority": PriorityQueue}


def make_request_queue(policy: SchedulingPolicy = "fcfs") -> RequestQueue:
    """The empty queue of a scheduling policy (vLLM's `create_request_queue`)."""
    return QUEUES[policy]()
