"""Metamorphic relations, third round: deployments that must decompose into engines, and workloads moved
in time or in the pool in ways that, by vLLM's semantics, change known parts of the result.

`test_metamorphic.py` (a fleet of one, one DP rank, one priority, time rescaled, presets as files) and
`test_metamorphic2.py` (settings that never bind, FIFO service, hit arithmetic, causality, a round-robin
replica's share) hold the earlier rounds. Here:

* a dense model's data-parallel ranks are independent engines (vLLM's `run_engine_core`: "Non-MoE DP
  ranks are completely independent"): each rank serves its requests exactly as one engine given them,
  and the group's step figures are the engines' own, merged in time; a fleet's mean running is its
  replicas' running together, over the time some replica steps;
* a round-robin fleet of three on a trace is three engines on every third row, whatever the engine;
* a disaggregated prefill instance is the engine serving each prompt with one output token, and an
  isolated request's disaggregated timeline is counted by hand (chunks, transfer, the decode side's
  recompute of the last prompt token, then one step per token);
* a request served before everything else, then the rest of the trace moved later: every later request
  takes the same times from its arrival (nothing the engine kept from the first request matters);
* time rescaled with links (a disaggregated fleet's KV link, an offload tier's): every time exactly half;
* a disaggregated summary does not depend on the steps the run keeps.

Relations tried and kept out (the relation was wrong, not kvsim): random draft acceptance shifts with a
request added first (the run's one generator draws for it too); a hybrid or all-sliding model admits
fewer prompts at once than `kvsim capacity`'s sequences (a prefill chunk holds every block of the chunk
until the next step frees what slid out of the window, while the capacity table counts a sequence's
blocks as it decodes).
"""

from __future__ import annotations

import datetime
import json

import numpy as np
import pytest

import kvsim
from kvsim.results.metrics import STEP_COLUMNS, StepTotals
from kvsim.results.together import means_together
from tests.test_metamorphic2 import random_rows, traced, write_trace  # the same trace helpers


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": False}])
def test_a_dense_models_data_parallel_rank_is_the_engine_on_its_share(tmp_path, engine):
    """Two DP ranks of Llama-3.1-8B: rank 0 (which takes the first request, vLLM's balancer picking the
    first on a tie) serves its requests exactly as one engine given only those rows of the trace; rank 1
    the same, its times counted from its own first request. kvsim stepped every DP group in lockstep
    (vLLM does that for MoE models only), so a rank's steps waited for the other's: finishes moved by up
    to 0.39 s."""
    rows = random_rows(np.random.default_rng(3), 80, 6.0)
    group = kvsim.simulate(traced(write_trace(tmp_path / "all.jsonl", rows), {**engine, "data_parallel_size": 2}))
    requests = group.requests
    assert requests.num_preemptions.sum() > 0
    for rank in (0, 1):
        mine = requests[requests.dp_rank == rank].drop(columns="dp_rank").reset_index(drop=True)
        assert len(mine) >= 30
        alone = kvsim.simulate(traced(write_trace(tmp_path / f"r{rank}.jsonl", [rows[i] for i in mine.request_id]),
                                      engine)).requests.assign(request_id=mine.request_id)
        if rank == 0:
            assert alone.equals(mine)
            continue
        start_s = (rows[mine.request_id[0]][0] - rows[0][0]) / 1e9  # each trace counts from its first row
        for column in ("arrival_s", "first_token_s", "finish_s"):
            np.testing.assert_allclose(alone[column] + start_s, mine[column], rtol=1e-12, atol=1e-9)
        others = ["prompt_tokens", "output_tokens", "prefix_hit_tokens", "num_preemptions"]
        assert alone[others].equals(mine[others])


