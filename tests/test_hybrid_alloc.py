"""Sliding-window and hybrid allocation: exact block ids freed as the window moves, and prefix hits.

The tiny world: block_size 4, a sliding-window group (window 8) and a full-attention group,
one layer each, 20 blocks (block 0 is vLLM's null block). Expected tables are worked out by
hand from vLLM's rules (SlidingWindowManager.remove_skipped_blocks: before growing, blocks
below (computed − window + 1) // block_size are freed; the free queue hands out the most
recently freed uncached block first).
"""

from __future__ import annotations

from kvsim.kv import GroupedPagedAllocator, TokenContent
from kvsim.model.capacity import model_kv_layout
from kvsim.model.config import load_model
from kvsim.model.engine_config import make_engine
from kvsim.model.kv_layout import KVGroup, KVLayout


def tiny(enable_caching: bool = False, num_blocks: int = 20) -> GroupedPagedAllocator:
    layout = KVLayout((KVGroup("sliding_window", 1, 8), KVGroup("full", 1)), group_size=1, page_bytes=4,
                      block_size=4)
    return GroupedPagedAllocator(num_blocks, layout, max_num_batched_tokens=64, enable_caching=enable_caching)


def grow(alloc: GroupedPagedAllocator, seq_id: int, num_tokens: int) -> list[list[int]]:
    assert alloc.allocate(seq_id, num_tokens)
    alloc.check_invariants()
    return [list(t) for t in alloc.seqs[seq_id].tables]


def test_sliding_window_blocks_are_freed_as_the_window_moves() -> None:
    alloc = tiny()
    assert alloc.allocate(1, 10, final_num_tokens=17)  # prefill: 3 blocks in each group
    assert alloc.seqs[1].tables == [[1, 2, 3], [4, 5, 6]]
    assert alloc.num_held_slots == 6 * 4
    # 10 computed: 10 − 8 + 1 = 3 skipped tokens, no whole block yet.
    assert grow(alloc, 1, 11) == [[1, 2, 3], [4, 5, 6]]
    # 11 computed: 4 skipped tokens = block index 0 leaves the window: block 1 is freed.
    assert grow(alloc, 1, 12) == [[0, 2, 3], [4, 5, 6]]
    assert alloc.num_held_slots == 5 * 4
    # 12 computed, a fourth block: block 1 (freed last, at the queue's head) is reused first.
    assert grow(alloc, 1, 13) == [[0, 2, 3, 1], [4, 5, 6, 7]]
    assert grow(alloc, 1, 14) == [[0, 2, 3, 1], [4, 5, 6, 7]]
    assert grow(alloc, 1, 15) == [[0, 2, 3, 1], [4, 5, 6, 7]]
    # 15 computed: 8 skipped tokens: block index 1 (block 2) goes.
    assert grow(alloc, 1, 16) == [[0, 0, 3, 1], [4, 5, 6, 7]]
    assert grow(alloc, 1, 17) == [[0, 0, 3, 1, 2], [4, 5, 6, 7, 8]]
    # The sliding group holds 3 blocks (at most cdiv(8 − 1 + 1, 4) + 1 for one token a step), the full one 5.
    assert alloc.num_held_slots == 8 * 4
    alloc.free(1)
    assert alloc.pool.num_free_blocks == 19
    # By hand, from vLLM: `KVCacheCoordinator.free` frees group by group, each manager's `free` passing
    # `reversed(req_blocks)` (the null block skipped); caching off, `BlockPool.free_blocks` prepends them all,
    # `prepend_n` keeping the list's order at the head. The sliding group's [2, 1, 3] goes first, to the head;
    # then the full group's [8, 7, 6, 5, 4] goes in front of it: 8, 7, 6, 5, 4, 2, 1, 3 are handed out next.
    assert alloc.pool.get_new_blocks(8) == [8, 7, 6, 5, 4, 2, 1, 3]


