"""vLLM v0's scheduler and block manager stepped by hand, by exact block id: kvsim's `V0Scheduler` over a
`PagedAllocator` built as the builder builds v0's (no null block, v0 prefix caching).

Each expectation is derived from vLLM v0's code (vllm/core/scheduler.py `_schedule_default`, `_schedule_prefills`,
`_schedule_running`, `_schedule_swapped`, `_preempt`, `_swap_out`; vllm/core/block_manager.py
`SelfAttnBlockSpaceManager.can_allocate`, `can_append_slots`, `_can_swap`, `free`; vllm/core/block/naive_block.py;
vllm/core/block/prefix_caching_block.py; vllm/core/evictor.py `LRUEvictor`), not from kvsim's output:

* block ids: `CpuGpuBlockAllocator.create` numbers the GPU blocks 0 .. num_gpu_blocks − 1 (no null block) and the
  CPU blocks after them; `NaiveBlockAllocator` hands out `popleft()` from a deque that starts in id order and
  frees with `appendleft()`; `BlockTable.free` frees a table front to back, so its last block is reused first.
  kvsim numbers its CPU pool from 0: CPU block c here is vLLM's num_gpu_blocks + c.
* admission (`_schedule_prefills`, only while nothing is swapped): `can_allocate` is NEVER when
  `num_total_gpu_blocks − cdiv(tokens, block_size) < watermark_blocks`, OK when
  `free − cdiv(tokens, block_size) ≥ watermark_blocks`, else LATER, which ends admission for the step;
  `watermark_blocks = int(0.01 · num_gpu_blocks)`.
* a step that admits a prefill schedules no decode (`_schedule_default`); otherwise `_schedule_running` grows the
  running groups in order, each needing a block per sequence whose unseen token starts one (`can_append_slots`),
  and preempts `running_queue.pop()` (the last admitted; the group itself when none is left) until it fits:
  recompute for a group of one sequence, swap otherwise or under preemption_mode=swap. A preempted group goes to
  the front of `waiting` (`extendleft`); no swap-in in a step that preempted.
"""

import pytest

from kvsim.kv import PagedAllocator
from kvsim.model.errors import KvsimError
from kvsim.sched import SchedulerLimits, make_scheduler
from tests.conftest import make_request

BLOCK = 16


def v0_world(num_blocks, watermark_blocks, caching=False, num_cpu_blocks=0, preemption_mode=None):
    """A v0 engine as `kvsim.engine.builder` makes one: no null block, v0 prefix caching; vLLM v0's defaults of
    `max_num_seqs` 256 and `max_num_batched_tokens` = max(max_model_len, 2048) = 2048."""
    alloc = PagedAllocator(num_blocks, BLOCK, enable_caching=caching, null_block=False, num_cpu_blocks=num_cpu_blocks,
                           bytes_per_block=1000, v0_prefix_caching=True)
    limits = SchedulerLimits(256, 2048, 2048, watermark_blocks * BLOCK, preemption_mode,
                             can_swap=preemption_mode != "recompute")
    return make_scheduler("v0", alloc, limits)


def stepper(sched, requests=()):
    """`step(t)`: add the requests arrived by t, plan the step at t, complete it at t + 0.5, check the books;
    returns (scheduled (request, tokens), preempted ids, {request: block table of its first sequence})."""
    pending = sorted(requests, key=lambda r: r.arrival_s)

    def step(t):
        while pending and pending[0].arrival_s <= t:
            sched.add(pending.pop(0))
        plan = sched.schedule(float(t))
        scheduled = [(r.request_id, n) for r, n in plan.scheduled]
        tables = {r.request_id: list(sched.alloc.seqs[r.seq_ids[0]].block_table) for r, _ in plan.scheduled}
        step.plan = plan
        sched.complete(plan, t + 0.5)
        sched.check_invariants()
        return scheduled, [r.request_id for r in plan.preempted], tables
    return step


