"""KV memory managers: pure Python, no simpy, driven by method calls.

Every allocator implements `KVAllocator` (`protocol.py`); `kvsim.engine.builder.make_allocator`
builds the one an engine spec asks for. The paged pools keep their prefix cache behind
`PrefixCache` (`prefix_cache.py`: vLLM's hash chain, `HashChainCache`, by default).
"""

from __future__ import annotations

from kvsim.kv.accounting import FIG2_KEYS, KVOccupancy, Waste, fig2_shares, occupancy, sharing_saved_slots, waste
from kvsim.kv.block_pool import BlockPool
from kvsim.kv.hybrid import GroupedPagedAllocator
from kvsim.kv.paged import PagedAllocator
from kvsim.kv.prefix_cache import HashChainCache, PrefixCache, PrefixCacheStats
from kvsim.kv.protocol import ALLOCATED, NO_HIT, Allocation, KVAllocator, PrefixHit, SwapResult
from kvsim.kv.slab import SlabAllocator, region_slots
from kvsim.workload.content import SegmentContent, TokenContent

__all__ = [
    "ALLOCATED", "FIG2_KEYS", "NO_HIT", "Allocation", "BlockPool", "GroupedPagedAllocator", "HashChainCache",
    "KVAllocator", "KVOccupancy", "PagedAllocator", "PrefixCache", "PrefixCacheStats", "PrefixHit",
    "SegmentContent", "SlabAllocator", "SwapResult", "TokenContent", "Waste", "fig2_shares", "occupancy",
    "region_slots", "sharing_saved_slots", "waste",
]
