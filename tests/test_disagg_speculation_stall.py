"""A disaggregated decode instance that speculates (EAGLE) can stall for good, as vLLM's does.

vLLM reserves a remote request's prompt blocks with no lookahead (`effective_lookahead_tokens` is 0 for a
request with no computed token), but once its KV has arrived the request has computed tokens, so admitting it
asks `allocate_slots` for its next token plus `num_lookahead_tokens` (K) more. A decode pool filled by the
prompts it reserved has no block for that: nothing runs, so no block is ever freed. kvsim raised simpy's bare
"No scheduled events left" RuntimeError there (a traceback from `kvsim run`); it names the stall in one line.
"""

import json

import pytest

from kvsim.fleet.disagg import simulate_disagg
from kvsim.model.errors import HeldKvStall
from kvsim.workload.scenario import make_scenario
from tests.test_disagg import scenario

EAGLE = {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rates": 0.5}


def fleet(tmp_path, decode_engine):
    """1P1D (`tests.test_disagg.scenario`: 10 ms steps), two 96-token prompts asking 5 tokens, both at t = 0;
    the decode instance has 13 blocks of 16 (12 usable) and max_model_len 128 (legal: 192 tokens fit)."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 0, "input_length": 96, "output_length": 5, "hash_ids": [i]})
                            + "\n" for i in range(2)))
    raw = scenario(num_requests=2, decode_engine={"num_gpu_blocks_override": 13, "max_model_len": 128,
                                                  **decode_engine}).model_dump(mode="json")
    raw["workload"] = {"num_requests": 2, "arrival": {"process": "trace"}, "prompt_len": None, "output_len": None,
                       "trace": {"format": "mooncake", "path": str(path)}}
    return make_scenario(raw)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_loaded_request_whose_lookahead_finds_no_block_is_a_named_stall(tmp_path, policy):
    # By hand: P prefills both prompts in its first step (0-10 ms) and hands both off at 10 ms; D, idle,
    # reserves both at once: 96 tokens = 6 blocks each, its 12 usable blocks. Their KV arrives holding 95
    # computed tokens each. Without speculation D's head computes token 96 in the 6 blocks it holds: both finish.
    # (Both have priority 0 and the same hand-off instant, so request 0 heads a priority queue too.)
    plain = simulate_disagg(fleet(tmp_path, {"scheduling_policy": policy}), check=True)
    assert set(plain.requests.status) == {"finished"}
    # EAGLE K = 3: the head asks 95 + 1 + 3 = 99 slots, 7 blocks; it holds 6 and none is free, the other request
    # holds the rest and nothing runs: vLLM waits forever, kvsim stops with the line (a KvsimError: exit 2).
    with pytest.raises(HeldKvStall) as stall:
        simulate_disagg(fleet(tmp_path, {"scheduling_policy": policy, "speculative_config": EAGLE}), check=True)
    message = str(stall.value)
    assert message.startswith(f"engine.scheduling_policy={policy}: request 0 heads the queue holding the KV it "
                              "loaded from a prefill instance (kv_transfer_config)")
    assert "the 3 slots of its speculative lookahead" in message and "requests [1] behind it" in message
