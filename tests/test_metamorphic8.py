"""Metamorphic and differential relations, eighth round: the planning answers (what a planner buys GPUs from).

`test_metamorphic.py` to `test_metamorphic7.py` hold the earlier rounds; `test_plan*.py`, `test_steady*.py`,
`test_report*.py` and `test_cost.py` the plan's own. Here:

* every price `kvsim capacity` prints scales with the GPU's hourly price, to its printed 4 significant digits:
  they were rounded to 4 decimals, so a cheap GPU-hour's prices kept one or two digits (2 GPUs at $0.10 an hour
  over 156 sequences, $0.001282 per user-hour, printed 0.0013: 1.4 % off, and not a tenth of $1.00's 0.0128);
* a plan's printed evidence is what a plain run of the fleet it names gives: the `evidence, ...` line of a rate
  search whose answer rests on a long run below its searched count did not say that run served 1 + headroom times
  the traffic (it now says `on 1.1× the traffic`, and `evidence_traffic_scale` holds it), and without long runs
  it named the fleet (`4 replicas`) where the run was the one-replica probe (now `1 replica, ... on 0.2973× the
  traffic`; `evidence_replicas`);
* an MoE's and a hybrid model's KV pool, blocks and concurrent sequences, by hand from their config.json and vLLM's
  memory profiling rule (gpu_memory_utilization x memory − weights − activation peak − non-torch memory, over the
  bytes behind a block id): gemma-2's and -3's 4 norms a layer were counted as 2, one block too many for
  gemma-3-27b on an H100 (gemma-2-9b's count is now its model card's 9.24 B to the parameter).

Relations tried that held and are not kept (each a plan or a search of 5 to 40 s, or covered elsewhere): a plan's
price scales exactly with the hourly price; tensor parallelism at a constant step time doubles the cost of every
token, and under the roofline TP 2 sustains 1.4x one GPU's rate (so it costs more a token); more replicas (round
robin, least outstanding: 6.26, 15.4, 25.1, 35.9 req/s for 1 to 4 single-slot replicas), a looser SLO and a faster
GPU of the same memory (h100-80gb over h100-pcie: 17.1 against 9.6 req/s a replica) never lowered the sustained rate
beyond the search's tolerance (a tighter SLO once answered 0.25 % higher, within its 1 %); the rate search answers
the same from 100 or 400 requests a probe, and the same for a fleet's replica groups in either order; a single-slot
replica's rate at p90 TTFT <= 0.25 s is M/D/1's (Erlang's waiting-time distribution: 6.368 req/s; the search's
6.256, 1.8 % under, within its 3 %), and its every TTFT is the naive M/D/1 queue's to 1e-11; doubling every length
doubled the fleet and kept the cost a million tokens within the window's 1 % noise (the window counts the tokens of
the requests finishing in it); a saturating run's peak concurrency stays under the pool's blocks over a prompt's
blocks (llama, qwen3-30b-a3b, gemma-3); a `kvsim report`'s sustained rate rerun at its printed (4-decimal) rate is
stable and meets the SLO, its window within 1 % of the printed one (exactly, where the rate is round).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()
H100_BUDGET_BYTES = int(81559 * 2**20 * 0.9)  # nvidia-smi's 81,559 MiB at vLLM's default gpu_memory_utilization
NON_TORCH_BYTES = 2**30  # kvsim's estimate of vLLM's non-torch increase (`EngineConfig.non_torch_memory_bytes`)


def capacity_rows(*args: str) -> list[dict]:
    result = runner.invoke(app, ["capacity", "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["rows"]


@pytest.mark.parametrize("usd_per_gpu_hour", [0.1, 0.37, 2.0, 123.0])
def test_capacity_prices_scale_with_the_hourly_price_to_four_digits(usd_per_gpu_hour):
    """10,000 blocks of 16 tokens (9,999 usable: v1's null block), 1,024-token sequences: 9,999 // 64 = 156 at once
    (under max_num_seqs), 2,048: 78, on 2 GPUs (TP 2): USD per user-hour = 2 · price / sequences, and per million
    output tokens 2 · price / (the row's closed-form tokens/s · 3,600) · 10^6, each to 4 significant digits."""
    rows = capacity_rows("--num-gpu-blocks-override", "10000", "--context-lengths", "1024,2048", "-tp", "2",
                         "--gpu-hourly-cost", str(usd_per_gpu_hour))
    assert [row["concurrent_sequences"] for row in rows] == [156, 78]
    for row in rows:
        user_hour = 2 * usd_per_gpu_hour / row["concurrent_sequences"]
        per_million = 2 * usd_per_gpu_hour / (row["output_tokens_per_s_closed_form"] * 3600) * 1e6
        assert row["usd_per_concurrent_user_hour"] == pytest.approx(user_hour, rel=5e-4)
        assert row["usd_per_million_output_tokens"] == pytest.approx(per_million, rel=5e-4)


def toy_traffic(rate: float, num_requests: int, replicas: int | None = None) -> dict:
    """`tests/test_plan.py`'s toy (20 ms a step whatever the batch, at most 8 running, 256-token prompts, 64-token
    replies, Poisson arrivals, seed 5) as a scenario's fields; with `replicas`, that fleet behind least_outstanding."""
    fleet = {} if replicas is None else {"replicas": replicas, "router": {"policy": "least_outstanding"}}
    return {**fleet, "name": "toy", "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 400, "max_num_seqs": 8},
            "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": rate},
                         "prompt_len": {"dist": "fixed", "value": 256}, "output_len": {"dist": "fixed", "value": 64}},
            "latency": {"model": "constant", "step_s": 0.02}, "seed": 5, "steps": "none", "gpu": "h100-80gb"}


