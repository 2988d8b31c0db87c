"""Which prefix-cache hits skip computation: blocks are shared as soon as they are cached, but vLLM v0 counts
them computed only once the step that fills them is scheduled, while v1 counts them at allocation.

Expected values are derived by hand from vLLM's code:
* v0 (vllm/core/block/prefix_caching_block.py, PrefixCachingBlockAllocator): `allocate_immutable_block` shares
  any block whose content hash is in `_cached_blocks` (memory); `promote_to_immutable_block` puts a newly filled
  block there at once but only in `_touched_blocks`, marked computed by `mark_blocks_as_computed` after the
  scheduler has built the whole batch (vllm/core/scheduler.py, `schedule`; PR #7822). The cached-token count the
  scheduler's budget uses (`ComputedBlocksTracker.get_num_cached_tokens` → `find_cached_blocks_prefix`) takes
  only blocks that `block_is_computed`.
* v1 (vllm/v1/core/kv_cache_manager.py, `allocate_slots`): `cache_blocks` registers the full blocks of the
  scheduled tokens before the step runs, and `get_computed_blocks` of a request admitted later in the same step
  finds them.
"""

import numpy as np
import pytest

from kvsim.engine.builder import build_engine
from kvsim.kv.paged import PagedAllocator
from kvsim.workload.content import SegmentContent
from kvsim.workload.request import Request
from kvsim.workload.scenario import load_scenario
from tests.conftest import make_request


def built(scheduler: str, num_blocks: int = 10, max_num_seqs: int = 256, max_model_len: int = 64):
    """An engine of `num_blocks` blocks of 16 tokens with prefix caching on, built as every run is."""
    scenario = load_scenario(None, ["model=llama-3.1-8b", f"engine.num_gpu_blocks_override={num_blocks}",
                                    "engine.block_size=16", f"engine.max_model_len={max_model_len}",
                                    f"engine.scheduler={scheduler}", "workload.num_requests=1",
                                    "engine.enable_prefix_caching=true", f"engine.max_num_seqs={max_num_seqs}"])
    return build_engine(scenario, np.random.default_rng(0)).scheduler


def two_together(scheduler: str):
    """A and B, 40 tokens each whose first 32 (2 full blocks) are one shared prefix, arrive together and are
    scheduled in one step: the scheduler, A, B and that step's plan."""
    sched = built(scheduler)
    a, b = make_request(0, 0.0, 40, 10, prefix=32), make_request(1, 0.0, 40, 10, prefix=32)
    assert sched.add(a) and sched.add(b)
    return sched, a, b, sched.schedule(0.0)


def test_v0_second_identical_prefix_in_one_step_shares_blocks_but_computes_them():
    """A and B (40 tokens, the first 32 shared: 2 full blocks) arrive together. v0 hands out block ids in order
    from 0 (no null block): A takes 0, 1, 2; B's first two full blocks hash as A's, found in `_cached_blocks`,
    so B shares 0 and 1 (ref count 2) and takes 3 for its own 8 tokens; but 0 and 1 are not computed yet, so
    B's cached tokens are 0 and it computes all 40. 4 of 10 blocks are held: usage 0.4. Prefix-cache counters:
    80 tokens queried, 0 hit."""
    sched, a, b, plan = two_together("v0")
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(0, 40), (1, 40)]
    assert sched.alloc.seqs[a.seq_ids[0]].block_table == [0, 1, 2]
    assert sched.alloc.seqs[b.seq_ids[0]].block_table == [0, 1, 3]
    assert sched.alloc.pool.ref_counts[:4] == [2, 2, 1, 1]
    assert sched.kv_usage == 0.4
    assert (a.num_prefix_hit_tokens, b.num_prefix_hit_tokens) == (0, 0)
    assert (sched.prefix_stats.num_query_tokens, sched.prefix_stats.num_hit_tokens) == (80, 0)
    sched.check_invariants()
    # the next step: the batch has been built, blocks 0 and 1 are computed; C (same 32-token prefix) skips
    # them and computes its last 8 tokens in block 4
    sched.complete(plan, 1.0)
    c = make_request(2, 0.5, 40, 10, prefix=32)
    assert sched.add(c)
    plan = sched.schedule(1.0)
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(2, 8)]
    assert sched.alloc.seqs[c.seq_ids[0]].block_table == [0, 1, 4]
    assert c.num_prefix_hit_tokens == 32
    assert (sched.prefix_stats.num_query_tokens, sched.prefix_stats.num_hit_tokens) == (120, 32)
    sched.check_invariants()