def test_an_independent_groups_step_figures_are_its_engines_merged_in_time(tmp_path):
    """The group's running count at any instant is the sum of what each rank runs then: its max is the
    largest such sum at any step start, its mean the ranks' running·time summed over the time some rank
    steps (the union of their step intervals, also the group's busy time), all counted by hand from the
    ranks' own rows."""
    rows = random_rows(np.random.default_rng(5), 80, 4.0)
    result = kvsim.simulate(traced(write_trace(tmp_path / "t.jsonl", rows), {"data_parallel_size": 2}))
    steps = result.steps
    ranks = [steps[steps.dp_rank == r] for r in (0, 1)]
    assert min(len(r) for r in ranks) > 50

    def running_at(rank, t):
        """What `rank` runs at instants `t`: the running count of its step under way then, else 0."""
        start = rank.time_s.to_numpy()
        i = np.searchsorted(start, t, side="right") - 1
        on = (i >= 0) & (t < start[i] + rank.duration_s.to_numpy()[i])
        return np.where(on, rank["vllm:num_requests_running"].to_numpy()[i], 0)

    instants = steps.time_s.to_numpy()
    assert result.summary["max_running"] == (running_at(ranks[0], instants) + running_at(ranks[1], instants)).max()
    intervals = sorted(zip(steps.time_s, steps.time_s + steps.duration_s, strict=True))
    busy_s, reach = 0.0, -1.0
    for start, end in intervals:  # the union's length
        busy_s += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    work = (steps["vllm:num_requests_running"] * steps.duration_s).sum()
    assert result.summary["mean_running"] == pytest.approx(work / busy_s, rel=1e-9)
    assert result.totals is not None and result.totals.dt == pytest.approx(busy_s, rel=1e-12)
    assert result.summary["num_steps"] == len(steps)


def test_a_fleets_mean_running_is_its_replicas_running_together(tmp_path):
    """Requests 1 s apart, each served alone in well under a second, alternate between two replicas: the
    fleet never runs more than one request, so its mean running (over the time some replica steps, as one
    engine's is over the time it steps) is 1. It was the sum of each replica's own mean, 2. Under load the
    same figure is the replicas' running·time summed over the union of their step intervals, counted by
    hand from the fleet's step rows; a disaggregated pool's likewise."""
    isolated = write_trace(tmp_path / "iso.jsonl", [(i * 10**9, 300 + 10 * i, 20) for i in range(12)])
    fleet = kvsim.simulate(traced(isolated, replicas=2, router={"policy": "least_outstanding"}))
    assert set(fleet.requests.replica) == {0, 1}
    assert fleet.summary["mean_running"] == 1.0

    def by_hand(steps):
        intervals = sorted(zip(steps.time_s, steps.time_s + steps.duration_s, strict=True))
        busy_s, reach = 0.0, -1.0
        for start, end in intervals:
            busy_s += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        return (steps["vllm:num_requests_running"] * steps.duration_s).sum() / busy_s

    loaded = write_trace(tmp_path / "load.jsonl", random_rows(np.random.default_rng(6), 80, 6.0))
    fleet = kvsim.simulate(traced(loaded, replicas=3, router={"policy": "least_kv"}))
    assert fleet.summary["mean_running"] == pytest.approx(by_hand(fleet.steps), rel=1e-9)
    disagg = kvsim.simulate(traced(loaded, replicas=[{"count": 2, "kv_role": "kv_producer"},
                                                     {"count": 1, "kv_role": "kv_consumer"}],
                                   kv_transfer_config={"kv_connector": "NixlConnector"}))
    prefill = disagg.steps[disagg.steps.replica < 2]
    assert disagg.summary["disaggregation"]["pools"]["prefill"]["mean_running"] == pytest.approx(by_hand(prefill), rel=1e-9)


def _union_s(steps):
    """The time some row's step is under way: the union of the rows' step intervals."""
    busy_s, reach = 0.0, -1.0
    for start, end in sorted(zip(steps.time_s, steps.time_s + steps.duration_s, strict=True)):
        busy_s += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return busy_s


def _usage_by_hand(steps, num_blocks):
    """Blocks in use in all the replicas (each row's usage times its replica's pool) over all their blocks,
    time-averaged over the union of the rows' step intervals."""
    busy_s = _union_s(steps)
    used = sum(num_blocks[r] * u * dt for r, u, dt in zip(steps.replica, steps["vllm:kv_cache_usage_perc"],
                                                            steps.duration_s, strict=True))
    return used / (sum(num_blocks[r] for r in set(steps.replica)) * busy_s)


