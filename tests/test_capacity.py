from fractions import Fraction

import pytest

from kvsim.model.capacity import (
    check_parallel,
    kv_bytes_per_block,
    kv_bytes_per_token,
    model_kv_layout,
    num_gpu_blocks,
    paged_max_seqs,
    paged_seqs,
    shared_prefix_blocks,
    slab_max_seqs,
    vllm_max_concurrency,
)
from kvsim.model.capacity_plan import plan_capacity
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import EngineConfig
from kvsim.model.errors import KvsimError

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
    # OPT-13B (config.json): 40 layers, hidden 5120, fp16. K and V: 2 x 40 x 5120 x 2 B = 819,200 B a token,
    # 13,107,200 B a 16-token block; 12 GiB / 13,107,200 B = 983.04 -> 983 blocks, 15,728 slots (the paper: 15.7K)
    engine = EngineConfig(kv_cache_memory_bytes="12GiB")
    assert num_gpu_blocks(load_model("opt-13b"), H100, engine) == 983
    plan = plan_capacity(load_model("opt-13b"), H100, engine, [1024])
    assert (plan.num_gpu_blocks, plan.num_token_slots) == (983, 15_728)


def test_pool_from_memory_by_hand():
    """Llama-2-7B (config.json: 32 layers, hidden 4096, 32 KV heads of 128, MLP 11008, vocab 32000, untied
    embeddings, fp16) on an H100 SXM (81,559 MiB), vLLM's defaults for the OpenAI server on a GPU of 70 GiB or
    more (vllm/engine/arg_utils.py: max_num_batched_tokens 8192, max_num_seqs 1024)."""
    params = 2 * 32000 * 4096 + 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 4096
    assert params == 6_738_415_616  # the published parameter count of Llama-2-7B
    weights = 2 * params
    # kvsim's stated activation peak: gate/up + product + four hidden buffers for 8192 tokens, fp32 logits
    activation = 8192 * (3 * 11008 + 4 * 4096) * 2 + 1024 * 32000 * 4
    pool = int(81559 * 2**20 * 0.9) - weights - activation - 2**30  # 1 GiB non-torch memory
    plan = plan_capacity(load_model("llama-2-7b"), H100, EngineConfig(max_model_len=4096), [4096])
    assert (plan.weights_bytes, plan.activation_peak_bytes) == (weights, activation)
    assert plan.kv_pool_bytes == pool == 61_477_583_257
    assert plan.num_gpu_blocks == pool // (2 * 32 * 32 * 128 * 2 * 16) == 7328  # 512 KiB a token, 16 a block


def test_b200_pool_by_hand():
    """The same Llama-2-7B engine on a B200 (nvidia-smi: 183,359 MiB; NVIDIA/TensorRT-LLM issue #10278): the
    same weights and activation peak as on the H100 above, vLLM's defaults being the same for both (70 GiB or
    more), and 2.25x the H100's pool: 18,781 blocks of 8 MiB where the H100 holds 7,328."""
    weights = 2 * 6_738_415_616
    activation = 8192 * (3 * 11008 + 4 * 4096) * 2 + 1024 * 32000 * 4
    pool = int(183359 * 2**20 * 0.9) - weights - activation - 2**30
    plan = plan_capacity(load_model("llama-2-7b"), load_gpu("b200"), EngineConfig(max_model_len=4096), [4096])
    assert plan.kv_pool_bytes == pool == 157_548_116_377
    assert plan.num_gpu_blocks == pool // (512 * 1024 * 16) == 18_781


def test_seed_exercise_39_sequences_at_4k():
    layout = model_kv_layout(load_model("llama-3.1-8b"), EngineConfig())  # one full-attention group, blocks of 16
    assert paged_max_seqs(layout, 10_000, 4096, 2048, num_null_blocks=1) == 9_999 // 256 == 39
    assert paged_max_seqs(layout, 10_240, 4096, 2048, num_null_blocks=0) == 40
    assert paged_seqs(layout, 10_000, 4096, 2048, num_null_blocks=1) == Fraction(9_999, 256)
    assert vllm_max_concurrency(10_000, 4096, 16) == pytest.approx(39.0625)


