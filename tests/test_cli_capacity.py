import json
import subprocess
import sys
from functools import partial

import pytest
from conftest import FULL_SIZE
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()


def run_json(*args):
    result = runner.invoke(app, ["capacity", *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_seed_exercise():
    data = run_json("--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--num-gpu-blocks-override", "10000",
                    "--context-lengths", "4096")
    assert data["rows"][0]["paged_max_seqs"] == 39
    for key in ("bytes_per_token", "bytes_per_block", "num_gpu_blocks", "kv_pool_bytes", "weights_bytes",
                "max_concurrency"):
        assert key in data


def test_pool_matches_the_block_count_used():
    """10,000 blocks of 16 tokens × 128 KiB = 20,971,520,000 B (19.53 GiB), not the 55 GiB estimate."""
    data = run_json("--num-gpu-blocks-override", "10000", "--context-lengths", "4096")
    assert data["num_gpu_blocks"] == 10_000
    assert data["kv_pool_bytes"] == 10_000 * 16 * 131_072


def test_paper_table1():
    data = run_json("--model", "opt-13b", "--kv-cache-memory-bytes", "12GiB")
    assert data["bytes_per_token"] == 819_200
    assert data["num_gpu_blocks"] == 983 and data["num_token_slots"] == 15_728


def test_fp8_and_max_model_len_flags():
    auto = run_json("--max-model-len", "8192", "--context-lengths", "1024")
    fp8 = run_json("--max-model-len", "8192", "--context-lengths", "1024", "--kv-cache-dtype", "fp8")
    half = run_json("--max-model-len", "4096", "--context-lengths", "1024")
    assert fp8["bytes_per_block"] * 2 == auto["bytes_per_block"]
    assert half["rows"][0]["slab_max_seqs"] >= 2 * auto["rows"][0]["slab_max_seqs"]


def test_shared_prefix_flags():
    data = run_json("--num-gpu-blocks-override", "10000", "--context-lengths", "5100",
                    "--shared-prefix-tokens", "5000", "--num-sequences", "100")
    row = data["rows"][0]
    assert row["shared_prefix_blocks_with_sharing"] == 312 + 700
    assert row["shared_prefix_max_seqs"] == (10000 - 1 - 312) // 7  # vLLM v1 keeps block 0 back (null block)


@pytest.mark.parametrize("fmt", ["table", "csv", "markdown"])
def test_other_formats(fmt):
    result = runner.invoke(app, ["capacity", "--format", fmt, "--context-lengths", "4096"])
    assert result.exit_code == 0 and "4" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--model", "gpt-9"], "gpt-9"), (["--gpu", "tpu"], "tpu"), (["--kv-cache-dtype", "int2"], "int2"),
     (["--block-size", "0"], "block_size"), (["--kv-cache-memory-bytes", "-5GiB"], "kv_cache_memory_bytes"),
     (["--gpu-memory-utilization", "1.2"], "gpu_memory_utilization"),
     (["--model", "llama-3.1-70b"], "missing"), (["--context-lengths", "4k"], "--context-lengths"),
     # what vLLM refuses at startup (cited in kvsim/model/engine_config.py and kvsim/model/capacity.py)
     (["--tensor-parallel-size", "3"], "tensor_parallel_size=3"),
     (["--tensor-parallel-size", "64"], "tensor_parallel_size=64"),
     (["--block-size", "24"], "block_size=24"), (["--block-size", "1024"], "block_size=1024"),
     (["--kv-cache-memory-bytes", "10TiB"], "kv_cache_memory_bytes=10995116277760"),
     (["--num-gpu-blocks-override", "100000000"], "num_gpu_blocks_override=100000000"),
     (["--num-gpu-blocks-override", "100", "--max-model-len", "4096"], "max_model_len=4096"),
     (["--shared-prefix-tokens", "50000", "--context-lengths", "4096"], "shared_prefix_tokens=50000")],
)
def test_bad_input_is_one_line_and_nonzero(args, needle):
    result = runner.invoke(app, ["capacity", *args])
    assert result.exit_code == 2
    assert needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_import_is_light_and_module_entry_point_works():
    code = "import sys, kvsim, kvsim.model.capacity, kvsim.model.capacity_plan, kvsim.model.config, kvsim.model.engine_config; bad = {'torch','triton','matplotlib','simpy'} & set(sys.modules); print(sorted(bad))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    out = subprocess.run([sys.executable, "-m", "kvsim", "capacity", "--format", "csv"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.startswith("context_len,")


