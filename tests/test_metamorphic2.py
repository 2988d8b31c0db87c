"""Metamorphic relations, second round: settings that cannot bind, exact service and hit arithmetic, and
workloads transformed in ways that, by vLLM's semantics, leave known parts of the result unchanged.

`test_metamorphic.py` holds the first round (a fleet of one, one DP rank, one priority, one-turn
conversations, time rescaled, presets as files). Here:

* a pool so large that nothing waits for KV: its size, the block size, prefix caching (no prompt shares
  a prefix), an offload tier, v0's watermark and preemption mode, token budgets that never bind,
  settings a dense model does not read and a hybrid model's KV manager change no request (the roofline
  prices no block size);
* `max_num_seqs=1` is a FIFO single server: request i starts at max(arrival, previous finish) and takes
  the time it takes alone; with a constant step, the steps are counted by hand (chunks, drafts); a
  closed-loop client of one request in flight serves the same;
* a prefix hit is the whole blocks of the common prefix, one token short of the prompt (EAGLE: one block
  fewer), whatever the prefix cache, and an offload tier gives back what the GPU evicted, at the link's
  speed; `kvsim capacity`'s concurrency is the simulated admission;
* transformed workloads: requests arriving later change no request that ended before, rejected requests
  take nothing, a round-robin replica is the engine on its share, priority ties between classes do not
  depend on file order, the seed matters only where something is drawn, and every prompt token not hit and
  every output token but the last is computed exactly once.

Relations tried and dropped (the relation was wrong, not kvsim): EAGLE drafts that are never accepted
still cost the drafter's passes (priced by the roofline even beside a constant step); a trace's arrivals
count from its first row, so the odd rows of a round-robin fleet are not the same trace shifted; with
preemptions the token count also depends on where each victim stood (a one-token recompute is a decode).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import kvsim
from kvsim.cli import app

ENGINE = {"max_model_len": 2048, "num_gpu_blocks_override": 4000, "max_num_seqs": 64, "max_num_batched_tokens": 2048}
ROOMY = {  # 4,000 blocks of 16: 64,000 token slots, more than 40 requests ever hold at once
    "model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": 4, "engine": ENGINE,
    "workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 20.0},
                 "prompt_len": {"dist": "lognormal", "mean": 300, "p99": 1500},
                 "output_len": {"dist": "lognormal", "mean": 80, "p99": 300}},
}
TIMES = ["arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s"]


def roomy(engine=None, **top):
    return {**ROOMY, **top, "engine": {**ENGINE, **(engine or {})}}


def write_trace(path, rows):
    """A `sharegpt_tokens` trace (arrivals in integer ns, from the trace's start) of `rows`:
    (arrival_ns, prompt, output) or dicts of the format's own keys."""
    with path.open("w") as f:
        for row in rows:
            if not isinstance(row, dict):
                row = {"arrival_time_ns": int(row[0]), "input_toks": int(row[1]), "output_toks": int(row[2])}
            f.write(json.dumps(row) + "\n")
    return str(path)


def traced(path, engine=None, **top):
    return {"model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": 0, **top,
            "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 300, **(engine or {})},
            "workload": {"num_requests": 10**6, "arrival": {"process": "trace"},
                         "trace": {"format": "sharegpt_tokens", "path": path}}}


def random_rows(rng, n, span_s, max_prompt=1200, max_output=300):
    arrivals = np.sort(rng.integers(0, int(span_s * 1e9), n))
    return list(zip(arrivals, rng.integers(1, max_prompt, n), rng.integers(1, max_output, n), strict=True))


@pytest.fixture(scope="module")
def roomy_run():
    result = kvsim.simulate(roomy())
    assert result.summary["num_preemptions"] == 0 and result.summary["max_running"] >= 8
    assert result.summary["kv_cache_usage_perc"]["max"] < 0.5  # never near binding
    return result


@pytest.mark.parametrize("engine", [
    {"num_gpu_blocks_override": 8000},
    {"gpu_memory_utilization": 0.5, "non_torch_memory_bytes": 5 * 2**30},  # the override fixes the pool
    {"block_size": 1, "num_gpu_blocks_override": 64_000},
    {"block_size": 8, "num_gpu_blocks_override": 8000},
    {"block_size": 32, "num_gpu_blocks_override": 2000},
    {"enable_prefix_caching": False},  # no two prompts share a token
    {"prefix_cache": "radix"},
    {"kv_offload": {"num_cpu_blocks": 0}},  # a tier of 0 blocks is no tier
    {"kv_offload": {"cpu_bytes": 0}},
    {"kv_offload": {"num_cpu_blocks": 1000}},  # stores run beside the steps; nothing is evicted to load back
    {"max_num_batched_tokens": 8192},  # 2,048 already takes every prompt in one chunk
    {"max_model_len": 4096},  # no request nears 2,048 (nor is its output capped)
    {"kv_cache_dtype": "bfloat16"},  # the model's dtype: `auto`
    {"disable_hybrid_kv_cache_manager": True, "enable_expert_parallel": True},  # no window, no expert
    {"async_scheduling": True, "usage_context": "llm_class"},  # v1's default; limits given explicitly
], ids=["pool-x2", "memory-settings", "block-1", "block-8", "block-32", "no-prefix-caching", "radix",
        "offload-0-blocks", "offload-0-bytes", "offload-unused", "budget-x4", "max-model-len", "kv-dtype-named",
        "dense-ignores-hybrid-and-ep", "defaults-spelled-out"])
def test_a_setting_that_never_binds_changes_no_request(roomy_run, engine):
    result = kvsim.simulate(roomy(engine))
    assert result.summary["num_preemptions"] == 0
    assert result.requests.equals(roomy_run.requests)


@pytest.mark.parametrize("engine", [{"block_size": 32, "num_gpu_blocks_override": 4000},
                                    {"enable_prefix_caching": False}, {"disable_hybrid_kv_cache_manager": True}],
                         ids=["block-32", "no-prefix-caching", "hybrid-manager-off"])
def test_a_hybrid_models_allocation_settings_change_no_request_without_pressure(engine):
    """gpt-oss-20b (12 of 24 layers attend a 128-token window): the block size, prefix caching and vLLM's
    hybrid KV cache manager decide what is held, not what is computed; the manager off, sliding layers hold
    every token but still attend only the window (the roofline priced them over the whole context)."""
    gpt_oss = {"model": "gpt-oss-20b"}
    base = kvsim.simulate(roomy({"num_gpu_blocks_override": 8000}, **gpt_oss))
    assert base.summary["num_preemptions"] == 0 and base.summary["max_running"] >= 8
    result = kvsim.simulate(roomy({"num_gpu_blocks_override": 8000, **engine}, **gpt_oss))
    assert result.summary["num_preemptions"] == 0
    assert result.requests.equals(base.requests)


@pytest.mark.parametrize("engine", [{"watermark": 0.0}, {"watermark": 0.3}, {"preemption_mode": "swap"},
                                    {"swap_space": 0}, {"block_size": 32, "num_gpu_blocks_override": 2000}])
def test_v0_settings_for_memory_pressure_change_nothing_without_it(engine):
    """v0's 1 % watermark (30 %: 1,200 of 4,000 blocks, more than the run ever holds) and its preemption mode
    act only when blocks run short."""
    v0 = {"scheduler": "v0"}
    base = kvsim.simulate(roomy(v0))
    assert base.summary["num_preemptions"] == 0
    assert kvsim.simulate(roomy({**v0, **engine})).requests.equals(base.requests)


def test_ngram_drafts_never_accepted_cost_nothing_at_a_constant_step():
    """n-gram drafting runs no model and reserves no lookahead slot (vLLM's `num_lookahead_tokens` 0): with
    every draft rejected each step emits one token, as without speculation, and a constant step prices the
    wider verify the same. (vLLM keeps n-gram speculation synchronous, so both runs are; EAGLE's and draft
    models' passes are priced on top of any step, so they are not free.)"""
    step = {"latency": {"model": "constant", "step_s": 0.01}}
    off = kvsim.simulate(roomy({"async_scheduling": False}, **step))
    for acceptance in ({"acceptance_rates": 0.0}, {"synthetic_acceptance_length": 1.0}):
        spec = {"method": "ngram", "num_speculative_tokens": 3, **acceptance}
        on = kvsim.simulate(roomy({"speculative_config": spec}, **step))
        assert on.requests.equals(off.requests)
        counts = on.summary["spec_decode"]
        assert counts["num_accepted_tokens"] == 0 and counts["num_draft_tokens"] > 0


def fifo_starts(requests):
    """Each request's start in a FIFO single server: max(its arrival, the previous request's finish)."""
    previous = 0.0
    for arrival, finish in zip(requests.arrival_s, requests.finish_s, strict=True):
        yield max(arrival, previous)
        previous = finish


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False}, {"scheduler": "v0"}, {"scheduler": "static"},
                                    {"allocator": "slab-max"}, {"max_num_batched_tokens": 256}],
                         ids=["v1", "v1-sync", "v0", "static", "slab-max", "chunked"])
