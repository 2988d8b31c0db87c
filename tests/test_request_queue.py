"""The waiting queue's two orderings and preemption victims, on hand-built queues (vLLM v1's request_queue.py)."""

from __future__ import annotations

import pytest

from kvsim.sched.request_queue import FCFSQueue, PriorityQueue, make_request_queue
from kvsim.workload.request import Request
from tests.conftest import tiny_world


def req(rid: int, arrival_s: float = 0.0, priority: int = 0) -> Request:
    r = Request(rid, arrival_s, 10, 5)
    r.priority = priority
    return r


def ids(queue) -> list[int]:
    return [r.request_id for r in queue]


def test_fcfs_orders_by_arrival_and_prepends_preempted_to_the_front():
    q = FCFSQueue()
    a, b, c = req(0), req(1), req(2)
    for r in (a, b, c):
        q.add(r)
    assert len(q) == 3 and q and ids(q) == [0, 1, 2] and [r.request_id for r in reversed(q)] == [2, 1, 0]
    assert q.peek() is a and len(q) == 3  # peek leaves it queued
    assert q.pop() is a
    q.prepend(a)  # a preempted request goes back to the front
    assert ids(q) == [0, 1, 2]
    q.remove(b)
    assert ids(q) == [0, 2]
    assert q.pop() is a and q.pop() is c
    assert not q and len(q) == 0
    with pytest.raises(IndexError):
        q.peek()
    with pytest.raises(IndexError):
        q.pop()


def test_priority_orders_by_priority_then_arrival_then_request_id():
    q = PriorityQueue()
    # (id, arrival, priority): expected order (0, 1.0, #2), (0, 3.0, #1), (1, 0.0, #3), (1, 0.0, #4), (2, 0.0, #0)
    for rid, arrival_s, priority in ((0, 0.0, 2), (1, 3.0, 0), (2, 1.0, 0), (4, 0.0, 1), (3, 0.0, 1)):
        q.add(req(rid, arrival_s, priority))
    assert ids(q) == [2, 1, 3, 4, 0]
    assert len(q) == 5 and ids(q) == [2, 1, 3, 4, 0]  # iterating pops nothing
    assert q.peek().request_id == 2
    first = q.pop()
    assert first.request_id == 2 and ids(q) == [1, 3, 4, 0]
    q.prepend(first)  # no front in a heap: it goes where its key puts it (here, first again)
    late = req(9, 0.5, 5)
    q.prepend(late)
    assert ids(q) == [2, 1, 3, 4, 0, 9]
    q.remove(next(r for r in q if r.request_id == 3))
    assert ids(q) == [2, 1, 4, 0, 9]
    assert [q.pop().request_id for _ in range(len(q))] == [2, 1, 4, 0, 9]
    with pytest.raises(IndexError):
        q.peek()
    with pytest.raises(ValueError, match="request 3 is not queued"):
        q.remove(req(3))


def test_victims_fcfs_last_admitted_priority_lowest_priority_latest_arrival():
    running = [req(0, 0.0, 1), req(1, 2.0, 3), req(2, 1.0, 3), req(3, 5.0, 0)]
    assert FCFSQueue().victim_index(running) == 3  # the most recently admitted
    # max (priority, arrival): priority 3 at 2.0 s beats priority 3 at 1.0 s, and both beat 5.0 s at priority 0
    assert PriorityQueue().victim_index(running) == 1
    tied = [req(5, 1.0, 2), req(6, 1.0, 2)]
    assert PriorityQueue().victim_index(tied) == 0  # Python's max keeps the first of equal keys, as vLLM's


def test_make_request_queue_by_policy_name():
    assert isinstance(make_request_queue(), FCFSQueue) and make_request_queue().policy == "fcfs"
    assert isinstance(make_request_queue("priority"), PriorityQueue)


def test_scheduler_admits_in_priority_order():
    """One sequence at a time: the priority-0 request is admitted first, though it arrived last."""
    s = tiny_world(max_num_seqs=1, num_blocks=20)
    s.waiting = PriorityQueue()
    for rid, priority in ((0, 2), (1, 1), (2, 0)):
        s.add(req(rid, 0.0, priority))
    plan = s.schedule(0.0)
    assert [r.request_id for r, _ in plan.scheduled] == [2]
    assert ids(s.waiting) == [1, 0]
