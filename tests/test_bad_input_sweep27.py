"""Bad input found by the twenty-seventh sweep (the newer scenario sections field by field, and their combinations).
Each is refused (the CLI: exit 2, one line naming the field and the value, nothing written; the Python API: a
`KvsimError`), or said as it is.

Found: speculative decoding under a token budget that no CUDA-graph capture size of 1 + K tokens fits (vLLM refuses
to start) was refused by the roofline and calibrated latency models only: under `latency.model: constant` it ran.
`engine.disable_hybrid_kv_cache_manager: true` on a model whose KV layers (and its drafter's) are of one kind (Llama's
full attention, Mistral's one window, an MLA model) ran without a word, though it changes nothing there (now a warning
line, as `enable_expert_parallel` on a dense model is). `engine.data_parallel_size: 2` beside `scheduler: v0` or
`static` ran as a v1 DP group, a deployment vLLM has not (its data parallelism is the v1 engine's). `kvsim.simulate`
set a field an override names inside another override's dict or list in the caller's own object. A `draft_model` of
another vocabulary size than the target's (Llama-2-7B's 32,000 beside Llama-3.1-8B's 128,256) ran, where vLLM refuses
it at startup. `latency.overlap_swap: true` where no preemption swaps (scheduler v1 or static, v0 told to recompute,
or v0 of single-sequence requests) ran without a word, where `engine.swap_space` was already said unread.

Probed and found refused or read as the rule asks (not repeated here): every field of the engine, offload,
speculative, priority, router, autoscaler and kv_transfer sections at 0, -1, 1e18, 2**63, nan, a boolean, text, an
empty string or list and a list for a scalar, through `--set`, `kvsim.simulate` and each shipped scenario; offload
beside slabs, v0 or caching off; speculation beside beams, v0, slabs or windows; priority on v0/static; radix beside
slabs or windows; windows beside slabs or v0; kv_transfer on one engine or a count; DP inside a fleet or a
disaggregated group; an autoscaler over groups or with min = max; a pool below one max_model_len request.
"""

from __future__ import annotations

import json

import pytest

import kvsim
from kvsim.model.errors import KvsimError
from tests.conftest import one_line_exit_2

TINY = {"workload": {"num_requests": 4, "prompt_len": {"dist": "fixed", "value": 64},
                     "output_len": {"dist": "fixed", "value": 8}}, "steps": "none"}
EAGLE_K2 = {"method": "eagle", "num_speculative_tokens": 2, "acceptance_rates": 0.5}


@pytest.mark.parametrize("latency", ["roofline", "constant"])
def test_a_budget_no_capture_size_of_a_speculative_step_fits_is_refused_whatever_the_latency_model(latency):
    """vLLM rounds each capture size up to a multiple of 1 + K (`adjust_cudagraph_sizes_for_spec_decode`) and
    drops those past its largest, min(2 · max_num_seqs · (1 + K), 512, max_num_batched_tokens) = min(6, 512, 2) = 2
    here: sizes {1, 2} round up to 3, past 2, so none is left and vLLM refuses to start. The constant latency
    model prices no padding, so it never asked."""
    with pytest.raises(KvsimError, match=r"^engine\.max_num_batched_tokens=2: vLLM refuses to start with "
                                         r"num_speculative_tokens=2: no CUDA graph size up to 2 is a multiple of 3"):
        kvsim.simulate(TINY, latency__model=latency, engine__speculative_config=EAGLE_K2, engine__max_num_seqs=1,
                       engine__max_num_batched_tokens=2)


def test_the_cli_refuses_it_under_the_constant_model_in_one_line(tmp_path):
    out = tmp_path / "out"
    line = one_line_exit_2(["run", "--set", "latency.model=constant", "--set", "workload.num_requests=4",
                            "--set", "engine.max_num_seqs=1", "--set", "engine.max_num_batched_tokens=2",
                            "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, '
                            '"acceptance_rates": 0.5}', "-o", str(out)])
    assert line.startswith("engine.max_num_batched_tokens=2: vLLM refuses to start") and not out.exists()


@pytest.mark.parametrize("engine", [{"enforce_eager": True, "max_num_batched_tokens": 2},
                                    {"max_num_batched_tokens": 6}])
