"""`kvsim validate` on runs it has never seen: the bench JSON as each vLLM version writes it, settings a run records
(held against each other and against flags), and GPU names as the driver writes them. Expected values by hand
from the fields vLLM's `benchmarks/benchmark_serving.py` (2024-25) and `vllm/benchmarks/serve.py` (2025-26) save."""

import json

import pandas as pd
import pytest
from test_validate import CONSTANT, write_run

from kvsim.model.config import gpu_presets
from kvsim.model.errors import KvsimError
from kvsim.validation.compare import PHASE_METRICS, _read_notes, series_tick_s, simulated_phase_rates, validate
from kvsim.validation.measured import MeasuredRun, load_measured
from kvsim.validation.recorded import recorded_settings
from kvsim.validation.replay import build_scenario, resolve_gpu
from kvsim.workload.traces import TraceRecord

# four requests: TTFT, gaps between streamed tokens, output tokens; E2E = TTFT + the gaps (vLLM's client sets its
# latency at the last chunk); request 1 streamed one token (no TPOT)
DETAIL = {"input_lens": [100, 200, 50, 80], "output_lens": [3, 1, 4, 2], "ttfts": [0.1, 0.2, 0.05, 0.3],
          "itls": [[0.02, 0.03], [], [0.01, 0.01, 0.01], [0.05]], "generated_texts": ["a b c", "x", "p q r s", "u v"],
          "errors": ["", "", "", ""]}
SETUP = {"date": "20250101-120000", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
         "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 4, "mean_ttft_ms": 162.5}
VERSIONS = {  # what each generation of the benchmark saves beside the per-request lists
    "0.4-0.6: no burstiness, max_concurrency, start_times or latencies": {"request_rate": "inf", "best_of": 1},
    "0.7-0.9: burstiness and max_concurrency": {"request_rate": "inf", "burstiness": 1.0, "max_concurrency": None},
    "2025: start_times": {"request_rate": 4.0, "burstiness": 1.0, "max_concurrency": None, "failed": 0,
                          "start_times": [10.0, 10.5, 11.0, 11.2]},
    "2026: latencies, start_times, queue_times": {"request_rate": 4.0, "burstiness": 1.0, "max_concurrency": None,
                                                 "start_times": [10.0, 10.5, 11.0, 11.2],
                                                 "latencies": [0.15, 0.2, 0.08, 0.35], "queue_times": [0.0] * 4},
}


@pytest.mark.parametrize("version", VERSIONS)
def test_each_versions_bench_json_reads_to_the_same_requests(tmp_path, version):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({**SETUP, **VERSIONS[version], **DETAIL}))
    run = load_measured(path)
    df = run.requests.sort_values("request_index")
    assert list(df.ttft_s) == pytest.approx([0.1, 0.2, 0.05, 0.3])
    assert list(df.e2e_s) == pytest.approx([0.15, 0.2, 0.08, 0.35])  # 0.1 + 0.05, 0.2, 0.05 + 0.03, 0.3 + 0.05
    assert list(df.tpot_s[[0, 2, 3]]) == pytest.approx([0.05 / 2, 0.03 / 3, 0.05 / 1]) and df.tpot_s.isna()[1]
    assert df.ttft_s.mean() * 1000 == pytest.approx(SETUP["mean_ttft_ms"])  # the file's own mean, recomputed
    assert not [n for n in run.notes if "mean_ttft_ms" in n]  # so no note of a summary the lists do not give
    arrivals = [r.arrival_s for r in run.records]
    if "start_times" in VERSIONS[version]:
        assert arrivals == pytest.approx([0.0, 0.5, 1.0, 1.2])
    else:  # vLLM's default infinite rate hands the client every request at the start
        assert arrivals == [0.0] * 4 and any("no start_times" in n for n in run.notes)


def test_a_summary_its_lists_do_not_reproduce_is_noted(tmp_path):
    """vLLM's mean_ttft_ms is the mean of its successful requests' ttfts × 1000: TTFTs saved in milliseconds (another
    tool's file) read as seconds 1000 times too long, and nothing said so. The lists give 162.5 ms (above)."""
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({**SETUP, **DETAIL, "ttfts": [100.0, 200.0, 50.0, 300.0],
                                "itls": [[20.0, 30.0], [], [10.0] * 3, [50.0]]}))
    assert [n for n in load_measured(path).notes if "mean_ttft_ms" in n] == [
        "the file's mean_ttft_ms=162.5 is not the mean of its successful requests' ttfts (162500 ms): its "
        "per-request lists may be another run's or in other units; the comparison reads the lists"]


