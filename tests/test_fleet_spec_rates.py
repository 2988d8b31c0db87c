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


def test_an_autoscaled_replica_s_pool_counts_in_the_rejected_share_only_while_it_serves():
    # 40 requests arrive within 0.4 s, all on replica 0 (the only one READY then). A KV-usage target that any
    # use exceeds asks for a second replica at the t = 1 s sync; it serves from t = 2 s (startup 1 s) to the end
    # D, receiving nothing. Replica 0 is then the static one-replica fleet, with share s1 = r / (S · D). Two pools
    # of S slots, one up for D and one for D − 2: share = r / (S · D + S · (D − 2)) = s1 · D / (2 D − 2). Before,
    # both pools counted for D: s1 / 2.
    k3 = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 0.5}
    common = dict(workload__num_requests=40, workload__arrival={"process": "constant", "rate": 100.0},
                  workload__prompt_len={**FIXED, "value": 256}, workload__output_len={**FIXED, "value": 600},
                  engine__speculative_config=k3, router={"policy": "least_outstanding"})
    one = kvsim.simulate(None, replicas=1, **common).summary
    auto = kvsim.simulate(None, replicas=1, autoscaler={"metric": "kv_cache_usage_perc", "target": 0.0001,
                                                        "min_replicas": 1, "max_replicas": 2, "startup_s": 1.0,
                                                        "sync_period_s": 1.0}, **common)
    assert auto.tables["scaling"]["num_ready"].tolist()[:3] == [1, 1, 2]  # READY from the t = 2 s sync on
    assert (auto.requests["replica"] == 0).all() and auto.summary["duration_s"] == one["duration_s"]
    d, s1 = one["duration_s"], one["spec_decode"]["draft_rejected_share"]
    assert auto.summary["spec_decode"]["draft_rejected_share"] == pytest.approx(s1 * d / (2 * d - 2.0), rel=1e-12)


def test_a_pinned_autoscaled_fleet_s_rejected_share_is_the_static_fleet_s_exactly():
    k3 = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 0.5}
    common = dict(workload__num_requests=20, engine__speculative_config=k3, router={"policy": "least_outstanding"})
    static = kvsim.simulate(None, replicas=2, **common).summary
    pinned = kvsim.simulate(None, replicas=2, autoscaler={"min_replicas": 2, "max_replicas": 3, "target": 1000}, **common).summary
    assert pinned["spec_decode"] == static["spec_decode"]