def test_v1_second_identical_prefix_in_one_step_hits():
    """The same two requests under v1: block 0 is the null block, A takes 1, 2, 3 and caches 1 and 2 at
    allocation; B's `get_computed_blocks` finds them (32 tokens), so B computes 8 tokens into block 4."""
    sched, a, b, plan = two_together("v1")
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(0, 40), (1, 8)]
    assert sched.alloc.seqs[b.seq_ids[0]].block_table == [1, 2, 4]
    assert b.num_prefix_hit_tokens == 32
    sched.check_invariants()


@pytest.mark.parametrize(("v0_prefix_caching", "blocks", "computed_before", "computed_after"), [
    # v0: `allocate_immutable_blocks` shares all 3 full blocks; none computed until `mark_blocks_as_computed`,
    # then 48 cached tokens less the one `_get_num_new_uncached_and_cached_tokens` keeps uncached: 47
    (True, (1, 2, 3), 0, 47),
    # v1: `find_longest_cache_hit` stops before the last token's block (max_cache_hit_length = 48 − 1): 2 blocks,
    # computed as soon as allocated
    (False, (1, 2), 32, 32),
])
def test_paged_lookup_splits_cached_from_computed_blocks(v0_prefix_caching, blocks, computed_before, computed_after):
    """Allocator level: a 48-token prompt fills blocks 1, 2, 3 (block 0 is null); the same 48 tokens are looked
    up before and after the step's batch is built."""
    alloc = PagedAllocator(6, 16, v0_prefix_caching=v0_prefix_caching)
    content = SegmentContent([("p", 48)])
    assert alloc.allocate(1, 48, 50, content) is not None
    hit = alloc.lookup_prefix(content, 48)
    assert (hit.num_tokens, hit.block_ids) == (16 * len(blocks), blocks)
    assert hit.num_computed_tokens == computed_before
    alloc.mark_blocks_as_computed()
    assert alloc.lookup_prefix(content, 48).num_computed_tokens == computed_after
    alloc.check_invariants()


def test_v0_full_hit_shares_every_block_and_recomputes_the_last_token():
    """A (32 tokens: 2 full blocks) is computed in step 1 (blocks 0, 1). B, the same 32 tokens, arrives after:
    v0 shares both full blocks (ref count 2) and, every token cached, computes only the last one
    (`_get_num_new_uncached_and_cached_tokens`: uncached 0 -> 1; ModelRunner._compute_for_prefix_cache_hit),
    so B schedules 1 token and 31 count as hit (v0 admits prefills alone: A does not decode in that step). v1
    recomputes the last block instead: A, running, decodes first into block 3 (blocks 1, 2 are its prompt), then
    B hits block 1 and computes 16 tokens into block 4."""
    for scheduler, scheduled, table, hit_tokens in (("v0", 1, [0, 1], 31), ("v1", 16, [1, 4], 16)):
        sched = built(scheduler)
        a, b = (Request(rid, rid / 2, 32, 8, content=SegmentContent([("sys", 32), (("reply", rid), 8)]))
                for rid in (0, 1))
        assert sched.add(a)
        sched.complete(sched.schedule(0.0), 1.0)
        assert sched.add(b)
        plan = sched.schedule(1.0)
        assert (b, scheduled) in plan.scheduled
        assert sched.alloc.seqs[b.seq_ids[0]].block_table == table
        assert b.num_prefix_hit_tokens == hit_tokens
        sched.check_invariants()


def test_v0_hit_is_computed_up_to_the_first_block_filled_this_step():
    """A (33 tokens: a 32-token prefix S, then 1 of its own) runs first: blocks 0, 1 (S) and 2, computed once
    that step is built. Next step B and C arrive, each 56 tokens: S, a shared 16-token part P, then 8 tokens of
    their own. B hits S (32 computed tokens) and takes 3 (P) and 4; C's lookup covers S and P (blocks 0, 1, 3:
    `find_cached_blocks_prefix` would stop at 3, cached in this step but not computed), so C skips 32 tokens,
    computes 24 and shares block 3 with B, taking 5 for its own 8 tokens."""
    sched = built("v0")
    a = make_request(0, 0.0, 33, 10, prefix=32)
    assert sched.add(a)
    sched.complete(sched.schedule(0.0), 1.0)
    b, c = (Request(rid, 0.5, 56, 8, content=SegmentContent([("sys", 32), ("P", 16), (("own", rid), 8)]))
            for rid in (1, 2))
    assert sched.add(b) and sched.add(c)
    plan = sched.schedule(1.0)
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(1, 24), (2, 24)]
    assert sched.alloc.seqs[b.seq_ids[0]].block_table == [0, 1, 3, 4]
    assert sched.alloc.seqs[c.seq_ids[0]].block_table == [0, 1, 3, 5]
    assert (b.num_prefix_hit_tokens, c.num_prefix_hit_tokens) == (32, 32)
    sched.check_invariants()


