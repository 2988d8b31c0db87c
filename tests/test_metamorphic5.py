"""Metamorphic relations, fifth round: features that work alone, combined.

`test_metamorphic.py` to `test_metamorphic4.py` hold the earlier rounds. Here:

* a replica's own `max_model_len` is the engine's: vLLM ends a request when its tokens reach the engine's
  limit (`FINISHED_LENGTH_CAPPED`), so a fleet whose group sets the limit serves every request as one engine
  with that limit does, and each group of a fleet of two limits as its own engine; a group that names the
  other scheduler is an engine of that scheduler (v0 caches no prefix unless asked); requests arriving
  together go to different data-parallel ranks under async scheduling too, and so do a request's parallel
  samples (vLLM fans them out before its DP client routes them);
* a trace split in two where the first part drains long before the second arrives: the second part runs as
  alone, though the first filled the pool with cached blocks the second must evict (prefix caching or
  not, the radix tree, a hybrid model's windows, parallel sampling, v0's swap);
* token ids cannot matter without prefix caching: a trace whose rows share long prefixes of ids runs as the
  same trace without ids, under preemption, chunking, parallel sampling and beam search;
* an offload tier that never fills: ten times the CPU blocks, or a disk tier below it, changes no request;
* v0's prefix caching changes no swapped group (beam search, parallel sampling) whose prompt no row shares;
* v0 and synchronous v1 agree on prompts that end at their first token (no caching, nothing binding), and
  one priority from a trace column is FCFS beside speculation, an offload tier and the radix tree;
* decode bursts are exact in the deployments the burst tests leave out: a disaggregated fleet, an
  autoscaled one, and v1's parallel sampling;
* a hybrid or sliding-window model hits the whole blocks of the common prefix, as a full-attention one.

Relations tried and kept out (the relation was wrong, not kvsim): halving every time with EAGLE drafts (the
drafter's passes are priced by the roofline beside a constant step) or beam search (v0 swaps a group's
blocks over the host link, whose bandwidth is not doubled); a step row's waste shares sum to 1 only with its
`draft_rejected` share when speculating.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import kvsim
import kvsim.engine.runtime
from kvsim.engine.simulate import simulate
from kvsim.fleet.autoscaled import simulate_autoscaled
from kvsim.fleet.disagg import simulate_disagg
from kvsim.workload.scenario import make_scenario
from tests.test_metamorphic2 import random_rows, write_trace
from tests.test_metamorphic4 import assert_fanned_is_sent_twice, own_ids, sent_twice

STEP = {"model": "constant", "step_s": 0.01}


def traced(path, engine=None, model="llama-3.1-8b", **workload):
    """A run of the `sharegpt_tokens` trace at `path`, at its own arrivals, a constant 10 ms step."""
    return {"model": model, "gpu": "h100-80gb", "seed": 0, "engine": {"max_model_len": 1024, **(engine or {})},
            "workload": {"trace": {"format": "sharegpt_tokens", "path": str(path)}, "arrival": {"process": "trace"},
                         **workload},
            "latency": STEP}


def shared_rows(seed, n=30, first_token_id=0):
    """`n` rows 80 ms apart on average whose prompts start with up to 600 ids of one of three common texts
    (ids from `first_token_id` on), then ids of their own."""
    rng = np.random.default_rng(seed)
    texts = [rng.integers(first_token_id, first_token_id + 30_000, 600).tolist() for _ in range(3)]
    rows, arrival_ns = [], 0
    for _ in range(n):
        arrival_ns += int(rng.exponential(0.08) * 1e9)
        prompt, output = int(rng.integers(20, 700)), int(rng.integers(1, 150))
        common = int(rng.integers(0, min(prompt, 600)))
        own = rng.integers(first_token_id + 40_000, first_token_id + 90_000, prompt - common).tolist()
        rows.append({"arrival_time_ns": arrival_ns, "input_toks": prompt, "output_toks": output,
                     "input_tok_ids": texts[int(rng.integers(0, 3))][:common] + own})
    return rows


# ------------------------------------------------------------------ a replica's max_model_len


LONG_ROWS = [(i * 10**9, prompt, 300) for i, prompt in enumerate((900, 200, 1000, 700))]


@pytest.mark.parametrize(("top", "group"), [(4096, 1024), (1024, 4096)])
def test_a_groups_max_model_len_is_its_engines(tmp_path, top, group):
    """A fleet of one group that sets max_model_len serves every request as one engine with that limit:
    capped to max_model_len − prompt tokens (vLLM ends a request whose tokens reach the limit), 124 for a
    900-token prompt under 1024. The fleet capped every request at the scenario's limit before routing, and
    its replica refused what did not fit its own: a 1024 group under a 4096 scenario rejected every prompt
    of 900 tokens asking for 300, and a 4096 group under a 1024 scenario cut them to 124."""
    path = write_trace(tmp_path / "t.jsonl", LONG_ROWS)
    raw = traced(path, {"max_model_len": top, "num_gpu_blocks_override": 2000})
    fleet = kvsim.simulate({**raw, "replicas": [{"count": 1, "engine": {"max_model_len": group}}]})
    alone = kvsim.simulate(traced(path, {"max_model_len": group, "num_gpu_blocks_override": 2000}))
    by_hand = [min(output, group - prompt) for _, prompt, output in LONG_ROWS]
    assert alone.requests.output_tokens.tolist() == by_hand
    assert fleet.requests.drop(columns="replica").equals(alone.requests)


def test_each_group_of_a_fleet_of_two_limits_serves_as_its_engine(tmp_path):
    """Round robin over a 1024 and a 4096 replica: rows 0 and 2 go to the first, capped at 1024 − prompt
    (124, 24), rows 1 and 3 to the second, uncapped (300); a disaggregated decode instance caps as its engine
    does too (its prefill instance, asked for one token, has the scenario's 4096)."""
    path = write_trace(tmp_path / "t.jsonl", LONG_ROWS)
    raw = traced(path, {"max_model_len": 4096, "num_gpu_blocks_override": 2000})
    fleet = kvsim.simulate({**raw, "replicas": [{"count": 1, "engine": {"max_model_len": 1024}}, {"count": 1}]})
    assert fleet.requests.output_tokens.tolist() == [124, 300, 24, 300]
    assert fleet.requests.status.eq("finished").all()
    disagg = kvsim.simulate({**raw, "replicas": [{"count": 1, "kv_role": "kv_producer"},
                                                 {"count": 1, "kv_role": "kv_consumer", "engine": {"max_model_len": 1024}}],
                             "kv_transfer_config": {"kv_connector": "NixlConnector"}})
    assert disagg.requests.output_tokens.tolist() == [124, 300, 24, 300]
    assert disagg.requests.status.eq("finished").all()


@pytest.mark.parametrize(("top", "group"), [("v1", "v0"), ("v0", "v1")])
def test_a_group_that_names_a_scheduler_is_an_engine_of_that_scheduler(tmp_path, top, group):
    """Round robin over a replica of the scenario's scheduler and one whose group names the other: each
    serves its rows (every other one) as one engine given those settings does. vLLM's v0 engine caches no
    prefix unless asked (`enable_prefix_caching` None in `EngineArgs`, turned on for v1 only), so the v0
    replica hits nothing and the v1 one hits the common texts. The group took the scenario's resolved
    value instead: a v0 group under a v1 scenario cached prefixes, a v1 group under a v0 scenario did not."""
    rows = shared_rows(4, n=24)
    raw = traced(write_trace(tmp_path / "all.jsonl", rows), {"scheduler": top, "num_gpu_blocks_override": 2000})
    fleet = kvsim.simulate({**raw, "replicas": [{"count": 1}, {"count": 1, "engine": {"scheduler": group}}],
                            "router": {"policy": "round_robin"}}).requests
    for replica, scheduler in enumerate((top, group)):
        mine = fleet[fleet.replica == replica].drop(columns="replica").reset_index(drop=True)
        share = [rows[i] for i in range(replica, len(rows), 2)]
        alone = kvsim.simulate(traced(write_trace(tmp_path / f"r{replica}.jsonl", share),
                                      {"scheduler": scheduler, "num_gpu_blocks_override": 2000})).requests
        assert (mine.prefix_hit_tokens.sum() > 0) == (scheduler == "v1")
        counts = ["prompt_tokens", "output_tokens", "prefix_hit_tokens", "num_preemptions"]
        assert mine[counts].equals(alone[counts])
        start_s = (share[0]["arrival_time_ns"] - rows[0]["arrival_time_ns"]) / 1e9
        np.testing.assert_allclose(mine.finish_s, alone.finish_s + start_s, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False}], ids=["async", "sync"])
