"""Metamorphic and differential relations, ninth round: the latency and memory-sizing models.

`test_metamorphic.py` to `test_metamorphic8.py` hold the earlier rounds (fp8 blocks and TP's split of a block's
bytes over the presets' KV heads: round seven; pools by hand from config.json: round eight). Here:

* a GPU file with every FLOP/s and bandwidth figure doubled (`fp16_flops`, `fp8_flops`, `hbm_bandwidth_bytes_per_s`;
  named as the preset, so it keeps the preset's fitted fractions) halves every compute- or memory-bound term of a
  step, and nothing else: 2 · step(2x) − step(1x) is the step's fixed costs counted by hand (a GEMM kernel's floor
  per GEMM, a token op's clock-scaled floor per call, the attention kernels' floors, the sampler per row, the CPU),
  for llama-3.1-8b and qwen3-30b-a3b (MoE, q/k norms), decodes alone, a prefill chunk alone and the two mixed;
  end to end, with those fixed costs zeroed in the file (`efficiency`), the same requests arriving twice as fast
  are served in the same steps in exactly half the time (llama, qwen3-30b-a3b and gemma-3-27b, under preemption
  and prefix caching, through the decode bursts);
* a model with twice the layers (its config.json with `num_hidden_layers` doubled) at the bare datasheet roofline
  takes 2 · step − LM head and sampler + 2 · T · h · dtype / B: every per-layer term doubles, the LM head does not,
  and the first layer's input norm, the one norm not fused with a residual add (2h bytes a token, not 4h), is
  counted once in either stack (llama-3.1-8b, qwen3-30b-a3b, gemma-3-27b with its sliding layers);
* TP 2 at the bare datasheet roofline is half of TP 1's step plus half of what every rank does whole (the norms on
  the hidden state, the rotary's cos/sin row and position id) plus two all-reduces a layer by hand (H100's NVLink
  fit at 2 GPUs), for llama-3.1-8b and qwen3-8b (q/k norms split with the heads);
* `gpu_memory_utilization` raised by d adds floor(d · memory / block bytes) blocks or one more (the two floors),
  block bytes by hand (llama-3.1-8b: 2 · 32 · 8 · 128 · 2 · 16 = 2 MiB; qwen3-30b-a3b 1.5 MiB; the hybrid
  gemma-3-27b a page in each of 10 layers, 1.25 MiB, and gpt-oss-20b in each of 12, 384 KiB), on h100-80gb's
  81,559 MiB at 0.9 + 0.05: 2,038 or 2,039 blocks more for llama;
* in a fixed pool per GPU (`kv_cache_memory_bytes`) TP t holds floor(pool / (block bytes at TP 1 / min(t, kv heads)))
  blocks: llama-3.1-8b's config with 1, 2 and 8 KV heads at TP 1, 2, 4 and 8 (vLLM's QKVParallelLinear
  replicates a KV head on t / kv_heads GPUs when t > kv_heads, so blocks stop doubling there);
* a sliding window longer than every request's context is full attention: mistral-7b (4,096-token window in every
  layer) at max_model_len 2,048 serves every request and step as its config without `sliding_window`, and
  gemma-3-27b with an 8,192-token window (a hybrid pool of seven KV groups) every request and step time as its
  config with every layer full (a uniform pool), with prefix caching and chunked prefill, in a pool that never
  binds (below);
* an MoE layer is its grouped GEMM at ηg of the dense roofline plus the router: with k = E (every token to every
  expert) the step's experts cost the dense MLP of E experts' width over the same tokens, over ηg, and one
  expert with k = 1 costs the dense MLP of the expert's width (a dense model whose `intermediate_size` is the
  expert's) over ηg, plus the router's GEMM, at every batch size;
* one speculating request (n-gram drafts, K = 1 and 3, 200-token prompt, 23 output tokens) takes the prefill,
  then verify steps of 1 + K tokens priced as such: 22 of them at acceptance 0 (one token each), ceil(22 / (K + 1))
  at acceptance 1, each after the tokens accepted so far, step for step;
* the roofline's token ops are the kernels vLLM's decoder layer runs, by hand at the bare datasheet roofline:
  gemma-2 and -3 norm the attention's and the MLP's outputs too (`post_attention_layernorm`,
  `post_feedforward_layernorm`: four norms a layer, two of them plain, 2h bytes a token), which the roofline left
  out (fixed: gemma-3-27b's token ops were 14 % short, 0.79 us a token and step on an H100 at the datasheet rate,
  and two norm kernels' floors a layer, 0.43 ms a step with the fitted floors; llama's two norms stay as they were);
* gemma-3-27b's decodes read only the last min(context, 1,024) tokens in its 52 sliding layers, every token in
  its 10 full ones: exactly, for batches inside or beyond the window (below for batches across it).

Modelling choices met (documented where they live):

* kvsim's v1 admits a full-attention request only when its whole prompt fits (DESIGN §3) and a sliding-window or
  hybrid one likewise when the prompt fits in the shortest window, but by its first chunk beyond it (as vLLM v1's
  `allocate_slots(request, num_new_tokens)` does for every model; `kvsim.kv.hybrid`: such a prompt never holds
  all its blocks at once). Fixed: the hybrid pool had admitted every prompt by its first chunk, so the window
  relation above failed under KV pressure (mistral-7b, seed 4, 260 blocks, 40 req/s: a 1,442-token prompt's
  1,020-token first chunk admitted at step 288 into about 80 free blocks, 91 needed, and preempted the next step);
* with decodes on both sides of a sliding window in one step a sliding layer's read was min(Σ context, n · window),
  an upper bound on Σ min(context, window) (contexts 100 and 3,000 read 2,048 tokens a sliding layer, not 1,124).
  Fixed: the scheduler counts Σ min(context, window) per window (`StepPlan.decode_context_in_window`) and decode
  bursts keep every context on one side of each window (`tests/test_window_reads.py`);
* a GPU file named as a preset takes that preset's fitted fractions (`efficiency_for`), which is what makes the
  doubled file comparable.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import kvsim
from kvsim.latency.efficiency import DATASHEET, REFERENCE_CLOCK_HZ, efficiency_for, gemm_s
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.capacity import num_gpu_blocks
from kvsim.model.config import PRESETS_DIR, load_gpu, load_model
from kvsim.model.engine_config import make_engine

H100 = load_gpu("h100-80gb")
MIB = 2**20


def variant_file(tmp_path, preset: str, **changes) -> str:
    """The preset's config.json with `changes` (None drops a key), written to a file of its own."""
    raw = json.loads((PRESETS_DIR / "models" / f"{preset}.json").read_text())
    raw.update(changes)
    path = tmp_path / f"{preset}-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    return str(path)


