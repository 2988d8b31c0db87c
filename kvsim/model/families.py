"""Model families: reading a Hugging Face `config.json` into the fields `ModelSpec` validates.

One reader per `model_type`; each names the family's own keys (DeepSeek's `n_routed_experts`,
Mixtral's `num_local_experts`, Gemma 3's nested `text_config`, ...) and states which layers
are sliding-window, chunked-local or MLA, and which carry a mixture of experts, the way
vLLM's model file for that family decides it (cited per reader). A key that matters and is
missing raises `KvsimError` naming it; an unknown `model_type` lists the supported ones.

Pure data: no pydantic models are built here (config.py validates), so this module imports
nothing from kvsim but the error type and the layer bound `ModelSpec` enforces.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvsim.model.errors import KvsimError, shown
from kvsim.model.spec import MAX_LAYERS, one_line_label

Fields = dict[str, Any]

FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"


class _Config:
    """A `config.json` mapping whose missing keys are reported as one line naming the key."""

    def __init__(self, raw: dict[str, Any], name: str) -> None:
        self.raw, self.name = raw, name

    def need(self, key: str) -> Any:
        value = self.raw.get(key)
        if value is None:
            family = self.raw.get("model_type", "?")
            raise KvsimError(f"model config {self.name}: field {key!r} is missing (needed for {family})")
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self.raw.get(key)
        return default if value is None else value

    def count(self, key: str, default: int | None = None) -> int:
        """A positive integer field; only a missing (or null) key takes `default` (None: required).

        0 is refused, never read as "missing": `num_key_value_heads: 0` is not full MHA.
        """
        value = self.raw.get(key)
        if value is None:
            return self.need(key) if default is None else default
        if isinstance(value, bool) or not isinstance(value, int):
            raise KvsimError(f"model config {self.name}: {key}={value!r}: must be a positive integer")
        if value <= 0:
            raise KvsimError(f"model config {self.name}: {key}={value}: must be > 0")
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A true/false field; missing (or null) is `default`. JSON's true or false only: pydantic read the text
        "no" or "false" as False, where Hugging Face's `if config.tie_word_embeddings:` takes any text as true."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise KvsimError(f"model config {self.name}: {key}={shown(value)}: must be true or false")
        return value

    def whole(self, key: str, default: int = 0) -> int:
        """A whole number >= 0 (`first_k_dense_replace`, `n_shared_experts`); missing is `default`."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise KvsimError(f"model config {self.name}: {key}={shown(value)}: must be a whole number >= 0")
        return value

    def layer_list(self, key: str, num_layers: int, allowed: tuple[Any, ...]) -> list[Any] | None:
        """A per-layer list of `num_layers` entries, each one of `allowed`; missing is None."""
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != num_layers or not all(
                type(v) is type(allowed[0]) and v in allowed for v in value):
            raise KvsimError(f"model config {self.name}: {key}={shown(value)}: must list {num_layers} entries "
                             f"(num_hidden_layers), each {' or '.join(repr(a) for a in allowed)}")
        return value

    def layer_indices(self, key: str) -> set[int]:
        """A list of layer numbers (e.g. `mlp_only_layers`); missing is empty."""
        value = self.get(key, [])
        if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            raise KvsimError(f"model config {self.name}: {key}={value!r}: must be a list of layer numbers")
        return set(value)

    def text_part(self) -> _Config:
        """The config with a multimodal checkpoint's `text_config` (if any) laid over it."""
        text = self.raw.get("text_config")
        if text is None:
            return self
        if not isinstance(text, dict):
            raise KvsimError(f"model config {self.name}: text_config={text!r}: must be a mapping")
        return _Config({**self.raw, **text}, self.name)


