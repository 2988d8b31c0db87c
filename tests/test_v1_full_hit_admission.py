"""vLLM v1 admitting requests whose whole prompt is cached, under `max_num_seqs`, by exact block id.

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
