"""Exact env.now timelines on tiny worlds with a constant 10 ms step."""

import pytest

from kvsim.model.errors import KvsimError
from kvsim.workload.request import RequestStatus
from tests.conftest import make_request, run, tiny_world


def times(req):
    return (round(req.first_scheduled_s, 9), round(req.first_token_s, 9), round(req.finish_s, 9))


@pytest.mark.parametrize("bursts", [True, False])
def test_two_requests_v1(bursts):
    s = tiny_world()
    a = make_request(0, 0.0, prompt=10, output=3)
    b = make_request(1, 0.015, prompt=5, output=2)
    rec = run(s, [a, b], bursts=bursts)
    # t=0 A prefill → 0.01 first token; A decodes at 0.01 and 0.02 (finishing at 0.03);
    # B arrives mid-step at 0.015, joins at 0.02 (prefill) → first token 0.03, decodes → 0.04.
    assert times(a) == (0.0, 0.01, 0.03)
    assert times(b) == (0.02, 0.03, 0.04)
    assert list(rec.frame()["time_s"]) == pytest.approx([0.0, 0.01, 0.02, 0.03])
    assert list(rec.frame()["num_batched_tokens"]) == [10, 1, 6, 1]


def test_chunked_prefill_v1():
    s = tiny_world(max_num_batched_tokens=8)
    a = make_request(0, 0.0, prompt=20, output=2)
    run(s, [a])
    assert times(a) == (0.0, 0.03, 0.04)  # chunks of 8, 8, 4, then one decode


def test_v0_runs_prefill_only_batches():
    s = tiny_world(policy="v0", max_num_batched_tokens=128)
    a = make_request(0, 0.0, prompt=10, output=3)
    b = make_request(1, 0.015, prompt=5, output=2)
    rec = run(s, [a, b])
    # At 0.02 B's prefill runs alone (prefill-first), A waits one step.
    assert times(a) == (0.0, 0.01, 0.04)
    assert times(b) == (0.02, 0.03, 0.04)
    assert list(rec.frame()["num_batched_tokens"]) == [10, 1, 5, 2]


def test_static_batch_admits_nobody_until_empty():
    s = tiny_world(policy="static")
    a = make_request(0, 0.0, prompt=10, output=4)
    b = make_request(1, 0.005, prompt=5, output=2)
    run(s, [a, b])
    assert times(a) == (0.0, 0.01, 0.04)
    assert times(b) == (0.04, 0.05, 0.06)


def test_idle_engine_waits_for_the_next_arrival():
    s = tiny_world()
    a = make_request(0, 0.0, prompt=4, output=1)
    b = make_request(1, 5.0, prompt=4, output=1)
    rec = run(s, [a, b])
    assert times(b) == (5.0, 5.01, 5.01)
    assert list(rec.frame()["time_s"]) == pytest.approx([0.0, 5.0])  # no polling steps in between


def test_recompute_preemption_keeps_generated_tokens():
    # 4 usable blocks of 4 tokens. A and B each hold 2 blocks after prefill; growing, B is preempted.
    s = tiny_world(num_blocks=5, block_size=4, max_model_len=64)
    a = make_request(0, 0.0, prompt=6, output=6)
    b = make_request(1, 0.0, prompt=6, output=6)
    seen = []
    original = s.preempt

    def spy(req, plan):
        seen.append((req.request_id, req.num_output_tokens))
        original(req, plan)
        assert req.num_tokens == req.prompt_len + req.num_output_tokens and req.num_computed_tokens == 0

    s.preempt = spy
    run(s, [a, b])
    assert seen and seen[0][0] == 1 and seen[0][1] > 0
    assert a.status is b.status is RequestStatus.FINISHED
    assert b.num_preemptions >= 1
    assert s.alloc.num_held_slots == 0


def test_swap_preemption_charges_link_time():
    s = tiny_world(policy="v0", num_blocks=5, block_size=4, max_model_len=64, preemption_mode="swap",
                   num_cpu_blocks=8, max_num_batched_tokens=64)
    a = make_request(0, 0.0, prompt=6, output=6)
    b = make_request(1, 0.0, prompt=6, output=6)
    rec = run(s, [a, b], link=1e5)  # 1000 B per block / 1e5 B/s = 10 ms per block moved
    assert s.num_swapped_out_bytes > 0
    assert max(list(rec.frame()["duration_s"])) > 0.01
    assert sum(list(rec.frame()["swap_in_bytes"])) == sum(list(rec.frame()["swap_out_bytes"])) > 0
    assert a.status is b.status is RequestStatus.FINISHED