@pytest.mark.parametrize(("config", "blocks_per_seq", "seqs"), [
    # 641 blocks, 640 usable (vLLM v1 keeps block 0 back as its null block).
    # EAGLE, K = 3: a verify step holds the 3 drafts and vLLM's num_lookahead_tokens (3): 1024 + 6 = 1030 slots,
    # ceil(1030 / 16) = 65 blocks, 640 // 65 = 9 sequences (10 without drafts: 640 // 64)
    ({"method": "eagle", "num_speculative_tokens": 3, "acceptance_length": 2.5}, 65, 9),
    # n-gram, K = 3: no lookahead (its drafter keeps no KV): 1027 slots, still 65 blocks
    ({"method": "ngram", "num_speculative_tokens": 3, "acceptance_length": 2.5}, 65, 9),
    # n-gram, K = 16: 1040 slots, 65 blocks; EAGLE K = 16: 1056 slots, 66 blocks, 640 // 66 = 9
    ({"method": "eagle", "num_speculative_tokens": 16, "acceptance_length": 2.5}, 66, 9),
])
def test_drafts_cut_concurrency_as_vllm_reserves_their_slots(config, blocks_per_seq, seqs):
    """Issue 23: capacity shows how drafts cut concurrency (vLLM v1's allocate_slots with num_lookahead_tokens)."""
    data = run_json("--num-gpu-blocks-override", "641", "--context-lengths", "1024,2048", "--max-model-len", "2048",
                    "--speculative-config", json.dumps(config))
    row, at_limit = data["rows"]
    assert row["paged_max_seqs"] == 10 and row["blocks_per_seq"] == 64
    assert row["blocks_per_seq_with_drafts"] == blocks_per_seq and row["paged_max_seqs_with_drafts"] == seqs
    # at max_model_len the reservation is capped there (vLLM: min(..., max_model_len)): no extra block
    assert at_limit["blocks_per_seq_with_drafts"] == at_limit["blocks_per_seq"] == 128


@pytest.mark.parametrize(("config", "expected"), [
    (None, (11, 160, 8 + 10 * 8)),
    # n-gram K = 3: 256 + 3 slots, 17 blocks, 8 of them the shared prefix's: 9 own; (100 − 8) // 9 = 10
    ({"method": "ngram", "num_speculative_tokens": 3, "acceptance_length": 2.5}, (10, 170, 8 + 10 * 9)),
    # EAGLE K = 3: 256 + 3 + 3 slots, 17 blocks; its hit gives the 8th prefix block back (vLLM's use_eagle), which
    # each sequence recomputes into a block of its own: 7 shared, 10 own; (100 − 7) // 10 = 9
    ({"method": "eagle", "num_speculative_tokens": 3, "acceptance_length": 2.5}, (9, 170, 7 + 10 * 10)),
])
def test_shared_prefix_columns_count_the_drafts_and_eagles_own_last_prefix_block(config, expected):
    """101 blocks (100 usable) of 16; 10 sequences of 256 tokens sharing 128: the prefix's 8 full blocks hit
    (min(128, 255) // 16). The shared-prefix columns ignored speculation: EAGLE showed n-gram's and no drafts'
    11 sequences and 88 blocks."""
    flags = [] if config is None else ["--speculative-config", json.dumps(config)]
    row = run_json("--num-gpu-blocks-override", "101", "--context-lengths", "256", "--max-model-len", "1024",
                   "--shared-prefix-tokens", "128", "--num-sequences", "10", *flags)["rows"][0]
    assert (row["shared_prefix_max_seqs"], row["shared_prefix_blocks_without_sharing"],
            row["shared_prefix_blocks_with_sharing"]) == expected


