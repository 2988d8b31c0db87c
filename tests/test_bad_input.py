"""The bad-input corpus: every case exits 2 with one line naming what is wrong, and writes nothing.

Each case is (id, files to create, command line, text the error line must contain). `{d}` in
files and arguments is the case's folder; run, report and validate are given `-o {d}/out`,
which must not exist afterwards. The cases cover scenario fields, `--set`, every trace reader
(empty and malformed files), Hugging Face configs, GPU files, sizes too big to allocate,
configurations vLLM refuses at startup, and the other commands' flags.
"""

import json

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


RUN_S = ["run", "{d}/s.yaml"]
DISAGG = f"kv_transfer_config: {{kv_link: rdma}}\n{WORKLOAD}"
DISAGG_GROUPS = "replicas: [{count: 1, kv_role: kv_producer}, {count: 1, kv_role: kv_consumer}]\n"
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
MOONCAKE_ROW = '{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}\n'
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
    ("max-model-len-zero", scenario(f"engine: {{max_model_len: 0}}\n{WORKLOAD}"), RUN_S, "engine.max_model_len=0"),
    # --- --set
    ("set-unclosed-yaml", {}, ["run", "--set", "name=[unclosed"], "--set 'name=[unclosed'"),
    ("set-no-equals", {}, ["run", "--set", "engine.block_size"], "expected dotted.key=value"),
    ("set-empty-key", {}, ["run", "--set", "=5"], "expected dotted.key=value"),
    ("set-through-a-value", {}, ["run", "--set", "engine.max_model_len.x=1"], "max_model_len is not a section"),
    ("set-bad-value", {}, ["run", "--set", "engine.block_size=abc"], "engine.block_size='abc'"),
    ("set-unknown-field", {}, ["run", "--set", "engine.blok_size=16"], "engine.blok_size: unknown key"),
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
    ("hf-not-json", {"config.json": "{not json", "s.yaml": f"model: {{d}}/config.json\n{WORKLOAD}"}, RUN_S,
     "config.json"),
    ("hf-a-list", {"config.json": "[1, 2]", "s.yaml": f"model: {{d}}/config.json\n{WORKLOAD}"}, RUN_S,
     "expected a mapping"),
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
    ("exabyte-swap", {}, ["run", "--set", "engine.scheduler=v0", "--set", "engine.swap_space=1000000"],
     "engine.swap_space=1000000.0: this run needs at least"),
    ("over-a-given-memory-limit", {}, ["run", "--memory-limit", "1MiB"], "more than the limit of 0.0 GiB"),
    ("memory-limit-unparsable", {}, ["run", "--memory-limit", "plenty"], "--memory-limit='plenty'"),
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
    # --- autoscaled fleets (kvsim.fleet.autoscaled)
    ("autoscaler-never-scales", scenario(f"{WORKLOAD}replicas: 2\nrouter: {{policy: least_outstanding}}\n"
                                         "autoscaler: {min_replicas: 2, max_replicas: 2}\n"), RUN_S,
     "autoscaler.max_replicas=2: equals min_replicas"),
    ("autoscaler-startup-negative", scenario(f"{WORKLOAD}replicas: 2\nrouter: {{policy: least_outstanding}}\n"
                                             "autoscaler: {startup_s: -1}\n"), RUN_S, "autoscaler.startup_s=-1"),
    ("autoscaler-without-count", scenario(f"{WORKLOAD}replicas: [{{count: 2}}]\nautoscaler: {{}}\n"), RUN_S,
     "autoscaler: needs replicas as a count"),
    # --- other commands
    ("capacity-context-lengths", {}, ["capacity", "--context-lengths", "1k,2k"], "--context-lengths='1k,2k'"),
    ("capacity-kv-bytes", {}, ["capacity", "--kv-cache-memory-bytes", "lots"], "kv_cache_memory_bytes"),
    ("capacity-tp-zero", {}, ["capacity", "--tensor-parallel-size", "0"], "tensor_parallel_size=0"),
    ("report-gpu-unknown", {}, ["report", "--gpu", "tpu"], "gpu='tpu'"),
    ("report-set-broken", {}, ["report", "--set", "engine.block_size=[1"], "--set 'engine.block_size=[1'"),
    ("calibrate-dtype", {}, ["calibrate", "--gpu", "h200", "--kv-cache-dtype", "int4"], "--kv-cache-dtype='int4'"),
    ("calibrate-block-sizes", {}, ["calibrate", "--gpu", "h200", "--block-sizes", "x"], "--block-sizes='x'"),
    ("output-is-a-file", {"taken": "user data\n"}, ["run", "--set", "workload.num_requests=5", "-o", "{d}/taken"],
     "is not a folder"),
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
    assert "Traceback" not in result.output
    assert sorted(p.name for p in d.iterdir()) == before  # nothing written beside the inputs
    assert list(tmp_path.iterdir()) == [d]  # nor in the working directory (no runs/, report/)
