"""Model families from config.json: KV bytes by attention type and weights of MoE models.

Every expected number is derived here from the published config.json values (written out in
each test), not read from kvsim's output.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.model.capacity import (
    engine_weights_bytes,
    kv_bytes_per_block,
    kv_bytes_per_token,
    model_kv_layout,
)
from kvsim.model.capacity_plan import plan_capacity
from kvsim.model.config import PRESETS_DIR, load_gpu, load_model, model_from_hf_config
from kvsim.model.engine_config import make_engine
from kvsim.model.errors import KvsimError
from kvsim.model.weights import active_params_per_token

BF16 = 2


def gqa_moe_params(layers: int, h: int, heads: int, kv_heads: int, head_dim: int, experts: int,
                   expert_inter: int, vocab: int) -> tuple[int, int]:
    """(total parameters, one expert's) of an untied GQA model whose every layer is MoE, by hand:
    q, o = h · heads · hd; k, v = h · kv · hd; experts · 3 · h · I; router h · experts; 2 norms;
    embeddings and LM head; the final norm."""
    attn = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
    expert = 3 * h * expert_inter
    return layers * (attn + experts * expert + h * experts + 2 * h) + 2 * vocab * h + h, expert


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_deepseek_v3_mla_latent_per_token_not_split_by_tp() -> None:
    # deepseek-ai/DeepSeek-V3: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64, bf16 KV.
    per_token = 61 * (512 + 64) * BF16
    assert per_token == 70_272
    m = load_model("deepseek-v3")
    for tp in (1, 8):
        engine = make_engine(tensor_parallel_size=tp)
        assert kv_bytes_per_token(m, engine) == per_token  # one latent, replicated on every rank
        assert kv_bytes_per_block(m, engine) == per_token * 16
    assert kv_bytes_per_token(m, make_engine(kv_cache_dtype="fp8")) == 61 * 576
    # A dense-attention reading of the same config would be 2 · 61 · 128 heads · 56 · 2 B per token.
    assert per_token < 2 * 61 * 128 * (7168 // 128) * BF16 / 20


def test_deepseek_v3_weights_and_active_params() -> None:
    m = load_model("deepseek-v3")
    h, heads, layers = 7168, 128, 61
    attn = (h * 1536 + 1536 * heads * (128 + 64)  # q_a, q_b
            + h * (512 + 64) + 512 * heads * (128 + 128)  # kv_a, kv_b
            + heads * 128 * h)  # o
    dense = 3 * (3 * h * 18432)  # first_k_dense_replace = 3
    expert = 3 * h * 2048
    moe = 58 * (256 * expert + 1 * expert + h * 256)  # routed + shared + router
    embed, norms = 2 * 129280 * h, (2 * layers + 1) * h
    total = layers * attn + dense + moe + embed + norms
    assert m.num_params == total
    assert total == pytest.approx(671e9, rel=0.005)  # the model card's 671B (MTP layer excluded)
    assert active_params_per_token(m) == total - 58 * (256 - 8) * expert
    assert active_params_per_token(m) == pytest.approx(37e9, rel=0.02)
    # fp8 checkpoint: linear layers 1 byte, embeddings / router / norms in bf16.
    linear = layers * attn + dense + 58 * 257 * expert
    assert engine_weights_bytes(m, make_engine()) == linear + (embed + norms + 58 * h * 256) * BF16


def test_gemma3_hybrid_groups_and_block_bytes() -> None:
    # google/gemma-3-27b-it text_config: 62 layers, every 6th global, window 1024, 16 KV heads of 128.
    m = load_model("gemma-3-27b")
    per_layer_token = 2 * 16 * 128 * BF16
    full_layers = [i for i in range(62) if (i + 1) % 6 == 0]
    assert len(full_layers) == 10
    engine = make_engine(num_gpu_blocks_override=10_000, max_model_len=131072, max_num_batched_tokens=2048)
    layout = model_kv_layout(m, engine)
    # vLLM groups: group_size = min(52 sliding, 10 full) = 10 (52 >= 1.5 · 10); sliding layers
    # make cdiv(52, 10) = 6 groups, full layers 1 group.
    assert layout.group_size == 10
    assert sorted((g.kind, g.num_layers) for g in layout.groups) == sorted(
        [("sliding_window", n) for n in (9, 9, 9, 9, 8, 8)] + [("full", 10)])
    assert kv_bytes_per_token(m, engine) == 62 * per_layer_token
    assert kv_bytes_per_block(m, engine) == 10 * 16 * per_layer_token  # one page in each of 10 layers
    # vLLM's max concurrency: sliding groups need cdiv(1023 + 2048, 16) + 1 blocks, full cdiv(131072, 16).
    per_request = 6 * (cdiv(1024 - 1 + 2048, 16) + 1) + cdiv(131072, 16)
    plan = plan_capacity(m, load_gpu("h100-80gb"), engine, [4096])
    assert plan.max_concurrency == pytest.approx(10_000 / per_request)
    # A sequence decoding up to 4096 tokens: full group 256 blocks; each sliding group keeps the blocks of its
    # last 1024 tokens, which start mid-block at every length but the aligned one: at 4090, from
    # (4090 − 1024 + 1) // 16 = 191 up to 256, one more than the (4096 − 1024 + 1) // 16 = 192 of 4096 itself.
    assert plan.rows[0].blocks_per_seq == 256 + 6 * (256 - (4090 - 1024 + 1) // 16)
    kinds = {row.attention: row for row in plan.kv_types}
    assert kinds["sliding_window"].num_layers == 52 and kinds["sliding_window"].num_groups == 6
    assert kinds["full"].max_blocks_per_request == 8192


def test_gpt_oss_alternating_layers_and_mxfp4_experts() -> None:
    # openai/gpt-oss-120b: 36 layers alternating sliding (window 128) / full, 8 KV heads of 64,
    # 128 experts of 2880, top-4, hidden 2880, vocab 201088; experts MXFP4.
    m = load_model("gpt-oss-120b")
    per_layer_token = 2 * 8 * 64 * BF16
    engine = make_engine(num_gpu_blocks_override=10_000, max_model_len=131072, max_num_batched_tokens=2048)
    layout = model_kv_layout(m, engine)
    assert layout.group_size == 18 and len(layout.groups) == 2
    assert kv_bytes_per_token(m, engine) == 36 * per_layer_token
    assert kv_bytes_per_block(m, engine) == 18 * 16 * per_layer_token
    per_request = cdiv(128 - 1 + 2048, 16) + 1 + cdiv(131072, 16)
    assert layout.blocks_per_request(131072, 2048) == per_request
    total, expert = gqa_moe_params(36, 2880, 64, 8, 64, 128, 2880, 201088)
    assert m.num_params == total
    assert total == pytest.approx(116.8e9, rel=0.005)
    experts_bytes = 36 * 128 * expert * 17 // 32  # 4.25 bits each
    assert engine_weights_bytes(m, make_engine()) == experts_bytes + (total - 36 * 128 * expert) * BF16


def test_mixtral_weights_hold_every_expert() -> None:
    # mistralai/Mixtral-8x7B-v0.1: 32 layers, hidden 4096, 32 heads / 8 KV of 128, 8 experts of 14336, top-2.
    m = load_model("mixtral-8x7b")
    total, expert = gqa_moe_params(32, 4096, 32, 8, 128, 8, 14336, 32000)
    assert m.num_params == total
    assert total == pytest.approx(46.7e9, rel=0.005)
    assert active_params_per_token(m) == total - 32 * 6 * expert
    assert active_params_per_token(m) == pytest.approx(12.9e9, rel=0.01)
    assert engine_weights_bytes(m, make_engine()) == total * BF16
    assert kv_bytes_per_token(m, make_engine()) == 2 * 32 * 8 * 128 * BF16


def test_qwen3_30b_a3b_experts_and_expert_parallel_split() -> None:
    # Qwen/Qwen3-30B-A3B: 48 layers, hidden 2048, 32 heads / 4 KV of 128, 128 experts of 768, top-8.
    m = load_model("qwen3-30b-a3b")
    total, expert = gqa_moe_params(48, 2048, 32, 4, 128, 128, 768, 151936)
    experts = 48 * 128 * expert
    assert m.num_params == total
    assert total == pytest.approx(30.5e9, rel=0.005)
    assert active_params_per_token(m) == pytest.approx(3.3e9, rel=0.02)
    assert kv_bytes_per_token(m, make_engine()) == 2 * 48 * 4 * 128 * BF16
    # DP 2: each GPU keeps all non-expert weights and half the experts (whole experts with EP,
    # half of each expert's shards without: vLLM's MoE layers span the dp · tp GPUs either way).
    for ep in (True, False):
        engine = make_engine(data_parallel_size=2, enable_expert_parallel=ep)
        assert engine_weights_bytes(m, engine) == (total - experts) * BF16 + experts * BF16 // 2
    assert engine_weights_bytes(m, make_engine()) == total * BF16


def test_llama4_chunked_local_layers_and_disabling_the_hybrid_manager() -> None:
    # meta-llama/Llama-4-Scout: 48 layers, every 4th NoPE (global), others chunked local of 8192.
    m = load_model("llama-4-scout")
    layout = model_kv_layout(m, make_engine())
    assert sorted((g.kind, g.num_layers) for g in layout.groups) == [("chunked_local", 12)] * 3 + [("full", 12)]
    assert layout.blocks_per_request(131072, 2048) == 3 * cdiv(8192 + 2048, 16) + cdiv(131072, 16)
    unified = model_kv_layout(m, make_engine(disable_hybrid_kv_cache_manager=True))
    assert [(g.kind, g.num_layers) for g in unified.groups] == [("full", 48)]
    assert unified.bytes_per_block == 48 * 16 * 2 * 8 * 128 * BF16


def test_unknown_model_type_lists_supported_ones() -> None:
    with pytest.raises(KvsimError, match=r"model_type='falcon' is not supported \(supported: .*deepseek_v3.*"
                                         r"gpt_oss.*qwen3_moe"):
        model_from_hf_config({"model_type": "falcon", "hidden_size": 8}, "x")


def test_missing_family_field_is_named() -> None:
    raw = json.loads((PRESETS_DIR / "models" / "deepseek-v3.json").read_text())
    del raw["kv_lora_rank"]
    with pytest.raises(KvsimError, match=r"field 'kv_lora_rank' is missing \(needed for deepseek_v3\)"):
        model_from_hf_config(raw, "ds")
    raw = json.loads((PRESETS_DIR / "models" / "mixtral-8x7b.json").read_text())
    del raw["num_local_experts"]
    with pytest.raises(KvsimError, match="'num_local_experts' is missing"):
        model_from_hf_config(raw, "mx")


def test_cli_capacity_shows_the_per_type_breakdown() -> None:
    result = CliRunner().invoke(app, ["capacity", "--model", "gpt-oss-20b", "--gpu", "h100-80gb", "--max-model-len",
                                      "8192", "--num-gpu-blocks-override", "1000", "--max-num-batched-tokens", "2048",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    types = {row["attention"]: row for row in data["kv_types"]}
    # gpt-oss-20b: 24 layers, 12 sliding (window 128) + 12 full, 2 · 8 · 64 · 2 B per token per layer.
    assert types["sliding_window"]["num_layers"] == 12 and types["full"]["num_layers"] == 12
    assert types["sliding_window"]["max_blocks_per_request"] == cdiv(127 + 2048, 16) + 1
    assert types["full"]["max_bytes_per_request"] == cdiv(8192, 16) * 12 * 16 * 2048
    assert data["max_concurrency"] == pytest.approx(1000 / (cdiv(127 + 2048, 16) + 1 + 512))
    table = CliRunner().invoke(app, ["capacity", "--model", "gpt-oss-20b", "--max-model-len", "8192"])
    assert table.exit_code == 0 and "KV by attention type" in table.output


# google/gemma-2-9b-it config.json (model_type gemma2): 42 layers alternating a 4096-token window
# (layer 0 first) and global attention, 16 heads and 8 KV heads of head_dim 256, tied embeddings.
GEMMA2_9B = {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "hidden_size": 3584,
             "intermediate_size": 14336, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
             "num_hidden_layers": 42, "sliding_window": 4096, "max_position_embeddings": 8192,
             "vocab_size": 256000, "torch_dtype": "float32", "hidden_activation": "gelu_pytorch_tanh",
             "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
# microsoft/Phi-3-mini-4k-instruct config.json (model_type phi3): Llama's shapes, full MHA.
PHI3_MINI = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072,
             "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 32,
             "num_hidden_layers": 32, "max_position_embeddings": 4096, "vocab_size": 32064,
             "torch_dtype": "bfloat16", "tie_word_embeddings": False, "sliding_window": 2047,
             "_name_or_path": "Phi-3-mini-4k-instruct"}


def test_gemma2_alternates_sliding_and_global_layers_from_layer_0(tmp_path) -> None:
    folder = tmp_path / "gemma-2-9b-it"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GEMMA2_9B))
    m = load_model(str(folder / "config.json"))
    assert m.name == "gemma-2-9b-it"  # no _name_or_path: the folder names it, not "config"
    assert m.resolved_layer_types[:3] == ("sliding_attention", "full_attention", "sliding_attention")
    assert m.resolved_layer_types.count("full_attention") == 21 and m.sliding_window == 4096
    assert m.tie_word_embeddings and m.head_dim == 256
    engine = make_engine(max_model_len=8192)
    # every layer stores K and V; the float32 checkpoint is served in bfloat16, as vLLM's dtype=auto does
    assert m.dtype == "bfloat16" and kv_bytes_per_token(m, engine) == 42 * 2 * 8 * 256 * BF16
    kinds = {row.attention: row for row in plan_capacity(m, load_gpu("h100-80gb"), engine, [8192]).kv_types}
    assert kinds["sliding_window"].num_layers == 21 and kinds["full"].num_layers == 21
    # a config that says so directly wins, once no sliding_window is left: with one, vLLM gives it to every layer
    # as the model-level window (tests/test_gemma_uniform_layer_types.py)
    given = {**GEMMA2_9B, "layer_types": ["full_attention"] * 42, "sliding_window": None}
    assert set(model_from_hf_config(given, "g").resolved_layer_types) == {"full_attention"}


def test_a_float32_checkpoint_is_served_in_16_bits_as_vllm_auto_does() -> None:
    """vLLM's `--dtype auto`: float32 (or no torch_dtype) -> float16; Gemma -> bfloat16; others kept."""
    fields = {k: v for k, v in PHI3_MINI.items() if k != "torch_dtype"}
    assert model_from_hf_config(fields, "p").dtype == "float16"
    assert model_from_hf_config({**fields, "torch_dtype": "float32"}, "p").dtype == "float16"
    assert model_from_hf_config({**fields, "torch_dtype": "bfloat16"}, "p").dtype == "bfloat16"


def test_phi3_loads_as_llama_shaped_and_is_named_by_name_or_path(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(PHI3_MINI))
    m = load_model(str(path))
    assert m.name == "Phi-3-mini-4k-instruct"
    assert (m.num_layers, m.num_kv_heads, m.head_dim) == (32, 32, 3072 // 32)
    assert kv_bytes_per_token(m, make_engine(max_model_len=4096)) == 2 * 32 * 32 * 96 * BF16  # 384 KiB
    local = {**PHI3_MINI, "_name_or_path": "/data/checkpoints/phi3-ft/"}
    path.write_text(json.dumps(local))  # the same path, rewritten: read again, not the first file's cached spec
    assert load_model(str(path)).name == "phi3-ft"  # a local path: its last folder


MIXTRAL_NO_TYPE = {"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
                   "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                   "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}


def test_a_config_without_model_type_is_read_as_its_architectures_model():
    """Mixtral-8x7B's config.json less its model_type: vLLM builds MixtralForCausalLM from `architectures`, so
    its 8 experts (2 per token) of 14,336 stay in every one of the 32 layers (read as Llama, they were dropped)."""
    model = model_from_hf_config(MIXTRAL_NO_TYPE, "M")
    assert model.model_type == "mixtral"
    assert model.moe is not None
    assert (model.moe.num_experts, model.moe.num_experts_per_tok, model.moe.expert_intermediate_size,
            model.moe.num_moe_layers) == (8, 2, 14336, 32)


@pytest.mark.parametrize(("architectures", "model_type"), [
    (["MyOwnForCausalLM", "MixtralForCausalLM"], "mixtral"),  # an unknown class first: the next one
    (["MixtralForCausalLM", "LlamaForCausalLM"], "mixtral"),  # two known: the first
])
def test_several_architectures_are_read_as_the_first_known(architectures, model_type):
    """vLLM's `ModelRegistry.inspect_model_cls` tries a config's `architectures` in order and builds the first it
    supports; every class kvsim knows is the model_type one of its readers reads."""
    from kvsim.model.families import ARCHITECTURE_TYPES, READERS

    config = {**MIXTRAL_NO_TYPE, "architectures": architectures}
    assert model_from_hf_config(config, "M").model_type == model_type
    assert set(ARCHITECTURE_TYPES.values()) <= set(READERS)


@pytest.mark.parametrize("architectures", [None, [], ["BertModel"], "BertModel", {"MixtralForCausalLM": 1}])
def test_a_config_without_model_type_or_a_known_architecture_is_refused(tmp_path, architectures):
    """transformers' AutoConfig refuses a config without model_type ("Should have a `model_type` key"); kvsim
    infers nothing from a missing, empty or unknown `architectures`, or one neither a list nor a name (one name is
    read as a list of it, as vLLM's registry reads it), and names both fields."""
    from tests.conftest import one_line_exit_2

    config = {k: v for k, v in MIXTRAL_NO_TYPE.items() if k != "architectures"}
    if architectures is not None:
        config["architectures"] = architectures
    folder = tmp_path / "M"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    message = one_line_exit_2(["capacity", "--model", str(folder)])
    assert message.startswith(f"model config M: model_type is missing and architectures={architectures!r} names no "
                              "model kvsim reads (supported: ")


QWEN = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(("rope_scaling", "model_type", "max_len"), [
    (None, "qwen2", 32768),
    # Qwen2.5's model card: YaRN {factor 4, original 32,768} serves 4 x 32,768 = 131,072 tokens
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, "qwen2", 131072),
    ({"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16384}, "qwen2", 32768),  # older key
    ({"rope_type": "linear", "factor": 2.0}, "qwen2", 65536),  # 2 x 32,768
    ({"rope_type": "dynamic", "factor": 1.5}, "qwen2", 49152),  # 1.5 x 32,768
    # Llama 3.1's llama3 rope: its max_position_embeddings is the scaled length already
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, "llama", 32768),
    ({"rope_type": "linear", "factor": 8.0}, "gemma3_text", 32768),  # Gemma 3's 128K is scaled already
])
def test_the_default_max_model_len_is_vllm_s_derived_length(rope_scaling, model_type, max_len):
    """vLLM's `_get_and_verify_max_len`: max_position_embeddings x factor, a yarn one's from its original
    length; llama3/longrope/su and Gemma 3 unscaled. A max_model_len up to it is accepted, one past it refused."""
    extra = {} if model_type != "gemma3_text" else {"sliding_window": 1024, "sliding_window_pattern": 6}
    model = model_from_hf_config({**QWEN, "model_type": model_type, "rope_scaling": rope_scaling, **extra}, "M")
    assert make_engine().resolved_max_model_len(model) == max_len
    assert make_engine(max_model_len=max_len).resolved_max_model_len(model) == max_len
    with pytest.raises(KvsimError, match=f"max_model_len={max_len + 1}: exceeds M's max_position_embeddings"):
        make_engine(max_model_len=max_len + 1).resolved_max_model_len(model)


@pytest.mark.parametrize(("rope_scaling", "message"), [
    ("yarn", "rope_scaling='yarn': must be a mapping"),
    ({"rope_type": "linear", "factor": 0}, "rope_scaling.factor=0: must be a positive number"),
    ({"rope_type": "yarn", "factor": 4.0}, "rope_scaling.original_max_position_embeddings=None: a yarn"),
])
def test_a_bad_rope_scaling_is_named(rope_scaling, message):
    with pytest.raises(KvsimError, match=f"^model config M: {message}"):
        model_from_hf_config({**QWEN, "rope_scaling": rope_scaling}, "M")
