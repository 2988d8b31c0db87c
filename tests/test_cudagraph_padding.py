"""CUDA-graph batch padding (`kvsim.latency.cudagraph`): capture sizes, padded step times, DP padding.

Expected sizes are written out by hand from vLLM 0.19.0's code (vllm/config/vllm.py `_set_cudagraph_sizes`:
max = min(max_num_seqs · (1 + K) · 2, 512, max_num_batched_tokens), sizes [1, 2, 4] + range(8, 256, 8) +
range(256, max + 1, 16); `adjust_cudagraph_sizes_for_spec_decode`; vllm/v1/worker/dp_utils.py
`coordinate_batch_across_dp`), and step times by hand from the bare datasheet roofline or a tiny profile.
"""

import pytest
from test_profiles import write_bundle

from kvsim.engine.builder import make_latency, resolve_engine
from kvsim.latency.calibrated import CalibratedLatency
from kvsim.latency.cudagraph import CudaGraphPadding, capture_sizes, coordinate_dp_group
from kvsim.latency.efficiency import DATASHEET
from kvsim.latency.profiles.loader import load_profile
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.speculative import speculative_latency
from kvsim.latency.step_plan import StepPlan
from kvsim.model.config import load_gpu, load_model
from kvsim.model.drafter import eagle_head
from kvsim.model.engine_config import EngineConfig, make_engine
from kvsim.model.errors import KvsimError
from kvsim.model.speculative_config import SpeculativeConfig
from kvsim.workload.scenario import load_scenario

LLAMA, RTX = load_model("llama-3.1-8b"), load_gpu("rtx-pro-6000")
TP1 = EngineConfig(max_model_len=8192)
MEASURED = CudaGraphPadding.of(128, 2048)  # the validation runs' max_num_seqs and max_num_batched_tokens


@pytest.mark.parametrize(("seqs", "tokens", "k", "expected"), [
    (128, 2048, 0, [1, 2, 4, *range(8, 256, 8), 256]),  # max min(256, 512, 2048) = 256
    (256, 8192, 0, [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]),  # capped at 512
    (128, 100, 0, [1, 2, 4, *range(8, 97, 8)]),  # the token budget caps it: 100, the last size 96
    (2, 2048, 0, [1, 2, 4]),  # max 4
    (128, 2048, 3, [4, *range(8, 256, 8), *range(256, 513, 16)]),  # 128 · 4 · 2 → 512; 1, 2, 4 round up to 4
    (4, 2048, 2, [3, 6, 9, 18, 24]),  # max 24: 1, 2, 4, 8, 16, 24 rounded up to multiples of 3
])
def test_capture_sizes_are_vllms_defaults(seqs, tokens, k, expected):
    assert capture_sizes(seqs, tokens, k) == tuple(expected)


def test_no_size_a_multiple_of_the_verify_length_is_refused():
    with pytest.raises(KvsimError, match=r"engine.max_num_batched_tokens=4: .*num_speculative_tokens=4"):
        capture_sizes(128, 4, 4)  # max 4, sizes 1, 2, 4: every one rounds up to 5


@pytest.mark.parametrize(("tokens", "padded"), [(0, 0), (1, 1), (3, 4), (5, 8), (17, 24), (121, 128), (256, 256),
                                                (257, 257), (2048, 2048)])
def test_a_step_runs_at_the_next_capture_size_and_eager_past_the_largest(tokens, padded):
    assert MEASURED.padded(tokens) == padded


def decodes(n: int, context: int) -> StepPlan:
    plan = StepPlan()
    plan.add(1, context - 1, n, logits_row=True)
    return plan