def test_one_sequence_at_a_time_is_a_fifo_single_server(tmp_path, engine):
    """With `max_num_seqs=1` requests run one after another, each as if alone: its first token and its end
    come the same time after its start (max of its arrival and the previous request's end) as when it runs
    alone. "Alone" is the same requests 100 s apart (the roofline's step time depends on the batch only)."""
    rng = np.random.default_rng(0)
    rows = random_rows(rng, 30, 4.0, max_output=60)
    engine = {"max_num_seqs": 1, **engine}
    alone = kvsim.simulate(traced(write_trace(tmp_path / "alone.jsonl",
                                              [(i * 100e9, p, o) for i, (_, p, o) in enumerate(rows)]), engine))
    fifo = kvsim.simulate(traced(write_trace(tmp_path / "fifo.jsonl", rows), engine)).requests
    service = (alone.requests.finish_s - alone.requests.arrival_s).to_numpy()
    to_first = (alone.requests.first_token_s - alone.requests.arrival_s).to_numpy()
    start = np.fromiter(fifo_starts(fifo), float)
    assert (start > fifo.arrival_s.to_numpy()).sum() >= 10  # most requests queued behind another
    np.testing.assert_allclose(fifo.finish_s - start, service, rtol=1e-9)
    np.testing.assert_allclose(fifo.first_token_s - start, to_first, rtol=1e-9)


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False}, {"scheduler": "v0"}])
def test_a_client_of_one_request_in_flight_is_one_sequence_at_a_time(engine):
    """`max_concurrency: 1` (the client sends the next request when the last one ends) and `max_num_seqs: 1`
    (the engine takes the next when the last one ends) serve the same requests at the same instants: every
    first token and finish is the same (the client's `arrival_s` is its send). Without CUDA graphs: vLLM
    captures them up to 2 · max_num_seqs tokens, so the two engines would pad their steps differently."""
    engine = {**engine, "enforce_eager": True}
    one_at_a_time = kvsim.simulate(roomy({**engine, "max_num_seqs": 1})).requests
    closed = kvsim.simulate(roomy(engine, workload={**ROOMY["workload"], "max_concurrency": 1})).requests
    assert (closed.client_queue_s > 0).sum() >= 10
    for column in ("first_token_s", "finish_s", "prompt_tokens", "output_tokens"):
        assert closed[column].equals(one_at_a_time[column])