def test_eager_steps_or_a_budget_that_fits_one_size_still_run_under_the_constant_model(engine):
    """Eager: no graphs to capture. A budget of 6: sizes 1, 2 and 4 (up to min(6, 512, 6) = 6) round up to 3, 3
    and 6, and 3 is within the largest, 4."""
    result = kvsim.simulate(TINY, latency__model="constant", engine__speculative_config=EAGLE_K2,
                            engine__max_num_seqs=1, **{f"engine__{k}": v for k, v in engine.items()})
    assert result.summary["num_finished"] == 4


def _unread(**fields):
    from kvsim.fleet.run import unread_by_setting
    from kvsim.workload.scenario import make_scenario

    return unread_by_setting(make_scenario({**TINY, **fields}))


@pytest.mark.parametrize(("model", "engine", "said"), [
    ("llama-3.1-8b", {}, "every KV layer of llama-3.1-8b has full attention"),
    ("mistral-7b", {"max_model_len": 4096}, "every KV layer of mistral-7b has a sliding window of 4096 tokens"),
    ("llama-3.1-8b", {"speculative_config": EAGLE_K2},
     "every KV layer of llama-3.1-8b and its drafter's has full attention"),
])
def test_the_hybrid_manager_flag_on_a_pool_of_one_kind_of_layer_is_said_unread(model, engine, said):
    """vLLM's `unify_hybrid_kv_cache_specs` returns at once for a uniform pool: the flag changes only a pool that
    mixes kinds. Llama-3.1-8B's config.json gives no window (32 full-attention layers, and an EAGLE head is one
    more of the same); Mistral-7B-v0.1's gives `sliding_window: 4096` to every layer."""
    line = _unread(model=model, engine={"disable_hybrid_kv_cache_manager": True, **engine})[
        "disable_hybrid_kv_cache_manager"]
    assert line.startswith(f"engine.disable_hybrid_kv_cache_manager=true is unread: {said}, ")


@pytest.mark.parametrize(("model", "engine"), [
    ("gpt-oss-20b", {"max_model_len": 4096}),  # layer_types alternate sliding_attention (128) and full_attention
    ("mistral-7b", {"max_model_len": 4096, "speculative_config": EAGLE_K2}),  # a full-attention head beside windows
    ("llama-3.1-8b", {}),  # the flag not given
])
def test_the_flag_where_it_unifies_kinds_or_is_not_given_is_not_said(model, engine):
    flag = {"disable_hybrid_kv_cache_manager": True} if engine else {}
    assert "disable_hybrid_kv_cache_manager" not in _unread(model=model, engine={**flag, **engine})


def test_the_cli_says_the_flag_unread_in_one_warning_line_and_runs(tmp_path):
    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, ["run", "--set", "workload.num_requests=4", "--set", "steps=none", "--set",
                                      "engine.disable_hybrid_kv_cache_manager=true", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if "disable_hybrid_kv_cache_manager" in line]
    assert len(warnings) == 1 and warnings[0].startswith("kvsim: warning: engine.disable_hybrid_kv_cache_manager")


@pytest.mark.parametrize("scheduler", ["v0", "static"])
def test_a_data_parallel_group_of_another_scheduler_than_v1_is_refused(scheduler, tmp_path):
    """vLLM's data-parallel ranks (engine cores behind its DP load balancer, lockstep for an MoE) are its v1
    engine's; V0 has none (vllm-project/vllm issue 16978). A v0 or static group ran as if vLLM served it."""
    with pytest.raises(KvsimError, match=rf"^engine: data_parallel_size=2 needs scheduler v1 \(got {scheduler}\)"):
        kvsim.simulate(TINY, engine__data_parallel_size=2, engine__scheduler=scheduler)
    out = tmp_path / "out"
    line = one_line_exit_2(["run", "--set", f"engine.scheduler={scheduler}", "--set", "workload.num_requests=4",
                            "--set", "engine.data_parallel_size=2", "-o", str(out)])
    assert line.startswith(f"engine: data_parallel_size=2 needs scheduler v1 (got {scheduler})") and not out.exists()


@pytest.mark.parametrize("engine", [{"scheduler": "v0"}, {"allocator": "slab-max"}])
def test_a_v0_engine_alone_and_a_v1_group_of_slab_engines_still_run(engine):
    size = {} if "scheduler" in engine else {"data_parallel_size": 2, "max_model_len": 1024}
    result = kvsim.simulate(TINY, **{f"engine__{k}": v for k, v in {**engine, **size}.items()})
    assert result.summary["num_finished"] == 4


