"""Tiny worlds with exact block ids: 11 blocks (block 0 is the null block, 10 usable) of 16 tokens."""

import pytest

from kvsim.kv import NO_HIT, PagedAllocator, SegmentContent, TokenContent, sharing_saved_slots, waste


def world(**kwargs) -> PagedAllocator:
    return PagedAllocator(num_blocks=11, block_size=16, **kwargs)


def seg(*pieces):
    return SegmentContent(list(pieces))


def test_blocks_come_from_the_head_in_order():
    a = world()
    assert a.allocate(1, 40, content=seg(("a", 40)))
    assert a.seqs[1].block_table == [1, 2, 3]
    assert a.allocate(1, 48) and a.seqs[1].block_table == [1, 2, 3]  # within the last block
    assert a.allocate(1, 49) and a.seqs[1].block_table == [1, 2, 3, 4]  # crosses a boundary
    a.check_invariants()


def test_free_order_is_lru_with_hashed_tail_blocks_evicted_first():
    a = world()
    a.allocate(1, 40, content=seg(("a", 40)))  # [1, 2, 3]: 1 and 2 full (hashed), 3 partial
    a.allocate(2, 40, content=seg(("b", 40)))  # [4, 5, 6]
    a.free(1)
    a.free(2)
    # Unhashed partial blocks go to the head; hashed blocks to the tail, each request tail-first.
    assert list(a.pool.free_queue) == [6, 3, 7, 8, 9, 10, 2, 1, 5, 4]
    assert a.allocate(3, 160)
    assert a.seqs[3].block_table == [6, 3, 7, 8, 9, 10, 2, 1, 5, 4]
    assert a.pool.cache.cached == {}  # lazily evicted as they were popped
    a.check_invariants()


def test_allocate_is_all_or_nothing():
    a = world()
    assert a.allocate(1, 150)  # 10 blocks
    assert not a.can_allocate(2, 1)
    before = (list(a.pool.free_queue), dict(a.seqs))
    assert not a.allocate(2, 1)
    assert not a.allocate(1, 161)
    assert (list(a.pool.free_queue), dict(a.seqs)) == before
    assert a.allocate(1, 160)  # fills the last block, no new block needed
    a.check_invariants()


def test_prefix_hit_takes_exactly_the_full_shared_blocks():
    a = world()
    a.allocate(1, 52, content=seg(("sys", 32), ("a", 20)))  # [1, 2, 3, 4]; 1, 2, 3 hashed
    hit = a.lookup_prefix(seg(("sys", 32), ("b", 20)), 52)
    assert (hit.num_tokens, hit.block_ids) == (32, (1, 2))
    assert a.allocate(2, 52, content=seg(("sys", 32), ("b", 20)), hit=hit)
    assert a.seqs[2].block_table == [1, 2, 5, 6]
    assert a.pool.ref_counts[1:7] == [2, 2, 1, 1, 1, 1]
    assert sharing_saved_slots(a) == 32
    a.check_invariants()


def test_full_hit_recomputes_the_last_block():
    a = world()
    a.allocate(1, 32, content=seg(("sys", 32)))
    hit = a.lookup_prefix(seg(("sys", 32)), 32)
    assert hit.num_tokens == 16 and hit.block_ids == (1,)


def test_lookup_stops_at_first_miss():
    a = world()
    a.allocate(1, 48, content=seg(("x", 16), ("y", 16), ("z", 16)))
    hit = a.lookup_prefix(seg(("x", 16), ("q", 16), ("z", 16), ("w", 1)), 49)
    assert hit.block_ids == (1,) and hit.num_tokens == 16


def test_hit_on_a_free_cached_block_pulls_it_out_of_the_queue():
    a = world()
    a.allocate(1, 40, content=seg(("sys", 32), ("a", 8)))
    a.free(1)
    assert list(a.pool.free_queue) == [3, 4, 5, 6, 7, 8, 9, 10, 2, 1]
    hit = a.lookup_prefix(seg(("sys", 32), ("b", 8)), 40)
    assert hit.block_ids == (1, 2)
    assert a.allocate(2, 40, content=seg(("sys", 32), ("b", 8)), hit=hit)
    assert a.seqs[2].block_table == [1, 2, 3]
    assert list(a.pool.free_queue) == [4, 5, 6, 7, 8, 9, 10]
    a.check_invariants()


def test_token_content_hits_on_real_ids():
    a = world()
    a.allocate(1, 33, content=TokenContent(range(33)))
    hit = a.lookup_prefix(TokenContent([*range(20), 99, 98, 97, 96, 95]), 25)
    assert hit.block_ids == (1,)