def test_a_fleets_kv_usage_is_its_replicas_blocks_in_use_together(tmp_path):
    """Requests 1 s apart, each served alone, alternate between two replicas of 300 blocks: while one steps,
    the other holds nothing (a finished request's cached blocks count as free), so the fleet's 600 blocks
    are used half as much as the stepping replica's own 300: its mean usage is half the rows' time-weighted
    usage. It was the plain mean of each replica's own mean (each over its own steps), twice that. Under
    load, and with pools of 300 and 900 blocks, the blocks in use summed over the fleet's blocks and the
    union of the step intervals, counted by hand from the step rows; a disaggregated pool's likewise (and
    its requests waiting, summed over its instances, over the same time)."""
    isolated = write_trace(tmp_path / "iso.jsonl", [(i * 10**9, 300 + 10 * i, 20) for i in range(12)])
    fleet = kvsim.simulate(traced(isolated, replicas=2, router={"policy": "least_outstanding"}))
    steps = fleet.steps
    assert set(fleet.requests.replica) == {0, 1}
    rows_mean = (steps["vllm:kv_cache_usage_perc"] * steps.duration_s).sum() / steps.duration_s.sum()
    assert fleet.summary["kv_cache_usage_mean"] == pytest.approx(rows_mean / 2, rel=1e-9)
    old = np.mean([row["kv_cache_usage_mean"] for row in fleet.summary["per_replica"]])
    assert old == pytest.approx(rows_mean, rel=0.05)

    loaded = write_trace(tmp_path / "load.jsonl", random_rows(np.random.default_rng(6), 80, 6.0))
    mixed = kvsim.simulate(traced(loaded, replicas=[{"count": 1}, {"count": 1, "engine": {"num_gpu_blocks_override": 900}}],
                                  router={"policy": "least_kv"}))
    assert [r.summary["num_gpu_blocks"] for r in mixed.replicas] == [300, 900]
    assert mixed.summary["kv_cache_usage_mean"] == pytest.approx(_usage_by_hand(mixed.steps, [300, 900]), rel=1e-9)
    disagg = kvsim.simulate(traced(loaded, replicas=[{"count": 2, "kv_role": "kv_producer"},
                                                     {"count": 1, "kv_role": "kv_consumer"}],
                                   kv_transfer_config={"kv_connector": "NixlConnector"}))
    prefill = disagg.steps[disagg.steps.replica < 2]
    assert disagg.summary["disaggregation"]["pools"]["prefill"]["kv_cache_usage_mean"] == pytest.approx(
        _usage_by_hand(prefill, [300, 300]), rel=1e-9)
    waiting = (prefill["vllm:num_requests_waiting"] * prefill.duration_s).sum() / _union_s(prefill)
    assert disagg.summary["disaggregation"]["pools"]["prefill"]["mean_waiting"] == pytest.approx(waiting, rel=1e-9)


ENGINES = {"v1": {}, "v1-sync": {"async_scheduling": False}, "v0": {"scheduler": "v0"},
           "v0-swap": {"scheduler": "v0", "preemption_mode": "swap"}, "static": {"scheduler": "static"},
           "ngram-all-accepted": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                         "acceptance_rates": 1.0}},
           "offload": {"kv_offload": {"num_cpu_blocks": 200}}, "priority": {"scheduling_policy": "priority"}}


@pytest.mark.parametrize("engine", ENGINES.values(), ids=ENGINES.keys())
def test_a_round_robin_fleet_of_three_is_three_engines_on_every_third_row(tmp_path, engine):
    """Replica k of three identical replicas behind round-robin serves rows k, k + 3, ... of the trace as one
    engine serves those rows alone (its times from its own first row, which arrives row k's time later)."""
    rows = random_rows(np.random.default_rng(21), 90, 4.0)
    fleet = kvsim.simulate(traced(write_trace(tmp_path / "all.jsonl", rows), engine, replicas=3,
                                  router={"policy": "round_robin"})).requests
    if not {"scheduler", "speculative_config"} & set(engine):  # v1 without drafts preempts on this trace
        assert fleet.num_preemptions.sum() > 0
    for k in range(3):
        alone = kvsim.simulate(traced(write_trace(tmp_path / f"{k}.jsonl", rows[k::3]), engine)).requests
        mine = fleet[fleet.replica == k].drop(columns="replica").reset_index(drop=True)
        start_s = (rows[k][0] - rows[0][0]) / 1e9
        for column in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s"):
            np.testing.assert_allclose(alone[column] + start_s, mine[column], rtol=1e-12, atol=1e-9)
        counts = ["prompt_tokens", "output_tokens", "prefix_hit_tokens", "num_preemptions"]
        assert alone[counts].equals(mine[counts])


def disaggregated(path, engine=None, decode=None, link=None, **top):
    raw = traced(path, engine, **top)
    raw.update(replicas=[{"count": 1, "kv_role": "kv_producer"},
                         {"count": 1, "kv_role": "kv_consumer", "engine": decode or {}}],
               kv_transfer_config={"kv_connector": "NixlConnector", **(link or {})})
    return raw


