"""A KV offload tier below the GPU's prefix cache (vLLM's CPU offloading connector, LMCache's local CPU and disk).

A tier holds block hashes (the identity of a full, hashed KV block: `kvsim.workload.content`) in a pool of
`num_blocks` slots, evicted least recently used first, as vLLM's `LRUOffloadingManager`
(vllm/v1/kv_offload/lru_manager.py) does:

    lookup(hashes)        how many leading blocks are held and ready (a store still in flight is not)
    storing(hash)         whether the block is held but its store is still in flight (vLLM's HIT_PENDING)
    prepare_load(hashes)  pin those blocks (a pinned block is never evicted) until complete_load
    touch(hashes)         mark them used, the first block most recently (it is the last to go)
    prepare_store(hashes) reserve slots for the blocks not held yet, evicting unpinned ready blocks LRU-first
                          (never one of `hashes`, as vLLM's `CPUOffloadingManager` protects them); None
                          (nothing reserved, nothing evicted) when too few can be evicted
    complete_store(hashes) the reserved blocks become ready (a lookup can hit them from now on)

        LRU ◀─────────────────────────────────────────────▶ MRU
        [ h7 ready ][ h3 ready, pinned ][ h9 storing ][ h1 ready ]
          evicted first          never evicted while pinned or storing

`TieredOffload` stacks tiers (CPU, then disk): a block a tier evicts is offered to the tier below (a slot
reserved there, ready once its write ends, as LMCache's local disk admits a chunk only after writing it), and
a lookup walks the prefix block by block, each block served by the fastest tier that holds it. A tier of 0 blocks
holds nothing: every call is a no-op, so a run with it equals a run without offload.
Pure Python; the engine prices the bytes moved (`kvsim.kv.link`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

BlockHash = Hashable


@dataclass(slots=True)
class _Slot:
    ready: bool = False  # False while its store is in flight
    pins: int = 0


@dataclass(slots=True)
class OffloadTier:
    """One tier (`name`: "cpu", "disk") of `num_blocks` block slots, LRU. Counters for the run's metrics."""

    name: str
    num_blocks: int
    _slots: OrderedDict[BlockHash, _Slot] = field(default_factory=OrderedDict)
    num_stored_blocks: int = 0
    num_loaded_blocks: int = 0
    num_evicted_blocks: int = 0
    num_refused_stores: int = 0
    num_pins: int = 0  # Σ pins over the blocks held: loads in flight reading this tier, block by block

    def __post_init__(self) -> None:
        assert self.num_blocks >= 0, f"{self.name}: num_blocks={self.num_blocks}"

    @property
    def num_held(self) -> int:
        return len(self._slots)

    def hashes_lru_first(self) -> list[BlockHash]:
        """Every block held (ready or being stored), the next to be evicted first."""
        return list(self._slots)

    def pins_of(self, block_hash: BlockHash) -> int:
        """Loads in flight that read the block (0 when it is not held)."""
        slot = self._slots.get(block_hash)
        return 0 if slot is None else slot.pins

    def holds(self, block_hash: BlockHash) -> bool:
        slot = self._slots.get(block_hash)
        return slot is not None and slot.ready

    def storing(self, block_hash: BlockHash) -> bool:
        """Held, its store still in flight: vLLM's `LookupResult.HIT_PENDING` (found, not readable yet)."""
        slot = self._slots.get(block_hash)
        return slot is not None and not slot.ready

    def lookup(self, hashes: Sequence[BlockHash]) -> int:
        hits = 0
        for h in hashes:
            if not self.holds(h):
                break
            hits += 1
        return hits

    def prepare_load(self, hashes: Sequence[BlockHash]) -> None:
        for h in hashes:
            slot = self._slots[h]
            assert slot.ready, f"{self.name}: load of a block still being stored"
            slot.pins += 1
        self.num_pins += len(hashes)

    def complete_load(self, hashes: Sequence[BlockHash]) -> None:
        for h in hashes:
            slot = self._slots[h]
            assert slot.pins > 0, f"{self.name}: load completed twice"
            slot.pins -= 1
        self.num_pins -= len(hashes)
        self.num_loaded_blocks += len(hashes)

    def touch(self, hashes: Sequence[BlockHash]) -> None:
        for h in reversed(hashes):
            if h in self._slots:
                self._slots.move_to_end(h)

    def prepare_store(self, hashes: Sequence[BlockHash]) -> tuple[list[BlockHash], list[BlockHash]] | None:
        """Reserve slots for `hashes` not held yet: (to store, evicted), or None when they cannot all fit. The
        blocks of `hashes` already held are never evicted for them (vLLM's `CPUOffloadingManager.prepare_store`
        passes them to its policy as `protected`)."""
        new = list(dict.fromkeys(h for h in hashes if h not in self._slots))
        num_to_evict = len(new) - (self.num_blocks - len(self._slots))
        evicted: list[BlockHash] = []
        if num_to_evict > 0:
            protected = set(hashes)
            for h, slot in self._slots.items():
                if slot.ready and slot.pins == 0 and h not in protected:
                    evicted.append(h)
                    if len(evicted) == num_to_evict:
                        break
            else:
                self.num_refused_stores += 1
                return None
        for h in evicted:
            del self._slots[h]
        for h in new:
            self._slots[h] = _Slot()
        self.num_evicted_blocks += len(evicted)
        return new, evicted

    def complete_store(self, hashes: Sequence[BlockHash]) -> None:
        for h in hashes:
            slot = self._slots[h]
            if not slot.ready:
                slot.ready = True
                self.num_stored_blocks += 1

    def check_invariants(self) -> None:
        assert len(self._slots) <= self.num_blocks, f"{self.name}: {len(self._slots)} > {self.num_blocks} blocks"
        num_pins = 0
        for h, slot in self._slots.items():
            assert slot.pins >= 0, f"{self.name}: block {h!r} pinned {slot.pins} times"
            assert slot.ready or slot.pins == 0, f"{self.name}: block {h!r} pinned while being stored"
            num_pins += slot.pins
        assert num_pins == self.num_pins, f"{self.name}: {num_pins} pins held, {self.num_pins} counted"