def test_requests_arriving_together_go_to_different_data_parallel_ranks(tmp_path, engine):
    """vLLM's DP client picks the engine of least 4 · waiting + running (the first on a tie) and adds the
    request to that engine's waiting count at once: of two requests arriving together on an idle group, the
    first goes to rank 0 (a tie), the second to rank 1 (scores 4 and 0), and each runs as alone. Under async
    scheduling, vLLM's default, a request sent to a rank waits in its inbox for the next step to see it,
    and the balancer did not count it: every pair went to rank 0, and its requests shared the steps."""
    rows = [(pair * 2 * 10**9, 200, 50) for pair in range(4) for _ in (0, 1)]
    group = kvsim.simulate(traced(write_trace(tmp_path / "t.jsonl", rows),
                                  {"num_gpu_blocks_override": 2000, "data_parallel_size": 2, **engine})).requests
    assert group.dp_rank.tolist() == [0, 1] * 4
    alone = kvsim.simulate(traced(write_trace(tmp_path / "one.jsonl", rows[:1]), {"num_gpu_blocks_override": 2000,
                                                                                   **engine})).requests
    np.testing.assert_allclose(group.e2e_s, alone.e2e_s[0], rtol=1e-12)


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False}], ids=["async", "sync"])
def test_parallel_sampling_on_data_parallel_ranks_is_each_row_sent_twice(tmp_path, engine):
    """Round four's relation (`n = 2` is each row sent twice with the same prompt ids) on two DP ranks: vLLM's
    front end fans the request out before its DP client routes each child (`AsyncLLM.add_request`, then
    `add_request_async` per child), so the children are balanced like two rows arriving together, on ranks
    of their own when the group is idle, sharing no prefix cache. The steps are those of the rows sent twice,
    the parent's row starts with its first child's first token and ends with its last child's end. kvsim
    fanned out inside the rank the parent was sent to: both children ran there, the second hitting the
    first's prompt blocks."""
    rows = own_ids(random_rows(np.random.default_rng(3), 30, 3.0, max_prompt=600, max_output=100))
    group = {"num_gpu_blocks_override": 120, "data_parallel_size": 2, **engine}
    fanned = kvsim.simulate(traced(write_trace(tmp_path / "n2.jsonl", rows), group, n=2))
    alone = kvsim.simulate(traced(write_trace(tmp_path / "twice.jsonl", sent_twice(rows)), group))
    assert alone.summary["num_preemptions"] > 0
    assert set(alone.requests.dp_rank) == {0, 1}
    assert_fanned_is_sent_twice(fanned, alone)