def test_prefill_only_steps_the_watermark_and_recompute_of_the_last_admitted():
    """100 blocks, so a watermark of int(0.01 · 100) = 1 block. A (40 blocks of prompt), B (30) and C (29) arrive
    with D (one block), each of 3 output tokens but D's 2.

    Step 1: A takes 0..39 (free 60 − 40 ≥ 1), B 40..69, C 70..98; D would leave 1 − 1 = 0 < 1 block free: LATER
    (without the watermark it fits). Step 2: D is LATER again, so the running groups decode; each prompt fills its
    last block, so each needs a block. A takes 99; for B none is left: `running_queue.pop()` is C, preempted by
    recompute (one sequence), its table freed front to back (head 98, 97, ..., 70); B takes 98. C goes to the
    front of waiting. Step 3: C now needs cdiv(464 + 1, 16) = 30 blocks, 28 are free: LATER, and D behind it
    waits too; A and B decode into their partial blocks and finish (freed in running order: A's, then B's at the
    head). Step 4: C recomputes its prompt and its output (465 tokens) into 98, 69 .. 41, D takes 40: a
    prefill-only step. Step 5: both decode, D into the head's 99."""
    sched = v0_world(100, watermark_blocks=1)
    a, b, c = make_request(0, 0.0, 40 * BLOCK, 3), make_request(1, 0.0, 30 * BLOCK, 3), make_request(2, 0.0, 29 * BLOCK, 3)
    d = make_request(3, 0.0, BLOCK, 2)
    step = stepper(sched, [a, b, c, d])
    assert step(1) == ([(0, 640), (1, 480), (2, 464)], [],
                       {0: list(range(40)), 1: list(range(40, 70)), 2: list(range(70, 99))})
    assert sched.alloc.pool.free_queue == [99] and sched.waiting.peek() is d
    assert step(2) == ([(0, 1), (1, 1)], [2], {0: [*range(40), 99], 1: [*range(40, 70), 98]})
    assert sched.alloc.pool.free_queue == list(range(97, 69, -1))
    assert [r.request_id for r in sched.waiting] == [2, 3] and c.num_output_tokens == 1
    assert step(3) == ([(0, 1), (1, 1)], [], {0: [*range(40), 99], 1: [*range(40, 70), 98]})
    assert sched.alloc.pool.free_queue[:3] == [98, *range(69, 67, -1)] and a.finish_s == b.finish_s == 3.5
    assert step(4) == ([(2, 465), (3, 16)], [], {2: [98, *range(69, 40, -1)], 3: [40]})
    assert step(5) == ([(2, 1), (3, 1)], [], {2: [98, *range(69, 40, -1)], 3: [40, 99]})
    assert not sched.has_work and c.num_preemptions == 1


def test_a_decode_needs_a_free_block_even_with_room_in_its_last_block():
    """`can_append_slots` counts each running sequence's next token as touching a block
    (`get_num_blocks_touched_by_append_slots`: 1 + ceil((1 − room in the last block) / block_size) = 1) and asks
    that many free blocks, room in its partial last block or not (BlockSpaceManagerV1 asked one a sequence too).
    10 blocks, watermark 0; A and B, 72-token prompts (4 full blocks and 8 tokens), 4 output tokens each.
    Step 1: A takes 0..4, B 5..9 (free 5 − 5 = 0 ≥ 0): none free. Step 2: A's token fits block 4, but 1 > 0
    free: `running_queue.pop()` is B, recomputed (freed front to back: head 9 .. 5); A decodes alone.
    Step 3: B, its prompt and first output (73 tokens, 5 blocks), takes 9 .. 5 again, a prefill-only step.
    Step 4: none free again: B is preempted again, A decodes."""
    sched = v0_world(10, watermark_blocks=0)
    step = stepper(sched, [make_request(0, 0.0, 72, 4), make_request(1, 0.0, 72, 4)])
    assert step(1) == ([(0, 72), (1, 72)], [], {0: [0, 1, 2, 3, 4], 1: [5, 6, 7, 8, 9]})
    assert step(2) == ([(0, 1)], [1], {0: [0, 1, 2, 3, 4]}) and sched.alloc.pool.free_queue == [9, 8, 7, 6, 5]
    assert step(3) == ([(1, 73)], [], {1: [9, 8, 7, 6, 5]}) and not sched.alloc.pool.free_queue
    assert step(4) == ([(0, 1)], [1], {0: [0, 1, 2, 3, 4]}) and sched.num_preemptions == 2


def test_a_request_that_only_fits_inside_the_watermark_is_never_admitted():
    """`can_allocate` is NEVER for a prompt of 100 blocks in a 100-block pool with a 1-block watermark
    (100 − 100 < 1): vLLM v0 ignores it (FINISHED_IGNORED), kvsim rejects it on arrival. A prompt of 99 blocks
    answering one token is OK alone (100 − 99 ≥ 1) and runs."""
    sched = v0_world(100, watermark_blocks=1)
    too_long, fits = make_request(0, 0.0, 100 * BLOCK, 1), make_request(1, 0.0, 99 * BLOCK, 1)
    assert not sched.add(too_long) and too_long.reject_reason == ("needs more KV slots than the pool's 1600 less the "
                                                                  "watermark's 16")
    assert sched.add(fits)
    assert stepper(sched)(1) == ([(1, 99 * BLOCK)], [], {1: list(range(99))}) and fits.finish_s == 1.5