@pytest.mark.parametrize(("budget", "drafts"), [(2048, 0), (64, 0), (128, 1), (2048, 3)])
def test_fifo_steps_counted_by_hand(budget, drafts):
    """`max_num_seqs=1`, a 10 ms step: a prompt of P tokens takes ceil(P / budget) chunks, the last giving
    the first token; the other O - 1 tokens take one step each, or, with K n-gram drafts always accepted
    (each verify emits K + 1 tokens), ceil((O - 1) / (K + 1)) steps."""
    step_s = 0.01
    engine = {"max_num_seqs": 1, "max_num_batched_tokens": budget, "num_gpu_blocks_override": 400}
    if drafts:
        engine["speculative_config"] = {"method": "ngram", "num_speculative_tokens": drafts, "acceptance_rates": 1.0}
    raw = roomy(engine, seed=1, latency={"model": "constant", "step_s": step_s})
    raw["workload"] = {**raw["workload"], "arrival": {"process": "poisson", "rate": 8.0},
                       "prompt_len": {"dist": "uniform", "low": 1, "high": 700},
                       "output_len": {"dist": "uniform", "low": 1, "high": 40}}
    requests = kvsim.simulate(raw).requests
    start = np.fromiter(fifo_starts(requests), float)
    chunks = np.ceil(requests.prompt_tokens / budget)
    decodes = np.ceil((requests.output_tokens - 1) / (drafts + 1))
    np.testing.assert_allclose(requests.first_token_s, start + chunks * step_s, rtol=1e-12)
    np.testing.assert_allclose(requests.finish_s, start + (chunks + decodes) * step_s, rtol=1e-12)


