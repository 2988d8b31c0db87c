"""Metamorphic relations, third round: deployments that must decompose into engines, and workloads moved
in time or in the pool in ways that, by vLLM's semantics, change known parts of the result.

`test_metamorphic.py` (a fleet of one, one DP rank, one priority, time rescaled, presets as files) and
`test_metamorphic2.py` (settings that never bind, FIFO service, hit arithmetic, causality, a round-robin
replica's share) hold the earlier rounds. Here:

* a dense model's data-parallel ranks are independent engines (vLLM's `run_engine_core`: "Non-MoE DP
  ranks are completely independent"): each rank serves its requests exactly as one engine given them,
  and the group's step figures are the engines' own, merged in time;
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import kvsim


def write_trace(path, rows):
    """A `sharegpt_tokens` trace of (arrival_ns, prompt, output) rows (arrivals count from the first row)."""
    with path.open("w") as f:
        for arrival_ns, prompt, output in rows:
            f.write(json.dumps({"arrival_time_ns": int(arrival_ns), "input_toks": int(prompt),
                                "output_toks": int(output)}) + "\n")
    return str(path)


def traced(path, engine=None, **top):
    return {"model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": 0, **top,
            "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 300, **(engine or {})},
            "workload": {"num_requests": 10**6, "arrival": {"process": "trace"},
                         "trace": {"format": "sharegpt_tokens", "path": path}}}


def random_rows(rng, n, span_s, max_prompt=1200, max_output=300):
    arrivals = np.sort(rng.integers(0, int(span_s * 1e9), n))
    return list(zip(arrivals, rng.integers(1, max_prompt, n), rng.integers(1, max_output, n), strict=True))


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