def test_can_allocate_counts_the_blocks_the_window_frees() -> None:
    alloc = tiny(num_blocks=7)  # 6 usable
    assert alloc.allocate(1, 12)  # 3 + 3 blocks: the pool is full
    assert alloc.pool.num_free_blocks == 0
    assert not alloc.can_allocate(2, 1)
    # Growing to 13 needs 2 new blocks; 12 computed frees sliding blocks below (12 − 7) // 4 = 1: one.
    assert not alloc.can_allocate(1, 13)
    assert alloc.seqs[1].tables == [[1, 2, 3], [4, 5, 6]]  # nothing changed


def test_prefix_hit_with_sliding_window_needs_the_blocks_before_the_hit() -> None:
    alloc = tiny(enable_caching=True)
    prompt = list(range(100, 120))  # 20 tokens
    a = TokenContent(prompt)
    assert alloc.allocate(1, 20, content=a)
    for n in range(21, 25):
        grow(alloc, 1, n)
    alloc.free(1)
    # Same 20-token prompt: at most (20 − 1) // 4 = 4 blocks may hit. The full group hits all 4;
    # the sliding group needs cdiv(8 − 1, 4) = 2 cached blocks ending there (indices 2 and 3),
    # and the blocks before them are null.
    hit = alloc.lookup_prefix(TokenContent(prompt), 20)
    assert hit.num_tokens == 16
    sliding, full = hit.block_ids[:4], hit.block_ids[4:]
    assert sliding[:2] == (0, 0) and 0 not in sliding[2:]
    assert 0 not in full
    assert alloc.allocate(2, 20, content=TokenContent(prompt), hit=hit)
    alloc.check_invariants()
    # A different prompt sharing only the first 8 tokens: 2 full blocks hit, and the sliding
    # group's blocks 0 and 1 (from the start, fewer than needed but reaching block 0) too.
    other = alloc.lookup_prefix(TokenContent(prompt[:8] + [7] * 12), 20)
    assert other.num_tokens == 8


def evict(alloc: GroupedPagedAllocator, block_ids: list[int]) -> None:
    """Drop cached free blocks' content, as `BlockPool.get_new_blocks` does when it reuses them."""
    cache = alloc.prefix_cache
    for block_id in block_ids:
        del cache.cached[cache.block_hashes[block_id]]
        cache.block_hashes[block_id] = None


def test_prefix_hit_needs_only_the_sliding_blocks_inside_the_window() -> None:
    prompt = list(range(50, 66))  # 16 tokens: 4 blocks per group
    cases = {  # evicted sliding blocks -> hit tokens, block ids (sliding table, then full table)
        (1, 2): (16, (0, 0, 3, 4, 5, 6, 7, 8)),  # indices 0, 1 lie outside the last window: not needed
        (3, 4): (8, (1, 2, 5, 6)),  # the longest run of 2 cached blocks ends at index 2
        (2, 3): (4, (1, 5)),  # no run of 2; the run from block 0 (block 1 alone) still counts
    }
    for evicted, (expected_hit, expected_ids) in cases.items():
        alloc = tiny(enable_caching=True)
        assert alloc.allocate(1, 16, content=TokenContent(prompt))
        assert alloc.seqs[1].tables == [[1, 2, 3, 4], [5, 6, 7, 8]]
        alloc.free(1)
        evict(alloc, list(evicted))
        # A 17-token request may hit 4 blocks and the full group has all 4; the sliding group
        # needs cdiv(8 − 1, 4) = 2 consecutive cached blocks ending where the hit ends
        # (SlidingWindowManager.find_longest_cache_hit, scanning right to left).
        hit = alloc.lookup_prefix(TokenContent(prompt + [1]), 17)
        assert (hit.num_tokens, hit.block_ids) == (expected_hit, expected_ids)


