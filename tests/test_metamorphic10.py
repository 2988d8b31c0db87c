"""Metamorphic and differential relations, tenth round: a run's own books, recomputed from its other outputs.

`test_metamorphic.py` to `test_metamorphic9.py` hold the earlier rounds (round six: each request's first token and
end at step ends, TTFT/TPOT/E2E as those instants' differences, output rate × duration = tokens, preemptions the
requests', `steps: none`'s summary; round seven: step limits per scheduler and Little's law). Here, a naive pandas
second implementation of `summary.json` from the requests and step tables, written in the test, for runs of 60
requests on a 300-block pool with a shared system prompt, `max_num_seqs` 12 and a 1,024-token budget (both bind):
a v1 engine (30 preemptions of 23 requests, 14,672 prefix-hit tokens), v0, synchronous v1 (v1 plans
asynchronously by default), n-gram speculation, a 200-block CPU offload tier, a least-outstanding fleet of 3, a
1P2D disaggregated fleet and an autoscaled fleet:

* every figure the summary prints is its definition over the tables, to 1e-12 relative (summation order moves
  the last digits of the printed `repr`), in memory and read back from requests.csv, steps.csv or steps.parquet
  and summary.json: requests, finished and rejected counts; steps; duration = last step end − first arrival;
  output tokens and requests a second over it; TTFT, TPOT, E2E and queue time's mean, p50, p90 and p99 by a
  hand-written linear-interpolation percentile (numpy's default, as `vllm bench` takes them); the per-token ITL
  mean (Σ (finish − first token) / Σ (O − 1)); peak running; running and KV usage weighted by step time; the
  saturated window (the steps with a request waiting: their time, mean running, preemptions a second); the waste
  shares and the sharing saving over the steps that hold KV; v1's prefix-cache queries (every prompt token, at
  first admissions: 35,682) and hits (the requests' first-admission hits);
* a fleet's figures are its replicas' rows together: duration, throughput and percentiles over every request;
  `mean_running` Σ running · dt over the time some replica steps (a naive union of the step intervals: 9.855 for
  the fleet of 3), KV usage likewise over the three pools; each replica's `mean_running`, KV usage, hit rate,
  request count and p90s from its own rows; the prefix counters summed; a 1P2D fleet's pools likewise (prefill
  1.051 running, utilization 0.088 = its step time over the run; decode 9.989 and 0.976, averaged over its two
  instances), one transfer a request, each no faster than its bytes over the link plus its latency (mean 1.091 ms
  against 0.993 ms alone: the prefill instance's link is shared);
* per request (vLLM's `RequestStateStats`): arrival ≤ first scheduled ≤ first token ≤ finish; `queue_s` is the
  first scheduled instant − arrival however often the request was preempted after (vLLM sets `scheduled_ts` on
  the first SCHEDULED event only); E2E = TTFT + (O − 1) · TPOT; finish = arrival + E2E;
* per engine, per step: duration > 0, no two steps overlap, running ≤ `max_num_seqs`, tokens ≤ the budget, and Σ
  durations ≤ the makespan (to 1e-12: the offload run's engine, stepping back to back, is 1.2e-14 s over, rounding);
* an offload tier's books (vLLM's CPU backend keeps a block it loads: a load copies): blocks stored = blocks
  evicted + blocks held at the end (2,126 = 1,926 + 200); bytes stored and loaded are blocks × 2 MiB (by hand:
  16 · 2 · 8 · 128 · 2 · 32 layers); hit tokens 16 a block, the recompute avoided; loads no faster than their bytes
  over the link (mean 0.345 ms against 0.270 ms alone); the store link's busy fraction its bytes over its
  bandwidth over the run;
* an autoscaled fleet's decisions replay from its recorded load: a naive HPA rule (raw ceil(current · metric /
  target) outside the tolerance, stabilisation windows, the scaling policies on the count a period ago) on
  scaling.csv's metric gives its `desired` at every sync (1 to 6 replicas, limited up and down; on waiting
  requests, target 2 a replica, and on KV usage, target 0.3), READY + STARTING
  is that count, the replicas starting those asked for under `startup_s` before, and the GPU-hours the slots on
  over each sync's interval to the last request's end.

Relations tried and kept out (the relation was wrong, not kvsim): "bytes stored = loaded + evicted + left" (a load
does not take a block out of the tier; the balance above is the tier's); under offload, the requests' hits exceed
the summary's (vLLM's per-request `num_cached_tokens` counts the tokens its connector loads, `prefix_cache_stats`
only the GPU's): GPU hits ≤ Σ request hits ≤ GPU hits + tokens loaded (14,848 < 15,024 ≤ 18,272); a disaggregated
transfer at exactly bytes / bandwidth + latency (transfers share the link); an async-scheduling run as a new run
(v1's default already is one).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

import kvsim

SMALL = {
    "model": "llama-3.1-8b", "gpu": "h100-80gb", "seed": 0,
    "engine": {"max_model_len": 4096, "num_gpu_blocks_override": 300, "max_num_seqs": 12, "max_num_batched_tokens": 1024},
    "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 12.0},
                 "prompt_len": {"dist": "lognormal", "mean": 300, "p99": 1500},
                 "output_len": {"dist": "lognormal", "mean": 200, "p99": 800},
                 "shared_prefix": {"tokens": 512, "fraction": 0.6, "num_prefixes": 3}},
}
BLOCK_BYTES = 16 * 2 * 8 * 128 * 2 * 32  # llama-3.1-8b: 16 tokens · K and V · 8 KV heads · 128 dims · bf16 · 32 layers
DISAGG = {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_link": "rdma"},
          "replicas": [{"count": 1, "kv_role": "kv_producer"}, {"count": 2, "kv_role": "kv_consumer"}]}


def variant(engine=None, **top):
    return {**SMALL, **top, "engine": {**SMALL["engine"], **(engine or {})}}


SINGLE = {
    "v1": variant(),
    "v0": variant({"scheduler": "v0", "max_num_batched_tokens": 4096}),  # v0 takes whole prompts (no chunking)
    "sync": variant({"async_scheduling": False}),  # v1 plans asynchronously by default (vLLM PR #27614)
    "ngram": variant({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rates": 0.5}}),
    "offload": variant({"kv_offload": {"num_cpu_blocks": 200}}),
}
FLEETS = {"fleet3": variant(replicas=3, router={"policy": "least_outstanding"}), "1p2d": variant(**DISAGG)}
_RUNS: dict[str, kvsim.RunResult] = {}


def result(name):
    """The run `name`, every step kept (computed once a session)."""
    if name not in _RUNS:
        _RUNS[name] = kvsim.simulate({**SINGLE, **FLEETS}[name], steps="all")
    return _RUNS[name]


def naive_percentile(values, q):
    """The q-th percentile by linear interpolation between the closest ranks, by hand."""
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return None
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


def naive_stats(values):
    values = [float(v) for v in values]
    kept = [v for v in values if not math.isnan(v)]
    return {"mean": sum(kept) / len(kept) if kept else None,
            **{f"p{q}": naive_percentile(values, q) for q in (50, 90, 99)}}


def union_s(intervals):
    """The length of a union of [start, end) intervals, merged one by one in start order."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def close(actual, expected):
    """Equal to 1e-12 relative (summation order moves the last digits), None and ints exactly."""
    if expected is None or actual is None or isinstance(expected, int):
        return actual == expected
    return actual == pytest.approx(expected, rel=1e-12, abs=1e-15)