def test_the_printed_evidence_is_what_a_run_of_the_fleet_it_names_shows(tmp_path):
    """A rate search on the toy at 14 req/s (p90 TTFT <= 0.3 s, capacity_headroom 0.1) answers with a long run below
    its searched count, which served 1.1x the traffic (`verify_attempts` marks it *); without long runs
    (`verify_factor` 0) its window columns are the one-replica probe's, on the fraction f of the traffic. Each time
    the `evidence, ...` line names that run, and a plain run of that many replicas, requests and traffic, built here
    from its fields, gives the window the line prints, digit for digit (3 replicas, 600 requests at 15.4 req/s: p90
    TTFT 0.2019 s). The line said `3 replicas, 600-request run` without the 1.1x (a run of that on the traffic itself
    shows 0.085 s), and `4 replicas, 200-request run` for the probe: no fleet of 4 had been simulated."""
    import re

    from kvsim.cli.plan_command import evidence_line
    from kvsim.fleet.run import simulate_scenario
    from kvsim.planning.plan import make_plan_spec, plan
    from kvsim.planning.window import window_evidence
    from kvsim.workload.scenario import make_scenario

    settings = {"slo": {"ttft_s.p90": 0.3}, "gpus": ["h100-80gb"], "max_replicas": 8, "search": "rate",
                "probe_requests": 100, "max_probe_requests": 200}
    for verify_factor in (3, 0):  # the second plan reads its probes from the first one's points
        (row,), _ = plan(make_scenario(toy_traffic(14.0, 100)), make_plan_spec({**settings, "verify_factor":
                                                                                 verify_factor}), tmp_path / "plan")
        line = evidence_line(row)
        named = re.match(r"evidence, h100-80gb tp1: (\d+) replicas?, ([\d,]+)-request run(?: on ([\d.]+)× the "
                         r"traffic)?: ", line)
        assert named is not None, line
        replicas, num_requests, scale = int(named[1]), int(named[2].replace(",", "")), float(named[3] or 1.0)
        if verify_factor:  # the case this checks: an answer on the sped-up traffic
            assert "*" in row["verify_attempts"] and (replicas, scale) == (row["replicas"], 1.1)
        else:  # the probe: one replica, on the fraction of the traffic the line prints to 4 digits
            assert replicas == 1 < row["replicas"] and scale == pytest.approx(row["evidence_traffic_scale"], rel=1e-3)
            scale = row["evidence_traffic_scale"]
        fleet = make_scenario(toy_traffic(14.0 * scale, num_requests, replicas))
        ev = window_evidence(simulate_scenario(fleet).requests)
        assert f"{ev['verdict']} over its window ({ev['num_in_window']:,} requests in {ev['window_s']:,.0f} s" in line
        assert f"ttft_s.p90 {ev['ttft_s']['p90']:.4g} " in line


