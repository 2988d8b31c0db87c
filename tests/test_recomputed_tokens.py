"""Tokens recomputed after a preemption (`Scheduler.num_recomputed_tokens`, the plan's `recomputed_tokens`).

vLLM's `_preempt_request` sets a recompute-preempted request's `num_computed_tokens` to 0; re-admitted, it
computes `num_tokens − hit` tokens, where the hit is what the prefix cache still holds (capped at
`num_tokens − 1`). Of those, the ones whose KV it had computed before the preemption are recomputed; the newest
sampled token is not (its KV was never computed: a decode would have computed it anyway). The plan took
prefill tokens less each prompt's uncached part instead, which counted that newest token on a re-admission of
more than one token, and counted −1 for a chunk of one token that ends a prompt (stepped as a decode, but
counted in the prompt's uncached part): a request whose prefix hit all of its prompt but the last token.
"""

import numpy as np
import pytest

from kvsim.engine.loop import run_engine
from kvsim.latency.base import ConstantLatency
from tests.conftest import make_request, run, tiny_world
from tests.test_bounds import world


def test_a_decode_preempted_with_32_tokens_computed_recomputes_32_not_33():
    """A pool of 4 usable blocks of 16. Two requests of 16 + 40 tokens prefill together, each in one block, and
    decode into a second; after 16 decodes each holds 32 tokens computed (33 with its newest sampled), and the
    next decode needs a third block each: B, the later, is preempted. A then fits alone (55 slots ≤ 64) and
    finishes; B, re-admitted without prefix caching, computes all 33 tokens in one chunk: 32 of them again."""
    scheduler = tiny_world(num_blocks=5, caching=False)
    run(scheduler, [make_request(0, 0.0, 16, 40), make_request(1, 0.0, 16, 40)])
    assert scheduler.num_preemptions == 1
    assert scheduler.counters().num_recomputed_tokens == 32


def test_the_plans_recomputed_tokens_are_the_engines_in_a_fleet():
    """The same requests through `kvsim plan`'s point metrics (one replica, τ = 10 ms steps, synchronous), B
    arriving 1 ms after A: A prefills in step 0, then A decodes position 16 + j and B position 16 + j − 1 in step
    1 + j (B prefilled in step 1). In step 17 A's position 32 needs a third block: B, preempted before it is
    scheduled, has 16 + 15 = 31 tokens computed, all computed again on its re-admission after A finishes (with
    its newest token: a chunk of 32). The plan counted 16 + 16 + 32 prefill tokens − 32 uncached = 32."""
    from kvsim.planning.plan import point_metrics
    from kvsim.workload.scenario import make_scenario

    raw = world(blocks=5, prompt=16, output=40, max_model_len=64).model_dump(mode="json")
    raw["engine"].update(block_size=16, enable_prefix_caching=False, async_scheduling=False)
    raw["workload"].update(num_requests=2, arrival={"process": "constant", "rate": 1000.0})
    raw.update(replicas=1, steps="none")
    metrics = point_metrics(make_scenario(raw))
    assert metrics["num_preemptions"] == 1
    assert metrics["work"]["recomputed_tokens"] == 31


def test_a_one_token_chunk_ending_a_prompt_is_no_recompute():
    """B's 33-token prompt shares its first 32 with A's, cached when B arrives: B computes 1 token, its last
    prompt token, after a hit of 32. Nothing is preempted, nothing recomputed (the plan's count was 33 + 1
    uncached against 33 prefill tokens: −1, which hid one recomputed token elsewhere)."""
    scheduler = tiny_world(num_blocks=20)
    run(scheduler, [make_request(0, 0.0, 33, 2, prefix=32), make_request(1, 1.0, 33, 2, prefix=32)])
    assert list(scheduler.records.columns()["prefix_hit_tokens"]) == [0, 32]
    assert scheduler.counters().num_recomputed_tokens == 0


@pytest.mark.parametrize("seed", range(6))
def test_the_count_is_a_naive_set_of_positions_computed_twice(seed):
    """A second implementation: every chunk a step computes is the positions [past, past + new) of its request;
    a position computed before counts as recomputed. Random lengths, shared prefixes and chunked prefill on a
    pool small enough to preempt often (preemptions mid-prefill, repeated, and re-admissions on prefix hits)."""
    rng = np.random.default_rng(seed)
    scheduler = tiny_world(num_blocks=9, max_num_batched_tokens=24, caching=bool(seed % 2))
    requests = [make_request(i, float(t), int(rng.integers(20, 60)), int(rng.integers(5, 50)),
                             prefix=int(rng.choice([0, 16, 17]))) for i, t in
                enumerate(np.sort(rng.uniform(0, 0.2, 12)))]
    seen: dict[int, set[int]] = {}
    naive = [0]
    account = scheduler.account

    def spy(plan):
        for req, num_new in plan.scheduled:
            chunk = set(range(req.num_computed_tokens, req.num_computed_tokens + num_new))
            naive[0] += len(chunk & seen.setdefault(req.request_id, set()))
            seen[req.request_id] |= chunk
        account(plan)

    scheduler.account = spy
    run_engine(scheduler, ConstantLatency(0.01), requests, check=True, bursts=False)
    assert scheduler.num_preemptions > 0
    assert scheduler.counters().num_recomputed_tokens == naive[0]
