"""Which attention layers slide, and by how much, as vLLM decides from a Hugging Face `config.json`.

The layer kinds a `layer_types` list names (`FULL`, `SLIDING`, `CHUNKED`), the families whose config gates or
shapes the window (`USE_SLIDING_WINDOW_TYPES`, `MAX_WINDOW_LAYERS_TYPES`, `PER_LAYER_WINDOW_TYPES`), and the
rules: `model_window` for a family with no attention pattern of its own (Llama, Mistral, Qwen, ...), `slide`
for the window each layer gets once a family's reader (`kvsim.model.families`) has said which layers slide.
Each sets a reader's `layer_types` and `sliding_window` fields only when some layer slides.
"""

from __future__ import annotations

from kvsim.model.errors import KvsimError
from kvsim.model.hf_config import Fields, HFConfig

FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"


USE_SLIDING_WINDOW_TYPES = frozenset({"qwen2", "qwen3", "qwen3_moe"})
"""Families whose Hugging Face config keeps `sliding_window` only when `use_sliding_window` is true
(transformers' Qwen2Config, Qwen3Config, Qwen3MoeConfig: `sliding_window if use_sliding_window else None`)."""
MAX_WINDOW_LAYERS_TYPES = frozenset({"qwen2", "qwen3"})
"""Families whose config derives `layer_types` from `max_window_layers` (transformers' Qwen2Config and
Qwen3Config: layer i slides when a window is set and i >= max_window_layers) and whose vLLM model refuses
a mix (vllm/model_executor/models/qwen2.py, Qwen2Model, also Qwen3Model's base: when
is_interleaved(hf_text_config), assert max_window_layers == num_hidden_layers)."""
PER_LAYER_WINDOW_TYPES = frozenset({"llama", "mistral", "phi3"})
"""Families served by vllm/model_executor/models/llama.py, whose LlamaAttention gives a layer that
`layer_types` calls sliding the config's `sliding_window` as its own (`per_layer_sliding_window`)."""


def model_window(c: HFConfig, fields: Fields) -> None:
    """Which layers slide, and by how much, in a family with no attention pattern of its own, as vLLM decides.

    vLLM gives every attention layer that names no window of its own the model-wide one,
    `CacheConfig.sliding_window` (vllm/attention/layer.py, Attention.__init__: per_layer_sliding_window,
    else cache_config.sliding_window), which vllm/engine/arg_utils.py (create_engine_config) sets to
    `ModelConfig.get_sliding_window()`, the config's `sliding_window`, unless `is_interleaved` (its
    `layer_types` hold more than one kind). A layer with a window gets a `SlidingWindowSpec`, whose blocks
    `SlidingWindowManager` frees once they leave the window. So Mistral-7B-v0.1 (`sliding_window` 4096, no
    `layer_types`) slides in all 32 layers; Qwen2.5 (`use_sliding_window` false) in none; a Qwen2 config with
    `use_sliding_window` true in all, even when `max_window_layers` = num_hidden_layers makes Hugging Face's
    `layer_types` all full (uniform, so not interleaved: the model-wide window reaches every layer).

    Sets `layer_types` and `sliding_window` when any layer slides; a config where none does is left full.
    `sliding_window` must be a positive integer or null, except where `use_sliding_window` is false: there
    Hugging Face drops it before vLLM reads it, so Qwen2.5's 131072 (or any value) is not checked.
    """
    model_type = c.get("model_type", "llama")
    n = fields["num_layers"]
    use = c.flag("use_sliding_window", False) if model_type in USE_SLIDING_WINDOW_TYPES else True
    window = c.count("sliding_window") if use and c.get("sliding_window") is not None else None
    hf_types = c.layer_list("layer_types", n, (FULL, SLIDING))
    max_window = c.whole("max_window_layers", 28) if model_type in MAX_WINDOW_LAYERS_TYPES else n
    if hf_types is None and model_type in MAX_WINDOW_LAYERS_TYPES:
        hf_types = [SLIDING if window is not None and i >= max_window else FULL for i in range(n)]
    interleaved = hf_types is not None and len(set(hf_types)) > 1
    if interleaved and max_window != n:
        raise KvsimError(f"model config {c.name}: max_window_layers={max_window}: vLLM serves a sliding window in "
                         f"every layer of a {model_type} model or in none (num_hidden_layers={n}); "
                         "set use_sliding_window=false or max_window_layers to num_hidden_layers")
    slide(fields, hf_types, window, per_layer=model_type in PER_LAYER_WINDOW_TYPES)


def slide(fields: Fields, hf_types: list[str] | None, window: int | None, per_layer: bool) -> None:
    """Each layer's window as vLLM gives it: a layer whose model code passes a window of its own
    (`per_layer`: `config.sliding_window` where `hf_types` says sliding) keeps it; every other layer takes
    the model-wide one, `CacheConfig.sliding_window`: the config's `sliding_window` unless `hf_types` mix
    kinds (`is_interleaved`, vllm/engine/arg_utils.py `create_engine_config`; vllm/attention/layer.py,
    Attention.__init__). Sets `layer_types` and `sliding_window` when any layer slides; else leaves the
    model full."""
    interleaved = hf_types is not None and len(set(hf_types)) > 1
    model_wide = None if interleaved else window
    if per_layer and hf_types is not None:
        windows = [window if kind == SLIDING else model_wide for kind in hf_types]
    else:
        windows = [model_wide] * fields["num_layers"]
    if any(w is not None for w in windows):
        fields["layer_types"] = [FULL if w is None else SLIDING for w in windows]
        fields["sliding_window"] = window


def config_window(c: HFConfig, hf_types: list[str]) -> int | None:
    """The config's `sliding_window`: required where a layer slides, else null or a positive integer."""
    if SLIDING in hf_types or c.get("sliding_window") is not None:
        return c.count("sliding_window")
    return None
