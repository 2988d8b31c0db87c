"""Freeing a table's blocks, against naive references at realistic size (tables of hundreds of blocks).

`BlockPool.free_blocks` and `PagedAllocator`'s release take fast paths when the blocks still shared after a
free are the table's leading ones (a prefix hit: listed last, as tables are freed tail-first): the freed
blocks are then a slice, and the tokens they held follow from the table's layout. Here both are driven with
shared blocks anywhere, and every answer is compared with a recount written without those paths: the freed
blocks as vLLM's `BlockPool.free_blocks` picks them (each block whose ref count reaches 0, in the order
given), the queue as `FreeKVCacheBlockQueue` orders them, and the filled slots as the sum of each block's fill.
"""

import random
from collections import OrderedDict
from itertools import compress, count, islice

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.kv.block_pool import BlockPool
from kvsim.kv.paged import PagedAllocator
from kvsim.kv.radix_prefix_cache import RadixPrefixCache
from kvsim.workload.content import SegmentContent


def test_free_blocks_picks_and_queues_as_a_naive_pool():
    """400 tables of 1-300 blocks over 2,000 blocks: each takes new blocks and references to 0-40 % of the
    blocks of live tables (a prefix of one, as a hit, or blocks picked anywhere), caches some of its new blocks,
    all, or all but the last (a request's partial last block; one block under the hash 0, a false value), and
    tables are freed tail-first in random order."""
    rng, num_blocks = random.Random(5), 2_000
    pool = BlockPool(num_blocks)
    refs = [0] * num_blocks  # the naive pool: ref counts, the plain blocks (head first) and the LRU
    plain, lru, hashed = list(range(1, num_blocks)), OrderedDict[int, None](), set[int]()
    keys = count(1 << 40)
    tables: list[list[int]] = []
    num_sliced = num_picked = num_all_hashed = num_head_plain = num_zero_hash = 0
    for step in range(400):
        while tables and (len(tables) > 12 or rng.random() < 0.4):
            table = tables.pop(rng.randrange(len(tables)))
            ordered = table[::-1]
            for block_id in ordered:
                refs[block_id] -= 1
            expected = [b for b in ordered if not refs[b]]
            kept = len(ordered) - len(expected)
            num_all_hashed += len(expected) > 1 and all(b in hashed for b in expected)
            num_head_plain += len(expected) > 1 and expected[0] not in hashed and all(b in hashed for b in expected[1:])
            num_zero_hash += any(pool.cache.block_hashes[b] == 0 for b in expected)
            num_sliced += bool(kept) and ordered[:len(expected)] == expected
            num_picked += bool(kept) and ordered[:len(expected)] != expected
            assert pool.free_blocks(ordered) == expected
            lru.update(dict.fromkeys(b for b in expected if b in hashed))
            plain[:0] = [b for b in expected if b not in hashed]
            assert pool.free_queue == [*plain, *lru] and pool.ref_counts == refs
        shared: list[int] = []
        if tables and rng.random() < 0.7:
            other = rng.choice(tables)
            if rng.random() < 0.5:
                shared = other[:rng.randrange(len(other) + 1)]  # a hit: the other table's first blocks
            else:
                shared = rng.sample(other, rng.randrange(len(other) + 1))
        size = min(rng.randrange(1, 300), len(plain) + len(lru))
        new = pool.get_new_blocks(size)
        taken = plain[:size]
        for _ in range(size - len(taken)):
            block_id, _ = lru.popitem(last=False)
            taken.append(block_id)
        del plain[:size]
        hashed.difference_update(taken)
        assert new == taken
        pool.touch(shared)
        table = [*shared, *new]
        for block_id in table:
            refs[block_id] += 1
        kind = rng.randrange(3)  # as a request caches: some blocks, all, or all but its partial last block
        cached = [b for b in new if rng.random() < 0.7] if kind == 0 else new if kind == 1 else new[:-1]
        # a hash of 0 once (a false value the pool must still see as a hash)
        pool.cache.insert_keys(cached, [0, *islice(keys, len(cached) - 1)] if step == 0 and cached
                               else islice(keys, len(cached)))
        hashed.update(cached)
        tables.append(table)
        if step % 40 == 0:
            pool.check_invariants()
    assert num_sliced > 40 and num_picked > 40  # both ways of picking the freed blocks
    # every way of splitting them into cached and plain ones
    assert num_all_hashed > 40 and num_head_plain > 40 and num_zero_hash == 1


