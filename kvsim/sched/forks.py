"""The scheduler's half of parallel sampling and beam search (a request's `n` > 1 sequences): forking a
request's samples off its prompt once it is prefilled (vLLM v0's parallel sampling: the v0 and static
policies; v1 fans samples out instead, `kvsim.sched.fanout`), and re-forking beams as beam search drops
and duplicates them (`kvsim.sched.beams` models which survive). Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvsim.sched.beams import select_beams
from kvsim.sched.fanout import sample_content

if TYPE_CHECKING:
    from kvsim.kv import KVAllocator
    from kvsim.workload.request import Request


class SampleForks:
    """Mixed into `kvsim.sched.base.Scheduler`, whose state it uses (`alloc`, `rng`, the two tables below,
    which `Scheduler.free_request` clears for a request that leaves)."""

    alloc: KVAllocator
    rng: np.random.Generator
    _forked: set[int]  # request ids whose samples have been forked
    _beam_scores: dict[int, np.ndarray]  # request id -> cumulative log-prob of each beam slot

    if TYPE_CHECKING:
        def active_seq_ids(self, req: Request) -> list[int]: ...

    def num_queued(self, req: Request) -> int:
        """How many requests `req` joins the waiting queue as: one, whose samples fork once it is prefilled
        (the v1 policy fans n > 1 samples out into n requests instead: `kvsim.sched.fanout`)."""
        return 1

    def _fork_samples(self, req: Request) -> None:
        """Once `req` is prefilled (its first token sampled on its first sequence), fork its n − 1 other
        samples off that sequence, as vLLM v0 does: each shares the prompt's blocks (a partial last block
        is copied on its first write). Each child gets an output of its own (`sample_content`, as v1's fanned-out
        children do), so the blocks it fills hash apart from its siblings'. A child of token-level content was
        given its parent's tokens: every sample's output blocks hashed as the first sample's."""
        parent = req.seq_ids[0]
        for index, child in enumerate(req.child_seq_ids(), start=1):
            self.alloc.fork(parent, child, sample_content(req, index), req.kv_len)
        self._forked.add(req.request_id)

    def _reselect_beams(self, req: Request) -> None:
        """Beam search step: the W best continuations survive (`beams.select_beams` states the model).

        A beam that is the parent of at least one survivor keeps its slot for its first one;
        slots of beams with no survivor are freed and re-forked from the parents of the extra
        survivors, sharing their blocks (a partial last block is copied on the next write) and their
        tokens so far, not their next one (vLLM v0's `_process_sequence_group_outputs` forks the parent and
        appends the child's own candidate token): the allocator's `fork` without content branches it there.
        It took its parent's whole content: its later blocks hashed as its parent's (duplicates in the cache,
        and under v0's prefix caching swapped for the parent's blocks). Slabs keep a region per beam, so
        nothing moves there.
        """
        if not self.alloc.shares_blocks:
            return
        seq_ids = self.active_seq_ids(req)
        scores = self._beam_scores.get(req.request_id)
        if scores is None:
            scores = np.zeros(len(seq_ids))
        parents, new_scores = select_beams(scores, self.rng)
        slot_scores = np.empty(len(seq_ids))
        kept: set[int] = set()
        extra = []
        for parent, score in zip(parents, new_scores, strict=True):
            if parent in kept:
                extra.append((parent, score))
            else:
                kept.add(parent)
                slot_scores[parent] = score
        dead = [i for i in range(len(seq_ids)) if i not in kept]
        for slot, (parent, score) in zip(dead, extra, strict=True):
            self.alloc.free(seq_ids[slot])
            self.alloc.fork(seq_ids[parent], seq_ids[slot], None, req.kv_len)
            slot_scores[slot] = score
        self._beam_scores[req.request_id] = slot_scores