# ------------------------------------------------------------------ combinations that must not matter


SPLIT_ENGINES = {
    "v1": {}, "v1-sync-no-caching": {"async_scheduling": False, "enable_prefix_caching": False},
    "radix-chunked": {"prefix_cache": "radix", "max_num_batched_tokens": 64, "max_num_seqs": 16},
    "v0-swap": {"scheduler": "v0", "preemption_mode": "swap", "enable_prefix_caching": True},
    "offload": {"kv_offload": {"num_cpu_blocks": 100}},
}


@pytest.mark.parametrize(("engine", "model", "n"), [
    *[(engine, "llama-3.1-8b", 1) for engine in SPLIT_ENGINES.values()],
    ({}, "llama-3.1-8b", 2), ({"num_gpu_blocks_override": 200}, "gpt-oss-20b", 1),
], ids=[*SPLIT_ENGINES, "v1-n2", "gpt-oss"])
def test_a_trace_split_where_it_drains_runs_its_second_part_as_alone(tmp_path, engine, model, n):
    """Part A, then part B 1,000 s after A's last arrival (long after A drained), ids of B's own: each of
    B's requests takes the same times from its arrival, with the same hits and preemptions, as B alone,
    though A's cached blocks fill the 120-block pool (its free queue) and B's allocations evict them."""
    a, b = shared_rows(1), shared_rows(2, first_token_id=100_000)
    shift_ns = a[-1]["arrival_time_ns"] + 10**12
    later = [{**row, "arrival_time_ns": row["arrival_time_ns"] + shift_ns} for row in b]
    engine = {"num_gpu_blocks_override": 120, **engine}  # gpt-oss: 200, its startup check's least
    both = kvsim.simulate(traced(write_trace(tmp_path / "ab.jsonl", a + later), engine, model, n=n)).requests
    alone = kvsim.simulate(traced(write_trace(tmp_path / "b.jsonl", b), engine, model, n=n)).requests
    second = both.iloc[len(a):].reset_index(drop=True)
    assert alone.num_preemptions.sum() > 0 or model != "llama-3.1-8b"
    counts = ["prompt_tokens", "output_tokens", "prefix_hit_tokens", "num_preemptions"]
    assert second[counts].equals(alone[counts])
    for column in ("queue_s", "ttft_s", "e2e_s"):
        np.testing.assert_allclose(second[column], alone[column], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("engine", "workload"), [
    ({"enable_prefix_caching": False}, {}),
    ({"enable_prefix_caching": False, "max_num_batched_tokens": 64, "max_num_seqs": 16}, {"n": 2}),
    ({"scheduler": "v0", "max_num_seqs": 16}, {"beam_width": 2}),
    ({"scheduler": "v0", "preemption_mode": "swap"}, {"n": 2}),
], ids=["v1", "v1-chunked-n2", "v0-beam", "v0-swap-n2"])
def test_shared_token_ids_without_prefix_caching_are_no_token_ids(tmp_path, engine, workload):
    """Without prefix caching (v0's default) the ids decide nothing: rows whose prompts share up to 600
    ids run as the same rows without ids, in a 120-block pool that preempts."""
    rows = shared_rows(5)
    with_ids = kvsim.simulate(traced(write_trace(tmp_path / "ids.jsonl", rows),
                                     {"num_gpu_blocks_override": 120, **engine}, **workload))
    bare = [{k: v for k, v in row.items() if k != "input_tok_ids"} for row in rows]
    without = kvsim.simulate(traced(write_trace(tmp_path / "bare.jsonl", bare),
                                    {"num_gpu_blocks_override": 120, **engine}, **workload))
    assert with_ids.summary["num_preemptions"] > 0
    assert with_ids.requests.equals(without.requests)
    assert with_ids.steps.equals(without.steps)


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False, "max_num_batched_tokens": 64, "max_num_seqs": 16}],
                         ids=["v1", "v1-sync-chunked"])
