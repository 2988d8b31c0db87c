"""A fleet's speculative-decoding rates are ratios of its replicas' summed counters, as vLLM's Prometheus
counters add over engines: acceptance rate = Σ accepted ÷ Σ draft tokens, mean acceptance length =
1 + Σ accepted ÷ Σ drafts (vllm/v1/spec_decode/metrics.py, `SpecDecodingLogging.log`), not a mean of rates."""

import pytest

import kvsim

FIXED = {"dist": "fixed"}


def test_two_replicas_drafting_differently_add_their_counters():
    # Round robin: requests 0, 2 to replica 0 (n-gram K = 3, exactly 2 accepted a verify), 1, 3 to replica 1
    # (K = 1, its draft always accepted). Output 11: the prefill samples token 1.
    # Replica 0 emits 3 a verify: 1 -> 4 -> 7 -> 10 -> 11 (the last verify's 2 accepted are counted, as vLLM counts
    #   the rejection sampler's before the stop check): 4 verifies, 12 draft tokens, 8 accepted per request.
    # Replica 1 emits 2: 1 -> 3 -> 5 -> 7 -> 9 -> 11: 5 verifies, 5 draft tokens, 5 accepted per request.
    k3 = {"method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": 3.0}
    k1 = {"method": "ngram", "num_speculative_tokens": 1, "synthetic_acceptance_length": 2.0}
    result = kvsim.simulate(None, workload__num_requests=4, workload__prompt_len={**FIXED, "value": 64},
                            workload__output_len={**FIXED, "value": 11},
                            replicas=[{"count": 1, "engine": {"speculative_config": k3}},
                                      {"count": 1, "engine": {"speculative_config": k1}}])
    spec = result.summary["spec_decode"]
    drafts, tokens, accepted = 2 * 4 + 2 * 5, 2 * 12 + 2 * 5, 2 * 8 + 2 * 5
    assert (spec["num_drafts"], spec["num_draft_tokens"], spec["num_accepted_tokens"]) == (drafts, tokens, accepted)
    assert spec["draft_acceptance_rate"] == pytest.approx(26 / 34)  # the mean of the two rates would be 5/6
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 26 / 18)