def test_release_counts_the_filled_slots_of_a_recount():
    """500 sequences over 2,000 blocks of 16 tokens: prompts of up to 4,000 tokens sharing prefixes of 1-6
    512-token segments (hits), forks (a parent's blocks, its partial last one included, shared) and decodes,
    freed in random order: after each free the filled slots equal the sum of the fills of the blocks in use."""
    rng, bs = random.Random(11), 16
    alloc = PagedAllocator(2_000, bs)
    live: list[int] = []
    num_shared_frees = 0
    for seq_id in range(0, 1_000, 2):
        while live and (len(live) > 10 or rng.random() < 0.4):
            victim = live.pop(rng.randrange(len(live)))
            num_shared_frees += any(alloc.pool.ref_counts[b] > 1 for b in alloc.seqs[victim].block_table)
            alloc.free(victim)
            refs = alloc.pool.ref_counts
            assert alloc.num_filled_slots == sum(compress(alloc.block_fill, refs))
        segments = [(("doc", rng.randrange(8)), 512) for _ in range(rng.randrange(1, 7))]
        content = SegmentContent([*segments, (("own", seq_id), rng.randrange(1, 900))])
        prompt = rng.randrange(1, content.num_tokens + 1)
        hit = alloc.lookup_prefix(content, prompt)
        if alloc.allocate(seq_id, prompt, prompt + 64, content, hit) is None:
            continue
        live.append(seq_id)
        if rng.random() < 0.3:
            alloc.fork(seq_id, seq_id + 1)
            live.append(seq_id + 1)
        for grown in rng.sample(live, min(3, len(live))):
            alloc.allocate(grown, alloc.seqs[grown].num_tokens + rng.randrange(1, 20))
    alloc.check_invariants()
    assert num_shared_frees > 100


def test_a_hit_sharing_a_later_block_than_its_duplicate_frees_the_blocks_between():
    """Blocks of 4 tokens; U, S and T read the same 12-token document, then text of their own. U prefills 8
    tokens: blocks 1, 2 (hashes h0, h1). S's 5-token prompt hits block 1 (a hit stops before the last token's
    block) and takes block 3 for tokens 4-7: decoding, it fills 3 with h1, already found at 2 (3 is a
    duplicate), then block 4 with h2, first. T's 13-token prompt hits h0, h1, h2: blocks 1, 2, 4, and takes 5.
    S then writes 2 tokens into block 6. Freed tail-first, S's [6, 4, 3, 1] drops to 6 and 3 (4 stays T's, 1
    U's and T's): the blocks still shared are not the table's first, and the filled slots lose 6's 2 and 3's
    4 tokens: 13 left, in blocks 1, 2, 4 (4 each) and 5 (1). Block 6 (no hash) goes to the free queue's
    head, 3 (h1) to its tail."""
    alloc = PagedAllocator(11, 4)

    def content(name):
        return SegmentContent([("doc", 12), (("own", name), 8)])

    alloc.allocate(0, 8, 20, content("U"))
    s = content("S")
    alloc.allocate(1, 5, 20, s, alloc.lookup_prefix(s, 5))
    for tokens in range(6, 13):
        alloc.allocate(1, tokens)
    t = content("T")
    hit = alloc.lookup_prefix(t, 13)
    assert hit.block_ids == (1, 2, 4)
    alloc.allocate(2, 13, 20, t, hit)
    alloc.allocate(1, 13)
    alloc.allocate(1, 14)
    assert [alloc.seqs[i].block_table for i in range(3)] == [[1, 2], [1, 3, 4, 6], [1, 2, 4, 5]]
    alloc.free(1)
    assert alloc.num_filled_slots == 4 + 4 + 4 + 1
    assert alloc.pool.free_queue == [6, 7, 8, 9, 10, 3]
    alloc.check_invariants()


