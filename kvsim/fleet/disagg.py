"""Disaggregated prefill/decode (xPyD), as vLLM runs it with a P2P connector (NIXL) behind its proxy.

    kv_transfer_config: {kv_link: rdma}           # kvsim.fleet.kv_transfer: presets, bytes
    replicas:
      - {count: 2, kv_role: kv_producer}          # the prefill pool
      - {count: 1, kv_role: kv_consumer, engine: {max_num_seqs: 512}}   # the decode pool

A request's life (each instance is one engine exactly as a colocated fleet builds it; the pools, their routers
and the hand-offs between them are `kvsim.fleet.disagg_pools.Disaggregation`, which this module's
`simulate_disagg` runs and `disagg_summary` sums up):

    arrives ─▶ prefill router ─▶ P: queue, prefill, first token (max_tokens=1, as the proxy asks)
           ─▶ decode router ─▶ D: waits until D can reserve the prompt's blocks (in D's queue order, at D's step
              boundaries or at once if D is idle; D's own prefix-cache hit, as D's scheduler looks it up,
              is not moved)
           ─▶ transfer over D's ingress link (latency + bytes ÷ bandwidth, shared: `SharedLink`);
              P keeps its blocks until the transfer ends, then frees them
           ─▶ D's queue with the KV held: admitted as computed but for the last prompt token, which
              D recomputes to sample the first token, then decodes the rest (vLLM's remote prefill)
    From its hand-off to its admission the request counts in D's `vllm:num_requests_waiting`: vLLM's
    queue holds it while its blocks wait and its KV moves (WAITING_FOR_REMOTE_KVS).

What a client measures: vLLM's proxy discards the prefill instance's token and streams the decode
instance's response, so the first token a client sees is D's: TTFT = P queue + prefill + wait for D's
blocks + transfer + D queue + D's first step. That is the `ttft_s` of the requests table; the
prefill instance's own TTFT is in its replica's summary. `queue_s` is the wait before the prefill.

Simplifications, stated: a request D can never hold is rejected when its prefill ends (its prefill
was spent); a transfer into D is limited by D's ingress link only (not P's egress); n > 1 samples are
refused, as vLLM's connectors hand one request's blocks over (`check_disaggregable`), and so is beam
search; D's preempted requests recompute locally, as vLLM's do. A multi-turn conversation's next turn (open
timing) may arrive while its previous turn still prefills: it carries the reply D will give that turn
(`Disaggregation.reply_len`), known then because the decode instances must answer alike (`check_decode_alike`).

KV in flight in the step rows: P's blocks kept for a transfer and D's blocks reserved for it are held in
their pools (`vllm:kv_cache_usage_perc` counts them, as vLLM's `BlockPool.get_usage` counts a finished
request's blocks whose free the connector delays and a WAITING_FOR_REMOTE_KVS request's allocated blocks),
so every row either instance records while they are held includes them. An instance that only holds them
(P with nothing else to run, D with nothing but transfers to wait for) records no row until it steps
again: a lone request's transfer is in no row, and the time-weighted usage means leave those seconds out
(a fleet's counts such an instance as using none). vLLM's D engine keeps stepping (empty steps that poll
the connector) while a request waits for its KV, so its logged usage covers them; kvsim writes no idle rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.engine.builder import engine_result
from kvsim.engine.loop import ProgressFn, run_engines
from kvsim.engine.runtime import Engine
from kvsim.fleet.disagg_checks import check_disaggregable, synchronous
from kvsim.fleet.disagg_pools import Disaggregation
from kvsim.fleet.driver import (
    fleet_requests,
    fleet_summary,
    fleet_tables,
    replica_engines,
    replica_groups,
    replica_scenarios,
)
from kvsim.fleet.kv_transfer import per_gpu_link
from kvsim.model.errors import KvsimError, expect_flag
from kvsim.results.budget import check_engines_memory
from kvsim.results.metrics import percentiles
from kvsim.results.run_result import RunResult
from kvsim.results.together import means_together
from kvsim.workload.generate import RequestStream
from kvsim.workload.scenario import Scenario, expect_scenario

if TYPE_CHECKING:
    import pandas as pd


def simulate_disagg(scenario: Scenario, check: bool = False, progress: ProgressFn | None = None,
                    bursts: bool = True, memory_limit_bytes: int | None = None) -> RunResult:
    """Simulate a disaggregated fleet (module docstring); every request ends finished or rejected once.

    A fleet's result (`kvsim.fleet.driver`) whose `tables` add `transfers` (one row per KV transfer) and
    `pools` (the prefill and decode pools' numbers). A fleet that cannot fit in `memory_limit_bytes` [the
    machine's memory] is refused before any instance is built (`kvsim.results.budget.check_engines_memory`,
    as a colocated fleet's)."""
    import pandas as pd

    expect_scenario(scenario)
    expect_flag(check, "check")  # `check="no"` ran every check
    expect_flag(bursts, "bursts")  # `bursts="no"` ran bursts
    if scenario.kv_transfer_config is None:  # an AssertionError in `check_disaggregable`, as simulate_fleet names it
        raise KvsimError("kv_transfer_config: not set, so no disaggregated fleet; use kvsim.simulate, which runs any "
                         "scenario")
    check_engines_memory(scenario, replica_groups(scenario), memory_limit_bytes,
                         steps_in_memory=scenario.steps == "all")
    specs = replica_scenarios(scenario)
    check_disaggregable(scenario, specs)
    specs = [synchronous(spec) for spec in specs]
    # `Disaggregation` sets `observe_kv` where a pool's router reads KV usage
    parts, engines, requests = replica_engines(scenario, specs, observe_kv=False)
    disagg = Disaggregation(scenario, specs, parts, engines)
    if isinstance(requests, RequestStream) and requests.turns is not None:  # open multi-turn: a turn's reply is
        requests.turns.reply_len = disagg.reply_len  # decided after its prefill, maybe after its next turn came
    run_engines([[engine] for engine in engines], requests, disagg.dispatch, check, progress, bursts,
                clocks=disagg.clocks)
    assert all(not pending for pending in disagg.pending) and all(not f for f in disagg.in_flight)
    for engine in engines:  # conservation: nothing left queued, no block held on either side
        assert not engine.scheduler.has_work and engine.scheduler.alloc.num_held_slots == 0
        assert not engine.scheduler.num_remote_waiting
        if check:
            engine.scheduler.alloc.check_invariants()
    runs = [engine_result(spec, p, e.recorder) for spec, p, e in zip(specs, parts, engines, strict=True)]
    prefill = set(disagg.prefill)
    client_rows = []  # a prefill instance's rows the client saw: those it rejected (the rest went on to decode)
    for i, run in enumerate(runs):
        keep = run.request_columns["status"] == "rejected" if i in prefill else slice(None)
        client_rows.append({name: values[keep] for name, values in run.request_columns.items()})
    requests_df = fleet_requests(client_rows)
    steps_df = pd.concat([run.steps.assign(replica=i) for i, run in enumerate(runs)], ignore_index=True)
    routes_df = pd.concat([disagg.p_routes.frame().assign(pool="prefill"),
                           disagg.d_routes.frame().assign(pool="decode")], ignore_index=True)
    routes_df["replica"] = [(disagg.prefill if pool == "prefill" else disagg.decode)[r]
                            for pool, r in zip(routes_df["pool"], routes_df["replica"], strict=True)]
    transfers_df = pd.DataFrame({key: np.asarray(values, dtype=np.float64 if key.endswith("_s") else np.int64)
                                 for key, values in disagg.transfers.items()})
    transfers_df = transfers_df.sort_values("request_id", kind="stable").reset_index(drop=True)
    summary = fleet_summary(scenario, requests_df, runs, routes_df)
    routers = disagg.config.prefill_router, disagg.config.decode_router  # these routed; not the fleet's `router`
    summary["router"] = f"{routers[0].policy} (prefill), {routers[1].policy} (decode)"
    for row, role in zip(summary["per_replica"], [g.kv_role for g in scenario.replicas  # type: ignore[union-attr]
                                                  for _ in range(g.count)], strict=True):
        row["kv_role"] = role
    summary["disaggregation"] = disagg_summary(disagg, runs, engines, transfers_df, summary["duration_s"])
    pools_df = pd.DataFrame([{"pool": name, **pool} for name, pool in summary["disaggregation"]["pools"].items()])
    tables = {**fleet_tables(routes_df, summary), "transfers": transfers_df, "pools": pools_df}
    return RunResult.of_frames(scenario, requests_df, steps_df, summary, runs, tables)


def disagg_summary(disagg: Disaggregation, runs: list[RunResult], engines: list[Engine],
                   transfers_df: pd.DataFrame, duration_s: float) -> dict[str, Any]:
    """Per-pool numbers and the transfers' distribution (`summary.json`'s `disaggregation`)."""
    bandwidth, latency = per_gpu_link(disagg.config)

    def pool(indices: list[int]) -> dict[str, Any]:
        busy_s = sum(engines[i].recorder.totals.dt for i in indices)
        return {
            "num_instances": len(indices),
            "num_gpus": sum(runs[i].scenario.engine.tensor_parallel_size for i in indices),
            "utilization": busy_s / (duration_s * len(indices)) if duration_s else 0.0,
            **means_together([engines[i].recorder.totals for i in indices],  # mean_running, _waiting, kv usage
                             [runs[i].summary["num_gpu_blocks"] for i in indices]),
            "num_preemptions": sum(runs[i].summary["num_preemptions"] for i in indices),
        }

    prefill_queue_s = np.concatenate([runs[i].requests["queue_s"].to_numpy(dtype=float) for i in disagg.prefill])
    transfer_s = (transfers_df["end_s"] - transfers_df["start_s"]).to_numpy(dtype=float)
    wait_s = (transfers_df["start_s"] - transfers_df["handoff_s"]).to_numpy(dtype=float)
    return {
        "kv_connector": disagg.config.kv_connector, "kv_link": disagg.config.kv_link,
        "kv_link_bandwidth_bytes_per_s_per_gpu": bandwidth, "kv_link_latency_s": latency,
        "num_transfers": len(transfers_df), "bytes_moved": int(transfers_df["num_bytes"].sum()),
        "transfer_s": percentiles(transfer_s), "transfer_wait_s": percentiles(wait_s),
        "prefill_queue_s": percentiles(prefill_queue_s),
        "pools": {"prefill": pool(disagg.prefill), "decode": pool(disagg.decode)},
    }