def test_a_prefill_instance_is_the_engine_serving_one_token_per_prompt(tmp_path):
    """vLLM's proxy asks the prefill instance for one token (max_tokens=1); kvsim steps a disaggregated
    instance synchronously. With a decode pool that never waits for blocks and a link that takes no time
    (P frees a prompt's blocks when its transfer ends), the prefill instance's requests are those of a
    synchronous engine given the same rows with one output token each."""
    rows = random_rows(np.random.default_rng(12), 60, 3.0)
    sync = {"async_scheduling": False}
    raw = disaggregated(write_trace(tmp_path / "t.jsonl", rows), decode={"num_gpu_blocks_override": 20000},
                        link={"kv_link_bandwidth_bytes_per_s": 1e18, "kv_link_latency_s": 0.0})
    prefill = kvsim.simulate(raw).replicas[0].requests
    alone = kvsim.simulate(traced(write_trace(tmp_path / "one.jsonl", [(a, p, 1) for a, p, _ in rows]), sync)).requests
    assert alone.first_scheduled_s.gt(alone.arrival_s).sum() >= 10  # prompts queued behind others
    assert prefill[alone.columns].equals(alone)


@pytest.mark.parametrize(("bandwidth", "latency_s"), [(1e9, 0.003), (50e9, 2e-5)])
def test_an_isolated_disaggregated_request_counted_by_hand(tmp_path, bandwidth, latency_s):
    """A 10 ms step, prompts of P tokens in chunks of 256: the prefill instance takes ceil(P / 256) steps;
    the prompt's ceil(P / 16) blocks of 16 tokens · 128 KiB (Llama-3.1-8B) cross the link in latency +
    bytes / bandwidth; the decode instance recomputes the last prompt token to sample the first token the
    client sees (one step), then one step per further token."""
    step_s = 0.01
    rng = np.random.default_rng(0)
    rows = [(i * 100 * 10**9, int(rng.integers(1, 1500)), int(rng.integers(1, 50))) for i in range(8)]
    raw = disaggregated(write_trace(tmp_path / "t.jsonl", rows), {"max_num_batched_tokens": 256, "max_num_seqs": 64},
                        link={"kv_link_bandwidth_bytes_per_s": bandwidth, "kv_link_latency_s": latency_s},
                        latency={"model": "constant", "step_s": step_s})
    requests = kvsim.simulate(raw).requests
    for (arrival_ns, prompt, output), request in zip(rows, requests.itertuples(), strict=True):
        transfer_s = latency_s + -(-prompt // 16) * 16 * 2**17 / bandwidth
        ttft_s = -(-prompt // 256) * step_s + transfer_s + step_s
        assert request.ttft_s == pytest.approx(ttft_s, rel=1e-9)
        assert request.finish_s - arrival_ns / 1e9 == pytest.approx(ttft_s + (output - 1) * step_s, rel=1e-9)


@pytest.mark.parametrize("engine", [{}, {"scheduler": "v0"}, {"kv_offload": {"num_cpu_blocks": 200}},
                                    {"data_parallel_size": 2}], ids=["v1", "v0", "offload", "dp2"])
def test_a_request_served_first_changes_nothing_for_the_rest_moved_later(tmp_path, engine):
    """One short request, then the trace 40 s later: every request of the trace takes the same time from its
    arrival to its first schedule, first token and end, with the same hits and preemptions (40 s is far
    longer than the first request; its cached blocks hold tokens no other prompt has)."""
    rows = random_rows(np.random.default_rng(11), 60, 5.0)
    first = (rows[0][0], 50, 3)
    alone = kvsim.simulate(traced(write_trace(tmp_path / "a.jsonl", rows), engine)).requests
    later = kvsim.simulate(traced(write_trace(tmp_path / "b.jsonl", [first] + [(a + 40 * 10**9, p, o) for a, p, o in rows]),
                                  engine)).requests.iloc[1:].reset_index(drop=True)
    assert alone.num_preemptions.sum() > 0
    np.testing.assert_allclose(later.arrival_s, alone.arrival_s + 40, rtol=1e-12)
    for column in ("queue_s", "ttft_s", "e2e_s"):
        np.testing.assert_allclose(later[column], alone[column], rtol=1e-9, atol=1e-9)
    counts = ["prompt_tokens", "output_tokens", "prefix_hit_tokens", "num_preemptions"]
    assert later[counts].equals(alone[counts])


def test_a_disaggregated_summary_does_not_depend_on_the_steps_kept(tmp_path):
    """`steps: none | sampled | all` changes what a run keeps, never its summary: a disaggregated pool's
    mean_waiting (its instances' waiting summed, time-averaged over the time some instance steps; here one
    instance, by hand from every step row) read the rows the run kept, so it was 0 with `steps: none`."""
    raw = disaggregated(write_trace(tmp_path / "t.jsonl", random_rows(np.random.default_rng(6), 80, 6.0)))
    every = kvsim.simulate({**raw, "steps": "all"})
    steps = every.steps[every.steps.replica == 0]
    prefill = (steps["vllm:num_requests_waiting"] * steps.duration_s).sum() / steps.duration_s.sum()
    assert prefill > 1
    assert every.summary["disaggregation"]["pools"]["prefill"]["mean_waiting"] == pytest.approx(prefill, rel=1e-12)
    for mode in ("none", "sampled"):
        assert json.dumps(kvsim.simulate({**raw, "steps": mode}).summary) == json.dumps(every.summary)


def test_a_pools_mean_waiting_is_its_instances_waiting_together():
    """Instance A steps once, [0, 0.1) s, with 10 requests waiting; instance B steps nine times over
    [0, 0.9) s with none waiting. The pool had 10 waiting for 0.1 s of the 0.9 s some instance stepped:
    10 · 0.1 / 0.9. The sum of each instance's waiting averaged over its own steps said 10, as if A's
    queue had stood all along."""
    def steps(starts, duration_s, waiting):
        n = len(starts)
        columns = dict.fromkeys(STEP_COLUMNS, np.zeros(n))
        return {**columns, "time_s": np.asarray(starts, dtype=float), "duration_s": np.full(n, duration_s),
                "vllm:num_requests_waiting": np.full(n, waiting), "free": np.ones(n)}

    a = StepTotals.of(steps([0.0], 0.1, 10))
    b = StepTotals.of(steps([0.1 * i for i in range(9)], 0.1, 0))
    assert means_together([a, b], [1, 1])["mean_waiting"] == pytest.approx(10 * 0.1 / 0.9, rel=1e-12)
    assert means_together([a], [1])["mean_waiting"] == pytest.approx(10.0, rel=1e-12)


SMALL = {"model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": 2,
         "engine": {"max_model_len": 4096, "num_gpu_blocks_override": 300},
         "workload": {"num_requests": 120, "prompt_len": {"dist": "lognormal", "mean": 300, "p99": 1500},
                      "output_len": {"dist": "lognormal", "mean": 200, "p99": 800},
                      "shared_prefix": {"tokens": 512, "fraction": 0.6, "num_prefixes": 3}}}


@pytest.mark.parametrize("what", ["disaggregated", "offload"])
def test_doubling_every_rate_and_link_halves_every_time_exactly(what):
    """Round one's time rescaling (`test_metamorphic.py`) with links: arrival rate and link bandwidth doubled,
    step time and link latency halved. A transfer's latency + bytes / bandwidth halves exactly (powers of
    two), so every decision is the same and every time is exactly half."""
    def run(scale):
        raw = {**SMALL, "latency": {"model": "constant", "step_s": 0.01 / scale},
               "workload": {**SMALL["workload"], "arrival": {"process": "poisson", "rate": 12.0 * scale}}}
        if what == "disaggregated":
            raw.update(replicas=[{"count": 2, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}],
                       kv_transfer_config={"kv_connector": "NixlConnector", "kv_link_bandwidth_bytes_per_s": 1e9 * scale,
                                           "kv_link_latency_s": 0.002 / scale})
        else:
            raw["engine"] = {**SMALL["engine"], "kv_offload": {"num_cpu_blocks": 300, "bandwidth_bytes_per_s": 4e9 * scale}}
        return kvsim.simulate(raw)

    slow, fast = run(1), run(2)
    assert slow.summary["num_preemptions"] > 0
    times = ["arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s"]
    np.testing.assert_array_equal(fast.requests[times].to_numpy(), slow.requests[times].to_numpy() / 2)
    others = [c for c in slow.requests.columns if c not in times]
    assert fast.requests[others].equals(slow.requests[others])
    assert fast.summary["duration_s"] == slow.summary["duration_s"] / 2


@pytest.mark.parametrize("engine", [{"async_scheduling": False}, {"scheduler": "v0"},
                                    {"scheduler": "static", "max_num_batched_tokens": 16384},  # batches of 8+
                                    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                            "acceptance_rates": 0.6}}],
                         ids=["v1-sync", "v0", "static", "ngram"])
