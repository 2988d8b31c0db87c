"""Model families: reading a Hugging Face `config.json` into the fields `ModelSpec` validates.

One reader per `model_type`; each names the family's own keys (DeepSeek's `n_routed_experts`,
Mixtral's `num_local_experts`, Gemma 3's nested `text_config`, ...) and states which layers
are sliding-window, chunked-local or MLA, and which carry a mixture of experts, the way
vLLM's model file for that family decides it (cited per reader). The registry (`READERS`, and
`ARCHITECTURE_TYPES` for a config without `model_type`) picks the reader: `fields_from_hf_config`.
A key that matters and is missing raises `KvsimError` naming it (`kvsim.model.hf_config.HFConfig`);
an unknown `model_type` lists the supported ones. The fields every decoder shares are read in
`kvsim.model.hf_config`; the sliding-window rules several families share are `kvsim.model.sliding_window`'s.

Pure data: no pydantic models are built here (config.py validates), so this module imports
nothing from kvsim but its config readers, the error type and `ModelSpec`'s label rule.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvsim.model.errors import KvsimError, shown
from kvsim.model.hf_config import Fields, HFConfig, dense_fields
from kvsim.model.sliding_window import CHUNKED, FULL, SLIDING, config_window, model_window, slide
from kvsim.model.spec import one_line_label


def _llama(c: HFConfig) -> Fields:
    """Llama, Mistral, Phi-3, Qwen2 and Qwen3: dense, with vLLM's model-wide sliding window (`model_window`)."""
    fields = dense_fields(c)
    model_window(c, fields)
    return fields


def _opt(c: HFConfig) -> Fields:
    return dense_fields(c, is_opt=True)


def _qwen3_moe(c: HFConfig) -> Fields:
    """Qwen3-MoE: a layer is MoE unless listed in `mlp_only_layers`, every `decoder_sparse_step`-th
    layer (vllm/model_executor/models/qwen3_moe.py, Qwen3MoeDecoderLayer)."""
    fields = dense_fields(c)
    step = c.count("decoder_sparse_step", 1)
    dense_only = c.layer_indices("mlp_only_layers")
    moe_layers = [i for i in range(fields["num_layers"]) if i not in dense_only and (i + 1) % step == 0]
    fields["moe"] = {
        "num_experts": c.need("num_experts"),
        "num_experts_per_tok": c.need("num_experts_per_tok"),
        "expert_intermediate_size": c.need("moe_intermediate_size"),
        "num_moe_layers": len(moe_layers),
    }
    model_window(c, fields)
    return fields


def _mixtral(c: HFConfig) -> Fields:
    """Mixtral: every layer MoE, experts of `intermediate_size` (vllm/model_executor/models/mixtral.py)."""
    fields = dense_fields(c)
    fields["moe"] = {
        "num_experts": c.need("num_local_experts"),
        "num_experts_per_tok": c.need("num_experts_per_tok"),
        "expert_intermediate_size": fields["intermediate_size"],
        "num_moe_layers": fields["num_layers"],
    }
    model_window(c, fields)
    return fields


def _deepseek(c: HFConfig) -> Fields:
    """DeepSeek-V2/V3: MLA in every layer; layer i is MoE when i >= first_k_dense_replace and
    i % moe_layer_freq == 0, with `n_shared_experts` shared experts of `moe_intermediate_size`
    (vllm/model_executor/models/deepseek_v2.py, DeepseekV2DecoderLayer). The MTP layers
    (`num_nextn_predict_layers`) are loaded only for speculative decoding and are not counted."""
    fields = dense_fields(c)
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


def _gpt_oss(c: HFConfig) -> Fields:
    """gpt-oss: `layer_types` alternates sliding (window `sliding_window`) and full attention; every
    layer MoE with `num_local_experts` experts of `intermediate_size`; experts in MXFP4
    (vllm/model_executor/models/gpt_oss.py: sliding_window only where layer_types says so)."""
    fields = dense_fields(c)
    fields["layer_types"] = _layer_types(c, fields["num_layers"])
    fields["sliding_window"] = c.need("sliding_window")
    fields["moe"] = {
        "num_experts": c.need("num_local_experts"),
        "num_experts_per_tok": c.get("num_experts_per_tok") or c.need("experts_per_token"),
        "expert_intermediate_size": fields["intermediate_size"],
        "num_moe_layers": fields["num_layers"],
    }
    return fields


def _gemma3(c: HFConfig) -> Fields:
    """Gemma 3 (text part; multimodal checkpoints nest it in `text_config`): local layers use a
    `sliding_window` window, every `sliding_window_pattern`-th layer is global, or `layer_types`
    says so directly (vllm/model_executor/models/gemma3.py, Gemma3Attention.is_sliding). `layer_types`
    of one kind are not interleaved, so the window also reaches the full layers (`slide`): all
    `full_attention` with a `sliding_window` slides everywhere, as vLLM serves it.
    Embeddings are tied; the vision tower (~0.4B) is not counted."""
    text = c.text_part()
    fields = dense_fields(text)
    fields["model_type"] = "gemma3"
    fields["tie_word_embeddings"] = text.flag("tie_word_embeddings", True)
    n = fields["num_layers"]
    types = text.layer_list("layer_types", n, (FULL, SLIDING))
    if types is None:
        pattern = text.count("sliding_window_pattern", 6)
        types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)]
    slide(fields, types, config_window(text, types), per_layer=True)
    return fields


def _gemma2(c: HFConfig) -> Fields:
    """Gemma 2: layers 0, 2, 4, ... use a `sliding_window` window, the odd layers attend globally,
    unless `layer_types` says so directly (HF's Gemma2Config: `sliding_attention` where (i + 1) % 2,
    as vllm/model_executor/models/gemma2.py reads it); one kind throughout slides everywhere when a
    `sliding_window` is set, as for Gemma 3 (`slide`). Embeddings are tied."""
    fields = dense_fields(c)
    fields["model_type"] = "gemma2"
    fields["tie_word_embeddings"] = c.flag("tie_word_embeddings", True)
    n = fields["num_layers"]
    types = c.layer_list("layer_types", n, (FULL, SLIDING)) or [SLIDING if i % 2 == 0 else FULL for i in range(n)]
    slide(fields, types, config_window(c, types), per_layer=True)
    return fields


def _llama4(c: HFConfig) -> Fields:
    """Llama 4 (text part, `text_config`): layers with RoPE use chunked local attention of
    `attention_chunk_size` tokens, the NoPE layers (`no_rope_layers[i] == 0`, every 4th by
    default) attend globally (vllm/model_executor/models/llama4.py, Llama4Attention:
    use_chunked_local_attn = not nope and attention_chunk_size). Every `interleave_moe_layer_step`-th
    layer is MoE with one shared expert of `intermediate_size`; other layers are dense with
    `intermediate_size_mlp`. The vision tower is not counted."""
    text = c.text_part()
    fields = dense_fields(text)
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


def _layer_types(c: HFConfig, num_layers: int) -> list[str]:
    c.need("layer_types")
    types = c.layer_list("layer_types", num_layers, (FULL, SLIDING))
    assert types is not None
    return types


READERS: dict[str, Callable[[HFConfig], Fields]] = {
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
    fields = reader(HFConfig(raw, name))
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
