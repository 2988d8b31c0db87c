"""Metamorphic relations, fourth round: representations that must not matter, and fan-out, tiers, speculation
and disaggregation against the engines they reduce to.

`test_metamorphic.py`, `test_metamorphic2.py` and `test_metamorphic3.py` hold the earlier rounds. Here:

* token ids that no other row shares are no token ids: a `sharegpt_tokens` trace whose rows carry
  `input_tok_ids` of their own (and no `output_tok_ids`) runs as the same trace without ids, under
  preemption, parallel sampling and multi-turn conversations (the ids decide which blocks hash alike, and
  none do across rows), and samples forked off a sequence (v0's sampling, beam search) own their outputs
  whether the row's reply ids are given or not, and rows of the same ids behind a system prompt share it
  all; Mooncake's 512-token hash ids are the token ids they stand for, later turns too;
* vLLM v1's parallel sampling is its children: `n = 2` is each row sent twice with the same prompt ids, the
  parent's row the first child's first token and the last child's end;
* an autoscaled fleet at double speed (arrivals, steps, the HPA's periods, startup, the SLO) takes half the
  time exactly;
* prompts arriving together pack into steps by hand: v1 cuts one stream of prompt tokens every token budget,
  v0 takes whole prompts while they fit.

* the radix tree hits as the hash chain while nothing is evicted, with EAGLE's trimmed hits too.

Relations tried and kept out (the relation was wrong, not kvsim): the radix cache and the hash chain give
the same run only while nothing is evicted (SGLang evicts whole LRU leaves, vLLM's free queue a request's
last block first, so a preempted request finds less of its own KV again in the radix tree).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import kvsim
from tests.test_metamorphic2 import random_rows, traced, write_trace  # the same trace helpers

TIGHT = {"num_gpu_blocks_override": 150, "max_model_len": 1024}
SMALL_FLEET = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": 2, "replicas": 1,
               "router": {"policy": "least_outstanding"}, "engine": {"max_model_len": 4096, "num_gpu_blocks_override": 300},
               "workload": {"num_requests": 150, "prompt_len": {"dist": "lognormal", "mean": 300, "p99": 1500},
                            "output_len": {"dist": "lognormal", "mean": 200, "p99": 800},
                            "shared_prefix": {"tokens": 512, "fraction": 0.6, "num_prefixes": 3}}}  # 40 prompts of up to 600 tokens preempt


def own_ids(rows, outputs=False):
    """`rows` (arrival_ns, prompt, output) with prompt token ids no other row has, and output ids (its own
    too) only if `outputs`."""
    table = []
    for i, (a, p, o) in enumerate(rows):
        first = 10**6 * (i + 1)
        row = {"arrival_time_ns": int(a), "input_toks": int(p), "output_toks": int(o),
               "input_tok_ids": list(range(first, first + int(p)))}
        if outputs:
            row["output_tok_ids"] = list(range(first + 5 * 10**5, first + 5 * 10**5 + int(o)))
        table.append(row)
    return table


AFFINITY = {"replicas": 3, "router": {"policy": "affinity"}}


@pytest.mark.parametrize(("workload", "engine", "fleet"), [
    ({}, {}, {}), ({"n": 2}, {}, {}), ({}, {"prefix_cache": "radix"}, {}), ({}, {"kv_offload": {"num_cpu_blocks": 100}}, {}),
    ({"multi_turn": {"turns": 3, "think_time_s": 0.5, "timing": "after_reply"}}, {}, {}),
    ({"multi_turn": {"turns": 2, "think_time_s": 0.5}}, {}, {}),
    ({"multi_turn": {"turns": 4, "think_time_s": 0.5, "timing": "after_reply"}}, {}, AFFINITY),
], ids=["v1", "n2", "radix", "offload", "turns-after-reply", "turns-open", "turns-affinity"])
def test_token_ids_no_other_row_shares_are_no_token_ids(tmp_path, workload, engine, fleet):
    """A row's prompt ids without its reply's ids stopped the request's content at the prompt: a preempted
    request's lookup (prompt and reply so far) asserted "hashing beyond the known content". And a
    conversation whose first turn was given as ids named its history by segments, so no later turn hit
    the blocks the first turn's ids had filled (a segment trace's later turns hit the whole history), and an
    affinity router, keyed by the same block hashes, sent them elsewhere."""
    rows = random_rows(np.random.default_rng(7), 40, 4.0, max_prompt=600, max_output=200)
    runs = []
    for name, trace_rows in (("plain.jsonl", rows), ("ids.jsonl", own_ids(rows))):
        raw = traced(write_trace(tmp_path / name, trace_rows), {**TIGHT, **engine}, **fleet)
        raw["workload"].update(workload)
        runs.append(kvsim.simulate(raw))
    plain, ids = runs
    if fleet:  # ten conversations over three replicas: no pressure, but later turns routed by their history
        assert (plain.tables["routes"].reason == "affinity").sum() >= 10
    else:
        assert plain.summary["num_preemptions"] > 0
    if workload:  # the history (or the first sample's prompt) is hit
        assert plain.summary["num_prefix_cache_hit_tokens"] > 0
    assert ids.requests.equals(plain.requests)
    assert json.dumps(ids.summary) == json.dumps(plain.summary)


@pytest.mark.parametrize(("workload", "engine"), [
    ({"beam_width": 3}, {}), ({"beam_width": 2}, {"prefix_cache": "radix"}),
    ({"beam_width": 3}, {"scheduler": "v0", "preemption_mode": "recompute", "enable_prefix_caching": True}),
    ({"n": 3, "multi_turn": {"turns": 2, "think_time_s": 0.3, "timing": "after_reply"}},
     {"scheduler": "v0", "enable_prefix_caching": True, "watermark": 0}),  # a swapped group always comes back
], ids=["v1-beams", "radix-beams", "v0-beams-recompute", "v0-samples-turns"])
def test_forked_samples_own_their_outputs_whatever_the_content(tmp_path, workload, engine):
    """Samples forked off a prefilled sequence (v0's parallel sampling, beam search) each fill blocks of their
    own output: segment content renamed each child's output segment, token content gave every child its
    parent's tokens, so with a row's prompt and reply ids every sample's output blocks hashed as the first
    sample's (duplicates in the cache, and a changed eviction order: other times than the same rows without
    ids). Now each child's reply is its own placeholder tokens, as v1's fanned-out children's are."""
    rng = np.random.default_rng(5)
    rows = random_rows(rng, 40, 4.0, max_prompt=700, max_output=150)
    runs = []
    for name, trace_rows in (("plain.jsonl", rows), ("ids.jsonl", own_ids(rows, outputs=True))):
        raw = traced(write_trace(tmp_path / name, trace_rows), {**TIGHT, **engine})
        raw["workload"].update(workload)
        runs.append(kvsim.simulate(raw))
    plain, ids = runs
    assert plain.summary["num_preemptions"] > 0
    assert ids.requests.equals(plain.requests)
    assert json.dumps(ids.summary) == json.dumps(plain.summary)