def swap_world(num_cpu_blocks):
    """20 GPU blocks (watermark int(0.01 · 20) = 0), preemption_mode=swap. A (10 blocks of prompt) and B (9),
    4 output tokens each, and C (2 blocks, 1 token) arrive at once."""
    sched = v0_world(20, watermark_blocks=0, num_cpu_blocks=num_cpu_blocks, preemption_mode="swap")
    reqs = [make_request(0, 0.0, 10 * BLOCK, 4), make_request(1, 0.0, 9 * BLOCK, 4), make_request(2, 0.0, 2 * BLOCK, 1)]
    return sched, reqs


def test_swap_out_and_the_swapped_group_resumes_before_a_waiting_one():
    """10 CPU blocks. Step 1: A 0..9, B 10..18; C needs 2 of the 1 free: LATER. Step 2: C is LATER; A decodes
    into 19; B needs a block, none is left and the queue is empty: B preempts itself, by swap: `_can_swap` to the
    CPU counts its 9 full blocks and 1 for its unseen token, 10 ≤ 10 free; its GPU blocks freed front to back
    (head 18 .. 10), CPU blocks 0 .. 8 taken in order. Steps 3 and 4: something is swapped, so no prefill runs
    (C would fit in the 9 free blocks); A decodes; B's swap-in needs 9 + 1 > 9 free: it waits. A finishes after
    step 4 ([0..9, 19] freed: head 19, 9, .., 0). Step 5: still no prefill (B was swapped when the step began);
    B swaps in to 19, 9 .. 2 (CPU blocks freed front to back: head 8 .. 0) and its next token takes 1. Step 6:
    nothing swapped: C is admitted into 0, 18, a prefill-only step, B not decoded."""
    sched, reqs = swap_world(10)
    step = stepper(sched, reqs)
    assert step(1) == ([(0, 160), (1, 144)], [], {0: list(range(10)), 1: list(range(10, 19))})
    assert step(2) == ([(0, 1)], [1], {0: [*range(10), 19]})
    assert step.plan.swap_out_bytes == 9 * 1000 and sched.alloc.swapped[reqs[1].seq_ids[0]].block_table == list(range(9))
    assert sched.alloc.pool.free_queue == list(range(18, 9, -1)) and sched.alloc.cpu_pool.free_queue == [9]
    assert step(3) == step(4) == ([(0, 1)], [], {0: [*range(10), 19]})
    assert step(5) == ([(1, 1)], [], {1: [19, *range(9, 0, -1)]}) and step.plan.swap_in_bytes == 9 * 1000
    assert sched.alloc.cpu_pool.free_queue == [*range(8, -1, -1), 9]
    assert step(6) == ([(2, 32)], [], {2: [0, 18]})
    assert step(7) == step(8) == ([(1, 1)], [], {1: [19, *range(9, 0, -1)]})
    assert not sched.has_work and sched.num_swapped_out_bytes == 9000


def test_swap_out_needs_a_cpu_block_for_the_next_token_too():
    """9 CPU blocks: B's 9 blocks would fit, but `can_swap_out` asks for its 9 full blocks and 1 for its unseen
    token (`_can_swap`: 10 > 9 CPU blocks in all, NEVER), and `_swap_out` raises "Aborted due to the lack of CPU
    swap space": the run ends with kvsim's error naming swap_space."""
    sched, reqs = swap_world(9)
    step = stepper(sched, reqs)
    step(1)
    with pytest.raises(KvsimError, match="swap_space"):
        step(2)