def _dense(c: _Config, *, is_opt: bool = False) -> Fields:
    """The fields every decoder has (Llama/Mistral/Qwen2/Qwen3/OPT names)."""
    hidden, heads = c.count("hidden_size"), c.count("num_attention_heads")
    if c.get("head_dim") is None and hidden % heads:  # hidden // heads would drop the rest (or be 0)
        raise KvsimError(f"model config {c.name}: hidden_size={hidden} is not a multiple of "
                         f"num_attention_heads={heads} and no head_dim is given")
    return {
        "model_type": c.get("model_type", "llama"),
        "num_layers": _num_layers(c),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": c.count("num_key_value_heads", heads),
        "head_dim": c.count("head_dim", hidden // heads),
        "intermediate_size": c.count("ffn_dim") if is_opt else c.count("intermediate_size"),
        "vocab_size": c.count("vocab_size"),
        "max_position_embeddings": _derived_max_len(c),
        "dtype": _served_dtype(c),
        "gated_mlp": not is_opt,
        "tie_word_embeddings": c.flag("tie_word_embeddings", is_opt),
        "weight_quant": _weight_quant(c),
    }


def _derived_max_len(c: _Config) -> int:
    """The longest context vLLM serves the model at (`_get_and_verify_max_len` in vllm/config): the config's
    `max_position_embeddings` (2,048 where missing), times `rope_scaling`'s `factor` unless its type (`rope_type`,
    or the older `type`) is llama3, longrope or su, a yarn one's from its `original_max_position_embeddings`;
    a Gemma 3's is left unscaled (its 128K is scaled already). Llama 3.1's llama3 rope keeps 131,072; a Qwen
    config given YaRN {factor 4, original 32,768} serves 131,072. Not modelled: longrope's shorter default
    (vLLM defaults to `original_max_position_embeddings` there yet accepts up to this), and the other length
    keys vLLM takes the least of (`n_positions`, `max_seq_len`, ...)."""
    length = c.count("max_position_embeddings", 2048)
    scaling = c.get("rope_scaling")
    if scaling is None or "gemma3" in str(c.get("model_type", "")):
        return length
    if not isinstance(scaling, dict):
        raise KvsimError(f"model config {c.name}: rope_scaling={shown(scaling)}: must be a mapping")
    rope_type = scaling.get("rope_type", scaling.get("type"))
    legacy = scaling.get("type", rope_type)
    if legacy != rope_type and (legacy, rope_type) not in _LEGACY_ROPE_TYPES:
        raise KvsimError(f"model config {c.name}: rope_scaling.rope_type={shown(rope_type)} and its legacy "
                         f"type={shown(legacy)} disagree (vLLM refuses both); give one of them")
    if rope_type in ("llama3", "longrope", "su"):
        return length
    factor = _positive_number(c, "factor", scaling.get("factor", 1.0))
    base: float = length
    if rope_type == "yarn":  # vLLM multiplies it as it is, an integral float (32768.0) included
        original = scaling.get("original_max_position_embeddings")
        base = _positive_number(c, "original_max_position_embeddings", original, "a yarn one needs it, ")
    try:
        scaled = base * factor
    except OverflowError:  # an int past a float's range (max_position_embeddings of 401 digits) times a float
        scaled = math.inf
    if scaled == math.inf:  # a float's (an int times an int is exact): int() of it was an OverflowError traceback
        raise KvsimError(f"model config {c.name}: rope_scaling.factor={shown(factor)}: the context length it scales "
                         f"({shown(base)}) times it is past a float's range")
    return int(scaled)


# The (legacy `type`, `rope_type`) pairs of different names that vLLM's `patch_rope_parameters_dict` lets stand.
_LEGACY_ROPE_TYPES = {("su", "longrope"), ("mrope", "default")}


def _positive_number(c: _Config, key: str, value: Any, need: str = "") -> float:
    """`rope_scaling[key]`, a positive finite number (int or float, as vLLM multiplies it), else `KvsimError`
    (`need` says why it must be there)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise KvsimError(f"model config {c.name}: rope_scaling.{key}={shown(value)}: {need}must be a positive number")
    return value


def _num_layers(c: _Config) -> int:
    """`num_hidden_layers`, a count ("32", text, is refused, as vLLM's range() would) of at most `MAX_LAYERS`,
    refused here as `ModelSpec` refuses it, before a family's per-layer lists: Gemma's, Llama 4's and DeepSeek's
    lists of 10**30 entries ran out of memory (a MemoryError, or the process killed)."""
    n = c.count("num_hidden_layers")
    if n > MAX_LAYERS:
        raise KvsimError(f"model {c.name}.num_layers={n}: Input should be less than or equal to {MAX_LAYERS}")
    return n


def _served_dtype(c: _Config) -> str:
    """The dtype vLLM serves with `--dtype auto`: the checkpoint's, except that a float32 (or unstated)
    checkpoint runs in float16, and a Gemma one in bfloat16 (vLLM's `_get_and_verify_dtype`)."""
    dtype = c.get("torch_dtype") or c.get("dtype") or "float32"
    if dtype != "float32":
        return str(dtype)
    return "bfloat16" if str(c.get("model_type", "")).startswith("gemma") else "float16"


def _weight_quant(c: _Config) -> str | None:
    """`fp8` (DeepSeek-V3's block-fp8 checkpoint) or `mxfp4` (gpt-oss's experts); None otherwise."""
    quant = c.get("quantization_config") or {}
    if not isinstance(quant, dict):  # read as no quantization: the weights counted at the served dtype
        raise KvsimError(f"model config {c.name}: quantization_config={shown(quant)}: must be a mapping")
    method = quant.get("quant_method")
    if method is None:
        return None
    if method in ("fp8", "mxfp4"):
        return str(method)
    raise KvsimError(f"model config {c.name}: quantization_config.quant_method={method!r}: "
                     "kvsim knows fp8 and mxfp4 (or none)")


def _llama(c: _Config) -> Fields:
    """Llama, Mistral, Phi-3, Qwen2 and Qwen3: dense, with vLLM's model-wide sliding window (`_model_window`)."""
    fields = _dense(c)
    _model_window(c, fields)
    return fields


def _opt(c: _Config) -> Fields:
    return _dense(c, is_opt=True)


def _qwen3_moe(c: _Config) -> Fields:
    """Qwen3-MoE: a layer is MoE unless listed in `mlp_only_layers`, every `decoder_sparse_step`-th
    layer (vllm/model_executor/models/qwen3_moe.py, Qwen3MoeDecoderLayer)."""
    fields = _dense(c)
    step = c.count("decoder_sparse_step", 1)
    dense_only = c.layer_indices("mlp_only_layers")
    moe_layers = [i for i in range(fields["num_layers"]) if i not in dense_only and (i + 1) % step == 0]
    fields["moe"] = {
        "num_experts": c.need("num_experts"),
        "num_experts_per_tok": c.need("num_experts_per_tok"),
        "expert_intermediate_size": c.need("moe_intermediate_size"),
        "num_moe_layers": len(moe_layers),
    }
    _model_window(c, fields)
    return fields


def _mixtral(c: _Config) -> Fields:
    """Mixtral: every layer MoE, experts of `intermediate_size` (vllm/model_executor/models/mixtral.py)."""
    fields = _dense(c)
    fields["moe"] = {
        "num_experts": c.need("num_local_experts"),
        "num_experts_per_tok": c.need("num_experts_per_tok"),
        "expert_intermediate_size": fields["intermediate_size"],
        "num_moe_layers": fields["num_layers"],
    }
    _model_window(c, fields)
    return fields


def _deepseek(c: _Config) -> Fields:
    """DeepSeek-V2/V3: MLA in every layer; layer i is MoE when i >= first_k_dense_replace and
    i % moe_layer_freq == 0, with `n_shared_experts` shared experts of `moe_intermediate_size`
    (vllm/model_executor/models/deepseek_v2.py, DeepseekV2DecoderLayer). The MTP layers
    (`num_nextn_predict_layers`) are loaded only for speculative decoding and are not counted."""
    fields = _dense(c)
    n = fields["num_layers"]
    first_dense, freq = c.whole("first_k_dense_replace"), c.count("moe_layer_freq", 1)
    moe_layers = [i for i in range(n) if i >= first_dense and i % freq == 0]
    expert = c.count("moe_intermediate_size")  # a count: `n_shared_experts * {...}` was a bare TypeError
    fields["moe"] = {
        "num_experts": c.need("n_routed_experts"),
        "num_experts_per_tok": c.need("num_experts_per_tok"),
        "expert_intermediate_size": expert,
        "shared_expert_intermediate_size": c.whole("n_shared_experts") * expert,
        "num_moe_layers": len(moe_layers),
    }
    fields["mla"] = {
        "kv_lora_rank": c.need("kv_lora_rank"),
        "qk_rope_head_dim": c.need("qk_rope_head_dim"),
        "qk_nope_head_dim": c.need("qk_nope_head_dim"),
        "v_head_dim": c.need("v_head_dim"),
        "q_lora_rank": c.get("q_lora_rank"),
    }
    return fields


def _gpt_oss(c: _Config) -> Fields:
    """gpt-oss: `layer_types` alternates sliding (window `sliding_window`) and full attention; every
    layer MoE with `num_local_experts` experts of `intermediate_size`; experts in MXFP4
    (vllm/model_executor/models/gpt_oss.py: sliding_window only where layer_types says so)."""
    fields = _dense(c)
    fields["layer_types"] = _layer_types(c, fields["num_layers"])
    fields["sliding_window"] = c.need("sliding_window")
    fields["moe"] = {
        "num_experts": c.need("num_local_experts"),
        "num_experts_per_tok": c.get("num_experts_per_tok") or c.need("experts_per_token"),
        "expert_intermediate_size": fields["intermediate_size"],
        "num_moe_layers": fields["num_layers"],
    }
    return fields


def _gemma3(c: _Config) -> Fields:
    """Gemma 3 (text part; multimodal checkpoints nest it in `text_config`): local layers use a
    `sliding_window` window, every `sliding_window_pattern`-th layer is global, or `layer_types`
    says so directly (vllm/model_executor/models/gemma3.py, Gemma3Attention.is_sliding). `layer_types`
    of one kind are not interleaved, so the window also reaches the full layers (`_slide`): all
    `full_attention` with a `sliding_window` slides everywhere, as vLLM serves it.
    Embeddings are tied; the vision tower (~0.4B) is not counted."""
    text = c.text_part()
    fields = _dense(text)
    fields["model_type"] = "gemma3"
    fields["tie_word_embeddings"] = text.flag("tie_word_embeddings", True)
    n = fields["num_layers"]
    types = text.layer_list("layer_types", n, (FULL, SLIDING))
    if types is None:
        pattern = text.count("sliding_window_pattern", 6)
        types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)]
    _slide(fields, types, _window(text, types), per_layer=True)
    return fields


def _gemma2(c: _Config) -> Fields:
    """Gemma 2: layers 0, 2, 4, ... use a `sliding_window` window, the odd layers attend globally,
    unless `layer_types` says so directly (HF's Gemma2Config: `sliding_attention` where (i + 1) % 2,
    as vllm/model_executor/models/gemma2.py reads it); one kind throughout slides everywhere when a
    `sliding_window` is set, as for Gemma 3 (`_slide`). Embeddings are tied."""
    fields = _dense(c)
    fields["model_type"] = "gemma2"
    fields["tie_word_embeddings"] = c.flag("tie_word_embeddings", True)
    n = fields["num_layers"]
    types = c.layer_list("layer_types", n, (FULL, SLIDING)) or [SLIDING if i % 2 == 0 else FULL for i in range(n)]
    _slide(fields, types, _window(c, types), per_layer=True)
    return fields


def _llama4(c: _Config) -> Fields:
    """Llama 4 (text part, `text_config`): layers with RoPE use chunked local attention of
    `attention_chunk_size` tokens, the NoPE layers (`no_rope_layers[i] == 0`, every 4th by
    default) attend globally (vllm/model_executor/models/llama4.py, Llama4Attention:
    use_chunked_local_attn = not nope and attention_chunk_size). Every `interleave_moe_layer_step`-th
    layer is MoE with one shared expert of `intermediate_size`; other layers are dense with
    `intermediate_size_mlp`. The vision tower is not counted."""
    text = c.text_part()
    fields = _dense(text)
    fields["model_type"] = "llama4"
    n = fields["num_layers"]
    interval = text.count("no_rope_layer_interval", 4)
    no_rope = text.layer_list("no_rope_layers", n, (0, 1)) or [int((i + 1) % interval != 0) for i in range(n)]
    chunk = text.get("attention_chunk_size")
    fields["layer_types"] = [CHUNKED if chunk and rope else FULL for rope in no_rope]
    fields["attention_chunk_size"] = chunk
    step = text.count("interleave_moe_layer_step", 1)
    expert = fields["intermediate_size"]
    fields["intermediate_size"] = text.get("intermediate_size_mlp", expert)
    fields["moe"] = {
        "num_experts": text.need("num_local_experts"),
        "num_experts_per_tok": text.get("num_experts_per_tok", 1),
        "expert_intermediate_size": expert,
        "shared_expert_intermediate_size": expert,
        "num_moe_layers": len([i for i in range(n) if (i + 1) % step == 0]),
    }
    return fields


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


def _model_window(c: _Config, fields: Fields) -> None:
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
    _slide(fields, hf_types, window, per_layer=model_type in PER_LAYER_WINDOW_TYPES)


def _slide(fields: Fields, hf_types: list[str] | None, window: int | None, per_layer: bool) -> None:
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


def _window(c: _Config, hf_types: list[str]) -> int | None:
    """The config's `sliding_window`: required where a layer slides, else null or a positive integer."""
    if SLIDING in hf_types or c.get("sliding_window") is not None:
        return c.count("sliding_window")
    return None


def _layer_types(c: _Config, num_layers: int) -> list[str]:
    c.need("layer_types")
    types = c.layer_list("layer_types", num_layers, (FULL, SLIDING))
    assert types is not None
    return types


READERS: dict[str, Callable[[_Config], Fields]] = {
    "llama": _llama, "mistral": _llama, "qwen2": _llama, "qwen3": _llama, "opt": _opt,
    "phi3": _llama,  # Phi-3: fused qkv and gate_up projections of Llama's shapes (vLLM's Phi3 is a Llama)
    "gemma2": _gemma2,
    "qwen3_moe": _qwen3_moe, "mixtral": _mixtral,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
    "gpt_oss": _gpt_oss, "gemma3": _gemma3, "gemma3_text": _gemma3,
    "llama4": _llama4, "llama4_text": _llama4,
}


# The model class vLLM builds for a config's `architectures` entry (its model registry), as the reader's model_type.
ARCHITECTURE_TYPES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "OPTForCausalLM": "opt", "Phi3ForCausalLM": "phi3", "Gemma2ForCausalLM": "gemma2",
    "Qwen3MoeForCausalLM": "qwen3_moe", "MixtralForCausalLM": "mixtral", "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3", "GptOssForCausalLM": "gpt_oss", "Gemma3ForCausalLM": "gemma3_text",
    "Gemma3ForConditionalGeneration": "gemma3", "Llama4ForCausalLM": "llama4_text",
    "Llama4ForConditionalGeneration": "llama4",
}


