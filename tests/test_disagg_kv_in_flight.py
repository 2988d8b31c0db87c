"""KV in flight between a prefill and a decode instance: used in the pools' step rows while they step."""

import pytest

import kvsim

FIXED = {"dist": "fixed"}


def test_a_lone_transfer_holds_the_prompt_blocks_on_both_sides_and_no_row_covers_it():
    # One 1,024-token prompt, blocks of 16: 64 blocks. P's prefill row holds them (its first token computed as
    # the prompt's 1,024 slots); D's first row, when the transfer has ended, holds D's 64 reserved blocks (its
    # first step recomputes the last prompt token, in them). Between the handoff and the transfer's end neither
    # instance steps: no row covers it.
    # The link: 1e8 B/s for 64 blocks of 16 · 128 KiB (Llama-3.1-8B, bf16) = 134,217,728 B: 1.342 s.
    result = kvsim.simulate(None, workload__num_requests=1, workload__prompt_len={**FIXED, "value": 1024},
                            workload__output_len={**FIXED, "value": 4}, router=None,
                            replicas=[{"count": 1, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}],
                            kv_transfer_config={"kv_link": "rdma", "kv_link_bandwidth_bytes_per_s": 1e8,
                                                "kv_link_latency_s": 0.0})
    steps = result.steps
    transfer = result.tables["transfers"].iloc[0]
    assert transfer["num_bytes"] == 64 * 16 * 128 * 1024
    assert transfer["end_s"] - transfer["start_s"] == pytest.approx(64 * 16 * 128 * 1024 / 1e8, rel=1e-12)
    prefill, decode = steps[steps.replica == 0], steps[steps.replica == 1]
    assert prefill["held_slots"].tolist() == [1024]
    assert decode["held_slots"].iloc[0] == 1024
    ends = steps["time_s"] + steps["duration_s"]
    assert not ((steps["time_s"] < transfer["end_s"]) & (ends > transfer["start_s"])).any()


def test_lone_transfers_are_counted_from_the_transfers_not_the_rows():
    """Two 1,024-token requests 10 s apart on average (each transfer lone: 1.342 s, no instance steps), 4 output
    tokens, every step 10 ms: the summary counts both transfers and their 2 · 134,217,728 bytes; P's step time
    is its 2 prefills (20 ms), D's its 2 · 4 steps (the first recomputes the last prompt token): 80 ms, the
    transfers' 2.68 s in neither; D's rows never show a request waiting (vLLM's empty connector steps would)."""
    result = kvsim.simulate(None, workload__num_requests=2, workload__arrival={"process": "poisson", "rate": 0.1},
                            workload__prompt_len={**FIXED, "value": 1024}, workload__output_len={**FIXED, "value": 4},
                            latency={"model": "constant", "step_s": 0.01}, router=None,
                            replicas=[{"count": 1, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}],
                            kv_transfer_config={"kv_link": "rdma", "kv_link_bandwidth_bytes_per_s": 1e8,
                                                "kv_link_latency_s": 0.0})
    disagg, duration_s = result.summary["disaggregation"], result.summary["duration_s"]
    assert disagg["num_transfers"] == 2 and disagg["bytes_moved"] == 2 * 64 * 16 * 128 * 1024
    assert disagg["pools"]["prefill"]["utilization"] * duration_s == pytest.approx(2 * 0.01)
    assert disagg["pools"]["decode"]["utilization"] * duration_s == pytest.approx(8 * 0.01)
    assert disagg["pools"]["decode"]["mean_waiting"] == 0.0
    assert disagg["transfer_s"]["mean"] == pytest.approx(64 * 16 * 128 * 1024 / 1e8)
