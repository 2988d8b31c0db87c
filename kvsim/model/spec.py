"""What a model *is* for kvsim: the shapes of a decoder-only transformer (`ModelSpec`) and its
parameter counts by component, which follow from the shapes (a `ModelSpec` without a given
`num_params` gets their total).

    attention (per layer)   q, o = hidden · heads · head_dim; k, v = hidden · kv_heads · head_dim
                            MLA: q (q_lora: hidden · q_lora + q_lora · heads · (nope + rope),
                                 else hidden · heads · (nope + rope)) + kv_a = hidden · (kv_lora + rope)
                                 + kv_b = kv_lora · heads · (nope + v) + o = heads · v · hidden
    dense MLP (per layer)   (3 if gated else 2) · hidden · intermediate       (non-MoE layers)
    experts (per MoE layer) num_experts · 3 · hidden · expert_intermediate     (all stored)
    shared (per MoE layer)  3 · hidden · shared_expert_intermediate
    router (per MoE layer)  hidden · num_experts
    embeddings              vocab · hidden (· 2 when the LM head is untied) + OPT's learned positions
    norms                   2 · hidden per layer (gemma-2 and -3: 4, `SANDWICH_NORM_MODEL_TYPES`) + the final norm

Biases, MLA's latent norms, q/k norms and quantization scales are left out (each well under 0.1 % of the
total). Bytes of those weights: `kvsim.model.weights`; the GPU and engine configs and the preset
loaders: `kvsim.model.config`. Nearly a leaf of kvsim: it imports only `kvsim.model.units` and `kvsim.model.errors`.
"""

from __future__ import annotations

import math
from collections import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from kvsim.model.errors import KvsimError, from_validation_error, shown, union_members
from kvsim.model.units import control_character, underscore_problem

WeightDtype = Literal["float16", "bfloat16", "float32"]
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}

def _leaf_types(annotation: Any) -> set[Any]:
    """The types an annotation's unions and optionals are made of (`int | None` -> {int, NoneType})."""
    args = get_args(annotation)
    return {leaf for arg in args for leaf in _leaf_types(arg)} if args else {annotation}


def _misread_number(annotation: Any, value: Any) -> str | None:
    """Where in `value` a number the annotation wants is written in a form pydantic's lax mode misreads, and why:
    `=true: expected a number, not a boolean` (a field taking int or float, not bool), `='1_0': a number written
    with an underscore ...` (not str: `kvsim.model.units.underscore_problem`); `[i]...` for a list's or tuple's
    item, `.key...` for a dict's value, ` key=...` for a dict's key (nested as deep as the annotation goes); None
    when none is. A nested section's values (a dict where a model is expected) are left to that section's own
    check."""
    # numpy's booleans too (a notebook's `mask.any()`): no subclass of bool, pydantic reads them as 1 and 0 as well
    boolean = isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool",
                                                                                                      "bool_"))
    if boolean or isinstance(value, str):
        leaves = _leaf_types(annotation)
        if not leaves & {int, float}:
            return None
        if boolean:
            return f"={str(value).lower()}: expected a number, not a boolean" if bool not in leaves else None
        problem = underscore_problem(value)
        return f"={value!r}: {problem}" if problem is not None and str not in leaves else None
    members = union_members(annotation)
    if isinstance(value, (list, tuple)):
        items = [arg for m in members if get_origin(m) in (list, tuple, set, frozenset, abc.Sequence)
                 for arg in get_args(m) if arg is not Ellipsis]
        for i, item in enumerate(value):
            where = _misread_number(Union[tuple(items)], item) if items else None  # noqa: UP007 (built at run time)
            if where is not None:
                return f"[{i}]{where}"
    if isinstance(value, dict):
        pairs = [get_args(m) for m in members if get_origin(m) in (dict, abc.Mapping) and len(get_args(m)) == 2]
        keys, values = [k for k, _ in pairs], [v for _, v in pairs]
        for key, item in value.items():
            # a key is read as a number too (`by_num_gpus: {1_6: ...}` was 16, `{true: ...}` 1)
            where = _misread_number(Union[tuple(keys)], key) if keys else None  # noqa: UP007 (built at run time)
            if where is not None:
                return f" key{where}"
            where = _misread_number(Union[tuple(values)], item) if values else None  # noqa: UP007
            if where is not None:
                return f".{key}{where}"
    return None


