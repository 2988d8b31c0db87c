"""Blocks vLLM caches late: a block completed by a token still in flight (async scheduling), accepted drafts.

vLLM caches a request's full blocks in `KVCacheManager.allocate_slots` only up to `request.num_tokens`
(`num_tokens_to_cache = min(total_computed_tokens + num_new_tokens, request.num_tokens)`), and under async
scheduling the token the step in flight samples is an output placeholder, not in `num_tokens`, until its output
is processed after the next plan; `AsyncScheduler._update_request_with_output` then caches up to
`num_computed_tokens - num_output_placeholders`, for a request still RUNNING only. So a decode whose input is the
token in flight leaves the block that token completes unhashed for one more plan, and a request preempted in that
plan frees it unhashed: `BlockPool.free_blocks` puts it at the free queue's head, and the request's re-admission
misses it (vllm/v1/core/kv_cache_manager.py, vllm/v1/core/sched/async_scheduler.py, vllm/v1/core/block_pool.py).
With speculative decoding a verify's drafts are not in `num_tokens` either: the ones it accepts join it when its
output is processed (`Scheduler.update_from_output`, which caches nothing), so their blocks are cached at the
request's next allocation, and a preemption before that frees them unhashed.

The first world, worked by hand from those rules (block size 4, blocks 1-3 usable, block 0 the null block; B = request 0,
prompt 4, output 4; A = request 1, prompt 3, output 4; both at t = 0, B first):

plan 0  B 4 tokens -> [1] (its prompt block hashed), A 3 -> [2]; free [3]
plan 1  B decodes into a new block [1, 3]; A decodes its token 3 = a0, still in flight: A's block 2 (p0 p1 p2 a0)
        is full but `min(4, num_tokens 3)` caches nothing; after the plan, step 0's output: A caches up to
        computed 4 - placeholders 1 = 3 tokens, nothing
plan 2  B decodes; A's decode needs a second block, none free: `running.pop()` preempts A, which frees block 2
        unhashed (free queue [2]); no admission in a plan that preempted
plan 3  B decodes; A (5 tokens now: a0, a1 came out) needs 2 blocks, 1 free: it waits
plan 4  B's last token is in flight: passed over (computed 7 + 2 - 1 placeholder >= 4 + 4); A still waits: an
        empty plan; B's output then frees its blocks tail-first: block 3 (3 tokens, no hash) to the head, block 1
        (hashed) to the tail: free [3, 2, 1]
plan 5  A: its first block's hash (p0 p1 p2 a0) was never cached: no hit, all 5 tokens computed in blocks [3, 2]
        (the free queue's head), free [1]. Caching the in-flight token's block at once (as a synchronous step would)
        gave A a 4-token hit on block 2 and 1 token to compute, in [2, 3].
"""

from __future__ import annotations

from kvsim.kv import GroupedPagedAllocator, PagedAllocator, TokenContent
from kvsim.model.kv_layout import KVGroup, KVLayout
from kvsim.sched import SchedulerLimits, make_request_queue, make_scheduler
from kvsim.sched.speculative import AcceptanceModel, Speculation
from tests.conftest import make_request, plan_steps, tiny_world


def test_a_preempted_request_frees_the_block_its_in_flight_token_completed_unhashed():
    sched = tiny_world(num_blocks=4, block_size=4, caching=True)
    sched.async_scheduling = True
    assert plan_steps(sched, {0: [make_request(0, 0.0, 4, 4), make_request(1, 0.0, 3, 4)]}, 6) == [
        ([(0, 4), (1, 3)], [], {0: [1], 1: [2]}, [3]),
        ([(0, 1), (1, 1)], [], {0: [1, 3], 1: [2]}, []),
        ([(0, 1)], [1], {0: [1, 3]}, [2]),
        ([(0, 1)], [], {0: [1, 3]}, [2]),
        ([], [], {}, [3, 2, 1]),
        ([(1, 5)], [], {1: [3, 2]}, [1]),
    ]