def _inferred_model_type(raw: dict[str, Any], name: str) -> Any:
    """The config's `model_type`; where it has none, the one its `architectures` names (vLLM picks the model
    class by `architectures`; transformers' AutoConfig refuses a config without `model_type` unless the path
    names one). Neither: `KvsimError` naming the field, as no default layout is safe (Mixtral read as Llama
    dropped its experts)."""
    if "model_type" in raw:
        return raw["model_type"]
    architectures = raw.get("architectures")
    names = [architectures] if isinstance(architectures, str) else architectures  # as vLLM's _normalize_archs
    known = [ARCHITECTURE_TYPES[a] for a in names if isinstance(a, str) and a in ARCHITECTURE_TYPES] \
        if isinstance(names, list) else []
    if not known:
        raise KvsimError(f"model config {name}: model_type is missing and architectures={shown(architectures)} "
                         f"names no model kvsim reads (supported: {', '.join(sorted(ARCHITECTURE_TYPES))})")
    return known[0]


def fields_from_hf_config(raw: dict[str, Any], name: str) -> Fields:
    """The `ModelSpec` fields of a `config.json` mapping, read by its `model_type`'s reader (a config without
    one: its `architectures`' model, `_inferred_model_type`)."""
    model_type = _inferred_model_type(raw, name)
    raw = {**raw, "model_type": model_type}
    reader = READERS.get(model_type) if isinstance(model_type, str) else None  # a list was a bare TypeError
    if reader is None:
        raise KvsimError(f"model config {name}: model_type={shown(model_type)} is not supported "
                         f"(supported: {', '.join(sorted(READERS))})")
    fields = reader(_Config(raw, name))
    fields["name"] = name
    if "num_params" in raw:
        fields["num_params"] = raw["num_params"]
    return fields


def config_name(raw: dict[str, Any], path: Path) -> str:
    """A config file's model name: its `_name_or_path` (`meta-llama/Llama-3.1-8B`; a local path's last
    folder), else the folder of a `config.json`, else the file's stem."""
    given = raw.get("_name_or_path")
    if isinstance(given, str) and given.strip():
        try:  # the name leads the model's one-line errors: a newline in it split them
            given = one_line_label(given.strip().rstrip("/"))
        except ValueError as error:
            raise KvsimError(f"model file {path}: _name_or_path={shown(given)}: {error}") from None
        return Path(given).name if given.startswith(("/", ".", "~")) or given.count("/") > 1 else given
    folder = path.resolve().parent.name
    return folder if path.name == "config.json" and folder else path.stem