@pytest.mark.parametrize(("model", "config", "layers", "bytes_per_token"), [
    # Llama-3.1-70B at TP 4 (80 layers, 8 KV heads: 2 per GPU, head_dim 128, bf16): 2 · 2 · 128 · 2 = 1,024 B per
    # token and layer. A Llama-3.1-8B draft model (32 layers of the same page) joins vLLM's one KV group:
    # 80 + 32 = 112 layers, 112 · 1,024 = 114,688 B per token
    ("llama-3.1-70b", {"method": "draft_model", "model": "llama-3.1-8b", "num_speculative_tokens": 3,
                       "acceptance_length": 2.5}, 112, 114_688),
    # an EAGLE head's one decoder layer: 80 + 1 = 81 layers, 82,944 B per token
    ("llama-3.1-70b", {"method": "eagle", "num_speculative_tokens": 3, "acceptance_length": 2.5}, 81, 82_944),
])
def test_a_drafters_layers_are_counted_in_the_kv_group(model, config, layers, bytes_per_token):
    """vLLM's KV group lists every attention layer, a draft model's too (get_kv_cache_groups); capacity reported
    the target's 80 for a draft model beside the bytes of all 112."""
    data = run_json("--model", model, "-tp", "4", "--context-lengths", "1024", "--speculative-config",
                    json.dumps(config))
    assert (data["num_kv_groups"], data["layers_per_kv_group"]) == (1, layers)
    assert data["bytes_per_token"] == bytes_per_token and data["bytes_per_block"] == 16 * bytes_per_token
    assert [row["num_layers"] for row in data["kv_types"]] == [layers]


def test_without_speculation_capacity_has_no_draft_columns():
    data = run_json("--num-gpu-blocks-override", "640", "--context-lengths", "1024", "--max-model-len", "2048")
    assert data["rows"][0]["paged_max_seqs_with_drafts"] is None


def test_sustained_rate_is_what_the_engine_served_not_the_poisson_rate_asked_for():
    """capacity --sustained's search on an engine with an exact capacity: 10 ms steps whatever they carry, at
    most 8 running, prompt 32 + output 32 (context 64), synchronous steps. A request holds a slot from its
    prefill step (which yields its first token) to its 32nd token, 32 steps: 8 / (32 · 0.01) = 25 req/s, 800
    output tokens/s, $2 / (800 · 3,600) · 10^6 = $0.694 per million at $2 an hour. The search's short probes
    offer about 10 % less than the Poisson rate they ask for (the seed's first 400 arrivals are sparse), so
    the rate asked for at the highest stable probe, 28.8 req/s, overstated the capacity by 15 %."""
    from kvsim.cli.shared import fixed_length_scenario
    from kvsim.model.capacity_plan import plan_capacity
    from kvsim.model.config import load_gpu, load_model
    from kvsim.model.engine_config import make_engine
    from kvsim.planning.cost import add_sustained_costs, gpu_price
    from kvsim.workload.scenario import make_scenario

    engine = make_engine(max_num_seqs=8, async_scheduling=False, num_gpu_blocks_override=2000, max_model_len=1024)

    def scenario_for(context_len: int):
        raw = fixed_length_scenario("llama-3.1-8b", "h100-80gb", engine, context_len).model_dump(mode="json")
        raw["latency"] = {"model": "constant", "step_s": 0.01}
        return make_scenario(raw, ".")

    plan = plan_capacity(load_model("llama-3.1-8b"), load_gpu("h100-80gb"), engine, [64]).to_dict()
    (row,) = add_sustained_costs(plan, gpu_price("h100-80gb", 2.0), 1, scenario_for)["rows"]
    assert row["sustained_rate_per_s"] == pytest.approx(25.0, rel=0.02)
    assert row["output_tokens_per_s_sustained"] == pytest.approx(32 * row["sustained_rate_per_s"], rel=0.005)
    assert row["usd_per_million_output_tokens_sustained"] == pytest.approx(2 / (800 * 3600) * 1e6, rel=0.02)


