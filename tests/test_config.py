import json

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path

from kvsim.model.config import PRESETS_DIR, load_gpu, load_model, model_presets
from kvsim.model.engine_config import EngineConfig, make_engine
from kvsim.model.errors import KvsimError
from kvsim.model.sizes import parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12GiB", 12 * 2**30), ("12 GB", 12 * 10**9), ("512MiB", 512 * 2**20), ("4096", 4096),
     (4096, 4096), ("1.5GiB", 3 * 2**29), ("4G", 4 * 2**30)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["12 parsecs", "GiB", "-1GiB"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_every_preset_loads_and_counts_plausible_params():
    expected_billions = {
        "opt-13b": 12.9, "opt-66b": 65.7, "opt-175b": 174.6, "llama-2-7b": 6.7, "llama-2-13b": 13.0,
        "llama-2-70b": 69.0, "llama-3.1-8b": 8.03, "llama-3.1-70b": 70.6, "mistral-7b": 7.24,
        "qwen2.5-7b": 7.6,
    }
    assert set(expected_billions) <= set(model_presets())
    for name, billions in expected_billions.items():
        model = load_model(name)
        assert model.num_params / 1e9 == pytest.approx(billions, rel=0.02), name


def test_gqa_and_mha_shapes():
    assert load_model("llama-2-70b").num_kv_heads == 8
    assert load_model("llama-2-7b").num_kv_heads == 32
    assert load_model("opt-13b").head_dim == 128
    assert load_model("qwen2.5-7b").head_dim == 128


def test_hf_config_file(tmp_path):
    raw = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
           "max_position_embeddings": 512, "torch_dtype": "float16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    model = load_model(str(path))
    assert (model.num_layers, model.num_kv_heads, model.head_dim) == (2, 2, 64)
    # 2 layers · (2·256·256 + 2·256·128 + 3·256·512 + 2·256) + 2·1000·256 + 256
    assert model.num_params == 2 * (131072 + 65536 + 393216 + 512) + 512000 + 256


def test_hf_config_missing_field_names_it(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 256}))
    with pytest.raises(KvsimError, match="num_attention_heads"):
        load_model(str(path))


def test_user_gpu_yaml(tmp_path):
    path = tmp_path / "mygpu.yaml"
    path.write_text("memory_bytes: 24GiB\nhbm_bandwidth_bytes_per_s: 1e12\nfp16_flops: 1e14\n"
                    "host_link_bandwidth_bytes_per_s: 3.2e10\n")
    gpu = load_gpu(str(path))
    assert gpu.memory_bytes == 24 * 2**30 and gpu.fp8_flops is None
    assert load_gpu(str(path)) is gpu  # read once while the file stays as it was


