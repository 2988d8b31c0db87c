import pytest

from kvsim.kv import SlabAllocator, region_slots, waste
from kvsim.model.errors import KvsimError


@pytest.mark.parametrize(
    ("policy", "need", "expected"),
    [("max", 100, 2048), ("pow2", 100, 128), ("pow2", 128, 128), ("pow2", 1500, 2048), ("oracle", 100, 100)],
)
def test_region_sizes(policy, need, expected):
    assert region_slots(policy, need, 2048) == expected


def test_first_fit_places_and_coalesces():
    s = SlabAllocator(1000, max_model_len=1000, policy="oracle")
    assert s.allocate(1, 10, final_num_tokens=300)
    assert s.allocate(2, 10, final_num_tokens=300)
    assert s.allocate(3, 10, final_num_tokens=300)
    assert [s.seqs[i].start for i in (1, 2, 3)] == [0, 300, 600]
    s.free(2)
    assert not s.allocate(4, 1, final_num_tokens=301)  # 400 free, but in runs of 300 and 100
    assert s.allocate(4, 1, final_num_tokens=250) and s.seqs[4].start == 300  # first fit
    s.free(1)
    s.free(4)
    assert s.free_runs.lengths == {0: 600, 900: 100}  # coalesced
    s.check_invariants()


def test_external_fragmentation_is_what_the_next_request_cannot_use():
    s = SlabAllocator(1000, max_model_len=1000, policy="oracle")
    for seq in range(4):
        s.allocate(seq, 1, final_num_tokens=250)
    s.free(0)
    s.free(2)
    w = waste(s, next_request_slots=300)
    assert w.external_frag == 500 and w.free == 0
    assert waste(s, next_request_slots=200).external_frag == 0
    assert waste(s).external_frag == 0


def test_oracle_reaches_full_token_state_at_end_of_life():
    s = SlabAllocator(1000, max_model_len=1000, policy="oracle")
    s.allocate(1, 60, final_num_tokens=100)
    w = waste(s)
    assert (w.token_state, w.reserved, w.internal_frag) == (60, 40, 0)
    s.allocate(1, 100)
    w = waste(s)
    assert (w.token_state, w.reserved, w.internal_frag) == (100, 0, 0)


def test_max_policy_wastes_internally():
    s = SlabAllocator(4096, max_model_len=2048, policy="max")
    s.allocate(1, 100, final_num_tokens=300)
    w = waste(s)
    assert (w.token_state, w.reserved, w.internal_frag, w.free) == (100, 200, 1748, 2048)


def test_writing_past_the_region_is_a_clear_error():
    s = SlabAllocator(1000, max_model_len=1000, policy="oracle")
    s.allocate(1, 10, final_num_tokens=50)
    with pytest.raises(KvsimError, match="request 1: 51 tokens exceed its oracle slab of 50"):
        s.allocate(1, 51)


def test_swap_round_trip():
    s = SlabAllocator(1000, max_model_len=1000, policy="oracle", num_cpu_slots=100, bytes_per_token=10)
    s.allocate(1, 80, final_num_tokens=500)
    assert s.swap_out([1]).num_bytes == 800
    assert s.num_free_slots == 1000
    s.allocate(2, 1, final_num_tokens=600)
    assert s.swap_in([1]) is None
    s.free(2)
    assert s.swap_in([1]).num_blocks == 80 and s.seqs[1].num_tokens == 80
    s.check_invariants()


def test_reserve_and_fork_copy_into_own_region():
    s = SlabAllocator(1000, max_model_len=1000, policy="oracle")
    s.allocate(1, 30, final_num_tokens=40)
    assert s.reserve(2, 40)
    s.fork(1, 2)
    assert s.seqs[2].num_tokens == 30 and s.num_held_slots == 80
    s.check_invariants()


@pytest.mark.parametrize("allocator", ["slab-max", "slab-pow2", "slab-oracle"])
@pytest.mark.parametrize("scheduler", ["v1", "v0"])
def test_the_one_token_fast_path_is_the_general_path(monkeypatch, allocator, scheduler):
    """`append_token` (a decode's token written into its region, the hot path) against `allocate` alone:
    the same run with the fast path turned off gives byte-identical requests, steps and summary, on a
    workload that queues for its regions (40,000 slots, max_model_len 2,048, 40 req/s; the prompts past
    max_model_len are rejected as before)."""
    from kvsim.engine.simulate import simulate
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario(None, [f"engine.allocator={allocator}", f"engine.scheduler={scheduler}",
                                    "engine.num_gpu_blocks_override=2500", "engine.max_model_len=2048",
                                    "workload.num_requests=300", "workload.arrival.rate=40"])
    fast = simulate(scenario)
    monkeypatch.setattr(SlabAllocator, "append_token", lambda self, seq_id: False)
    plain = simulate(scenario)
    assert fast.summary == plain.summary and fast.summary["num_finished"] > 250
    assert fast.requests.equals(plain.requests) and fast.steps.equals(plain.steps)
    assert fast.summary["max_running"] > 1