def config_variant(tmp_path, preset: str, **changes):
    """`variant_file`'s model."""
    return load_model(variant_file(tmp_path, preset, **changes))


def gemma_variant(tmp_path, name: str, **text_changes) -> str:
    """gemma-3-27b's config.json with `text_changes` in its `text_config`, written to a file of its own."""
    raw = json.loads((PRESETS_DIR / "models" / "gemma-3-27b.json").read_text())
    raw["text_config"].update(text_changes)
    path = tmp_path / f"gemma-3-{name}.json"
    path.write_text(json.dumps(raw))
    return str(path)


def plans() -> dict[str, StepPlan]:
    decodes, chunk, mixed = StepPlan(), StepPlan(), StepPlan()
    decodes.add(1, 700, 24, logits_row=True)
    chunk.add(512, 0, 1, logits_row=False)
    mixed.add(1, 1500, 6, logits_row=True)
    mixed.add(300, 200, 1, logits_row=True)
    return {"decodes": decodes, "chunk": chunk, "mixed": mixed}


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("plan_name", ["decodes", "chunk", "mixed"])
def test_doubled_gpu_rates_halve_every_bound_term_and_keep_the_fixed_costs(tmp_path, model, plan_name):
    raw = yaml.safe_load((PRESETS_DIR / "gpus.yaml").read_text())["h100-80gb"]
    for field in ("fp16_flops", "fp8_flops", "hbm_bandwidth_bytes_per_s"):
        raw[field] = 2 * float(raw[field])
    path = tmp_path / "h100-80gb.yaml"
    path.write_text(yaml.safe_dump(raw))
    fast = load_gpu(str(path))
    assert efficiency_for(fast) == efficiency_for(H100)  # named as the preset: its fitted fractions
    spec, engine, plan = load_model(model), make_engine(max_model_len=4096), plans()[plan_name]
    one, two = RooflineLatency(spec, H100, engine), RooflineLatency(spec, fast, engine)
    eff = efficiency_for(H100)
    layers = spec.num_layers
    gemms_per_layer = 2  # qkv+o, then the MLP (dense) or the router (MoE: its experts are one grouped term)
    token_op_calls = 2 + 1 + 1 + (2 if spec.has_qk_norm else 0)  # two norms, rotary, activation, q/k norms
    fixed = (layers * gemms_per_layer * eff.gemm_floor_s
             + layers * token_op_calls * eff.token_op_floor_s * REFERENCE_CLOCK_HZ / H100.boost_clock_hz
             + (eff.gemm_floor_s + plan.num_logits_rows * eff.sample_per_seq_s if plan.num_logits_rows else 0.0)
             + (layers * (eff.kernel_floor_s + plan.num_decode_seqs * eff.decode_per_seq_s)
                if plan.num_decode_seqs else 0.0)
             + (layers * eff.kernel_floor_s if plan.num_prefill_tokens else 0.0)
             + eff.cpu_fixed_s + plan.num_seqs * eff.cpu_per_seq_s)
    assert 2 * two.step_time(plan) - one.step_time(plan) == pytest.approx(fixed, rel=1e-9)
    assert two.step_time(plan) < one.step_time(plan)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-30b-a3b", "gemma-3-27b"])
