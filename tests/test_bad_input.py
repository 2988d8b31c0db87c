"""The bad-input corpus: every case exits 2 with one line naming what is wrong, and writes nothing.

Each case is (id, files to create, command line, text the error line must contain). `{d}` in
files and arguments is the case's folder; run, report and validate are given `-o {d}/out`,
which must not exist afterwards. The cases cover scenario fields, `--set`, every trace reader
(empty and malformed files), Hugging Face configs, GPU files, sizes too big to allocate,
configurations vLLM refuses at startup, and the other commands' flags.
"""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()

LENGTHS = "prompt_len: {dist: fixed, value: 64}, output_len: {dist: fixed, value: 16}"
WORKLOAD = f"workload: {{num_requests: 5, {LENGTHS}}}\n"


def scenario(text: str) -> dict[str, str]:
    return {"s.yaml": text}


def trace_scenario(fmt: str, name: str, content: str, extra: str = "") -> dict[str, str]:
    arrival = "arrival: {process: trace}, " if fmt in ("azure", "mooncake", "sharegpt_tokens") else ""
    return {"s.yaml": f"workload: {{num_requests: 5, {arrival}trace: {{format: {fmt}, path: {name}{extra}}}}}\n",
            name: content}


def config_json(**changes) -> dict[str, str]:
    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 4096}
    for key, value in changes.items():
        if value is None:
            base.pop(key)
        else:
            base[key] = value
    return {"config.json": json.dumps(base), "s.yaml": f"model: {{d}}/config.json\n{WORKLOAD}"}


def measured_run(**request) -> dict[str, str]:
    """A measured-run folder `m/` (validation layout) of one request, its fields changed by `request`."""
    meta = {"model": "meta-llama/Llama-3.1-8B", "dataset_path": "w.jsonl",
            "engine_kwargs": {"model": "meta-llama/Llama-3.1-8B", "max_num_seqs": 4}}
    row = {"request_id": "bench-0", "input_toks": 16, "output_toks": 5, "queued_ts": 100.0, "scheduled_ts": 100.0,
           "first_token_ts": 100.01, "last_token_ts": 100.05, **request}
    row = {key: value for key, value in row.items() if value is not None}  # None: the field is absent
    workload = {"input_toks": 16, "output_toks": 5, "arrival_time_ns": 0}
    return {"m/vllm/meta.json": json.dumps(meta), "m/vllm/requests.jsonl": json.dumps(row) + "\n",
            "m/w.jsonl": json.dumps(workload) + "\n"}


def bench_json(**changes) -> dict[str, str]:
    """`vllm bench serve --save-result --save-detailed` JSON of two requests, fields changed by `changes`."""
    raw = {"model_id": "meta-llama/Llama-3.1-8B", "input_lens": [16, 32], "output_lens": [5, 3],
           "ttfts": [0.01, 0.02], "itls": [[0.01] * 4, [0.02, 0.02]], "latencies": [0.05, 0.06],
           "start_times": [1000.0, 1000.015], **changes}
    return {"b.json": json.dumps(raw)}


BUNDLE_META = ("gpu: NVIDIA RTX PRO 6000 Blackwell Server Edition\nmodel: meta-llama/Llama-3.1-8B\nvariant: bf16\n"
               "tp_degrees: [1]\n")
BUNDLE_DENSE = "layer,tokens,time_us\nqkv_proj,1,30\nqkv_proj,256,60\ngate_up_proj,1,100\ngate_up_proj,256,200\n"


def bundle(meta: str = BUNDLE_META, dense: str = BUNDLE_DENSE, **files: str) -> dict[str, str]:
    """A tiny LLMServingSim profile bundle `b/` (Llama-3.1-8B on the RTX PRO 6000, TP 1)."""
    return {"b/meta.yaml": meta, "b/tp1/dense.csv": dense, **{f"b/tp1/{k}.csv": v for k, v in files.items()}}


VIDUR_COLUMNS = ("n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tokens,"
                 "num_tensor_parallel_workers,time_stats.attn_pre_proj.median,time_stats.mlp_up_proj.median")


def vidur(*rows: str) -> dict[str, str]:
    """A Vidur mlp.csv in Vidur's layout (compute/<device>/<org>/<model>/), Llama-2-7B on an A100."""
    return {"compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv": "\n".join([VIDUR_COLUMNS, *rows]) + "\n"}


def native_profile(*extra_rows: str) -> dict[str, str]:
    """A kvsim profile CSV `p.csv` of four GEMM rows (plus `extra_rows`), imported from a bundle elsewhere."""
    from kvsim.latency.base import PROFILE_COLUMNS

    def row(op: str, tokens: int, seconds: float) -> str:
        return ",".join({"kind": "gemm", "op": op, "num_tokens": str(tokens), "time_s": repr(seconds)}.get(c, "")
                        for c in PROFILE_COLUMNS)

    rows = [row("qkv", 1, 3e-5), row("qkv", 256, 6e-5), row("gate_up", 1, 1e-4), row("gate_up", 256, 2e-4)]
    return {"p.csv": "\n".join(["# gpu: NVIDIA RTX PRO 6000 Blackwell Server Edition", "# model: meta-llama/Llama-3.1-8B",
                                "# source_path: /elsewhere/bundle", ",".join(PROFILE_COLUMNS), *rows, *extra_rows])
            + "\n"}


VIDUR_ROW = "32,32,4096,11008,32000,True,{tokens},1,{ms},{ms}"
RUN_S = ["run", "{d}/s.yaml"]
IMPORT_B = ["import-profile", "{d}/b", "-o", "{d}/out.csv", "--gpu", "rtx-pro-6000"]
IMPORT_N = ["import-profile", "{d}/p.csv", "-o", "{d}/out.csv", "--gpu", "rtx-pro-6000"]
IMPORT_V = ["import-profile", "{d}/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv", "-o", "{d}/out.csv",
            "--model", "llama-2-7b", "--gpu", "a100-80gb"]
VALIDATE_M = ["validate", "{d}/m", "--gpu", "h100-80gb", "-o", "{d}/out"]
VALIDATE_B = ["validate", "{d}/b.json", "--model", "llama-3.1-8b", "--gpu", "h100-80gb", "-o", "{d}/out"]
PLAN = ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=2", "-o", "{d}/out"]
DISAGG = f"kv_transfer_config: {{kv_link: rdma}}\n{WORKLOAD}"
DISAGG_GROUPS = "replicas: [{count: 1, kv_role: kv_producer}, {count: 1, kv_role: kv_consumer}]\n"
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
MOONCAKE_ROW = '{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}\n'
DEEP = "[" * 50_000 + "]" * 50_000  # nested past the recursion limit
HUGE = "9" * 5000  # digits: over Python's limit for converting text to an int (4,300)
TOKENS_ROW = '{"arrival_time_ns": 0, "input_toks": 2, "output_toks": 1, "input_tok_ids": [1, 2], "output_tok_ids": [3]}\n'

