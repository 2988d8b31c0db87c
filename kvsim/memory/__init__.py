"""KV memory managers: pure Python, no simpy, driven by method calls.

`make_allocator` builds the allocator an engine config asks for.
"""

from __future__ import annotations

from kvsim.memory.accounting import FIG2_KEYS, Waste, fig2_shares, sharing_saved_slots, waste
from kvsim.memory.block_pool import BlockPool
from kvsim.memory.content import SegmentContent, TokenContent
from kvsim.memory.hybrid import GroupedPagedAllocator
from kvsim.memory.paged import NO_HIT, PagedAllocator, PrefixHit, SwapResult
from kvsim.memory.slab import SlabAllocator, region_slots

__all__ = [
    "FIG2_KEYS", "NO_HIT", "BlockPool", "GroupedPagedAllocator",
    "PagedAllocator", "PrefixHit", "SegmentContent", "SlabAllocator", "SwapResult",
    "TokenContent", "Waste", "fig2_shares", "region_slots", "sharing_saved_slots", "waste",
]
