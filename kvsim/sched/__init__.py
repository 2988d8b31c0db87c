"""Continuous batching policies: `v1` (default), `v0` and `static`; pure Python, no simpy."""

from __future__ import annotations

from kvsim.kv import KVAllocator
from kvsim.sched.base import Scheduler, SchedulerLimits
from kvsim.sched.static import StaticScheduler
from kvsim.sched.v0 import V0Scheduler
from kvsim.sched.v1 import V1Scheduler

POLICIES: dict[str, type[Scheduler]] = {"v1": V1Scheduler, "v0": V0Scheduler, "static": StaticScheduler}


def make_scheduler(policy: str, allocator: KVAllocator, limits: SchedulerLimits, rng=None) -> Scheduler:
    """`rng` (a numpy Generator) drives beam-search survivor draws; pass the run's generator."""
    return POLICIES[policy](allocator, limits, rng)


__all__ = ["POLICIES", "Scheduler", "SchedulerLimits", "StaticScheduler", "V0Scheduler", "V1Scheduler",
           "make_scheduler"]