@pytest.mark.slow
def test_a_data_parallel_group_is_priced_by_all_its_gpus(monkeypatch):
    """With -dp 2 the sustained probes run two engines of one GPU each (vLLM's DP group), so the output rate
    they serve costs two GPU-hours an hour: $/M = 2 · $0.1 / (tokens/s · 3,600) · 10^6. It was priced at the
    TP size alone (1 GPU): half the cost ($0.156 against $0.311 per million at the L4's list price and 512-token
    contexts; 128-token ones here keep the test short). The price divides by whatever rate the probes measured,
    so their length does not matter to it: probes of 100 and 200 requests, not the search's up to 3,200 (about
    a tenth of the time), or its own lengths with KVSIM_FULL_TESTS=1; $0.1 an hour keeps the price near $0.2 per
    million as before, so the 10^-4 tolerance is as tight a fraction of it."""
    import kvsim.planning.cost

    if not FULL_SIZE:
        monkeypatch.setattr(kvsim.planning.cost, "add_sustained_costs",
                            partial(kvsim.planning.cost.add_sustained_costs, num_requests=100, max_requests=200))
    result = runner.invoke(app, ["capacity", "--model", "llama-3.1-8b", "--gpu", "l4", "-dp", "2",
                                 "--context-lengths", "128", "--max-model-len", "256", "--sustained",
                                 "--gpu-hourly-cost", "0.1", "--format", "json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["rows"]
    tokens_per_s = row["output_tokens_per_s_sustained"]
    assert tokens_per_s > 0
    assert row["usd_per_million_output_tokens_sustained"] == pytest.approx(2 * 0.1 / (tokens_per_s * 3600) * 1e6,
                                                                           abs=1e-4)


class StepCounter:
    """A latency model of 10 ms a step plus 1 µs a token, keeping every plan it priced."""

    name = "counter"
    cudagraph_padding = None

    def __init__(self):
        self.plans = []

    def step_time(self, plan):
        self.plans.append(plan)
        return 0.01 + 1e-6 * plan.num_tokens


def test_the_closed_form_rate_under_speculation_divides_the_decode_steps_by_the_acceptance_length():
    """4 sequences of context 1,024 (prompt 512, output 512), K = 3 drafts, mean acceptance length L = 2.5: the
    prefill step computes 4 · 512 tokens and yields the first output token; the other 511 tokens take 511 / L
    verify steps of 4 · (1 + 3) tokens, each sequence checking 3 drafts. By hand:
    4 · 512 / (0.01 + 2048 µs + 511 / 2.5 · (0.01 + 16 µs)); without speculation 511 steps of 4 tokens."""
    from kvsim.latency.roofline import cohort_output_tokens_per_s

    latency = StepCounter()
    rate = cohort_output_tokens_per_s(latency, 4, 1024, num_speculative_tokens=3, acceptance_length=2.5)
    assert rate == pytest.approx(4 * 512 / (0.01 + 2048e-6 + 511 / 2.5 * (0.01 + 16e-6)))
    verify = latency.plans[-1]
    assert (verify.num_spec_decode_seqs, verify.num_draft_tokens, verify.num_logits_rows) == (4, 12, 16)
    assert cohort_output_tokens_per_s(StepCounter(), 4, 1024) == pytest.approx(
        4 * 512 / (0.01 + 2048e-6 + 511 * (0.01 + 4e-6)))


@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_capacity_prices_speculation_at_the_mean_acceptance_length_with_the_drafters_cost(method):
    """vLLM's mean acceptance length is 1 + accepted drafts per verify step: with conditional acceptance rates
    0.8, 0.5, 0.5 (K = 3), 1 + 0.8 + 0.4 + 0.2 = 2.4. capacity's closed form takes it, and prices the
    verify step with the drafter's passes (EAGLE's head; none for n-gram) through kvsim.latency.speculative;
    it had priced plain decode steps, one token each, whatever the config."""
    from kvsim.latency.speculative import SpeculativeLatency
    from kvsim.model.config import load_gpu, load_model
    from kvsim.model.engine_config import make_engine
    from kvsim.planning.cost import closed_form_output_rate

    engine = make_engine(speculative_config={"method": method, "num_speculative_tokens": 3,
                                             "acceptance_rates": [0.8, 0.5, 0.5]})
    rate = closed_form_output_rate(load_model("llama-3.1-8b"), load_gpu("h100-80gb"), engine)
    assert rate.keywords == {"num_speculative_tokens": 3, "acceptance_length": pytest.approx(2.4)}
    latency = rate.args[0]
    assert isinstance(latency, SpeculativeLatency) and (latency.drafter is None) == (method == "ngram")
    plain = run_json("--context-lengths", "4096")["rows"][0]
    spec = run_json("--context-lengths", "4096", "--speculative-config",
                    json.dumps({"method": method, "num_speculative_tokens": 3, "acceptance_rates": [0.8, 0.5, 0.5]}))
    row = spec["rows"][0]
    assert row["output_tokens_per_s_closed_form"] == pytest.approx(rate(row["concurrent_sequences"], 4096), abs=0.05)
    assert row["output_tokens_per_s_closed_form"] > plain["output_tokens_per_s_closed_form"]