def one_line_label(text: str) -> str:
    """`text`, unless it holds a control character (`control_character`) or nothing but spaces (a scenario named
    '' or '   ' wrote to `runs/scenario` and titled its tables with nothing)."""
    if not text.strip():
        raise ValueError("is blank; a name labels output rows, tables and one-line errors, so it holds a character "
                         "other than a space")
    bad = control_character(text)
    if bad is not None:
        raise ValueError(f"holds the control character {bad!r}; a name labels output rows, tables and one-line "
                         "errors, so it is one line of printable text")
    return text


Label = Annotated[str, AfterValidator(one_line_label)]
"""A name kvsim shows (a scenario's, a replica group's, a priority class's): a newline in one split kvsim's
one-line errors in two (`replicas (a<newline>b/g1-0, kv_consumer): ...`), an escape sequence reached the terminal."""


def _unsigned_zeros(value: Any) -> Any:
    """`value` with every negative zero in it (`-0.0`, itself or inside a list's, tuple's or dict's values, as deep as
    they go) read as 0.0; None when it holds none (the caller keeps `value` as it is)."""
    if isinstance(value, float):
        return 0.0 if value == 0 and math.copysign(1, value) < 0 else None
    if isinstance(value, (list, tuple)):
        items = [_unsigned_zeros(item) for item in value]
        if all(item is None for item in items):
            return None
        return type(value)(old if new is None else new for old, new in zip(value, items, strict=True))
    if isinstance(value, dict):
        changed = {key: new for key, item in value.items() if (new := _unsigned_zeros(item)) is not None}
        return {**value, **changed} if changed else None
    return None


class Settings(BaseModel):
    """The base of every user-set section (model, GPU, engine, scenario, plan spec): immutable, unknown keys
    refused, inf and NaN never a setting, and `true`, `false` or text with an underscore refused where a number
    is expected (a field taking int or float, not bool or str, or a list, tuple or dict of them:
    `tensor_parallel_sizes: [true]`). Pydantic's lax mode reads `true` and `false` as 1 and 0, so
    `num_requests: true` ran one request, `gpu_memory_utilization: true` used all memory and
    `acceptance_rates: [true, true]` accepted every draft; and '1_6' as 16 (`block_size: '1_6'`). A negative
    zero (`-0.0`, which passes `ge=0`) is read as 0.0, as `-0` is the integer 0, in a list or a mapping too
    (`acceptance_rates: [0.8, -0.0]`): it was written back to `scenario.yaml` as `-0.0` and shown as `-0`.

    A model's validator is built at its first use (`defer_build`), not at import: a section nested in another
    is validated through its parent's validator, and many sections are never validated on their own in a run."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _no_misread_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                where = _misread_number(field.annotation, data.get(name))
                if where is not None:
                    raise ValueError(f"{name}{where}")
            unsigned = _unsigned_zeros(data)
            return data if unsigned is None else unsigned
        return data

    @classmethod
    def model_construct(cls, _fields_set: set[str] | None = None, **values: Any) -> Self:
        """An instance of `values` validated as `model_validate` validates them (a `Scenario`'s refuses a bad one
        as one `KvsimError` line naming it): pydantic's construct skips validation, so
        `Scenario.model_construct(seed=-5)` ran into numpy's ValueError mid-run and an unknown key was kept
        without a word. `_fields_set`, where given, replaces the fields counted as given (pydantic's meaning)."""
        built = cls.model_validate(values)
        if _fields_set is not None:
            object.__setattr__(built, "__pydantic_fields_set__", set(_fields_set))
        return built

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy whose `update` is validated as a new instance's fields are (`model_validate`: a `Scenario`'s
        refuses a bad one as one `KvsimError` line naming it): pydantic's copy sets `update` unchecked, so
        `scenario.model_copy(update={"seed": -5})` ran into numpy's ValueError mid-run, `update={"replicas": 0}`
        into a ZeroDivisionError and `update={"engine": {...}}` into an AttributeError, and an unknown key was
        kept without a word. A section's copy (`scenario.engine.model_copy(update={"max_num_seqs": -1})`) refuses
        its field so too: it raised pydantic's multi-line ValidationError, no `KvsimError`."""
        from pydantic import ValidationError

        if not update:
            return super().model_copy(deep=deep)
        # the fields given (not the defaults), so that `model_fields_set` stays what the copy's would be
        try:
            copied = type(self).model_validate({**{name: getattr(self, name) for name in self.model_fields_set},
                                                **update})
        except ValidationError as error:
            raise from_validation_error(error, model=type(self)) from None
        return copied.model_copy(deep=True) if deep else copied

    def __setattr__(self, name: str, value: Any) -> None:
        """Refuse an assignment in one `KvsimError` line naming the field and the value: a section is frozen once
        validated (a run reads it as checked), and pydantic refused `scenario.seed = 5` with its multi-line
        ValidationError, no `KvsimError`. A changed copy is made with `model_copy(update=...)`."""
        raise KvsimError(f"{name}={shown(value)}: {type(self).__name__} is read-only once made; change a copy: "
                         f".model_copy(update={{{name!r}: ...}})")

    def refuse_unread(self, mode: str, readers: Mapping[str, Sequence[str]], show: Callable[[Any], str],
                      only: str | None = None) -> None:
        """Raise `ValueError` for the first field of `readers` (field -> the values of the field `mode` that
        read it) set to another value than its default while `mode` holds none of those: given where it has
        no effect, it was dropped without a word. Defaults pass (a written scenario carries every one). The
        message is `name=<show(value)>: mode=<its value> does not read it (only <only, or the readers>)`."""
        current = getattr(self, mode)
        for name, modes in readers.items():
            value = getattr(self, name)
            if current not in modes and value != type(self).model_fields[name].default:
                raise ValueError(f"{name}={show(value)}: {mode}={current} does not read it "
                                 f"(only {only or ', '.join(modes)})")