@pytest.mark.parametrize("plan_name", ["decodes", "chunk", "mixed"])
def test_twice_the_layers_doubles_every_per_layer_term(tmp_path, model, plan_name):
    """gemma-3-27b's 124 layers keep its pattern: every sixth full, 20 full and 104 sliding, twice 10 and 52."""
    spec = load_model(model)
    double = load_model(gemma_variant(tmp_path, "124", num_hidden_layers=124)) if model == "gemma-3-27b" else \
        config_variant(tmp_path, model, num_hidden_layers=2 * spec.num_layers)
    assert double.num_layers == 2 * spec.num_layers
    assert double.resolved_layer_types.count("full_attention") == 2 * spec.resolved_layer_types.count("full_attention")
    engine, plan = make_engine(max_model_len=4096), plans()[plan_name]
    one = RooflineLatency(spec, H100, engine, overhead_s=0.0, efficiency=DATASHEET)
    two = RooflineLatency(double, H100, engine, overhead_s=0.0, efficiency=DATASHEET)
    head = one.sequence_s(plan.num_logits_rows)
    first_norm = 2 * plan.num_tokens * spec.hidden_size * spec.dtype_bytes / H100.hbm_bandwidth_bytes_per_s
    assert two.step_time(plan) == pytest.approx(2 * one.step_time(plan) - head + first_norm, rel=1e-12)


BLOCK_BYTES = {"llama-3.1-8b": 2 * 32 * 8 * 128 * 2 * 16, "qwen3-30b-a3b": 2 * 48 * 4 * 128 * 2 * 16,
               # hybrid: a block id is a page in each of group-size layers (vLLM's KVCacheTensor per group slot):
               # gemma-3-27b's 10 full layers make groups of 10, gpt-oss-20b's 12 full layers groups of 12
               "gemma-3-27b": 10 * 2 * 16 * 128 * 2 * 16, "gpt-oss-20b": 12 * 2 * 8 * 64 * 2 * 16}


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(sorted(BLOCK_BYTES)), utilization=st.floats(0.85, 0.95),
       raise_by=st.floats(0.001, 0.05))