@dataclass(slots=True)
class TieredOffload:
    """Tiers top to bottom (CPU, then disk). Evictions of one tier are stored, at once, in the next."""

    tiers: list[OffloadTier]

    def lookup(self, hashes: Sequence[BlockHash]) -> list[int]:
        """Per tier, how many blocks of the leading prefix held somewhere it serves: each block from the fastest
        tier holding it (a prefix may span tiers); the walk stops at the first block no tier holds."""
        hits = [0] * len(self.tiers)
        for h in hashes:
            tier = next((i for i, t in enumerate(self.tiers) if t.holds(h)), None)
            if tier is None:
                break
            hits[tier] += 1
        return hits

    def hit_pending(self, hashes: Sequence[BlockHash]) -> bool:
        """Whether the walk `lookup` makes meets, before the first block no tier holds ready, one the top tier is
        still storing: vLLM's `_maximal_prefix_lookup` (v1/offloading/scheduler.py) counts such a HIT_PENDING
        block (`CPUOffloadingManager.lookup`: held, not ready) as a hit, walks on to the first MISS and then
        returns None (try the request again later) instead of the hit. A block ready in any tier is a hit; one a
        lower tier is still writing (a demotion) is a miss, as LMCache's local disk admits a chunk only once
        written (`local_disk_backend.py`: the key is registered after `write_file`)."""
        top = self.tiers[0] if self.tiers else None
        for h in hashes:
            if any(t.holds(h) for t in self.tiers):
                continue
            return top is not None and top.storing(h)
        return False

    def store(self, hashes: Sequence[BlockHash]) -> tuple[list[BlockHash], list[tuple[int, list[BlockHash]]]] | None:
        """Offer `hashes` to the top tier, demoting its evictions down the stack. Returns what the top must write
        (blocks it did not hold) and the demotions, (tier index, blocks that tier must write): every slot
        reserved is ready only on that tier's `complete_store`, when its write ends. None (nothing changed)
        when the top tier refuses them (too few blocks it can evict)."""
        if not self.tiers:
            return [], []
        prepared = self.tiers[0].prepare_store(hashes)
        if prepared is None:
            return None
        to_store, evicted = prepared
        demotions: list[tuple[int, list[BlockHash]]] = []
        for k, lower in enumerate(self.tiers[1:], start=1):
            if not evicted:
                break
            demoted = lower.prepare_store(evicted)
            if demoted is None:
                break
            if demoted[0]:
                demotions.append((k, demoted[0]))
            evicted = demoted[1]
        return to_store, demotions

    def touch(self, hashes: Sequence[BlockHash]) -> None:
        """Mark the blocks used in every tier holding them, the first most recently (`OffloadTier.touch`)."""
        for tier in self.tiers:
            tier.touch(hashes)

    def check_invariants(self) -> None:
        for tier in self.tiers:
            tier.check_invariants()
