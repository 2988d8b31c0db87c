"""The report completes, without a traceback, for every preset model on a GPU it fits (a tiny study size).

In `./dev test` two models stand for the families (dense; MoE, whose fp8 figure once crashed); with
KVSIM_FULL_TESTS=1 every preset runs (the sliding-window hybrids among them run step by step: minutes). Each uses the smallest GPU and TP the weights fit on.
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
MODELS = sized(["llama-3.1-8b", "qwen3-30b-a3b"], PRESETS)
TINY = StudyConfig(num_requests=12, load_fractions=(0.5, 1.5), shared_prefix_counts=(4,), fleet_requests=12,
                   fleet_max_replicas=2, rate_requests=60, rate_max_requests=120, saturate_max_requests=150,
                   speculation_batch_sizes=(1, 16), workers=1)


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


def test_a_prompt_the_hybrid_pool_cannot_admit_whole_is_rejected_not_stalled():
    """gemma-3-27b keeps 7 KV groups (sliding windows and full attention) in one pool; admission takes the
    whole prompt in every group. With 4,501 blocks of 16 tokens (4,500 usable; vLLM's startup check for
    max_model_len 16,384 asks for 4,486), a prompt of 10,273 tokens or more takes 7 · 643 = 4,501 blocks or
    more: it can never be admitted, so it is rejected with the reason
    instead of blocking the queue head forever (the stall of issue 20); every other request finishes."""
    from kvsim.engine.simulate import simulate
    from kvsim.workload.scenario import make_scenario

    scenario = make_scenario({
        "name": "hybrid-refusal", "model": "gemma-3-27b", "gpu": "h100-80gb", "steps": "none",
        "engine": {"max_model_len": 16384, "num_gpu_blocks_override": 4501, "enable_prefix_caching": False},
        "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": 20, "arrival": {"process": "constant", "rate": 100.0},
                     "prompt_len": {"dist": "uniform", "low": 100, "high": 16000},
                     "output_len": {"dist": "fixed", "value": 4}}})
    result = simulate(scenario)
    summary, prompts = result.summary, result.requests.prompt_tokens
    too_long = int((7 * -(-prompts // 16) > 4500).sum())  # 7 groups × ceil(prompt / 16) blocks > 4,500 usable
    assert too_long >= 1 and summary["num_rejected"] == too_long and summary["num_finished"] == 20 - too_long
    assert any("7 KV groups at admission" in reason for reason in summary["reject_reasons"])
