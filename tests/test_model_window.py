"""Model-wide sliding windows (Mistral-7B-v0.1, Phi-3, Qwen2 with use_sliding_window), as vLLM serves them.

vLLM gives each attention layer that names no window of its own `CacheConfig.sliding_window`
(vllm/attention/layer.py), set to the config's `sliding_window` unless the config's `layer_types` mix kinds
(vllm/engine/arg_utils.py, `is_interleaved`); such a layer gets a `SlidingWindowSpec` and its blocks are freed
by `SlidingWindowManager` once they leave the window. Hugging Face's Qwen2Config drops `sliding_window` when
`use_sliding_window` is false, and vLLM's Qwen2Model asserts `max_window_layers == num_hidden_layers` when the
layers mix. Every expected number below is worked out by hand from those rules and the published configs.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.model.capacity import model_kv_layout
from kvsim.model.config import PRESETS_DIR, load_model, model_from_hf_config
from kvsim.model.engine_config import make_engine
from kvsim.model.errors import KvsimError

MISTRAL = json.loads((PRESETS_DIR / "models" / "mistral-7b.json").read_text())
QWEN25 = json.loads((PRESETS_DIR / "models" / "qwen2.5-7b.json").read_text())


def kinds(raw: dict) -> set[tuple[str, int | None]]:
    m = model_from_hf_config(raw, "m")
    return {(t, m.sliding_window if t == "sliding_attention" else None) for t in m.resolved_layer_types}


def test_the_hybrid_manager_off_keeps_a_window_every_layer_shares() -> None:
    """vLLM's unify_hybrid_kv_cache_specs returns when every layer has one spec: only a mix of kinds is turned
    into full attention. A Gemma 2 config whose layer_types are all sliding (window 4096) keeps one sliding group
    of 42 layers with --disable-hybrid-kv-cache-manager; kvsim made it full attention."""
    gemma2 = {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42, "sliding_window": 4096,
              "max_position_embeddings": 8192, "vocab_size": 256000, "layer_types": ["sliding_attention"] * 42}
    m = model_from_hf_config(gemma2, "g")
    for unhybrid in (False, True):
        layout = model_kv_layout(m, make_engine(max_model_len=8192, disable_hybrid_kv_cache_manager=unhybrid))
        assert [(g.kind, g.num_layers, g.window_tokens) for g in layout.groups] == [("sliding_window", 42, 4096)]
        assert "sliding_window null" in layout.full_attention_advice
    mixed = model_kv_layout(load_model("gpt-oss-20b"), make_engine(max_model_len=8192))
    assert mixed.full_attention_advice.startswith("set engine.disable_hybrid_kv_cache_manager=true")


def test_mistral_7b_v0_1_slides_4096_tokens_in_every_layer() -> None:
    """Mistral-7B-v0.1 (32 layers, 8 KV heads of 128, bf16, sliding_window 4096, no layer_types): one group of
    32 sliding layers. SlidingWindowSpec.max_memory_usage_bytes allows cdiv(min(4096 − 1 + 2048, 32768), 16) + 1
    = 385 blocks a request, not full attention's cdiv(32768, 16) = 2048; a request at 32,768 tokens keeps
    tokens [32768 − 4096, 32768): blocks 1792 to 2047, 256 blocks."""
    m = load_model("mistral-7b")
    assert set(m.resolved_layer_types) == {"sliding_attention"} and m.sliding_window == 4096
    engine = make_engine(max_model_len=32768, max_num_batched_tokens=2048)
    layout = model_kv_layout(m, engine)
    assert [(g.kind, g.num_layers, g.window_tokens) for g in layout.groups] == [("sliding_window", 32, 4096)]
    assert layout.bytes_per_block == 2 * 16 * 8 * 128 * 2 * 32  # K and V, 16 tokens, 8 heads of 128, bf16, 32 layers
    assert layout.blocks_per_request(32768, 2048) == 385
    assert layout.live_blocks(32768) == 256
    # The hybrid manager off leaves a model of one spec as it is (unify_hybrid_kv_cache_specs returns early).
    unhybrid = make_engine(max_model_len=32768, max_num_batched_tokens=2048, disable_hybrid_kv_cache_manager=True)
    assert model_kv_layout(m, unhybrid).groups == layout.groups


def test_a_32k_prompt_runs_in_400_blocks_holding_at_most_the_window_and_a_chunk() -> None:
    """One 32,000-token prompt in chunks of 2048 with 400 blocks (399 usable beside vLLM's null block), which
    full attention could not hold (2000 blocks). Before a chunk at c computed tokens (c a multiple of 2048)
    SlidingWindowManager frees the blocks before token c − 4095, block (c − 4095) // 16 = c/16 − 256, and the
    chunk takes the table to cdiv(c + 2048, 16) = c/16 + 128: 384 blocks at most, usage 384 / 399."""
    import kvsim

    for unhybrid in (False, True):
        raw = {"model": "mistral-7b",
               "engine": {"max_model_len": 32768, "max_num_batched_tokens": 2048, "num_gpu_blocks_override": 400,
                          "disable_hybrid_kv_cache_manager": unhybrid},
               "workload": {"num_requests": 1, "arrival": {"process": "poisson", "rate": 5},
                            "prompt_len": {"dist": "fixed", "value": 32000}, "output_len": {"dist": "fixed", "value": 64}},
               "latency": {"model": "constant"}}
        summary = kvsim.simulate(raw, check=True).summary
        assert summary["num_finished"] == 1 and summary["num_preemptions"] == 0
        assert summary["kv_cache_usage_perc"]["max"] == pytest.approx(384 / 399, rel=1e-12)


def test_a_config_without_a_window_stays_full_attention() -> None:
    """Mistral-7B-Instruct-v0.2 publishes sliding_window null; Mixtral-8x7B-v0.1 too."""
    assert kinds({**MISTRAL, "sliding_window": None}) == {("full_attention", None)}
    assert load_model("mixtral-8x7b").layer_types is None


def test_phi3_mini_4k_slides_2047_tokens_and_llama_layer_types_pick_the_sliding_layers() -> None:
    """Phi-3-mini-4k-instruct (sliding_window 2047) is served by vLLM's llama.py: every layer slides. Where a
    Llama-family config's layer_types mix kinds, LlamaAttention gives the sliding ones the config's window and
    the model-wide window is off (interleaved); where they are all full, the model-wide window reaches every
    layer (no per-layer window, so CacheConfig.sliding_window)."""
    phi3 = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
            "num_hidden_layers": 32, "max_position_embeddings": 4096, "vocab_size": 32064, "sliding_window": 2047}
    assert kinds(phi3) == {("sliding_attention", 2047)}
    mixed = {**MISTRAL, "layer_types": ["sliding_attention", "full_attention"] * 16}
    m = model_from_hf_config(mixed, "m")
    assert m.resolved_layer_types[:2] == ("sliding_attention", "full_attention") and m.sliding_window == 4096
    assert m.resolved_layer_types.count("sliding_attention") == 16
    assert kinds({**MISTRAL, "layer_types": ["full_attention"] * 32}) == {("sliding_attention", 4096)}


def test_qwen2_5_is_full_attention_and_use_sliding_window_decides_as_in_vllm() -> None:
    """Qwen2.5-7B: use_sliding_window false, so Hugging Face drops its 131072 window: full attention. With it true
    and max_window_layers 28 of 28, Hugging Face's layer_types are all full (a layer slides from index 28), not
    interleaved, so vLLM's model-wide window reaches all 28 layers; max_window_layers 0 makes them all sliding
    anyway; 14 mixes them, which vLLM's Qwen2Model refuses."""
    assert load_model("qwen2.5-7b").layer_types is None
    assert kinds({**QWEN25, "use_sliding_window": True}) == {("sliding_attention", 131072)}
    assert kinds({**QWEN25, "use_sliding_window": True, "max_window_layers": 0}) == {("sliding_attention", 131072)}
    with pytest.raises(KvsimError, match=r"^model config m: max_window_layers=14: .*num_hidden_layers=28"):
        model_from_hf_config({**QWEN25, "use_sliding_window": True, "max_window_layers": 14}, "m")
    # Never read when use_sliding_window is false (Hugging Face sets it to None first).
    assert kinds({**QWEN25, "sliding_window": "x"}) == {("full_attention", None)}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("sliding_window", -1, "sliding_window=-1: must be > 0"),
    ("sliding_window", 0, "sliding_window=0: must be > 0"),
    ("sliding_window", "4096", "sliding_window='4096': must be a positive integer"),
    ("sliding_window", 4096.5, "sliding_window=4096.5: must be a positive integer"),
    ("use_sliding_window", "yes", "use_sliding_window='yes': must be true or false"),
])
def test_a_bad_window_is_one_line_naming_the_field(field: str, value: object, message: str) -> None:
    raw = MISTRAL if field == "sliding_window" else QWEN25
    with pytest.raises(KvsimError) as refused:
        model_from_hf_config({**raw, field: value}, "m")
    assert str(refused.value) == f"model config m: {message}"


