"""KV memory managers: pure Python, no simpy, driven by method calls.

Every allocator implements `KVAllocator` (`protocol.py`); `kvsim.engine.make_allocator`
builds the one an engine config asks for.
"""

from __future__ import annotations

from kvsim.content import SegmentContent, TokenContent
from kvsim.memory.accounting import FIG2_KEYS, Waste, fig2_shares, sharing_saved_slots, waste
from kvsim.memory.block_pool import BlockPool
from kvsim.memory.hybrid import GroupedPagedAllocator
from kvsim.memory.paged import PagedAllocator
from kvsim.memory.protocol import NO_HIT, KVAllocator, PrefixHit, SwapResult
from kvsim.memory.slab import SlabAllocator, region_slots

__all__ = [
    "FIG2_KEYS", "NO_HIT", "BlockPool", "GroupedPagedAllocator", "KVAllocator", "PagedAllocator", "PrefixHit",
    "SegmentContent", "SlabAllocator", "SwapResult", "TokenContent", "Waste", "fig2_shares", "region_slots",
    "sharing_saved_slots", "waste",
]