def test_evictor_order_least_recently_used_then_deepest_first_and_a_hit_refreshes():
    """8 blocks, prefix caching on; each request alone in its step, one output token (it ends at its prefill).
    v0's `LRUEvictor` evicts the smallest (last_accessed, −num_hashed_tokens): a freed sequence's blocks carry the
    time it was last scheduled (`LastAccessBlocksTracker`, stamped in `free`), so blocks of requests freed at
    different times go least recently used first, and a sequence's own blocks deepest first (kvsim: freed tail
    first to the LRU tail). A hit takes a block out of the evictor (`_incr_refcount_cached_block`); it comes
    back with its new holder's time.

    A (a 32-token system prompt + 16) takes 0, 1, 2 from the hashless deque; B (32) 3, 4; C (64) the last
    hashless 5, 6, 7, then evicts (t1, −48) = 2. D (the system prompt + 16) hits 0 and 1 and evicts
    (t2, −32) = 4 for its third block. E (80) evicts (t2, −16) = 3, then C's (t3) 2, 7, 6, 5 deepest first,
    not the system prompt's blocks, which D's hit restamped t4. F (the system prompt + 16) hits 0, 1 again and
    evicts D's third block, 4."""
    sched = v0_world(8, watermark_blocks=0, caching=True)
    reqs = [make_request(0, 1.0, 48, 1, prefix=32), make_request(1, 2.0, 32, 1), make_request(2, 3.0, 64, 1),
            make_request(3, 4.0, 48, 1, prefix=32), make_request(4, 5.0, 80, 1), make_request(5, 6.0, 48, 1, prefix=32)]
    step = stepper(sched, reqs)
    assert [step(t)[2] for t in range(1, 7)] == [{0: [0, 1, 2]}, {1: [3, 4]}, {2: [5, 6, 7, 2]}, {3: [0, 1, 4]},
                                                 {4: [3, 2, 7, 6, 5]}, {5: [0, 1, 4]}]
    assert [reqs[i].num_prefix_hit_tokens for i in (3, 5)] == [32, 32]


def test_admission_asks_free_blocks_for_every_prompt_block_cached_or_not():
    """`can_allocate` counts `cdiv(len(prompt), block_size)` blocks against the free ones, whatever the cache
    holds. 4 blocks, caching on; A and B share a 32-token system prompt and have 16 tokens of their own.
    Step 1: A takes 0, 1, 2 (hashed as they fill); B needs 3 blocks, 1 is free: LATER, although two of its
    blocks are cached. Its tokens were counted first (`_get_num_new_uncached_and_cached_tokens`), while 0 and 1
    were not computed yet: `ComputedBlocksTracker` records 0 cached tokens and keeps that while B waits. Step 2:
    B is LATER again; A decodes into 3 and finishes: its full blocks go to the evictor (stamp t2, 2 first), 3
    (one token, no hash) to the hashless deque. Step 3: B needs 3 of 4 free: OK; it shares 0 and 1 and takes
    the hashless 3, but its record says 0 cached, so it computes all 48 tokens. Freed at stamp t3, deepest
    first: the evictor is 2 (t2), then 3, 1, 0."""
    sched = v0_world(4, watermark_blocks=0, caching=True)
    step = stepper(sched, [make_request(0, 0.0, 48, 2, prefix=32), make_request(1, 0.0, 48, 1, prefix=32)])
    assert step(1) == ([(0, 48)], [], {0: [0, 1, 2]})
    assert step(2) == ([(0, 1)], [], {0: [0, 1, 2, 3]})
    assert step(3) == ([(1, 48)], [], {1: [0, 1, 3]})
    assert sched.alloc.pool.free_queue == [2, 3, 1, 0]


@pytest.mark.parametrize(("prompt", "tables", "free_after"), [
    # 20 tokens: the forked sequences share the partial block 1; the parent appends first
    # (`get_seqs` order) and copies it to 2 (`cow_block_if_not_appendable`: ref count 2), the child keeps it
    (20, {0: [0, 2], 1: [0, 1]}, [1, 0, 2]),
    # 32 tokens end a block: no copy, each sequence's next token takes a new block, the parent's first
    (32, {0: [0, 1, 2], 1: [0, 1, 3]}, [3, 1, 0, 2]),
])
def test_parallel_sampling_forks_then_copies_the_shared_last_block_on_write(prompt, tables, free_after):
    """n = 2 in v0 as the paper and vLLM up to 0.6.3 run it (one prefill; the output processor forks the child,
    `SelfAttnBlockSpaceManager.fork` shares the whole table). 10 blocks. Step 1 prefills into 0, 1; step 2 writes
    each sequence's token; both finish at step 3 and are freed parent first, each table front to back."""
    sched = v0_world(10, watermark_blocks=0)
    req = make_request(0, 0.0, prompt, 3, n=2)
    step = stepper(sched, [req])
    assert step(1) == ([(0, prompt)], [], {0: [0, 1]})
    step(2)
    seqs = sched.alloc.seqs
    assert {i: seqs[s].block_table for i, s in enumerate(req.seq_ids + req.child_seq_ids())} == tables
    assert step.plan.num_copied_blocks == sched.alloc.num_copy_on_writes == int(prompt % BLOCK > 0)
    step(3)
    assert sched.alloc.pool.free_queue[:len(free_after)] == free_after and not sched.has_work