@pytest.mark.parametrize(("scheduler", "expected"), [("v1", 10_000 / 257), ("v0", 1600 / 41)])
def test_maximum_concurrency_is_logged_in_the_modelled_vllm_versions_formula(scheduler, expected):
    """max_model_len 4,100 is not a multiple of 16: vLLM v1 counts whole blocks per request, cdiv(4100, 16) =
    257, and logs 10,000 / 257 = 38.91x; v0 logs token slots over max_model_len, 10,000 · 16 / 4,100 =
    1,600 / 41 = 39.02x. kvsim capacity, the run summary and the helper each print the engine's version's."""
    import kvsim

    assert vllm_max_concurrency(10_000, 4100, 16, scheduler) == pytest.approx(expected, rel=1e-12)
    engine = EngineConfig(max_model_len=4100, num_gpu_blocks_override=10_000, scheduler=scheduler)
    plan = plan_capacity(load_model("llama-3.1-8b"), H100, engine, [1024])
    assert plan.max_concurrency == pytest.approx(expected, rel=1e-12)
    summary = kvsim.simulate(None, workload__num_requests=2, steps="none", engine__scheduler=scheduler,
                             engine__max_model_len=4100, engine__num_gpu_blocks_override=10_000).summary
    assert summary["vllm_max_concurrency"] == pytest.approx(expected, rel=1e-12)


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


