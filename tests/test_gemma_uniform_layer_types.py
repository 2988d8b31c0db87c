"""Gemma configs whose `layer_types` are all one kind, with a `sliding_window` set, as vLLM serves them.

vLLM's Gemma2Attention and Gemma3Attention (vllm/model_executor/models/gemma2.py, gemma3.py) pass
`per_layer_sliding_window=config.sliding_window` only where `config.layer_types[i] == "sliding_attention"`, and
None elsewhere; `Attention.__init__` (vllm/attention/layer.py) gives a layer with None the model-level window,
`cache_config.sliding_window`, which `create_engine_config` (vllm/engine/arg_utils.py) sets to the config's
`sliding_window` unless `is_interleaved(hf_text_config)` (its `layer_types` hold more than one kind). So all
`full_attention` layer_types with `sliding_window` 1024 is not interleaved: every layer slides 1024 tokens.
kvsim read it as full attention everywhere. Expected values by hand from google/gemma-3-27b-it's text_config
(62 layers, 16 KV heads of 128, bf16) and google/gemma-2-9b-it's config (42 layers, 8 KV heads of 256).
"""

from __future__ import annotations

import copy
import json

from kvsim.model.capacity import model_kv_layout
from kvsim.model.config import PRESETS_DIR, model_from_hf_config
from kvsim.model.engine_config import make_engine
from kvsim.model.kv_layout import KVGroup
from tests.test_families import GEMMA2_9B

GEMMA3_27B = json.loads((PRESETS_DIR / "models" / "gemma-3-27b.json").read_text())


def gemma3(layer_types: list[str], sliding_window: int | None) -> dict:
    raw = copy.deepcopy(GEMMA3_27B)
    raw["text_config"] |= {"layer_types": layer_types, "sliding_window": sliding_window}
    return raw


def test_gemma3_all_full_layer_types_with_a_window_slide_in_every_layer():
    """One group of 62 sliding layers (window 1024), pages 2 · 16 · 16 · 128 · 2 = 131,072 B: a block id is 62
    pages, 8,126,464 B. At max_model_len 8192 and 2048 batched tokens a request holds at most
    cdiv(min(1023 + 2048, 8192), 16) + 1 = 193 blocks (SlidingWindowSpec.max_memory_usage_bytes), not 512."""
    m = model_from_hf_config(gemma3(["full_attention"] * 62, 1024), "g3")
    assert set(m.resolved_layer_types) == {"sliding_attention"} and m.sliding_window == 1024
    layout = model_kv_layout(m, make_engine(max_model_len=8192, max_num_batched_tokens=2048))
    assert layout.groups == (KVGroup("sliding_window", 62, 1024),)
    assert layout.bytes_per_block == 62 * 131_072 == 8_126_464
    assert layout.blocks_per_request(8192, 2048) == 193


def test_gemma3_all_full_layer_types_without_a_window_stay_full():
    """`sliding_window: null`: no model-level window, nothing slides (and no window is required)."""
    m = model_from_hf_config(gemma3(["full_attention"] * 62, None), "g3")
    assert m.layer_types is None and m.sliding_window is None


def test_gemma3_mixed_layer_types_keep_their_global_layers():
    """The published 5:1 pattern is interleaved: the model-level window is None, the 10 global layers stay full."""
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(62)]
    m = model_from_hf_config(gemma3(types, 1024), "g3")
    assert m.resolved_layer_types.count("full_attention") == 10


def test_gemma2_all_full_layer_types_with_a_window_slide_in_every_layer():
    m = model_from_hf_config({**GEMMA2_9B, "layer_types": ["full_attention"] * 42}, "g2")
    assert set(m.resolved_layer_types) == {"sliding_attention"} and m.sliding_window == 4096
    assert model_kv_layout(m, make_engine(max_model_len=8192)).groups == (KVGroup("sliding_window", 42, 4096),)
