"""A speculating engine's pool holds its EAGLE head's KV layer and loses the head's weights, as vLLM v1 sizes it.

vLLM (vllm/v1/spec_decode/eagle.py `EagleProposer.load_model`; vllm/v1/worker/gpu_model_runner.py
`get_kv_cache_spec`; vllm/v1/core/kv_cache_utils.py `_get_num_blocks`): the head's one decoder layer is an
attention layer of the target's KV shape, so Llama-3.1-8B's pool is one group of 33 layers, and the head is
loaded with the target's weights before the pool is sized. Every expected value below is worked by hand from
Llama-3.1-8B's published config.json (32 layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336, vocab
128256, bf16) and the H100 preset's 81,559 MiB.
"""

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.engine.builder import resolve_engine
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.capacity import engine_weights_bytes, model_kv_layout, num_gpu_blocks
from kvsim.model.config import load_gpu, load_model
from kvsim.model.drafter import drafter_weights_bytes
from kvsim.model.engine_config import make_engine
from kvsim.workload.scenario import load_scenario

H, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB, LAYERS = 4096, 32, 8, 128, 14336, 128_256, 32
ATTENTION = H * HEADS * HEAD_DIM + 2 * H * KV_HEADS * HEAD_DIM + HEADS * HEAD_DIM * H  # q, k, v, o: 41,943,040
TARGET_PARAMS = 2 * VOCAB * H + LAYERS * (ATTENTION + 3 * H * MLP + 2 * H) + H  # 8,030,261,248
EAGLE_PARAMS = 2 * H * H + ATTENTION + 3 * H * MLP + H  # fc, one layer, its post-attention norm: 251,662,336
EAGLE3_PARAMS = (3 * H * H  # fc over three target layers' hidden states
                 + 2 * H * (HEADS + 2 * KV_HEADS) * HEAD_DIM + HEADS * HEAD_DIM * H  # q/k/v read 2H; o
                 + 3 * H * MLP + 4 * H  # MLP; input, post-attention, hidden and final norms
                 + 32_000 * H)  # LM head over the published head's draft_vocab_size
EAGLE3_ID_MAP_BYTES = 8 * 32_000  # draft_id_to_target_id, int64

PAGE = 2 * 16 * KV_HEADS * HEAD_DIM * 2  # one layer's block of 16 tokens: 65,536 B
BUDGET = int(81_559 * 2**20 * 0.9)  # 76,968,728,985 B
ACTIVATIONS = 8192 * (3 * MLP + 4 * H) * 2 + 1024 * VOCAB * 4  # kvsim's profile-run estimate (H100 defaults)
POOL = BUDGET - TARGET_PARAMS * 2 - ACTIVATIONS - 2**30  # 58,336,049,561 B without a drafter


def eagle(method, k=3):
    return {"method": method, "num_speculative_tokens": k, "acceptance_length": 2.0}


def test_hand_counts_match_the_published_sizes():
    """The arithmetic the other tests rest on: Llama-3.1-8B is 8.03B parameters, EAGLE's Llama-3 8B head 0.25B."""
    assert TARGET_PARAMS == 8_030_261_248 and EAGLE_PARAMS == 251_662_336
    assert EAGLE3_PARAMS == 424_689_664 and POOL == 58_336_049_561


@pytest.mark.parametrize(("method", "head_bytes", "page_layers", "blocks"), [
    (None, 0, 32, 27_816),  # 58,336,049,561 // (32 · 65,536)
    ("ngram", 0, 32, 27_816),  # no drafter on the GPU: the same pool
    ("eagle", 503_324_672, 33, 26_741),  # (58,336,049,561 − 503,324,672) // (33 · 65,536)
    ("eagle3", 849_635_328, 33, 26_581),  # (58,336,049,561 − 849,635,328) // (33 · 65,536)
])
def test_llama_8b_h100_pool_counts_the_heads_layer_and_weights(method, head_bytes, page_layers, blocks):
    model, gpu = load_model("llama-3.1-8b"), load_gpu("h100-80gb")
    engine = make_engine(max_model_len=8192, speculative_config=None if method is None else eagle(method))
    expected_head = {None: 0, "ngram": 0, "eagle": EAGLE_PARAMS * 2,
                     "eagle3": EAGLE3_PARAMS * 2 + EAGLE3_ID_MAP_BYTES}[method]
    assert head_bytes == expected_head
    assert drafter_weights_bytes(model, engine.speculative_config) == head_bytes
    assert engine_weights_bytes(model, engine) == TARGET_PARAMS * 2 + head_bytes
    layout = model_kv_layout(model, engine)
    assert len(layout.groups) == 1 and layout.group_size == page_layers  # one group: one block table for all
    assert layout.bytes_per_block == page_layers * PAGE
    assert num_gpu_blocks(model, gpu, engine) == (POOL - head_bytes) // (page_layers * PAGE) == blocks


