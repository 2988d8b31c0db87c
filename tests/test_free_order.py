"""The order a v1 scheduler frees a request's blocks in, by exact block id: on finish, on preemption by
recompute and with async scheduling's deferred frees.

vLLM v1 frees a request through `KVCacheManager.free` → `SingleTypeKVCacheManager.free`, which passes
`reversed(req_blocks)` to `BlockPool.free_blocks` (vllm/v1/core/single_type_kv_cache_manager.py,
vllm/v1/core/block_pool.py at c59cb79): of the blocks whose ref count reaches 0, those without a hash are
prepended to the free queue in that order (`prepend_n`: the request's last block becomes the head) and those
with one appended (`append_n`: its first block is evicted last). The scheduler frees a finished request in
`update_from_output` (`_free_request`), iterating the step's requests in scheduled order, and a preempted one
in `_preempt_request`, both with `kv_cache_manager.free`. Every expectation below follows from those rules by
hand. The world: 11 blocks of 16 tokens (block 0 is the null block), prefix caching on, a budget that admits
every prompt at once; a request's blocks are full (hashed) up to its last, partial one.
"""

from tests.conftest import make_request, tiny_world


def world():
    return tiny_world(max_num_batched_tokens=256, max_model_len=256)


def table(sched, req):
    return sched.alloc.seqs[req.seq_ids[0]].block_table


def add(sched, rid, now, prompt):
    req = make_request(rid, now, prompt, 2)
    sched.add(req)
    return req


def step(sched, now):
    plan = sched.schedule(now)
    sched.complete(plan, now + 1.0)
    sched.alloc.check_invariants()
    return plan


def test_finished_requests_are_freed_in_scheduled_order_each_tail_first():
    """Two prompts of 40 (blocks [1, 2, 3] and [4, 5, 6]; 1, 2, 4, 5 full) sample 2 tokens: step 1 prefills,
    step 2 decodes into the partial blocks and both finish. Request 0 is freed first: 3 to the head, then 2, 1
    to the tail; request 1 next: 6 to the head (before 3), then 5, 4 to the tail. A third prompt of 40 then
    takes the head's three: [6, 3, 7]."""
    sched = world()
    first, second = add(sched, 0, 0.0, 40), add(sched, 1, 0.0, 40)
    step(sched, 0.0)
    assert [table(sched, first), table(sched, second)] == [[1, 2, 3], [4, 5, 6]]
    done = sched.complete(sched.schedule(1.0), 2.0)
    assert [r.request_id for r in done] == [0, 1] and not sched.alloc.seqs
    assert sched.alloc.pool.free_queue == [6, 3, 7, 8, 9, 10, 2, 1, 5, 4]
    third = add(sched, 2, 2.0, 40)
    step(sched, 2.0)
    assert table(sched, third) == [6, 3, 7]


def test_a_preempted_request_is_freed_tail_first_so_its_prefix_survives_for_its_readmission():
    """Two prompts of 80 fill the 10 blocks ([1..5] and [6..10], all full and hashed). Step 2: request 0
    needs a sixth block for its first decode; request 1, the last admitted, is preempted (recompute) and
    freed tail-first: 10, 9, 8, 7, 6 appended, so request 0 takes 10 and 6..9 keep their hashes. Request 0
    then finishes (output 2): 10 (one token, no hash) to the head, 5..1 to the tail. Step 3 readmits request
    1 (80 + 1 tokens): its prefix hits 6, 7, 8, 9 (its fifth block, 10, was evicted: the chain stops
    there), and its 2 new blocks are the head's 10 and then 5. Freed head-first, the preemption would have
    given request 0 block 6 and left request 1 no hit at all."""
    sched = world()
    first, second = add(sched, 0, 0.0, 80), add(sched, 1, 0.0, 80)
    step(sched, 0.0)
    assert [table(sched, first), table(sched, second)] == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    plan = step(sched, 1.0)
    assert plan.preempted == [second] and not sched.alloc.seqs and first.finish_s == 2.0
    assert sched.alloc.pool.free_queue == [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    plan = sched.schedule(2.0)
    assert plan.scheduled == [(second, 81 - 64)]
    assert table(sched, second) == [6, 7, 8, 9, 10, 5]
    sched.complete(plan, 3.0)
    # it finishes: 5 (one token) to the head, then 10 (full now, hashed), 9, 8, 7, 6 to the tail
    assert sched.alloc.pool.free_queue == [5, 4, 3, 2, 1, 10, 9, 8, 7, 6]


def test_async_scheduling_frees_the_finished_requests_after_the_next_plan_in_the_same_order():
    """The first test with vLLM's async scheduling: the requests that finish in step 2 still hold their
    blocks when step 3 is planned, so the third prompt takes the free [7, 8, 9]; they are freed right after
    that plan, request 0 first, each tail-first: [6, 3] at the head, 10 then 2, 1, 5, 4 behind."""
    sched = world()
    sched.async_scheduling = True
    first, second = add(sched, 0, 0.0, 40), add(sched, 1, 0.0, 40)
    step(sched, 0.0)
    step(sched, 1.0)
    assert first.finish_s == second.finish_s == 2.0
    assert [table(sched, first), table(sched, second)] == [[1, 2, 3], [4, 5, 6]]  # held until the next plan
    third = add(sched, 2, 2.0, 40)
    step(sched, 2.0)
    assert table(sched, third) == [7, 8, 9] and len(sched.alloc.seqs) == 1
    assert sched.alloc.pool.free_queue == [6, 3, 10, 2, 1, 5, 4]
