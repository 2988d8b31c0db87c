"""`check_invariants()` can fail: each book it keeps, corrupted by hand, is caught with its own message.

The allocators' property and end-to-end tests call `check_invariants()` after every operation or step;
they prove the books balance only if the checks would notice books that do not. The world: 11 blocks of
16 tokens (block 0 the null block), prefix caching on; sequence 1 holds blocks 1, 2, 3 (40 tokens: 1 and
2 full and cached, 3 partial); sequence 2 held 4, 5, 6 and is freed, so 4 and 5 are cached and evictable,
6 (partial, unhashed) joins the plain free blocks 7-10.
"""

import pytest

from kvsim.kv import PagedAllocator, SegmentContent


def world() -> PagedAllocator:
    a = PagedAllocator(num_blocks=11, block_size=16, enable_caching=True)
    assert a.allocate(1, 40, content=SegmentContent([("a", 40)]))
    assert a.allocate(2, 40, content=SegmentContent([("b", 40)]))
    a.free(2)
    assert a.seqs[1].block_table == [1, 2, 3]
    assert sorted(a.prefix_cache.evictable) == [4, 5]
    a.check_invariants()  # the books balance before any corruption
    return a


def corrupt_ref_count(a):
    a.pool.ref_counts[1] += 1  # block 1 referenced by one table, counted twice


def corrupt_free_block_with_references(a):
    a.pool.ref_counts[3] = 0  # a held block's count moved to a free one: as many in use as before
    a.pool.ref_counts[7] = 1


def corrupt_negative_ref_count(a):
    a.pool.ref_counts[7] = -1


def corrupt_free_queue_twice(a):
    a.pool._unhashed[0] = a.pool._unhashed[1]  # same length, one block listed twice, one lost


def corrupt_fill(a):
    a.block_fill[2] -= 1


def corrupt_filled_counter(a):
    a.num_filled_slots += 1


def corrupt_evictable_without_hash(a):
    a.prefix_cache.block_hashes[4] = None  # free, evictable, and its content forgotten


def corrupt_lru_count(a):
    a.prefix_cache.evictable._num_live += 1  # one evictable block more than its runs hold


def corrupt_hash_map(a):
    a.prefix_cache.cached[a.prefix_cache.block_hashes[1]] = 2


def corrupt_cached_block_not_evictable(a):
    a.prefix_cache.evictable.discard(4)  # free and cached, but among the plain free blocks
    a.pool._unhashed.append(4)


@pytest.mark.parametrize(("corrupt", "message"), [
    (corrupt_ref_count, "block 1 ref_count mismatch"),
    (corrupt_free_block_with_references, "free block 7 has references"),
    (corrupt_negative_ref_count, "free block 7 has references"),
    (corrupt_free_queue_twice, "a block is in the free queue twice"),
    (corrupt_fill, "block 2 fill mismatch"),
    (corrupt_filled_counter, None),  # a bare assert: the recount differs
    (corrupt_evictable_without_hash, "evictable block 4 holds no hash"),
    (corrupt_lru_count, "LRU entries miscounted"),
    (corrupt_hash_map, "hash map stale at block 2"),
    (corrupt_cached_block_not_evictable, "a free cached block is not evictable"),
])
def test_each_corrupted_book_is_caught(corrupt, message):
    a = world()
    corrupt(a)
    with pytest.raises(AssertionError, match=message):
        a.check_invariants()