def test_more_memory_utilization_adds_its_memory_in_blocks(model, utilization, raise_by):
    spec = load_model(model)
    low = num_gpu_blocks(spec, H100, make_engine(max_model_len=4096, gpu_memory_utilization=utilization))
    high = num_gpu_blocks(spec, H100, make_engine(max_model_len=4096,
                                                  gpu_memory_utilization=utilization + raise_by))
    added_bytes = int(H100.memory_bytes * (utilization + raise_by)) - int(H100.memory_bytes * utilization)
    assert high - low in (added_bytes // BLOCK_BYTES[model], added_bytes // BLOCK_BYTES[model] + 1)


def test_more_memory_utilization_by_hand():
    spec = load_model("llama-3.1-8b")
    blocks = [num_gpu_blocks(spec, H100, make_engine(max_model_len=4096, gpu_memory_utilization=u))
              for u in (0.9, 0.95)]
    assert H100.memory_bytes == 81559 * MIB
    # 0.05 · 81,559 MiB = 4,077.95 MiB = 2,038.975 blocks of 2 MiB
    assert blocks[1] - blocks[0] in (2038, 2039)


@pytest.mark.parametrize("kv_heads", [1, 2, 8])
def test_a_fixed_pool_holds_blocks_by_the_kv_heads_each_gpu_keeps(tmp_path, kv_heads):
    spec = config_variant(tmp_path, "llama-3.1-8b", num_key_value_heads=kv_heads)
    pool = 3 * 1000 * MIB + 12345  # not a whole number of blocks at any TP
    block_bytes = 2 * 32 * kv_heads * 128 * 2 * 16
    for tp in (1, 2, 4, 8):
        engine = make_engine(max_model_len=2048, tensor_parallel_size=tp, kv_cache_memory_bytes=pool)
        heads_per_gpu = kv_heads // min(tp, kv_heads)  # a head replicated on tp / kv_heads GPUs past kv_heads
        assert num_gpu_blocks(spec, H100, engine) == pool // (2 * 32 * heads_per_gpu * 128 * 2 * 16)
        assert num_gpu_blocks(spec, H100, engine) == pool // (block_bytes // min(tp, kv_heads))


def window_run(model: str, num_blocks: int | None = None, rate: float = 30.0):
    pool = {} if num_blocks is None else {"num_gpu_blocks_override": num_blocks}
    return kvsim.simulate({
        "model": model, "gpu": "h100-80gb", "seed": 4,
        "engine": {"max_model_len": 2048, "max_num_seqs": 32, "max_num_batched_tokens": 1024,
                   "enable_prefix_caching": True, **pool},
        "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate": rate},
                     "prompt_len": {"dist": "lognormal", "mean": 500, "p99": 1500},
                     "output_len": {"dist": "lognormal", "mean": 120, "p99": 400},
                     "shared_prefix": {"tokens": 384, "fraction": 0.7, "num_prefixes": 2}}})


KV_COLUMNS = ["vllm:kv_cache_usage_perc", "held_slots", "shared_slots", "token_state", "reserved", "internal_frag",
              "free"]


@pytest.mark.parametrize("model", ["mistral-7b", "gemma-3-27b"])
def test_a_window_longer_than_every_context_is_full_attention(tmp_path, model):
    """mistral-7b slides 4,096 tokens in every layer (one KV group: the same pool); gemma-3-27b's 52 sliding
    layers, given an 8,192-token window, beside the config with every layer full (a hybrid pool of another block
    count, so the steps' KV shares differ: every other column is the same)."""
    if model == "mistral-7b":
        sliding_model, full_model = model, variant_file(tmp_path, model, sliding_window=None)
    else:
        sliding_model = gemma_variant(tmp_path, "long-window", sliding_window=8192)
        full_model = gemma_variant(tmp_path, "full", sliding_window=None, layer_types=["full_attention"] * 62)
    assert load_model(sliding_model).sliding_window >= 4096 and load_model(full_model).sliding_window is None
    sliding, plain = window_run(sliding_model), window_run(full_model)
    assert sliding.requests.prefix_hit_tokens.sum() > 0 and sliding.steps.num_batched_tokens.max() == 1024
    assert (sliding.requests.prompt_tokens + sliding.requests.output_tokens).max() < 2048
    assert sliding.requests.equals(plain.requests)
    kv = KV_COLUMNS if model != "mistral-7b" else []
    assert sliding.steps.drop(columns=kv).equals(plain.steps.drop(columns=kv))


