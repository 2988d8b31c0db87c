"""The report completes, without a traceback, for every preset model on every preset GPU (a tiny study size).

Each model × GPU pair uses the smallest TP (1, 2, 4, 8) whose pool holds a max_model_len 4096 request (the
report's default; the model's context when shorter, as OPT's 2,048) on that GPU; a pair no TP fits must be refused with one `KvsimError` line (as the CLI prints it), never a
traceback. In `./dev test` three pairs stand for the families (dense on a datacenter GPU; MoE, whose fp8
figure once crashed; dense on a small GDDR GPU); with KVSIM_FULL_TESTS=1 every preset × every GPU runs
(the sliding-window hybrids among them run step by step: allow hours for the whole matrix).
"""

from pathlib import Path

import pytest
import yaml

from kvsim.model.capacity import check_parallel, num_gpu_blocks
from kvsim.model.config import load_gpu, load_model
from kvsim.model.errors import KvsimError
from kvsim.report.build import build_report
from kvsim.report.studies import StudyConfig
from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario
from tests.conftest import sized

PRESET_DIR = Path(__file__).resolve().parents[1] / "kvsim/model/presets"
PRESETS = sorted(p.stem for p in (PRESET_DIR / "models").glob("*.json"))
GPUS = sorted(yaml.safe_load((PRESET_DIR / "gpus.yaml").read_text()))
PAIRS = sized([("llama-3.1-8b", "h100-80gb"), ("qwen3-30b-a3b", "h100-80gb"), ("qwen2.5-7b", "l4")],
              [(m, g) for m in PRESETS for g in GPUS])
TINY = StudyConfig(num_requests=12, load_fractions=(0.5, 1.5), shared_prefix_counts=(4,), fleet_requests=12,
                   fleet_max_replicas=2, fleet_max_probe_requests=12, fleet_verify_factor=0, rate_requests=60, rate_max_requests=120, rate_max_verify_requests=240,
                   saturate_max_requests=150, offload_requests=12, offload_loads=(1.0,),
                   speculation_batch_sizes=(1, 16), workers=1)


def settings(model: str, gpu: str, tp: int) -> list[str]:
    """The report's scenario for `model` on `gpu` with TP `tp`, max_model_len capped at the model's context."""
    max_model_len = min(4096, load_model(model).max_position_embeddings)
    return [f"model={model}", f"gpu={gpu}", f"engine.tensor_parallel_size={tp}", f"engine.max_model_len={max_model_len}"]


def fitting_tp(model: str, gpu: str) -> int | None:
    """The smallest TP (1, 2, 4, 8) the model splits over whose pool on `gpu` holds a max_model_len request
    (None: none)."""
    spec = load_model(model)
    for tp in (1, 2, 4, 8):
        engine = load_scenario(None, settings(model, gpu, tp), default=REPORT_SCENARIO).engine
        try:
            check_parallel(spec, engine)
            num_gpu_blocks(spec, load_gpu(gpu), engine)
            return tp
        except KvsimError:
            continue
    return None


@pytest.mark.slow
@pytest.mark.parametrize(("model", "gpu"), PAIRS)
def test_report_completes(tmp_path, model, gpu):
    tp = fitting_tp(model, gpu)
    base = load_scenario(None, settings(model, gpu, tp or 8), default=REPORT_SCENARIO)
    if tp is None:  # the weights leave no pool even at TP 8: one clear line, nothing written
        with pytest.raises(KvsimError) as refused:
            build_report(base, tmp_path / "r", TINY)
        assert "\n" not in str(refused.value) and not (tmp_path / "r").exists()
        return
    out = build_report(base, tmp_path / "r", TINY)
    md = (out / "report.md").read_text()
    assert "nan" not in md.replace("nano", "") and "100.0% to 100.0%" not in md


