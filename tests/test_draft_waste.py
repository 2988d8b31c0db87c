"""The step rows' `draft_rejected` share: KV slots holding drafts a verify step rejected, carved out of
`reserved` / `internal_frag` so the shares still sum to the pool. Slot counts are worked out by hand."""

import numpy as np
import pytest

import kvsim
from kvsim.workload.scenario import make_scenario

SHARES = ["token_state", "reserved", "internal_frag", "slack", "external_frag", "free", "draft_rejected"]
POOL_SLOTS = 199 * 16  # 200 blocks of 16 tokens, block 0 the null block


def one_request(**extra):
    return make_scenario({
        "name": "drafts", "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 200,
                                     "speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                            "synthetic_acceptance_length": 2}},
        "workload": {"num_requests": 1, "arrival": {"process": "poisson", "rate": 1.0},
                     "prompt_len": {"dist": "fixed", "value": 16}, "output_len": {"dist": "fixed", "value": 10}},
        "latency": {"model": "constant", "step_s": 0.01}, **extra})


def test_rejected_drafts_are_their_own_share_of_each_step():
    """Prompt 16, reply 10 (final length 25 slots), n-gram K = 3 (no lookahead), exactly 1 draft accepted a
    step (synthetic length 2). Step 1 prefills 16 slots. Each verify then computes 4 tokens from c computed
    ones and keeps 2: c = 16 → 18 → 20 → 22 → 24 → done, leaving rejected drafts in slots [c, c + 2). When
    the next verify is planned, slot c is its input token (written), so slot c + 1 alone holds a rejected
    draft: 1 slot in steps 3-6. Held: 1 block, then 2 (32 slots). Step 5 (c = 22, 23 written): reserved
    min(32, 25) − 23 = 2, of which 1 is the draft; step 6 (c = 24, 25 written): the draft's slot 25 is past
    the final length, so it comes out of internal fragmentation, 32 − 25 = 7 → 6."""
    result = kvsim.simulate(one_request(), check=True)
    slots = (result.steps[SHARES] * POOL_SLOTS).round(9)
    assert list(slots.draft_rejected) == [0, 0, 1, 1, 1, 1]
    assert list(slots.token_state) == [16, 17, 19, 21, 23, 25]
    assert list(slots.reserved) == [0, 8, 5, 3, 1, 0]
    assert list(slots.internal_frag) == [0, 7, 7, 7, 7, 6]
    assert np.allclose(result.steps[SHARES].sum(axis=1), 1.0)
    held_s = 0.01 * 6  # every step holds KV: the summary's shares are step averages
    assert result.summary["waste"]["draft_rejected"] == pytest.approx(4 * 0.01 / POOL_SLOTS / held_s)


def test_a_fleet_with_speculation_writes_the_share_for_every_replica():
    result = kvsim.simulate(one_request(replicas=2, workload={
        "num_requests": 6, "arrival": {"process": "poisson", "rate": 5.0},
        "prompt_len": {"dist": "fixed", "value": 16}, "output_len": {"dist": "fixed", "value": 10}}))
    steps = result.steps
    assert "draft_rejected" in steps and set(steps.replica) == {0, 1}
    assert np.allclose(steps[SHARES].sum(axis=1), 1.0)
    assert steps.draft_rejected.max() > 0


def test_no_speculation_no_column():
    plain = one_request()
    raw = plain.model_dump(mode="json")
    raw["engine"].pop("speculative_config")
    result = kvsim.simulate(make_scenario(raw))
    assert "draft_rejected" not in result.steps and "draft_rejected" not in result.summary["waste"]


def test_a_decode_after_a_passed_over_verify_overwrites_its_rejected_drafts():
    """fuzz38: the `reserved` share went negative. Async scheduling, EAGLE K = 2, every draft rejected; prompt
    4, reply 4 (kv_len 7), max_model_len 8, one usable block of 16. Step 1 prefills slots 0-3; step 2 verifies
    token 5 and 2 drafts (slots 4-6) and keeps token 5 alone: rejected drafts sit in slots 5 and 6. Step 3 is
    planned while that verify is in flight, still counting its drafts (vLLM's cap: 8 − 1 − 6 tokens − 2 in
    flight < 0), so the request is passed over, its new drafts dropped; the empty plan is made again at once
    and decodes token 6 alone into slot 5, over one draft: 6 token states, slot 6 a rejected draft (below
    kv_len: out of `reserved`, which is then 0). Step 4 verifies token 7 with no draft (8 − 1 − 7 = 0) into
    slot 6: no draft left. kvsim counted slot 5 both a token and a draft in step 3 (reserved −1), and in
    step 4 still counted 2 drafts after the 6 computed tokens (slot 7, past kv_len, out of internal_frag)."""
    scenario = make_scenario({
        "name": "passed-over", "engine": {"max_model_len": 8, "num_gpu_blocks_override": 2, "async_scheduling": True,
                                          "speculative_config": {"method": "eagle", "num_speculative_tokens": 2,
                                                                 "acceptance_rates": 0.0}},
        "workload": {"num_requests": 1, "arrival": {"process": "constant", "rate": 1.0},
                     "prompt_len": {"dist": "fixed", "value": 4}, "output_len": {"dist": "fixed", "value": 4}}})
    result = kvsim.simulate(scenario, check=True)
    slots = (result.steps[SHARES] * 16).round(9)
    assert list(result.steps.num_batched_tokens) == [4, 3, 1, 1]
    assert list(slots.token_state) == [4, 5, 6, 7]
    assert list(slots.reserved) == [3, 2, 0, 0]
    assert list(slots.draft_rejected) == [0, 0, 1, 0]
    assert list(slots.internal_frag) == [9, 9, 9, 9]
