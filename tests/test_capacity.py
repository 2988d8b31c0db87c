import pytest

from kvsim.capacity import (
    check_parallel,
    kv_bytes_per_block,
    kv_bytes_per_token,
    num_gpu_blocks,
    paged_max_seqs,
    plan_capacity,
    shared_prefix_blocks,
    slab_max_seqs,
    vllm_max_concurrency,
    weights_bytes,
)
from kvsim.config import EngineConfig, load_gpu, load_model
from kvsim.errors import KvsimError

H100 = load_gpu("h100-80gb")


def test_bytes_per_token_from_the_paper_and_llama():
    assert kv_bytes_per_token(load_model("opt-13b"), EngineConfig()) == 819_200  # 800 KiB
    assert kv_bytes_per_token(load_model("llama-3.1-8b"), EngineConfig()) == 131_072  # 128 KiB


def test_fp8_halves_block_bytes():
    m = load_model("llama-3.1-8b")
    assert kv_bytes_per_block(m, EngineConfig(kv_cache_dtype="fp8")) * 2 == kv_bytes_per_block(m, EngineConfig())


def test_tensor_parallel_divides_kv_heads_but_never_below_one():
    m = load_model("llama-3.1-70b")  # 8 KV heads
    base = kv_bytes_per_token(m, EngineConfig())
    assert kv_bytes_per_token(m, EngineConfig(tensor_parallel_size=4)) == base // 4
    assert kv_bytes_per_token(m, EngineConfig(tensor_parallel_size=16)) == base // 8


def test_opt13b_12gib_is_the_papers_15_7k_slots():
    engine = EngineConfig(kv_cache_memory_bytes="12GiB")
    assert num_gpu_blocks(load_model("opt-13b"), H100, engine) == 983
    assert 983 * 16 == 15_728


def test_pool_from_memory_by_hand():
    m = load_model("llama-2-7b")
    e = EngineConfig(max_model_len=4096)
    plan = plan_capacity(m, H100, e, [4096])
    expected_pool = int(H100.memory_bytes * 0.9) - weights_bytes(m) - plan.activation_peak_bytes - 2**30
    assert plan.kv_pool_bytes == expected_pool
    assert plan.num_gpu_blocks == expected_pool // (524_288 * 16)


def test_seed_exercise_39_sequences_at_4k():
    assert paged_max_seqs(10_000, 4096, 16) == 39
    assert vllm_max_concurrency(10_000, 4096, 16) == pytest.approx(39.0625)


def test_halving_max_model_len_doubles_slab_concurrency():
    assert slab_max_seqs(160_000, 4096) * 2 == slab_max_seqs(160_000, 2048)
    m = load_model("llama-3.1-8b")
    a = plan_capacity(m, H100, EngineConfig(max_model_len=8192, num_gpu_blocks_override=10_000), [1024])
    b = plan_capacity(m, H100, EngineConfig(max_model_len=4096, num_gpu_blocks_override=10_000), [1024])
    assert (a.rows[0].slab_max_seqs, b.rows[0].slab_max_seqs) == (19, 39)  # 160,000 slots


def test_shared_prefix_stores_full_blocks_once():
    # 100 users, 5,000-token system prompt, 5,100-token contexts: 312 prompt blocks stored once.
    without, with_ = shared_prefix_blocks(100, 5100, 5000, 16)
    assert without == 100 * 319
    assert with_ == 312 + 100 * (319 - 312)


def test_plan_rows_above_max_model_len_are_zero():
    m = load_model("opt-13b")
    plan = plan_capacity(m, H100, EngineConfig(kv_cache_memory_bytes="12GiB"), [1024, 4096])
    assert [r.paged_max_seqs for r in plan.rows] == [15, 0]


def test_model_too_big_says_missing_bytes():
    with pytest.raises(KvsimError, match="B missing"):
        num_gpu_blocks(load_model("llama-3.1-70b"), H100, EngineConfig())
    # Two shards fit (at 8k context; the full 128k would need 20 GiB of KV per GPU, more than is left).
    assert num_gpu_blocks(load_model("llama-3.1-70b"), H100,
                          EngineConfig(tensor_parallel_size=2, max_model_len=8192)) > 0
    with pytest.raises(KvsimError, match="max_model_len=131072"):
        num_gpu_blocks(load_model("llama-3.1-70b"), H100, EngineConfig(tensor_parallel_size=2))


def test_max_model_len_the_pool_cannot_hold_is_refused_as_vllm_does():
    """vLLM's check_enough_kv_cache_memory: 100 blocks × 16 = 1,600 slots < one 4,096-token request."""
    m = load_model("llama-3.1-8b")
    with pytest.raises(KvsimError, match="max_model_len=4096"):
        num_gpu_blocks(m, H100, EngineConfig(max_model_len=4096, num_gpu_blocks_override=100))
    assert num_gpu_blocks(m, H100, EngineConfig(max_model_len=4096, num_gpu_blocks_override=256)) == 256


def test_tensor_parallel_must_split_the_heads():
    m = load_model("llama-3.1-8b")  # 32 attention heads, 8 KV heads
    for tp in (3, 64):
        with pytest.raises(KvsimError, match=f"tensor_parallel_size={tp}"):
            num_gpu_blocks(m, H100, EngineConfig(tensor_parallel_size=tp, max_model_len=4096))
    for tp in (2, 4, 8, 16, 32):  # 16 and 32 replicate each KV head on 2 and 4 GPUs
        check_parallel(m, EngineConfig(tensor_parallel_size=tp))


def test_fp8_column_doubles_blocks_when_memory_bound():
    plan = plan_capacity(load_model("llama-3.1-8b"), H100, EngineConfig(max_model_len=8192), [4096])
    assert plan.num_gpu_blocks_fp8 in (2 * plan.num_gpu_blocks, 2 * plan.num_gpu_blocks + 1)