def test_a_failed_requests_ttft_is_not_in_the_summary_it_is_held_against(tmp_path):
    """vLLM's calculate_metrics appends a ttft to the mean only for a successful output, while the saved `ttfts` list
    holds every output's, a failure's 0.0 among them: request 3 failed (error text, no tokens), so the file's
    mean_ttft_ms is (100 + 200 + 50) / 3 = 116.67 ms and its lists give it: no note. A mean over all four lists
    (87.5 ms) noted every file with a failure (nothing tested it)."""
    path = tmp_path / "bench.json"
    failed = {"ttfts": [0.1, 0.2, 0.05, 0.0], "itls": [[0.02, 0.03], [], [0.01] * 3, []], "output_lens": [3, 1, 4, 0],
              "generated_texts": ["a b c", "x", "p q r s", ""], "errors": ["", "", "", "Bad Request"]}
    path.write_text(json.dumps({**SETUP, **DETAIL, **failed, "mean_ttft_ms": 350 / 3}))
    assert not [n for n in load_measured(path).notes if "mean_ttft_ms" in n]
    path.write_text(json.dumps({**SETUP, **DETAIL, **failed, "mean_ttft_ms": 87.5}))  # the four lists' mean
    assert [n for n in load_measured(path).notes if "mean_ttft_ms" in n] == [
        "the file's mean_ttft_ms=87.5 is not the mean of its successful requests' ttfts (116.667 ms): its "
        "per-request lists may be another run's or in other units; the comparison reads the lists"]


def test_bench_metadata_naming_an_engine_argument_the_replay_does_not_read_is_noted(tmp_path):
    """`vllm bench serve --metadata num_gpu_blocks_override=500 data_parallel_size=2` (serve.py saves each as text at
    the top level): a measured folder's engine_kwargs give the replay both (meta.ENGINE_KEYS), a bench result's
    metadata neither, and both were dropped without a word, the replay running the GPU's whole pool on one engine.
    Now a note names them and the --set that replays them; the keys vLLM's result holds itself (request_rate,
    max_concurrency, ...) are none of them, so the four version files get no such note."""
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({**SETUP, **VERSIONS["2025: start_times"], **DETAIL, "max_num_seqs": "8",
                                "num_gpu_blocks_override": "500", "data_parallel_size": "2"}))
    assert [n for n in load_measured(path).notes if n.startswith("the file's")] == [
        "the file's data_parallel_size='2', num_gpu_blocks_override='500': engine arguments a bench result's metadata "
        "does not give the replay (it reads tensor_parallel_size, kv_cache_dtype, block_size, max_num_seqs, "
        "max_num_batched_tokens, max_model_len, gpu_memory_utilization, enable_prefix_caching, async_scheduling, "
        "enforce_eager and num_gpu_blocks); not replayed: --set engine.data_parallel_size=... "
        "--set engine.num_gpu_blocks_override=... to replay them"]
    for version in VERSIONS.values():
        path.write_text(json.dumps({**SETUP, **version, **DETAIL}))
        assert not [n for n in load_measured(path).notes if n.startswith("the file's")]


def test_a_ramp_without_start_times_is_refused_not_sent_at_once(tmp_path):
    """`--ramp-up-strategy` saves request_rate "inf"; a version that saved no start_times was replayed with every
    request at t = 0, as if the rate were infinite."""
    path = tmp_path / "ramp.json"
    path.write_text(json.dumps({**SETUP, **VERSIONS["0.7-0.9: burstiness and max_concurrency"], **DETAIL,
                                "ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 4}))
    with pytest.raises(KvsimError, match=r"ramp.json: ramp_up_strategy='linear' and no start_times: the requests "
                                         r"were sent at a ramping rate the file does not record"):
        load_measured(path)


def _run(engine=None, hardware=None) -> MeasuredRun:
    return MeasuredRun(name="r", source="vllm-measured", model_id="meta-llama/Llama-3.1-8B", requests=pd.DataFrame(),
                       records=[TraceRecord(0.0, 10, 5)], engine=engine or {}, hardware=hardware)


def test_bench_metadata_is_text_and_is_read_as_the_engine_reads_it(tmp_path):
    """`vllm bench serve --metadata k=v` saves each value as text (`kvstring[1].strip()`): the pool was refused
    ("num_gpu_blocks='5000' is not a whole number"), and a `--set` repeating a recorded '8' as 8 was refused as a
    contradiction of the run's own setting."""
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"model_id": "x", "num_gpu_blocks": "5000", "max_num_seqs": "8"}))
    recorded = recorded_settings(bench)
    assert recorded == {"num_gpu_blocks": 5000, "max_num_seqs": "8"}
    trace = tmp_path / "w.jsonl"
    trace.write_text("")
    scenario = build_scenario(_run(), trace, model="llama-3.1-8b", gpu="h100-80gb", recorded=recorded,
                              overrides=["engine.max_num_seqs=8"])
    assert (scenario.engine.num_gpu_blocks_override, scenario.engine.max_num_seqs) == (5000, 8)
    with pytest.raises(KvsimError, match=r"recorded engine.max_num_seqs='8'; a replay runs the engine that ran"):
        build_scenario(_run(), trace, model="llama-3.1-8b", gpu="h100-80gb", recorded=recorded,
                       overrides=["engine.max_num_seqs=9"])


