"""The capacity formula's bisection for the largest `max_num_seqs` without preemption skips the probes whose
outcome the pool gives (`never_preempts`) and answers exactly as the plain bisection that runs every probe."""

import pytest

from kvsim.engine.builder import resolve_engine
from kvsim.engine.simulate import simulate
from kvsim.report import no_preemption
from kvsim.report.studies import Study, StudyConfig, saturated
from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario


def fixed(c: int) -> tuple[str, ...]:
    """A formula row's lengths: prompt c/2 + output c/2, caching off, paged."""
    return ("engine.allocator=paged", "engine.enable_prefix_caching=false", "workload.trace=null",
            "workload.shared_prefix=null", f"workload.prompt_len={{dist: fixed, value: {c // 2}}}",
            f"workload.output_len={{dist: fixed, value: {c - c // 2}}}")


SMALL_POOL = ("engine.num_gpu_blocks_override=257", "latency={model: constant, step_s: 0.01}")  # quick runs


NGRAM = "engine.speculative_config={method: ngram, num_speculative_tokens: 3, acceptance_length: 2.0}"
EAGLE = "engine.speculative_config={method: eagle3, num_speculative_tokens: 3, acceptance_length: 2.0}"


@pytest.mark.parametrize("engine", [(), ("engine.scheduler=v0", "engine.preemption_mode=swap"),
                                    ("engine.async_scheduling=false", "engine.block_size=32"), (NGRAM,)],
                         ids=["v1-async", "v0-swap", "v1-sync-block-32", "ngram-drafts"])
def test_the_bisection_answers_as_the_plain_one_with_fewer_runs(monkeypatch, engine):
    """Four engines (one with n-gram drafts), three fixed lengths, on a pool of 256 blocks: the same answers as
    the bisection that simulates every probe (`never_preempts` patched to know nothing), in fewer runs."""
    st = Study(load_scenario(None, [*SMALL_POOL, *engine], default=REPORT_SCENARIO),
               StudyConfig(num_requests=16, workers=1, saturate_max_requests=48))
    rows = [fixed(128), fixed(256), fixed(512)]
    runs, counts = st.run_saturated(rows)
    simulated: list[int] = []

    def run(scenarios):
        simulated.append(len(scenarios))
        return st.run(scenarios)

    def bisect() -> list[int]:
        return no_preemption.largest_seqs_without_preemption(
            lambda i, seqs: st.saturated(*rows[i], f"engine.max_num_seqs={seqs}", num_requests=counts[i]), run,
            runs)

    skipping = bisect()
    runs_skipping, simulated[:] = sum(simulated), []
    monkeypatch.setattr(no_preemption, "never_preempts", lambda scenario: False)
    assert bisect() == skipping
    assert runs_skipping < sum(simulated)


def with_seqs(base, max_num_seqs: int):
    """`base` saturated with `max_num_seqs` for a limit: 3 × that many requests at once, enough to fill it."""
    return saturated(base, max_num_seqs, f"engine.max_num_seqs={max_num_seqs}")


@pytest.mark.parametrize(("engine", "c", "extra"), [
    ((), 1024, 0), (("engine.scheduler=v0", *SMALL_POOL), 512, 0),
    (("engine.async_scheduling=false", "engine.prefix_cache=radix"), 512, 0),
    ((NGRAM, *SMALL_POOL), 256, 3), ((EAGLE, *SMALL_POOL), 256, 6)])
