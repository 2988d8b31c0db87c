"""The offload connector: the tiers of `offload.py` with the time their bytes take, as vLLM's
OffloadingConnector (vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py) runs them.

    GPU KV cache ──────store (write-through, async)──▶ CPU tier (LRU) ──evicted (async)──▶ disk tier (LRU)
          ▲                  GPU→host link                  │       disk's write link      │
          └──────── load (async) over the tier's link ──────┴──────────────────────────────┘

* Stores: after each step, the full blocks a request computed in it are offered to the CPU tier
  (vLLM's `_build_store_jobs`, formerly `_get_reqs_to_store`: every newly full block, from block 0 of the
  request on, with `offload_prompt_only` (vLLM's default) only those within its prompt, so decoded tokens'
  blocks are never stored; blocks the tier holds are skipped; a request whose new blocks it took has all its
  blocks touched, its first most recently; a refused offer is made again next step). They go as one transfer
  over the GPU→host link (shared by concurrent stores, `SharedLink`), and a lookup can hit them only once it
  has ended (`complete_store`). The blocks the CPU tier evicts to make room are demoted to the disk tier: their disk
  slots are reserved at once and written, as one transfer per store, over the disk's write link (shared
  by the demotions in flight), hittable there once it ends, as LMCache's local disk backend writes a chunk
  asynchronously and admits it only when written. The disk's reads and writes use separate links (they do not contend).
* Loads: a waiting request whose prefix misses the GPU cache at block k but whose blocks k.. are held
  by the tiers (`lookup`, each block from the fastest tier holding it) gets GPU blocks for them and
  waits while they load (vLLM's WAITING_FOR_REMOTE_KVS): one transfer per tier over that tier's
  host→GPU link, shared by the loads in flight on it; the request is ready when all of its transfers end.
  The loaded blocks are pinned in their tiers meanwhile. Every request the scheduler considers admitting
  has its full blocks touched first (vLLM's `get_num_new_matched_tokens` touches them on each query).
  With GPU prefix caching, a request whose hit includes a block a load in flight reads is not loaded
  again (`loading_any`): it waits for that load and then hits the GPU cache (vLLM's `_blocks_being_loaded`).
  A request whose walk meets a block the CPU tier is still storing before its first miss (`hit_pending`)
  waits too, tried again each step, until that store has ended: vLLM's `_maximal_prefix_lookup` returns None
  on a HIT_PENDING block; the scheduler then calls `await_stores`. (A demotion being written to disk is a miss.)
* Without GPU prefix caching (`enable_prefix_caching: false`, `vllm serve --no-enable-prefix-caching` with an
  offloading connector) the tiers work the same: vLLM hashes every request's full blocks whenever a KV connector
  is set (`request_block_hasher`, vllm/v1/engine/core.py), so stores and lookups are unchanged, while the GPU
  pool hits and keeps nothing (`KVCacheManager.get_computed_blocks` returns no block, `cache_blocks` does
  nothing): a prefix the tiers hold is loaded into fresh GPU blocks every time it is asked for, and two
  requests loading the same blocks each load them (`_blocks_being_loaded` is None: `loading_any` is not asked).
* Time is explicit (`now_s` in every call, non-decreasing); the engine wakes an idle engine at the
  instant `on_next_load_end` is told (`kvsim.engine.loop`): the next end of a load, or of a CPU-tier store
  while a request awaits one (`await_stores`, until the next such store ends).

Counters for the run's summary (`summary()`): hits per tier (blocks and tokens), bytes moved each way,
recompute avoided (tokens loaded instead of prefilled), load durations. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsim.kv.link import LinkSpec, SharedLink
from kvsim.kv.offload import BlockHash, OffloadTier, TieredOffload
from kvsim.workload.content import Content


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One tier: `num_blocks` blocks, loaded to the GPU over `load_link`; the blocks demoted into it are
    written over `store_link` (a lower tier's; the top tier's writes use the connector's `store_link`)."""

    name: str
    num_blocks: int
    load_link: LinkSpec
    store_link: LinkSpec | None = None