def test_bench_metadata_flags_are_replayed(tmp_path):
    """`--metadata enable_prefix_caching=false enforce_eager=true async_scheduling=false` (text, as vLLM saves it)
    was dropped: the replay ran prefix caching on (a replay's default), CUDA graphs and asynchronous scheduling."""
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"model_id": "x", "enable_prefix_caching": "false", "enforce_eager": "true",
                                 "async_scheduling": "false"}))
    trace = tmp_path / "w.jsonl"
    trace.write_text("")
    engine = build_scenario(_run(), trace, model="llama-3.1-8b", gpu="h100-80gb",
                            recorded=recorded_settings(bench)).engine
    assert (engine.enable_prefix_caching, engine.enforce_eager, engine.async_scheduling) == (False, True, False)


def test_a_pool_recorded_against_its_own_override_is_refused(tmp_path):
    """meta.json's num_gpu_blocks 200 beside engine_kwargs.num_gpu_blocks_override 100 replayed 100 blocks while the
    notes said "from what the run recorded: num_gpu_blocks=200". vLLM allocates an override exactly, so the two
    cannot both be this run's."""
    trace = tmp_path / "w.jsonl"
    trace.write_text("")
    with pytest.raises(KvsimError, match=r"^measured run r: engine_kwargs.num_gpu_blocks_override=100, but it "
                                         r"recorded num_gpu_blocks=200: one of the two is not this run's"):
        build_scenario(_run({"num_gpu_blocks_override": 100}), trace, model="llama-3.1-8b", gpu="h100-80gb",
                       recorded={"num_gpu_blocks": 200})
    agreed = build_scenario(_run({"num_gpu_blocks_override": 100}), trace, model="llama-3.1-8b", gpu="h100-80gb",
                            recorded={"num_gpu_blocks": 100})
    assert agreed.engine.num_gpu_blocks_override == 100


def test_each_setting_read_is_noted():
    run = _run({"max_num_seqs": 8, "enable_prefix_caching": False}, hardware="H100")
    assert _read_notes(run, {}, None, "h100-80gb") == [
        "from the run's engine_kwargs: max_num_seqs=8, enable_prefix_caching=False",
        "the run names no GPU device: gpu preset h100-80gb from its hardware label H100"]
    # a label is followed where the run named no device, and a device it named is followed over the label: a label
    # of another family than the device is said (H100 and an H200), a label of its family not (H100, H100 PCIe)
    assert _read_notes(run, {"gpu": "NVIDIA H200"}, None, "h200")[1:] == [
        "from what the run recorded: gpu=NVIDIA H200 (gpu preset h200)",
        "the run's hardware label H100 (preset h100-80gb) is not the device it recorded, 'NVIDIA H200': replayed on "
        "the recorded device's preset h200"]
    assert _read_notes(run, {"gpu": "NVIDIA H100 PCIe"}, None, "h100-pcie")[1:] == [
        "from what the run recorded: gpu=NVIDIA H100 PCIe (gpu preset h100-pcie)"]
    assert len(_read_notes(_run(hardware="RTXPRO6000"), {"gpu": "NVIDIA RTX PRO 6000 Blackwell Server Edition"},
                           None, "rtx-pro-6000")) == 1
    assert _read_notes(_run(), {}, "h100-80gb", "h100-80gb") == []  # --gpu: nothing taken from the run