def test_a_prompt_the_hybrid_pool_cannot_hold_whole_is_served_a_chunk_at_a_time():
    """gemma-3-27b keeps 7 KV groups in one pool: 10 full-attention layers and 52 sliding-window ones (window
    1,024) in groups of 10, so 1 full group and 6 sliding groups. vLLM v1 admits a request by allocating
    its first chunk only (`allocate_slots(request, num_new_tokens)`, the chunk within the 8,192-token budget),
    and each sliding group frees the blocks behind its window before the next chunk. So a request holds at
    most cdiv(P + O, 16) full-group blocks plus, per sliding group, cdiv(1,023 + 8,192, 16) + 1 = 577: for the
    longest prompt here (≤ 16,000 + 4 tokens) 1,001 + 6 · 577 = 4,463 ≤ the 4,500 usable blocks of 4,501 (vLLM's
    startup check for max_model_len 16,384 asks for 1,024 + 3,462 = 4,486). Whole-prompt admission, every group
    at once, would need 7 · cdiv(P, 16) > 4,500 blocks for P ≥ 10,273 and could never admit those prompts
    (the stall of issue 20, then refused); admitted by chunk, every request is served, none refused."""
    from kvsim.engine.simulate import simulate
    from kvsim.workload.scenario import make_scenario

    scenario = make_scenario({
        "name": "hybrid-chunked", "model": "gemma-3-27b", "gpu": "h100-80gb", "steps": "none",
        "engine": {"max_model_len": 16384, "num_gpu_blocks_override": 4501, "enable_prefix_caching": False},
        "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": 20, "arrival": {"process": "constant", "rate": 100.0},
                     "prompt_len": {"dist": "uniform", "low": 100, "high": 16000},
                     "output_len": {"dist": "fixed", "value": 4}}})
    result = simulate(scenario, check=True)
    summary, prompts = result.summary, result.requests.prompt_tokens
    assert int((7 * -(-prompts // 16) > 4500).sum()) >= 1  # some prompts the pool cannot take whole
    assert summary["num_rejected"] == 0 and summary["num_finished"] == 20


def test_a_pool_of_exactly_vllms_per_request_maximum_serves_the_longest_request():
    """max_model_len 16,050 = a 16,000-token prompt + 50 outputs: vLLM's startup check asks for
    cdiv(16,050, 16) = 1,004 full-group blocks + 6 sliding groups × (cdiv(1,023 + 8,192, 16) + 1 = 577)
    = 4,466 blocks. A pool of exactly that (4,467 with the null block) must serve three such requests one
    after another, chunk by chunk, the allocator's invariants checked every step: never a stall."""
    from kvsim.engine.simulate import simulate
    from kvsim.workload.scenario import make_scenario

    scenario = make_scenario({
        "name": "hybrid-tight", "model": "gemma-3-27b", "gpu": "h100-80gb", "steps": "none",
        "engine": {"max_model_len": 16050, "num_gpu_blocks_override": 4467, "enable_prefix_caching": False},
        "latency": {"model": "constant", "step_s": 0.01},
        "workload": {"num_requests": 3, "arrival": {"process": "constant", "rate": 100.0},
                     "prompt_len": {"dist": "fixed", "value": 16000}, "output_len": {"dist": "fixed", "value": 50}}})
    summary = simulate(scenario, check=True).summary
    assert summary["num_finished"] == 3 and summary["num_rejected"] == 0
    raw = scenario.model_dump(mode="json")
    # 4,466 blocks: block 0 is the null block, 4,465 usable, one short of a request's maximum; vLLM's startup check
    # leaves the null block out since PR #47272 (it compared all the memory before, and started), so the engine
    # does not start (kvsim started it and refused each request up front)
    raw["engine"]["num_gpu_blocks_override"] = 4466
    with pytest.raises(KvsimError, match=r"max_model_len=16050: .* \(4,466 blocks, one of them v1's null block"):
        simulate(make_scenario(raw))


def test_a_workload_with_priority_classes_gets_each_class_latency_in_the_report():
    """Issue 23: per-class TTFT/TPOT/E2E in the report's Load section (the study that makes it, run alone on the
    paged sustained rate it grids from; the report writes each section's tables as CSV, `test_report.py`). Under
    `--scheduling-policy priority` the class served first (priority 0) waits no longer than the other at the
    grid's highest load, and every load point has a row per class."""
    from kvsim.report import paging_study, studies
    from kvsim.report.text import load_text

    mix = "workload.priority={classes: [{name: chat, priority: 0, weight: 1}, {name: batch, priority: 1, weight: 1}]}"
    base = load_scenario(None, [*settings("llama-3.1-8b", "h100-80gb", 1), mix, "engine.scheduling_policy=priority"],
                         default=REPORT_SCENARIO)
    st = studies.Study(base, TINY)
    load, _ = paging_study.load_and_alerts(st, paging_study.sustained_rates(st, ("paged",)))
    by_class, curves = load.tables["load_by_priority"], load.tables["load_curves"]
    assert sorted(by_class.priority.unique()) == [0, 1]
    top = by_class[by_class.rate == by_class.rate.max()].set_index("priority")
    assert top.loc[0, "ttft_p90_s"] <= top.loc[1, "ttft_p90_s"]
    assert set(by_class.columns) >= {"ttft_p50_s", "tpot_p90_s", "e2e_p90_s", "num_in_window"}
    assert len(by_class) == 2 * len(curves)
    assert "Per priority class" in load_text(load, TINY)