@dataclass(slots=True)
class _Load:
    hashes: list[list[BlockHash]]  # per tier, the blocks it serves
    start_s: float
    num_pending: int  # tier transfers not ended
    end_s: float = 0.0  # when its latest ended transfer ended


@dataclass(slots=True)
class OffloadConnector:
    """Tiers (top first) with their links; `bytes_per_block` is one block's bytes, all TP ranks together."""

    tiers: list[TierSpec]
    store_link: LinkSpec
    block_size: int
    bytes_per_block: int
    offload_prompt_only: bool = True  # vLLM's default: store the prompt's full blocks only (`_store_computed`)
    cache: TieredOffload = field(init=False)
    _writes_on: list[SharedLink] = field(init=False)  # per tier, the link its writes go over
    _loads_on: list[SharedLink] = field(init=False)
    _writing: list[dict[int, list[BlockHash]]] = field(init=False)  # per tier, writes in flight: id -> blocks
    _loads: dict[int, _Load] = field(default_factory=dict)
    _ready: list[int] = field(default_factory=list)  # requests whose loads ended, not yet taken
    _next_store_id: int = 0
    awaiting_stores: bool = False  # a request waits for a store in flight (`await_stores`), until the next ends
    on_next_load_end: Callable[[float], None] | None = None  # told the next load's (or awaited store's) end
    _told_s: float | None = None  # the instant `on_next_load_end` was last told (None: nothing in flight then)
    num_hit_blocks: list[int] = field(init=False)  # per tier, blocks loaded from it
    num_loads: int = 0
    num_stored_bytes: list[int] = field(init=False)  # per tier, bytes of the writes started into it
    load_s: list[float] = field(default_factory=list)  # each load's duration (start to its last transfer's end)

    def __post_init__(self) -> None:
        assert self.tiers and all(t.num_blocks > 0 for t in self.tiers), "a tier of 0 blocks is no tier"
        assert all(t.store_link is not None for t in self.tiers[1:]), "a lower tier needs its write link"
        self.cache = TieredOffload([OffloadTier(t.name, t.num_blocks) for t in self.tiers])
        self._writes_on = [SharedLink(t.store_link or self.store_link) for t in self.tiers]
        self._loads_on = [SharedLink(t.load_link) for t in self.tiers]
        self._writing = [{} for _ in self.tiers]
        self.num_hit_blocks = [0] * len(self.tiers)
        self.num_stored_bytes = [0] * len(self.tiers)

    @property
    def loading_ids(self) -> set[int]:
        """Requests whose loads are in flight or ended but not yet taken (`take_ready`)."""
        return set(self._loads) | set(self._ready)

    def lookup(self, content: Content, first_block: int, num_blocks: int) -> int:
        """How many blocks from `first_block` (up to `num_blocks` blocks of the content) the tiers hold, in a row."""
        if first_block >= num_blocks:
            return 0
        hashes = content.block_hashes(self.block_size, num_blocks)[first_block:num_blocks]
        return sum(self.cache.lookup(hashes))

    def loading_any(self, content: Content, first_block: int, num_blocks: int) -> bool:
        """Whether a load in flight reads any of blocks `first_block .. first_block + num_blocks` of the content
        (vLLM's `_blocks_being_loaded`, the blocks of the loads not yet finished)."""
        if not self._loads or num_blocks <= 0:
            return False
        wanted = set(content.block_hashes(self.block_size, first_block + num_blocks)[first_block:])
        return any(h in wanted for load in self._loads.values() for own in load.hashes for h in own)

    def hit_pending(self, content: Content, first_block: int, num_blocks: int) -> bool:
        """Whether the walk over blocks `first_block` .. `num_blocks` (as `lookup`) meets a block the CPU tier is
        still storing before its first miss (`TieredOffload.hit_pending`): vLLM delays the request until it is."""
        if first_block >= num_blocks:
            return False
        return self.cache.hit_pending(content.block_hashes(self.block_size, num_blocks)[first_block:num_blocks])

    def await_stores(self) -> None:
        """A request waits for a store in flight into the top tier (`hit_pending`): from now until the next
        such store ends, `on_next_load_end` is told the next end of a load or of a top-tier store (the engine,
        idle or not, tries the request again then; a store ending clears this, and the scheduler says it again
        if the request still waits)."""
        if not self.awaiting_stores:
            self.awaiting_stores = True
            self._tell_next_end()

    def start_load(self, request_id: int, content: Content, first_block: int, num_blocks: int, now_s: float) -> None:
        """Load blocks `first_block .. first_block + num_blocks` (a `lookup` hit) for a request, starting now."""
        self.advance(now_s)
        hashes = content.block_hashes(self.block_size, first_block + num_blocks)[first_block:]
        per_tier: list[list[BlockHash]] = [[] for _ in self.tiers]
        for h in hashes:
            per_tier[next(i for i, t in enumerate(self.cache.tiers) if t.holds(h))].append(h)
        pending = 0
        for k, (tier, own) in enumerate(zip(self.cache.tiers, per_tier, strict=True)):
            if own:
                tier.prepare_load(own)
                self._loads_on[k].start(request_id, len(own) * self.bytes_per_block, now_s)
                self.num_hit_blocks[k] += len(own)
                pending += 1
        assert pending, "a load of no block"
        self._loads[request_id] = _Load(per_tier, now_s, pending)
        self.num_loads += 1
        self._tell_next_end()

    def store(self, offers: Sequence[tuple[Sequence[BlockHash], int]], now_s: float) -> list[bool]:
        """Offer requests' newly computed full blocks to the top tier, one request after another, as vLLM's
        `OffloadingConnectorScheduler._get_reqs_to_store` does. An offer is (the request's full blocks from
        block 0 on, the index of its first new one); the top tier reserves slots for the new blocks it lacks,
        evicting LRU-first (its evictions demoted down the stack), and, if it took any, the request's blocks
        are touched, the first most recently (vLLM's `manager.touch` after `prepare_store`: a prefix's tail
        is evicted before its head). An offer the tier refuses (too few blocks it can evict) is False: the
        caller offers those blocks again later, as vLLM keeps `_next_stored_block_idx`. The blocks each tier
        takes in one call are written as one transfer over its write link."""
        self.advance(now_s)
        taken: list[bool] = []
        writes: list[list[BlockHash]] = [[] for _ in self.tiers]
        for prefix, first_new in offers:
            prepared = self.cache.store(prefix[first_new:])
            taken.append(prepared is not None)
            if prepared is None:
                continue
            to_store, demotions = prepared
            writes[0] += to_store
            for k, demoted in demotions:
                writes[k] += demoted
            if to_store:
                self.cache.touch(prefix)
        for k, blocks in enumerate(writes):
            if not blocks:
                continue
            num_bytes = len(blocks) * self.bytes_per_block
            self._writes_on[k].start(self._next_store_id, num_bytes, now_s)
            self._writing[k][self._next_store_id] = blocks
            self._next_store_id += 1
            self.num_stored_bytes[k] += num_bytes
        if writes[0] and self.awaiting_stores:  # the link is shared: the awaited store now ends later
            self._tell_next_end()
        return taken

    def touch(self, content: Content, num_blocks: int) -> None:
        """Mark the first `num_blocks` full blocks of the content used, the first most recently, as vLLM's
        `get_num_new_matched_tokens` touches every block of a request it is asked about."""
        if num_blocks > 0:
            self.cache.touch(content.block_hashes(self.block_size, num_blocks))

    def take_ready(self, now_s: float) -> list[int]:
        """The requests whose loads have completed by `now_s` and were not taken yet, in the order they completed."""
        self.advance(now_s)
        ready, self._ready = self._ready, []
        return ready

    def advance(self, now_s: float) -> None:
        """Book the transfers that ended by `now_s`: stores become hittable, completed loads ready (`take_ready`)."""
        ended = False
        for k, (tier, link, writing) in enumerate(zip(self.cache.tiers, self._writes_on, self._writing, strict=True)):
            for store_id in link.advance(now_s):
                tier.complete_store(writing.pop(store_id))
                ended = ended or (self.awaiting_stores and k == 0)
        if ended:
            self.awaiting_stores = False
        ready = self._ready
        for k, link in enumerate(self._loads_on):
            for request_id, end_s in zip(link.advance(now_s), link.ended_s, strict=True):
                ended = True
                load = self._loads[request_id]
                self.cache.tiers[k].complete_load(load.hashes[k])
                load.num_pending -= 1
                load.end_s = max(load.end_s, end_s)
                if not load.num_pending:
                    ready.append(request_id)
                    self.load_s.append(load.end_s - load.start_s)
                    del self._loads[request_id]
        if ended or (self._told_s is not None and now_s >= self._told_s):
            self._tell_next_end()

    def _tell_next_end(self) -> None:
        """Tell `on_next_load_end` the next end of a load (or of a top-tier store, while a request awaits one).
        A link re-estimates its transfers' ends as it drains them piecewise (`SharedLink.advance`), a few ulps
        apart: where the instant told has come (`advance`) and nothing ended, it is told again, or an idle
        engine woken then would wait for a wake-up never armed."""
        links = [*self._loads_on, self._writes_on[0]] if self.awaiting_stores else self._loads_on
        ends = [nxt[0] for link in links if (nxt := link.next_end()) is not None]
        self._told_s = min(ends) if ends else None
        if ends and self.on_next_load_end is not None:
            self.on_next_load_end(min(ends))

    @property
    def bytes_loaded(self) -> list[int]:
        """Per tier, bytes moved to the GPU by loads that ended."""
        return [link.bytes_moved for link in self._loads_on]

    def check_invariants(self) -> None:
        """Every tier's books balance; blocks pinned are exactly those of loads in flight, once each; blocks
        being stored are exactly those of the tier's writes in flight."""
        self.cache.check_invariants()
        for k, tier in enumerate(self.cache.tiers):
            storing = {h for h in tier.hashes_lru_first() if not tier.holds(h)}
            written = [h for blocks in self._writing[k].values() for h in blocks]
            assert len(written) == len(storing) and set(written) == storing, f"{tier.name}: storing != writes"
            pinned: dict[BlockHash, int] = {}
            for request_id, load in self._loads.items():
                if request_id in self._loads_on[k].in_flight_ids:
                    for h in load.hashes[k]:
                        pinned[h] = pinned.get(h, 0) + 1
            for h, num in pinned.items():  # the loads' blocks are pinned that often, and nothing else is
                assert tier.holds(h) and tier.pins_of(h) == num, f"{tier.name}: block {h!r} pins != loads reading it"
            assert tier.num_pins == sum(pinned.values()), f"{tier.name}: a block is pinned by no load"

    def summary(self, duration_s: float, end_s: float) -> dict[str, Any]:
        """`summary.json`'s `kv_offload` of a run of `duration_s` that ended at `end_s` (the transfers are booked
        up to it first): per tier, then totals; tokens loaded are prefill not recomputed. A write link's busy
        fraction is the share of the run in which it was moving bytes (in [0, 1]: a write still in flight at the
        end counts only what it drained by then)."""
        self.advance(end_s)
        tiers = {}
        for k, (spec, tier) in enumerate(zip(self.tiers, self.cache.tiers, strict=True)):
            tiers[spec.name] = {
                "num_blocks": spec.num_blocks, "bytes": spec.num_blocks * self.bytes_per_block,
                "load_bandwidth_bytes_per_s": spec.load_link.bandwidth_bytes_per_s,
                "num_hit_blocks": self.num_hit_blocks[k], "num_hit_tokens": self.num_hit_blocks[k] * self.block_size,
                "bytes_loaded": self.bytes_loaded[k], "num_stored_blocks": tier.num_stored_blocks,
                "num_evicted_blocks": tier.num_evicted_blocks, "num_refused_stores": tier.num_refused_stores,
                "num_held_blocks_at_end": tier.num_held, "bytes_stored": self.num_stored_bytes[k],
                "store_bandwidth_bytes_per_s": self._writes_on[k].spec.bandwidth_bytes_per_s,
                "store_link_busy_fraction": self._busy_fraction(k, duration_s),
            }
        loaded_tokens = sum(self.num_hit_blocks) * self.block_size
        return {
            "tiers": tiers,
            "store_bandwidth_bytes_per_s": self.store_link.bandwidth_bytes_per_s,
            "num_loads": self.num_loads,
            "bytes_loaded": sum(self.bytes_loaded), "bytes_stored": self.num_stored_bytes[0],
            "recompute_avoided_tokens": loaded_tokens,
            "load_s_mean": sum(self.load_s) / len(self.load_s) if self.load_s else 0.0,
            "load_s_max": max(self.load_s, default=0.0),
            "store_link_busy_fraction": self._busy_fraction(0, duration_s),
        }

    def _busy_fraction(self, tier: int, duration_s: float) -> float:
        """The share of `duration_s` the tier's write link was busy: the bytes it drained ÷ its bandwidth (not the
        bytes written into the tier, whose writes may end after the run: those overran 1 on a slow link)."""
        link = self._writes_on[tier]
        return link.bytes_drained / link.spec.bandwidth_bytes_per_s / duration_s if duration_s else 0.0


