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