def test_seventeen_decodes_run_a_24_token_graph_on_the_bare_roofline():
    """Llama-3.1-8B on the RTX PRO 6000 (483.6 TFLOP/s, 1.597 TB/s), every fraction 1 and no floors: the
    layers run 24 tokens, attention, LM head and sampler the 17 real sequences."""
    padded = RooflineLatency(LLAMA, RTX, TP1, overhead_s=0.0, efficiency=DATASHEET, padding=MEASURED)
    eager = RooflineLatency(LLAMA, RTX, TP1, overhead_s=0.0, efficiency=DATASHEET)
    f, b = 483.6e12, 1.597e12
    params = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336  # q, o, k, v and the gated MLP of a layer

    def linear(t):
        return 32 * ((2 * params * t / f) ** 2 + (2 * params / b) ** 2) ** 0.5

    # per token and layer: 2 norms (2h · (2 + 4 · 63) / 64 bytes each, fused with the residual but the first),
    # rotary (q and k read and written, the cos/sin row, an int64 position), activation (read 2I, write I)
    token_bytes = 2 * (2 * 4096 * 254 / 64) + (2 * (2 * 40 * 128 + 128) + 8) + 2 * 3 * 14336
    attention = 17 * 1000 * 131072 / b  # 128 KiB of KV per token
    lm_head = ((2 * 128256 * 4096 * 17 / f) ** 2 + (128256 * 4096 * 2 / b) ** 2) ** 0.5
    plan = decodes(17, 1000)
    assert padded.step_time(plan) == pytest.approx(linear(24) + 32 * 24 * token_bytes / b + attention + lm_head,
                                                   rel=1e-12)
    assert eager.step_time(plan) == pytest.approx(linear(17) + 32 * 17 * token_bytes / b + attention + lm_head,
                                                  rel=1e-12)


def test_tensor_parallel_all_reduces_carry_the_padded_tokens():
    """TP 2 over PCIe (64 GB/s, 57 % in an all-reduce, 1 us a ring step, 8.4 us fixed: `test_roofline`): two
    all-reduces a layer of 24 tokens' 4096-wide bf16 hidden state for 17 decodes."""
    tp2 = RooflineLatency(LLAMA, RTX, EngineConfig(max_model_len=8192, tensor_parallel_size=2), overhead_s=0.0,
                          padding=MEASURED)
    one = 24 * 4096 * 2 / (0.57 * 64e9) + 2 * 1e-6 + 8.4e-6
    assert tp2.fixed_s(decodes(17, 1000)) == pytest.approx(2 * 32 * one, rel=1e-12)


def test_a_decode_burst_prices_its_steps_padded_too():
    roof = RooflineLatency(LLAMA, RTX, TP1, padding=MEASURED)
    first = decodes(17, 1000)
    times = roof.decode_step_times(first)
    assert times is not None
    for step in range(3):
        assert next(times) == roof.step_time(decodes(17, 1000 + step))


def test_calibrated_layers_run_the_padded_tokens(tmp_path):
    """`test_profiles`' bundle (per-op times doubling from 1 to 256 tokens, attention 10 us + 3 ns per decode KV
    token): 9 decodes run a 16-token graph, their attention and sampling stay at 9 sequences."""
    profile = load_profile(write_bundle(tmp_path / "bf16"), LLAMA, RTX, TP1)
    model = CalibratedLatency(profile, LLAMA, TP1, RooflineLatency(LLAMA, RTX, TP1, overhead_s=0.0, padding=MEASURED))
    layer_us = 30 + 20 + 100 + 50 + 2 * 2 + 3 + 4
    layers_at_16 = 32 * layer_us * (1 + 15 / 255) + (5 + 6) * (1 + 15 / 255)  # + embedding and final norm
    attention = 32 * (10 + 1e-3 * 3 * 9 * 1024)
    lm_head, sampler = 700 + 200 * 8 / 255, 20 + 256 * 8 / 255
    expected_us = layers_at_16 + attention + lm_head + sampler
    assert model.step_time(decodes(9, 1024)) == pytest.approx(expected_us * 1e-6, rel=1e-9)