def run_until_done(sched, req, max_steps=100):
    """Step at t = 1, 2, ... until `req` (added) has ended; the steps whose plan let it go (vLLM v0's ignored
    groups)."""
    step, let_go = stepper(sched), []
    for t in range(1, max_steps):
        step(t)
        let_go += [(t, r.request_id) for r in step.plan.ignored]
        if req.status.value == "finished":
            return let_go
    raise AssertionError("the request never ended")


def test_a_prompt_that_fits_runs_and_is_let_go_when_its_output_outgrows_the_pool():
    """vLLM v0 cannot know the output length: `can_allocate` counts the prompt's blocks only. 5 blocks, a 1-block
    watermark; a 40-token prompt (3 blocks: 5 − 3 ≥ 1, OK) asking 40 tokens, 80 in all (5 blocks, which fit the
    pool but not beside the watermark): it runs. Step 1 prefills positions 0..39 (blocks 0..2, free 2) and samples
    token 1; steps 2..26 decode positions 40..64 (a new block at 48 and at 64: `can_append_slots` needs a free
    block for every append, room or not, so 49..63 run with 1 free, 64 takes the last). Step 27: position 65 finds
    no free block, and nothing else runs: it preempts itself by recompute with 26 output tokens, 66 tokens in all.
    Step 28: `_schedule_prefills` asks `can_allocate` for cdiv(66, 16) = 5 blocks: 5 − 5 < 1, NEVER, so vLLM marks
    it FINISHED_IGNORED and returns its 26 tokens, finish reason "length": 14 of the 40 asked are cut."""
    sched = v0_world(5, watermark_blocks=1)
    req = make_request(0, 0.0, 40, 40)
    assert sched.add(req)
    assert run_until_done(sched, req) == [(28, 0)]
    assert (req.num_output_tokens, req.output_len, req.num_length_capped_tokens) == (26, 26, 14)
    assert (req.num_preemptions, req.finish_s, sched.num_held_slots) == (1, 28.0, 0)
    assert sched.records.count(req.status) == 1


def test_without_a_watermark_a_recomputed_request_comes_back_until_its_sequence_outgrows_the_pool():
    """The same request in 4 blocks, no watermark. Prefill (blocks 0..2, free 1), decodes of positions 40..48 (a
    new block at 48, free 0); position 49 preempts it: 50 tokens, cdiv(50, 16) = 4 blocks, 4 − 4 ≥ 0, OK. Each
    readmission prefills its L tokens (4 blocks, none free) and samples one, and the next decode preempts it again,
    for L = 50 .. 64; at 65 tokens cdiv(65, 16) = 5 > 4: NEVER. 25 tokens (65 − 40), 16 preemptions (at 50 .. 65
    tokens); steps: 1 + 9 decodes, then 16 preempting steps (11, 13, .., 41) with the 15 readmissions between
    them, the let-go at 42."""
    sched = v0_world(4, watermark_blocks=0)
    req = make_request(0, 0.0, 40, 40)
    assert sched.add(req)
    assert run_until_done(sched, req) == [(42, 0)]
    assert (req.num_output_tokens, req.num_length_capped_tokens, req.num_preemptions) == (25, 15, 16)


def test_a_swapped_request_whose_next_token_needs_more_than_the_pool_is_let_go():
    """preemption_mode=swap, 4 GPU blocks, no watermark: a 32-token prompt (2 blocks) asking 60. Prefill, then
    decodes of 32..48 (new blocks at 32 and 48, free 0); position 49 swaps it out (4 blocks). `_can_swap` counts
    each sequence's append (1 block) and the full blocks (3): 4 ≤ 4, OK, so it swaps in and decodes 49 in its
    partial block, swaps out at the next step, and so on up to 63. At 64 its 4 full blocks and the append need 5 >
    4: NEVER, an infeasible group, FINISHED_IGNORED: 33 tokens (65 − 32), 16 swaps out (for 49 .. 64)."""
    sched = v0_world(4, watermark_blocks=0, num_cpu_blocks=8, preemption_mode="swap")
    req = make_request(0, 0.0, 32, 60)
    assert sched.add(req)
    run_until_done(sched, req)
    assert (req.num_output_tokens, req.num_length_capped_tokens, req.num_preemptions) == (33, 27, 16)
    assert sched.num_held_slots == 0 and not sched.alloc.swapped


