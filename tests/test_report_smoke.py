"""The report completes, without a traceback, for every preset model on a GPU it fits (a tiny study size).

In `./dev test` three models stand for the families (dense, MoE, sliding-window hybrid); with
KVSIM_FULL_TESTS=1 every preset runs. Each uses the smallest GPU and TP the weights fit on.
"""

from pathlib import Path

import pytest

from kvsim.model.capacity import num_gpu_blocks
from kvsim.model.config import load_gpu, load_model
from kvsim.model.errors import KvsimError
from kvsim.report.build import build_report
from kvsim.report.studies import StudyConfig
from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario
from tests.conftest import sized

PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "kvsim/model/presets/models").glob("*.json"))
MODELS = sized(["llama-3.1-8b", "qwen3-30b-a3b", "gemma-3-27b"], PRESETS)
TINY = StudyConfig(num_requests=12, load_fractions=(0.5, 1.5), shared_prefix_counts=(4,), fleet_requests=12,
                   fleet_max_replicas=2, rate_requests=60, rate_max_requests=120, saturate_max_requests=150,
                   workers=1)


def fitting(model: str) -> tuple[str, int]:
    """The first GPU × TP (h100-80gb, then h200, TP 1..8) whose pool holds a max_model_len 4096 request."""
    spec = load_model(model)
    for tp in (1, 2, 4, 8):
        for gpu in ("h100-80gb", "h200"):
            engine = load_scenario(None, [f"model={model}", f"gpu={gpu}", f"engine.tensor_parallel_size={tp}"],
                                   default=REPORT_SCENARIO).engine
            try:
                num_gpu_blocks(spec, load_gpu(gpu), engine)
                return gpu, tp
            except KvsimError:
                continue
    raise AssertionError(f"{model} fits on no H100/H200 with TP ≤ 8")


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_report_completes(tmp_path, model):
    gpu, tp = fitting(model)
    base = load_scenario(None, [f"model={model}", f"gpu={gpu}", f"engine.tensor_parallel_size={tp}"],
                         default=REPORT_SCENARIO)
    out = build_report(base, tmp_path / "r", TINY)
    md = (out / "report.md").read_text()
    assert "nan" not in md.replace("nano", "") and "100.0% to 100.0%" not in md