LayerType = Literal["full_attention", "sliding_attention", "chunked_attention"]
WeightQuant = Literal["fp8", "mxfp4"]


class WholeSettings(Settings):
    """A `Settings` a user makes whole from Python (`kvsim.Scenario(...)`, `StudyConfig(...)`), not only as a
    section of another: made (`__init__`) or validated (`model_validate`) with a bad field, it is one `KvsimError`
    line naming the field (under `error_name`) and the value; pydantic's `ValidationError` is several lines, and
    no `KvsimError`."""

    error_name: ClassVar[str]

    def __init__(self, **fields: Any) -> None:
        from pydantic import ValidationError

        try:
            super().__init__(**fields)
        except ValidationError as error:
            raise from_validation_error(error, model=type(self), name=self.error_name) from None

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        from pydantic import ValidationError

        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as error:
            raise from_validation_error(error, model=cls, name=cls.error_name) from None


class MLASpec(Settings):
    """Multi-head latent attention (DeepSeek-V2/V3): K and V are rebuilt from one cached latent of
    `kv_lora_rank + qk_rope_head_dim` values per token per layer."""

    kv_lora_rank: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)
    q_lora_rank: int | None = Field(default=None, gt=0)


class MoESpec(Settings):
    """A mixture of experts in `num_moe_layers` layers (the rest are dense with `intermediate_size`).

    Each token is routed to `num_experts_per_tok` of `num_experts` gated experts of
    `expert_intermediate_size`; `shared_expert_intermediate_size` is the total width of the
    experts every token passes through (DeepSeek's shared experts, Llama 4's shared expert).
    """

    num_experts: int = Field(gt=0)
    num_experts_per_tok: int = Field(gt=0)
    expert_intermediate_size: int = Field(gt=0)
    shared_expert_intermediate_size: int = Field(default=0, ge=0)
    num_moe_layers: int = Field(ge=0)

    @model_validator(mode="after")
    def _check_top_k(self) -> MoESpec:
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} exceeds num_experts={self.num_experts}")
        return self


QK_NORM_MODEL_TYPES = frozenset({"qwen3", "qwen3_moe", "gemma3"})
"""Families whose attention normalises q and k per head (vLLM's Qwen3Attention, Qwen3MoeAttention and
Gemma3Attention: `q_norm`, `k_norm`, RMSNorms over head_dim): two more norm kernels a layer. Their
weights (head_dim each) are left out of the counts, as the other small tensors below are."""
SANDWICH_NORM_MODEL_TYPES = frozenset({"gemma2", "gemma3"})
"""Families whose layers norm before and after both attention and MLP (vLLM's Gemma2DecoderLayer and
Gemma3DecoderLayer: input_layernorm, post_attention_layernorm, pre_feedforward_layernorm and
post_feedforward_layernorm): 4 hidden-sized norm weights a layer, not 2. Counted as 2, gemma-3-27b's weights
were 1,333,248 B short and its pool one block too large on an H100 (14,796 where vLLM's rule gives 14,795)."""
MAX_LAYERS = 2**16
"""The most layers a model may have: kvsim holds a value per layer (its attention kind), and a config giving
10**12 layers was a MemoryError making them; published decoders have a few hundred at most (Llama 3.1 405B: 126)."""