def test_a_window_longer_than_every_context_is_full_attention_under_kv_pressure(tmp_path):
    """mistral-7b in 260 blocks at 40 req/s preempts; its prompts, all inside the 4,096-token window, are
    admitted whole as the full-attention copy's are (DESIGN §3). It had admitted a 1,442-token prompt's
    1,020-token first chunk at step 288 into about 80 free blocks and preempted it the next step."""
    sliding = window_run("mistral-7b", num_blocks=260, rate=40.0)
    plain = window_run(variant_file(tmp_path, "mistral-7b", sliding_window=None), num_blocks=260, rate=40.0)
    assert sliding.summary["num_preemptions"] > 0
    assert sliding.requests.equals(plain.requests) and sliding.steps.equals(plain.steps)


@pytest.mark.parametrize("tokens", [1, 3, 16, 100, 700, 4096])
def test_an_moe_layer_is_the_dense_roofline_of_its_routed_width_over_eta_g(tmp_path, tokens):
    every = config_variant(tmp_path, "qwen3-30b-a3b", num_experts=8, num_experts_per_tok=8)
    single = config_variant(tmp_path, "qwen3-30b-a3b", num_experts=1, num_experts_per_tok=1)
    dense = config_variant(tmp_path, "qwen3-8b", hidden_size=2048, intermediate_size=768, num_hidden_layers=48)
    engine = make_engine(max_model_len=4096)
    eff = efficiency_for(H100)
    h, expert = 2048, 3 * 2048 * 768

    def routed(params: float) -> float:  # a dense GEMM of the routed width, less its kernel floor, over ηg
        return (gemm_s(params, tokens, 2, H100.fp16_flops, H100.hbm_bandwidth_bytes_per_s, eff)
                - eff.gemm_floor_s) / eff.grouped_gemm_fraction

    def router(experts: int) -> float:
        return gemm_s(h * experts, tokens, 2, H100.fp16_flops, H100.hbm_bandwidth_bytes_per_s, eff)

    all_experts = RooflineLatency(every, H100, engine).moe_s(tokens)
    assert all_experts == pytest.approx(48 * (routed(8 * expert) + router(8)), rel=1e-12)
    one_expert = RooflineLatency(single, H100, engine).moe_s(tokens)
    dense_mlp = RooflineLatency(dense, H100, engine).mlp_s(tokens)
    assert one_expert == pytest.approx(
        48 * ((dense_mlp / 48 - eff.gemm_floor_s) / eff.grouped_gemm_fraction + router(1)), rel=1e-12)


@pytest.mark.parametrize("acceptance", [0.0, 1.0])
@pytest.mark.parametrize("drafts", [1, 3])
def test_a_speculating_requests_steps_are_its_verifies_counted_by_hand(acceptance, drafts):
    prompt, output = 200, 23
    spec = {"method": "ngram", "num_speculative_tokens": drafts, "acceptance_rates": acceptance}
    engine = {"max_model_len": 2048, "speculative_config": spec}
    result = kvsim.simulate({"model": "llama-3.1-8b", "gpu": "h100-80gb", "engine": engine,
                             "workload": {"num_requests": 1, "prompt_len": {"dist": "fixed", "value": prompt},
                                          "output_len": {"dist": "fixed", "value": output}}})
    roof = RooflineLatency(load_model("llama-3.1-8b"), H100, make_engine(**engine),
                           overlap_cpu=make_engine(**engine).resolved_async_scheduling)
    first = StepPlan()
    first.add(prompt, 0, 1, logits_row=True)
    expected = [roof.step_time(first)]
    emitted = 1 + drafts if acceptance else 1  # tokens each verify step emits: the accepted drafts and one more
    for i in range(math.ceil((output - 1) / emitted)):  # a verify of the last token and every draft, priced whole
        verify = StepPlan()
        verify.add_verify(1 + drafts, prompt + i * emitted)
        expected.append(roof.step_time(verify))
    steps = result.steps
    assert list(steps.num_batched_tokens) == [prompt] + [1 + drafts] * (len(expected) - 1)
    assert list(steps.duration_s) == pytest.approx(expected, rel=1e-12)
    assert result.requests.e2e_s[0] == pytest.approx(sum(expected), rel=1e-12)