def request_figures(requests, steps):
    """The summary's request figures, by definition from the two tables."""
    finished = requests[requests.status == "finished"]
    duration = float((steps.time_s + steps.duration_s).max() - requests.arrival_s.min())
    tokens = int((finished.output_tokens * finished.num_samples).sum())
    decoded = finished[finished.output_tokens > 1]
    return {
        "num_requests": len(requests), "num_finished": len(finished),
        "num_rejected": int((requests.status == "rejected").sum()),
        "duration_s": duration, "output_tokens_per_s": tokens / duration, "requests_per_s": len(finished) / duration,
        **{key: naive_stats(requests[key]) for key in ("ttft_s", "tpot_s", "e2e_s", "queue_s")},
        "itl": float((decoded.finish_s - decoded.first_token_s).sum() / (decoded.output_tokens - 1).sum()),
    }


def weighted(values, weights):
    total = float(weights.sum())
    return float((values * weights).sum()) / total if total > 0 else None


def assert_figures(summary, expected):
    for key, value in expected.items():
        got = summary[key]
        if isinstance(value, dict):
            assert set(got) == set(value) and all(close(got[k], v) for k, v in value.items()), (key, got, value)
        else:
            assert close(got, value), (key, got, value)


@pytest.mark.parametrize("name", list(SINGLE))
def test_a_single_engines_summary_is_its_tables_by_definition(name):
    run = result(name)
    check_single_summary(name, run.requests, run.steps, run.summary)


