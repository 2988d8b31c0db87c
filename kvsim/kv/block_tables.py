"""Block-table arithmetic over a group of sequences (pure functions of tables and ref counts).

A *group* is sequences that move or grow together: a forked family swapped out and back in, or the
sequences one scheduling decision grows. Blocks may be shared inside the group (forks share a prefix
and possibly a partial last block) and with sequences outside it (prefix-cache hits).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Protocol

from kvsim.model.units import ceil_div


class Table(Protocol):
    """What the arithmetic reads of a sequence: its block table and how many slots it has written."""

    @property
    def block_table(self) -> list[int]: ...
    @property
    def num_tokens(self) -> int: ...


def growth_blocks(seqs: Sequence[Table], targets: Sequence[int], block_size: int,
                  ref_count: Callable[[int], int]) -> int:
    """Blocks a group of sequences takes to grow each to its target token count.

    New blocks where a sequence crosses a boundary, plus copies of shared partial last
    blocks: k group members sharing one copy k − 1 times (the last writer keeps it), or k
    times if someone outside the group shares it too (`ref_count(block) > k`).
    """
    blocks, sharers = 0, dict[int, int]()
    for seq, target in zip(seqs, targets, strict=True):
        if target <= seq.num_tokens:
            continue
        blocks += max(0, ceil_div(target, block_size) - len(seq.block_table))
        if seq.num_tokens % block_size:
            sharers[seq.block_table[-1]] = sharers.get(seq.block_table[-1], 0) + 1
    for block_id, k in sharers.items():
        blocks += k - 1 if ref_count(block_id) == k else k
    return blocks


def distinct_blocks(tables: Sequence[list[int]]) -> list[int]:
    """The distinct blocks of a group's tables, in first-seen order (what a swap moves, once each)."""
    return list(dict.fromkeys(b for table in tables for b in table))


def repeated_blocks(tables: Sequence[list[int]]) -> list[int]:
    """Each block once per table after the first that holds it: a group's tables mapped onto new blocks
    (ref count 1 each) need these touched once more each for the ref counts to equal the references."""
    seen: set[int] = set()
    repeats = []
    for table in tables:
        for block_id in table:
            if block_id in seen:
                repeats.append(block_id)
            seen.add(block_id)
    return repeats


def table_references(tables: Sequence[list[int]], num_blocks: int) -> list[int]:
    """How many references `tables` hold to each block id 0 .. num_blocks − 1 (ids a pool of that many handed
    out): a checked run's recount of the ref counts, at every step (the distinct blocks set one by one)."""
    refs = [0] * num_blocks
    for block_id, count in Counter(chain.from_iterable(tables)).items():
        refs[block_id] = count
    return refs