def test_tensor_parallel_splits_the_heads_layers_and_replicates_its_fc():
    """TP 2: attention and MLP halved (QKV/row-parallel), fc and the norm on both ranks (torch Linear, replicated);
    the KV layer holds 4 of the 8 KV heads, like the target's."""
    model = load_model("llama-3.1-8b")
    engine = make_engine(tensor_parallel_size=2, max_model_len=8192, speculative_config=eagle("eagle"))
    assert drafter_weights_bytes(model, engine.speculative_config, 2) == \
        (ATTENTION + 3 * H * MLP) * 2 // 2 + (2 * H * H + H) * 2
    assert model_kv_layout(model, engine).bytes_per_block == 33 * PAGE // 2


def test_a_given_block_count_is_pages_of_every_layer_the_head_included():
    """num_gpu_blocks_override: 10,000 blocks of 33 pages each (vLLM allocates every layer's tensor)."""
    model, gpu = load_model("llama-3.1-8b"), load_gpu("h100-80gb")
    engine = make_engine(max_model_len=8192, num_gpu_blocks_override=10_000, speculative_config=eagle("eagle"))
    from kvsim.model.capacity import kv_pool_bytes

    assert kv_pool_bytes(model, gpu, engine) == 10_000 * 33 * PAGE


def test_the_targets_step_reads_its_own_32_layers_not_the_heads():
    """The head's KV layer is in the pool, but the target's attention reads 32 layers (the head's passes are
    priced by its own roofline): the target's step time is the same with and without EAGLE."""
    model, gpu = load_model("llama-3.1-8b"), load_gpu("h100-80gb")
    plain = RooflineLatency(model, gpu, make_engine(max_model_len=8192))
    drafting = RooflineLatency(model, gpu, make_engine(max_model_len=8192, speculative_config=eagle("eagle3")))
    assert drafting.kv_bytes_per_token == plain.kv_bytes_per_token == LAYERS * PAGE // 16
    plan = StepPlan()
    plan.add_decodes(64, 64 * 2000, 2000, 2000)
    assert drafting.step_time(plan) == plain.step_time(plan)


def test_the_simulated_engine_sizes_its_pool_with_the_head():
    scenario = load_scenario(overrides={"model": "llama-3.1-8b", "gpu": "h100-80gb", "engine.max_model_len": 8192,
                                        "engine.speculative_config": eagle("eagle")})
    spec = resolve_engine(scenario)
    assert spec.num_gpu_blocks == 26_741 and spec.bytes_per_block == 33 * PAGE


def test_capacity_prices_the_sequences_that_fit_with_their_drafts():
    """`concurrent_sequences` (and the USD per user-hour on it) took `paged_max_seqs` while speculating. EAGLE K = 3
    on Llama-3.1-8B / H100: 26,741 blocks, 26,740 usable beside vLLM's null block; 1,024 tokens + 3 drafts +
    3 lookahead = 1,030 slots, ceil(1030 / 16) = 65 blocks: 26,740 // 65 = 411 sequences (417 without drafts:
    26,740 // 64); $1 a GPU-hour over 411 of them."""
    result = CliRunner().invoke(app, ["capacity", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                                      "--max-model-len", "8192", "--context-lengths", "1024",
                                      "--speculative-config", json.dumps(eagle("eagle")),
                                      "--gpu-hourly-cost", "1", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    row = data["rows"][0]
    assert data["num_gpu_blocks"] == 26_741 and data["weights_bytes"] == TARGET_PARAMS * 2 + EAGLE_PARAMS * 2
    assert (row["paged_max_seqs"], row["blocks_per_seq_with_drafts"], row["paged_max_seqs_with_drafts"]) == \
        (417, 65, 411)
    assert row["concurrent_sequences"] == 411
    # to 4 significant digits: 0.002433, not 1 / 417's 0.002398 (to 4 decimals both printed 0.0024)
    assert row["usd_per_concurrent_user_hour"] == pytest.approx(1 / 411, rel=5e-4)