HIT_ENGINES = [{}, {"prefix_cache": "radix"}, {"max_num_batched_tokens": 64, "max_num_seqs": 8},
               {"speculative_config": {"method": "eagle", "num_speculative_tokens": 2, "acceptance_rates": 0.5}}]


@pytest.mark.parametrize("case", range(24))
def test_a_prefix_hit_is_the_whole_blocks_of_the_common_prefix(tmp_path, case):
    """Request A (prompt and reply token ids) ends; B, 100 s later, starts with A's first m tokens. A's KV
    holds its prompt and every reply token but the last (never fed back), and only full blocks are cached,
    so B hits min(common, P_A + O_A - 1, P_B - 1) // bs whole blocks: the lookup stops one token short of
    B's prompt (vLLM's `max_cache_hit_length`), so a prompt that is all hit recomputes its last block. With
    EAGLE one block fewer (vLLM's `use_eagle` drops the last matched block). B's prefill computes the rest."""
    rng = np.random.default_rng(case)
    engine = HIT_ENGINES[case % len(HIT_ENGINES)]
    block = int(rng.choice([1, 8, 16, 32]))
    prompt_a, output_a = int(rng.integers(1, 300)), int(rng.integers(1, 50))
    tokens_a = rng.integers(0, 30_000, prompt_a + output_a).tolist()
    if case < 4:  # B's prompt is exactly A's prompt (a full hit), or A's whole conversation
        common = prompt_b = prompt_a if case < 2 else prompt_a + output_a
    else:
        common = int(rng.integers(0, prompt_a + output_a + 20))
        prompt_b = int(rng.integers(max(1, min(common, prompt_a + output_a)), 400))
    tokens_b = (tokens_a[:common] + rng.integers(40_000, 70_000, 400).tolist())[:prompt_b]
    rows = [{"arrival_time_ns": 0, "input_toks": prompt_a, "output_toks": output_a,
             "input_tok_ids": tokens_a[:prompt_a], "output_tok_ids": tokens_a[prompt_a:]},
            {"arrival_time_ns": 100 * 10**9, "input_toks": prompt_b, "output_toks": 3,
             "input_tok_ids": tokens_b, "output_tok_ids": [1, 2, 3]}]
    engine = {**engine, "block_size": block, "num_gpu_blocks_override": 600 * 32 // block}
    result = kvsim.simulate(traced(write_trace(tmp_path / "t.jsonl", rows), engine,
                                   latency={"model": "constant", "step_s": 0.01}))
    same = next((i for i in range(min(prompt_b, prompt_a + output_a)) if tokens_b[i] != tokens_a[i]),
                min(prompt_b, prompt_a + output_a))
    blocks = min(same, prompt_a + output_a - 1, prompt_b - 1) // block
    if "speculative_config" in engine:
        blocks = max(0, blocks - 1)
    b = result.requests.iloc[1]
    assert b.prefix_hit_tokens == blocks * block
    steps = result.steps
    before_first_token = (steps.time_s >= 100) & (steps.time_s < b.first_token_s)
    assert steps.num_batched_tokens[before_first_token].sum() == prompt_b - blocks * block


@pytest.mark.parametrize("case", range(4))
def test_an_offload_tier_gives_back_the_hit_the_gpu_evicted(tmp_path, case):
    """A's blocks are evicted from a 200-block GPU pool by later prompts before B, sharing A's first m tokens,
    arrives: without a tier B recomputes its whole prompt; with a CPU tier (or a disk tier below a CPU tier
    too small to keep them) it computes what it computes with a pool that never evicts, and first waits for
    the hit's blocks to load: hit blocks · 2 MiB (Llama-3.1-8B's 16-token block) / the tier's bandwidth."""
    rng = np.random.default_rng(case)
    prompt_a, output_a = int(rng.integers(100, 1000)), int(rng.integers(1, 50))
    tokens_a = rng.integers(0, 30_000, prompt_a + output_a).tolist()
    common = int(rng.integers(1, prompt_a + output_a))
    prompt_b = int(rng.integers(common, common + 300))
    tokens_b = (tokens_a[:common] + rng.integers(40_000, 70_000, 400).tolist())[:prompt_b]
    rows = [{"arrival_time_ns": 0, "input_toks": prompt_a, "output_toks": output_a,
             "input_tok_ids": tokens_a[:prompt_a], "output_tok_ids": tokens_a[prompt_a:]},
            *[(10**10 * (1 + i), 1500, 2) for i in range(6)],  # 6 · 94 blocks through a 200-block pool
            {"arrival_time_ns": 200 * 10**9, "input_toks": prompt_b, "output_toks": 3, "input_tok_ids": tokens_b,
             "output_tok_ids": [1, 2, 3]}]
    path = write_trace(tmp_path / "t.jsonl", rows)
    hit = min(common, prompt_a + output_a - 1, prompt_b - 1) // 16 * 16
    step = {"latency": {"model": "constant", "step_s": 0.01}}
    for engine, hit_b, load_bandwidth in (
            ({"num_gpu_blocks_override": 8000}, hit, None), ({}, 0, None),
            ({"kv_offload": {"num_cpu_blocks": 2000}}, hit, 64e9),  # the H100's host link
            ({"kv_offload": {"num_cpu_blocks": 100, "num_disk_blocks": 2000, "disk_bandwidth_bytes_per_s": 1e9}},
             hit, 1e9)):
        result = kvsim.simulate(traced(path, engine, **step))
        b, steps = result.requests.iloc[-1], result.steps
        assert b.prefix_hit_tokens == hit_b
        computed = steps.num_batched_tokens[(steps.time_s >= 200) & (steps.time_s < b.first_token_s)].sum()
        assert computed == prompt_b - hit_b
        load_s = hit_b // 16 * 2**21 / load_bandwidth if load_bandwidth else 0.0
        assert b.ttft_s == pytest.approx(load_s + 0.01, rel=1e-9)


@pytest.mark.parametrize(("block", "engine"), [(16, {}), (32, {"prefix_cache": "radix"}), (1, {})])
def test_each_turn_hits_the_previous_turn_whole(block, engine):
    """A conversation's next turn, sent think_time_s after the previous one ended, starts with the previous
    turn's prompt and reply, so with nothing evicted it hits min(P_prev + O_prev - 1, P - 1) // bs whole
    blocks (a system prompt shared by half the conversations included). The previous turn is the request
    that ended think_time_s before it arrived and is shorter than its prompt (requests ending in one step
    end at one instant: a turn with two such candidates is left out)."""
    think_s = 3.0
    raw = roomy({**engine, "block_size": block, "num_gpu_blocks_override": 4000 * 16 // block}, seed=block)
    raw["workload"] = {**raw["workload"], "num_requests": 48, "arrival": {"process": "poisson", "rate": 2.0},
                       "prompt_len": {"dist": "uniform", "low": 1, "high": 200},
                       "output_len": {"dist": "uniform", "low": 1, "high": 100},
                       "shared_prefix": {"tokens": 40, "fraction": 0.5, "num_prefixes": 2},
                       "multi_turn": {"turns": 4, "think_time_s": think_s, "timing": "after_reply"}}
    result = kvsim.simulate(raw)
    requests = result.requests
    assert result.summary["num_preemptions"] == 0 and result.summary["num_finished"] == 48
    checked = 0
    for turn in requests.itertuples():
        before = requests[(requests.finish_s + think_s == turn.arrival_s)
                          & (requests.prompt_tokens + requests.output_tokens < turn.prompt_tokens)]
        if len(before) == 1:
            history = int(before.prompt_tokens.iloc[0] + before.output_tokens.iloc[0])
            assert turn.prefix_hit_tokens == min(history - 1, turn.prompt_tokens - 1) // block * block
            checked += 1
    assert checked >= 30  # of 12 conversations' 36 later turns


def capacity_row(**flags):
    args = ["capacity", "--format", "json"] + [item for key, value in flags.items()
                                                for item in (f"--{key.replace('_', '-')}", str(value))]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["rows"]
    return row


@pytest.mark.parametrize("case", range(8))
def test_capacity_is_the_simulated_admission(tmp_path, case):
    """`kvsim capacity`'s sequences of a context length (sharing a prefix of P tokens: the last three cases
    a prompt that is all prefix, which recomputes its last block) are the prompts of that length the engine
    admits at once when more arrive together (one output token: the prompt is all the KV it holds), with
    the token budget and max_num_seqs out of the way."""
    rng = np.random.default_rng(case)
    block, blocks, context = int(rng.choice([8, 16, 32])), int(rng.integers(300, 900)), int(rng.integers(20, 700))
    prefix = [0, 0, int(rng.integers(1, context)), int(rng.integers(1, context)), block, context][min(case, 5)]
    if case >= 5:  # all prefix, ending on a block boundary (the last case) or not
        context = prefix = (context // block + 1) * block if case == 7 else context
    engine = {"num_gpu_blocks_override": blocks, "block_size": block, "max_model_len": 1024,
              "max_num_batched_tokens": 400_000, "max_num_seqs": 1024}
    sharing = {"shared_prefix_tokens": prefix, "num_sequences": 10} if prefix else {}
    row = capacity_row(context_lengths=context, **sharing, **engine)
    expected = row["shared_prefix_max_seqs"] if prefix else row["paged_max_seqs"]
    rows = [{"arrival_time_ns": 0, "input_toks": context, "output_toks": 1, "output_tok_ids": [1],
             "input_tok_ids": list(range(prefix)) + [10**6 + 1000 * i + j for j in range(context - prefix)]}
            for i in range(expected + 20)]
    result = kvsim.simulate(traced(write_trace(tmp_path / "t.jsonl", rows), engine,
                                   latency={"model": "constant", "step_s": 0.01}))
    assert result.steps["vllm:num_requests_running"].iloc[0] == result.summary["max_running"] == expected


def test_the_seed_matters_only_where_something_is_drawn(tmp_path):
    """A trace's arrivals and lengths, or constant arrivals, fixed lengths, a system prompt on every request
    and drafts of fixed acceptance: nothing is drawn, so any seed gives the same run."""
    path = write_trace(tmp_path / "t.jsonl", random_rows(np.random.default_rng(0), 50, 5.0))
    first = kvsim.simulate(traced(path))
    assert first.summary["num_preemptions"] > 0
    assert kvsim.simulate(traced(path, seed=9)).requests.equals(first.requests)
    drawn = roomy({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                                          "synthetic_acceptance_length": 2.0}}, seed=0)
    drawn["workload"] = {**drawn["workload"], "arrival": {"process": "constant", "rate": 20.0},
                         "prompt_len": {"dist": "fixed", "value": 300}, "output_len": {"dist": "fixed", "value": 100},
                         "shared_prefix": {"tokens": 64, "fraction": 1.0}}
    first = kvsim.simulate(drawn)
    assert first.summary["prefix_cache_hit_rate"] > 0
    other = kvsim.simulate({**drawn, "seed": 5})
    assert other.requests.equals(first.requests)
    assert json.dumps({**other.summary, "seed": 0}) == json.dumps(first.summary)


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False}, {"scheduler": "v0"}])
def test_requests_arriving_later_change_no_request_that_ended_before(tmp_path, engine):
    """Causality: the trace cut at instant T (only the requests arriving before it) gives every request that
    ended before T the same record (decode bursts are planned up to the next arrival: this checks they
    never look past it)."""
    rows = random_rows(np.random.default_rng(1), 70, 7.0)
    whole = kvsim.simulate(traced(write_trace(tmp_path / "all.jsonl", rows), engine)).requests
    assert whole.num_preemptions.sum() > 0
    for cut_s in (2.5, 5.0):
        part = kvsim.simulate(traced(write_trace(tmp_path / "part.jsonl", [r for r in rows if r[0] < cut_s * 1e9]),
                                     engine)).requests
        ended = whole[whole.finish_s < cut_s]
        assert len(ended) >= 8
        assert part.iloc[ended.request_id].reset_index(drop=True).equals(ended.reset_index(drop=True))


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False}, {"scheduler": "v0"}, {"scheduler": "static"},
                                    {"allocator": "slab-pow2"}, {"scheduling_policy": "priority"}])