def test_a_context_that_is_all_prefix_keeps_its_last_block():
    """A 64-token context that is the whole 64-token prefix (blocks of 16): a prefix hit stops one token short
    of the sequence (vLLM v1's `max_cache_hit_length = num_tokens - 1`), so it hits 3 blocks and recomputes
    the 4th into a block of its own. The table said every block was shared and none own: 0 sequences fit,
    and 10 held 4 blocks in all. By hand: 10 hold 3 + 10 · 1 = 13 blocks; 500 blocks (499 usable, vLLM v1's
    null block) fit (499 − 3) // 1 = 496."""
    assert shared_prefix_blocks(10, 64, 64, 16) == (40, 13)
    assert shared_prefix_blocks(10, 65, 64, 16) == (50, 4 + 10)  # a 65th token: the prefix's 4 blocks all hit
    engine = EngineConfig(max_model_len=1024, num_gpu_blocks_override=500)
    plan = plan_capacity(load_model("llama-3.1-8b"), H100, engine, [64, 100], shared_prefix_tokens=64,
                         num_sequences=10)
    assert [(r.shared_prefix_blocks_with_sharing, r.shared_prefix_max_seqs) for r in plan.rows] == \
        [(13, 496), (4 + 10 * 3, (499 - 4) // 3)]


def test_plan_rows_above_max_model_len_are_zero():
    # 983 blocks (above) / cdiv(1024, 16) = 15; 4096 tokens exceed OPT-13B's max_position_embeddings 2048
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
    assert num_gpu_blocks(m, H100, EngineConfig(max_model_len=4096, num_gpu_blocks_override=257)) == 257


def test_the_startup_check_leaves_out_v1s_null_block():
    """vLLM PR #47272 (vllm/v1/core/kv_cache_utils.py `get_kv_cache_configs`: the override folded into the memory
    checked, one block's bytes reserved for the null block `BlockPool` holds back): its test refuses a 32-block
    pool for max_model_len 512 (exactly cdiv(512, 16) = 32 blocks) and accepts 33. Here 4,096 tokens: 256 blocks of
    16, refused under v1 (255 usable; it started, and every request that long was then refused on arrival) and
    accepted under v0, whose `raise_if_cache_size_invalid` counts every block (no null block); 257 start v1."""
    m = load_model("llama-3.1-8b")
    with pytest.raises(KvsimError) as refused:
        num_gpu_blocks(m, H100, EngineConfig(max_model_len=4096, num_gpu_blocks_override=256))
    assert str(refused.value) == (
        "max_model_len=4096: one request needs 0.50 GiB of KV cache, the pool holds 0.50 GiB (256 blocks, one of them "
        "v1's null block, which no request holds); decrease max_model_len or give the KV cache more memory")
    assert num_gpu_blocks(m, H100, EngineConfig(max_model_len=4096, num_gpu_blocks_override=256, scheduler="v0")) == 256
    assert num_gpu_blocks(m, H100, EngineConfig(max_model_len=512, num_gpu_blocks_override=33)) == 33
    with pytest.raises(KvsimError, match="max_model_len=512: .* \\(32 blocks, one of them v1's null block"):
        num_gpu_blocks(m, H100, EngineConfig(max_model_len=512, num_gpu_blocks_override=32))


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


def test_sequence_counts_leave_out_vllm_v1s_null_block():
    """vLLM v1's BlockPool takes block 0 as the null block (vllm/v1/core/block_pool.py: `null_block =
    free_block_queue.popleft()`), so 10,240 blocks of 16 tokens hold floor(10,239 / 256) = 39 sequences of
    4,096 tokens, not 40 (v0's block manager hands out all 10,240: 40). With a 1,024-token prefix shared
    (64 blocks once, 192 own): floor((10,239 − 64) / 192) = 52 (v0: floor(10,176 / 192) = 53). vLLM's
    "maximum concurrency" counts every block, as vLLM prints it: 10,240 / 256 = 40.0. The engine agrees:
    40 such sequences at once preempt one (`kvsim run` on this engine, 2,048 + 2,048 tokens each)."""
    m = load_model("llama-3.1-8b")
    for scheduler, seqs, shared in (("v1", 39, 52), ("v0", 40, 53)):
        engine = EngineConfig(max_model_len=4096, num_gpu_blocks_override=10_240, scheduler=scheduler)
        plan = plan_capacity(m, H100, engine, [4096], shared_prefix_tokens=1024, num_sequences=10)
        (row,) = plan.rows
        assert (row.blocks_per_seq, row.paged_max_seqs, row.paged_max_seqs_fp8) == (256, seqs, seqs)
        assert row.shared_prefix_max_seqs == shared
        assert plan.num_gpu_blocks == 10_240 and plan.max_concurrency == pytest.approx(40.0)
    from kvsim import simulate

    def preemptions(num_seqs):  # all arrive at once and hold 4,096 tokens at their last step
        return simulate({
            "name": "null-block", "steps": "none", "latency": {"model": "constant", "step_s": 0.01},
            "engine": {"max_model_len": 4096, "num_gpu_blocks_override": 10_240, "enable_prefix_caching": False},
            "workload": {"num_requests": num_seqs, "arrival": {"process": "constant", "rate": 1e6},
                         "prompt_len": {"dist": "fixed", "value": 2048},
                         "output_len": {"dist": "fixed", "value": 2048}}}).summary["num_preemptions"]
    assert (preemptions(39), preemptions(40)) == (0, 1)


def test_expert_parallelism_places_whole_experts_the_busiest_gpu_holding_the_remainder():
    """vLLM's `determine_expert_map` gives each of g = tp · dp GPUs E // g whole experts and one more to the
    first E % g: Qwen3-30B-A3B's 128 experts over 3 GPUs are 43 / 43 / 42, so the busiest GPU holds 43 experts
    of 48 layers · 3 · 2048 · 768 · 2 B = 452,984,832 B each, beside the rest copied on every GPU (attention
    1,811,939,328 + router 25,165,824 + embeddings 1,244,659,712 + norms 397,312 B, from the preset's config);
    over 256 GPUs the busiest holds one expert, not half of one. Without expert parallelism the experts are
    tensor-parallel shards, a third of each."""
    from kvsim.model.capacity import weights_bytes
    from kvsim.model.config import load_model

    model = load_model("qwen3-30b-a3b")
    per_expert, rest = 48 * 3 * 2048 * 768 * 2, 1_811_939_328 + 25_165_824 + 1_244_659_712 + 397_312
    assert weights_bytes(model, 1, 3, whole_experts=True) == rest + 43 * per_expert
    assert weights_bytes(model, 1, 256, whole_experts=True) == rest + per_expert
    assert weights_bytes(model, 1, 3) == rest + -(-128 * per_expert // 3)
    assert weights_bytes(model, 2, 4, whole_experts=True) == -(-rest // 2) + 16 * per_expert  # 128 / 8 exactly


def gemma_rows(blocks=3101, context=2048):
    engine = EngineConfig(num_gpu_blocks_override=blocks, max_num_batched_tokens=2048, max_model_len=4096,
                          max_num_seqs=256)
    (row,) = plan_capacity(load_model("gemma-3-27b"), H100, engine, [context]).rows
    return row, engine


def test_a_sliding_window_sequence_counts_its_misaligned_window_and_its_prompt_chunk():
    """Gemma-3-27B: 6 groups of sliding layers (window 1,024) and 1 full group, blocks of 16, 3,101 blocks (3,100
    usable), 2,048-token sequences, chunks of 2,048. Decoding (any length in 2,033..2,048): the full group holds
    cdiv(n, 16) = 128 blocks; a sliding group the blocks of tokens n − 1,023..n, which start mid-block at all but
    the aligned length: cdiv(1,023, 16) + 1 = 65 (vLLM's SlidingWindowSpec adds the same block): 128 + 6 · 65 =
    518. Prefilling, every group holds the whole prompt until the step ends: 7 · 128 = 896. The last sequence
    admitted prefills beside the others decoding: 1 + (3,100 − 896) // 518 = 5 sequences, not the 3,100 // 512 = 6
    of the live blocks at exactly 2,048 tokens (128 + 6 · 64)."""
    row, _ = gemma_rows()
    assert (row.blocks_per_seq, row.prefill_blocks_per_seq, row.paged_max_seqs) == (518, 896, 5)


def test_capacity_of_a_sliding_window_model_is_the_simulated_concurrency():
    """The same engine simulated: 40 prompts of 2,032 tokens (16 output tokens: 2,048 in all) arriving together.
    The most sequences decoding at once is capacity's count (the running count can show one more for a step: a
    prompt's first chunk admitted beside them, preempted when the decoders grow)."""
    import kvsim

    row, engine = gemma_rows()
    result = kvsim.simulate({
        "name": "swa", "model": "gemma-3-27b", "gpu": "h100-80gb", "steps": "all",
        "engine": engine.model_dump(exclude_defaults=True), "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 1e6},
                     "prompt_len": {"dist": "fixed", "value": 2032}, "output_len": {"dist": "fixed", "value": 16}}})
    assert int(result.steps["num_decode_seqs"].max()) == row.paged_max_seqs == 5


def test_a_sliding_window_models_shared_prefix_column_counts_as_the_others_do():
    """The same gemma-3-27b engine (3,100 usable blocks, 2,048-token sequences, chunks of 2,048), the first 1,024
    tokens shared: a hit covers min(1,024, 2,047) // 16 = 64 blocks. The last sequence admitted computes its whole
    prompt in one chunk and holds blocks 0..127 in all 7 groups: 7 · 64 shared (held once) and 7 · 64 its own;
    each decoding one holds in the full group blocks 0..127 (64 its own) and in a sliding group those from
    (n − 1,023) // 16 ∈ {63, 64} on (64 its own: the misaligned block 63 is the prefix's): 7 · 64 = 448. So
    1 + (3,100 − 448 − 448) / 448 = 5.9: 5 sequences, where the column said (3,100 − 64) // 448 = 6 (the
    prefilling sequence left out). A prefix of one token shares no block: the column is then paged_max_seqs (it
    said 6 against 5). The engine agrees: 40 such requests together decode 5 at most."""
    import kvsim

    engine = EngineConfig(num_gpu_blocks_override=3101, max_num_batched_tokens=2048, max_model_len=4096,
                          max_num_seqs=256)
    for prefix in (1, 1024):
        (row,) = plan_capacity(load_model("gemma-3-27b"), H100, engine, [2048], shared_prefix_tokens=prefix,
                               num_sequences=10).rows
        assert row.shared_prefix_max_seqs == row.paged_max_seqs == 5
    result = kvsim.simulate({
        "name": "swa", "model": "gemma-3-27b", "gpu": "h100-80gb", "steps": "all",
        "engine": engine.model_dump(exclude_defaults=True), "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 1e6},
                     "shared_prefix": {"tokens": 1024},  # in front of each 1,008-token prompt: 2,032 tokens
                     "prompt_len": {"dist": "fixed", "value": 1008}, "output_len": {"dist": "fixed", "value": 16}}})
    assert int(result.steps["num_decode_seqs"].max()) == 5


def test_a_given_kv_cache_memory_bytes_is_sized_without_gpu_memory_utilization():
    """vLLM's `Worker.determine_available_memory` returns `kv_cache_memory_bytes` before it reads any budget ("This
    does not respect the gpu_memory_utilization config"), so weights above memory · utilization still start.
    kvsim refused them: llama-2-7b's 13,476,831,232 B of fp16 weights (2 · 6,738,415,616 params) over an H100's
    0.1 · 81,559 MiB = 8,552,080,998 B. By hand: 2 (K, V) · 32 layers · 32 heads · 128 · 2 B = 524,288 B a token,
    8 MiB a 16-token block, so 12 GiB holds 12 GiB / 8 MiB = 1,536 blocks."""
    model, weights = load_model("llama-2-7b"), 2 * 6_738_415_616
    assert weights > int(0.1 * H100.memory_bytes)
    with pytest.raises(KvsimError, match="gpu_memory_utilization=0.1 gives"):  # no pool given: the budget sizes it
        num_gpu_blocks(model, H100, EngineConfig(gpu_memory_utilization=0.1, max_model_len=4096))
    given = EngineConfig(gpu_memory_utilization=0.1, kv_cache_memory_bytes="12GiB", max_model_len=4096)
    assert num_gpu_blocks(model, H100, given) == 12 * 2**30 // (8 * 2**20) == 1536
    # the GPU's memory still bounds weights and pool together
    too_big = EngineConfig(gpu_memory_utilization=0.1, kv_cache_memory_bytes=H100.memory_bytes - weights + 1)
    with pytest.raises(KvsimError, match="kv_cache_memory_bytes=.*exceeds"):
        num_gpu_blocks(model, H100, too_big)
    # so a utilization beside it sizes nothing: a run says so, as vLLM's log does; the default is not "given"
    assert given.unread_settings() == {"gpu_memory_utilization": "engine.gpu_memory_utilization=0.1 is unread: "
                                                                 "kv_cache_memory_bytes sizes the KV pool, as in vLLM"}
    assert EngineConfig(kv_cache_memory_bytes="12GiB").unread_settings() == {}
    assert EngineConfig(gpu_memory_utilization=0.1).unread_settings() == {}


def test_weights_past_the_gpu_beside_a_given_pool_are_the_models_error_not_the_pools():
    """With `kv_cache_memory_bytes` given, weights that alone exceed the GPU were refused as the pool's fault:
    "kv_cache_memory_bytes=1073741824: a KV pool of 1.00 GiB plus 131.42 GiB of weights exceeds ...", though no pool
    would fit them. Llama-3.1-70B's 70,553,706,496 parameters (its safetensors index) at 2 B are 141,107,412,992 B,
    over an H100's 81,559 MiB = 85,520,809,984 B whatever the pool: the model is named, with the GPU's whole memory
    as the limit (a given pool reads no gpu_memory_utilization), 55,586,603,008 B missing."""
    weights, memory = 2 * 70_553_706_496, 81_559 * 2**20
    assert H100.memory_bytes == memory
    given = EngineConfig(kv_cache_memory_bytes="1GiB", max_model_len=4096)
    with pytest.raises(KvsimError) as caught:
        num_gpu_blocks(load_model("llama-3.1-70b"), H100, given)
    assert str(caught.value) == (
        f"model=llama-3.1-70b: weights need {weights:,} B per GPU (tensor_parallel_size=1) but h100-80gb gives "
        f"{memory:,} B; {weights - memory:,} B missing")