def test_hybrid_model_serves_more_than_full_attention_allocation_in_the_same_memory() -> None:
    """gpt-oss-20b under load in a 512 MiB pool: its sliding layers keep at most the window, so
    vLLM's hybrid manager runs more sequences than allocating every layer for the whole context
    (the `disable_hybrid_kv_cache_manager` reading of the same model)."""
    from kvsim.engine.simulate import simulate
    from kvsim.workload.scenario import load_scenario

    common = ["model=gpt-oss-20b", "gpu=h100-80gb", "engine.kv_cache_memory_bytes=512MiB",
              "engine.max_model_len=4096", "workload.num_requests=80", "workload.arrival.rate=50"]
    hybrid = simulate(load_scenario(None, common), check=True).summary
    unified = simulate(load_scenario(None, [*common, "engine.disable_hybrid_kv_cache_manager=true"]),
                       check=True).summary
    # gpt-oss-20b: 2 · 8 KV heads · 64 · 2 B = 2048 B per token per layer; a block id spans 16 tokens
    # of 12 layers (two groups of 12) with the hybrid manager, of all 24 layers without.
    assert hybrid["num_gpu_blocks"] == 2**29 // (16 * 2048 * 12)
    assert unified["num_gpu_blocks"] == 2**29 // (16 * 2048 * 24)
    assert hybrid["num_finished"] == unified["num_finished"]
    assert hybrid["max_running"] > unified["max_running"]
    assert hybrid["num_preemptions"] < unified["num_preemptions"]


def test_beams_are_refused_before_the_run_naming_the_field_and_the_flag_and_samples_run() -> None:
    """The grouped pool does not fork: n > 1 failed only once a first sample forked, mid-run, with a message
    naming no field; then the engine was refused when it was built, before any step, and the flag that
    allocates every layer as full attention runs the same scenario. Beams still fork and are refused so; n > 1
    samples run since v1 serves them as requests of their own, unforked (`kvsim.sched.fanout`, as vLLM v1's
    hybrid KV cache manager serves them): the second sample of each request hits the first one's prompt."""
    import pytest

    import kvsim
    from kvsim.model.errors import KvsimError

    def raw(field: str) -> dict:
        return {"model": "gpt-oss-20b", "engine": {"max_model_len": 512, "num_gpu_blocks_override": 400},
                "workload": {"num_requests": 3, "arrival": {"process": "poisson", "rate": 5}, field: 2,
                             "prompt_len": {"dist": "fixed", "value": 40}, "output_len": {"dist": "fixed", "value": 8}},
                "latency": {"model": "constant"}}

    with pytest.raises(KvsimError) as refused:
        kvsim.simulate(raw("beam_width"))
    message = str(refused.value)
    assert message.startswith("workload.beam_width=2: model=gpt-oss-20b has sliding-window") and "\n" not in message
    assert "engine.disable_hybrid_kv_cache_manager=true" in message
    result = kvsim.simulate(raw("beam_width"), check=True, engine__disable_hybrid_kv_cache_manager=True)
    assert result.summary["num_finished"] == 3 and list(result.requests["num_samples"]) == [2, 2, 2]
    result = kvsim.simulate(raw("n"), check=True)
    assert result.summary["num_finished"] == 3 and list(result.requests["num_samples"]) == [2, 2, 2]
    assert result.summary["num_prefix_cache_hit_tokens"] > 0


