"""A sliding-window layer's decode read is Σ min(context, window), exactly, for batches across the window.

gemma-3-27b: 62 layers, every sixth full attention (10 full, 52 sliding over 1,024 tokens), 16 KV heads of 128,
bf16: 2 · 16 · 128 · 2 = 8,192 KV bytes a token and layer. Two decodes at contexts 100 and 3,000 read
100 + 3,000 tokens in each full layer and 100 + 1,024 = 1,124 in each sliding one (the aggregate bound
min(Σ, n · window) had read 2,048).
"""

from __future__ import annotations

from kvsim.engine.simulate import simulate
from kvsim.latency.efficiency import DATASHEET
from kvsim.latency.roofline import RooflineLatency, attended_windows
from kvsim.latency.step_plan import StepPlan
from kvsim.model.capacity import model_kv_layout
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import make_engine
from kvsim.sched.burst import burst_batch
from kvsim.workload.scenario import resolve_scenario
from tests.conftest import make_request, tiny_world

GEMMA = load_model("gemma-3-27b")
PER_LAYER = 2 * 16 * 128 * 2


def test_the_read_of_decodes_across_the_window_by_hand() -> None:
    roof = RooflineLatency(GEMMA, load_gpu("h100-80gb"), make_engine(max_model_len=4096), efficiency=DATASHEET)
    assert roof.decode_read_bytes(2, 3100, {1024: 1124}) == (3100 * 10 + 1124 * 52) * PER_LAYER
    assert roof.decode_read_bytes(2, 3100) == (3100 * 10 + 2048 * 52) * PER_LAYER  # the bound, unplanned
    for hybrid_off in (False, True):  # the kernels attend over the window either way
        engine = make_engine(max_model_len=4096, disable_hybrid_kv_cache_manager=hybrid_off)
        assert attended_windows(GEMMA, engine, model_kv_layout(GEMMA, engine)) == (1024,)
    llama, engine = load_model("llama-3.1-8b"), make_engine(max_model_len=4096)
    assert attended_windows(llama, engine, model_kv_layout(llama, engine)) == ()


def test_the_scheduler_counts_each_decode_inside_its_window() -> None:
    """Prompts of 100 and 3,000 tokens with all but their last token computed (one token after ≥ 1 cached:
    decodes, as `StepPlan.add` counts them) and a 50-token chunk from nothing (not a decode)."""
    sched = tiny_world(num_blocks=400, max_num_batched_tokens=4096, max_model_len=4096)
    sched.decode_windows = (1024, 2048)
    short, long, chunk = make_request(1, 0.0, 100, 5), make_request(2, 0.0, 3000, 5), make_request(3, 0.0, 50, 5)
    short.num_computed_tokens, long.num_computed_tokens = 99, 2999
    plan = StepPlan(scheduled=[(short, 1), (long, 1), (chunk, 50)])
    sched.account(plan)
    assert plan.num_decode_seqs == 2 and plan.sum_decode_context_tokens == 3100
    assert plan.windowed_decode_context_tokens == {1024: 100 + 1024, 2048: 100 + 2048}
    assert plan.decode_context_in_window(1024) == 1124
    sched.decode_windows = ()  # a model without windows: nothing counted, nothing asked
    plain = StepPlan(scheduled=[(short, 1), (long, 1)])
    sched.account(plain)
    assert plain.windowed_decode_context_tokens is None


def test_a_burst_keeps_every_context_on_one_side_of_each_window() -> None:
    """Condition (f): decodes at 100 and 3,000 straddle a 1,024 window (no burst); at 100 and 1,000 they may
    run 1,024 − 1,000 + 1 = 25 steps (the last at 1,024), at 2,000 and 3,000 as many as the outputs allow."""
    def batch(contexts: list[int], windows: tuple[int, ...]):
        sched = tiny_world(num_blocks=2000, max_num_batched_tokens=8192, max_model_len=8192, caching=False)
        sched.decode_windows = windows
        reqs = [make_request(rid, 0.0, context - 1, 500) for rid, context in enumerate(contexts)]
        for req in reqs:
            sched.enqueue(req)
        sched.complete(sched.schedule(0.0), 0.0)  # both prompts in one step: one output token each
        assert [r.num_computed_tokens + 1 for r in reqs] == contexts
        return burst_batch(sched)

    assert batch([100, 3000], (1024,)) is None
    assert batch([100, 3000], ())[4] == 499
    assert batch([100, 1000], (1024,))[4] == 25
    assert batch([2000, 3000], (1024,))[4] == 499


def test_gemma_on_the_paged_allocator_runs_the_same_with_bursts_or_step_by_step() -> None:
    """vLLM's disable_hybrid_kv_cache_manager puts gemma-3's sliding layers on the paged allocator (bursts on);
    contexts from about 600 to 1,800 tokens cross the 1,024 window mid-run."""
    scenario = resolve_scenario({
        "model": "gemma-3-27b", "gpu": "h100-80gb", "seed": 3,
        "engine": {"max_model_len": 4096, "max_num_seqs": 8, "disable_hybrid_kv_cache_manager": True},
        "workload": {"num_requests": 12, "arrival": {"process": "poisson", "rate": 4.0},
                     "prompt_len": {"dist": "uniform", "low": 600, "high": 1000},
                     "output_len": {"dist": "uniform", "low": 200, "high": 800}}}, {})
    burst, step_by_step = simulate(scenario), simulate(scenario, bursts=False)
    assert burst.requests.equals(step_by_step.requests) and burst.steps.equals(step_by_step.steps)
    assert (burst.requests.prompt_tokens + burst.requests.output_tokens).max() > 1024