def test_an_offload_tier_that_never_fills_is_any_larger_one(tmp_path, engine):
    """A CPU tier of 5,000 blocks holds every block the 150-block GPU pool ever evicts (it stores fewer than
    5,000, evicts none): 50,000 blocks, or a disk tier below it, change no request."""
    path = write_trace(tmp_path / "t.jsonl", shared_rows(7, n=40))
    runs = [kvsim.simulate(traced(path, {"num_gpu_blocks_override": 150, "kv_offload": tier, **engine}))
            for tier in ({"num_cpu_blocks": 5000}, {"num_cpu_blocks": 50_000},
                         {"num_cpu_blocks": 5000, "num_disk_blocks": 9000, "disk_bandwidth_bytes_per_s": 1e9})]
    cpu = runs[0].summary["kv_offload"]["tiers"]["cpu"]
    assert 0 < cpu["num_stored_blocks"] < 5000 and cpu["num_evicted_blocks"] == 0 and cpu["num_hit_blocks"] > 0
    for other in runs[1:]:
        assert other.requests.equals(runs[0].requests)


@pytest.mark.parametrize("latency", [STEP, {"model": "roofline"}], ids=["constant", "roofline"])
def test_v0_and_v1_agree_on_prompts_that_end_at_their_first_token(tmp_path, latency):
    """Where the engines must agree: every request wants one token (its prefill samples it and it ends), no
    prefix caching, a token budget and a pool nothing fills. Both then take every waiting prompt each step
    (v1's chunks are whole prompts, v0's prefill-first batch has no decode to wait for), so synchronous v1
    and v0 give the same requests and steps, priced alike: v1 without CUDA graphs (v0 captured decodes only,
    v1 pads these prefills to its capture sizes: `kvsim.latency.cudagraph`)."""
    rows = [{**row, "output_toks": 1} for row in shared_rows(300, n=50)]
    path = write_trace(tmp_path / "t.jsonl", rows)
    roomy = {"num_gpu_blocks_override": 8000, "max_num_batched_tokens": 40_000, "max_num_seqs": 256}
    runs = []
    for engine in ({"async_scheduling": False, "enable_prefix_caching": False, "enforce_eager": True},
                   {"scheduler": "v0"}):
        raw = traced(path, {**roomy, **engine})
        runs.append(kvsim.simulate({**raw, "latency": latency}))
    assert runs[0].steps["num_batched_tokens"].max() > 700  # prompts batched together
    assert runs[0].requests.equals(runs[1].requests)
    columns = ["time_s", "duration_s", "num_batched_tokens", "vllm:num_requests_running"]
    assert runs[0].steps[columns].equals(runs[1].steps[columns])