SPECULATING = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rates": 0.6},
               "num_gpu_blocks_override": 80}  # drafts' slots held: fewer blocks to preempt


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False}, {"prefix_cache": "radix"},
                                    {"scheduling_policy": "priority"}, {"max_num_batched_tokens": 128, "max_num_seqs": 64},
                                    SPECULATING],
                         ids=["v1", "v1-sync", "radix", "priority", "chunked", "speculative"])
def test_parallel_sampling_is_each_row_sent_twice(tmp_path, engine):
    """vLLM v1 fans `n = 2` out into two child requests with the parent's prompt, arrival and priority, added
    in index order (`kvsim.sched.fanout`): the steps are those of a trace giving every row twice, with the
    same prompt ids and replies of their own; the parent's row starts with its first child's first token
    and ends with its last child's end. Each child speculates as any request does (vLLM v1's drafts are per
    request, `is_spec_decode_unsupported` names no `n`): kvsim refused n > 1 with speculative decoding."""
    rows = own_ids(random_rows(np.random.default_rng(3), 30, 3.0, max_prompt=600, max_output=100))
    raw = traced(write_trace(tmp_path / "n2.jsonl", rows), {**TIGHT, "num_gpu_blocks_override": 120, **engine})
    raw["workload"]["n"] = 2
    fanned = kvsim.simulate(raw)
    alone = kvsim.simulate(traced(write_trace(tmp_path / "twice.jsonl", sent_twice(rows)),
                                  {**TIGHT, "num_gpu_blocks_override": 120, **engine}))
    assert alone.summary["num_preemptions"] > 0
    assert_fanned_is_sent_twice(fanned, alone)
    assert fanned.summary.get("spec_decode") == alone.summary.get("spec_decode")


