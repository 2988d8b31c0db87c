"""The affinity router's table, counted in its own blocks when replicas' block sizes differ."""

from kvsim.fleet.router import Router, prefix_table_blocks
from kvsim.workload.content import SegmentContent
from kvsim.workload.request import Request


def test_the_table_holds_as_many_tokens_as_the_pools_in_router_blocks():
    # 100 blocks of 16 tokens + 50 blocks of 32 = 3,200 tokens = 200 router blocks of 16 (the pools' block
    # count, 150, held 2,400 tokens: a quarter of the fleet's prefixes forgotten too early).
    assert prefix_table_blocks([100 * 16, 50 * 32], 16) == 200
    assert prefix_table_blocks([100 * 16, 100 * 16], 16) == 200  # one block size: the pools' block count
    assert prefix_table_blocks([10 * 16], 32) == 5


def test_a_hybrid_pool_s_table_counts_its_blocks_shared_among_its_kv_groups():
    """Gemma 3 27B: 6 sliding-window groups and 1 full (52 sliding layers, 10 full: the smaller kind's count),
    each holding a block per prefix block, so 5,000 blocks hold 5,000 // 7 = 714 blocks of 16 tokens, 11,424
    tokens (vLLM's "GPU KV cache size"); two replicas' table 2 x 714 = 1,428 entries, not 2 x 5,000 = 10,000."""
    from kvsim.engine.builder import resolve_engine
    from kvsim.workload.scenario import load_scenario

    spec = resolve_engine(load_scenario(None, ["model=gemma-3-27b", "engine.num_gpu_blocks_override=5000",
                                               "engine.max_model_len=2048"]))
    assert spec.kv_cache_size_tokens == 714 * 16
    assert prefix_table_blocks([spec.kv_cache_size_tokens] * 2, 16) == 1428


class Idle:
    def outstanding(self):
        return [0, 0]

    def kv_usage(self):
        return [0.0, 0.0]


def prompt(request_id, segment, length=64):
    return Request(request_id, 0.0, length, 1, SegmentContent([((segment,), length), (("out", request_id), 1)]))


def test_a_table_of_four_router_blocks_forgets_the_older_prompt():
    # Blocks of 16: each 64-token prompt is 4 blocks. A table of 4 keeps the last prompt's 4 only: after "b",
    # "a" matches nothing (new_prefix); "b" again matches its 4 blocks, 64 tokens.
    router = Router("affinity", 2, 16, load_slack=8, max_prefix_blocks=4)
    router.route(prompt(0, "a"), Idle())
    router.route(prompt(1, "b"), Idle())
    assert router.route(prompt(2, "b"), Idle()).matched_tokens == 64
    assert router.route(prompt(3, "a"), Idle()).reason == "new_prefix"