CASES = [
    # --- scenario fields
    ("unknown-key", scenario(f"wrkload: {{}}\n{WORKLOAD}"), RUN_S, "wrkload: unknown key"),
    ("num-requests-text", scenario(f"workload: {{num_requests: many, {LENGTHS}}}\n"), RUN_S,
     "workload.num_requests='many'"),
    ("num-requests-zero", scenario(f"workload: {{num_requests: 0, {LENGTHS}}}\n"), RUN_S, "workload.num_requests=0"),
    ("num-requests-negative", scenario(f"workload: {{num_requests: -3, {LENGTHS}}}\n"), RUN_S,
     "workload.num_requests=-3"),
    ("rate-negative", scenario(f"workload: {{arrival: {{rate: -2}}, {LENGTHS}}}\n"), RUN_S, "workload.arrival.rate=-2"),
    ("rate-missing", scenario(f"workload: {{arrival: {{process: gamma}}, {LENGTHS}}}\n"), RUN_S, "needs a rate"),
    # a rate beside the trace's own arrival times was ignored: the run replayed the trace at its own rate
    ("rate-with-trace-times", {"s.yaml": "workload: {num_requests: 5, arrival: {process: trace, rate: 9}, "
                                         "trace: {format: azure, path: t.csv}}\n",
                               "t.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"},
     RUN_S, "workload.arrival: rate=9: process=trace replays the trace's own arrival times, so no rate applies; "
            "scale them with workload.trace.rate_scale (to switch a scenario that sets a rate to its trace: --set "
            "'workload.arrival={process: trace}')"),
    ("rate-with-servegen", {"s.yaml": "workload: {num_requests: 5, arrival: {process: poisson, rate: 9}, "
                                      "trace: {format: servegen, path: sg}}\n", "sg/README": "nothing\n"}, RUN_S,
     "arrival.process=poisson: a servegen trace makes its own arrival times"),
    ("dist-unknown", scenario("workload: {prompt_len: {dist: zipf, value: 3}, output_len: {dist: fixed, value: 1}}\n"),
     RUN_S, "workload.prompt_len"),
    ("uniform-reversed", scenario("workload: {prompt_len: {dist: uniform, low: 9, high: 3}, "
                                  "output_len: {dist: fixed, value: 1}}\n"), RUN_S, "high=3 is below low=9"),
    ("lognormal-p99-below-mean", scenario("workload: {prompt_len: {dist: lognormal, mean: 100, p99: 50}, "
                                          "output_len: {dist: fixed, value: 1}}\n"), RUN_S, "p99=50.0 must exceed"),
    ("lognormal-two-shapes", scenario("workload: {prompt_len: {dist: lognormal, mean: 100, p99: 500, sigma: 1}, "
                                      "output_len: {dist: fixed, value: 1}}\n"), RUN_S, "exactly one of p99 or sigma"),
    ("lengths-missing", scenario("workload: {num_requests: 5}\n"), RUN_S, "give prompt_len and output_len"),
    ("block-size-zero", scenario(f"engine: {{block_size: 0}}\n{WORKLOAD}"), RUN_S, "engine.block_size=0"),
    ("block-size-text", scenario(f"engine: {{block_size: big}}\n{WORKLOAD}"), RUN_S, "engine.block_size='big'"),
    ("gpu-util-above-one", scenario(f"engine: {{gpu_memory_utilization: 1.5}}\n{WORKLOAD}"), RUN_S,
     "engine.gpu_memory_utilization=1.5"),
    ("kv-dtype-unknown", scenario(f"engine: {{kv_cache_dtype: int3}}\n{WORKLOAD}"), RUN_S,
     "engine.kv_cache_dtype='int3'"),
    ("allocator-unknown", scenario(f"engine: {{allocator: buddy-ish}}\n{WORKLOAD}"), RUN_S, "engine.allocator"),
    ("scheduler-unknown", scenario(f"engine: {{scheduler: v9}}\n{WORKLOAD}"), RUN_S, "engine.scheduler='v9'"),
    ("model-unknown", scenario(f"model: gpt-17\n{WORKLOAD}"), RUN_S, "model='gpt-17'"),
    ("gpu-unknown", scenario(f"gpu: tpu-v9\n{WORKLOAD}"), RUN_S, "gpu='tpu-v9'"),
    ("max-model-len-too-long", scenario(f"model: llama-2-7b\nengine: {{max_model_len: 100000}}\n{WORKLOAD}"), RUN_S,
     "max_model_len=100000"),
    ("swap-preemption-on-v1", scenario(f"engine: {{preemption_mode: swap}}\n{WORKLOAD}"), RUN_S,
     "preemption_mode=swap needs scheduler v0"),
    ("yaml-broken", scenario("[1, 2\n"), RUN_S, "not valid YAML"),
    ("yaml-error-says-where-not-what", scenario(f"a: b\n  c: {'z' * 300}\n"), RUN_S,
     "not valid YAML: mapping values are not allowed here at line 2, column 4"),
    ("yaml-duplicate-section", scenario(f"engine: {{block_size: 16}}\nengine: {{block_size: 32}}\n{WORKLOAD}"), RUN_S,
     "duplicate key 'engine' (lines 1 and 2): give each key once"),
    ("yaml-duplicate-field", scenario(f"engine:\n  block_size: 16\n  block_size: 32\n{WORKLOAD}"), RUN_S,
     "duplicate key 'block_size' (lines 2 and 3)"),
    ("yaml-long-key-is-cut", scenario(f"{'x' * 500}: 1\n{WORKLOAD}"), RUN_S, f"'{'x' * 56}...: unknown key"),
    ("yaml-long-value-is-cut", scenario(f"engine: {{block_size: {'y' * 500}}}\n{WORKLOAD}"), RUN_S,
     f"engine.block_size='{'y' * 56}...: "),
    ("yaml-names-lines", {"s.yaml": "name:hash:\n" * 3}, RUN_S, "duplicate key 'name:hash' (lines 1 and 2)"),
    # YAML 1.1 integers PyYAML reads in another base: 016 is octal 14, 1:30 is base-60 90
    ("yaml-leading-zero-octal", scenario(f"engine: {{block_size: 016}}\n{WORKLOAD}"), RUN_S,
     "016 reads as 14 (a YAML 1.1 octal or base-60 integer)"),
    ("yaml-base-60", scenario(f"seed: 1:30\n{WORKLOAD}"), RUN_S, "1:30 reads as 90 (a YAML 1.1 octal"),
    ("set-leading-zero-octal", {}, ["run", "--set", "engine.block_size=016"], "016 reads as 14"),
    ("seed-negative", scenario(f"seed: -1\n{WORKLOAD}"), RUN_S, "seed=-1: "),
    ("trace-dev-zero", scenario("workload: {num_requests: 5, arrival: {process: trace}, "
                                "trace: {format: azure, path: /dev/zero}}\n"), RUN_S,
     "workload.trace.path='/dev/zero': not a regular file"),
    ("yaml-top-level-list", scenario("- 1\n- 2\n"), RUN_S, "expected a mapping"),
    ("scenario-missing", {}, ["run", "{d}/nope.yaml"], "nope.yaml"),
    ("beam-and-n", scenario(f"workload: {{n: 2, beam_width: 4, {LENGTHS}}}\n"), RUN_S, "not both"),
    ("n-zero", scenario(f"workload: {{n: 0, {LENGTHS}}}\n"), RUN_S, "workload.n=0"),
    ("calibrated-without-profile", scenario(f"latency: {{model: calibrated}}\n{WORKLOAD}"), RUN_S,
     "needs a profile path"),
    ("profile-missing", scenario(f"latency: {{model: calibrated, profile: gone.csv}}\n{WORKLOAD}"), RUN_S,
     "gone.csv"),
    ("prefix-fraction-two", scenario(f"workload: {{shared_prefix: {{tokens: 10, fraction: 2}}, {LENGTHS}}}\n"), RUN_S,
     "workload.shared_prefix.fraction=2"),
    ("turns-zero", scenario(f"workload: {{multi_turn: {{turns: 0}}, {LENGTHS}}}\n"), RUN_S,
     "workload.multi_turn.turns=0"),
    ("seed-text", scenario(f"seed: lucky\n{WORKLOAD}"), RUN_S, "seed='lucky'"),
    ("swap-space-negative", scenario(f"engine: {{swap_space: -1}}\n{WORKLOAD}"), RUN_S, "engine.swap_space=-1"),
    ("engine-not-mapping", scenario(f"engine: 5\n{WORKLOAD}"), RUN_S, "engine=5"),
    ("workload-missing", scenario("model: llama-3.1-8b\n"), RUN_S, "workload: required field is missing"),
    ("scenario-file-empty", scenario("# nothing but a comment\n"), RUN_S, "s.yaml: the file is empty"),
    ("max-model-len-zero", scenario(f"engine: {{max_model_len: 0}}\n{WORKLOAD}"), RUN_S, "engine.max_model_len=0"),
    # --- --set
    ("set-unclosed-yaml", {}, ["run", "--set", "name=[unclosed"], "--set 'name=[unclosed'"),
    ("set-no-equals", {}, ["run", "--set", "engine.block_size"], "expected dotted.key=value"),
    ("set-empty-key", {}, ["run", "--set", "=5"], "expected dotted.key=value"),
    ("set-through-a-value", {}, ["run", "--set", "engine.max_model_len.x=1"], "max_model_len is not a section"),
    ("set-bad-value", {}, ["run", "--set", "engine.block_size=abc"], "engine.block_size='abc'"),
    ("set-unknown-field", {}, ["run", "--set", "engine.blok_size=16"], "engine.blok_size: unknown key"),
    ("set-near-miss-key", {}, ["run", "--set", "engine.max_num_seq=3"],
     "engine.max_num_seq: unknown key (did you mean max_num_seqs?)"),
    ("set-near-miss-section", {}, ["run", "--set", "wrkload.num_requests=3"], "wrkload: unknown key (did you mean "
                                                                             "workload?)"),
    ("set-flow-map-without-space", {}, ["run", "--set", "engine.kv_offload={cpu_bytes:1GiB}"],  # YAML: one key
     "engine.kv_offload.cpu_bytes:1GiB: unknown key; YAML needs a space after the colon: `cpu_bytes: 1GiB`"),
    ("kv-transfer-without-pools", {}, ["run", "--kv-transfer-config", '{"kv_connector": "NixlConnector"}'],
     "kvsim: error: kv_transfer_config: no replica group with kv_role=kv_producer"),  # a check across fields
    ("set-duplicate-key", {}, ["run", "--set", "engine={block_size: 16, block_size: 32}"],
     "the value is not valid YAML (duplicate key 'block_size' (lines 1 and 1)"),
    # --- traces
    ("azure-empty-file", trace_scenario("azure", "t.csv", ""), RUN_S, "t.csv: no rows"),
    ("azure-header-only", trace_scenario("azure", "t.csv", AZURE_HEAD), RUN_S, "t.csv: no rows"),
    ("azure-bad-timestamp", trace_scenario("azure", "t.csv", AZURE_HEAD + "yesterday,10,5\n"), RUN_S,
     "t.csv:2: TIMESTAMP='yesterday'"),
    ("azure-negative-tokens", trace_scenario("azure", "t.csv", AZURE_HEAD + "2023-11-16 18:15:46.6805900,-4,5\n"),
     RUN_S, "t.csv:2: ContextTokens=-4"),
    ("mooncake-empty-file", trace_scenario("mooncake", "t.jsonl", ""), RUN_S, "t.jsonl: no rows"),
    ("mooncake-blank-lines", trace_scenario("mooncake", "t.jsonl", "\n\n"), RUN_S, "t.jsonl: no rows"),
    ("mooncake-not-json", trace_scenario("mooncake", "t.jsonl", MOONCAKE_ROW + "{oops\n"), RUN_S,
     "t.jsonl:2: not JSON"),
    ("mooncake-no-hash-ids", trace_scenario("mooncake", "t.jsonl", '{"timestamp": 0, "input_length": 600, '
                                            '"output_length": 10}\n'), RUN_S, "t.jsonl:1: hash_ids"),
    ("mooncake-text-length", trace_scenario("mooncake", "t.jsonl", '{"timestamp": 0, "input_length": "long", '
                                            '"output_length": 10, "hash_ids": []}\n'), RUN_S,
     "t.jsonl:1: input_length='long'"),
    ("mooncake-row-is-list", trace_scenario("mooncake", "t.jsonl", "[1, 2]\n"), RUN_S, "t.jsonl:1: expected a JSON object"),
    ("vllm-sharegpt-empty-list", trace_scenario("vllm_sharegpt", "t.json", "[]"), RUN_S, "t.json: no rows"),
    ("vllm-sharegpt-no-reply", trace_scenario("vllm_sharegpt", "t.json", json.dumps(
        [{"conversations": [{"from": "human", "value": "hi"}]}])), RUN_S, "t.json: no rows"),
    ("vllm-sharegpt-no-turns", trace_scenario("vllm_sharegpt", "t.json", json.dumps([{"conversations": []}])),
     RUN_S, "t.json: no rows"),
    ("vllm-sharegpt-not-list", trace_scenario("vllm_sharegpt", "t.json", '{"a": 1}'), RUN_S,
     "expected a JSON list of conversations"),
    ("vllm-sharegpt-turn-not-object", trace_scenario("vllm_sharegpt", "t.json", json.dumps(
        [{"conversations": ["hi", "there"]}])), RUN_S, "t.json: conversation 0"),
    ("vllm-sharegpt-empty-file", trace_scenario("vllm_sharegpt", "t.json", ""), RUN_S, "t.json:1: not JSON"),
    ("tokens-empty-file", trace_scenario("sharegpt_tokens", "t.jsonl", ""), RUN_S, "t.jsonl: no rows"),
    ("tokens-id-count-mismatch", trace_scenario("sharegpt_tokens", "t.jsonl", TOKENS_ROW.replace("[1, 2]", "[1]")),
     RUN_S, "t.jsonl:1: input_tok_ids"),
    ("lengths-empty-table", trace_scenario("lengths", "t.csv", "num_prefill_tokens,num_decode_tokens\n"), RUN_S,
     "t.csv: no requests (the table has a header but no rows)"),
    ("lengths-text-value", trace_scenario("lengths", "t.csv", "num_prefill_tokens,num_decode_tokens\nabc,3\n"), RUN_S,
     "t.csv:2: num_prefill_tokens='abc'"),
    ("trace-start-after-end", trace_scenario("mooncake", "t.jsonl", MOONCAKE_ROW, ", start_s: 99"), RUN_S,
     "workload.trace.start_s=99"),
    ("trace-missing-file", scenario("workload: {trace: {format: azure, path: nowhere.csv}, arrival: {process: trace}}\n"),
     RUN_S, "nowhere.csv"),
    # --- Hugging Face config.json
    ("hf-heads-text", config_json(num_attention_heads="four"), RUN_S, "num_attention_heads='four'"),
    ("hf-heads-zero", config_json(num_attention_heads=0), RUN_S, "num_attention_heads=0"),
    ("hf-kv-heads-zero", config_json(num_key_value_heads=-2), RUN_S, "num_key_value_heads=-2"),
    ("hf-hidden-missing", config_json(hidden_size=None), RUN_S, "hidden_size"),
    ("hf-heads-not-multiple", config_json(num_key_value_heads=3), RUN_S, "not a multiple of num_kv_heads=3"),
    ("hf-layers-negative", config_json(num_hidden_layers=-1), RUN_S, "=-1"),
    ("hf-hidden-not-a-multiple-of-heads", config_json(hidden_size=65), RUN_S,  # head_dim was 65 // 4 = 16
     "hidden_size=65 is not a multiple of num_attention_heads=4 and no head_dim is given"),
    ("hf-hidden-below-heads", config_json(hidden_size=2), RUN_S,  # head_dim 0, named as kvsim's field
     "hidden_size=2 is not a multiple of num_attention_heads=4"),
    ("hf-layers-text", config_json(num_hidden_layers="2"), RUN_S,  # read as 2, where num_attention_heads="4" is refused
     "num_hidden_layers='2': must be a positive integer"),
    ("hf-vocab-text", config_json(vocab_size="1000"), RUN_S, "vocab_size='1000': must be a positive integer"),
    ("hf-max-position-text", config_json(max_position_embeddings="4096"), RUN_S,
     "max_position_embeddings='4096': must be a positive integer"),
    ("hf-not-json", {"config.json": "{not json", "s.yaml": f"model: {{d}}/config.json\n{WORKLOAD}"}, RUN_S,
     "config.json"),
    ("hf-a-list", {"config.json": "[1, 2]", "s.yaml": f"model: {{d}}/config.json\n{WORKLOAD}"}, RUN_S,
     "expected a mapping"),
    ("hf-layer-types-a-number", config_json(model_type="gemma3_text", layer_types=5, sliding_window=512), RUN_S,
     "layer_types=5: must list 2 entries (num_hidden_layers), each 'full_attention' or 'sliding_attention'"),
    ("hf-layer-types-of-objects", config_json(model_type="gemma3_text", layer_types=[{}, {}], sliding_window=512),
     RUN_S, "layer_types=[{}, {}]: must list 2 entries"),
    ("hf-no-rope-layers-text", config_json(model_type="llama4_text", no_rope_layers="all"), RUN_S,
     "no_rope_layers='all': must list 2 entries (num_hidden_layers), each 0 or 1"),
    ("hf-first-k-dense-text", config_json(model_type="deepseek_v3", first_k_dense_replace="3"), RUN_S,
     "first_k_dense_replace='3': must be a whole number >= 0"),
    ("hf-quantization-config-a-string", config_json(quantization_config="fp8"), RUN_S,  # was read as unquantized
     "quantization_config='fp8': must be a mapping"),
    ("hf-duplicate-key", {"config.json": '{"hidden_size": 64, "hidden_size": 128}',
                          "s.yaml": f"model: {{d}}/config.json\n{WORKLOAD}"}, RUN_S,
     "config.json: cannot read: duplicate key 'hidden_size': give each key once at line 1"),  # read as JSON
    # --- GPU files
    ("gpu-file-bad-size", {"g.yaml": "memory_bytes: lots\nhbm_bandwidth_bytes_per_s: 1e12\nfp16_flops: 1e14\n"
                           "host_link_bandwidth_bytes_per_s: 1e10\n", "s.yaml": f"gpu: {{d}}/g.yaml\n{WORKLOAD}"},
     RUN_S, "memory_bytes='lots'"),
    ("gpu-file-missing-field", {"g.yaml": "memory_bytes: 80GiB\n", "s.yaml": f"gpu: {{d}}/g.yaml\n{WORKLOAD}"},
     RUN_S, "hbm_bandwidth_bytes_per_s: required field is missing"),
    # --- sizes that would not fit in memory (checked before allocating)
    ("billion-requests", {}, ["run", "--set", "workload.num_requests=1000000000"],
     "workload.num_requests=1000000000: this run needs at least"),
    ("billion-blocks", {}, ["run", "--set", "engine.num_gpu_blocks_override=1000000000"],
     "num_gpu_blocks_override=1000000000"),
    # 10**6 GiB of 2 MiB swap blocks: 512,000,000 of them at 3 list slots of 8 B and an int of 28 B (all but ids
    # 0-256), beside the GPU's 1,661,764 B (below) and 1,000 requests of 160 B: 24.8 GiB (a given limit: not every
    # machine has less)
    ("exabyte-swap", {}, ["run", "--set", "engine.scheduler=v0", "--set", "engine.swap_space=1000000",
                          "--memory-limit", "16GiB"], "engine.swap_space=1000000.0: this run needs at least 24.8 GiB"),
    ("over-a-given-memory-limit", {}, ["run", "--memory-limit", "1MiB"], "more than the limit of 1.0 MiB"),
    ("num-requests-boolean", {}, ["run", "--set", "workload.num_requests=true"],
     "workload: num_requests=true: expected a number, not a boolean"),
    ("gpu-memory-utilization-boolean", {}, ["run", "--set", "engine.gpu_memory_utilization=true"],
     "engine: gpu_memory_utilization=true: expected a number, not a boolean"),
    ("max-num-seqs-boolean", {}, ["run", "--set", "engine.max_num_seqs=false"],
     "engine: max_num_seqs=false: expected a number, not a boolean"),
    ("config-json-boolean-layers", config_json(num_hidden_layers=True), ["run", "{d}/s.yaml"],
     "num_hidden_layers=True: must be a positive integer"),
    ("speculative-tokens-boolean", {}, ["capacity", "--speculative-config",
                                        '{"method": "ngram", "num_speculative_tokens": true}'],
     "speculative_config: num_speculative_tokens=true: expected a number, not a boolean"),
    ("router-without-replicas", {}, ["run", "--set", "router.policy=affinity"],
     "router.policy='affinity': a router spreads requests over replicas; set replicas"),
    ("over-a-tiny-memory-limit", {}, ["run", "--memory-limit", "1KiB"], "more than the limit of 1.0 KiB"),
    # under 1 KiB the sizes are whole bytes: the GPU's 27,816 blocks at 4 list slots of 8 B each and an int of 28 B
    # for each id past 256, 27,816 x 32 + 27,559 x 28 = 1,661,764 B (scheduler v1 builds no CPU swap pool: vLLM v1
    # never swaps, whatever swap_space says), 1,000 requests at 160 B
    ("over-a-one-byte-memory-limit", {}, ["run", "--memory-limit", "1"],
     "(B by part: requests 160,000, kv_blocks 1,661,764, steps 0), more than the limit of 1 B;"),
    # a fleet: every replica's blocks (1,661,764 B, above) and 100 kB per engine, the requests
    # (1,000 x 160 B) once: 4 x 1,761,764 + 160,000 = 7,207,056 B, 6.9 MiB
    ("fleet-over-a-given-memory-limit", {}, ["run", "--set", "replicas=4", "--memory-limit", "4MiB"],
     "replicas=4: this fleet needs at least 6.9 MiB"),
    ("data-parallel-over-a-given-memory-limit", {}, ["run", "--set", "engine.data_parallel_size=4",
                                                     "--memory-limit", "4MiB"],
     "engine.data_parallel_size=4: this data-parallel group needs at least 6.9 MiB"),
    # 4,096 x 1,761,764 B + 40 x 160 B = 7,216,191,744 B, 6.72 GiB (such a fleet of 5 requests held 7.4 GB; the
    # floor of 40 B a block said 4.6 GiB)
    ("fleet-many-replicas-few-requests", {}, ["run", "--set", "replicas=4096", "--set", "workload.num_requests=40",
                                              "--memory-limit", "4GiB"],
     "replicas=4096: this fleet needs at least 6.7 GiB"),
    ("memory-limit-unparsable", {}, ["run", "--memory-limit", "plenty"], "--memory-limit='plenty'"),
    ("disagg-over-a-given-memory-limit", scenario(f"{DISAGG}{DISAGG_GROUPS}"), [*RUN_S, "--memory-limit", "1MiB"],
     # 2 x 1,761,764 B + 5 x 160 B = 3,524,328 B, 3.36 MiB
     "replicas=[1 x kv_producer, 1 x kv_consumer]: this fleet needs at least 3.4 MiB"),
    # a plan: every point is estimated first; refused up front only when even the smallest one cannot fit
    ("plan-smallest-point-over-the-limit", {}, [*PLAN, "--memory-limit", "1MiB"],
     "--memory-limit 1.0 MiB: even the smallest point (h100-80gb tp1, 1 replica, 1000 requests) needs at least"),
    ("plan-rate-search-first-probe-over-the-limit", {}, [*PLAN, "--search", "rate", "--memory-limit", "1MiB"],
     "--memory-limit 1.0 MiB: even the smallest point"),
    ("plan-memory-limit-unparsable", {}, [*PLAN, "--memory-limit", "plenty"], "--memory-limit='plenty'"),
    # a plan's xPyD splits (kvsim.planning.xpyd)
    ("plan-xpyd-no-prefill", {}, [*PLAN, "--xpyd", "0P1D"], "plan.xpyd=['0P1D']: '0P1D': needs at least 1 prefill (kv_producer)"),
    ("plan-xpyd-no-decode", {}, [*PLAN, "--xpyd", "1P1D,2P0D"], "'2P0D': needs at least 1 decode (kv_consumer)"),
    ("plan-xpyd-malformed", {}, [*PLAN, "--xpyd", "1P"], "plan.xpyd=['1P']: '1P': expected xPyD"),
    ("plan-xpyd-twice", {}, [*PLAN, "--xpyd", "1P1D", "--xpyd", "1p1d"], "plan.xpyd=['1P1D', '1p1d']: a split is given twice"),
    ("plan-xpyd-auto-on-slab", {}, [*PLAN, "--xpyd", "auto", "--set", "engine.allocator=slab-pow2"],
     "--xpyd auto: engine.allocator=slab-pow2: a prefill/decode split needs engine.allocator=paged"),
    ("plan-xpyd-link-unknown", {}, [*PLAN, "--xpyd", "1P1D", "--kv-transfer-config", '{"kv_link": "pigeon"}'],
     "kv_transfer_config.kv_link='pigeon'"),
    ("plan-kv-transfer-config-not-json", {}, [*PLAN, "--xpyd", "1P1D", "--kv-transfer-config", "[1,"],
     "--kv-transfer-config='[1,': not JSON"),
    ("plan-kv-transfer-config-without-splits", {}, [*PLAN, "--kv-transfer-config", '{"kv_link": "nvlink"}'],
     "give the splits with --xpyd"),
    ("plan-xpyd-slab-allocator", {}, [*PLAN, "--xpyd", "1P1D", "--set", "engine.allocator=slab-max"],
     "--xpyd 1P1D: engine.allocator=slab-max: a prefill/decode split needs engine.allocator=paged"),
    # --- configurations vLLM refuses at startup (vllm/config/scheduler.py, verify_max_model_len)
    ("v0-batch-below-max-model-len", {}, ["run", "--set", "engine.scheduler=v0", "--set",
                                          "engine.max_num_batched_tokens=512"],
     "max_num_batched_tokens (512) is smaller than max_model_len (8192)"),
    ("static-batch-below-max-model-len", {}, ["run", "--set", "engine.scheduler=static", "--set",
                                              "engine.max_num_batched_tokens=1000"],
     "max_num_batched_tokens (1000) is smaller than max_model_len (8192)"),
    ("batch-below-max-num-seqs", {}, ["run", "--set", "engine.max_num_batched_tokens=100", "--set",
                                      "engine.max_num_seqs=256"],
     "max_num_batched_tokens (100) must be greater than or equal to max_num_seqs (256)"),
    # --- measured runs that cannot have happened (kvsim validate)
    ("measured-negative-ttft", measured_run(scheduled_ts=None, first_token_ts=99.79), VALIDATE_M,
     "requests.jsonl:1: first_token_ts=99.79 is before queued_ts=100.0: the TTFT would be negative"),
    ("measured-last-token-before-first", measured_run(last_token_ts=100.005), VALIDATE_M,
     "last_token_ts=100.005 is before first_token_ts=100.01: the decode time (E2E below TTFT) would be negative"),
    ("measured-scheduled-before-queued", measured_run(scheduled_ts=99.0), VALIDATE_M,
     "scheduled_ts=99.0 is before queued_ts=100.0: the queue time would be negative"),
    ("bench-negative-ttft", bench_json(ttfts=[0.01, -0.21]), VALIDATE_B, "b.json: ttfts[1]=-0.21 is negative"),
    ("bench-e2e-below-ttft", bench_json(latencies=[0.005, 0.06]), VALIDATE_B,
     "b.json: request 0's E2E 0.005 s is below its TTFT 0.01 s"),
    ("bench-negative-gap", bench_json(latencies=None, itls=[[0.01, -0.02], [0.02, 0.02]]), VALIDATE_B,
     "b.json: itls[0] has a negative gap"),
    # --- measured profiles that are malformed or not physical (kvsim import-profile)
    ("profile-meta-empty", bundle(meta=""), IMPORT_B, "meta.yaml: expected a mapping (gpu, model, variant, "
                                                      "tp_degrees, ...), got an empty file"),
    ("profile-meta-a-list", bundle(meta="- gpu\n- model\n"), IMPORT_B, "meta.yaml: expected a mapping"),
    ("profile-meta-bad-tp-degrees", bundle(meta=BUNDLE_META.replace("[1]", "[one]")), IMPORT_B,
     "tp_degrees must list integers"),
    # int() truncated these: a TP degree of 1.5 read as 1, 12.5 heads (times the TP) as 12, without a word
    ("profile-meta-fractional-tp-degree", bundle(meta=BUNDLE_META.replace("[1]", "[1.5]")), IMPORT_B,
     "tp_degrees must list integers"),
    ("profile-meta-fractional-override", bundle(meta=BUNDLE_META + "engine_effective: {hf_overrides: "
                                                "{num_attention_heads: 12.5}}\n"), IMPORT_B,
     "engine_effective.hf_overrides map shape names to integers"),
    ("profile-truncated-csv", bundle(dense=BUNDLE_DENSE + "down_proj,256"), IMPORT_B,
     "dense.csv: line 6 does not have the header's 3 fields (a truncated or malformed file)"),
    ("profile-text-in-a-size", bundle(dense=BUNDLE_DENSE.replace("qkv_proj,256", "qkv_proj,lots")), IMPORT_B,
     "(gemm qkv): num_tokens='lots' is not a number"),
    ("profile-text-in-attention", bundle(attention="prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n"
                                                   "x,0,1,16,10\n"), IMPORT_B,
     "attention.csv: prefill_chunk='x' is not a whole number"),
    ("profile-infinite-time", bundle(dense=BUNDLE_DENSE.replace("qkv_proj,256,60", "qkv_proj,256,inf")), IMPORT_B,
     "(gemm qkv): time_s='inf' is not a finite number"),
    ("profile-duplicate-points-900x-apart", bundle(dense=BUNDLE_DENSE + "qkv_proj,1,27000\n"), IMPORT_B,
     "the gemm qkv point num_tokens=1 is measured 2 times, 900x apart"),
    ("profile-faster-when-bigger", bundle(dense=BUNDLE_DENSE.replace("gate_up_proj,256,200", "gate_up_proj,256,2")),
     IMPORT_B, "the gemm gate_up time at num_tokens=256 (2e-06 s) is 50x below the time at the smaller num_tokens=1"),
    ("profile-for-another-model", bundle(meta=BUNDLE_META.replace("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-32B")),
     IMPORT_B, "measured for model='Qwen/Qwen3-32B', but the scenario's model is 'llama-3.1-8b'"),
    ("vidur-no-heads", vidur("0,32,4096,11008,32000,True,1,1,0.05,0.2"), IMPORT_V,
     "mlp.csv: n_head='0' must be a positive whole number"),
    ("vidur-all-negative", vidur(VIDUR_ROW.format(tokens=1, ms=-0.05), VIDUR_ROW.format(tokens=2, ms=-0.06)), IMPORT_V,
     "mlp.csv: time_stats.attn_pre_proj.median='-0.05' is negative (a time is 0, a timer that did not fire, or "
     "positive)"),  # was "no usable rows": the negative times left out as timers that did not fire (sweep 21)
    ("vidur-truncated", vidur(VIDUR_ROW.format(tokens=1, ms=0.05), "32,32,4096,11008,32000,True,2,1,0.06"), IMPORT_V,
     "mlp.csv: line 3 does not have the header's 10 fields (a truncated or malformed file)"),
    # --- disaggregated prefill/decode (kvsim.fleet.disagg)
    ("disagg-pool-size-zero", scenario(f"{DISAGG}replicas: [{{count: 0, kv_role: kv_producer}}, "
                                       "{count: 1, kv_role: kv_consumer}]\n"), RUN_S, "replicas.0.count=0"),
    ("disagg-no-decode-pool", scenario(f"{DISAGG}replicas: [{{count: 2, kv_role: kv_producer}}]\n"), RUN_S,
     "no replica group with kv_role=kv_consumer"),
    ("disagg-link-zero-bandwidth", scenario(f"kv_transfer_config: {{kv_link_bandwidth_bytes_per_s: 0}}\n"
                                            f"{WORKLOAD}{DISAGG_GROUPS}"), RUN_S,
     "kv_transfer_config.kv_link_bandwidth_bytes_per_s=0"),
    ("disagg-link-unknown", scenario(f"kv_transfer_config: {{kv_link: carrier-pigeon}}\n{WORKLOAD}{DISAGG_GROUPS}"),
     RUN_S, "kv_transfer_config.kv_link='carrier-pigeon'"),
    ("disagg-role-unknown", scenario(f"{DISAGG}replicas: [{{count: 1, kv_role: kv_both}}, "
                                     "{count: 1, kv_role: kv_consumer}]\n"), RUN_S, "replicas.0.kv_role='kv_both'"),
    ("disagg-role-without-config", scenario(f"{WORKLOAD}{DISAGG_GROUPS}"), RUN_S, "kv_transfer_config is missing"),
    ("disagg-slab-allocator", scenario(f"{DISAGG}engine: {{allocator: slab-max}}\n{DISAGG_GROUPS}"), RUN_S,
     "engine.allocator=slab-max"),
    # --- KV offload tiers (engine.kv_offload, kvsim.kv.offload_connector)
    ("offload-tier-larger-than-host", scenario(f"engine: {{kv_offload: {{cpu_bytes: 3TB}}}}\n{WORKLOAD}"), RUN_S,
     "cpu_bytes=3000000000000: larger than host_memory_bytes=2000000000000"),
    ("offload-blocks-larger-than-host", scenario(f"engine: {{kv_offload: {{num_cpu_blocks: 10000000}}}}\n{WORKLOAD}"),
     RUN_S, "engine.kv_offload.num_cpu_blocks=10000000: 20971520000000 bytes, larger than host_memory_bytes"),
    ("offload-zero-bandwidth", scenario(f"engine: {{kv_offload: {{cpu_bytes: 1GiB, bandwidth_bytes_per_s: 0}}}}\n"
                                        f"{WORKLOAD}"), RUN_S, "engine.kv_offload.bandwidth_bytes_per_s=0"),
    ("offload-zero-disk-bandwidth", scenario("engine: {kv_offload: {cpu_bytes: 1GiB, disk_bytes: 1TB, "
                                             f"disk_bandwidth_bytes_per_s: 0}}}}\n{WORKLOAD}"), RUN_S,
     "engine.kv_offload.disk_bandwidth_bytes_per_s=0"),
    ("offload-disk-without-bandwidth", scenario(f"engine: {{kv_offload: {{cpu_bytes: 1GiB, disk_bytes: 1TB}}}}\n"
                                                f"{WORKLOAD}"), RUN_S, "needs disk_bandwidth_bytes_per_s"),
    ("offload-disk-without-cpu", scenario("engine: {kv_offload: {disk_bytes: 1TB, disk_bandwidth_bytes_per_s: 1e9}}\n"
                                          f"{WORKLOAD}"), RUN_S, "needs a CPU tier above it"),
    ("offload-size-text", scenario(f"engine: {{kv_offload: {{cpu_bytes: lots}}}}\n{WORKLOAD}"), RUN_S,
     "engine.kv_offload.cpu_bytes"),
    ("offload-on-v0", scenario(f"engine: {{scheduler: v0, kv_offload: {{cpu_bytes: 1GiB}}}}\n{WORKLOAD}"), RUN_S,
     "kv_offload needs scheduler=v1 (got v0)"),
    ("offload-set-zero-bandwidth", {}, ["run", "--set", "engine.kv_offload={cpu_bytes: 1GiB, bandwidth_bytes_per_s: 0}"],
     "engine.kv_offload.bandwidth_bytes_per_s=0"),
    # --- autoscaled fleets (kvsim.fleet.autoscaled)
    ("autoscaler-never-scales", scenario(f"{WORKLOAD}replicas: 2\nrouter: {{policy: least_outstanding}}\n"
                                         "autoscaler: {min_replicas: 2, max_replicas: 2}\n"), RUN_S,
     "autoscaler.max_replicas=2: equals min_replicas"),
    ("autoscaler-startup-negative", scenario(f"{WORKLOAD}replicas: 2\nrouter: {{policy: least_outstanding}}\n"
                                             "autoscaler: {startup_s: -1}\n"), RUN_S, "autoscaler.startup_s=-1"),
    ("autoscaler-over-a-given-memory-limit", scenario(f"{WORKLOAD}replicas: 1\nrouter: {{policy: least_outstanding}}\n"
                                                      "autoscaler: {max_replicas: 64}\n"),
     [*RUN_S, "--memory-limit", "64MiB"], "autoscaler.max_replicas=64: this fleet needs at least"),
    ("autoscaler-without-count", scenario(f"{WORKLOAD}replicas: [{{count: 2}}]\nautoscaler: {{}}\n"), RUN_S,
     "autoscaler: needs replicas as a count"),
    # --- inf, NaN, huge and tiny numbers, booleans for counts (found by the bad-input sweep)
    ("rate-infinite", scenario(f"workload: {{arrival: {{rate: .inf}}, {LENGTHS}}}\n"), RUN_S,
     "workload.arrival.rate=inf"),
    ("lognormal-mean-infinite", scenario("workload: {prompt_len: {dist: lognormal, mean: .inf, sigma: 1}, "
                                         "output_len: {dist: fixed, value: 1}}\n"), RUN_S,
     "workload.prompt_len.lognormal.mean=inf"),
    ("fixed-length-beyond-int64", scenario("workload: {prompt_len: {dist: fixed, value: 99999999999999999999}, "
                                           "output_len: {dist: fixed, value: 1}}\n"), RUN_S,
     "workload.prompt_len.fixed.value=99999999999999999999"),
    ("swap-space-infinite", scenario(f"engine: {{swap_space: .inf}}\n{WORKLOAD}"), RUN_S, "engine.swap_space=inf"),
    ("swap-space-1e308", scenario(f"engine: {{swap_space: 1.0e+308, scheduler: v0, preemption_mode: swap}}\n"
                                  f"{WORKLOAD}"), RUN_S, "engine.swap_space=1e+308"),
    ("latency-overhead-infinite", scenario(f"{WORKLOAD}latency: {{overhead_s: .inf}}\n"), RUN_S,
     "latency.overhead_s=inf"),
    ("latency-constant-step-infinite", scenario(f"{WORKLOAD}latency: {{model: constant, step_s: .inf}}\n"), RUN_S,
     "latency.step_s=inf"),
    ("gpu-link-bandwidth-tiny", scenario(f"engine: {{tensor_parallel_size: 2}}\n{WORKLOAD}"
                                         "gpu_link: {kind: nvlink, bandwidth_bytes_per_s: 1.0e-300, latency_s: 0}\n"),
     RUN_S, "gpu_link.bandwidth_bytes_per_s=1e-300"),
    ("gpu-file-flops-infinite", {"g.yaml": "memory_bytes: 80GiB\nhbm_bandwidth_bytes_per_s: 3.35e12\n"
                                           "fp16_flops: .inf\nhost_link_bandwidth_bytes_per_s: 64e9\n",
                                 "s.yaml": f"gpu: {{d}}/g.yaml\n{WORKLOAD}"}, RUN_S, "fp16_flops=inf"),
    ("kv-link-bandwidth-tiny", scenario(f"{WORKLOAD}kv_transfer_config: {{kv_link_bandwidth_bytes_per_s: 1.0e-300}}\n"
                                        "replicas: [{kv_role: kv_producer}, {kv_role: kv_consumer}]\n"), RUN_S,
     "kv_transfer_config.kv_link_bandwidth_bytes_per_s=1e-300"),
    ("autoscaler-sync-period-tiny", scenario(f"{WORKLOAD}replicas: 1\nrouter: {{policy: least_outstanding}}\n"
                                             "autoscaler: {max_replicas: 4, sync_period_s: 1.0e-300}\n"), RUN_S,
     "autoscaler.sync_period_s=1e-300"),  # the clock stood still: the run synced forever
    ("autoscaler-slo-window-infinite", scenario(f"{WORKLOAD}replicas: 1\nrouter: {{policy: least_outstanding}}\n"
                                                "autoscaler: {max_replicas: 4, slo_window_s: .inf}\n"), RUN_S,
     "autoscaler.slo_window_s=inf"),
    ("priority-class-beyond-int64", scenario(f"workload: {{num_requests: 5, {LENGTHS}, priority: {{classes: "
                                             "[{name: a, priority: 99999999999999999999, weight: 1}]}}\n"), RUN_S,
     "priority=99999999999999999999"),
    ("priority-class-a-boolean", scenario(f"workload: {{num_requests: 5, {LENGTHS}, priority: {{classes: "
                                          "[{name: a, priority: true, weight: 1}]}}\n"), RUN_S,
     "priority=true: expected a number, not a boolean"),
    ("priority-class-weight-infinite", scenario(f"workload: {{num_requests: 5, {LENGTHS}, priority: {{classes: "
                                                "[{name: a, priority: 0, weight: .inf}]}}\n"), RUN_S,
     "weight=inf"),
    ("replicas-a-boolean", scenario(f"{WORKLOAD}replicas: true\n"), RUN_S,
     "replicas=true: expected a number, not a boolean"),
    ("trace-rate-scale-infinite", trace_scenario("azure", "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                                 "2023-11-16 18:15:46.68,374,44\n", ", rate_scale: .inf"), RUN_S,
     "workload.trace.rate_scale=inf"),
    # --- traces: values no reader may take (found by the bad-input sweep)
    ("mooncake-timestamp-infinite", trace_scenario("mooncake", "t.jsonl", '{"timestamp": Infinity, "input_length": 5, '
                                                   '"output_length": 5, "hash_ids": [1]}\n'), RUN_S,
     "t.jsonl:1: timestamp=inf is not a finite number"),
    ("mooncake-timestamp-nan", trace_scenario("mooncake", "t.jsonl", '{"timestamp": NaN, "input_length": 5, '
                                              '"output_length": 5, "hash_ids": [1]}\n'), RUN_S,
     "t.jsonl:1: timestamp=nan is not a finite number"),
    ("mooncake-length-a-boolean", trace_scenario("mooncake", "t.jsonl", '{"timestamp": 0, "input_length": true, '
                                                 '"output_length": 5, "hash_ids": [1]}\n'), RUN_S,
     "t.jsonl:1: input_length=True is not an integer"),
    ("mooncake-length-fractional", trace_scenario("mooncake", "t.jsonl", '{"timestamp": 0, "input_length": 5.5, '
                                                  '"output_length": 5, "hash_ids": [1]}\n'), RUN_S,
     "t.jsonl:1: input_length=5.5 is not an integer"),
    ("mooncake-length-1e400", trace_scenario("mooncake", "t.jsonl", '{"timestamp": 0, "input_length": 1e400, '
                                             '"output_length": 5, "hash_ids": []}\n'), RUN_S,
     "t.jsonl:1: input_length=inf is not an integer"),
    ("mooncake-hash-ids-objects", trace_scenario("mooncake", "t.jsonl", '{"timestamp": 0, "input_length": 5, '
                                                 '"output_length": 5, "hash_ids": [{"a": 1}]}\n'), RUN_S,
     "t.jsonl:1: hash_ids must be integers or strings"),
    ("mooncake-nested-too-deeply", trace_scenario("mooncake", "t.jsonl", "[" * 100_000 + "]" * 100_000 + "\n"),
     RUN_S, "t.jsonl:1: not JSON (nested too deeply for kvsim to read)"),
    ("sharegpt-token-ids-text", trace_scenario("sharegpt_tokens", "t.jsonl", '{"arrival_time_ns": 0, "input_toks": 2, '
                                               '"output_toks": 1, "input_tok_ids": ["a", "b"], "output_tok_ids": [1]}\n'),
     RUN_S, "t.jsonl:1: input_tok_ids and output_tok_ids must be integer token ids"),
    ("azure-column-named-twice", trace_scenario("azure", "t.csv", "TIMESTAMP,ContextTokens,ContextTokens,"
                                                "GeneratedTokens\n2023-11-16 18:15:46.68,100,9,44\n"),
     RUN_S, "t.csv: its header names the column 'ContextTokens' twice"),
    ("sharegpt-token-ids-negative", trace_scenario("sharegpt_tokens", "t.jsonl", '{"arrival_time_ns": 0, '
                                                   '"input_toks": 2, "output_toks": 1, "input_tok_ids": [5, -1], '
                                                   '"output_tok_ids": [1]}\n'),
     RUN_S, "t.jsonl:1: input_tok_ids and output_tok_ids must be integer token ids (>= 0)"),
    ("azure-tokens-beyond-int64", trace_scenario("azure", "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                                 "2023-11-16 18:15:46.68,99999999999999999999999,44\n"), RUN_S,
     "t.csv:2: ContextTokens=99999999999999999999999 is more tokens than kvsim counts"),
    ("azure-priority-beyond-int64", trace_scenario("azure", "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,P\n"
                                                   "2023-11-16 18:15:46.68,374,44,99999999999999999999\n",
                                                   ", priority_column: P"), RUN_S,
     "t.csv:2: priority column P='99999999999999999999' is outside int64"),
    ("azure-field-over-the-csv-limit", trace_scenario("azure", "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n\""
                                                      + "x" * 200_000 + "\",1,1\n"), RUN_S,
     "t.csv: not a CSV file kvsim reads (field larger than field limit"),
    ("servegen-empty-folder", {"s.yaml": "workload: {num_requests: 5, arrival: {process: trace}, "
                                         "trace: {format: servegen, path: sg}}\n", "sg/README": "nothing\n"}, RUN_S,
     "servegen needs at least one client"),
    ("servegen-dataset-a-list", {"s.yaml": "workload: {num_requests: 5, arrival: {process: trace}, "
                                           "trace: {format: servegen, path: sg, clients: [1]}}\n",
                                 "sg/chunk-1-trace.csv": "0,1,1\n", "sg/chunk-1-dataset.json": "[1]\n"}, RUN_S,
     "malformed ServeGen dataset"),
    # --- other commands
    ("capacity-context-lengths", {}, ["capacity", "--context-lengths", "1k,2k"], "--context-lengths='1k,2k'"),
    ("plan-workers-zero", {}, ["plan", "--workers", "0", "--gpu", "h100-80gb", "--slo", "ttft_s.p90=2"],
     "--workers=0: expected at least 1 process"),  # a LocalCluster of no processes
    ("report-workers-negative", {}, ["report", "--workers", "-1"], "--workers=-1: expected at least 1 process"),
    ("report-workers-a-slip", {}, ["report", "--quick", "--workers", "100000"],  # forked thousands of processes
     "--workers=100000: more than 4 processes per CPU"),
    ("plan-workers-a-slip", {}, [*PLAN[:-2], "--workers", "100000"], "--workers=100000: more than 4 processes per CPU"),
    ("run-output-empty", {}, ["run", "-o", ""], "--output='': is empty"),  # not runs/NAME, not the working folder
    ("report-output-empty", {}, ["report", "-o", ""], "--output='': is empty"),
    ("report-every-request-too-long", {}, ["report", "--quick", "--set", "engine.max_model_len=1"],  # a TypeError
     "engine.max_model_len=1: every request's prompt reaches it"),  # after the first studies' runs
    ("report-every-request-too-long-file", scenario(f"engine: {{max_model_len: 64}}\n{WORKLOAD}"),
     ["report", "{d}/s.yaml", "--quick"], "engine.max_model_len=64: every request"),
    ("report-dask-address-empty", {}, ["report", "--quick", "--dask-address", ""],  # ran every study here
     "--dask-address='': is empty"),
    ("plan-dask-address-empty", {}, [*PLAN, "--dask-address", ""], "--dask-address='': is empty"),
    ("report-dask-address-malformed", {}, ["report", "--quick", "--dask-address", "nonsense"],  # a ValueError
     "dask_address='nonsense'"),
    ("run-kv-transfer-config-empty", {}, ["run", "--kv-transfer-config", ""],
     "--kv-transfer-config='': not JSON (Expecting value at character 0)"),  # was read as no setting: a colocated run
    ("capacity-kv-bytes", {}, ["capacity", "--kv-cache-memory-bytes", "lots"], "kv_cache_memory_bytes"),
    ("capacity-kv-bytes-below-a-block", {}, ["capacity", "--kv-cache-memory-bytes", "1MiB"],  # named no setting
     "engine.kv_cache_memory_bytes=1,048,576: a KV pool of 1,048,576 B holds no block of 2,097,152 B"),
    ("run-kv-bytes-below-a-block", {}, ["run", "--set", "engine.kv_cache_memory_bytes=1MiB"],
     "engine.kv_cache_memory_bytes=1,048,576: a KV pool"),
    ("capacity-tp-zero", {}, ["capacity", "--tensor-parallel-size", "0"], "tensor_parallel_size=0"),
    ("capacity-gpu-util-a-percentage", {}, ["capacity", "--gpu-memory-utilization", "95"],
     "gpu_memory_utilization=95.0: must be a fraction in (0, 1] (did you mean 0.95?)"),
    ("capacity-max-num-seqs-zero", {}, ["capacity", "--max-num-seqs", "0"], "max_num_seqs=0"),
    ("capacity-speculative-config-not-json", {}, ["capacity", "--speculative-config", "eagle"],
     "--speculative-config='eagle': not JSON"),
    ("capacity-speculative-k-zero", {}, ["capacity", "--speculative-config",
                                         '{"method": "eagle", "num_speculative_tokens": 0}'], "num_speculative_tokens=0"),
    ("run-max-num-seqs-zero", {}, ["run", "--max-num-seqs", "0"], "engine.max_num_seqs=0"),
    ("report-max-num-seqs-zero", {}, ["report", "--max-num-seqs", "0"], "engine.max_num_seqs=0"),
    ("report-gpu-unknown", {}, ["report", "--gpu", "tpu"], "gpu='tpu'"),
    ("report-set-broken", {}, ["report", "--set", "engine.block_size=[1"], "--set 'engine.block_size=[1'"),
    ("calibrate-dtype", {}, ["calibrate", "--gpu", "h200", "--kv-cache-dtype", "int4"], "--kv-cache-dtype='int4'"),
    ("calibrate-block-sizes", {}, ["calibrate", "--gpu", "h200", "--block-sizes", "x"], "--block-sizes='x'"),
    ("calibrate-block-size-zero", {}, ["calibrate", "--gpu", "h200", "--block-sizes", "16,0", "--dry-run"],
     "--block-sizes='16,0': block_size=0: Input should be greater than 0"),  # a grid of block size 0 was printed
    ("calibrate-block-size-not-vllm", {}, ["calibrate", "--gpu", "h200", "--block-sizes", "7", "--dry-run"],
     "--block-sizes='7': block_size=7: vLLM accepts 1, 8, 16, 32, 64, 128, 256"),
    ("calibrate-tp-not-dividing-heads", {}, ["calibrate", "--gpu", "h200", "-tp", "3", "--dry-run"],
     "tensor_parallel_size=3: must divide llama-3.1-8b's 32 attention heads"),  # 32 // 3 = 10 heads were timed
    ("capacity-gpu-hourly-cost-infinite", {}, ["capacity", "--gpu-hourly-cost", "inf"],
     "'--gpu-hourly-cost': 'inf': Input should be a finite number"),  # sweep 16: refused as the flag's value
    ("capacity-num-sequences-negative", {}, ["capacity", "--num-sequences", "-5"], "--num-sequences=-5"),
    ("capacity-context-length-twice", {}, ["capacity", "--context-lengths", "1024,2048,1024"],
     "--context-lengths='1024,2048,1024': 1024 is given twice"),
    ("capacity-num-sequences-without-prefix", {}, ["capacity", "--num-sequences", "10"],
     "--num-sequences=10: counts the sequences sharing a prefix"),
    ("output-is-a-file", {"taken": "user data\n"}, ["run", "--set", "workload.num_requests=5", "-o", "{d}/taken"],
     "is not a folder"),
    # --- kvsim import-profile, second sweep
    ("profile-native-names-the-file-read", native_profile("gemm,qkv,,,,2,,,,,,,,-5e-05,,,,,,,"), IMPORT_N,
     "p.csv: row 5 (gemm qkv): time_s='-5e-05' must be positive"),  # was named by its source_path, elsewhere
    ("profile-native-long-row", native_profile("gemm,qkv,,,,2,,,,,,,,5e-05,,,,,,,,7"), IMPORT_N,
     "p.csv: row 5 does not have the header's 21 fields (a truncated or malformed file)"),  # the extra one ignored
    ("profile-native-short-row", native_profile("gemm,qkv,,,,2,,,,,,,,5e-05"), IMPORT_N,
     "p.csv: row 5 does not have the header's 21 fields"),
    ("run-calibrated-profile-long-row", {**native_profile("gemm,qkv,,,,2,,,,,,,,5e-05,,,,,,,,7"),
                                         "s.yaml": f"latency: {{model: calibrated, profile: p.csv}}\n{WORKLOAD}"},
     RUN_S, "p.csv: row 5 does not have the header's 21 fields"),
    ("profile-source-spans-lines", bundle(), [*IMPORT_B, "--source-repository", "a\nb: c"],  # was written, unreadable
     "profile metadata source_repository='a\\nb: c': spans lines; a profile CSV keeps each metadata value on one line"),
    ("profile-meta-duplicate-key", bundle(meta=BUNDLE_META + "gpu: NVIDIA H100\n"), IMPORT_B,  # the last one was used
     "meta.yaml: cannot read: duplicate key 'gpu' (lines 1 and 5): give each key once"),
    # --- keys that are not strings: a TypeError from `Model(**raw)` ("keywords must be strings")
    ("yaml-integer-key", scenario(f"1: 2\n{WORKLOAD}"), RUN_S, "kvsim: error: 1: a key must be a string, not int"),
    ("yaml-null-key", scenario(f"~: 2\n{WORKLOAD}"), RUN_S, "None: a key must be a string, not NoneType"),
    ("plan-spec-integer-key", {"spec.yaml": "1: 2\n"}, [*PLAN, "--spec", "{d}/spec.yaml"],
     "plan.1: a key must be a string, not int"),
    # --- integers longer than Python converts (4,300 digits): a bare ValueError out of PyYAML and json
    ("yaml-integer-too-long", scenario(f"seed: {HUGE}\n{WORKLOAD}"), RUN_S,
     "not valid YAML: an integer of 5,000 digits is longer than kvsim reads at line 1, column 7"),
    ("set-integer-too-long", {}, ["run", "--set", f"seed={HUGE}"],  # the flag is cut, not echoed whole
     f"--set 'seed={'9' * 51}...: the value is not valid YAML (an integer of 5,000 digits"),
    ("hf-integer-too-long", {**config_json(), "config.json": config_json()["config.json"].replace(
        '"hidden_size": 64', f'"hidden_size": {HUGE}')}, RUN_S, "config.json: cannot read: an integer of 5,000 digits"),
    ("mooncake-integer-too-long", trace_scenario("mooncake", "t.jsonl", MOONCAKE_ROW.replace("600", HUGE)), RUN_S,
     "t.jsonl:1: not JSON (an integer of 5,000 digits is longer than kvsim reads)"),
    ("kv-transfer-config-integer-too-long", {}, ["run", "--kv-transfer-config", f'{{"kv_link_bandwidth_bytes_per_s": '
                                                                                 f'{HUGE}}}'],
     "--kv-transfer-config='{\"kv_link_bandwidth_bytes_per_s\": 99"),
    ("capacity-speculative-config-integer-too-long", {}, ["capacity", "--speculative-config",
                                                          f'{{"num_speculative_tokens": {HUGE}}}'],
     "not JSON (an integer of 5,000 digits is longer than kvsim reads at character 27)"),
    ("bench-integer-too-long", {"b.json": f'{{"input_lens": [{HUGE}]}}'}, VALIDATE_B,
     "b.json: not JSON (an integer of 5,000 digits is longer than kvsim reads at line 1)"),
    ("measured-integer-too-long", {**measured_run(), "m/vllm/requests.jsonl": f'{{"input_toks": {HUGE}}}\n'},
     VALIDATE_M, "requests.jsonl:1: not JSON (an integer of 5,000 digits"),
    ("plan-spec-integer-too-long", {"spec.yaml": f"max_replicas: {HUGE}\n"}, [*PLAN, "--spec", "{d}/spec.yaml"],
     "not valid YAML: an integer of 5,000 digits is longer than kvsim reads at line 1, column 15"),
    ("plan-engine-integer-too-long", {}, [*PLAN, "--engine", f"max_num_seqs={HUGE}"],
     f"--engine max_num_seqs='{'9' * 56}...: not a comma-separated list of values"),
    # --- a plan's candidates and flags given twice (as `plan-xpyd-twice`): searched twice, or the last one kept
    ("plan-gpu-twice", {}, [*PLAN, "--gpu", "h100-80gb"], "plan.gpus=['h100-80gb', 'h100-80gb']: 'h100-80gb' is given twice"),
    ("plan-tp-twice", {}, [*PLAN, "-tp", "1", "-tp", "1"], "plan.tensor_parallel_sizes=[1, 1]: 1 is given twice"),
    ("plan-engine-value-twice", {}, [*PLAN, "--engine", "max_num_seqs=128,128"],
     "plan.engine: max_num_seqs=128 is given twice"),
    ("plan-slo-twice", {}, [*PLAN, "--slo", "ttft_s.p90=3"], "--slo 'ttft_s.p90=3': ttft_s.p90 is given twice"),
    ("plan-hourly-cost-twice", {}, [*PLAN, "--gpu-hourly-cost", "h100-80gb=2", "--gpu-hourly-cost", "h100-80gb=3"],
     "--gpu-hourly-cost 'h100-80gb=3': h100-80gb is given twice"),
    ("plan-spec-slo-not-a-mapping", {"spec.yaml": "slo: fast\n"}, [*PLAN, "--spec", "{d}/spec.yaml"],
     "plan.slo='fast': Input should be a valid dictionary"),  # was a TypeError where --slo added to it
    ("plan-hourly-cost-infinite", {}, [*PLAN, "--gpu-hourly-cost", "h100-80gb=inf"],  # was refused after the search
     "--gpu-hourly-cost h100-80gb='inf': expected a price per hour, a finite number"),
    # --- nesting deeper than the recursion limit: a RecursionError out of PyYAML and json
    ("yaml-nested-too-deeply", scenario(f"name: {DEEP}\n{WORKLOAD}"), RUN_S,
     "not valid YAML: nested too deeply for kvsim to read"),
    ("set-nested-too-deeply", {}, ["run", "--set", f"name={DEEP}"],
     "the value is not valid YAML (nested too deeply for kvsim to read)"),
    ("hf-nested-too-deeply", {**config_json(), "config.json": config_json()["config.json"][:-1] + f', "x": {DEEP}}}'},
     RUN_S, "config.json: cannot read: nested too deeply for kvsim to read"),
    ("capacity-speculative-config-nested-too-deeply", {}, ["capacity", "--speculative-config", f'{{"a": {DEEP}}}'],
     "not JSON (nested too deeply for kvsim to read at character 0)"),
    ("profile-meta-nested-too-deeply", bundle(meta=f"{BUNDLE_META}x: {DEEP}\n"), IMPORT_B,
     "meta.yaml: cannot read: nested too deeply for kvsim to read"),
    ("yaml-control-character", scenario(f"name: a\x00b\n{WORKLOAD}"), RUN_S,  # was "not valid YAML: ReaderError"
     "not valid YAML: character #x0000 is not allowed (special characters are not allowed) at character 7"),
    ("plan-spec-duplicate-key", {"spec.yaml": "gpus: [h100-80gb]\ngpus: [a100-80gb]\n"},  # the last one was used
     [*PLAN, "--spec", "{d}/spec.yaml"], "not valid YAML: duplicate key 'gpus' (lines 1 and 2)"),
    # --- third sweep: `true`/`false` inside a list or a dict (read as 1 and 0: every draft accepted)
    ("speculative-acceptance-rate-a-boolean", {}, ["run", "--set", "engine.speculative_config={method: ngram, "
                                                   "num_speculative_tokens: 2, acceptance_rates: [0.5, true]}"],
     "engine.speculative_config: acceptance_rates[1]=true: expected a number, not a boolean"),
    ("plan-spec-tp-a-boolean", {"spec.yaml": "tensor_parallel_sizes: [true]\n"}, [*PLAN, "--spec", "{d}/spec.yaml"],
     "plan: tensor_parallel_sizes[0]=true: expected a number, not a boolean"),
    ("trace-clients-a-boolean", trace_scenario("azure", "t.csv", AZURE_HEAD + "2023-11-16 18:15:46.68,374,44\n",
                                               ", clients: [false]"), RUN_S,
     "workload.trace: clients[0]=false: expected a number, not a boolean"),
    # --- `builtin:NAME` was a glob in the data folder: the README, a scenario or `../scenario.py` read as a trace
    ("builtin-readme", scenario("workload: {num_requests: 5, arrival: {process: trace}, "
                                "trace: {format: azure, path: 'builtin:README'}}\n"), RUN_S,
     "workload.trace.path='builtin:README': no built-in data named 'README' (there are: azure_conv, "),
    ("builtin-a-pattern", scenario("workload: {num_requests: 5, arrival: {process: trace}, "
                                   "trace: {format: azure, path: 'builtin:*'}}\n"), RUN_S,
     "workload.trace.path='builtin:*': no built-in data named '*'"),
    ("builtin-outside-the-data", scenario("workload: {num_requests: 5, arrival: {process: trace}, "
                                          "trace: {format: azure, path: 'builtin:../scenario'}}\n"), RUN_S,
     "workload.trace.path='builtin:../scenario': no built-in data named '../scenario'"),
    ("builtin-a-scenario", scenario("workload: {num_requests: 5, prompt_len: {dist: empirical, column: prompt, table: "
                                    "'builtin:default_scenario'}, output_len: {dist: fixed, value: 1}}\n"), RUN_S,
     "workload.prompt_len.table='builtin:default_scenario': no built-in data named 'default_scenario'"),
    # --- validate: a --model or --gpu other than the one the run records was replayed in silence
    ("validate-model-not-the-runs", bench_json(), [*VALIDATE_B[:3], "opt-13b", *VALIDATE_B[4:]],
     "--model='opt-13b': num_layers=40, but the measured run is of 'meta-llama/Llama-3.1-8B' (preset llama-3.1-8b, "
     "num_layers=32)"),
    ("validate-gpu-not-the-runs", bench_json(gpu_name="NVIDIA H100 80GB HBM3"), [*VALIDATE_B[:5], "a100-80gb",
                                                                                *VALIDATE_B[6:]],
     "--gpu='a100-80gb': memory_bytes=85,899,345,920, but the measured run ran on 'NVIDIA H100 80GB HBM3' "
     "(preset h100-80gb, memory_bytes=85,520,809,984)"),
    ("validate-folder-model-not-the-runs", measured_run(), [*VALIDATE_M, "--model", "qwen3-8b"],
     "--model='qwen3-8b': num_layers=36, but the measured run is of 'meta-llama/Llama-3.1-8B'"),
    # --- vLLM ShareGPT JSON: an empty prompt was a 1-token request, a value of another type its repr's length
    ("vllm-sharegpt-empty-prompt", trace_scenario("vllm_sharegpt", "t.json", json.dumps(
        [{"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "y" * 80}]}])), RUN_S,
     "t.json: no rows: each of its 1 conversations lacks a reply or has a prompt or reply under 4 tokens "
     "(16 characters)"),
    ("vllm-sharegpt-value-a-number", trace_scenario("vllm_sharegpt", "t.json", json.dumps(
        [{"conversations": [{"from": "human", "value": "x" * 40}, {"from": "gpt", "value": 5}]}])), RUN_S,
     "t.json: conversation 0: turn 1 value=5 is not text"),
    ("vllm-sharegpt-value-missing", trace_scenario("vllm_sharegpt", "t.json", json.dumps(
        [{"conversations": [{"from": "human"}, {"from": "gpt", "value": "y"}]}])), RUN_S,
     "t.json: conversation 0: turn 0 value=None is not text"),
    # --- run's vLLM flags: an empty one was dropped without a word (capacity refused the same flag)
    ("run-speculative-config-empty", {}, ["run", "--speculative-config", ""],
     "--speculative-config='': not JSON (Expecting value at character 0)"),
    ("run-scheduling-policy-empty", {}, ["run", "--scheduling-policy", ""],
     "engine.scheduling_policy='': Input should be 'fcfs' or 'priority'"),
    # --- disaggregation: a decode pool of another model or KV dtype took the prefill pool's KV (vLLM's
    # NixlConnector refuses the peer: its compatibility hash covers the model and the cache dtype)
    ("disagg-decode-another-model", scenario(f"{DISAGG}replicas: [{{count: 1, kv_role: kv_producer}}, "
                                             "{count: 1, kv_role: kv_consumer, model: opt-13b}]\n"), RUN_S,
     "replicas (s/g1-0, kv_consumer): model=opt-13b, but (s/g0-0, kv_producer) has model=llama-3.1-8b"),
    ("disagg-decode-another-kv-dtype", scenario(f"{DISAGG}replicas: [{{count: 1, kv_role: kv_producer}}, "
                                                "{count: 1, kv_role: kv_consumer, engine: {kv_cache_dtype: fp8}}]\n"),
     RUN_S, "replicas (s/g1-0, kv_consumer): KV cache dtype fp8, but (s/g0-0, kv_producer) has KV cache dtype "
            "bfloat16"),
    # --- traces: rows out of arrival order ran with negative arrivals (and TTFTs from before the run began)
    ("azure-rows-out-of-order", trace_scenario("azure", "t.csv", AZURE_HEAD + "2023-11-16 18:15:46.68,10,5\n"
                                               "2023-11-16 18:15:45.18,10,5\n"), RUN_S,
     "t.csv: request 2 arrives 1.5 s before request 1: a trace lists requests in arrival order"),
    ("mooncake-rows-out-of-order", trace_scenario("mooncake", "t.jsonl", MOONCAKE_ROW.replace('"timestamp": 0',
                                                                                              '"timestamp": 5000')
                                                  + MOONCAKE_ROW.replace('"timestamp": 0', '"timestamp": 1000')),
     RUN_S, "t.jsonl: request 2 arrives 4 s before request 1"),
    ("mooncake-timestamp-a-boolean", trace_scenario("mooncake", "t.jsonl", MOONCAKE_ROW.replace('"timestamp": 0',
                                                                                                '"timestamp": true')),
     RUN_S, "t.jsonl:1: timestamp=True is not a number"),  # was an arrival 1 ms in
    ("sharegpt-output-ids-count-mismatch", trace_scenario("sharegpt_tokens", "t.jsonl", TOKENS_ROW.replace(
        '"output_tok_ids": [3]', '"output_tok_ids": [3, 4, 5]')), RUN_S,
     "t.jsonl:1: output_tok_ids lists 3 token ids, output_toks=1"),
]


def test_the_corpus_is_big_and_ids_are_unique():
    ids = [case[0] for case in CASES]
    assert len(ids) >= 60 and len(set(ids)) == len(ids)


@pytest.mark.parametrize(("files", "args", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, files, args, needle):
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "case"
    d.mkdir()
    for name, text in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text.replace("{d}", str(d)))
    argv = [a.replace("{d}", str(d)) for a in args]
    if argv[0] in ("run", "report") and "-o" not in argv:
        argv += ["-o", str(d / "out")]
    before = sorted(p.name for p in d.iterdir())
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kvsim: error: ") and needle in lines[0], lines[0]
    assert len(lines[0].replace(str(d), "{d}")) < 500, lines[0]  # names the field and value, echoes no file
    assert "Traceback" not in result.output
    assert sorted(p.name for p in d.iterdir()) == before  # nothing written beside the inputs
    assert list(tmp_path.iterdir()) == [d]  # nor in the working directory (no runs/, report/)


@pytest.mark.parametrize("fleet", [[], ["--set", "replicas=2", "--set", "router.policy=round_robin"]])
def test_a_run_that_rejects_every_request_says_so(tmp_path, fleet):
    """Every prompt past max_model_len: vLLM answers each with HTTP 400 and so does kvsim, but the run
    exited 0 with "0 finished" in its table and nothing on stderr. Now one warning line naming how many and
    why; the output (a faithful record: every request rejected) is still written. Some rejections among
    served requests are a result, not a warning."""
    out = tmp_path / "out"
    lengths = "output_len: {dist: fixed, value: 5}}"
    result = runner.invoke(app, ["run", "--set", f"workload={{num_requests: 4, prompt_len: {{dist: fixed, value: 9000}}, "
                                 f"{lengths}", *fleet, "-o", str(out), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_rejected"] == 4
    assert result.stderr.strip().splitlines() == [  # a fleet's summary counts the reasons over its replicas
        "kvsim: warning: every request was rejected (4 of 4: prompt_len >= max_model_len 8192 (4)), "
        "as vLLM rejects "
        "them (HTTP 400); nothing was served, so the latency and throughput figures are empty"]
    assert (out / "summary.json").exists()
    partial = runner.invoke(app, ["run", "--set", "workload={num_requests: 8, prompt_len: {dist: uniform, low: 100, "
                                  f"high: 16000}}, {lengths}", *fleet, "-o", str(tmp_path / "partial"),
                                  "--format", "json"])
    assert partial.exit_code == 0 and 0 < json.loads(partial.stdout)["num_rejected"] < 8, partial.output
    assert partial.stderr == ""


def test_a_scenario_dict_with_a_key_that_is_not_a_string_is_named():
    """From the Python API as from YAML: `Scenario(**raw)` raised TypeError("keywords must be strings")."""
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError, match="^1: a key must be a string, not int$"):
        kvsim.simulate({1: 2, "workload": {"num_requests": 5}})  # the workload's lengths are missing too


@pytest.mark.parametrize("path", [{"workload": {"num_requests": 5}}, 5, ["s.yaml"]])
def test_load_scenario_given_no_path_says_so(path):
    """`kvsim.load_scenario({...})` from a notebook: Path(a dict) raised TypeError("expected str, bytes or
    os.PathLike object, not dict")."""
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError, match=r"^scenario=.*: expected a YAML path \(`kvsim.simulate` also takes a dict"):
        kvsim.load_scenario(path)


@pytest.mark.parametrize(("call", "message"), [
    (lambda kvsim: kvsim.load_scenario(None, 5), "overrides=5: expected a dict of dotted keys to values"),  # TypeError
    (lambda kvsim: kvsim.load_scenario(None, [1]), "overrides item 1: expected a 'dotted.key=value' string"),
    (lambda kvsim: kvsim.load_scenario(None, ["engine..block_size=32"]),  # was "engine.: unknown key"
     "--set 'engine..block_size=32': an empty field name between its dots"),
    (lambda kvsim: kvsim.simulate(None, engine____block_size=32),
     "override 'engine..block_size': an empty field name between its dots"),
])
def test_overrides_of_the_wrong_shape_are_named(call, message):
    """From a notebook: overrides that are not a mapping or strings were a TypeError or AttributeError out of
    iterating them; a doubled `__` in a keyword was reported as the unknown key "engine."."""
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError) as error:
        call(kvsim)
    assert str(error.value).startswith(message), str(error.value)
    assert "\n" not in str(error.value)


def test_a_key_merged_in_may_be_overridden_but_not_repeated(tmp_path):
    """YAML's `<<` merge: a key written beside it overrides the merged one (`yaml-duplicate-field` is a key
    written twice). The repeated-key check saw the merged pairs as written ones, and refused the override."""
    from kvsim.model.errors import KvsimError
    from kvsim.workload.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text("replicas: [{<<: &group {count: 1, kv_role: kv_producer}}, {<<: *group, kv_role: kv_consumer}]\n"
                    f"engine: {{<<: {{block_size: 32, max_num_seqs: 8}}, block_size: 16}}\n{DISAGG}")
    scenario = load_scenario(path)
    assert (scenario.engine.block_size, scenario.engine.max_num_seqs) == (16, 8)
    assert [(g.count, g.kv_role) for g in scenario.replicas] == [(1, "kv_producer"), (1, "kv_consumer")]
    path.write_text(f"engine: {{<<: {{block_size: 32}}, max_num_seqs: 8, max_num_seqs: 4}}\n{WORKLOAD}")
    with pytest.raises(KvsimError, match="duplicate key 'max_num_seqs'"):
        load_scenario(path)


def _gzip(text: str) -> bytes:
    import gzip

    return gzip.compress(text.encode())


AZURE_ROWS = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "2023-11-16 18:15:46.68,374,44\n" * 200
MOONCAKE_ROWS = '{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [1]}\n' * 200


@pytest.mark.parametrize(("files", "args", "needle"), [
    ({"s.yaml": "workload: {num_requests: 5, arrival: {process: trace}, trace: {format: azure, path: t.csv.gz}}\n",
      "t.csv.gz": _gzip(AZURE_ROWS)[:15]}, RUN_S, "t.csv.gz: cannot read, the compressed file is truncated or corrupt"),
    ({"s.yaml": "workload: {num_requests: 5, arrival: {process: trace}, trace: {format: mooncake, path: t.jsonl.gz}}\n",
      "t.jsonl.gz": _gzip(MOONCAKE_ROWS)[:-40]}, RUN_S,
     "t.jsonl.gz: cannot read, the compressed file is truncated or corrupt"),
    ({"b.json": b"\xff\xfe\x00{}"}, ["validate", "{d}/b.json", "-o", "{d}/out"], "b.json: not UTF-8 text (byte 0)"),
], ids=["azure-gzip-truncated", "mooncake-gzip-truncated", "validate-binary-json"])
def test_bad_binary_input_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, files, args, needle):
    """As the corpus, for files that are not text: a truncated gzip trace was `Aborted!` (click's EOFError), a
    binary bench JSON a UnicodeDecodeError traceback."""
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "case"
    d.mkdir()
    for name, content in files.items():
        (d / name).write_bytes(content) if isinstance(content, bytes) else (d / name).write_text(content)
    argv = [a.replace("{d}", str(d)) for a in args]
    if argv[0] == "run":
        argv += ["-o", str(d / "out")]
    before = sorted(p.name for p in d.iterdir())
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: ") and needle in lines[0], result.stderr
    assert sorted(p.name for p in d.iterdir()) == before
    assert list(tmp_path.iterdir()) == [d]


@pytest.mark.parametrize("output", ["loop", "loop/out"])
@pytest.mark.parametrize("command", [["run", "--set", "workload.num_requests=5"],
                                     ["import-profile", "{d}/b", "--gpu", "rtx-pro-6000"]])
def test_an_output_through_a_symlink_loop_is_one_line(tmp_path, monkeypatch, command, output):
    """`-o loop` where loop -> loop: pathlib's resolve() raised RuntimeError("Symlink loop from ...")."""
    monkeypatch.chdir(tmp_path)
    for name, text in bundle().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "loop").symlink_to("loop")
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = [a.replace("{d}", str(tmp_path)) for a in command] + ["-o", str(tmp_path / output)]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.strip().splitlines() == [f"kvsim: error: --output={str(tmp_path / output)!r}: leads "
                                                  "through a loop of symbolic links; kvsim only replaces output it "
                                                  "wrote itself (choose a new path)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_byte_order_mark_is_skipped(tmp_path, monkeypatch):
    """Spreadsheet programs start a CSV with a UTF-8 byte-order mark: it was read as part of the first column's
    name ("TIMESTAMP=None is not a timestamp", "column 'kind' is missing"). Every reader goes through
    `kvsim.workload.files.open_text`, which skips it: a trace and a profile read the same with one as without."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("\ufeff" + AZURE_ROWS)
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 5, arrival: {process: trace}, "
                                     "trace: {format: azure, path: t.csv}}\nsteps: none\n")
    result = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_finished"] == 5
    written = []
    for name, files, source in [("plain", native_profile(), "p.csv"), ("bom", native_profile(), "p.csv"),
                                ("bundle", bundle(), "b"), ("bundle-bom", bundle(dense="\ufeff" + BUNDLE_DENSE), "b")]:
        folder = tmp_path / name
        for path, text in files.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(("\ufeff" if name == "bom" else "") + text)
        result = runner.invoke(app, ["import-profile", str(folder / source), "-o", str(folder / "out.csv"),
                                     "--gpu", "rtx-pro-6000"])
        assert result.exit_code == 0, result.output
        written.append([line for line in (folder / "out.csv").read_text().splitlines() if not line.startswith("#")])
    assert written[0] == written[1] and written[2] == written[3]


def test_a_trace_named_without_gz_is_read_from_its_gz(tmp_path, monkeypatch):
    """`kvsim.workload.files`: `x.csv` may be given when only `x.csv.gz` exists; the scenario's path check
    said "file not found" before the reader could look for the .gz."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv.gz").write_bytes(_gzip(AZURE_ROWS))
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 5, arrival: {process: trace}, "
                                     "trace: {format: azure, path: t.csv}}\nsteps: none\n")
    result = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_finished"] == 5


# -- faults: the machine, not the input --------------------------------------------------------

@pytest.mark.parametrize(("command", "writer"), [
    (["run", "--set", "workload.num_requests=5"], "kvsim.engine.simulate.write_run_files"),
    (["run", "--set", "workload.num_requests=5", "--set", "replicas=2"], "kvsim.fleet.driver.write_run_files"),
])
def test_a_full_disk_names_the_output_and_leaves_nothing(tmp_path, monkeypatch, command, writer):
    """ENOSPC comes from `write` on an open file, so the OSError has no file name: the line names --output."""
    import errno
    import os

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, full)
    out = tmp_path / "out"
    result = runner.invoke(app, [*command, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [f"kvsim: error: --output={str(out)!r}: cannot write there "
                                                  "(No space left on device)"]
    assert list(tmp_path.iterdir()) == []  # not even the temporary folder


def _as_a_terminal_starts_it() -> None:
    """A child as a shell starts it: SIGINT handled by default and not blocked. The test process may
    have it ignored or blocked (pytest-xdist's worker, another test's fork), and a child inherits both."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signal_state(pid: int) -> str:
    """The kernel's view of a process's signals (pending, blocked, ignored, caught masks), for a failure message."""
    try:
        lines = open(f"/proc/{pid}/status").read().splitlines()  # noqa: SIM115 (a one-shot read)
    except OSError:
        return "(no /proc status)"
    return "; ".join(line for line in lines if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))


def test_ctrl_c_says_what_was_interrupted_and_what_is_intact(tmp_path):
    """SIGINT once the run streams into its temporary folder: one line, exit 130, no traceback, the
    earlier output at the path untouched and no temporary left. (A loaded machine may print progress
    lines first: the run had been going for seconds.)"""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    first = runner.invoke(app, ["run", "--set", "workload.num_requests=5", "-o", str(out)])
    assert first.exit_code == 0, first.output
    before = sorted((p.name, p.read_bytes()) for p in out.iterdir())
    child = subprocess.Popen(  # SIGINT as a terminal's Ctrl-C delivers it, even from a background job
        [sys.executable, "-X", "faulthandler", "-m", "kvsim", "run", "--set", "workload.num_requests=1000000",
         "--steps", "none", "-o", str(out)],  # no steps file: no pyarrow writer
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=_as_a_terminal_starts_it)
    try:
        while not any((p / ".kvsim-output").exists() for p in tmp_path.glob(".out.kvsim-*")) and child.poll() is None:
            time.sleep(0.05)  # polling for the temporary folder's marker (the run is writing), not timing
        child.send_signal(signal.SIGINT)
        try:
            _, stderr = child.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # the interrupt was lost: say where the child is, then fail
            state = _signal_state(child.pid)
            child.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            _, stderr = child.communicate(timeout=30)
            pytest.fail(f"SIGINT lost; child signals: {state}; stderr:\n{stderr[-6000:]}")
    finally:
        child.kill()
    # 130, not death by the SIGINT itself: CPython's `Py_RunMain` (`python -m`) re-raises SIGINT at exit whenever a
    # KeyboardInterrupt of that exact type ended code that a string `exec` ran (`run_eval_code_obj` sets
    # `unhandled_keyboard_interrupt`, a dataclass's `exec` included), even one kvsim caught and reported: kvsim's
    # handler raises a subclass (`kvsim.cli.interrupts.Interrupted`), which that check does not match.
    assert child.returncode == 130, (child.returncode, stderr)
    *progress, last = stderr.splitlines()
    assert last == f"kvsim: interrupted (kvsim run): {out} was not written; what was there before is intact"
    assert all(line.startswith("kvsim run: simulated ") for line in progress), stderr
    assert sorted((p.name, p.read_bytes()) for p in out.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_ctrl_c_swallowed_where_it_landed_is_raised_at_the_next_progress(monkeypatch):
    """The CLI's SIGINT handler remembers the interrupt: code that swallowed the KeyboardInterrupt (here an
    `except BaseException`) does not lose it, the next progress call of the run raises it again."""
    import contextlib
    import signal
    import threading

    from kvsim.cli import interrupts
    from kvsim.cli.progress import run_progress

    monkeypatch.setattr(interrupts, "_interrupted", threading.Event())
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupts.install()
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        with contextlib.suppress(BaseException):  # what a careless library does
            signal.raise_signal(signal.SIGINT)
        for enabled in (False, True):
            with run_progress("run", enabled=enabled) as progress, pytest.raises(KeyboardInterrupt):
                progress(1.0, 1, 10)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_landing_in_a_finalizer_prints_no_traceback(monkeypatch, capsys):
    """A SIGINT that lands in a weakref callback or finalizer (an import lock's, in a fresh clone's run) cannot
    propagate: Python printed "Exception ignored in ..." and a KeyboardInterrupt traceback above the CLI's
    one-line message. The CLI's hook leaves that report out (the next progress call raises the interrupt);
    any other exception lost in a finalizer is still reported."""
    import gc
    import signal
    import sys
    import threading

    from kvsim.cli import interrupts

    class Finalized:
        def __init__(self, action):
            self.action = action

        def __del__(self):
            self.action()

    def lost(action):  # an object finalized while nothing can catch what its __del__ raises
        Finalized(action)
        gc.collect()

    monkeypatch.setattr(interrupts, "_interrupted", threading.Event())
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupts.install()
        lost(lambda: signal.getsignal(signal.SIGINT)(signal.SIGINT, None))  # the handler, as the signal runs it
        assert capsys.readouterr().err == ""
        with pytest.raises(KeyboardInterrupt):
            interrupts.raise_if_interrupted()

        def fails():
            raise ValueError("a finalizer's own bug")
        lost(fails)
        err = capsys.readouterr().err
        assert "Exception ignored" in err and "ValueError: a finalizer's own bug" in err
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_ignored_by_the_caller_stays_ignored(monkeypatch):
    """`nohup kvsim ... &` starts kvsim with SIGINT ignored: the CLI does not take it back."""
    import signal

    from kvsim.cli import interrupts

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        interrupts.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_before_any_output_says_so():
    from kvsim.__main__ import interrupted_message

    assert interrupted_message(["report", "--quick"], None) == (
        "kvsim: interrupted (kvsim report) before it wrote any output; no file was changed")
    assert "points.jsonl" in interrupted_message(["plan"], None)


def test_reading_a_peer_prediction_leaves_the_csv_field_limit_as_it_was():
    """LLMServingSim's sim.csv needs a larger csv field limit (its ITL column); the limit is process-wide,
    so reading one raised it for every later trace read in the process, and a trace field over the
    default limit was then read whole, not refused (the `azure-field-over-the-csv-limit` case, run after
    a validation test on the same worker)."""
    import csv

    from kvsim.validation.measured import read_llmservingsim

    before = csv.field_size_limit()
    case = Path(__file__).resolve().parents[1] / "benchmarks/validation_set/measured/RTXPRO6000/Llama-3.1-8B"
    assert read_llmservingsim(case / "outputs" / "sim.csv") is not None  # found as sim.csv.gz
    assert csv.field_size_limit() == before


@pytest.mark.parametrize("sustained", [[], ["--sustained"]])
def test_a_context_of_one_token_has_no_cohort_to_price(sustained):
    """c=1 splits into no prompt (c/2 = 0): the closed-form cohort rate was 0 tokens over 0 seconds (a
    ZeroDivisionError traceback); the row keeps its capacity and has no rate, price or sustained probe."""
    result = runner.invoke(app, ["capacity", "--context-lengths", "1", "--format", "json", *sustained])
    assert result.exit_code == 0, (result.output, result.exception)
    (row,) = json.loads(result.stdout)["rows"]
    assert row["paged_max_seqs"] > 0 and row["output_tokens_per_s_closed_form"] == 0.0
    assert row["usd_per_million_output_tokens"] is None and row.get("sustained_rate_per_s") is None