def pool_by_hand(params: int, activation_bytes: int, bytes_per_block: int, qk_norm_params: int) -> tuple[int, int]:
    """(pool bytes, blocks) of a bf16 model on an H100 by vLLM's rule; the blocks are the same with the q/k norms'
    weights loaded too (kvsim leaves them out: `kvsim.model.spec`)."""
    pool = H100_BUDGET_BYTES - 2 * params - activation_bytes - NON_TORCH_BYTES
    assert (pool - 2 * qk_norm_params) // bytes_per_block == pool // bytes_per_block
    return pool, pool // bytes_per_block


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gemma-3-27b"])
def test_an_moe_and_a_hybrid_models_pool_and_sequences_by_hand(name):
    """vLLM's defaults on a GPU of 70 GiB or more: max_num_batched_tokens 8,192, max_num_seqs 1,024; max_model_len
    8,192; the activation peak is kvsim's stated estimate (`activation_peak_bytes`: 8,192 tokens through one layer's
    MLP, 3 · width + 4 · hidden values a token, and fp32 logits for 1,024 sequences).

    Qwen3-30B-A3B (config.json: hidden 2,048, 48 layers, 32 heads and 4 KV heads of 128, 128 experts of 768, top 8,
    vocab 151,936, untied): 30.5 B parameters; one KV group, a block 48 layers x K and V x 4 heads x 128 x 2 B x 16
    tokens; at 4,096 tokens each sequence holds 256 blocks of the usable (v1 keeps block 0 back).
    Gemma-3-27B (text_config: hidden 5,376, 62 layers, 32 heads and 16 KV heads of 128, MLP 21,504, vocab 262,208,
    tied, every 6th layer global, the others sliding over 1,024 tokens): 10 global layers and 52 sliding, so vLLM's
    hybrid manager groups 10 layers (the fewer kind's count): 1 full group and ceil(52 / 10) = 6 sliding ones, and a
    block id is a page of 16 tokens in 10 layers. At 4,096 tokens a sequence decoding holds 256 full blocks and 65 a
    sliding group (a 1,024-token window starting mid-block), 646; the one computing its prompt (one chunk of 4,096)
    holds 7 x 256: 1 + (usable − 1,792) // 646 sequences."""
    from kvsim.model.capacity_plan import plan_capacity
    from kvsim.model.config import load_gpu, load_model
    from kvsim.model.engine_config import EngineConfig

    if name == "qwen3-30b-a3b":
        layer = 2 * 2048 * 32 * 128 + 2 * 2048 * 4 * 128 + 128 * 3 * 2048 * 768 + 2048 * 128 + 2 * 2048
        params = 48 * layer + 2 * 151936 * 2048 + 2048
        assert params == 30_532_110_336  # "30.5B" on the model card
        activation = 8192 * (3 * 8 * 768 + 4 * 2048) * 2 + 1024 * 151936 * 4
        pool, blocks = pool_by_hand(params, activation, 48 * 2 * 4 * 128 * 2 * 16, 48 * 2 * 128)
        sequences = (blocks - 1) // 256
    else:
        layer = 2 * 5376 * 32 * 128 + 2 * 5376 * 16 * 128 + 3 * 5376 * 21504 + 4 * 5376  # 4 norms a layer
        params = 62 * layer + 262208 * 5376 + 5376
        activation = 8192 * (3 * 21504 + 4 * 5376) * 2 + 1024 * 262208 * 4
        pool, blocks = pool_by_hand(params, activation, 10 * 2 * 16 * 128 * 2 * 16, 62 * 2 * 128)
        sequences = 1 + (blocks - 1 - 7 * 256) // (256 + 6 * 65)
    plan = plan_capacity(load_model(name), load_gpu("h100-80gb"), EngineConfig(max_model_len=8192), [4096])
    assert (plan.weights_bytes, plan.activation_peak_bytes, plan.kv_pool_bytes) == (2 * params, activation, pool)
    assert plan.num_gpu_blocks == blocks and plan.rows[0].paged_max_seqs == sequences
    assert (blocks, sequences) == ((8756, 34) if name == "qwen3-30b-a3b" else (14795, 21))


def test_gemma_2s_parameters_count_its_four_norms_a_layer(tmp_path):
    """Gemma-2-9B (config.json: hidden 3,584, 42 layers, 16 heads and 8 KV heads of 256, MLP 14,336, vocab 256,000,
    tied): per layer q and o 3,584 x 4,096, k and v 3,584 x 2,048, the gated MLP 3 x 3,584 x 14,336 and 4 norms
    (input, post-attention, pre- and post-feedforward: vLLM's Gemma2DecoderLayer), then the embedding and the final
    norm: 9,241,705,984, the model card's 9.24 B. Counted with 2 norms a layer it was 301,056 short."""
    from kvsim.model.config import load_model
    from tests.test_families import GEMMA2_9B

    layer = 2 * 3584 * 4096 + 2 * 3584 * 2048 + 3 * 3584 * 14336 + 4 * 3584
    params = 42 * layer + 256000 * 3584 + 3584
    (tmp_path / "config.json").write_text(json.dumps(GEMMA2_9B))
    assert load_model(str(tmp_path / "config.json")).num_params == params == 9_241_705_984