@pytest.mark.parametrize("engine", [
    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 0.6}},
    {"kv_offload": {"num_cpu_blocks": 100}, "max_num_batched_tokens": 64, "max_num_seqs": 16},
    {"prefix_cache": "radix", "async_scheduling": False},
], ids=["ngram", "offload-chunked", "radix-sync"])
def test_one_priority_from_a_trace_column_is_fcfs_with_speculation_tiers_and_the_radix_tree(tmp_path, engine):
    """Round one's relation (one priority for every request is FCFS) through a trace's priority column and
    beside the features it did not combine: with (priority, arrival) = arrival the waiting orders agree,
    and so do the victims (FCFS preempts the last admitted, which arrived last: a preempted request goes
    back to the front, behind no earlier arrival)."""
    path = write_trace(tmp_path / "t.jsonl", [{**row, "prio": 3} for row in shared_rows(200, n=40)])
    fcfs = kvsim.simulate(traced(path, {"num_gpu_blocks_override": 100, **engine}))
    raw = traced(path, {"num_gpu_blocks_override": 100, **engine, "scheduling_policy": "priority"})
    raw["workload"]["trace"]["priority_column"] = "prio"
    priority = kvsim.simulate(raw)
    assert fcfs.summary["num_preemptions"] > 0
    assert set(priority.requests.priority) == {3}
    assert priority.requests.drop(columns="priority").equals(fcfs.requests)


@pytest.mark.parametrize("workload", [{"beam_width": 2}, {"beam_width": 3}, {"n": 2}], ids=["beam2", "beam3", "n2"])
def test_v0_prefix_caching_without_shared_prompts_changes_no_swapped_group(tmp_path, workload):
    """v0 forks a group's sequences (beam search, parallel sampling) and swaps a preempted group out whole:
    with prompt ids no other row has, the blocks prefix caching registers are never hit (a swapped group
    comes back with its own blocks, not through a lookup), so caching on or off gives the same requests,
    under a 120-block pool that swaps."""
    rows = [{"arrival_time_ns": row["arrival_time_ns"], "input_toks": row["input_toks"], "output_toks": row["output_toks"],
             "input_tok_ids": [10**6 * (i + 1) + j for j in range(row["input_toks"])]}
            for i, row in enumerate(shared_rows(3, n=30))]
    path = write_trace(tmp_path / "t.jsonl", rows)
    engine = {"scheduler": "v0", "preemption_mode": "swap", "num_gpu_blocks_override": 120, "max_num_seqs": 32,
              "watermark": 0}
    off = kvsim.simulate(traced(path, {**engine, "enable_prefix_caching": False}, **workload))
    on = kvsim.simulate(traced(path, {**engine, "enable_prefix_caching": True}, **workload))
    assert off.summary["swapped_out_bytes"] > 0
    assert on.summary["num_prefix_cache_hit_tokens"] == 0
    assert on.requests.equals(off.requests)


# ------------------------------------------------------------------ bursts in the deployments left out