def test_a_repeated_hit_counts_its_free_blocks_as_a_recount():
    """A queue head's hit, asked about again and again (`_blocks_needed` with the same `PrefixHit`, as
    `can_allocate` is at every step) while, one operation at a time, 1,500 sequences over 600 blocks take hits on
    its blocks (some taking one new block only, or only references), free them, and evict them as they grow: the blocks it needs are always its free hit blocks
    (counted afresh) plus the blocks past the hit, also after its blocks were evicted under it."""
    rng, bs = random.Random(3), 16
    alloc = PagedAllocator(600, bs)
    docs = [SegmentContent([(("doc", d), 2_048), (("own", d), 4_096)]) for d in range(4)]
    for d, doc in enumerate(docs):  # cache each document's blocks, then free them
        alloc.allocate(10_000 + d, 2_048, 2_100, doc, alloc.lookup_prefix(doc, 2_048))
        alloc.free(10_000 + d)
    live: list[int] = []
    held: list[list[int]] = []
    hit = alloc.lookup_prefix(docs[0], 2_048)
    counts = []
    for seq_id in range(1_500):
        op = rng.random()
        if op < 0.05:
            hit = alloc.lookup_prefix(rng.choice(docs), 2_048)
        elif op < 0.15:  # a reference taken on some of the hit's blocks alone (a pool's `touch`), or dropped
            if held:
                alloc.pool.free_blocks(held.pop()[::-1])
            else:
                held.append(list(hit.block_ids[:rng.randrange(1, len(hit.block_ids) + 1)]))
                alloc.pool.touch(held[-1])
        elif op < 0.4 and live:
            alloc.free(live.pop(rng.randrange(len(live))))
        elif op < 0.7 and live:  # a growth past the plain free blocks evicts cached ones, with no hit taken
            grown = rng.choice(live)
            alloc.allocate(grown, alloc.seqs[grown].num_tokens + rng.randrange(1, 600))
        else:  # a hit, sometimes on the whole document (one new block: a plain one if any, no eviction)
            content = rng.choice(docs)
            prompt = 2_049 if op < 0.85 else rng.randrange(1, 2_100)
            if alloc.allocate(seq_id, prompt, prompt + 4_000, content, alloc.lookup_prefix(content, prompt)):
                live.append(seq_id)
        refs = alloc.pool.ref_counts
        counts.append([refs[b] for b in hit.block_ids].count(0))
        assert alloc._blocks_needed(None, 2_048, hit) == counts[-1] + 128 - len(hit.block_ids)
    assert len(set(counts)) > 20  # the head's hit blocks went in and out of use


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.booleans(), st.booleans())
def test_a_held_hit_counts_its_free_blocks_as_a_recount_through_forks_swaps_and_a_radix_cache(seed, radix, v0):
    """Review 27: `_blocks_needed`'s memo of a hit's free blocks stands while the pool's `num_ref_count_changes`
    does. Every path that moves a ref count is driven at random on 40 blocks of 4 tokens, with a hash-chain
    (v1 or v0 prefix caching) or SGLang's radix cache and a CPU swap pool: prefix hits, frees, v0 forks, appends
    (a shared last block is copied), swaps out and in, growth that evicts cached blocks; after each, a held hit's
    count is the recount of its blocks whose ref count is 0, plus the blocks past it."""
    rng, bs = random.Random(seed), 4
    alloc = PagedAllocator(40, bs, num_cpu_blocks=40, prefix_cache=RadixPrefixCache(40, bs) if radix else None,
                           v0_prefix_caching=v0 and not radix)
    docs = [SegmentContent([(("doc", d), 24), (("own", d), 200)]) for d in range(3)]
    live: list[int] = []
    swapped: list[int] = []
    new_ids = count(1)
    hit = alloc.lookup_prefix(docs[0], 24)
    for _ in range(120):
        op = rng.random()
        if op < 0.1:
            hit = alloc.lookup_prefix(rng.choice(docs), rng.randrange(1, 30))
        elif op < 0.3 and live:
            alloc.free(live.pop(rng.randrange(len(live))))
        elif op < 0.4 and live:
            child = next(new_ids)
            alloc.fork(rng.choice(live), child)
            live.append(child)
        elif op < 0.55 and live:
            alloc.append_token(rng.choice(live))
        elif op < 0.62 and live:
            seq_id = live.pop(rng.randrange(len(live)))
            (swapped if alloc.swap_out([seq_id]) is not None else live).append(seq_id)
        elif op < 0.7 and swapped:
            if alloc.swap_in([swapped[-1]]) is not None:
                live.append(swapped.pop())
        elif op < 0.8 and live:
            grown = rng.choice(live)
            alloc.allocate(grown, alloc.seqs[grown].num_tokens + rng.randrange(1, 12))
        else:
            content, prompt, seq_id = rng.choice(docs), rng.randrange(1, 40), next(new_ids)
            if alloc.allocate(seq_id, prompt, prompt + 10, content, alloc.lookup_prefix(content, prompt)):
                live.append(seq_id)
        if rng.random() < 0.3:
            alloc.mark_blocks_as_computed()
        refs = alloc.pool.ref_counts
        recount = [refs[b] for b in hit.block_ids].count(0) + max(0, -(-30 // bs) - len(hit.block_ids))
        assert alloc._blocks_needed(None, 30, hit) == recount
        alloc.check_invariants()
