"""The calibration harness end to end on the CPU: a tiny grid, the interpreter, a stand-in timer.

torch, triton and the harness are imported in the test, not when pytest collects it (conftest.py says why)."""

from kernels.grid import Grid, LayerShapes, plan
from kvsim.latency.calibrated import CalibratedLatency
from kvsim.latency.roofline import RooflineLatency
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import EngineConfig


def test_tiny_grid_writes_a_profile_the_model_reads(tmp_path):
    import torch
    import triton

    from kernels.calibrate import measure

    model = load_model("llama-3.1-8b")
    shapes = LayerShapes(num_heads=32, num_kv_heads=8, head_dim=128, hidden_size=64, intermediate_size=96,
                         vocab_size=100, gated_mlp=True, dtype="bfloat16", kv_dtype="auto", model="Llama-3.1-8B",
                         tensor_parallel_size=1)
    grid = Grid(batches=(1, 2), contexts=(16, 40), block_sizes=(16,), prefill_query_lens=(16,),
                prefill_cached_lens=(0, 16), gemm_tokens=(1, 8))
    calls = []

    def timer(fn):
        fn()  # the real kernels run (under the interpreter) so the harness code is exercised
        calls.append(1)
        return 1e-4 * len(calls)

    device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU only under the interpreter
    path = measure(shapes, grid, "cpu-test", tmp_path / "p.csv", device=device, timer=timer,
                   max_kv_bytes=2**22)
    assert len(calls) == len(plan(shapes, grid)) == 4 + 2 + 5 * 2 + 1
    text = path.read_text()
    assert text.startswith("# generator: kvsim calibrate\n# gpu: cpu-test")
    meta = dict(line[2:].split(": ", 1) for line in text.splitlines() if line.startswith("# "))
    assert meta["triton"] == triton.__version__ and meta["torch"] == torch.__version__
    assert meta["model"] == "Llama-3.1-8B" and meta["tensor_parallel_size"] == "1"
    assert meta["kv_cache_dtype"] == "bfloat16" and meta["block_sizes"] == "16"
    assert meta["driver"] and meta["kernels_commit"] and len(meta["kernels_source_sha256"]) == 64
    assert "'head_dim': 128" in meta["shapes"]
    engine = EngineConfig(max_model_len=8192)
    roofline = RooflineLatency(model, load_gpu("h200"), engine)
    latency = CalibratedLatency.from_csv(path, model, engine, roofline)
    assert latency.name == "calibrated(p: cpu-test)"