def steps(sched, num_steps: int) -> list[list[tuple[int, int]]]:
    """Plan and complete `num_steps` steps one second apart: each plan's (request id, tokens)."""
    seen = []
    for k in range(num_steps):
        plan = sched.schedule(float(k))
        seen.append([(r.request_id, n) for r, n in plan.scheduled])
        sched.complete(plan, k + 1.0)
        sched.check_invariants()
    return seen


def test_v0_waiting_request_keeps_the_cached_count_of_its_first_look():
    """max_num_seqs=1; A and B (40 tokens, the first 32 shared: 2 full blocks; 1 output token each) arrive
    together. Step 1 admits A (40 tokens, blocks 0, 1, 2); `_schedule_prefills` then counts B's tokens
    (`_get_num_new_uncached_and_cached_tokens`, before the seats check that stops it): blocks 0 and 1 are cached
    but not computed, so `ComputedBlocksTracker.get_num_cached_tokens` records 0 for B and, B still in
    prefill, returns that record ever after. A finishes in step 1 (its partial block 2 to the front of the
    hashless free deque). Step 2 admits B: it shares 0 and 1 (their content is A's) and takes 2, but both the budget and `get_common_computed_block_ids` read the record, 0: B
    computes all 40 tokens, none counted a hit. C (the same 32-token prefix, arriving after) is first looked up
    in step 3, blocks 0, 1 computed by then: it skips 32 and computes 8."""
    sched = built("v0", max_num_seqs=1)
    a, b = make_request(0, 0.0, 40, 1, prefix=32), make_request(1, 0.0, 40, 1, prefix=32)
    assert sched.add(a) and sched.add(b)
    assert steps(sched, 1) == [[(0, 40)]]
    plan = sched.schedule(1.0)
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(1, 40)]
    assert sched.alloc.seqs[b.seq_ids[0]].block_table == [0, 1, 2]
    sched.complete(plan, 2.0)
    assert (a.num_prefix_hit_tokens, b.num_prefix_hit_tokens) == (0, 0)
    assert sched.first_look_computed_tokens == {}
    c = make_request(2, 1.5, 40, 1, prefix=32)
    assert sched.add(c)
    plan = sched.schedule(2.0)
    assert [(r.request_id, n) for r, n in plan.scheduled] == [(2, 8)]
    assert c.num_prefix_hit_tokens == 32


def test_v0_recompute_preemption_counts_the_cached_tokens_anew():
    """A recompute preemption frees the sequence and `SelfAttnBlockSpaceManager.free` drops its tracker record
    (`ComputedBlocksTracker.remove_seq`), so back in waiting it is counted anew. 3 blocks of 16, no watermark
    (int(0.01 * 3) = 0). A ("a", 16 tokens, 3 outputs) and B ("b", 16 tokens, 2 outputs) are admitted together
    in step 1 (0 and 1; each records 0 cached tokens, nothing computed yet). Step 2: A's 17th token takes 2
    (`can_append_slots` counts 1 block a sequence); B's finds none free and, nothing left behind it in
    `running_queue`, B preempts itself by recompute: its full, computed block 1 goes to the evictor and B waits
    with 17 tokens. Step 3: B's first look since its free finds block 1 computed (16 cached tokens, recorded);
    it needs 2 blocks, 1 is free (the evictor's): LATER. A decodes its last token. Step 4: A's blocks are free;
    B is admitted, shares 1 and computes 17 - 16 = 1 token (with the step-1 record it would compute 17)."""
    sched = built("v0", num_blocks=3, max_model_len=48)
    a = Request(0, 0.0, 16, 3, content=SegmentContent([("a", 16)]))
    b = Request(1, 0.0, 16, 2, content=SegmentContent([("b", 16)]))
    assert sched.add(a) and sched.add(b)
    assert steps(sched, 4) == [[(0, 16), (1, 16)], [(0, 1)], [(0, 1)], [(1, 1)]]
    assert b.num_preemptions == 1