@pytest.mark.parametrize("steps_format", ["csv", "parquet"])
@pytest.mark.parametrize("name", ["v1", "offload", "fleet3"])
def test_the_written_files_give_the_same_books(tmp_path, name, steps_format):
    """The relations hold on what `kvsim run` writes (requests.csv, steps.csv or steps.parquet, summary.json):
    the files print every float whole (`repr`'s shortest round trip), so nothing is lost on the way."""
    pytest.importorskip("pyarrow")
    result(name).write(tmp_path / "out", steps_format=steps_format)
    requests = pd.read_csv(tmp_path / "out" / "requests.csv")
    steps = getattr(pd, f"read_{steps_format}")(tmp_path / "out" / f"steps.{steps_format}")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    if name in SINGLE:
        check_single_summary(name, requests, steps, summary)
    else:
        figures = request_figures(requests, steps)
        figures.pop("itl")
        assert_figures(summary, {**figures, "mean_running": together(steps, "vllm:num_requests_running"),
                                 "kv_cache_usage_mean": together(steps, "vllm:kv_cache_usage_perc", pools=3)})


def check_single_summary(name, requests, steps, summary):
    """The single engine's summary figures by their definitions over its requests and step rows."""
    figures = request_figures(requests, steps)
    itl = figures.pop("itl")
    dt = steps.duration_s
    running = steps["vllm:num_requests_running"]
    queued = dt * (steps["vllm:num_requests_waiting"] > 0)
    holding = dt * (steps.held_slots > 0)
    new_preemptions = steps["vllm:num_preemptions_total"].diff().fillna(steps["vllm:num_preemptions_total"].iloc[0])
    shares = [c for c in steps.columns if c in ("token_state", "reserved", "internal_frag", "slack", "external_frag",
                                                  "free", "draft_rejected")]
    assert_figures(summary, {
        **figures, "num_steps": len(steps), "inter_token_latency_s": {"mean": itl},
        "max_running": int(running.max()), "mean_running": weighted(running, dt),
        "kv_cache_usage_perc": {"mean": weighted(steps["vllm:kv_cache_usage_perc"], dt),
                                "max": float(steps["vllm:kv_cache_usage_perc"].max())},
        "num_preemptions": int(requests.num_preemptions.sum()),
        "waste": {k: weighted(steps[k], holding) for k in shares},
        "sharing_saving": float((steps.shared_slots * holding).sum()
                                / ((steps.held_slots + steps.shared_slots) * holding).sum()),
    })
    saturated = summary["saturated"]
    assert close(saturated["duration_s"], float(queued.sum()))
    assert close(saturated["mean_running"], weighted(running, queued))
    assert close(saturated["preemptions_per_s"], float(new_preemptions[queued > 0].sum()) / float(queued.sum()))
    assert summary["num_preemptions"] > 0 and saturated["reason"] is None  # the pool binds in every run
    if name == "v0":  # v0 counts blocks queried at every admission; without prefix caching none (its default)
        assert summary["num_prefix_cache_query_tokens"] == summary["num_prefix_cache_hit_tokens"] == 0
        return
    assert summary["num_prefix_cache_query_tokens"] == requests.prompt_tokens.sum()  # every admission's first
    hits = int(requests.prefix_hit_tokens.sum())
    if name == "offload":  # the requests' hits count the tokens the connector loaded too (module docstring)
        loaded = summary["kv_offload"]["tiers"]["cpu"]["num_hit_tokens"]
        assert summary["num_prefix_cache_hit_tokens"] < hits <= summary["num_prefix_cache_hit_tokens"] + loaded
    else:
        assert summary["num_prefix_cache_hit_tokens"] == hits > 0