def test_mapped_slots_follow_hits_skips_and_frees_by_hand() -> None:
    """`num_mapped_slots` (a count kept as blocks enter and leave the tables) against the tables, by hand:
    Σ over sequences and groups of the non-null entries, times block_size 4."""
    prompt = list(range(50, 66))  # 16 tokens: 4 blocks per group
    alloc = tiny(enable_caching=True)
    assert alloc.allocate(1, 16, content=TokenContent(prompt))
    assert alloc.num_mapped_slots == (4 + 4) * 4
    # A 17-token request hits the 4 cached blocks: the sliding group keeps the 2 its window needs, behind 2 nulls
    # (test_prefix_hit_needs_only_the_sliding_blocks_inside_the_window), and each group takes a fifth block.
    assert alloc.allocate(2, 17, content=TokenContent(prompt + [1]),
                          hit=alloc.lookup_prefix(TokenContent(prompt + [1]), 17))
    assert [t[:2] for t in alloc.seqs[2].tables] == [[0, 0], [5, 6]]
    assert alloc.num_mapped_slots == (8 + (2 + 1) + (4 + 1)) * 4
    # Sequence 1 grows to 17: 16 − 8 + 1 = 9 skipped tokens drop its sliding blocks 0 and 1, and each group takes one.
    assert grow(alloc, 1, 17)[0][:2] == [0, 0]
    assert alloc.num_mapped_slots == ((3 + 5) + (3 + 5)) * 4
    alloc.free(2)  # as a preemption does
    assert alloc.num_mapped_slots == (3 + 5) * 4
    alloc.check_invariants()
    alloc.free(1)
    assert alloc.num_mapped_slots == 0
    alloc.check_invariants()


def test_groups_in_vllm_order_free_group_by_group_hashed_to_the_tail() -> None:
    """vLLM's group order: `_get_kv_cache_groups_uniform_page_size` (vllm/v1/core/kv_cache_utils.py) fills its
    `same_type_layers` defaultdict in layer order, so the kind of layer 0 comes first: gemma-3-27b (layers 0-4
    sliding, 5 full) has its 6 sliding groups, then the full one; gpt-oss-20b (layer 0 sliding) sliding, then
    full. The coordinator holds one manager per group in that order, and `KVCacheCoordinator.free` calls each
    manager's `free` in turn (vllm/v1/core/kv_cache_coordinator.py), which passes its blocks tail-first.

    By hand, caching on, a 10-token prompt in the tiny world: group 0 takes blocks 1, 2, 3 and group 1 takes
    4, 5, 6 (the free queue starts 1..19); blocks 1, 2 and 4, 5 are full and hashed, 3 and 6 are not. Freeing:
    group 0's [3, 2, 1]: 3 to the head, 2, 1 to the tail; then group 1's [6, 5, 4]: 6 to the head (before 3),
    5, 4 to the tail. The queue hands out 6, 3, 7..19, then evicts 2, 1, 5, 4 in that order."""
    engine = make_engine(max_model_len=8192)
    gemma = model_kv_layout(load_model("gemma-3-27b"), engine)
    assert [g.kind for g in gemma.groups] == ["sliding_window"] * 6 + ["full"]
    assert [g.kind for g in model_kv_layout(load_model("gpt-oss-20b"), engine).groups] == ["sliding_window", "full"]
    alloc = tiny(enable_caching=True)
    assert alloc.allocate(1, 10, content=TokenContent(list(range(200, 210))))
    assert alloc.seqs[1].tables == [[1, 2, 3], [4, 5, 6]]
    alloc.free(1)
    alloc.check_invariants()
    assert alloc.pool.get_new_blocks(19) == [6, 3, *range(7, 20), 2, 1, 5, 4]


def test_v1_admits_a_prompt_inside_the_window_whole_and_a_longer_one_by_its_first_chunk() -> None:
    """DESIGN §3's whole-prompt admission holds for a hybrid pool wherever the prompt fits in the shortest
    window (no block of it is freed before it is all computed); beyond, the first chunk, as vLLM v1. The tiny
    world with 8 usable blocks, 6 held by another sequence (12 tokens: 3 blocks in each group), a budget of 4
    tokens: a first chunk needs 1 + 1 blocks (2 free), an 8-token prompt 2 + 2."""
    from kvsim.kv.protocol import NO_HIT
    from kvsim.sched import SchedulerLimits, make_scheduler
    from tests.conftest import make_request

    alloc = tiny(num_blocks=9)
    sched = make_scheduler("v1", alloc, SchedulerLimits(8, 4, 64))
    assert alloc.allocate(99, 12) and alloc.pool.num_free_blocks == 2
    assert alloc.admits_by_chunk_above_tokens == 8
    inside, beyond = make_request(1, 0.0, 8, 4), make_request(2, 0.0, 12, 4)
    assert not sched.can_admit(inside, NO_HIT, 4)  # the whole prompt: 4 blocks
    assert sched.can_admit(beyond, NO_HIT, 4)  # its first chunk: 2 blocks
    alloc.free(99)
    assert sched.can_admit(inside, NO_HIT, 4)


