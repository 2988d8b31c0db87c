"""Sustained capacity: the concurrency a saturated engine holds over time, not its admission peak."""

import pytest

from kvsim.engine import simulate
from kvsim.scenario import load_scenario
from kvsim.studies import Study, StudyConfig, capacity_formula

POOL = ["model=llama-3.1-8b", "gpu=h100-80gb", "engine.num_gpu_blocks_override=1024",
        "engine.enable_prefix_caching=false", "workload.trace=null"]


def half_and_half(c: int, n: int):
    return load_scenario(None, [*POOL, "engine.max_model_len=4096", f"workload.num_requests={n}",
                                "workload.arrival={process: poisson, rate: 100000}",
                                f"workload.prompt_len={{dist: fixed, value: {c // 2}}}",
                                f"workload.output_len={{dist: fixed, value: {c // 2}}}"])


@pytest.mark.parametrize("context_len", [512, 2048])
def test_sustained_k_for_half_prompt_half_output(context_len):
    """By hand: in steady state a sequence of prompt c/2 + output c/2 is on average halfway through its output,
    holding 3c/4 tokens, so B usable blocks hold about B / (3c/4 / bs) = 4/3 · B / (c / bs) sequences: k ≈ 1.33,
    a little less once admission waits for whole prompts and preemptions recompute. The admission peak, when
    every sequence holds only its prompt, is about twice the closed form: the transient the old fit measured."""
    summary = simulate(half_and_half(context_len, 150)).summary
    closed_form = 1023 / (context_len // 16)  # 1,024 blocks less vLLM's null block
    k = summary["saturated"]["mean_running"] / closed_form
    assert 1.2 <= k <= 1.45
    assert summary["max_running"] / closed_form > 1.7
    assert summary["saturated"]["preemptions_per_s"] > 0  # holding more than fits at full length thrashes


def test_capacity_formula_table_has_the_three_numbers():
    """Fixed 512 + 512 requests, all at once: with max_num_seqs = m the batch grows in lockstep to 1,023 tokens
    (64 blocks each), so it never preempts iff 64 m <= 1,023: the largest such m is 15."""
    base = load_scenario(None, [*POOL, "engine.max_model_len=1024"])
    section = capacity_formula(Study(base, StudyConfig(num_requests=40, workers=1)))
    table = section.tables["capacity_formula"].set_index("context_len")
    row = table.loc[1024]
    assert row["max_seqs_without_preemption"] == 15
    assert 1.2 <= row["sustained_over_closed_form"] <= 1.45
    assert row["peak_running_transient"] > row["sustained_running"] > row["max_seqs_without_preemption"]
    assert "scenario length mix" in set(table["lengths"])
    assert 1.2 <= section.facts["fitted_constant_fixed"] <= 1.45
