"""KV memory managers: pure Python, no simpy, driven by method calls.

Every allocator implements `KVAllocator` (`protocol.py`); `kvsim.engine.builder.make_allocator`
builds the one an engine config asks for.
"""

from __future__ import annotations

from kvsim.kv.accounting import FIG2_KEYS, Waste, fig2_shares, sharing_saved_slots, waste
from kvsim.kv.block_pool import BlockPool
from kvsim.kv.hybrid import GroupedPagedAllocator
from kvsim.kv.paged import PagedAllocator
from kvsim.kv.protocol import NO_HIT, KVAllocator, PrefixHit, SwapResult
from kvsim.kv.slab import SlabAllocator, region_slots
from kvsim.workload.content import SegmentContent, TokenContent

__all__ = [
    "FIG2_KEYS", "NO_HIT", "BlockPool", "GroupedPagedAllocator", "KVAllocator", "PagedAllocator", "PrefixHit",
    "SegmentContent", "SlabAllocator", "SwapResult", "TokenContent", "Waste", "fig2_shares", "region_slots",
    "sharing_saved_slots", "waste",
]