def test_simulate_leaves_the_callers_dicts_and_lists_as_they_were():
    """An override inside a section another override gives (`engine__speculative_config=spec`, then
    `engine__speculative_config__num_speculative_tokens=3`) was set in the caller's own dict: `spec` said K=3."""
    spec = {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rates": [0.5, 0.4]}
    groups = [{"count": 1, "engine": {"max_num_seqs": 8}}]
    result = kvsim.simulate(TINY, engine__speculative_config=spec, engine__speculative_config__num_speculative_tokens=3,
                            engine__speculative_config__acceptance_rates=0.5, replicas=groups,
                            replicas__0__engine__max_num_seqs=4, replicas__0__count=2)
    assert result.scenario.engine.speculative_config.num_speculative_tokens == 3
    assert result.scenario.replicas[0].count == 2 and result.scenario.replicas[0].engine == {"max_num_seqs": 4}
    assert spec == {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rates": [0.5, 0.4]}
    assert groups == [{"count": 1, "engine": {"max_num_seqs": 8}}]


@pytest.mark.parametrize(("draft", "vocab_size"), [("llama-2-7b", 32_000), ("qwen3-8b", 151_936)])
def test_a_draft_model_of_another_vocabulary_is_refused_as_vllm_refuses_it(draft, vocab_size, tmp_path):
    """vLLM's `SpeculativeConfig.verify_equal_vocab_size_if_draft_model` refuses a draft whose vocabulary size is not
    the target's (the published config.json files: Llama-3.1-8B 128,256, Llama-2-7B 32,000, Qwen3-8B 151,936);
    kvsim priced the draft's passes and ran. `kvsim capacity` refuses it the same way."""
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 2, "acceptance_rates": 0.5}
    said = (f"engine.speculative_config.model={draft}: vocab_size={vocab_size}, but llama-3.1-8b's is 128256: vLLM "
            "refuses a draft model of another vocabulary")
    with pytest.raises(KvsimError) as refused:
        kvsim.simulate(TINY, engine__speculative_config=spec)
    assert str(refused.value).startswith(said)
    out = tmp_path / "out"
    assert one_line_exit_2(["run", "--set", "workload.num_requests=4", "--speculative-config", json.dumps(spec),
                            "-o", str(out)]).startswith(said) and not out.exists()
    assert one_line_exit_2(["capacity", "--speculative-config", json.dumps(spec)]).startswith(said)


def test_a_draft_model_of_the_targets_vocabulary_still_runs():
    spec = {"method": "draft_model", "model": "llama-3.1-8b", "num_speculative_tokens": 2, "acceptance_rates": 0.5}
    assert kvsim.simulate(TINY, engine__speculative_config=spec).summary["num_finished"] == 4


@pytest.mark.parametrize(("fields", "why"), [
    ({}, "scheduler v1 never swaps"),
    ({"engine": {"scheduler": "static"}}, "scheduler static never swaps"),
    ({"engine": {"scheduler": "v0", "preemption_mode": "recompute"}, "workload": {**TINY["workload"], "n": 2}},
     "preemption_mode=recompute never swaps"),
    ({"engine": {"scheduler": "v0"}},
     "v0 preempts a single sequence by recompute (preemption_mode unset), and workload.n=1 sends no other"),
])
def test_overlapping_swaps_where_no_preemption_swaps_is_said_unread(fields, why):
    """`latency.overlap_swap` hides a step's swap transfers behind its compute (the roofline's `total_s`); only vLLM
    v0 swaps, and only a preempted request of several sequences unless `preemption_mode: swap` (its `_preempt`),
    so elsewhere no step has a transfer to hide: the same reasons `engine.swap_space` is said unread for."""
    assert _unread(latency={"overlap_swap": True}, **fields)["latency.overlap_swap"] == (
        f"latency.overlap_swap=true is unread: {why}")


@pytest.mark.parametrize("fields", [
    {"engine": {"scheduler": "v0", "preemption_mode": "swap"}},
    {"engine": {"scheduler": "v0"}, "workload": {**TINY["workload"], "n": 2}},  # v0 swaps a request of 2 sequences
    {"engine": {"scheduler": "v0"}, "latency": {"overlap_swap": False}},
])
def test_overlapping_swaps_where_a_preemption_may_swap_or_not_asked_is_not_said(fields):
    assert "latency.overlap_swap" not in _unread(**{"latency": {"overlap_swap": True}, **fields})