def test_the_largest_count_it_calls_calm_runs_without_preempting(engine, c, extra):
    """At the largest max_num_seqs `never_preempts` vouches for, a saturated run fills every slot and never
    preempts; one more sequence is past the bound: cdiv(c + extra, bs) blocks each would not all fit. With
    K = 3 drafts a verify step holds K slots more, and EAGLE vLLM's lookahead of K more again (n-gram: none)."""
    base = load_scenario(None, [*engine, *fixed(c)], default=REPORT_SCENARIO)
    m = max(n for n in range(1, 200) if no_preemption.never_preempts(with_seqs(base, n)))
    scenario = with_seqs(base, m)
    spec = resolve_engine(scenario)
    blocks_per_seq = -(-(c + extra) // scenario.engine.block_size)  # full attention: every slot, whole blocks
    assert m * blocks_per_seq <= spec.num_gpu_blocks - scenario.engine.num_null_blocks
    over = resolve_engine(with_seqs(base, m + 1))
    assert (m + 1) * blocks_per_seq > over.num_gpu_blocks - scenario.engine.num_null_blocks
    summary = simulate(scenario).summary
    assert summary["num_preemptions"] == 0 and summary["max_running"] == m


@pytest.mark.parametrize("setting", [
    ("workload.n=2",), ("engine.enable_prefix_caching=true",), ("workload.multi_turn={turns: 2}",),
    ("model=llama-4-scout", "gpu=h200", "engine.tensor_parallel_size=8"),
    ("workload.prompt_len={dist: uniform, low: 4, high: 12}",), ("workload.shared_prefix={tokens: 8}",)],
    ids=["samples", "caching", "multi-turn", "chunked-local", "varying-lengths", "shared-prefix"])
def test_it_vouches_only_where_a_sequences_blocks_are_known(setting):
    """Samples and caching share blocks, multi-turn prompts carry history, chunked-local attention is not
    checked against runs, a drawn length may be longer, a shared prefix adds to the prompt: no bound,
    even for one sequence of 16 tokens (which it gives without them)."""
    one = [*fixed(16), "engine.max_num_seqs=1", "engine.max_model_len=4096"]
    assert no_preemption.never_preempts(load_scenario(None, one, default=REPORT_SCENARIO))
    assert not no_preemption.never_preempts(load_scenario(None, [*one, *setting], default=REPORT_SCENARIO))


def test_a_sliding_window_sequence_is_counted_at_the_most_it_holds_prefilling():
    """Gemma-3-27B (1 full-attention group, 6 sliding groups of window 1,024), 3,101 blocks of 16 (3,100 usable),
    chunks of 2,048, prompt 1,024 + output 1,024: decoding, a sequence holds 128 + 6 · 65 = 518 blocks
    (tests/test_report_closed_forms.py), but while its prompt is computed every group holds the whole prompt's
    blocks and the step's (window − 1 + chunk = 3,071 tokens ≥ its 2,048): 7 · cdiv(2,048, 16) = 896. So the bound
    vouches for 3,100 // 896 = 3 sequences, not 3,100 // 518 = 5; at 3 a saturated run fills its slots calmly."""
    gemma = ("model=gemma-3-27b", "gpu=h100-80gb", "engine.num_gpu_blocks_override=3101",
             "engine.max_num_batched_tokens=2048", "engine.max_model_len=4096")
    base = load_scenario(None, [*gemma, *fixed(2048)], default=REPORT_SCENARIO)
    assert max(n for n in range(1, 20) if no_preemption.never_preempts(with_seqs(base, n))) == 3
    summary = simulate(with_seqs(base, 3)).summary
    assert summary["num_preemptions"] == 0 and summary["max_running"] == 3


@pytest.mark.parametrize("engine", [
    ("engine.scheduler=v0", "engine.watermark=0.1"), ("engine.kv_cache_dtype=fp8",), ("engine.tensor_parallel_size=2",),
    ("engine.scheduling_policy=priority",), (EAGLE.replace("3, acc", "4, acc"), "engine.async_scheduling=false"),
    ("engine.max_model_len=40", NGRAM.replace("3, acc", "5, acc"))],
    ids=["v0-watermark", "fp8", "tp2", "priority", "eagle-4-sync", "drafts-capped-by-max-model-len"])
@pytest.mark.parametrize(("prompt", "output"), [(17, 15), (7, 9), (1, 31)])
def test_every_count_it_calls_calm_runs_calm_on_more_engines(engine, prompt, output):
    """The engines and lengths the bound might miss: v0's watermark (it only delays admission), fp8 and
    tensor-parallel pools (their blocks are the engine's own), priority preemption, EAGLE's verify and lookahead
    without async scheduling, drafts cut by max_model_len, and lengths off the block boundary. At the largest
    count `never_preempts` vouches for, and at half of it, a saturated run never preempts (by the definition of
    the answer: the run's own count), and fills its slots (but behind v0's watermark)."""
    pool = ("engine.num_gpu_blocks_override=97", "engine.max_model_len=1024", "latency={model: constant, step_s: 0.01}")
    base = load_scenario(None, [*pool, *engine, *fixed(2 * prompt)[:4], f"workload.prompt_len={{dist: fixed, value: "
                                f"{prompt}}}", f"workload.output_len={{dist: fixed, value: {output}}}"],
                         default=REPORT_SCENARIO)
    m = max(n for n in range(1, 100) if no_preemption.never_preempts(with_seqs(base, n)))
    for seqs in (m, m // 2):
        summary = simulate(with_seqs(base, seqs)).summary
        assert summary["num_preemptions"] == 0
        # fills its slots; v0's watermark keeps 10 % of the pool free of new prompts (a few slots stay empty)
        assert summary["max_running"] == seqs if "engine.watermark=0.1" not in engine else summary["max_running"] <= seqs
