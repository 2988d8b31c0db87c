"""Freeing a table's blocks, against naive references at realistic size (tables of hundreds of blocks).

`BlockPool.free_blocks` takes a fast path when the blocks still shared after a free are the table's leading
ones (a prefix hit: listed last, as tables are freed tail-first): the freed blocks are then a slice. Here it
is driven with shared blocks anywhere, and every answer is compared with a recount written without that path:
the freed blocks as vLLM's `BlockPool.free_blocks` picks them (each block whose ref count reaches 0, in the
order given) and the queue as `FreeKVCacheBlockQueue` orders them.
"""

import random
from collections import OrderedDict
from itertools import count, islice

from kvsim.kv.block_pool import BlockPool


def test_free_blocks_picks_and_queues_as_a_naive_pool():
    """400 tables of 1-300 blocks over 2,000 blocks: each takes new blocks and references to 0-40 % of the
    blocks of live tables (a prefix of one, as a hit, or blocks picked anywhere), caches some of its blocks,
    and tables are freed tail-first in random order."""
    rng, num_blocks = random.Random(5), 2_000
    pool = BlockPool(num_blocks)
    refs = [0] * num_blocks  # the naive pool: ref counts, the plain blocks (head first) and the LRU
    plain, lru, hashed = list(range(1, num_blocks)), OrderedDict[int, None](), set[int]()
    keys = count(1 << 40)
    tables: list[list[int]] = []
    num_sliced = num_picked = 0
    for step in range(400):
        while tables and (len(tables) > 12 or rng.random() < 0.4):
            table = tables.pop(rng.randrange(len(tables)))
            ordered = table[::-1]
            for block_id in ordered:
                refs[block_id] -= 1
            expected = [b for b in ordered if not refs[b]]
            kept = len(ordered) - len(expected)
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
        cached = [b for b in new if rng.random() < 0.7]
        pool.cache.insert_keys(cached, islice(keys, len(cached)))
        hashed.update(cached)
        tables.append(table)
        if step % 40 == 0:
            pool.check_invariants()
    assert num_sliced > 40 and num_picked > 40  # both ways of picking the freed blocks