def test_running_time_is_the_requests_time_in_service(tmp_path, engine):
    """Little's law over the run, exact: without preemption a request is running in every step from the one it
    is scheduled in to the one that samples its last token, and the engine steps back to back meanwhile, so
    Σ running · step time over the steps is Σ (finish − first scheduled) over the requests. (With async
    scheduling a step is planned, and its requests stamped scheduled, while the previous step runs, as
    vLLM's SCHEDULED event is: the relation is for engines that plan at the step's start; n-gram drafting
    keeps vLLM synchronous.)"""
    rows = random_rows(np.random.default_rng(8), 60, 3.0, max_output=120)
    result = kvsim.simulate(traced(write_trace(tmp_path / "t.jsonl", rows),
                                   {**engine, "num_gpu_blocks_override": 6000}))
    steps, requests = result.steps, result.requests
    assert result.summary["num_preemptions"] == 0 and result.summary["max_running"] >= 8
    running_s = (steps["vllm:num_requests_running"] * steps.duration_s).sum()
    assert running_s == pytest.approx((requests.finish_s - requests.first_scheduled_s).sum(), rel=1e-12)


def test_one_trace_in_three_formats_is_one_run(tmp_path):
    """The same rows as token-level ShareGPT (ns), Mooncake (ms, a hash id of its own per 512-token block) and
    Azure (timestamps with 100 ns digits) give the same requests: arrivals within float rounding of the exact
    (t − t0), everything else equal. Azure's timestamps were seconds since the epoch as floats (about 0.24 µs
    apart near 1.7e9 s) before the first row's was taken off: arrivals were up to 0.2 µs off, and rows
    100 ns apart came 0 or 238 ns apart."""
    rng = np.random.default_rng(9)
    n = 60
    rows = [(int(t) * 10**6, int(p), int(o)) for t, p, o in
            zip(np.sort(rng.integers(0, 5000, n)) + 1_234_567, rng.integers(1, 1200, n), rng.integers(1, 300, n),
                strict=True)]
    base = datetime.datetime(2023, 11, 16, 18, 0, 0)
    azure = tmp_path / "t.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"{(base + datetime.timedelta(microseconds=t // 1000)).isoformat(' ', 'microseconds')}0,{p},{o}\n"
        for t, p, o in rows))
    mooncake, first_id = tmp_path / "t.jsonl", 0
    with mooncake.open("w") as f:
        for t, p, o in rows:
            blocks = -(-p // 512)
            f.write(json.dumps({"timestamp": t // 10**6, "input_length": p, "output_length": o,
                                "hash_ids": list(range(first_id, first_id + blocks))}) + "\n")
            first_id += blocks
    share = kvsim.simulate(traced(write_trace(tmp_path / "s.jsonl", rows))).requests
    assert share.num_preemptions.sum() > 0
    exact_s = np.array([(t - rows[0][0]) / 1e9 for t, _, _ in rows])
    for fmt, path in (("azure", azure), ("mooncake", mooncake)):
        raw = traced(str(path))
        raw["workload"]["trace"] = {"format": fmt, "path": str(path)}
        requests = kvsim.simulate(raw).requests
        np.testing.assert_allclose(requests.arrival_s, exact_s, rtol=0, atol=1e-12)
        np.testing.assert_allclose(requests.finish_s, share.finish_s, rtol=0, atol=1e-9)
        counts = ["prompt_tokens", "output_tokens", "prefix_hit_tokens", "num_preemptions"]
        assert requests[counts].equals(share[counts])
    ticks = tmp_path / "ticks.csv"
    ticks.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\n"
                     "2023-11-16 18:15:46.6805901,10,2\n2023-11-16 18:15:46.6805903,10,2\n")
    raw = traced(str(ticks))
    raw["workload"]["trace"] = {"format": "azure", "path": str(ticks)}
    np.testing.assert_allclose(kvsim.simulate(raw).requests.arrival_s, [0.0, 1e-7, 3e-7], rtol=1e-12, atol=0)