@pytest.mark.parametrize("tokens", [1, 64, 2048])
def test_gemmas_token_ops_count_its_sandwich_norms(tokens):
    """vLLM's Gemma3DecoderLayer (and Gemma2's) runs four RMSNorms a layer: `input_layernorm` and
    `pre_feedforward_layernorm` fused with the residual add (4h bytes a token; the first layer's input norm 2h),
    and `post_attention_layernorm` and `post_feedforward_layernorm` on the sublayers' outputs alone (read h, write
    h: 2h). The roofline priced two a layer, as for llama. gemma-3-27b at the bare datasheet roofline (every op at
    the datasheet bandwidth, no floors), per layer and token: the fused norms d · h · (8L − 2) / L, the sandwich
    norms 2 · 2 · d · h, rotary d · (2 · (32 + 16) · 128 + 128) + 8 (the position id), the gated activation
    3 · d · I, the q/k norms 2 · d · (32 + 16) · 128."""
    gemma = load_model("gemma-3-27b")
    roof = RooflineLatency(gemma, H100, make_engine(max_model_len=4096), efficiency=DATASHEET)
    layers, d, h = 62, 2, 5376
    per_layer = (d * h * (8 * layers - 2) / layers + 2 * 2 * d * h + d * (2 * (32 + 16) * 128 + 128) + 8
                 + 3 * d * 21504 + 2 * d * (32 + 16) * 128)
    assert roof.token_ops_s(tokens) == pytest.approx(layers * tokens * per_layer / 3.35e12, rel=1e-12)
    llama = RooflineLatency(load_model("llama-3.1-8b"), H100, make_engine(max_model_len=4096), efficiency=DATASHEET)
    llama_per_layer = (2 * 4096 * (8 * 32 - 2) / 32 + 2 * (2 * (32 + 8) * 128 + 128) + 8 + 3 * 2 * 14336)
    assert llama.token_ops_s(tokens) == pytest.approx(32 * tokens * llama_per_layer / 3.35e12, rel=1e-12)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-8b"])