def test_a_waiting_request_to_be_let_go_does_not_block_the_queue():
    """10 blocks, a 3-block watermark. B (1-token prompt, 1 block) and A (96 tokens, 6 blocks: 9 − 6 ≥ 3, OK) are
    admitted in step 1, free 3. Step k decodes B's position k − 1 and A's 94 + k: A takes a block at 96 (step 2)
    and 112 (step 18), B at 16 (step 17), so step 19 finds none for B's position 18 and preempts A, the last
    admitted, with 114 tokens (18 of its own): cdiv(114, 16) = 8 blocks > 10 − 3, NEVER. The queue's head is not
    blocked (a decode burst of B must not run past it): step 20 lets A go, as `_schedule_prefills` ignores it, and
    decodes B; vLLM returns A with that step's outputs (`LLMEngine._process_model_outputs` adds the ignored groups'
    after the scheduled ones', once the model ran), so A ends when step 20 does, at 20.5, not when it is planned."""
    sched = v0_world(10, watermark_blocks=3)
    b, a = make_request(0, 0.0, 1, 100), make_request(1, 0.0, 96, 60)
    assert sched.add(b) and sched.add(a)
    step = stepper(sched)
    for t in range(1, 19):
        assert step(t)[1] == []
    assert step(19) == ([(0, 1)], [1], {0: [0, 8]}) and not sched.waiting_blocked()
    step(20)
    assert step.plan.ignored == [a] and step.plan.scheduled == [(b, 1)]
    assert (a.num_output_tokens, a.num_length_capped_tokens, a.finish_s) == (18, 42, 20.5)
    assert sched.records.count(a.status) == 1


def test_a_swapped_request_that_fits_the_pool_but_never_beside_the_watermark_is_a_stall_said_in_one_line():
    """preemption_mode=swap, 5 blocks, a 1-block watermark; a 40-token prompt (3 blocks: 5 − 3 ≥ 1, admitted) asking
    40. As in the recompute case above it decodes to position 64 (all 5 blocks) and at 65 finds no free block: step
    27 swaps it out, 65 tokens in KV (4 full blocks, 1 token in the fifth). `_can_swap` counts the full blocks (4)
    and its append (1): 5 ≤ 5, not NEVER, so it is not let go; 5 free − 5 = 0 < 1 watermark block: LATER, with
    every block free. Nothing runs and `_schedule_default` admits nobody while it is swapped out: vLLM v0 waits
    forever, which the run says in one line (`HeldKvStall`) instead of "scheduler stalled"."""
    sched = v0_world(5, watermark_blocks=1, num_cpu_blocks=8, preemption_mode="swap")
    req = make_request(0, 0.0, 40, 40)
    assert sched.add(req)
    step = stepper(sched)
    for t in range(1, 27):
        assert step(t)[1] == []
    assert step(27) == ([], [0], {}) and req.num_output_tokens == 26
    assert step(28) == ([], [], {}) and not step.plan.ignored and list(sched.swapped) == [req]
    reason = sched.held_kv_stall()
    assert reason is not None and "counts 5 KV blocks" in reason and "the pool's 5" in reason
    assert "the watermark's 1," in reason


def test_the_swap_stall_ends_a_run_with_the_line():
    from kvsim.engine.simulate import simulate
    from kvsim.model.errors import HeldKvStall
    from kvsim.workload.scenario import make_scenario
    fixed = {"dist": "fixed"}
    scenario = make_scenario({"engine": {"scheduler": "v0", "max_model_len": 80, "num_gpu_blocks_override": 5,
                                         "watermark": 0.2, "preemption_mode": "swap"},
                              "workload": {"num_requests": 1, "prompt_len": {**fixed, "value": 40},
                                           "output_len": {**fixed, "value": 40}},
                              "latency": {"model": "constant"}, "steps": "none"})
    with pytest.raises(HeldKvStall, match="request 0 is swapped out and vLLM v0 counts 5 KV blocks"):
        simulate(scenario)