def test_cli_refuses_a_bad_window_with_exit_2_and_one_line(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MISTRAL, "sliding_window": "x"}))
    result = CliRunner().invoke(app, ["capacity", "--model", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "sliding_window='x': must be a positive integer" in result.output


def test_a_refused_all_sliding_model_is_not_told_to_disable_the_hybrid_manager() -> None:
    """The slab allocator keeps no windows; for gpt-oss (sliding and full layers) vLLM's flag makes every layer
    full, but Mistral-7B-v0.1's one sliding spec survives the flag, so the refusal names the config instead."""
    import kvsim

    raw = {"model": "mistral-7b", "engine": {"allocator": "slab-max", "scheduler": "v0", "max_model_len": 4096,
                                             "disable_hybrid_kv_cache_manager": True},
           "workload": {"num_requests": 1, "prompt_len": {"dist": "fixed", "value": 8},
                        "output_len": {"dist": "fixed", "value": 8}},
           "latency": {"model": "constant"}}
    with pytest.raises(KvsimError) as refused:
        kvsim.simulate(raw)
    message = str(refused.value)
    assert "\n" not in message and "sliding_window null" in message and "=true" not in message
    with pytest.raises(KvsimError) as refused:
        kvsim.simulate({**raw, "model": "gpt-oss-20b"}, engine__disable_hybrid_kv_cache_manager=False)
    assert "set engine.disable_hybrid_kv_cache_manager=true" in str(refused.value)


def test_a_windowed_config_of_too_many_layers_is_refused_as_num_layers() -> None:
    """Mistral's config with num_hidden_layers 10**12: the window's per-layer kinds (10**12 entries) were a
    MemoryError before ModelSpec could refuse num_layers above 2**16."""
    with pytest.raises(KvsimError, match=r"^model m\.num_layers=1000000000000: Input should be less than or equal to 65536$"):
        model_from_hf_config({**MISTRAL, "num_hidden_layers": 10**12}, "m")
