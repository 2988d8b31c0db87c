"""The narrow seams between scheduler, allocator and recorder: the allocation result and the occupancy snapshot."""

from __future__ import annotations

from kvsim.kv import ALLOCATED, Allocation, PagedAllocator, SlabAllocator
from kvsim.kv.accounting import Waste
from tests.conftest import make_request, tiny_world


def test_allocate_says_what_it_copied_or_none_when_it_cannot():
    a = PagedAllocator(6, 16, enable_caching=False)  # 5 usable blocks
    assert a.allocate(1, 20) is ALLOCATED  # blocks [1, 2], block 2 holds 4 tokens
    a.fork(1, 2)
    assert a.allocate(1, 21) == Allocation(num_copied_blocks=1)  # the shared partial block is copied first
    assert a.allocate(2, 21) is ALLOCATED  # the original is the child's alone now
    assert a.allocate(3, 100) is None and not a.holds(3)  # 7 blocks: "can't" changes nothing
    s = SlabAllocator(160, 64, "max")  # each region is max_model_len = 64 slots: two fit
    assert s.allocate(1, 20, final_num_tokens=30) is ALLOCATED and s.allocate(2, 20, final_num_tokens=30)
    assert s.allocate(3, 20, final_num_tokens=30) is None and not s.holds(3)


def test_the_plan_counts_the_copies_its_allocations_made():
    """n = 2 after the prefill of 20 tokens: both samples write token 21 into their shared partial block;
    the first writer copies it (one copy), the second then owns the original. (v0 forks samples; v1 runs
    them as requests of their own, which share no partial block.)"""
    s = tiny_world(policy="v0", caching=False, num_blocks=11)
    req = make_request(0, 0.0, prompt=20, output=5, n=2)
    s.add(req)
    s.complete(s.schedule(0.0), 0.01)  # prefill, first token sampled, the child forked
    plan = s.schedule(0.01)
    assert [n for _, n in plan.scheduled] == [1] and plan.num_seqs == 2
    assert plan.num_copied_blocks == 1 == s.alloc.num_copy_on_writes


def test_snapshot_is_the_queues_and_the_pool_by_hand():
    """10 usable blocks of 16; two requests of 20 prompt + 5 output admitted (max_num_seqs 2), one waits."""
    s = tiny_world(num_blocks=11, max_num_seqs=2, caching=False)
    for rid in range(3):
        s.add(make_request(rid, 0.0, prompt=20, output=5))
    s.schedule(0.0)
    snap = s.snapshot()
    assert (snap.num_running, snap.num_waiting, snap.num_swapped, snap.num_preemptions) == (2, 1, 0, 0)
    kv = snap.kv
    # each holds cdiv(20, 16) = 2 blocks (32 slots), writes 20 and will hold at most 20 + 5 − 1 = 24
    assert (kv.total_slots, kv.held_slots, kv.filled_slots, kv.reserved_slots) == (160, 64, 40, 8)
    assert (kv.slack_slots, kv.external_frag_slots, kv.shared_slots, kv.usage) == (0, 0, 0, 0.4)
    assert kv.waste() == Waste(token_state=40, reserved=8, internal_frag=16, slack=0, external_frag=0, free=96)
