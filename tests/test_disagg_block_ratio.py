"""A decode pool whose block size is a multiple of the prefill pool's (vLLM's NixlConnector `block_size_ratio`).

Hand-derived: Llama-3.1-8B stores 131,072 B of KV per token (TP 1). P's blocks hold 16 tokens, D's 32.
vLLM's `NixlConnectorWorker._read_blocks` splits each D block it fills into 32 / 16 = 2 of P's blocks
(`get_mapped_blocks`) and clips them to the blocks P holds, so a 100-token prompt moves P's ceil(100 / 16) = 7
blocks, 7 · 16 · 131,072 B, not D's 4 blocks' 128 tokens.
"""

from kvsim.fleet.disagg import simulate_disagg
from kvsim.fleet.kv_transfer import prefill_blocks_read
from kvsim.workload.scenario import make_scenario
from tests.test_disagg import BYTES_PER_TOKEN, scenario


def test_a_decode_instance_of_larger_blocks_reads_the_prefill_instances_blocks():
    result = simulate_disagg(scenario(decode_engine={"block_size": 32}), check=True)
    assert list(result.tables["transfers"]["num_bytes"]) == [7 * 16 * BYTES_PER_TOKEN]  # 14,680,064 B


def test_blocks_read_with_a_decode_prefix_hit():
    # D holds tokens 0..31 (1 block of 32): it fills its blocks 1..3, 6 of P's 16-token blocks; P holds 7, so
    # the read takes P's last 6 (vLLM: remote_block_ids[-num_local_blocks:]).
    assert prefill_blocks_read(100, 16, 32, 1) == 6
    assert prefill_blocks_read(100, 16, 32, 0) == 7  # 8 halves, clipped to P's 7
    assert prefill_blocks_read(96, 16, 32, 0) == 6  # whole blocks on both sides: no clipping
    assert prefill_blocks_read(100, 16, 16, 2) == 5  # equal sizes: D's blocks to fill, as before
    # D holds 0..63 and fills its block 1, 4 of P's blocks; P holds 7 and vLLM reads its last 4 (48..111)
    assert prefill_blocks_read(100, 16, 64, 1) == 4


def test_the_decode_router_hashes_at_the_decode_pools_block_size():
    # Two requests share a 48-token system prompt. The decode pool's affinity router, hashing in D's blocks of
    # 32, finds the second's first block (tokens 0..31) routed before: 32 matched tokens (in P's blocks of 16,
    # it would have found 3 blocks, 48 tokens). The prefill router (round robin) matches nothing.
    spec = scenario(num_requests=2, rate=10.0, decode_engine={"block_size": 32}).model_dump(mode="json")
    spec["workload"]["shared_prefix"] = {"tokens": 48}
    spec["kv_transfer_config"]["decode_router"] = {"policy": "affinity", "match_threshold": 0.0}
    routes = simulate_disagg(make_scenario(spec)).tables["routes"]
    decode = routes[routes["pool"] == "decode"].sort_values("request_id")
    assert list(decode["matched_tokens"]) == [0, 32]


def test_a_decode_prefix_hit_reads_p_blocks_for_d_blocks_to_fill_not_the_uncached_tokens():
    """Two 100-token prompts (a 64-token shared prefix before 36 tokens of their own), 1 s apart (the first long finished). D (blocks of 32,
    prefix caching on) holds the shared tokens 0..63, 2 of its blocks, so vLLM's scheduler gives the connector its
    ceil(100 / 32) − 2 = 2 blocks to fill (`get_unhashed_block_ids`); `_read_blocks` maps them to 2 · 32 / 16 = 4
    of P's blocks of 16 (`get_mapped_blocks`, clipped to P's 7: no clip) and reads P's last 4
    (`remote_block_ids[-4:]`): 4 · 16 = 64 tokens' KV, where the un-cached tokens 64..99 are 36 (P's blocks 4..6
    hold them, 48). The first request, no hit, reads P's 7 blocks (D's 4 blocks map to 8, clipped to 7)."""
    spec = scenario(num_requests=2, rate=1.0, prompt=36, decode_engine={"block_size": 32}).model_dump(mode="json")
    spec["workload"]["shared_prefix"] = {"tokens": 64}
    result = simulate_disagg(make_scenario(spec), check=True)
    transfers = result.tables["transfers"].sort_values("request_id")
    assert list(result.requests.sort_values("request_id")["prefix_hit_tokens"]) == [0, 64]
    assert list(transfers["num_bytes"]) == [7 * 16 * BYTES_PER_TOKEN, 4 * 16 * BYTES_PER_TOKEN]