_SUMMED = ("num_blocks", "bytes", "num_hit_blocks", "num_hit_tokens", "bytes_loaded", "num_stored_blocks",
           "num_evicted_blocks", "num_refused_stores", "num_held_blocks_at_end", "bytes_stored")
_BANDWIDTHS = ("load_bandwidth_bytes_per_s", "store_bandwidth_bytes_per_s")


def combine_summaries(summaries: Sequence[dict[str, Any]], durations_s: Sequence[float]) -> dict[str, Any]:
    """One `kv_offload` for engines that each have a tier (a fleet's replicas, a data-parallel group's ranks),
    from their `summary()`s over runs of `durations_s`: per tier (by name) and in total, counts and bytes
    summed; a bandwidth the engines share, or None where they differ; `load_s_mean` weighted by loads,
    `load_s_max` the largest; a link's busy fraction weighted by run duration (its busy seconds over all
    engines ÷ their summed durations); `num_engines`, per tier the engines that have it."""
    assert summaries and len(summaries) == len(durations_s), "one duration per summary"
    tiers: dict[str, dict[str, Any]] = {}
    for summary in summaries:
        for name in summary["tiers"]:
            tiers.setdefault(name, {})
    for name, combined in tiers.items():
        have = [(s["tiers"][name], d) for s, d in zip(summaries, durations_s, strict=True) if name in s["tiers"]]
        combined.update({key: sum(t[key] for t, _ in have) for key in _SUMMED})
        combined.update({key: _shared(t[key] for t, _ in have) for key in _BANDWIDTHS})
        combined["store_link_busy_fraction"] = _weighted(have, "store_link_busy_fraction")
        combined["num_engines"] = len(have)
    num_loads = sum(s["num_loads"] for s in summaries)
    return {
        "tiers": tiers, "store_bandwidth_bytes_per_s": _shared(s["store_bandwidth_bytes_per_s"] for s in summaries),
        "num_loads": num_loads, "bytes_loaded": sum(s["bytes_loaded"] for s in summaries),
        "bytes_stored": sum(s["bytes_stored"] for s in summaries),
        "recompute_avoided_tokens": sum(s["recompute_avoided_tokens"] for s in summaries),
        "load_s_mean": sum(s["load_s_mean"] * s["num_loads"] for s in summaries) / num_loads if num_loads else 0.0,
        "load_s_max": max(s["load_s_max"] for s in summaries),
        "store_link_busy_fraction": _weighted(list(zip(summaries, durations_s, strict=True)),
                                              "store_link_busy_fraction"),
        "num_engines": len(summaries),
    }


def _shared(values: Any) -> float | None:
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def _weighted(parts: Sequence[tuple[dict[str, Any], float]], key: str) -> float:
    total_s = sum(d for _, d in parts)
    return sum(p[key] * d for p, d in parts) / total_s if total_s else 0.0