def _bursts_world(tmp_path, kind):
    raw = traced(write_trace(tmp_path / "t.jsonl", shared_rows(9, n=60)), {"num_gpu_blocks_override": 200})
    raw["latency"] = {"model": "roofline"}
    if kind == "n2":
        raw["workload"]["n"] = 2
    elif kind == "disagg":
        raw.update(replicas=[{"count": 1, "kv_role": "kv_producer"}, {"count": 2, "kv_role": "kv_consumer"}],
                   kv_transfer_config={"kv_connector": "NixlConnector"})
    else:
        raw.update(replicas=1, router={"policy": "least_outstanding"},
                   autoscaler={"min_replicas": 1, "max_replicas": 3, "target": 1, "sync_period_s": 0.5,
                               "startup_s": 0.5, "scale_down_window_s": 1})
    return make_scenario(raw)


@pytest.mark.parametrize("kind", ["n2", "disagg", "autoscaled"])
def test_bursts_equal_step_by_step_where_the_burst_tests_do_not_look(tmp_path, kind, monkeypatch):
    """`tests/test_burst_exact.py` compares single engines and static fleets; parallel sampling's children,
    a disaggregated fleet's decode instances and an autoscaled fleet burst too: the same requests, steps and
    summary step by step (bursts=False), and bursts did run. (Data-parallel ranks never burst.)"""
    run = {"n2": simulate, "disagg": simulate_disagg, "autoscaled": simulate_autoscaled}[kind]
    scenario = _bursts_world(tmp_path, kind)
    step_by_step = run(scenario, bursts=False)
    applied = []
    apply_burst = kvsim.engine.runtime.apply_burst
    monkeypatch.setattr(kvsim.engine.runtime, "apply_burst", lambda *args: applied.append(1) or apply_burst(*args))
    bursts = run(scenario, check=True)
    assert applied
    assert bursts.requests.equals(step_by_step.requests)
    assert bursts.steps.equals(step_by_step.steps)
    assert json.dumps(bursts.summary) == json.dumps(step_by_step.summary)


# ------------------------------------------------------------------ windows and prefix hits


@pytest.mark.parametrize("model", ["gpt-oss-20b", "gemma-3-27b", "mistral-7b"])
@pytest.mark.parametrize("case", range(3))
def test_a_windowed_model_hits_the_whole_blocks_of_the_common_prefix(tmp_path, model, case):
    """Round two's prefix hit (`test_metamorphic2.py`) for models whose layers slide (all of Mistral-7B's
    over 4,096 tokens; half of gpt-oss-20b's over 128, five in six of Gemma 3's over 1,024): in a pool that
    evicts nothing every block A filled stays cached, the blocks that slid out of its window too, so B hits
    min(common, P_A + O_A − 1, P_B − 1) // 16 whole blocks and its prefill computes the rest."""
    rng = np.random.default_rng(case)
    prompt_a, output_a = int(rng.integers(1, 600)), int(rng.integers(1, 50))
    tokens_a = rng.integers(0, 30_000, prompt_a + output_a).tolist()
    common = int(rng.integers(0, prompt_a + output_a + 20))
    prompt_b = int(rng.integers(max(1, min(common, prompt_a + output_a)), 800))
    tokens_b = (tokens_a[:common] + rng.integers(40_000, 70_000, 800).tolist())[:prompt_b]
    rows = [{"arrival_time_ns": 0, "input_toks": prompt_a, "output_toks": output_a,
             "input_tok_ids": tokens_a[:prompt_a], "output_tok_ids": tokens_a[prompt_a:]},
            {"arrival_time_ns": 100 * 10**9, "input_toks": prompt_b, "output_toks": 3,
             "input_tok_ids": tokens_b, "output_tok_ids": [1, 2, 3]}]
    raw = traced(write_trace(tmp_path / "t.jsonl", rows), {"max_model_len": 2048, "num_gpu_blocks_override": 2000},
                 model)
    raw["gpu"] = "h200"
    result = kvsim.simulate(raw, check=True)
    b, steps = result.requests.iloc[1], result.steps
    hit = min(common, prompt_a + output_a - 1, prompt_b - 1) // 16 * 16
    assert b.prefix_hit_tokens == hit
    assert steps.num_batched_tokens[(steps.time_s >= 100) & (steps.time_s < b.first_token_s)].sum() == prompt_b - hit