def test_a_priority_victim_scheduled_in_the_plan_frees_the_block_it_decoded_the_token_in_flight_into_unhashed():
    """Priority, block size 1, blocks 1-10 usable, a budget of 4. V (request 0, priority 1, prompt 6) comes alone
    and prefills in two chunks, [1-4] then [5, 6], sampling its first token in plan 1; P (request 1, priority 0,
    prompt 4) comes before plan 1 and is admitted after V's chunk: its 4 blocks fit the 4 free, its first chunk of 2
    (the budget left) takes [7, 8]. Plan 2: V decodes the token still in flight into block 9 (not cached:
    `min(7, num_tokens 6)`); P's last chunk of 2 finds one block free, and the victim is V (priority 1), scheduled
    in this plan (its token given back). V's blocks go tail-first: 9, uncached, to the head, 6..1 to the tail, and P
    takes the head's two: [9, 10]. With block 9 cached, V's free left [10, 9, 6, ...] and P [7, 8, 10, 9]."""
    sched = make_scheduler("v1", PagedAllocator(11, 1, enable_caching=True), SchedulerLimits(8, 4, 64),
                           waiting=make_request_queue("priority"))
    sched.async_scheduling = True
    victim, later = make_request(0, 0.0, 6, 4), make_request(1, 0.5, 4, 4)
    victim.priority = 1
    assert plan_steps(sched, {0: [victim], 1: [later]}, 3) == [
        ([(0, 4)], [], {0: [1, 2, 3, 4]}, [5, 6, 7, 8, 9, 10]),
        ([(0, 2), (1, 2)], [], {0: [1, 2, 3, 4, 5, 6], 1: [7, 8]}, [9, 10]),
        ([(1, 2)], [0], {1: [7, 8, 9, 10]}, [6, 5, 4, 3, 2, 1]),
    ]


def test_forget_newest_hashes_uncaches_the_block_the_newest_token_filled():
    """The allocators' half, by hand from `BlockPool.free_blocks` (uncached blocks prepended in the given order, cached
    ones appended; a table freed tail-first, a hybrid model's group by group). Paged, block size 4, blocks 1-5: 8
    tokens fill [1, 2]; 2 uncached, the free leaves 2 at the head and 1 at the tail, and the same content finds 4
    tokens, not 8. Hybrid (a sliding-window group, then a full one): [[1, 2], [3, 4]]; 2 and 4 uncached: the sliding
    group's free puts 2 at the head and 1 at the tail, then the full group's 4 at the head and 3 at the tail."""
    content = TokenContent(range(12))
    paged = PagedAllocator(6, 4, enable_caching=True)
    assert paged.allocate(1, 7, 12, content)
    paged.forget_newest_hashes(1, 1)  # 7 tokens: the newest fills no block
    assert paged.lookup_prefix(content, 9).num_tokens == 4
    assert paged.allocate(1, 8, 12, content)
    assert paged.lookup_prefix(content, 9).num_tokens == 8
    paged.forget_newest_hashes(1, 1)
    assert paged.lookup_prefix(content, 9).num_tokens == 4  # the same question, asked again, answered anew
    paged.check_invariants()
    paged.free(1)
    assert paged.pool.free_queue == [2, 3, 4, 5, 1]
    layout = KVLayout((KVGroup("sliding_window", 1, 8), KVGroup("full", 1)), group_size=1, page_bytes=4, block_size=4)
    hybrid = GroupedPagedAllocator(20, layout, max_num_batched_tokens=64)
    assert hybrid.allocate(1, 8, 12, content)
    assert hybrid.seqs[1].tables == [[1, 2], [3, 4]]
    hybrid.forget_newest_hashes(1, 1)
    hybrid.check_invariants()
    hybrid.free(1)
    assert hybrid.pool.free_queue == [4, 2, *range(5, 20), 1, 3]