@pytest.mark.parametrize("plan_name", ["decodes", "chunk", "mixed"])
def test_tensor_parallelism_halves_every_sharded_term_and_nothing_else(model, plan_name):
    """At the bare datasheet roofline TP 2 is half of TP 1's step, except what every rank does whole: the norms on
    the hidden state (d · h · (8L − 2) per token in all), the rotary's cos/sin row and position id (d · head_dim + 8
    a layer), plus two all-reduces a layer of T · h · d bytes over NVLink (H100's fit at 2 GPUs: 62.69 % of
    450 GB/s, 16.62 us each). GEMMs, attention (half the heads, half the KV heads), q/k norms and the activation
    split in two."""
    spec, plan = load_model(model), plans()[plan_name]
    one, two = (RooflineLatency(spec, H100, make_engine(max_model_len=4096, tensor_parallel_size=tp), overhead_s=0.0,
                                efficiency=DATASHEET) for tp in (1, 2))
    layers, d, h, tokens = spec.num_layers, spec.dtype_bytes, spec.hidden_size, plan.num_tokens
    whole = tokens * (d * h * (8 * layers - 2) + layers * (d * spec.head_dim + 8)) / H100.hbm_bandwidth_bytes_per_s
    allreduce = 2 * layers * (tokens * h * d / (0.6269 * 450e9) + 16.62e-6)
    assert two.step_time(plan) == pytest.approx(one.step_time(plan) / 2 + whole / 2 + allreduce, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(contexts=st.lists(st.integers(1, 4000), min_size=1, max_size=12))
def test_gemmas_sliding_layers_read_at_most_their_window_per_decode(contexts):
    """gemma-3-27b's decodes read, per token of context, 2 · 16 · 128 · 2 = 8,192 B in each of its 10 full layers
    and, in each of its 52 sliding layers, only the last min(context, 1,024) tokens: exactly so when every context
    is inside the window or every one beyond it; a batch on both sides is priced min(Σ context, n · 1,024) a
    sliding layer (`decode_read_bytes`: the step plan carries Σ context, not each), at least the exact read."""
    roof = RooflineLatency(load_model("gemma-3-27b"), H100, make_engine(max_model_len=4096), efficiency=DATASHEET)
    per_layer = 2 * 16 * 128 * 2
    exact = sum(10 * c * per_layer + 52 * min(c, 1024) * per_layer for c in contexts)
    read = roof.decode_read_bytes(len(contexts), sum(contexts))
    if all(c <= 1024 for c in contexts) or all(c >= 1024 for c in contexts):
        assert read == exact
    else:
        assert exact <= read <= sum(62 * c * per_layer for c in contexts)


NO_FIXED_COSTS = {name: 0.0 for name in ("gemm_floor_s", "token_op_floor_s", "kernel_floor_s", "decode_per_seq_s",
                                         "sample_per_seq_s", "cpu_fixed_s", "cpu_per_seq_s")}


@pytest.mark.parametrize(("model", "num_blocks"), [("llama-3.1-8b", 300), ("qwen3-30b-a3b", 300),
                                                  ("gemma-3-27b", 950)])  # a hybrid block id: 7 groups' pages
def test_a_gpu_twice_as_fast_with_no_fixed_costs_serves_twice_the_rate_in_half_the_time(tmp_path, model, num_blocks):
    """The doubled GPU file end to end: with the fixed costs zeroed in the file (`efficiency`), every step is
    bound by the GPU's rates alone, so the same requests arriving twice as fast are served in the same steps in
    exactly half the time (under preemption and prefix caching, through the decode bursts)."""
    raw = yaml.safe_load((PRESETS_DIR / "gpus.yaml").read_text())["h100-80gb"]
    paths = []
    for scale in (1, 2):
        gpu = {**raw, "efficiency": NO_FIXED_COSTS}
        for field in ("fp16_flops", "fp8_flops", "hbm_bandwidth_bytes_per_s"):
            gpu[field] = scale * float(raw[field])
        (tmp_path / str(scale)).mkdir()
        path = tmp_path / str(scale) / "h100-80gb.yaml"
        path.write_text(yaml.safe_dump(gpu))
        paths.append(str(path))

    def run(gpu: str, rate: float):
        return kvsim.simulate({
            "model": model, "gpu": gpu, "seed": 2,
            "engine": {"max_model_len": 2048, "num_gpu_blocks_override": num_blocks,
                       "max_num_batched_tokens": 1024, "enable_prefix_caching": True},
            "workload": {"num_requests": 50, "arrival": {"process": "poisson", "rate": rate},
                         "prompt_len": {"dist": "lognormal", "mean": 500, "p99": 1500},
                         "output_len": {"dist": "lognormal", "mean": 100, "p99": 300},
                         "shared_prefix": {"tokens": 256, "fraction": 0.5, "num_prefixes": 2}}})

    slow, fast = run(paths[0], 10.0), run(paths[1], 20.0)
    assert slow.summary["num_preemptions"] > 0 and slow.requests.prefix_hit_tokens.sum() > 0
    for column in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "e2e_s"):
        assert list(fast.requests[column]) == pytest.approx(list(slow.requests[column] / 2), rel=1e-9, abs=1e-12)
    assert list(fast.requests.num_preemptions) == list(slow.requests.num_preemptions)
    assert list(fast.steps.num_batched_tokens) == list(slow.steps.num_batched_tokens)
    assert list(fast.steps.duration_s) == pytest.approx(list(slow.steps.duration_s / 2), rel=1e-9)
