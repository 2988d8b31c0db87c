"""Model-wide sliding windows (Mistral-7B-v0.1, Phi-3, Qwen2 with use_sliding_window), as vLLM serves them.

vLLM gives each attention layer that names no window of its own `CacheConfig.sliding_window`
(vllm/attention/layer.py), set to the config's `sliding_window` unless the config's `layer_types` mix kinds
(vllm/engine/arg_utils.py, `is_interleaved`); such a layer gets a `SlidingWindowSpec` and its blocks are freed
by `SlidingWindowManager` once they leave the window. Hugging Face's Qwen2Config drops `sliding_window` when
`use_sliding_window` is false, and vLLM's Qwen2Model asserts `max_window_layers == num_hidden_layers` when the
layers mix. Every expected number below is worked out by hand from those rules and the published configs.
"""

from __future__ import annotations

from kvsim.model.capacity import model_kv_layout
from kvsim.model.config import load_model, make_engine, model_from_hf_config


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