def test_rejected_requests_take_nothing(tmp_path, engine):
    """Prompts of max_model_len tokens or more, put among a trace's rows, are rejected on arrival (vLLM
    refuses them before they reach the scheduler): every other request runs as without them."""
    rng = np.random.default_rng(2)
    rows = random_rows(rng, 50, 5.0)
    too_long = set(rng.choice(len(rows), 8, replace=False).tolist())
    mixed = []
    for i, row in enumerate(rows):
        if i in too_long:
            mixed.append((row[0], int(rng.integers(2048, 3000)), 5))
        mixed.append(row)
    alone = kvsim.simulate(traced(write_trace(tmp_path / "a.jsonl", rows), engine)).requests
    among = kvsim.simulate(traced(write_trace(tmp_path / "b.jsonl", mixed), engine)).requests
    assert (among.status == "rejected").sum() == 8
    kept = among[among.status != "rejected"].reset_index(drop=True).assign(request_id=range(len(rows)))
    columns = [c for c in alone.columns if c != "reject_reason"]  # all None: object either way
    assert kept[columns].equals(alone[columns])


def test_a_round_robin_replica_is_the_engine_on_its_share(tmp_path):
    """Round-robin over two identical replicas sends the even rows of a trace to replica 0, which then runs
    exactly as one engine given those rows (same first row, so the same arrival instants)."""
    rows = random_rows(np.random.default_rng(3), 80, 6.0)
    fleet = kvsim.simulate(traced(write_trace(tmp_path / "all.jsonl", rows), replicas=2,
                                  router={"policy": "round_robin"})).requests
    share = kvsim.simulate(traced(write_trace(tmp_path / "even.jsonl", rows[0::2]))).requests
    assert share.num_preemptions.sum() > 0
    replica = fleet[fleet.replica == 0].drop(columns="replica").reset_index(drop=True)
    assert replica.equals(share.assign(request_id=share.request_id * 2))


