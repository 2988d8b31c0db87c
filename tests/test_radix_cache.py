"""SGLang's RadixCache semantics, on tiny hand-built trees, and its invariants under random use."""

import hypothesis.strategies as st
from hypothesis import given, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from kvsim.kv.radix_cache import RadixCache, page_keys


def test_page_keys_drop_the_unaligned_tail():
    assert page_keys([1, 2, 3, 4, 5], 2) == [(1, 2), (3, 4)]
    assert page_keys([1, 2, 3], 1) == [(1,), (2,), (3,)]
    assert page_keys([1], 4) == []


def test_insert_then_match_shares_the_common_prefix_and_splits_once():
    tree = RadixCache(page_size=16)
    assert tree.insert(["a", "b", "c"], [10, 11, 12]) == 0
    # a second key sharing two pages: only its third page is new, the first two are already cached
    assert tree.insert(["a", "b", "d"], [20, 21, 22]) == 2  # the caller frees 20 and 21
    tree.check_invariants()
    assert tree.total_size() == 4 * 16 and tree.evictable_size == 4 * 16 and tree.protected_size == 0
    match = tree.match_prefix(["a", "b", "c", "e"])
    assert match.values == [10, 11, 12]
    match = tree.match_prefix(["a", "x"])
    assert match.values == [10]  # the split [a b] node was split again into [a] [b]
    tree.check_invariants()
    assert tree.match_prefix(["z"]).values == [] and tree.match_prefix(["z"]).last_node is tree.root


def test_locks_protect_the_path_and_sizes_move_between_evictable_and_protected():
    tree = RadixCache(page_size=2)
    tree.insert(["a", "b", "c"], [1, 2, 3])
    tree.insert(["a", "b", "d"], [4, 5, 6])
    node = tree.match_prefix(["a", "b", "c"]).last_node
    assert tree.inc_lock_ref(node) == -3 * 2  # [a b] and [c]: 3 pages of 2 tokens
    assert tree.protected_size == 6 and tree.evictable_size == 2
    tree.check_invariants()
    assert tree.evict(100) == [6]  # only [d] is an unlocked leaf; [a b] stays (locked)
    assert tree.match_prefix(["a", "b", "d"]).values == [1, 2]
    assert tree.dec_lock_ref(node) == 6
    tree.check_invariants()
    assert sorted(tree.evict(100)) == [1, 2, 3]
    assert tree.total_size() == 0


def test_a_lock_on_an_inner_page_stays_above_a_later_split():
    tree = RadixCache(page_size=1)
    tree.insert(["a", "b", "c", "d"], [1, 2, 3, 4])
    node, page = tree.where(2)
    assert (node.value, page) == ([1, 2, 3, 4], 1)
    tree.inc_lock_ref(node, page)  # protects the node: all 4 pages
    assert tree.protected_size == 4
    tree.match_prefix(["a", "b", "x"])  # splits after page "b": the lock goes up with it
    tree.check_invariants()
    assert tree.protected_size == 2 and tree.evictable_size == 2
    assert sorted(tree.evict(10)) == [3, 4]  # the unlocked lower part is a leaf now
    tree.dec_lock_ref(*tree.where(2))
    tree.check_invariants()
    assert sorted(tree.evict(10)) == [1, 2]


def test_eviction_is_lru_over_leaves_and_cascades_to_parents():
    tree = RadixCache(page_size=1)
    tree.insert(["s", "x"], [0, 1])  # tick 1
    tree.insert(["s", "y"], [2, 3])  # tick 2: splits [s x] into [s] -> [x], adds [y]
    tree.insert(["t"], [4])  # tick 3
    tree.match_prefix(["s", "x"])  # tick 4: [s] and [x] are now the most recent
    # the least recently used leaf is [y] (tick 2), then [t] (3), then [x] (4), then [s] once it is a leaf
    assert tree.evict(1) == [3]
    assert tree.evict(1) == [4]
    assert tree.evict(2) == [1, 0]
    tree.check_invariants()


