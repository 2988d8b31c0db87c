"""Continuous batching policies: `v1` (default), `v0` and `static`; pure Python, no simpy.

The waiting queue is a scheduling policy of its own (`request_queue`: FCFS or priority, with
the preemption victim it implies), given to any of them.
"""

from __future__ import annotations

from kvsim.kv import KVAllocator
from kvsim.sched.base import Scheduler
from kvsim.sched.limits import SchedulerLimits, SchedulerSnapshot
from kvsim.sched.request_queue import FCFSQueue, PriorityQueue, RequestQueue, make_request_queue
from kvsim.sched.speculative import Speculation
from kvsim.sched.static import StaticScheduler
from kvsim.sched.v0 import V0Scheduler
from kvsim.sched.v1 import V1Scheduler

POLICIES: dict[str, type[Scheduler]] = {"v1": V1Scheduler, "v0": V0Scheduler, "static": StaticScheduler}


def make_scheduler(policy: str, allocator: KVAllocator, limits: SchedulerLimits, rng=None,
                   waiting: RequestQueue | None = None, speculation: Speculation | None = None) -> Scheduler:
    """`rng` (a numpy Generator) drives beam-search survivor draws and draft acceptance; pass the run's
    generator. `waiting`: the waiting queue and its policy (default FCFS, `make_request_queue`);
    `speculation` turns on speculative decoding (v1 only)."""
    assert speculation is None or policy == "v1", "speculative decoding is modelled in the v1 scheduler"
    scheduler = POLICIES[policy](allocator, limits, rng, waiting)
    scheduler.speculation = speculation
    return scheduler


__all__ = ["POLICIES", "FCFSQueue", "PriorityQueue", "RequestQueue", "Scheduler", "SchedulerLimits",
           "SchedulerSnapshot", "StaticScheduler", "V0Scheduler", "V1Scheduler", "make_request_queue",
           "make_scheduler"]