class ModelSpec(Settings):
    """The shapes of a decoder-only transformer that decide its KV and weight bytes.

    Attention: every layer is full attention unless `layer_types` says otherwise
    (`sliding_attention` keeps the last `sliding_window` tokens, `chunked_attention` the
    current `attention_chunk_size`-token chunk); `mla` replaces K/V heads by one latent.
    `moe` adds experts. `weight_quant` is the checkpoint's weight format where it is not
    `dtype` (fp8: every linear layer 1 byte; mxfp4: experts 4.25 bits). `num_params` is
    computed from the shapes unless given (`param_counts`).
    """

    name: Label  # a GPU's and a model's name are in one-line errors and tables, as a scenario's is
    model_type: str = "llama"
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    dtype: WeightDtype = "bfloat16"
    gated_mlp: bool = True
    tie_word_embeddings: bool = False
    layer_types: tuple[LayerType, ...] | None = None
    sliding_window: int | None = Field(default=None, gt=0)
    attention_chunk_size: int | None = Field(default=None, gt=0)
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    weight_quant: WeightQuant | None = None
    num_params: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check_heads(self) -> ModelSpec:
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        types = set(self.layer_types or ())
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries, num_layers={self.num_layers}")
        if "sliding_attention" in types and self.sliding_window is None:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
        if "chunked_attention" in types and self.attention_chunk_size is None:
            raise ValueError("layer_types has chunked_attention layers but attention_chunk_size is not set")
        if self.moe is not None and self.moe.num_moe_layers > self.num_layers:
            raise ValueError(f"moe.num_moe_layers={self.moe.num_moe_layers} exceeds num_layers={self.num_layers}")
        if self.num_params is None:
            object.__setattr__(self, "num_params", param_counts(self).total)
        return self

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def has_qk_norm(self) -> bool:
        """Whether attention RMS-normalises each head's q and k before the rotary (`QK_NORM_MODEL_TYPES`)."""
        return self.model_type in QK_NORM_MODEL_TYPES

    @property
    def has_sandwich_norms(self) -> bool:
        """Whether each layer also norms its attention's and its MLP's outputs, four norms a layer in all
        (`SANDWICH_NORM_MODEL_TYPES`)."""
        return self.model_type in SANDWICH_NORM_MODEL_TYPES

    @property
    def resolved_layer_types(self) -> tuple[LayerType, ...]:
        """One attention type per layer (all `full_attention` when `layer_types` is not set)."""
        full: LayerType = "full_attention"
        return self.layer_types or (full,) * self.num_layers


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameters of the whole model (all layers) by component."""

    attention: int
    dense_mlp: int
    experts: int
    shared_experts: int
    router: int
    embeddings: int
    norms: int

    @property
    def total(self) -> int:
        return (self.attention + self.dense_mlp + self.experts + self.shared_experts + self.router
                + self.embeddings + self.norms)


def attention_params_per_layer(m: ModelSpec) -> int:
    h = m.hidden_size
    if m.mla is not None:
        a = m.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = h * a.q_lora_rank + a.q_lora_rank * m.num_attention_heads * qk if a.q_lora_rank else \
            h * m.num_attention_heads * qk
        kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * m.num_attention_heads * (
            a.qk_nope_head_dim + a.v_head_dim)
        return q + kv + m.num_attention_heads * a.v_head_dim * h
    return 2 * h * m.num_attention_heads * m.head_dim + 2 * h * m.num_kv_heads * m.head_dim


def expert_params(m: ModelSpec) -> int:
    """Parameters of one routed expert (gate, up and down projections)."""
    assert m.moe is not None
    return 3 * m.hidden_size * m.moe.expert_intermediate_size


def param_counts(m: ModelSpec) -> ParamCounts:
    h = m.hidden_size
    moe = m.moe
    moe_layers = moe.num_moe_layers if moe else 0
    dense_layers = m.num_layers - moe_layers
    embed = m.vocab_size * h * (1 if m.tie_word_embeddings else 2)
    if not m.gated_mlp:  # OPT's learned positions
        embed += m.max_position_embeddings * h
    return ParamCounts(
        attention=m.num_layers * attention_params_per_layer(m),
        dense_mlp=dense_layers * (3 if m.gated_mlp else 2) * h * m.intermediate_size,
        experts=moe_layers * moe.num_experts * expert_params(m) if moe else 0,
        shared_experts=moe_layers * 3 * h * moe.shared_expert_intermediate_size if moe else 0,
        router=moe_layers * h * moe.num_experts if moe else 0,
        embeddings=embed,
        norms=((4 if m.has_sandwich_norms else 2) * m.num_layers + 1) * h,
    )
