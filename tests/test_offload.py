"""The offload tier against a naive second implementation (a plain list in LRU order), driven by hypothesis,
plus hand-built cases: vLLM's LRUOffloadingManager semantics, demotion to a lower tier, and size 0 = no tier."""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvsim.kv.offload import OffloadTier, TieredOffload


class NaiveTier:
    """LRU as a list (least recent first) of [hash, ready, pins]; a store evicts ready, unpinned blocks that
    are not in its own offer (vLLM's `CPUOffloadingManager.prepare_store` protects those)."""

    def __init__(self, num_blocks):
        self.num_blocks, self.rows = num_blocks, []

    def find(self, h):
        return next((r for r in self.rows if r[0] == h), None)

    def lookup(self, hashes):
        n = 0
        while n < len(hashes) and (r := self.find(hashes[n])) is not None and r[1]:
            n += 1
        return n

    def store(self, hashes):
        new = []
        for h in hashes:
            if self.find(h) is None and h not in new:
                new.append(h)
        need = len(new) - (self.num_blocks - len(self.rows))
        victims = [r for r in self.rows if r[1] and r[2] == 0 and r[0] not in hashes][:max(need, 0)]
        if need > 0 and len(victims) < need:
            return None
        self.rows = [r for r in self.rows if r not in victims] + [[h, False, 0] for h in new]
        return new, [r[0] for r in victims]

    def touch(self, hashes):
        for h in reversed(hashes):
            if (r := self.find(h)) is not None:
                self.rows.remove(r)
                self.rows.append(r)


HASHES = st.lists(st.integers(0, 12), min_size=1, max_size=5)


class TierMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tier, self.naive, self.pending, self.pinned = OffloadTier("cpu", 6), NaiveTier(6), [], []

    @rule(hashes=HASHES)
    def store(self, hashes):
        got, want = self.tier.prepare_store(hashes), self.naive.store(hashes)
        assert got == (None if want is None else (want[0], want[1]))
        if got is not None:
            self.pending.append(got[0])

    @rule()
    def complete_oldest_store(self):
        if self.pending:
            done = self.pending.pop(0)
            self.tier.complete_store(done)
            for h in done:
                self.naive.find(h)[1] = True

    @rule(hashes=HASHES)
    def load(self, hashes):
        n = self.tier.lookup(hashes)
        assert n == self.naive.lookup(hashes)
        if n:
            self.tier.prepare_load(hashes[:n])
            for h in hashes[:n]:
                self.naive.find(h)[2] += 1
            self.pinned.append(hashes[:n])

    @rule()
    def finish_load(self):
        if self.pinned:
            done = self.pinned.pop(0)
            self.tier.complete_load(done)
            for h in done:
                self.naive.find(h)[2] -= 1

    @rule(hashes=HASHES)
    def touch(self, hashes):
        self.tier.touch(hashes)
        self.naive.touch(hashes)

    @invariant()
    def books_balance(self):
        self.tier.check_invariants()
        assert self.tier.hashes_lru_first() == [r[0] for r in self.naive.rows]  # same LRU order


TestTier = TierMachine.TestCase


def test_lru_eviction_spares_pinned_and_storing_blocks():
    tier = OffloadTier("cpu", 3)
    tier.complete_store(tier.prepare_store(["a", "b"])[0])
    assert tier.prepare_store(["c"]) == (["c"], [])  # c is still being stored
    tier.prepare_load(["a"])  # a pinned
    assert tier.prepare_store(["d"]) == (["d"], ["b"])  # b: the only ready unpinned block
    assert tier.prepare_store(["e"]) is None  # a pinned, c and d storing: nothing can go
    assert tier.lookup(["a", "b"]) == 1 and tier.lookup(["c"]) == 0


def test_a_store_never_evicts_a_block_its_own_offer_holds():
    """vLLM's `CPUOffloadingManager.prepare_store` (vllm/v1/kv_offload/cpu/manager.py) passes the offer's keys as
    `protected` to its policy's `evict`: "a block that was already stored must remain in the cache after this
    call". Tier of 3 holding a, b, c (a least recently used); an offer of a (held) and x (new) must evict b,
    not a; an offer whose only evictable blocks it holds itself is refused."""
    tier = OffloadTier("cpu", 3)
    tier.complete_store(tier.prepare_store(["a", "b", "c"])[0])
    assert tier.prepare_store(["a", "x"]) == (["x"], ["b"])
    assert tier.hashes_lru_first() == ["a", "c", "x"]
    tier.prepare_load(["c"])  # c pinned, x still being stored: only a could go, and the offer holds it
    assert tier.prepare_store(["a", "y"]) is None and tier.hashes_lru_first() == ["a", "c", "x"]


def test_touch_makes_the_first_block_the_last_to_go():
    tier = OffloadTier("cpu", 3)
    tier.complete_store(tier.prepare_store(["a", "b", "c"])[0])
    tier.touch(["c", "a"])  # order now b, a, c: c (the prefix's first block) most recent
    assert tier.prepare_store(["x", "y"]) == (["x", "y"], ["b", "a"])


def test_a_cpu_eviction_is_demoted_to_disk_and_a_lookup_walks_down():
    stack = TieredOffload([OffloadTier("cpu", 2), OffloadTier("disk", 4)])
    assert stack.store(["h1", "h2"]) == (["h1", "h2"], [])
    stack.tiers[0].complete_store(["h1", "h2"])
    assert stack.store(["h3"]) == (["h3"], [(1, ["h1"])])  # h1 leaves the CPU for the disk, being written
    stack.tiers[0].complete_store(["h3"])
    assert stack.lookup(["h1"]) == [0, 0]  # in neither tier until the disk's write ends
    stack.tiers[1].complete_store(["h1"])
    assert stack.tiers[0].lookup(["h1"]) == 0 and stack.tiers[1].lookup(["h1"]) == 1
    assert stack.lookup(["h1", "h2", "h3", "h4"]) == [2, 1]  # h1 from disk, h2 and h3 from the CPU; no h4
    assert stack.lookup(["h4", "h1"]) == [0, 0]


def test_a_tier_of_zero_blocks_holds_nothing():
    stack = TieredOffload([OffloadTier("cpu", 0)])
    assert stack.store(["a", "b"]) is None and stack.lookup(["a"]) == [0]
    assert stack.tiers[0].num_held == 0
