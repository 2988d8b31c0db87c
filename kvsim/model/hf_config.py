"""Reading a Hugging Face `config.json`: its keys, and the fields every decoder family shares.

`HFConfig` wraps the mapping so that a key that matters and is missing, or has a value of the wrong kind, raises
`KvsimError` naming the key (and the family that needs it). `dense_fields` reads what every decoder has (layers,
heads, sizes, vocabulary) and what vLLM derives from the config the same way for every family: the context
length it serves (`rope_scaling`), the dtype `--dtype auto` picks, the weights' quantization. Each family's own
keys are read in `kvsim.model.families`; which layers slide in `kvsim.model.sliding_window`.

Pure data: no pydantic models are built here (config.py validates), so this module imports nothing from kvsim
but the error type and the layer bound `ModelSpec` enforces.
"""

from __future__ import annotations

import math
from typing import Any

from kvsim.model.errors import KvsimError, shown
from kvsim.model.spec import MAX_LAYERS

Fields = dict[str, Any]


class HFConfig:
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

    def text_part(self) -> HFConfig:
        """The config with a multimodal checkpoint's `text_config` (if any) laid over it."""
        text = self.raw.get("text_config")
        if text is None:
            return self
        if not isinstance(text, dict):
            raise KvsimError(f"model config {self.name}: text_config={text!r}: must be a mapping")
        return HFConfig({**self.raw, **text}, self.name)


def dense_fields(c: HFConfig, *, is_opt: bool = False) -> Fields:
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


def _derived_max_len(c: HFConfig) -> int:
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


def _positive_number(c: HFConfig, key: str, value: Any, need: str = "") -> float:
    """`rope_scaling[key]`, a positive finite number (int or float, as vLLM multiplies it), else `KvsimError`
    (`need` says why it must be there)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise KvsimError(f"model config {c.name}: rope_scaling.{key}={shown(value)}: {need}must be a positive number")
    return value


def _num_layers(c: HFConfig) -> int:
    """`num_hidden_layers`, a count ("32", text, is refused, as vLLM's range() would) of at most `MAX_LAYERS`,
    refused here as `ModelSpec` refuses it, before a family's per-layer lists: Gemma's, Llama 4's and DeepSeek's
    lists of 10**30 entries ran out of memory (a MemoryError, or the process killed)."""
    n = c.count("num_hidden_layers")
    if n > MAX_LAYERS:
        raise KvsimError(f"model {c.name}.num_layers={n}: Input should be less than or equal to {MAX_LAYERS}")
    return n


def _served_dtype(c: HFConfig) -> str:
    """The dtype vLLM serves with `--dtype auto`: the checkpoint's, except that a float32 (or unstated)
    checkpoint runs in float16, and a Gemma one in bfloat16 (vLLM's `_get_and_verify_dtype`)."""
    dtype = c.get("torch_dtype") or c.get("dtype") or "float32"
    if dtype != "float32":
        return str(dtype)
    return "bfloat16" if str(c.get("model_type", "")).startswith("gemma") else "float16"


def _weight_quant(c: HFConfig) -> str | None:
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