@pytest.mark.parametrize("bursts", [True, False])
def test_a_request_let_go_beside_a_running_one_ends_when_the_step_does(bursts):
    """The queue world above run by the engine loop, 10 ms a step: step k runs from 0.01 (k − 1) to 0.01 k. Step
    20 (0.19 → 0.20) lets A go and decodes B; A's output comes with that step's (`_process_model_outputs`), at
    0.20: E2E 0.20, TTFT 0.01 (step 1 prefilled it). B, asking 100 tokens, is never preempted again (A was the
    last admitted): it runs alone from step 20 on, one token a step after its first at 0.01, so it ends at
    0.01 · 100 = 1.00, decode bursts or not."""
    from tests.conftest import run
    sched = v0_world(10, watermark_blocks=3)
    b, a = make_request(0, 0.0, 1, 100), make_request(1, 0.0, 96, 60)
    run(sched, [b, a], bursts=bursts)
    assert (a.num_output_tokens, a.num_length_capped_tokens, a.num_preemptions) == (18, 42, 1)
    assert (a.first_token_s, a.finish_s) == pytest.approx((0.01, 0.20))
    assert (b.num_output_tokens, b.num_preemptions, b.finish_s) == pytest.approx((100, 0, 1.00))


def test_a_swapped_group_is_let_go_by_vllms_count_each_sample_its_own_full_blocks():
    """2 samples, a 32-token prompt (blocks 0 and 1, full, shared after the fork), 6 blocks, no watermark. Step 1
    prefills and forks; step k ≥ 2 decodes position 30 + k of both samples, each needing a free block per sample
    (`can_append_slots`): at 32 and at 48 each takes a new block (free 4 → 2 → 0). Step 19 (position 49) finds none
    and swaps the group out with 18 tokens, 49 in KV per sample: blocks [0, 16) and [16, 32) shared, [32, 48) full
    and 48 alone in each one's own. Step 20: `_can_swap` counts each sequence's full blocks, 3 + 3 (vLLM's forked
    `Block` objects are their own, `NaiveBlockAllocator.get_num_full_blocks_touched`), and 1 + 1 for the appends:
    8 > 6 blocks, NEVER: FINISHED_IGNORED with 18 tokens a sample, 42 of the 60 asked cut. (Counting the shared
    blocks once, 2 + 2 + 2 and no new block for 49, it would swap back in: 6 ≤ 6.)"""
    sched = v0_world(6, watermark_blocks=0, num_cpu_blocks=16)
    req = make_request(0, 0.0, 32, 60, n=2)
    assert sched.add(req)
    assert run_until_done(sched, req) == [(20, 0)]
    assert (req.num_output_tokens, req.num_length_capped_tokens, req.num_preemptions) == (18, 42, 1)
    assert sched.num_held_slots == 0 and not sched.alloc.swapped


def test_a_swapped_group_waits_for_free_blocks_by_vllms_count_each_sample_its_own_full_blocks():
    """8 blocks, no watermark; R0 (16-token prompt, 10 tokens), R1 (32, 40) and R2 (32, 40, 2 samples) are admitted
    in step 1 (1 + 2 + 2 blocks, free 3). Step 2: R0 takes a block at position 16 and R1 one at 32 (free 1); R2's
    two samples need a free block each (`can_append_slots`), 1 < 2, and R2, the last admitted, swaps itself out:
    free 3. R0 ends after step 10 (free 5). From step 11 `_can_swap` counts each sample's 2 full prompt blocks
    (a fork's `Block` objects are its own) and 1 for each append: 6 > 5 free, LATER, while R1 runs; R1 ends
    after step 40 (all 8 free) and R2 swaps back in at step 41. (Counting the shared blocks once, 2 + the 2 new
    blocks its next tokens take = 4 ≤ 5, it came back at step 11 and swapped out again at every other step.)"""
    sched = v0_world(8, watermark_blocks=0, num_cpu_blocks=16)
    r0, r1, r2 = make_request(0, 0.0, 16, 10), make_request(1, 0.0, 32, 40), make_request(2, 0.0, 32, 40, n=2)
    step = stepper(sched, [r0, r1, r2])
    swapped_in = []
    for t in range(1, 42):
        preempted = step(t)[1]
        assert preempted == ([2] if t == 2 else [])
        swapped_in += [t] if step.plan.swap_in_bytes else []
    assert (r0.finish_s, r1.finish_s, swapped_in, r2.num_preemptions) == (10.5, 40.5, [41], 1)