def test_a_request_inside_its_window_needs_only_its_own_blocks() -> None:
    """vLLM's per-request bound for a sliding group (`SlidingWindowSpec.max_memory_usage_bytes`) adds a block for
    a window that starts mid-block; a sequence no longer than its window never slides, so it holds
    cdiv(tokens, block_size) blocks, as full attention does, and no more. fuzz38 found kvsim rejecting such
    requests on arrival ("needs more KV slots than the pool's ...") that fit the pool exactly.

    The tiny world (window 8, blocks of 4, budget 64): 7 tokens hold 2 + 2 blocks (the bound said 3 + 2); 30
    tokens, one chunk, hold all 8 blocks of each group (the bound said 9 + 8)."""
    alloc = tiny()
    assert alloc.region_slots(7) == (2 + 2) * 4
    assert alloc.request_slots(7, 7, 1) == 16
    assert alloc.region_slots(30) == (8 + 8) * 4
    short_budget = GroupedPagedAllocator(20, alloc.layout, max_num_batched_tokens=4)
    # budget 4: the window keeps 7 tokens before a 4-token chunk, cdiv(11, 4) + 1 = 4 blocks (at 10 computed
    # tokens, none skipped yet: blocks 0-3 held), below the sequence's 8
    assert short_budget.region_slots(30) == (4 + 8) * 4


def test_mistral_requests_inside_the_window_fill_the_pool_exactly() -> None:
    """Mistral-7B slides every layer over 4,096 tokens. max_model_len 128, blocks of 32: a 68-token prompt with 38
    or 60 output tokens (106 and 128 tokens, KV of 105 and 127) holds cdiv(·, 32) = 4 blocks, so vLLM serves both;
    kvsim rejected both, asking for 5 blocks. vLLM's startup check asks cdiv(min(4,095 + max_num_batched_tokens,
    128), 32) + 1 = 5 blocks (`SlidingWindowSpec.max_memory_usage_bytes`: a window need not start at a block's
    start) besides the null block (PR #47272): 5 blocks do not start, 6 do (5 usable, 160 slots), where a request
    asks 4 (128 slots)."""
    import numpy as np
    import pytest

    import kvsim
    from kvsim.engine.builder import build_engine
    from kvsim.model.errors import KvsimError
    from kvsim.workload.scenario import make_scenario

    scenario = {"model": "mistral-7b", "engine": {"max_model_len": 128, "block_size": 32,
                                                  "num_gpu_blocks_override": 6},
                "workload": {"num_requests": 2, "arrival": {"process": "constant", "rate": 1},
                             "prompt_len": {"dist": "fixed", "value": 68},
                             "output_len": {"dist": "uniform", "low": 38, "high": 60}}}
    summary = kvsim.simulate(scenario, check=True).summary
    assert summary["num_rejected"] == 0 and summary["num_finished"] == 2
    alloc = build_engine(make_scenario(scenario), np.random.default_rng(0)).scheduler.alloc
    assert alloc.request_slots(68, 127, 1) == 4 * 32
    scenario["engine"]["num_gpu_blocks_override"] = 5
    with pytest.raises(KvsimError, match=r"max_model_len=128: .* \(5 blocks, one of them v1's null block"):
        kvsim.simulate(scenario)
