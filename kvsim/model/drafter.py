"""The drafter a speculating engine loads beside its target (`engine.speculative_config`): its KV layers and weights.

vLLM v1 builds an EAGLE head inside the target's `VllmConfig` (`EagleProposer.load_model`,
vllm/v1/spec_decode/eagle.py), so the head's attention layers join the target's in the static forward
context (its `draft_attn_layer_names` are the attention layers that appeared when it loaded, named after the
target's: `model.layers.32` after Llama-3.1-8B's 32). `GPUModelRunner.get_kv_cache_spec` gives every
attention layer there a KV spec, and `get_kv_cache_groups` (vllm/v1/core/kv_cache_utils.py) groups them
all: a head layer of the target's KV shape (Llama-3.1-8B's heads: 8 KV heads of 128, as the target) leaves
the spec uniform, one group of 33 layers sharing one block table (`EagleProposer.validate_same_kv_cache_group`),
so a block id is 33 pages instead of 32 and `_get_num_blocks` (pool // page // layers) gives 32/33 as many
blocks. The head loads in `GPUModelRunner.load_model` under the profiler that measures the weights, so its
weights leave the budget before the pool is sized.

    ngram        no drafter on the GPU: no KV layer, no weights
    eagle        EagleLlamaForCausalLM (vllm/model_executor/models/llama_eagle.py): fc (2H → H, replicated),
                 one decoder layer without its input norm; the target's embedding and LM head shared
                 (`load_model`). Llama-3.1-8B: 251,662,336 parameters, EAGLE's published 0.25B
    eagle3       Eagle3LlamaForCausalLM (llama_eagle3.py): fc (3H → H, replicated), one decoder layer whose
                 q/k/v read 2H (embedding and hidden state side by side), a hidden norm and a final norm, its
                 own LM head over `EAGLE3_DRAFT_VOCAB_SIZE` tokens and the int64 `draft_id_to_target_id`
                 map; the embedding shared
    draft_model  a separate model (`draft_model`), loaded in the target's dtype (vLLM's `SpeculativeConfig` builds
                 its `draft_model_config` with `dtype=target_model_config.dtype`) at the engine's tensor
                 parallelism: all its weights, and its own attention layers, of its own KV shape

`DraftModelProposer.load_model` (vllm/v1/spec_decode/draft_model.py) loads a draft model into the same
`VllmConfig` too, so its attention layers join the static forward context and get KV specs beside the target's.
Their shape is the draft's (Llama-3.2-1B beside Llama-3.1-8B: 16 layers of 8 KV heads of 64), so the specs
differ from the target's; all full attention of one block size, they still make one group
(`UniformTypeKVCacheSpecs.from_specs`, vllm/v1/core/kv_cache_utils.py `get_kv_cache_groups`) whose page is the
sum of every layer's page, and `get_kv_cache_config_from_groups` gives `pool // that sum` blocks
(`KVLayout.draft_bytes_per_block`). A target with sliding-window or chunked layers, or a draft with them, makes
groups of different page sizes, which vLLM unifies by growing block sizes (`unify_kv_cache_spec_page_size`):
not modelled, refused (`kvsim.model.kv_layout.kv_layout`).

The head's layer has the target's shape (`eagle_head`, as `kvsim.latency.speculative` prices it: MLA for an
MLA target), its weights the model's `dtype`; vLLM's pipeline parallelism (which loads the embedding
separately) is not modelled. Under tensor parallelism the head's attention, MLP and LM head are split over
the ranks, the fc and the norms replicated.
"""

from __future__ import annotations

from kvsim.model.config import load_model
from kvsim.model.errors import KvsimError
from kvsim.model.spec import ModelSpec, attention_params_per_layer
from kvsim.model.speculative_config import SpeculativeConfig
from kvsim.model.units import ceil_div
from kvsim.model.weights import weights_bytes

EAGLE3_DRAFT_VOCAB_SIZE = 32_000
"""`draft_vocab_size` of the published EAGLE-3 heads (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's config.json): the
head's LM head scores these tokens only, mapped to the target's by `draft_id_to_target_id`."""


def eagle_head(model: ModelSpec) -> ModelSpec:
    """EAGLE's draft head: one dense decoder layer of the target's width, with its vocabulary."""
    fields = {**model.model_dump(), "name": f"{model.name}-eagle-head", "num_layers": 1, "layer_types": None,
              "moe": None, "num_params": None}
    return ModelSpec(**fields)


def draft_model(model: ModelSpec, spec: SpeculativeConfig | None) -> ModelSpec | None:
    """The separate draft model of `method: draft_model`, in the target's dtype; None for any other drafter. One of
    another vocabulary size than the target's raises `KvsimError`: vLLM refuses it at startup
    (`SpeculativeConfig.verify_equal_vocab_size_if_draft_model`, vllm/config/speculative.py: other tokenizers' ids
    run out of bounds) unless `use_heterogeneous_vocab`, a field kvsim does not take."""
    if spec is None or spec.method != "draft_model":
        return None
    assert spec.model is not None  # `SpeculativeConfig` requires it for draft_model
    draft = load_model(spec.model)
    if draft.vocab_size != model.vocab_size:
        raise KvsimError(f"engine.speculative_config.model={spec.model}: vocab_size={draft.vocab_size}, but "
                         f"{model.name}'s is {model.vocab_size}: vLLM refuses a draft model of another vocabulary "
                         "(another tokenizer's token ids); give a draft of the target's family")
    return draft.model_copy(update={"dtype": model.dtype})


def drafter_weights_bytes(model: ModelSpec, spec: SpeculativeConfig | None, tensor_parallel_size: int = 1) -> int:
    """The drafter's weight bytes on one GPU of `tensor_parallel_size` (see the module docstring); 0 without one.

    EAGLE, Llama-3.1-8B, one GPU: fc 2 · 4096² + attention 4096 · (32 + 2 · 8) · 128 + 32 · 128 · 4096
    + MLP 3 · 4096 · 14336 + a norm of 4096 = 251,662,336 parameters, 503,324,672 B in bf16. A draft model:
    its own weights, split as a target's (`weights_bytes`).
    """
    draft = draft_model(model, spec)
    if draft is not None:
        return weights_bytes(draft, tensor_parallel_size)
    if spec is None or not spec.num_draft_kv_layers:
        return 0
    head = eagle_head(model)
    h, tp, d = model.hidden_size, tensor_parallel_size, model.dtype_bytes
    attention = attention_params_per_layer(head)
    mlp = (3 if model.gated_mlp else 2) * h * model.intermediate_size
    if spec.method == "eagle":
        split, replicated = attention + mlp, 2 * h * h + h
        return ceil_div(split * d, tp) + replicated * d
    draft_vocab = min(EAGLE3_DRAFT_VOCAB_SIZE, model.vocab_size)
    qkv_from_embedding = h * (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim
    if model.mla is not None:  # MLA's projections: counted once, as for the target's layers
        qkv_from_embedding = 0
    split = attention + qkv_from_embedding + mlp + draft_vocab * h
    replicated = 3 * h * h + 4 * h
    return ceil_div(split * d, tp) + replicated * d + 8 * draft_vocab  # the id map: int64 per draft token