def test_a_gpu_or_model_file_edited_between_loads_is_read_again(tmp_path):
    """A notebook edits its GPU file (48 GiB) and its model's config.json (a 4096 context) between two runs: the
    second load reads the edited files, as a fresh process would, not the spec first read under that path."""
    gpu_file = tmp_path / "mygpu.yaml"
    datasheet = "hbm_bandwidth_bytes_per_s: 1e12\nfp16_flops: 1e14\nhost_link_bandwidth_bytes_per_s: 3.2e10\n"
    gpu_file.write_text("memory_bytes: 24GiB\n" + datasheet)
    assert load_gpu(str(gpu_file)).memory_bytes == 24 * 2**30
    gpu_file.write_text("memory_bytes: 48GiB\n" + datasheet)
    assert load_gpu(str(gpu_file)).memory_bytes == 48 * 2**30
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    config = json.loads((PRESETS_DIR / "models" / "llama-3.1-8b.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    assert load_model(str(model_dir)).max_position_embeddings == 8192
    (model_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    assert load_model(str(model_dir)).max_position_embeddings == 4096



def test_a_gpu_name_holding_a_nul_is_refused_in_one_line(tmp_path):
    """`gpu: "h100\\0x"` in a scenario names no preset and no file a system can hold (a NUL): one line naming it,
    exit 2, as before the file-stamp cache (f114762), whose `stat` of the name raised ValueError, a traceback."""
    (tmp_path / "s.yaml").write_text('steps: none\ngpu: "h100\\0x"\nworkload: {num_requests: 2, '
                                     "prompt_len: {dist: fixed, value: 10}, output_len: {dist: fixed, value: 2}}\n")
    line = one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")])
    # its family word h100 begins two presets (ux40's hint)
    assert line.startswith("gpu='h100\\x00x': not a preset (a100-40gb, ")
    assert line.endswith("nor a file (did you mean h100-80gb or h100-pcie?)")
    assert not (tmp_path / "out").exists()
    with pytest.raises(KvsimError, match="not a preset"):
        load_gpu("h100\0x")

def test_gpu_yaml_bad_value_names_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("memory_bytes: -3GiB\nhbm_bandwidth_bytes_per_s: 1e12\nfp16_flops: 1e14\n"
                    "host_link_bandwidth_bytes_per_s: 3.2e10\n")
    with pytest.raises(KvsimError, match="memory_bytes"):
        load_gpu(str(path))


def test_unknown_presets():
    with pytest.raises(KvsimError, match="model='gpt-9'"):
        load_model("gpt-9")
    with pytest.raises(KvsimError, match="gpu='tpu-v9'"):
        load_gpu("tpu-v9")


def test_engine_defaults_follow_vllm():
    engine = EngineConfig()
    assert engine.block_size == 16 and engine.gpu_memory_utilization == 0.9
    assert engine.kv_cache_dtype == "auto" and engine.swap_space == 4.0
    l4 = load_gpu("l4")
    assert engine.resolved_max_num_batched_tokens(8192, l4) == 2048
    assert engine.model_copy(update={"scheduler": "v0"}).resolved_max_num_batched_tokens(8192, l4) == 8192
    assert engine.resolved_watermark == 0.0


def test_batch_defaults_follow_vllm_usage_context():
    """vllm/engine/arg_utils.py `get_batch_defaults`: >= 70 GiB and not an A100 -> 8192 tokens (API
    server) / 16384 (LLM class) and 1024 sequences; otherwise 2048 / 8192 and 256."""
    engine = EngineConfig()
    llm = engine.model_copy(update={"usage_context": "llm_class"})
    l4, a100, h100, h200 = (load_gpu(g) for g in ("l4", "a100-80gb", "h100-80gb", "h200"))
    for gpu in (h100, h200):  # 79.6 GiB and 140.4 GiB
        assert (engine.resolved_max_num_batched_tokens(4096, gpu), engine.resolved_max_num_seqs(gpu)) == (8192, 1024)
        assert llm.resolved_max_num_batched_tokens(4096, gpu) == 16384
    for gpu in (l4, a100):  # 22.5 GiB; 80 GiB but an A100
        assert (engine.resolved_max_num_batched_tokens(4096, gpu), engine.resolved_max_num_seqs(gpu)) == (2048, 256)
        assert llm.resolved_max_num_batched_tokens(4096, gpu) == 8192
    pinned = engine.model_copy(update={"max_num_seqs": 64, "max_num_batched_tokens": 512})
    assert (pinned.resolved_max_num_batched_tokens(4096, h200), pinned.resolved_max_num_seqs(h200)) == (512, 64)


@pytest.mark.parametrize(
    ("field", "value"),
    [("gpu_memory_utilization", 1.5), ("gpu_memory_utilization", 0), ("block_size", 0),
     ("kv_cache_dtype", "int3"), ("kv_cache_memory_bytes", "-1GiB"), ("max_num_seqs", -4)],
)
def test_engine_errors_name_field_and_value(field, value):
    with pytest.raises(KvsimError, match=field) as info:
        make_engine(**{field: value})
    assert "\n" not in str(info.value)


def test_max_model_len_above_model_limit():
    with pytest.raises(KvsimError, match="max_model_len=4096"):
        EngineConfig(max_model_len=4096).resolved_max_model_len(load_model("opt-13b"))


def test_swap_preemption_needs_v0():
    assert make_engine(scheduler="v0", preemption_mode="swap").preemption_mode == "swap"
    with pytest.raises(KvsimError, match="preemption_mode=swap needs scheduler v0"):
        make_engine(scheduler="v1", preemption_mode="swap")


# (scheduler, preemption_mode) -> can a preemption swap: vLLM v0 swaps unless told to recompute (unset, it swaps
# requests of several sequences, `_preempt`); v1 and static preempt by recompute only (swap is refused there)
CAN_SWAP = {("v0", None): True, ("v0", "swap"): True, ("v0", "recompute"): False, ("v1", None): False,
            ("v1", "recompute"): False, ("static", None): False, ("static", "recompute"): False}


@pytest.mark.parametrize(("scheduler", "mode"), list(CAN_SWAP))
def test_one_can_swap_sizes_the_pool_warns_and_bounds_the_scheduler(scheduler, mode):
    """The one predicate: the CPU pool (`swap_bytes`: 2 GiB or nothing), the unread-setting warning (the
    swap_space of 2 GiB, off vLLM's 4, is unread exactly where nothing swaps) and the scheduler's limits."""
    from kvsim.engine.builder import resolve_engine
    from kvsim.model.capacity import swap_bytes
    from kvsim.workload.scenario import load_scenario

    expected = CAN_SWAP[scheduler, mode]
    engine = make_engine(scheduler=scheduler, preemption_mode=mode, swap_space=2)
    assert engine.can_swap is expected
    assert swap_bytes(engine) == (2 * 2**30 if expected else 0)
    assert ("swap_space" in engine.unread_settings()) is (not expected)
    overrides = [f"engine.scheduler={scheduler}", "engine.swap_space=2", "engine.num_gpu_blocks_override=1000",
                 "engine.max_model_len=1024"] + ([f"engine.preemption_mode={mode}"] if mode else [])
    assert resolve_engine(load_scenario(None, overrides)).limits.can_swap is expected


def test_rtx_pro_6000_preset_matches_its_datasheet():
    gpu = load_gpu("rtx-pro-6000")
    assert gpu.memory_bytes == 97887 * 2**20  # 96 GB GDDR7 as nvidia-smi reports it
    assert gpu.hbm_bandwidth_bytes_per_s == 1597e9
    assert gpu.fp16_flops == pytest.approx(503.8e12 * 120 / 125, rel=1e-3)  # whitepaper rate, Server clock
    assert gpu.resolved_link.kind == "pcie" and gpu.resolved_link.bandwidth_bytes_per_s == 64e9


def test_every_gpu_preset_names_its_link():
    expected = {"a100-40gb": ("nvlink", 300e9), "a100-80gb": ("nvlink", 300e9), "h100-80gb": ("nvlink", 450e9),
                "h200": ("nvlink", 450e9), "l4": ("pcie", 32e9), "l40s": ("pcie", 32e9),
                "rtx-4090": ("pcie", 32e9), "rtx-pro-6000": ("pcie", 64e9)}
    for name, (kind, bandwidth) in expected.items():
        link = load_gpu(name).link
        assert link is not None and (link.kind, link.bandwidth_bytes_per_s) == (kind, bandwidth), name
        assert link.latency_s > 0 and link.source


def test_gpu_file_without_link_uses_pcie_at_the_host_link(tmp_path):
    path = tmp_path / "nolink.yaml"
    path.write_text("memory_bytes: 24GiB\nhbm_bandwidth_bytes_per_s: 1e12\nfp16_flops: 1e14\n"
                    "host_link_bandwidth_bytes_per_s: 3.2e10\n")
    link = load_gpu(str(path)).resolved_link
    assert (link.kind, link.bandwidth_bytes_per_s, link.latency_s) == ("pcie", 3.2e10, 1.0e-6)


def test_gpu_file_bad_link_kind_names_the_field(tmp_path):
    path = tmp_path / "badlink.yaml"
    path.write_text("memory_bytes: 24GiB\nhbm_bandwidth_bytes_per_s: 1e12\nfp16_flops: 1e14\n"
                    "host_link_bandwidth_bytes_per_s: 3.2e10\nlink: {kind: infiniband, bandwidth_bytes_per_s: 1e9, "
                    "latency_s: 0}\n")
    with pytest.raises(KvsimError, match="link.kind"):
        load_gpu(str(path))