@pytest.mark.parametrize(("tokens", "num_ranks", "each", "group"), [
    ([3, 17], 2, [24, 24], 48),  # every rank in a graph: all run the largest padded count, 24
    ([17], 2, [24], 48),  # the idle rank's 1-token dummy batch is padded to 24 too
    ([300, 17], 2, [300, 24], 324),  # 300 > 256 runs eager: no rank pads to another's, each its own
    ([300], 2, [300], 301),  # ... the idle rank's dummy batch at its own 1 token
    ([5, 6, 100], 4, [104, 104, 104], 416),
])
def test_lockstep_ranks_pad_to_the_largest_while_all_run_graphs(tokens, num_ranks, each, group):
    plans = [decodes(n, 50) for n in tokens]
    coordinate_dp_group(plans, num_ranks, MEASURED)
    assert [p.num_dp_padded_tokens for p in plans] == each
    assert {p.num_dp_group_tokens for p in plans} == {group}


def test_eager_lockstep_ranks_count_their_own_tokens():
    plans = [decodes(n, 50) for n in (3, 17)]
    coordinate_dp_group(plans, 2, None)
    assert [(p.num_dp_padded_tokens, p.num_dp_group_tokens) for p in plans] == [(0, 20), (0, 20)]


def test_a_speculating_idle_rank_runs_a_verify_length_dummy():
    plans = [decodes(1, 50)]
    coordinate_dp_group(plans, 2, CudaGraphPadding.of(128, 2048, 3))  # sizes 4, 8, ...: the dummy is 4 tokens
    assert (plans[0].num_dp_padded_tokens, plans[0].num_dp_group_tokens) == (4, 8)


def test_a_padded_moe_rank_is_priced_at_the_groups_padded_tokens():
    """A DP 2 rank with 3 tokens beside one with 17 runs 24 tokens, its experts 48: the eager roofline's terms
    at those counts, its attention and sampling at its own 3 sequences."""
    model, gpu = load_model("qwen3-30b-a3b"), load_gpu("h100-80gb")
    engine = make_engine(data_parallel_size=2, enable_expert_parallel=True, max_model_len=4096)
    padded = RooflineLatency(model, gpu, engine, padding=MEASURED)
    eager = RooflineLatency(model, gpu, engine)
    plans = [decodes(3, 500), decodes(17, 500)]
    coordinate_dp_group(plans, 2, padded.cudagraph_padding)
    plan = plans[0]
    expected = (eager.linear_s(24, 48) + eager.token_ops_s(24) + eager.attention_s(plan) + eager.sequence_s(3)
                + eager.cpu_s(3))
    assert padded.step_time(plan) == pytest.approx(expected, rel=1e-12)


def test_a_lockstep_group_steps_at_the_padded_price():
    """One request on a DP 2 MoE group: its rank's 100-token prefill runs a 104-token graph and the idle rank's
    dummy batch pads to 104 too (208 tokens through the experts); each 1-token decode beside the 1-token dummy
    runs 1 token a rank, 2 through the experts."""
    scenario = load_scenario(None, ["model=qwen3-30b-a3b", "gpu=h100-80gb", "engine.max_model_len=4096",
                                    "workload.num_requests=1", "workload.prompt_len={dist: fixed, value: 100}",
                                    "workload.output_len={dist: fixed, value: 3}", "engine.data_parallel_size=2",
                                    "engine.enable_expert_parallel=true", "engine.num_gpu_blocks_override=4096"])
    from kvsim.engine.simulate import simulate

    durations = list(simulate(scenario).steps["duration_s"])
    latency = make_latency(resolve_engine(scenario))
    prefill = StepPlan()
    prefill.add(100, 0, 1, logits_row=True)
    prefill.num_dp_padded_tokens, prefill.num_dp_group_tokens = 104, 208
    expected = [latency.step_time(prefill)]
    for context in (101, 102):
        plan = decodes(1, context)
        plan.num_dp_padded_tokens, plan.num_dp_group_tokens = 1, 2
        expected.append(latency.step_time(plan))
    assert durations == expected


