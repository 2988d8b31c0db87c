"""Sustained capacity: the concurrency a saturated engine holds over time, not its admission peak."""

import pytest

from kvsim.engine.simulate import simulate
from kvsim.report.capacity_study import capacity_formula
from kvsim.report.studies import Study, StudyConfig
from kvsim.workload.scenario import load_scenario

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


def _steps(num_steps: int, queued: set[int], running: list[int]):
    """Hand-built steps: each 0.1 s long; steps in `queued` had a request waiting."""
    import pandas as pd

    from kvsim.results.metrics import WASTE_KEYS
    return pd.DataFrame({"time_s": [0.1 * i for i in range(num_steps)], "duration_s": [0.1] * num_steps,
                         "vllm:kv_cache_usage_perc": [0.5] * num_steps, "held_slots": [1] * num_steps,
                         "shared_slots": [0] * num_steps,
                         "vllm:num_requests_waiting": [1 if i in queued else 0 for i in range(num_steps)],
                         "vllm:num_requests_running": running,
                         "vllm:num_preemptions_total": [0] * num_steps,
                         **{k: [1 / len(WASTE_KEYS)] * num_steps for k in WASTE_KEYS}})


def test_saturated_window_too_short_to_plan_on_is_null_with_a_reason():
    """A 10 s run (100 steps of 0.1 s) queued for 5 steps = 0.5 s, 5 % of it: a clump of arrivals, under the
    10 % floor, so no sustained figure; queued for 50 steps holding 8 running each, the figure is exactly 8."""
    from kvsim.results.metrics import saturated_summary
    clump = saturated_summary(_steps(100, set(range(40, 45)), [150] * 100), run_duration_s=10.0)
    assert clump["mean_running"] is None and clump["preemptions_per_s"] is None
    assert clump["duration_s"] == pytest.approx(0.5)
    assert "transient" in clump["reason"]
    held = saturated_summary(_steps(100, set(range(50)), [8] * 50 + [2] * 50), run_duration_s=10.0)
    assert held["mean_running"] == pytest.approx(8.0) and held["reason"] is None


def test_light_load_never_saturates_and_the_table_says_so():
    """By hand: 20 requests of 64 prompt + 16 output tokens, one every 10 s on average (Poisson, rate 0.1/s).
    Each is served in well under a second (one prefill and 16 decode steps of a few ms for an 8B model on an
    H100), so a request almost never finds another still queued: no steady state to report."""
    from rich.console import Console

    from kvsim.results.render import summary_table
    scenario = load_scenario(None, [*POOL, "workload.num_requests=20", "workload.arrival={process: poisson, rate: 0.1}",
                                    "workload.prompt_len={dist: fixed, value: 64}",
                                    "workload.output_len={dist: fixed, value: 16}"])
    summary = simulate(scenario).summary
    assert summary["saturated"]["mean_running"] is None
    assert summary["saturated"]["reason"]
    console = Console(width=200, record=True)
    console.print(summary_table(summary))
    assert "not saturated" in console.export_text()


def test_saturated_run_reports_a_number():
    """All 150 requests of 256 + 256 tokens arrive at once into 1,023 blocks (at most 1023 / 32 ≈ 32 full
    sequences): the queue lasts most of the run, so the sustained concurrency is a number, below the 150."""
    summary = simulate(half_and_half(512, 150)).summary
    sat = summary["saturated"]
    assert sat["reason"] is None and 0 < sat["mean_running"] < 150
    assert sat["duration_s"] >= 0.5 * summary["duration_s"]


def test_summary_gives_the_largest_concurrency_without_preemption_only_when_it_never_preempted():
    """1,024 − 1 usable blocks, fixed 512 + 512 requests (64 blocks each at full length), all at once.
    With max_num_seqs = 15, 15 · 64 = 960 <= 1,023 blocks: 15 run together to the end and nothing is
    preempted, so the summary says 15. With 40 allowed, about twice as many start on their prompts (32 blocks
    each) and growth preempts: a peak reached that way is no level the engine could hold, so null."""
    def run(max_num_seqs: int) -> dict:
        return simulate(load_scenario(None, [*POOL, "engine.max_model_len=1024", "workload.num_requests=45",
                                             "workload.arrival={process: poisson, rate: 100000}",
                                             "workload.prompt_len={dist: fixed, value: 512}",
                                             "workload.output_len={dist: fixed, value: 512}",
                                             f"engine.max_num_seqs={max_num_seqs}"])).summary

    calm = run(15)
    assert calm["num_preemptions"] == 0 and calm["max_running_without_preemption"] == 15
    busy = run(40)
    assert busy["num_preemptions"] > 0 and busy["max_running_without_preemption"] is None
