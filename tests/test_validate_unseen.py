"""`kvsim validate` on runs it has never seen: the bench JSON as each vLLM version writes it, settings a run records
(held against each other and against flags), and GPU names as the driver writes them. Expected values by hand
from the fields vLLM's `benchmarks/benchmark_serving.py` (2024-25) and `vllm/benchmarks/serve.py` (2025-26) save."""

import json

import pandas as pd
import pytest

from kvsim.model.config import gpu_presets
from kvsim.model.errors import KvsimError
from kvsim.validation.measured import MeasuredRun
from kvsim.validation.recorded import recorded_settings
from kvsim.validation.replay import build_scenario, resolve_gpu
from kvsim.workload.traces import TraceRecord


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