def test_enforce_eager_builds_no_padding_and_v1_pads_by_default():
    base = ["engine.max_num_seqs=128", "engine.max_num_batched_tokens=2048", "engine.max_model_len=2048"]
    assert make_latency(resolve_engine(load_scenario(None, base))).cudagraph_padding == MEASURED
    for extra in ("engine.enforce_eager=true", "engine.scheduler=v0"):
        assert make_latency(resolve_engine(load_scenario(None, [*base, extra]))).cudagraph_padding is None


def test_the_cli_refuses_what_vllm_refuses_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from kvsim.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--set", "engine.speculative_config={method: ngram, "
                                      "num_speculative_tokens: 4, acceptance_length: 2}", "--set", "engine.max_num_seqs=1",
                                      "--set", "engine.max_num_batched_tokens=4", "-o", str(out)])
    assert result.exit_code == 2 and not out.exists()
    assert "engine.max_num_batched_tokens=4: vLLM refuses to start with num_speculative_tokens=4" in result.output
    assert "Traceback" not in result.output


def test_the_eagle_drafters_passes_run_padded_as_the_targets_steps():
    """vLLM's `EagleProposer.propose` pads its first pass's tokens and each later pass's batch with the target's
    capture sizes (`pad_for_cudagraph`, piecewise). K = 2 with max_num_seqs 4: sizes 3, 6, 9, 18, 24 (above). Five
    sequences verify 3 tokens each: the first pass runs 15 → 18 tokens, the one later pass 5 → 6; the drafter's
    layers carry the padding, its attention and LM head do not (the head's own roofline terms, TP 1)."""
    engine = EngineConfig(max_model_len=8192, max_num_seqs=4,
                          speculative_config=SpeculativeConfig(method="eagle", num_speculative_tokens=2,
                                                              synthetic_acceptance_length=2.0))
    head = RooflineLatency(eagle_head(LLAMA), RTX, engine, overhead_s=0.0)
    plan = StepPlan()
    plan.add_verify(3, 500, 5)
    cost = {}
    for name, padding in (("padded", CudaGraphPadding.of(4, 2048, 2)), ("eager", None)):
        target = RooflineLatency(LLAMA, RTX, engine, overhead_s=0.0, padding=padding)
        cost[name] = speculative_latency(target, LLAMA, RTX, engine).step_time(plan) - target.step_time(plan)

    def layers(t):
        return head.linear_s(t) + head.token_ops_s(t)

    assert cost["padded"] - cost["eager"] == pytest.approx(layers(18) - layers(15) + layers(6) - layers(5), rel=1e-9)
    assert cost["padded"] > cost["eager"]


def test_capacitys_closed_form_pads_its_decode_steps_as_a_run_of_the_engine_does():
    """`kvsim capacity`'s cohort of 17 sequences at context 64 (prompt 32, output 32) on an engine of max_num_seqs
    128 and max_num_batched_tokens 2048 (sizes up to 256, `MEASURED`): the prefill step's 17 · 32 = 544 tokens run
    eager, each of the 31 decode steps a 24-token graph, as a simulated run of that engine prices them; with
    enforce_eager 17 tokens."""
    from kvsim.latency.roofline import cohort_output_tokens_per_s
    from kvsim.planning.cost import closed_form_output_rate

    h100 = load_gpu("h100-80gb")
    prefill = StepPlan()
    prefill.add(32, 0, 17, logits_row=True)
    rates = {}
    for eager, padding in ((False, MEASURED), (True, None)):
        engine = make_engine(max_model_len=8192, max_num_seqs=128, max_num_batched_tokens=2048, enforce_eager=eager)
        roofline = RooflineLatency(LLAMA, h100, engine, padding=padding)
        expected = 17 * 32 / (roofline.step_time(prefill) + 31 * roofline.step_time(decodes(17, 32 + 16)))
        rates[eager] = closed_form_output_rate(LLAMA, h100, engine)(17, 64)
        assert rates[eager] == pytest.approx(expected, rel=1e-12)
        assert rates[eager] == cohort_output_tokens_per_s(roofline, 17, 64)
    assert rates[False] < rates[True]