def sent_twice(rows: list[dict]) -> list[dict]:
    """Each traced row twice in a row, the same prompt ids, each copy with reply ids of its own."""
    return [{**row, "output_tok_ids": [10**9 + 10**6 * i + 10**5 * sample + j for j in range(row["output_toks"])]}
            for i, row in enumerate(rows) for sample in (0, 1)]


def assert_fanned_is_sent_twice(fanned, alone) -> None:
    """`fanned` (n = 2) ran the steps of `alone` (each row `sent_twice`); each parent row spans its children's."""
    assert fanned.steps.equals(alone.steps)
    children = alone.requests.groupby(alone.requests.request_id // 2)
    for column, of_children in (("first_scheduled_s", "min"), ("first_token_s", "min"), ("finish_s", "max"),
                                ("num_preemptions", "sum")):
        np.testing.assert_array_equal(fanned.requests[column], children[column].agg(of_children))
    for key in ("num_preemptions", "num_prefix_cache_query_tokens", "num_prefix_cache_hit_tokens", "duration_s"):
        assert fanned.summary[key] == alone.summary[key]


@pytest.mark.parametrize(("engine", "turns"), [({}, 1), ({"prefix_cache": "radix"}, 1), ({"block_size": 32}, 1),
                                               ({}, 2), ({"prefix_cache": "radix"}, 3)])
def test_mooncake_hash_ids_are_the_token_ids_they_stand_for(tmp_path, engine, turns):
    """A Mooncake row's hash id h stands for 512 tokens that every row with h at that place shares: the same
    rows given as token ids (h · 512 + j for token j of block h, cut at the prompt's length) hit the same
    blocks, whatever the cache and block size, and so do their conversations' later turns (each resends the
    earlier turns, hash ids or token ids, and their replies)."""
    rng = np.random.default_rng(0)
    mooncake, tokens, now_ms = [], [], 0
    for i in range(50):
        now_ms += int(rng.integers(0, 300))
        shared = int(rng.integers(0, 4))  # whole blocks of one of five common prefixes, then a block of its own
        hash_ids = [int(rng.integers(0, 5)) * 100 + k for k in range(shared)] + [10**4 + i]
        prompt, output = shared * 512 + int(rng.integers(1, 513)), int(rng.integers(1, 200))
        mooncake.append({"timestamp": now_ms, "input_length": prompt, "output_length": output, "hash_ids": hash_ids})
        tokens.append({"arrival_time_ns": now_ms * 10**6, "input_toks": prompt, "output_toks": output,
                       "input_tok_ids": [h * 512 + j for h in hash_ids for j in range(512)][:prompt]})
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in mooncake))
    runs = []
    for raw in (traced(str(path), {**engine, "num_gpu_blocks_override": 400}),
                traced(write_trace(tmp_path / "tokens.jsonl", tokens), {**engine, "num_gpu_blocks_override": 400})):
        if raw["workload"]["trace"]["path"] == str(path):
            raw["workload"]["trace"]["format"] = "mooncake"
        if turns > 1:
            raw["workload"]["multi_turn"] = {"turns": turns, "think_time_s": 1.0, "timing": "after_reply"}
        runs.append(kvsim.simulate(raw))
    by_ids, by_tokens = runs
    assert by_ids.summary["num_prefix_cache_hit_tokens"] > 5000
    assert by_tokens.requests.equals(by_ids.requests)