def test_priority_ties_are_decided_by_class_not_file_order(tmp_path):
    """Under the priority policy requests are ordered by (priority, arrival): rows arriving at the same
    instant, reordered in the file so that each class keeps its own order, give every row the same record."""
    rng = np.random.default_rng(4)
    n = 60
    rows = [{"arrival_time_ns": int(t) * 10**9, "input_toks": int(p), "output_toks": int(o), "class": int(c)}
            for t, p, o, c in zip(np.sort(rng.integers(0, 6, n)), rng.integers(1, 1500, n), rng.integers(1, 300, n),
                                  rng.integers(0, 3, n), strict=True)]
    order = sorted(range(n), key=lambda i: (rows[i]["arrival_time_ns"], -rows[i]["class"]))
    assert order != list(range(n))

    def run(name, trace_rows):
        raw = traced(write_trace(tmp_path / name, trace_rows), {"scheduling_policy": "priority"})
        raw["workload"]["trace"]["priority_column"] = "class"
        return kvsim.simulate(raw).requests

    as_written = run("a.jsonl", rows)
    assert as_written.num_preemptions.sum() > 0
    reordered = run("b.jsonl", [rows[i] for i in order])
    back = reordered.assign(request_id=[order[i] for i in reordered.request_id]).sort_values("request_id")
    assert back.reset_index(drop=True).equals(as_written)