def test_swap_space_too_small_aborts_the_run_as_vllm_v0_does():
    """Blocks of 4 slots, 5 on the GPU (v0 keeps no null block): A and B take 2 each for their 6-token
    prompts and need a third at token 9, so at the step that takes A past 8 tokens B (admitted last) is
    preempted by swap with 2 blocks or more; one CPU block cannot hold them, and vLLM v0's
    `_swap_out` raises ("Aborted due to the lack of CPU swap space") instead of recomputing."""
    s = tiny_world(policy="v0", num_blocks=5, block_size=4, max_model_len=64, preemption_mode="swap",
                   num_cpu_blocks=1, max_num_batched_tokens=64)
    a = make_request(0, 0.0, prompt=6, output=6)
    b = make_request(1, 0.0, prompt=6, output=6)
    with pytest.raises(KvsimError, match=r"^engine.swap_space=0: the CPU swap space cannot hold request 1 when "
                                         r"it is preempted by swap \(1 preemptions so far\).*lack of CPU swap space"):
        run(s, [a, b])


def test_parallel_sampling_forks_and_copies_on_write():
    s = tiny_world(policy="v0", max_num_batched_tokens=128)
    a = make_request(0, 0.0, prompt=20, output=3, n=3)
    rec = run(s, [a])
    # prompt 20 = one full block shared + a partial block each sample copies before writing
    assert s.alloc.num_copy_on_writes == 2
    assert list(rec.frame()["num_batched_tokens"]) == [20, 3, 3]


@pytest.mark.parametrize("policy", ["v0", "v1"])
def test_rejections_are_recorded(policy):
    """8 samples of 40 + 20 tokens: v1 runs 8 requests of 4 blocks each, in turns (served). v0 refuses a request
    for its prompt alone (vLLM v0's `can_allocate`), here beside an 8-block watermark: its 3 blocks exceed the 2
    of the 10 usable blocks it leaves, while the 1 of a 4-token prompt fits."""
    s = tiny_world(policy=policy, max_model_len=64, watermark_slots=128 if policy == "v0" else 0)
    too_long = make_request(0, 0.0, prompt=70, output=1)
    too_big = make_request(1, 0.0, prompt=40, output=20, n=8)
    ok = make_request(2, 0.0, prompt=4, output=1)
    run(s, [too_long, too_big, ok])
    assert too_long.status is RequestStatus.REJECTED and "max_model_len" in too_long.reject_reason
    if policy == "v0":
        assert too_big.status is RequestStatus.REJECTED and "KV slots" in too_big.reject_reason
    else:
        assert too_big.status is RequestStatus.FINISHED
    assert ok.status is RequestStatus.FINISHED


@pytest.mark.parametrize("policy", ["v1", "v0", "static"])
@pytest.mark.parametrize("allocator", ["paged", "slab-max", "slab-pow2", "slab-oracle"])
def test_every_allocator_under_every_policy(policy, allocator):
    s = tiny_world(policy=policy, allocator=allocator, num_blocks=33, max_model_len=128, max_num_batched_tokens=256,
                   num_cpu_blocks=16)
    reqs = [make_request(i, 0.003 * i, prompt=5 + (7 * i) % 40, output=1 + (5 * i) % 30, n=1 + (i % 3 == 0),
                         prefix=4 if i % 2 else 0) for i in range(24)]
    run(s, reqs)
    assert all(r.status in (RequestStatus.FINISHED, RequestStatus.REJECTED) for r in reqs)
    assert len(s.records) == len(reqs)
    assert s.alloc.num_held_slots == 0
    for r in reqs:
        if r.status is RequestStatus.FINISHED:
            assert r.num_output_tokens == r.output_len


def test_beam_search_shares_more_than_the_prompt():
    from kvsim.kv import sharing_saved_slots

    def peak_saving(beam):
        s = tiny_world(policy="v0", num_blocks=200, max_num_batched_tokens=256, max_model_len=256)
        req = make_request(0, 0.0, prompt=40, output=200, n=4)  # long enough for beams to fork
        req.beam = beam
        saved = []
        original = s.complete

        def spy(plan, now):
            done = original(plan, now)
            saved.append(sharing_saved_slots(s.alloc))
            return done

        s.complete = spy
        run(s, [req])
        assert req.status is RequestStatus.FINISHED and s.alloc.num_held_slots == 0
        return max(saved), s.alloc.num_copy_on_writes

    sampling_saved, sampling_copies = peak_saving(False)
    beam_saved, beam_copies = peak_saving(True)
    assert sampling_saved == 3 * 48  # right after the fork: all 3 prompt blocks shared by 3 children
    assert beam_saved > sampling_saved and beam_copies > sampling_copies