def test_steps_of_another_engine_are_not_the_step_before():
    """A request admitted here (a disaggregated decode instance's, handed over by a prefill instance) carries the
    step numbers another scheduler counted; its first step here decodes nothing in flight. Block size 4, blocks
    1-3: B (prompt 4) takes [1], then grows into [2]; V (prompt 4), marked as sampled by step 1 elsewhere, is
    admitted by this scheduler's step 2 into [3] and samples its first token; in step 3 its decode needs a block, none
    is free, and V preempts itself. Its prompt block was cached when written (its tokens known), so it stays found."""
    sched = tiny_world(num_blocks=4, block_size=4, caching=True)
    sched.async_scheduling = True
    victim = make_request(1, 0.0, 4, 4)
    victim.sampled_step = 1
    assert plan_steps(sched, {0: [make_request(0, 0.0, 4, 8)], 1: [victim]}, 3)[1:] == [
        ([(0, 1), (1, 4)], [], {0: [1, 2], 1: [3]}, []),
        ([(0, 1)], [1], {0: [1, 2]}, [3]),
    ]
    assert sched.alloc.lookup_prefix(victim.content, 5).num_tokens == 4


def test_a_request_preempted_after_a_verify_frees_the_accepted_drafts_block_unhashed():
    """Synchronous, 2 drafts a step (n-gram: no lookahead slots), block size 4, blocks 1-5. B (request 0, prompt 7)
    prefills into [1, 2], A (request 1, prompt 2) into [3]. Step 2 verifies both (3 tokens each): B grows into 4, A
    into 5, and both accept their 2 drafts. vLLM cached A's first block (p0 p1 a0 a1) only up to `num_tokens`, 3
    tokens when it allocated (a1 was a draft), and `update_from_output` caches nothing. Step 3: B's verify needs a
    fourth block, none is free, and A, the last admitted, is preempted before its turn: block 3 is freed uncached, so
    A's prefix finds nothing (caching accepted drafts when they are written, A found 4 tokens in block 3)."""
    sched = tiny_world(num_blocks=6, block_size=4, caching=True)
    sched.speculation = Speculation(AcceptanceModel((1.0, 1.0)), 0)
    b, a = make_request(0, 0.0, 7, 6), make_request(1, 0.0, 2, 6)
    b.acceptance_lengths, a.acceptance_lengths = (3, 1), (3,)
    assert plan_steps(sched, {0: [b, a]}, 3) == [
        ([(0, 7), (1, 2)], [], {0: [1, 2], 1: [3]}, [4, 5]),
        ([(0, 3), (1, 3)], [], {0: [1, 2, 4], 1: [3, 5]}, []),
        ([(0, 3)], [1], {0: [1, 2, 4, 5]}, [3]),
    ]
    assert sched.alloc.lookup_prefix(a.content, a.num_tokens).num_tokens == 0


def test_a_verify_before_a_preemption_leaves_nothing_uncached_after_the_re_admission():
    """As above (2 drafts a step, block size 4, blocks 1-3), V (request 1) marked as having accepted 2 drafts in a
    verify before an earlier preemption: admitted again, it prefills its prompt into [2], cached (its tokens known),
    and its first verify needs a second block while B's takes the last free one: V preempts itself before any
    verify of this admission, and its prompt block stays found."""
    sched = tiny_world(num_blocks=4, block_size=4, caching=True)
    sched.speculation = Speculation(AcceptanceModel((1.0, 1.0)), 0)
    victim = make_request(1, 0.0, 4, 8)
    victim.num_accepted_drafts = 2
    assert plan_steps(sched, {0: [make_request(0, 0.0, 4, 8), victim]}, 2) == [
        ([(0, 4), (1, 4)], [], {0: [1], 1: [2]}, [3]),
        ([(0, 3)], [1], {0: [1, 3]}, [2]),
    ]
    assert sched.alloc.lookup_prefix(victim.content, victim.num_tokens).num_tokens == 4