SPECULATION = [{"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 0.6},
               {"method": "eagle", "num_speculative_tokens": 2, "acceptance_rates": [0.8, 0.5]}]


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False}, {"prefix_cache": "radix"},
                                    {"scheduler": "v0", "enable_prefix_caching": True},
                                    {"scheduler": "static"}, {"data_parallel_size": 2},
                                    *({"speculative_config": spec} for spec in SPECULATION)],
                         ids=["v1-n2", "v1-sync", "radix", "v0", "static", "dp2", "ngram", "eagle"])
def test_every_token_is_computed_once_without_preemption(engine):
    """Summed over the steps, the tokens computed are each prompt's tokens past its prefix hit plus every
    sample's output tokens but the last (its KV is never needed); the prefill tokens are the first part.
    Speculating, every decode step is a verify of the last token and K drafts (none near max_model_len), a
    decode sequence of K + 1 tokens in the step rows (vLLM counts every token after the prompt as generation,
    `IterationStats.update_from_output`): batched, not prefill, tokens; with async scheduling, plus one discarded
    verify of K + 1 for each request that accepted drafts ended (at most one a request). Nothing is recomputed (the plan, which once took the
    prefill tokens less the prompts for the recompute, took every verify token for a preemption's recompute;
    it now reads the engines' own count, `tests/test_recomputed_tokens.py`)."""
    raw = roomy({**engine, "max_num_batched_tokens": 512 if engine.get("scheduler") not in ("v0", "static") else 2048},
                workload={**ROOMY["workload"], "n": 2 if engine == {} else 1,
                          "shared_prefix": {"tokens": 100, "fraction": 0.5}})
    result = kvsim.simulate(raw)
    requests, steps = result.requests, result.steps
    assert result.summary["num_preemptions"] == 0 and requests.prefix_hit_tokens.sum() > 0
    prompts = (requests.prompt_tokens - requests.prefix_hit_tokens).sum()
    if engine == {}:  # v1, n = 2: the second sample is a request of its own (vLLM v1's fan-out), whose lookup
        # finds all the first one's full prompt blocks but the one holding the last token (at most prompt − 1
        # tokens hit): it computes the prompt's last partial block, or its last whole block (16 tokens). A
        # tail of one token is a prompt token like the others (docs/metrics.md: `num_prefill_tokens`), though
        # priced as a decode; steps counted it as a decode until 2026-12-07
        tails = requests.prompt_tokens - (requests.prompt_tokens - 1) // 16 * 16
        siblings = requests.num_samples - 1
        prompts += (siblings * tails).sum()
    assert result.counters is not None and result.counters.num_recomputed_tokens == 0  # a sibling's tail is no recompute
    if "speculative_config" in engine:
        counts = result.summary["spec_decode"]
        assert counts["num_draft_tokens"] == engine["speculative_config"]["num_speculative_tokens"] * counts["num_drafts"]
        verifies = counts["num_drafts"] + counts["num_draft_tokens"]
        assert steps.num_prefill_tokens.sum() == prompts
        # async (EAGLE's default; vLLM refuses it for n-grams): a request its last verify's accepted drafts ended
        # gets one more verify of K + 1 tokens, discarded and in no counter (`V1Scheduler._wasted_verifies`)
        discarded = steps.num_batched_tokens.sum() - (prompts + verifies)
        k_plus_1 = engine["speculative_config"]["num_speculative_tokens"] + 1
        if result.summary.get("async_scheduling"):
            assert discarded % k_plus_1 == 0 and 0 < discarded // k_plus_1 <= len(requests)
        else:
            assert discarded == 0
    else:
        assert steps.num_prefill_tokens.sum() == prompts
        outputs = ((requests.output_tokens - 1) * requests.num_samples).sum()
        assert steps.num_batched_tokens.sum() == prompts + outputs