def busy_s(steps):
    return union_s(list(zip(steps.time_s, steps.time_s + steps.duration_s, strict=True)))


def together(steps, column, pools=1):
    """A column summed over engines side by side, weighted by step time, over the time some engine steps (over
    `pools` equal pools: KV usage is the share of all their blocks)."""
    return float((steps[column] * steps.duration_s).sum()) / busy_s(steps) / pools


@pytest.mark.parametrize("name", list(FLEETS))
def test_a_fleets_summary_is_its_replicas_rows_together(name):
    run = result(name)
    requests, steps, summary = run.requests, run.steps, run.summary
    figures = request_figures(requests, steps)
    figures.pop("itl")  # a fleet's summary has no ITL
    assert_figures(summary, {
        **figures, "num_replicas": 3, "mean_running": together(steps, "vllm:num_requests_running"),
        "kv_cache_usage_mean": together(steps, "vllm:kv_cache_usage_perc", pools=3),
        "num_preemptions": int(steps.groupby("replica")["vllm:num_preemptions_total"].max().sum()),
    })
    assert summary["num_preemptions"] == requests.num_preemptions.sum()
    for i, (row, replica) in enumerate(zip(summary["per_replica"], run.replicas, strict=True)):
        own = steps[steps.replica == i]
        assert row["replica"] == i and len(own) == len(replica.steps)
        assert close(row["mean_running"], weighted(own["vllm:num_requests_running"], own.duration_s))
        assert close(row["kv_cache_usage_mean"], weighted(own["vllm:kv_cache_usage_perc"], own.duration_s))
        queries, hits = replica.summary["num_prefix_cache_query_tokens"], replica.summary["num_prefix_cache_hit_tokens"]
        assert close(row["prefix_cache_hit_rate"], hits / queries)
        if name == "fleet3":  # a colocated replica serves its rows of requests.csv whole
            served = requests[requests.replica == i]
            assert row["num_requests"] == len(served) == len(replica.requests) > 0
            assert queries == served.prompt_tokens.sum() and hits == served.prefix_hit_tokens.sum()
            for key in ("ttft", "tpot", "e2e"):
                assert close(row[f"{key}_p90_s"], naive_percentile(served[f"{key}_s"], 90))
    for key in ("query", "hit"):
        assert summary[f"num_prefix_cache_{key}_tokens"] == sum(
            r.summary[f"num_prefix_cache_{key}_tokens"] for r in run.replicas)
    if name == "1p2d":  # one transfer a request, the prefill pool the engine 0's steps, the decode pool 1's and 2's
        disagg = summary["disaggregation"]
        assert disagg["num_transfers"] == summary["num_finished"] == 60
        assert disagg["prefill_queue_s"] == summary["queue_s"]  # a request is queued only before its prefill
        alone_s = disagg["bytes_moved"] / 60 / disagg["kv_link_bandwidth_bytes_per_s_per_gpu"] + disagg["kv_link_latency_s"]
        assert disagg["transfer_s"]["mean"] >= alone_s  # each transfer its bytes over the link and its latency, or
        # slower where transfers share the prefill instance's link
        for pool, rows, count in (("prefill", steps[steps.replica == 0], 1), ("decode", steps[steps.replica > 0], 2)):
            books = disagg["pools"][pool]
            assert books["num_instances"] == count  # utilization: each instance's share of the run stepping, averaged
            assert close(books["utilization"], float(rows.duration_s.sum()) / (summary["duration_s"] * count))
            assert close(books["kv_cache_usage_mean"], together(rows, "vllm:kv_cache_usage_perc", pools=count))
            assert close(books["mean_running"], together(rows, "vllm:num_requests_running"))
            assert close(books["mean_waiting"], together(rows, "vllm:num_requests_waiting"))
            assert close(books["num_preemptions"], int(rows.groupby("replica")["vllm:num_preemptions_total"].max().sum()))


