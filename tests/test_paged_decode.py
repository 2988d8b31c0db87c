"""The one-token decode paths (`kvsim.kv.paged_decode`: `append_token`, `allocate`'s new-block decode) do exactly
what `PagedAllocator.allocate`'s general path does (`_blocks_needed`, `_write`, `_mark_written`).

The reference is the same allocator with both paths turned off, so every call takes the general path; both
are driven by one random workload of thousands of sequences (shared prefixes under eviction pressure, forks
whose children write into a shared last block, speculative holds, a v0-style watermark, allocations refused
for want of a block) and must agree on every result, table, counter and the whole free queue after every call.
"""

import random

from kvsim.kv.paged import PagedAllocator
from kvsim.workload.content import SegmentContent


class GeneralPathAllocator(PagedAllocator):
    """`allocate` without its one-token shortcuts: a decode goes through `_blocks_needed` and `_write`."""

    def append_token(self, seq_id):
        return False

    def _append_block(self, seq, reserve_slots):
        return False


def seq_state(alloc: PagedAllocator, seq_id: int) -> tuple | None:
    q = alloc.seqs.get(seq_id)  # all but the content (a fork's is a new object on each side)
    return None if q is None else (q.block_table, q.num_tokens, q.final_num_tokens, q.num_hashed_blocks, q.reservable)


def counters(alloc: PagedAllocator) -> tuple:
    return (alloc.num_filled_slots, alloc.num_reserved_slots, alloc.num_mapped_slots, alloc.num_copy_on_writes,
            alloc.pool.num_free_blocks)


def state(alloc: PagedAllocator) -> tuple:
    seqs = {s: seq_state(alloc, s) for s in alloc.seqs}
    return (seqs, alloc.pool.free_queue, alloc.pool.ref_counts, alloc.block_fill, alloc.num_filled_slots,
            alloc.num_reserved_slots, alloc.num_mapped_slots, alloc.num_copy_on_writes, alloc.prefix_cache.cached,
            alloc.prefix_cache.duplicates)


def test_one_token_decodes_do_what_the_general_path_does():
    """1,000 sequences and their forks (contents of 1-5 shared 48-token segments plus a tail of their own, 1-120
    output tokens), up to 40 live, over 200 blocks of 16 tokens: decodes start hundreds of new blocks, some refused
    (the pool full, or only the watermark left), and forked children take their reservations over when they write."""
    rng = random.Random(3)
    block_size, num_blocks = 16, 200
    fast, plain = (cls(num_blocks, block_size) for cls in (PagedAllocator, GeneralPathAllocator))
    both = (fast, plain)
    live: dict[int, int] = {}  # seq id -> final tokens
    forked, held = set(), set()  # only single sequences speculate: forks never hold ahead (`PagedAllocator.hold`)
    num_new_blocks = num_refused = num_taken_over = next_id = num_ops = 0
    for _ in range(1_000):
        while live and (len(live) >= 40 or rng.random() < 0.6):  # grow, fork, hold or finish a live sequence
            seq_id = rng.choice(sorted(live))
            written, final = fast.seqs[seq_id].num_tokens, live[seq_id]
            op = rng.random()
            if written >= final or op < 0.1:
                for a in both:
                    a.free(seq_id)
                del live[seq_id]
            elif op < 0.15 and len(live) < 40 and seq_id not in held:  # a child sharing every block (parallel sampling, beams)
                next_id += 1
                child = 10_000 + next_id
                for a in both:
                    a.fork(seq_id, child)
                live[child] = final
                forked.update((seq_id, child))
            elif op < 0.2 and seq_id not in forked:  # speculative slots held ahead of the written tokens
                held.add(seq_id)
                slots = written + rng.randrange(1, 40)
                assert fast.hold(seq_id, slots) == plain.hold(seq_id, slots)
            else:  # one decode token, as the scheduler asks: `append_token` first, else `allocate`
                reserve = rng.choice((0, 0, 0, 10 * block_size))  # v0's watermark, in slots
                seq = fast.seqs[seq_id]
                starts_block, reserved_own = written == len(seq.block_table) * block_size, seq.reservable == written
                if not reserve and rng.random() < 0.5 and fast.append_token(seq_id):
                    assert plain.allocate(seq_id, written + 1) is not None
                    num_taken_over += reserved_own  # a forked child's reservation became its own
                else:
                    results = [a.allocate(seq_id, written + 1, reserve_slots=reserve) for a in both]
                    assert results[0] == results[1]
                    num_new_blocks += starts_block and results[0] is not None
                    num_refused += starts_block and results[0] is None
            assert seq_state(fast, seq_id) == seq_state(plain, seq_id) and counters(fast) == counters(plain)
            num_ops += 1
            if num_ops % 32 == 0:
                assert state(fast) == state(plain)
        content = SegmentContent([*((("seg", rng.randrange(10)), 48) for _ in range(rng.randrange(1, 6))),
                                  (("own", next_id), rng.randrange(1, 60))])
        next_id += 1
        prompt = rng.randrange(1, content.num_tokens + 1)
        hit = fast.lookup_prefix(content, prompt)
        assert hit == plain.lookup_prefix(content, prompt)
        final = prompt + rng.randrange(1, 120)
        results = [a.allocate(next_id, prompt, final, content, hit) for a in both]
        assert results[0] == results[1]
        if results[0] is not None:
            live[next_id] = final
        assert state(fast) == state(plain)
        if next_id % 50 == 0:
            fast.check_invariants()
    # every shortcut ran, and the refusals and forks it must leave to the general path happened
    assert num_new_blocks > 200 and num_refused > 40 and fast.num_copy_on_writes > 30 and num_taken_over > 5