@pytest.mark.parametrize("scheduler", ["v1", "v1-sync", "v0"])
@pytest.mark.parametrize("seed", range(3))
def test_prompts_arriving_together_pack_into_steps_by_hand(tmp_path, scheduler, seed):
    """30 prompts arrive at once, one output token each (the prompt's last chunk samples it), a 10 ms step,
    blocks and sequences never short. vLLM v1 fills each step's token budget B with chunks in FCFS order, a
    prompt cut where the budget ends going on first in the next step: the prompts are one stream of tokens
    cut every B, and prompt i's first token comes at step ceil((P_0 + ... + P_i) / B). v0 never chunks: a step
    takes whole prompts in order while they fit in B."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, 900, 30)
    budget = int(rng.choice([40, 100, 256])) if scheduler != "v0" else 1000
    engine = {"max_num_batched_tokens": budget, "max_num_seqs": 32, "num_gpu_blocks_override": 5000,
              **{"v1": {}, "v1-sync": {"async_scheduling": False}, "v0": {"scheduler": "v0", "max_model_len": 1000}}[scheduler]}
    raw = traced(write_trace(tmp_path / "t.jsonl", [(0, int(p), 1) for p in prompts]), engine,
                 latency={"model": "constant", "step_s": 0.01})
    if scheduler == "v0":
        steps, used = [], budget
        for prompt in prompts:
            if used + prompt > budget:
                steps.append((steps[-1] if steps else 0) + 1)
                used = 0
            else:
                steps.append(steps[-1])
            used += prompt
    else:
        steps = np.ceil(np.cumsum(prompts) / budget)
    np.testing.assert_allclose(kvsim.simulate(raw).requests.first_token_s, np.asarray(steps) * 0.01, rtol=1e-12)


def test_an_autoscaled_fleet_at_double_speed_takes_half_the_time_exactly():
    """Round one's time rescaling (`test_metamorphic.py`) for an autoscaled fleet: arrival rate doubled; step
    time, the HPA's sync period, windows and policy periods, replica startup and the SLO's thresholds and
    window halved. Every instant the fleet decides at halves exactly (powers of two), so the same replicas come
    up for the same requests: every time is half, every count the same, GPU-hours half and the SLO
    attainment the same."""
    def run(scale):
        raw = {**SMALL_FLEET, "latency": {"model": "constant", "step_s": 0.01 / scale},
               "workload": {**SMALL_FLEET["workload"], "arrival": {"process": "poisson", "rate": 30.0 * scale}}}
        raw["autoscaler"] = {"min_replicas": 1, "max_replicas": 4, "target": 2, **{
            key: seconds / scale for key, seconds in (
                ("startup_s", 2.0), ("sync_period_s", 1.0), ("scale_up_period_s", 4.0), ("scale_down_period_s", 4.0),
                ("scale_down_window_s", 8.0), ("slo_window_s", 16.0), ("slo_ttft_s", 2.0), ("slo_tpot_s", 0.1))}}
        return kvsim.simulate(raw)

    slow, fast = run(1), run(2)
    scaling = slow.summary["autoscaling"]
    assert scaling["max_ready"] == 4 and 0 < scaling["slo_attainment"] < 1
    times = ["arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s"]
    np.testing.assert_array_equal(fast.requests[times].to_numpy(), slow.requests[times].to_numpy() / 2)
    others = [c for c in slow.requests.columns if c not in times]
    assert fast.requests[others].equals(slow.requests[others])
    halved = ("gpu_hours", "billed_span_s", "gpu_hours_per_million_output_tokens")  # the same tokens in half the hours
    for key in ("mean_gpus", "max_ready", "num_syncs", "slo_attainment", "worst_window_slo_attainment", *halved):
        assert fast.summary["autoscaling"][key] == scaling[key] / (2 if key in halved else 1), key


@pytest.mark.parametrize("speculation", [None, {"method": "eagle", "num_speculative_tokens": 2, "acceptance_rates": 0.5}],
                         ids=["plain", "eagle"])
def test_the_radix_cache_hits_as_the_hash_chain_while_nothing_is_evicted(tmp_path, speculation):
    """Prompts that start with 0, 48, 96 or 144 tokens of one common text, a pool nothing is evicted from: the
    radix tree and the hash chain hit the same blocks. Each request hits the longest common text any earlier
    one computed, in whole blocks (with EAGLE one block fewer, `Scheduler.lookup`). By hand, A (48 tokens of
    it, running), then B (144) hits A's 3 blocks, then C (96) hits 6: A's 3 and B's next 3; with EAGLE 2 and 5
    blocks. The radix cache gave C 2 blocks under EAGLE: B recomputed its trimmed block into a block of its
    own, which the tree held as A's, and a sequence whose leading blocks the tree holds in others cached
    nothing past them (SGLang's insert points it at the tree's and caches the rest below)."""
    def row(arrival_ms, shared, own, output, i):
        ids = list(range(shared)) + list(range(10**6 * (i + 1), 10**6 * (i + 1) + own))
        return {"arrival_time_ns": arrival_ms * 10**6, "input_toks": len(ids), "output_toks": output,
                "input_tok_ids": ids}

    engine = {"num_gpu_blocks_override": 20_000, **({"speculative_config": speculation} if speculation else {})}
    path = write_trace(tmp_path / "abc.jsonl", [row(0, 48, 535, 95, 0), row(105, 144, 161, 57, 1),
                                                         row(283, 96, 153, 8, 2)])
    drop = 1 if speculation else 0
    for cache in ("hash_chain", "radix"):
        hits = kvsim.simulate(traced(path, {**engine, "prefix_cache": cache})).requests.prefix_hit_tokens
        assert hits.tolist() == [0, (3 - drop) * 16, (6 - drop) * 16], cache
    rng = np.random.default_rng(9)
    rows = [{"arrival_time_ns": int(a), "input_toks": int(p) + int(s), "output_toks": int(o),
             "input_tok_ids": list(range(int(s))) + list(range(10**6 * (i + 1), 10**6 * (i + 1) + int(p)))}
            for i, ((a, p, o), s) in enumerate(zip(random_rows(rng, 50, 5.0, max_prompt=600, max_output=100),
                                                   rng.integers(0, 4, 50) * 48, strict=True))]
    path = write_trace(tmp_path / "mixed.jsonl", rows)
    chain, radix = (kvsim.simulate(traced(path, {**engine, "max_model_len": 4096, "prefix_cache": cache}))
                    for cache in ("hash_chain", "radix"))
    assert chain.summary["num_prefix_cache_hit_tokens"] > 3000
    assert radix.requests.equals(chain.requests)


def test_rows_of_the_same_ids_behind_a_system_prompt_share_it_all(tmp_path):
    """Rows 0, 1 and 3 give the same 300 token ids, row 2 none; a 64-token system prompt is in front of all.
    By hand (blocks of 16, a hit stops one token short of the prompt): row 1 and row 3 hit their whole
    364-token prompt but its last partial block, (364 - 1) // 16 · 16 = 352 tokens; row 2 the system
    prompt's 64. A row's ids were dropped behind a system prompt (its prompt became the system prompt and
    a segment of its own): rows 1 and 3 hit 64 only. Without the system prompt, 288 = (300 - 1) // 16 · 16."""
    same = {"input_toks": 300, "output_toks": 5, "input_tok_ids": list(range(300))}
    rows = [{"arrival_time_ns": i * 10**10, **(same if i != 2 else {"input_toks": 300, "output_toks": 5})}
            for i in range(4)]
    raw = traced(write_trace(tmp_path / "t.jsonl", rows))
    assert kvsim.simulate(raw).requests.prefix_hit_tokens.tolist() == [0, 288, 0, 288]
    raw["workload"]["shared_prefix"] = {"tokens": 64, "fraction": 1.0}
    assert kvsim.simulate(raw).requests.prefix_hit_tokens.tolist() == [0, 352, 64, 352]