def test_caching_off_means_no_hits():
    """No hits, and the freed blocks go back to the head in vLLM's order, derived by hand: 40 tokens take 3
    blocks from the queue's head [1, 2, ..., 10] (block 0 is the null block), table [1, 2, 3]; `free` passes
    them tail-first, [3, 2, 1] (`SingleTypeKVCacheManager.free`: `reversed(req_blocks)`); none has a hash, so
    `BlockPool.free_blocks` gives all three to `FreeKVCacheBlockQueue.prepend_n`, which keeps the list's
    order at the head: [3, 2, 1, 4, ..., 10]."""
    a = world(enable_caching=False)
    a.allocate(1, 40, content=seg(("a", 40)))
    assert a.lookup_prefix(seg(("a", 40)), 40) is NO_HIT
    a.free(1)
    assert list(a.pool.free_queue) == [3, 2, 1, 4, 5, 6, 7, 8, 9, 10]


def test_copy_on_write_on_first_write_to_a_forked_block_only():
    a = world()
    a.allocate(1, 20)  # [1, 2], block 2 holds 4 tokens
    a.fork(1, 2)
    assert a.pool.ref_counts[1:3] == [2, 2]
    assert a.allocate(2, 21)
    assert a.seqs[2].block_table == [1, 3] and a.num_copy_on_writes == 1
    assert a.allocate(2, 22) and a.num_copy_on_writes == 1
    assert a.allocate(1, 21) and a.seqs[1].block_table == [1, 2] and a.num_copy_on_writes == 1
    a.check_invariants()


def test_fork_sharing_matches_closed_form():
    prompt, n, bs = 100, 4, 16
    a = PagedAllocator(num_blocks=101, block_size=bs)
    a.allocate(0, prompt)
    for child in range(1, n):
        a.fork(0, child)
    assert a.num_held_slots // bs == -(-prompt // bs)
    for seq in range(n):
        assert a.allocate(seq, prompt + 1)
    # shared full prompt blocks once, plus each sample's own last block
    assert a.num_held_slots // bs == prompt // bs + n
    a.check_invariants()


def test_5000_token_prompt_shared_by_100_requests_is_stored_once():
    a = PagedAllocator(num_blocks=1001, block_size=16)
    system = ("system", 5000)
    for request in range(100):
        content = seg(system, (("user", request), 1))
        hit = a.lookup_prefix(content, 5001)
        assert a.allocate(request, 5001, content=content, hit=hit)
        assert hit.num_tokens == (0 if request == 0 else 4992)
    # 312 full prompt blocks once, then each request's own partial block (8 prompt tokens + 1)
    assert a.num_held_slots // 16 == 312 + 100
    a.check_invariants()


def test_swap_out_and_in_all_or_nothing():
    a = world(num_cpu_blocks=4, bytes_per_block=1000)
    a.allocate(1, 40)  # 3 blocks
    a.allocate(2, 40)
    result = a.swap_out([1])
    assert (result.num_blocks, result.num_bytes) == (3, 3000)
    assert 1 in a.swapped and a.pool.num_free_blocks == 7
    assert a.swap_out([2]) is None  # 3 more do not fit in 4 CPU blocks
    assert a.allocate(3, 112)  # 7 blocks: GPU full
    assert a.swap_in([1]) is None
    a.free(3)
    result = a.swap_in([1])
    assert result.num_blocks == 3 and a.seqs[1].num_tokens == 40
    a.check_invariants()


def test_swap_keeps_fork_sharing():
    a = world(num_cpu_blocks=10)
    a.allocate(1, 20)
    a.fork(1, 2)
    assert a.swap_out([1, 2]).num_blocks == 2
    assert a.cpu_pool.ref_counts[:2] == [2, 2]
    assert a.swap_in([1, 2]).num_blocks == 2
    assert a.seqs[1].block_table == a.seqs[2].block_table
    a.check_invariants()


def test_waste_paged():
    a = world()
    a.allocate(1, 20, final_num_tokens=40)  # 2 blocks = 32 slots, 20 written, 12 reserved
    a.allocate(2, 20, final_num_tokens=20)  # 2 blocks, 20 written, 12 internal
    w = waste(a)
    assert (w.token_state, w.reserved, w.internal_frag, w.external_frag, w.free) == (40, 12, 12, 0, 96)
    assert w.total == 160