@pytest.mark.parametrize("name", [*SINGLE, *FLEETS])
def test_a_requests_instants_are_ordered_and_its_times_their_differences(name):
    """vLLM's `RequestStateStats`: queued, first scheduled, first token, last token, in that order; `queue_s`
    is the first SCHEDULED event's time less the arrival (`scheduled_ts` is set once), preempted or not;
    E2E = TTFT + (O − 1) · TPOT (TPOT over the tokens after the first)."""
    requests = result(name).requests
    done = requests[requests.status == "finished"]
    assert len(done) == 60
    assert (done.arrival_s <= done.first_scheduled_s).all() and (done.first_scheduled_s <= done.first_token_s).all()
    assert (done.first_token_s <= done.finish_s).all()
    assert np.allclose(done.queue_s, done.first_scheduled_s - done.arrival_s, rtol=0, atol=1e-12)
    preempted = done[done.num_preemptions > 0]
    assert len(preempted) > 0 or name == "fleet3"  # the first wait alone, however long the later ones
    assert (preempted.queue_s < preempted.ttft_s).all()
    many = done[done.output_tokens > 1]
    assert np.allclose(many.e2e_s, many.ttft_s + (many.output_tokens - 1) * many.tpot_s, rtol=1e-12, atol=1e-12)
    assert np.allclose(done.finish_s, done.arrival_s + done.e2e_s, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", [*SINGLE, *FLEETS])
def test_an_engines_steps_keep_their_limits_and_never_overlap(name):
    run = result(name)
    steps, engine = run.steps, run.scenario.engine
    groups = steps.groupby("replica") if "replica" in steps else [(0, steps)]
    for _, own in groups:
        start, end = own.time_s.to_numpy(), (own.time_s + own.duration_s).to_numpy()
        assert (own.duration_s > 0).all() and (start[1:] >= end[:-1]).all()
        assert own.duration_s.sum() <= run.summary["duration_s"] * (1 + 1e-12)
        assert (own["vllm:num_requests_running"] <= engine.max_num_seqs).all()
        assert (own.num_batched_tokens <= engine.max_num_batched_tokens).all()
    if name in ("v1", "sync", "ngram", "offload"):  # the limits bind (a precondition: the relation is exercised)
        assert steps["vllm:num_requests_running"].max() == engine.max_num_seqs
        assert steps.num_batched_tokens.max() == engine.max_num_batched_tokens


def test_an_offload_tiers_books_balance():
    summary = result("offload").summary
    books, cpu = summary["kv_offload"], summary["kv_offload"]["tiers"]["cpu"]
    assert cpu["num_stored_blocks"] == cpu["num_evicted_blocks"] + cpu["num_held_blocks_at_end"]
    assert cpu["num_held_blocks_at_end"] <= cpu["num_blocks"] == 200 and cpu["num_evicted_blocks"] > 0
    assert cpu["bytes"] == 200 * BLOCK_BYTES
    assert books["bytes_stored"] == cpu["bytes_stored"] == cpu["num_stored_blocks"] * BLOCK_BYTES
    assert books["bytes_loaded"] == cpu["bytes_loaded"] == cpu["num_hit_blocks"] * BLOCK_BYTES > 0
    assert books["recompute_avoided_tokens"] == cpu["num_hit_tokens"] == 16 * cpu["num_hit_blocks"]
    bandwidth = cpu["load_bandwidth_bytes_per_s"]
    assert books["load_s_mean"] >= books["bytes_loaded"] / books["num_loads"] / bandwidth  # a shared link only slows
    busy = books["bytes_stored"] / books["store_bandwidth_bytes_per_s"] / summary["duration_s"]
    assert close(books["store_link_busy_fraction"], busy)  # every store drained before the run ended


AUTO = {"metric": "num_requests_waiting", "target": 2, "min_replicas": 1, "max_replicas": 6, "tolerance": 0.1,
        "sync_period_s": 0.7, "scale_up_window_s": 1.3, "scale_down_window_s": 2.9, "scale_up_pods": 1,
        "scale_up_percent": 50, "scale_up_period_s": 2.2, "scale_down_percent": 50, "scale_down_period_s": 1.9,
        "startup_s": 1.5}
"""Windows and periods no multiple of the sync period (round six leaves a window's exact edge unsettled), and
policies that bind: one pod or 50 % more per 2.2 s, half as many per 1.9 s."""


def hpa_replay(times, metrics, initial, spec):
    """Kubernetes HPA's rule (`kvsim.fleet.autoscaler`'s docstring, kubernetes.io's algorithm details), naively:
    per sync, the raw recommendation ceil(current · metric / target) (kept within the tolerance), clamped; the
    lowest raw of the last scale-up window for a scale-up, the highest of the last scale-down window for a
    scale-down; then the policies on the count one period ago (now's less the changes made strictly after)."""
    raws, changes, counts, current = [], [], [], initial
    for now, metric in zip(times, metrics, strict=True):
        ratio = metric / spec["target"]
        raw = current if abs(ratio - 1) <= spec["tolerance"] else math.ceil(current * ratio)
        raws.append((now, min(max(raw, spec["min_replicas"]), spec["max_replicas"])))
        raw = raws[-1][1]
        desired = current
        if raw > current:
            desired = max(current, min(r for t, r in raws if t >= now - spec["scale_up_window_s"]))
            start = current - sum(n for t, n in changes if t > now - spec["scale_up_period_s"])
            limit = max(start + spec["scale_up_pods"], math.ceil(start * (1 + spec["scale_up_percent"] / 100)))
            desired = min(desired, max(limit, current))
        elif raw < current:
            desired = min(current, max(r for t, r in raws if t >= now - spec["scale_down_window_s"]))
            start = current - sum(n for t, n in changes if t > now - spec["scale_down_period_s"])
            limit = math.floor(start * (1 - spec["scale_down_percent"] / 100))
            desired = max(desired, min(limit, current))
        if desired != current:
            changes.append((now, desired - current))
        counts.append(desired)
        current = desired
    return counts


@pytest.mark.parametrize("metric", [{}, {"metric": "kv_cache_usage_perc", "target": 0.3}], ids=["waiting", "kv"])
def test_an_autoscaled_fleets_decisions_replay_from_its_recorded_load(metric):
    """Each sync's count is the HPA rule on the metric the run recorded for it (after the HPA's treatment of
    replicas not ready yet), from the count the previous sync left; READY + STARTING is that count, and the
    replicas starting are those asked for less than `startup_s` before (no start is cancelled here). The bill is
    the slots on (READY, STARTING, DRAINING: switched only at syncs) over each sync's interval, the last one to
    the last request's end; the summary's request and running figures are the fleet's, as a static one's."""
    spec = {**AUTO, **metric}
    raw = variant(replicas=1, router={"policy": "least_outstanding"}, autoscaler=spec)
    raw["workload"] = {**raw["workload"], "num_requests": 200, "arrival": {"process": "poisson", "rate": 25.0}}
    run = kvsim.simulate(raw, steps="all")
    scaling, requests, steps, summary = run.tables["scaling"], run.requests, run.steps, run.summary
    counts = hpa_replay(scaling.time_s.tolist(), scaling.metric.tolist(), 1, spec)
    assert scaling.desired.tolist() == counts
    assert (scaling.num_ready + scaling.num_starting == scaling.desired).all()
    ups = np.diff(counts, prepend=1)
    assert max(counts) == 6 and (ups > 0).sum() >= 3 and (ups < 0).sum() >= 2  # it scales up, limited, and down
    assert all(scaling.num_starting[k - 1] == 0 for k in np.flatnonzero(ups < 0))  # no start is ever cancelled
    for k, now in enumerate(scaling.time_s):
        recent = ((scaling.time_s <= now) & (scaling.time_s > now - AUTO["startup_s"])).to_numpy()
        assert scaling.num_starting[k] == ups[recent].clip(min=0).sum()
    figures = request_figures(requests, steps)
    figures.pop("itl")
    assert_figures(summary, {**figures, "mean_running": together(steps, "vllm:num_requests_running")})
    on = (scaling.num_ready + scaling.num_starting + scaling.num_draining).to_numpy()
    gpu_s = float((on * np.diff(scaling.time_s.to_numpy(), append=requests.finish_s.max())).sum())
    books, tokens = summary["autoscaling"], int(requests.output_tokens.sum())
    assert close(books["gpu_hours"], gpu_s / 3600) and close(books["billed_span_s"], summary["duration_s"])
    assert close(books["mean_gpus"], gpu_s / summary["duration_s"])
    assert close(books["gpu_hours_per_million_output_tokens"], gpu_s / 3600 / tokens * 1e6)
