"""vLLM v1 admitting requests from the cache, by exact block id: whole prompts cached under `max_num_seqs`, and a
preempted request resuming from its own blocks.

Stepped by hand through vLLM's code (vllm/v1/core/sched/scheduler.py `schedule`; vllm/v1/core/kv_cache_manager.py
`get_computed_blocks`, `allocate_slots`, `free`; vllm/v1/core/block_pool.py):

* admission stops at the top of its loop once `len(self.running) == self.max_num_running_reqs`, whatever the
  next request's cache hit (a full hit still needs a slot and at least one token of budget);
* `get_computed_blocks` looks up at most `max_cache_hit_length = request.num_tokens - 1` tokens, in whole blocks:
  a prompt of 32 whose two blocks are cached hits 16 and recomputes its second block into a new one;
* `allocate_slots` caches (hashes) the full blocks up to `min(computed + new, request.num_tokens)` when it
  allocates them, before the step runs, so a request admitted later in the same step hits them;
* `free` hands blocks to the pool last block first: ref count 0 and no hash (a partial block) to the free
  queue's head, with a hash to its tail; a block another request still references stays out of it.

The world: 11 blocks of 16 tokens (block 0 is vLLM's null block, so the free queue starts 1..10), prefix caching
on, a budget of 64 tokens, `max_num_seqs` 2. Three requests arrive at once, each a 32-token prompt that is the
same system prompt (the same two blocks' hashes), and 2 output tokens.
"""

from kvsim.workload.content import SegmentContent
from kvsim.workload.request import Request
from tests.conftest import tiny_world


def test_a_full_hit_waits_for_max_num_seqs_and_recomputes_its_last_block():
    sched = tiny_world(num_blocks=11, block_size=16, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=128)
    a, b, c = (Request(i, 0.0, 32, 2, content=SegmentContent([("system", 32), (("reply", i), 2)])) for i in range(3))
    for req in (a, b, c):
        sched.add(req)

    def tables():
        return {r.request_id: sched.alloc.seqs[r.seq_ids[0]].block_table for r in sched.running}

    def step(now):
        plan = sched.schedule(now)
        scheduled = [(r.request_id, n) for r, n in plan.scheduled]
        held = tables()
        sched.complete(plan, now + 1.0)
        sched.alloc.check_invariants()
        return scheduled, held

    # Step 1: A misses, takes blocks 1, 2 (hashed at allocation); B, admitted next in the same step, hits block 1
    # (at most 31 tokens: one whole block) and computes 16 tokens into block 3. Budget 64 - 32 - 16 = 16 is left,
    # but two requests run: C, a full hit, is not admitted.
    assert step(0.0) == ([(0, 32), (1, 16)], {0: [1, 2], 1: [1, 3]})
    assert sched.alloc.pool.free_queue == [4, 5, 6, 7, 8, 9, 10]
    assert (sched.prefix_stats.num_query_tokens, sched.prefix_stats.num_hit_tokens) == (64, 16)
    # Step 2: each decodes token 33 into a new block from the head (A 4, B 5) and finishes; C still waits (two
    # running when it is planned). Freed in scheduled order, each last block first: A's 4 to the head, 2 to the
    # tail, 1 still held by B; B's 5 to the head (before 4), then 3 and 1 to the tail.
    assert step(1.0) == ([(0, 1), (1, 1)], {0: [1, 2, 4], 1: [1, 3, 5]})
    assert sched.alloc.pool.free_queue == [5, 4, 6, 7, 8, 9, 10, 2, 3, 1]
    # Step 3: C hits block 1 (taken off the queue) and recomputes its second block into the head's 5.
    assert step(2.0) == ([(2, 16)], {2: [1, 5]})
    assert sched.alloc.pool.free_queue == [4, 6, 7, 8, 9, 10, 2, 3]
    assert (sched.prefix_stats.num_query_tokens, sched.prefix_stats.num_hit_tokens) == (96, 32)
    # Step 4: C decodes into block 4 and finishes: 4 to the head, 5 (full, hashed) and 1 to the tail.
    assert step(3.0) == ([(2, 1)], {2: [1, 5, 4]})
    assert sched.alloc.pool.free_queue == [4, 6, 7, 8, 9, 10, 2, 3, 5, 1] and not sched.has_work


def test_a_preempted_request_resumes_from_its_cached_blocks_generated_tokens_included_up_to_the_first_evicted():
    """A request preempted by recompute keeps its tokens (prompt and outputs); on resume `get_computed_blocks`
    looks up every full block of them, its generated tokens' included, and the chain stops at the first block
    the pool evicted (popped for reuse: `_maybe_evict_cached_block`). The queries count all its tokens and the
    hits apart, as preempted (`PrefixCacheStats.record(..., preempted=True)`).

    7 blocks of 16 (free queue 1..6), two requests of prompt 20 and output 30 with nothing in common. Step 1
    prefills both (A: 1, 2; B: 3, 4) and each samples a token; step j > 1 computes position 18 + j of each.
    Step 14 writes position 32, a third block each (A 5, B 6). Step 30: A writes position 48, needs a fourth
    block, the queue is empty: `running.pop()` preempts B (computed 48, 29 outputs), whose blocks go to the tail
    last first, all full and hashed: 6, 4, 3; A takes the head's 6 (its hash dropped), samples its 30th token and
    finishes: 6 (one token, no hash) to the head, 5, 2, 1 to the tail. Nothing is admitted in a step that
    preempted. Step 31 resumes B: 20 + 29 = 49 tokens, at most 48 looked up: blocks 3 and 4 (4 holds prompt
    tokens 16..19 and the first 12 outputs) hit, its third block's hash (block 6) is gone: 32 tokens hit, 17
    computed into two blocks from the head, 6 and 5."""
    from tests.conftest import make_request

    sched = tiny_world(num_blocks=7, block_size=16, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=128)
    a, b = make_request(0, 0.0, 20, 30), make_request(1, 0.0, 20, 30)
    sched.add(a)
    sched.add(b)

    def table(req):
        return sched.alloc.seqs[req.seq_ids[0]].block_table

    plans = {}
    for j in range(1, 32):
        plan = sched.schedule(float(j))
        plans[j] = [(r.request_id, n) for r, n in plan.scheduled], [r.request_id for r in plan.preempted]
        if j in (1, 14, 31):
            assert [table(r) for r, _ in plan.scheduled] == {1: [[1, 2], [3, 4]], 14: [[1, 2, 5], [3, 4, 6]],
                                                             31: [[3, 4, 6, 5]]}[j]
        sched.complete(plan, j + 1.0)
        sched.alloc.check_invariants()
        if j == 30:
            assert sched.alloc.pool.free_queue == [6, 4, 3, 5, 2, 1] and a.finish_s == 31.0
    assert plans[1] == ([(0, 20), (1, 20)], []) and plans[29] == ([(0, 1), (1, 1)], [])
    assert plans[30] == ([(0, 1)], [1]) and plans[31] == ([(1, 17)], [])
    stats = sched.prefix_stats
    assert (stats.num_preempted_query_tokens, stats.num_preempted_hit_tokens) == (49, 32)
    assert (stats.num_query_tokens, stats.num_hit_tokens) == (40, 0)