class RadixMachine(RuleBasedStateMachine):
    """Random inserts, matches, locks, unlocks and evictions; the tree's books must balance after each,
    every value is either in the tree, returned as a duplicate or evicted (exactly once), and nothing a
    running request has locked is ever evicted."""

    locks = Bundle("locks")

    def __init__(self):
        super().__init__()
        self.tree = RadixCache(page_size=4)
        self.next_value = 0
        self.duplicates: list[int] = []
        self.evicted: list[int] = []
        self.held: list[tuple[object, list[int]]] = []  # (node, values matched) per lock

    @rule(key=st.lists(st.sampled_from("abc"), min_size=1, max_size=6))
    def insert(self, key):
        values = list(range(self.next_value, self.next_value + len(key)))
        self.next_value += len(key)
        cached = self.tree.insert(key, values)
        self.duplicates.extend(values[:cached])
        assert self.tree.match_prefix(key).values[cached:] == values[cached:]

    @rule(target=locks, key=st.lists(st.sampled_from("abc"), min_size=1, max_size=6))
    def lock(self, key):
        match = self.tree.match_prefix(key)
        self.tree.inc_lock_ref(match.last_node)
        entry = (match.last_node, match.values)
        self.held.append(entry)
        return entry

    @rule(target=locks, pick=st.integers(0, 10**6))
    def lock_page(self, pick):
        """A lock on one page inside a node (as a block pool locks a block it hands out)."""
        stored = sorted(v for node in self.tree._nodes() for v in node.value)
        if not stored:
            return ("page", None, [])
        value = stored[pick % len(stored)]
        node, page = self.tree.where(value)
        self.tree.inc_lock_ref(node, page)
        path = node.value[:page + 1]
        while node.parent is not self.tree.root:
            node = node.parent
            path = node.value + path
        entry = ("page", value, path)
        self.held.append(entry)
        return entry

    @rule(entry=locks)
    def unlock(self, entry):
        if entry in self.held:
            self.held.remove(entry)
            if entry[0] == "page":
                self.tree.dec_lock_ref(*self.tree.where(entry[1]))
            else:
                self.tree.dec_lock_ref(entry[0])

    @rule(num_tokens=st.integers(0, 40))
    def evict(self, num_tokens):
        before = self.tree.evictable_size
        freed = self.tree.evict(num_tokens)
        assert len(freed) * 4 >= min(num_tokens, before)  # it frees what was asked while it can
        self.evicted.extend(freed)
        locked = {v for entry in self.held for v in entry[-1]}
        assert locked.isdisjoint(freed), "a locked page was evicted"

    @invariant()
    def books_balance(self):
        self.tree.check_invariants()
        stored = [v for node in self.tree._nodes() for v in node.value]
        everything = sorted(stored + self.duplicates + self.evicted)
        assert everything == list(range(self.next_value)), "a value was lost or freed twice"
        assert self.tree.total_size() == len(stored) * 4
        assert self.tree.evictable_size + self.tree.protected_size == self.tree.total_size()
        if not self.held:
            assert self.tree.protected_size == 0


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def _state(tree):
    """Everything observable about a tree: each node's pages, values, locks, access time and id, the clock."""
    nodes = sorted((n.node_id, tuple(n.key), tuple(n.value), n.lock_ref, tuple(n.page_locks), n.last_access,
                     n.parent.node_id) for n in tree._nodes())
    return nodes, tree.match_prefix([]).last_node.last_access, tree.evictable_size, tree.protected_size


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.lists(st.sampled_from("abc"), min_size=1, max_size=6), st.booleans(),
                              st.integers(0, 12)), max_size=12))
def test_insert_if_cached_as_is_match_prefix_then_insert(ops):
    """The one-walk `insert_if_cached_as` leaves a tree exactly as `match_prefix` then (when the cached values
    are the caller's) `insert` do: same nodes, values, locks, access times, ids and clock."""
    one, two = RadixCache(page_size=1), RadixCache(page_size=1)
    next_value = 0
    for key, reuse, evict in ops:
        cached = one.match_prefix(key).values  # a probe on both trees alike (also ticks and splits)
        assert two.match_prefix(key).values == cached
        values = (cached if reuse else []) + list(range(next_value, next_value + len(key)))
        values = values[:len(key)]
        next_value += len(key)
        got = one.insert_if_cached_as(key, values)
        again = two.match_prefix(key).values
        expected = two.insert(key, values) if list(values[:len(again)]) == again else None
        assert got == expected
        one.evict(evict)
        two.evict(evict)
        assert _state(one) == _state(two)
        one.check_invariants()
