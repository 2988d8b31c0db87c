"""The values a scheduler is built from and reports, immutable: `SchedulerLimits` (the engine arguments that
bound a step) and `SchedulerSnapshot` (the engine's state at one instant, as a step row records it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kvsim.kv import KVOccupancy


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """The engine arguments that bound a step, resolved for one model."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    watermark_slots: int = 0  # free slots admission must leave (v0's 1 % watermark)
    preemption_mode: str | None = None  # None: recompute, or swap for multi-sequence groups (v0)
    can_swap: bool = False  # `EngineConfig.can_swap`: a preemption may swap at all (`Scheduler.use_swap`)
    swap_space_gib: float = 0.0  # engine.swap_space, the CPU swap per GPU: named when it runs out


class SchedulerSnapshot(NamedTuple):
    """An engine's state at one instant, as a step row records it (`Scheduler.snapshot`): the queues'
    lengths, the preemptions so far and where the KV pool's slots are. The recorder reads this, never
    the scheduler's queues or its allocator. Immutable (a NamedTuple: one is built per step).

    `draft_rejected`, with speculative decoding only: the held slots still holding drafts a verify
    rejected (`Scheduler.draft_rejected_slots`), as (those below their sequence's final length, which
    the pool counts reserved; those past it, which it counts internal fragmentation)."""

    num_running: int
    num_waiting: int
    num_swapped: int
    num_preemptions: int
    kv: KVOccupancy
    draft_rejected: tuple[int, int] | None = None