@pytest.mark.parametrize("acceptance", [1.0, 0.0])
def test_a_data_parallel_groups_speculation_counts_every_rank(acceptance):
    """Two DP ranks serve the requests one engine serves; with fixed acceptance each request's verify steps do
    not depend on its batch: all K = 3 drafts accepted, ceil((O - 1) / 4) verifies, none accepted, O - 1.
    The group's summary held rank 0's counters only (its spec_decode, and `max_running_without_preemption`
    judged by rank 0's preemptions); now every rank's, summed."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": acceptance}
    result = kvsim.simulate(roomy({"data_parallel_size": 2, "speculative_config": spec}))
    requests = result.requests
    assert set(requests.dp_rank) == {0, 1}
    verifies = np.ceil((requests.output_tokens - 1) / (4 if acceptance else 1)).sum()
    counts = result.summary["spec_decode"]
    assert (counts["num_drafts"], counts["num_draft_tokens"]) == (verifies, 3 * verifies)
    assert counts["num_accepted_tokens"] == (3 * verifies if acceptance else 0)


@pytest.mark.parametrize("fleet", [
    {"replicas": [{"count": 1}, {"count": 1}]},
    {"replicas": [{"count": 2}]},
    {"replicas": 2, "autoscaler": {"min_replicas": 2, "max_replicas": 3, "target": 1e9, "sync_period_s": 1}},
    {"replicas": 2, "workload": {**ROOMY["workload"], "max_concurrency": 10**6}},
], ids=["two-groups", "one-group", "autoscaler-never-scales", "closed-loop-unbounded"])
def test_a_fleet_spelled_differently_is_the_same_fleet(fleet):
    """Two replicas as two groups of one or one group of two, an autoscaler whose target is never reached
    (it cannot go below min_replicas), a closed-loop client that never holds a request back: the same
    requests as `replicas: 2`."""
    router = {"router": {"policy": "least_outstanding"}}
    raw = roomy({"num_gpu_blocks_override": 400}, **router)
    base = kvsim.simulate({**raw, "replicas": 2})
    other = kvsim.simulate({**raw, **fleet})
    assert other.requests[base.requests.columns].equals(base.requests)
    assert other.summary["duration_s"] == base.summary["duration_s"]