def test_a_swapped_group_vllm_counts_as_the_whole_pool_is_a_stall_beside_the_watermark():
    """8 blocks, a 1-block watermark; R0 (16-token prompt, 20 tokens) and R1 (32, 40, 2 samples) are admitted in
    step 1 (8 − 1 ≥ 1, 7 − 2 ≥ 1; free 5). Step 2: R0 takes a block at position 16, R1's samples one each at 32
    (free 2). Step 18: R0 takes one at 32 (free 1); R1 at 48 needs a free block per sample, 1 < 2, and swaps itself
    out with 48 tokens a sample: blocks 0 and 1 shared, 2 its own each, all full (free 5). `_can_swap` counts
    each sample's 3 full blocks and 1 for its append: 8, not over the pool's 8 (not NEVER), and 8 free − 8 < 1
    (LATER) even once R0 ends after step 20: nothing runs, nothing is admitted, vLLM v0 waits forever. (kvsim's
    own swap-in takes its 4 distinct blocks and 2 new ones for the next tokens: 6 + 1 ≤ 8, back at step 21.)"""
    sched = v0_world(8, watermark_blocks=1, num_cpu_blocks=16)
    r0, r1 = make_request(0, 0.0, 16, 20), make_request(1, 0.0, 32, 40, n=2)
    step = stepper(sched, [r0, r1])
    for t in range(1, 22):
        assert step(t)[1] == ([1] if t == 18 else [])
        assert not step.plan.swap_in_bytes
    assert (r0.finish_s, list(sched.swapped), sched.running) == (20.5, [r1], [])
    reason = sched.held_kv_stall()
    assert reason is not None and "request 1 is swapped out and vLLM v0 counts 8 KV blocks" in reason
    assert "the pool's 8 but never beside the watermark's 1," in reason


def test_a_swapped_request_whose_prefix_a_running_one_holds_comes_back_by_vllms_count_without_those_blocks():
    """9 blocks, no watermark, prefix caching, preemption_mode=swap. A (a 48-token system prompt + 1 token, asking
    100), C (16 tokens, asking 19) and B (the system prompt + 16, asking 100) are admitted in that order in step 1
    (`can_allocate` counts every prompt block, hits too: 4, 1, 4 ≤ 9, 5, 4): A 0..3, C 4, B shares 0, 1, 2 (v0
    caches a block at once) and takes 5 (free 3). Step 2: C takes 6 at its position 16, B 7 at 64 (free 1).
    Step 17: A takes 8 at its position 64 (free 0); C then finds no free block for its next token
    (`can_append_slots` counts one a sequence) and B, the last admitted, swaps out with 79 tokens: full blocks 0, 1,
    2 (still held by A) and 5, and 7 with 15 tokens (5 blocks moved; free 2). Step 18: C takes 7 at 32 (free 1).
    C ends after step 19 (free 4). vLLM v0's `_can_swap` counts B's full blocks but those whose hash a GPU block
    in use caches (`PrefixCachingBlockAllocator.get_num_full_blocks_touched`: 0, 1 and 2, A's), and 1 for its next
    token: 1 + 1 = 2 > 1 free in steps 18 and 19 (LATER), ≤ 4 in step 20 (OK): B comes back, sharing 0, 1 and 2
    with A by reference (`allocate_immutable_block` finds their hashes), 2 blocks taken, its next token in its
    partial block (free 2). Counting A's blocks too (4 + 1 = 5 > 4, LATER) kept it out while A ran."""
    sched = v0_world(9, watermark_blocks=0, caching=True, num_cpu_blocks=16, preemption_mode="swap")
    a, c, b = (make_request(0, 0.0, 49, 100, prefix=48), make_request(1, 0.0, 16, 19),
               make_request(2, 0.0, 64, 100, prefix=48))
    step = stepper(sched, [a, c, b])
    assert step(1)[2] == {0: [0, 1, 2, 3], 1: [4], 2: [0, 1, 2, 5]}
    swapped_in = []
    for t in range(2, 21):
        preempted = step(t)[1]
        assert preempted == ([2] if t == 17 else []), t
        if t == 17:
            assert step.plan.swap_out_bytes == 5 * 1000 and sched.alloc.pool.num_free_blocks == 2
        swapped_in += [t] if step.plan.swap_in_bytes else []
    assert swapped_in == [20] and step.plan.swap_in_bytes == 5 * 1000  # every block copied, as vLLM's swap-in does
    assert c.status.value == "finished" and a.status.value == b.status.value == "running"
    b_table, a_table = sched.alloc.seqs[b.seq_ids[0]].block_table, sched.alloc.seqs[a.seq_ids[0]].block_table
    assert b_table[:3] == a_table[:3] == [0, 1, 2] and len(b_table) == 5
    assert sched.alloc.pool.ref_counts[:3] == [2, 2, 2] and sched.alloc.pool.num_free_blocks == 2
