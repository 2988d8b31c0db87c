"""A separate draft model (`speculative_config.method: draft_model`) takes its weights out of the budget and adds its own
KV layers, of its own shape, to every block, as vLLM v1 sizes the pool.

vLLM: `DraftModelProposer.load_model` (vllm/v1/spec_decode/draft_model.py) loads the draft into the target's
`VllmConfig`, so its attention layers get KV specs beside the target's (`GPUModelRunner.get_kv_cache_spec`), and
its weights load in `GPUModelRunner.load_model` before the pool is sized. The draft's specs differ from the
target's (other heads), but all are full attention of one block size, so `get_kv_cache_groups` makes one group
(`UniformTypeKVCacheSpecs.from_specs`) whose page is the sum of every layer's page, and
`get_kv_cache_config_from_groups` gives `available_memory // page_size_bytes` blocks. The draft model's config is
built with the target's dtype (vllm/config/speculative.py: `dtype=self.target_model_config.dtype`).

Expected values by hand from the published config.json files: Llama-3.1-8B (32 layers, 8 KV heads of 128)
and Llama-3.2-1B (16 layers, hidden 2048, 32 heads, 8 KV heads of 64, MLP 8192, vocab 128,256, tied
embeddings: 1,235,814,400 parameters), on the H100 preset; `POOL` is tests/test_drafter_memory.py's pool without
a drafter, 58,336,049,561 B.
"""

import json

import pytest

from kvsim.engine.builder import resolve_engine
from kvsim.model.capacity import engine_weights_bytes, model_kv_layout, num_gpu_blocks
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import make_engine
from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import load_scenario
from tests.test_drafter_memory import PAGE, POOL, TARGET_PARAMS

LLAMA_3_2_1B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
                "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "tie_word_embeddings": True,
                "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-05}
# embeddings 128,256 · 2048 (tied) + 16 · (attention 2 · 2048² + 2 · 2048 · 512 + MLP 3 · 2048 · 8192 + 2 norms)
# + the final norm
DRAFT_PARAMS = 128_256 * 2048 + 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048) + 2048
DRAFT_PAGE = 2 * 16 * 8 * 64 * 2  # one draft layer's block of 16 tokens: 32,768 B


@pytest.fixture
def draft(tmp_path):
    path = tmp_path / "llama-3.2-1b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA_3_2_1B))
    return str(path)


def config(draft_path):
    return {"method": "draft_model", "model": draft_path, "num_speculative_tokens": 4, "acceptance_length": 2.5}


def test_the_published_draft_size():
    assert DRAFT_PARAMS == 1_235_814_400


def test_llama_8b_with_a_1b_draft_model_on_h100(draft):
    """Block bytes: 32 target pages of 65,536 + 16 draft pages of 32,768 = 2,621,440. Pool: 58,336,049,561 −
    the draft's 2,471,628,800 bf16 bytes = 55,864,420,761; 55,864,420,761 // 2,621,440 = 21,310 blocks (27,816
    without the draft)."""
    model, gpu = load_model("llama-3.1-8b"), load_gpu("h100-80gb")
    engine = make_engine(max_model_len=8192, speculative_config=config(draft))
    assert engine_weights_bytes(model, engine) == (TARGET_PARAMS + DRAFT_PARAMS) * 2
    layout = model_kv_layout(model, engine)
    assert len(layout.groups) == 1 and layout.groups[0].num_layers == 32
    assert layout.bytes_per_block == 32 * PAGE + 16 * DRAFT_PAGE == 2_621_440
    assert layout.bytes_per_token == 2_621_440 // 16
    assert num_gpu_blocks(model, gpu, engine) == (POOL - DRAFT_PARAMS * 2) // 2_621_440 == 21_310


def test_the_draft_is_loaded_in_the_targets_dtype_and_split_by_tensor_parallelism(draft):
    """A float32 config.json is still loaded in bf16 (the target's dtype). TP 2: both models' weights halved
    (the draft's 1,235,814,400 params are even), each layer's KV heads 8 → 4."""
    path = draft.replace("config.json", "f32.json")
    with open(path, "w") as f:
        json.dump({**LLAMA_3_2_1B, "torch_dtype": "float32"}, f)
    model = load_model("llama-3.1-8b")
    engine = make_engine(max_model_len=8192, tensor_parallel_size=2, speculative_config=config(path))
    assert engine_weights_bytes(model, engine) == (TARGET_PARAMS + DRAFT_PARAMS) * 2 // 2
    assert model_kv_layout(model, engine).bytes_per_block == (32 * PAGE + 16 * DRAFT_PAGE) // 2


def test_the_simulated_engine_sizes_its_pool_with_the_draft_model(draft):
    scenario = load_scenario(overrides={"model": "llama-3.1-8b", "gpu": "h100-80gb", "engine.max_model_len": 8192,
                                        "engine.speculative_config": config(draft)})
    spec = resolve_engine(scenario)
    assert spec.num_gpu_blocks == 21_310 and spec.bytes_per_block == 2_621_440


def test_a_draft_model_beside_sliding_window_layers_is_refused(draft):
    """Gemma-3-27B mixes sliding and full layers: vLLM would unify page sizes by growing block sizes. (The draft
    is given Gemma's vocabulary: one of another is refused first, as vLLM refuses it.)"""
    path = draft.replace("config.json", "gemma-vocab.json")
    with open(path, "w") as f:
        json.dump({**LLAMA_3_2_1B, "vocab_size": 262_208}, f)
    engine = make_engine(max_model_len=8192, speculative_config=config(path))
    with pytest.raises(KvsimError, match=r"^engine.speculative_config.model=.*not modelled$"):
        model_kv_layout(load_model("gemma-3-27b"), engine)