def test_phase_rates_are_binned_by_the_measured_series_tick():
    """A series read every 2 s averages each 2 s (a row's rate is its window's tokens over 2 s), idle time
    included; kvsim's rates were binned by 1 s whatever the series' tick, so a run that prefilled 100 tokens at
    0.5 s and 200 at 3.5 s read 150 tokens/s while prefilling in kvsim against 75 measured, from the binning alone.
    Steps: [0, .5) prefill (running 1), [.5, 3) decode (1), [3, 3.5) prefill (2), [3.5, 4.5) decode (2)."""
    steps = pd.DataFrame({"time_s": [0.0, 0.5, 3.0, 3.5], "duration_s": [0.5, 2.5, 0.5, 1.0],
                          "vllm:num_requests_running": [1, 1, 2, 2]})
    requests = pd.DataFrame({"first_token_s": [0.5, 3.5], "prompt_tokens": [100, 200], "output_tokens": [3, 2],
                             "num_samples": [1, 1], "status": ["finished", "finished"]})
    # 2-s ticks: prompts 100 in [0, 2), 200 in [2, 4): 50 and 100 tokens/s; running at 2, 4, 6 s: 1, 2, 0; the 5
    # tokens over 2 s per tick, over the 3 running samples
    assert simulated_phase_rates(steps, requests, tick_s=2.0) == {PHASE_METRICS[0]: pytest.approx(75.0),
                                                                 PHASE_METRICS[1]: pytest.approx(5 / 2 / 3)}
    assert simulated_phase_rates(steps, requests)[PHASE_METRICS[0]] == pytest.approx(150.0)  # 1-s ticks: 100, 200
    assert series_tick_s(pd.DataFrame({"t_s": [0.9348, 2.9348, 4.9348, 6.9348]})) == 2.0  # shifted by started_at
    assert series_tick_s(None) == series_tick_s(pd.DataFrame({"t_s": [3.0]})) == 1.0


def test_a_validation_bins_kvsims_rates_by_its_series_tick(tmp_path):
    """The tiny run of test_validate.py with its series read every 2 s: kvsim's two prompts (16 and 32 tokens, first
    tokens at .01 and .04 s on the constant 10 ms step) fall in the first 2-s tick, 48 tokens over 2 s."""
    run_dir = write_run(tmp_path)
    (run_dir / "vllm" / "timeseries.csv").write_text(
        "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n1.0,24,4,0,0,0.0\n3.0,0,0,0,0,0.0\n")
    meta = json.loads((run_dir / "vllm" / "meta.json").read_text())
    (run_dir / "vllm" / "meta.json").write_text(json.dumps({**meta, "tick_seconds": 2}))  # as the rows say
    v = validate(load_measured(run_dir), gpu="h100-80gb", overrides=CONSTANT, measured_path=run_dir)
    assert v.row(PHASE_METRICS[0])["measured"] == pytest.approx(24.0)
    assert v.row(PHASE_METRICS[0])["kvsim"] == pytest.approx(48 / 2)


# the device names nvidia-smi (torch.cuda.get_device_name, which vLLM logs) gives, and the preset each is: another
# SKU of a preset's chip (other memory, bandwidth, power or interconnect on its datasheet) is no preset
DEVICES = {
    "NVIDIA H100 80GB HBM3": "h100-80gb", "NVIDIA H100 PCIe": "h100-pcie", "NVIDIA H100 NVL": None,
    "NVIDIA A100-SXM4-80GB": "a100-80gb", "NVIDIA A100-SXM4-40GB": "a100-40gb", "NVIDIA A100 80GB PCIe": None,
    "NVIDIA A100-PCIE-40GB": None,  # 250 W and bridged pairs, not the SXM4's 400 W on NVSwitch: was a100-40gb
    "NVIDIA H200": "h200", "NVIDIA H200 NVL": None, "NVIDIA L40S": "l40s", "NVIDIA L40": None, "NVIDIA L4": "l4",
    "NVIDIA A40": "a40", "NVIDIA GeForce RTX 4090": "rtx-4090", "NVIDIA GeForce RTX 4090 D": None,
    "NVIDIA B200": "b200", "NVIDIA GB200": None, "NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtx-pro-6000",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": None, "NVIDIA RTX 6000 Ada Generation": None,
    "NVIDIA GH200 480GB": None, "NVIDIA H800": None, "NVIDIA A10G": None,
}


@pytest.mark.parametrize("device", DEVICES)
def test_a_recorded_device_name_is_its_preset_or_refused_listing_the_presets(device):
    preset = DEVICES[device]
    if preset is not None:
        assert resolve_gpu(_run(), None, {"gpu": device}) == preset
        return
    listed = ", ".join(gpu_presets())
    with pytest.raises(KvsimError) as refused:
        resolve_gpu(_run(), None, {"gpu": device})
    assert str(refused.value) == (f"gpu: the run recorded gpu={device!r}, which matches no single preset "
                                  f"(hardware=None); pass --gpu with a preset ({listed}) or a GPU file")