@pytest.mark.parametrize("bs", [16, 32, 128])
def test_block_hashes_depend_on_block_size(bs):
    content = seg(("a", 300))
    assert len(content.block_hashes(bs, 300 // bs)) == 300 // bs


@pytest.mark.parametrize("caching", [False, True])
def test_a_burst_equals_one_token_allocations_step_by_step(caching):
    # 40, 16 and 5 tokens written (blocks [1, 2, 3], [4], [5]), 20 decode steps: a sequence takes a
    # block at each step offset where written + offset ≡ 0 (mod 16): the first at 8, the second at 0
    # and 16, the third at 11; so in step order blocks 6, 7, 8, 9 go to sequences 2, 1, 3, 2, and the
    # held slots after each step are 96 (offsets 0-7), 112 (8-10), 128 (11-15), 144 (16-19). A naive
    # second run allocates one token at a time: same tables, fills and hashes, and the occupancy that
    # append_burst returns (burst_occupancy's before it) is its per-step books.
    finals = {1: 100, 2: 60, 3: 30}
    burst, naive = (PagedAllocator(num_blocks=30, block_size=16, enable_caching=caching) for _ in range(2))
    for a in (burst, naive):
        for seq_id, written in ((1, 40), (2, 16), (3, 5)):
            assert a.allocate(seq_id, written, finals[seq_id], seg((("s", seq_id), finals[seq_id])))
    planned = burst.burst_occupancy([1, 2, 3], 20)
    assert burst.burst_slots_needed([1, 2, 3], 20) == 4 * 16 and burst.burst_fits([1, 2, 3], 20)
    assert burst.append_burst([1, 2, 3], 20) == planned
    assert planned[0] == [96] * 8 + [112] * 3 + [128] * 5 + [144] * 4
    assert planned[1] == [40 + 16 + 5 + 3 * j for j in range(1, 21)]
    assert [burst.seqs[s].block_table for s in (1, 2, 3)] == [[1, 2, 3, 7], [4, 6, 9], [5, 8]]
    books: tuple[list[int], list[int], list[int]] = ([], [], [])
    for _ in range(20):
        for seq_id in (1, 2, 3):
            assert naive.allocate(seq_id, naive.seqs[seq_id].num_tokens + 1)
        held, filled, reserved = books
        held.append(naive.num_held_slots)
        filled.append(naive.num_filled_slots)
        reserved.append(naive.num_reserved_slots)
    assert planned == books
    for a in (burst, naive):
        a.check_invariants()
    assert [naive.seqs[s].block_table for s in (1, 2, 3)] == [burst.seqs[s].block_table for s in (1, 2, 3)]
    assert burst.block_fill == naive.block_fill and burst.prefix_cache.block_hashes == naive.prefix_cache.block_hashes
    assert burst.pool.free_queue == naive.pool.free_queue


def test_burst_fits_counts_the_new_blocks_when_memory_is_short():
    # The sequences above with 4 free blocks: 20 steps could take 2 blocks each (6 > 4) but take 4;
    # 27 steps take 5 (2, 2 and 1).
    alloc = PagedAllocator(num_blocks=10, block_size=16, enable_caching=False)
    for seq_id, written in ((1, 40), (2, 16), (3, 5)):
        assert alloc.allocate(seq_id, written, 100)
    assert alloc.pool.num_free_blocks == 4
    assert alloc.burst_fits([1, 2, 3], 20)
    assert alloc.burst_slots_needed([1, 2, 3], 27) == 5 * 16 and not alloc.burst_fits([1, 2, 3], 27)


@pytest.mark.parametrize("d_written", [4, 2])
def test_a_burst_registers_a_hash_whether_or_not_it_is_evicted_before_the_step_that_fills_it(d_written):
    # Blocks of 4. A fills block 1 under the hash of its first 4 tokens and ends: block 1 is the one
    # free block, cached. B, with A's content and no hit, holds 1 token in block 2; D holds `d_written`
    # tokens in block 3. In 3 steps B fills block 2 at offset 2 (hash A's) and D takes a new block:
    # the cached block 1 is evicted for it at offset 0 (4 written: before B registers, so B's block
    # caches the hash afresh) or at offset 2 after B (2 written: B's block was cached as a duplicate of
    # block 1, as vLLM keeps duplicates, and is the one found once block 1 is evicted). Either way B's holds it.
    content = seg(("a", 8))
    burst, naive = (PagedAllocator(num_blocks=4, block_size=4, enable_caching=True) for _ in range(2))
    for a in (burst, naive):
        assert a.allocate(1, 4, 8, content)
        a.free(1)
        assert a.allocate(2, 1, 8, content) and a.allocate(3, d_written, 12, seg(("d", 12)))
        assert a.pool.free_queue == [1] and a.prefix_cache.block_hashes[1] is not None
    key = burst.prefix_cache.block_hashes[1]
    burst.append_burst([2, 3], 3)
    for _ in range(3):
        for seq_id in (2, 3):
            assert naive.allocate(seq_id, naive.seqs[seq_id].num_tokens + 1)
    for a in (burst, naive):
        a.check_invariants()
        assert a.prefix_cache.cached.get(key) == a.seqs[2].block_table[0]
        assert not a.prefix_cache.duplicates
    assert [burst.seqs[s].block_table for s in (2, 3)] == [naive.seqs[s].block_table for s in (2, 3)]
    assert burst.prefix_cache.block_hashes == naive.prefix_cache.block_hashes
    assert burst.prefix_cache.cached == naive.prefix_cache.cached


@pytest.mark.parametrize("v0", [False, True], ids=["v1-cache", "v0-cache"])
def test_a_fork_without_content_shares_the_parents_tokens_so_far_and_not_its_next(v0):
    """A beam re-forked from a survivor (`fork` without content) is the survivor's tokens so far, then a token
    of its own (vLLM v0's beam search: `parent.fork(id)`, then `child.append_token_id(its own candidate)`).
    It took the parent's whole content: the block both fill next hashed alike (a duplicate in the v1 cache;
    under v0's caching the child's block was swapped for the parent's, one block held by both). By hand:
    ids 100..139 (prompt 20 + output 20), the parent writes 20 and forks; the child's content is ids 100..119
    then its placeholder, so block 0 (ids 100..115) is one block, and block 1 (16..31) is two of different
    hashes, each found again only by its owner's tokens."""
    a = world(v0_prefix_caching=v0)
    ids = tuple(range(100, 140))
    assert a.allocate(1, 20, content=TokenContent(ids))  # [1, 2]: block 2 partial (4 tokens)
    a.fork(1, 2, None, 39)
    own = ("fork", 2, 20)
    assert a.seqs[2].content.token_ids == ids[:20] + (own,) * 20
    assert a.allocate(1, 32) and a.allocate(2, 32)  # both fill block 1: the first writer copies it
    parent_table, child_table = a.seqs[1].block_table, a.seqs[2].block_table
    assert parent_table[0] == child_table[0] and parent_table[1] != child_table[1]
    assert a.prefix_cache.duplicates == {}
    assert a.lookup_prefix(TokenContent(ids), 33).block_ids == tuple(parent_table[:2])
    assert a.lookup_prefix(TokenContent(ids[:20] + (own,) * 13), 33).block_ids == tuple(child_table[:2])
    a.check_invariants()


def test_a_branch_keeps_the_segments_before_it_and_names_the_rest():
    """`SegmentContent.branch` cut by hand: system prompt 5, output 7 (12 tokens)."""
    content = seg(("sys", 5), ("out", 7))
    assert content.branch(8, "x").segments == (("sys", 5), ("out", 3), ("x", 4))
    assert content.branch(5, "x").segments == (("sys", 5), ("x", 7))
    assert content.branch(3, "x").segments == (("sys", 3), ("x", 9))
    assert content.branch(2, "x").block_hashes(2, 1) == content.block_hashes(2, 1)
    assert content.branch(2, "x").block_hashes(2, 2)[1] != content.block_hashes(2, 2)[1]


@pytest.mark.parametrize("caching", [False, True])
def test_a_fork_where_the_parents_content_ends_shares_all_of_it(caching):
    """A parent forked once it has written every token its content names (hypothesis found: a 1-token
    prompt forked right after admission): the child has no token of its own, so its content is the parent's,
    and the books balance once both are freed."""
    alloc = PagedAllocator(num_blocks=3, block_size=16, enable_caching=caching)
    assert alloc.allocate(0, 1, 1, SegmentContent([("p", 1)]))
    alloc.fork(0, 1)
    assert alloc.seqs[1].content is alloc.seqs[0].content
    assert alloc.seqs[1].block_table == alloc.seqs[0].block_table
    alloc.free(0)
    alloc.free(1)
    alloc.check_invariants()
    assert alloc.pool.num_free_blocks == 2  # the null block held back


def test_a_branch_at_either_end():
    """`branch` at 0 owns every token; at its length it is the content itself (token-level alike)."""
    segments = SegmentContent([("sys", 5), ("out", 7)])
    assert segments.branch(0, "x").segments == (("x", 12),)
    assert segments.branch(12, "x").segments == segments.segments
    ids = TokenContent([1, 2, 3])
    assert ids.branch(0, "x").token_ids == ("x", "x", "x") and ids.branch(3, "x").token_ids == (1, 2, 3)


def test_free_puts_plain_blocks_at_the_head_last_block_first_and_cached_ones_at_the_tail():
    """vLLM's free order, derived by hand. 40 tokens of content take blocks [1, 2, 3] from the head of
    [1, ..., 10]: 1 and 2 are full and cached, 3 holds 8 tokens (no hash); holding 80 slots adds [4, 5]
    (no content). `free` passes the table tail-first, [5, 4, 3, 2, 1] (`reversed(req_blocks)`);
    `BlockPool.free_blocks` gives the unhashed ones, [5, 4, 3] in that order, to `prepend_n` (the list's
    first block becomes the head) and the hashed ones, [2, 1], to `append_n` (the LRU tail): the queue is
    [5, 4, 3, 6, 7, 8, 9, 10, 2, 1]."""
    a = world()
    assert a.allocate(1, 40, content=seg(("a", 40)))
    assert a.hold(1, 80)
    assert a.seqs[1].block_table == [1, 2, 3, 4, 5]
    a.free(1)
    assert list(a.pool.free_queue) == [5, 4, 3, 6, 7, 8, 9, 10, 2, 1]
    a.check_invariants()


def test_a_burst_that_registers_only_hashes_the_heads_hit_holds_does_not_extend_its_prefix():
    # Blocks of 4. A (p: 8 tokens, then o: 8) ran to its end and was freed: its 4 blocks stay cached, free.
    # S, with A's content and no hit, has written 5 tokens; a burst of 11 steps fills its blocks 1-3,
    # registering duplicates of A's hashes 1-3. The queue's head H (p, o, then q: 8) hits A's 4 blocks and
    # stops at q's first block, which no burst registers: its lookup cannot find more (vLLM would find the
    # same 4 blocks step by step), though S registers hashes of H's chain (before its miss).
    content, head = seg(("p", 8), ("o", 8)), seg(("p", 8), ("o", 8), ("q", 8))
    a = PagedAllocator(num_blocks=12, block_size=4, enable_caching=True)
    assert a.allocate(1, 16, 16, content)
    a.free(1)
    assert a.allocate(2, 5, 16, content)
    assert len(a.lookup_prefix(head, 24).block_ids) == 4
    assert not a.burst_extends_prefix([2], 11, head, 24)


@pytest.mark.parametrize(("num_steps", "extends"), [(2, False), (3, True)])
def test_a_burst_extends_the_heads_prefix_when_it_registers_the_heads_first_missing_hash(num_steps, extends):
    # Blocks of 4. S (p: 8 tokens, then o: 8) has written 5 tokens: block 0 (p's first 4) is cached. The head
    # (p, o, q) hits it and misses at p's second block, which S fills at its 8th token: 3 steps on.
    a = PagedAllocator(num_blocks=12, block_size=4, enable_caching=True)
    assert a.allocate(2, 5, 16, seg(("p", 8), ("o", 8)))
    head = seg(("p", 8), ("o", 8), ("q", 8))
    assert len(a.lookup_prefix(head, 24).block_ids) == 1
    assert a.burst_extends_prefix([2], num_steps, head, 24) is extends


def test_a_burst_registers_equal_hashes_in_step_order_not_batch_order():
    # Blocks of 16, both sequences with one content and no hit (each its own blocks: 1-2 and 3-4; block 0 of
    # the second is a duplicate of block 1). In 12 steps the first (batch position 0, 20 written) fills its
    # block 2 at offset 32 - 20 - 1 = 11, the second (position 1, 30 written) fills block 4 at offset 1 and
    # takes block 5 at offset 2. Step by step the second registers the shared hash first: block 4 is the one
    # found, block 2 its duplicate (the batch's order would have made block 2 the one found).
    content = seg(("doc", 64))
    burst, naive = (PagedAllocator(num_blocks=11, block_size=16, enable_caching=True) for _ in range(2))
    for a in (burst, naive):
        assert a.allocate(1, 20, 64, content) and a.allocate(2, 30, 64, content)
    burst.append_burst([1, 2], 12)
    for _ in range(12):
        for seq_id in (1, 2):
            assert naive.allocate(seq_id, naive.seqs[seq_id].num_tokens + 1)
    first, second = content.block_hashes(16, 2)
    for a in (burst, naive):
        a.check_invariants()
        assert [a.seqs[1].block_table, a.seqs[2].block_table] == [[1, 2], [3, 4, 5]]
        assert a.prefix_cache.cached == {first: 1, second: 4}
        assert a.prefix_cache.duplicates == {first: [3], second: [2]}
