"""A fleet: many replicas behind a router, in one simulated clock.

    replicas: 4                         # or groups:  replicas: [{count: 2, gpu: h200},
    router: {policy: affinity}          #                       {count: 2, engine: {max_num_seqs: 64}}]

Each replica is one engine exactly as `kvsim.engine.simulate` builds it (its own scheduler,
KV pool and latency model, from the scenario's model/GPU/engine with its group's changes).
The scenario's workload is the whole fleet's traffic, built once; the router assigns each
request at its arrival instant (`kvsim.fleet.router`). Replicas know nothing of each other.

Results (one `kvsim.results.run_result.RunResult`): every request with its `replica`, every replica's
steps, the router's decisions (`tables["routes"]`), one section per replica (`replicas`: the same
result a single run has) and a fleet-wide summary (percentiles over all requests, totals over replicas).
"""

from __future__ import annotations

from array import array
from collections import Counter
from operator import sub
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.engine.builder import EngineParts, build_engine, engine_result
from kvsim.engine.loop import ProgressFn, run_engines
from kvsim.engine.recorder import MAX_SAMPLED_STEPS, StepRecorder
from kvsim.engine.runtime import Engine
from kvsim.fleet.router import Decision, Router, prefix_table_blocks
from kvsim.kv.offload_connector import combine_summaries
from kvsim.model.capacity import num_gpu_blocks
from kvsim.model.config import load_gpu, load_model
from kvsim.model.errors import KvsimError, expect_flag
from kvsim.results.budget import check_engines_memory
from kvsim.results.metrics import (
    combined_counters,
    optional_column_summaries,
    percentiles,
    prefix_cache_hit_rate,
)
from kvsim.results.output_checks import check_output_dir
from kvsim.results.output_dir import output_directory
from kvsim.results.records import concat_request_columns
from kvsim.results.run_result import RunResult, write_run_files
from kvsim.results.step_writer import StepsFormat, StepWriter, concat_step_files, resolve_format
from kvsim.results.together import means_together
from kvsim.workload.fleet_layout import group_speculates
from kvsim.workload.generate import iter_requests
from kvsim.workload.request import Request
from kvsim.workload.scenario import Scenario, expect_scenario, make_scenario

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    import pandas as pd

    from kvsim.workload.conversations import Conversations
    from kvsim.workload.generate import RequestStream


def replica_scenarios(scenario: Scenario) -> list[Scenario]:
    """One single-engine scenario per replica, in replica order (groups in the order given)."""
    if scenario.replicas is None:
        return [scenario]
    return [_replica(scenario, raw, f"{scenario.name}/{label}{i}", g)
            for g, raw, label, count in _groups(scenario) for i in range(count)]


def replica_scenario(scenario: Scenario, index: int) -> Scenario:
    """Replica `index`'s scenario in a fleet of identical replicas (`replicas` a count), as `replica_scenarios`
    makes it, without making the others (an autoscaled fleet makes each when it first starts it)."""
    assert isinstance(scenario.replicas, int) and 0 <= index < scenario.replicas
    [(g, raw, label, _count)] = _groups(scenario)
    return _replica(scenario, raw, f"{scenario.name}/{label}{index}", g)


def replica_groups(scenario: Scenario) -> list[tuple[Scenario, int]]:
    """(the first replica's scenario, number of replicas) per group: what differs between
    replicas, without building every one (the memory check reads it before the fleet exists)."""
    if scenario.replicas is None:
        return [(scenario, 1)]
    return [(_replica(scenario, raw, f"{scenario.name}/{label}0", g, sized=True), count)
            for g, raw, label, count in _groups(scenario) if count]


def _groups(scenario: Scenario) -> list[tuple[int, dict[str, Any], str, int]]:
    """(group index, raw replica scenario less its name, name prefix, count) per group: the scenario's
    settings with the group's on top (a group naming another scheduler carries its `enable_prefix_caching`:
    `kvsim.workload.fleet_layout.settled_groups`). The scenario's `enable_prefix_caching` left at its default
    stays so in each replica (the same default, not a setting given: `Scenario.variant_fields`)."""
    base = scenario.variant_fields(exclude={"replicas", "router", "kv_transfer_config", "autoscaler"})
    if isinstance(scenario.replicas, int):
        return [(0, base, "r", scenario.replicas)]
    out = []
    for g, group in enumerate(scenario.replicas or ()):
        raw = {**base, "engine": {**base["engine"], **group.engine}}
        if not group_speculates(scenario.engine, group):  # another group's drafts read the trace's acceptance
            raw["workload"] = _without_acceptance_column(raw["workload"])
        raw.update({key: value for key, value in (("model", group.model), ("gpu", group.gpu)) if value})
        out.append((g, raw, f"{group.name or f'g{g}'}-", group.count))
    return out


def _without_acceptance_column(workload: dict[str, Any]) -> dict[str, Any]:
    """A replica's `workload` fields less the trace's acceptance column, for a group that does not speculate: the
    fleet's requests carry their acceptance lengths to every replica, and its engine never reads them (a single
    engine given the column without `speculative_config` is refused, where no group of a fleet speculates)."""
    trace = workload.get("trace")
    if not isinstance(trace, dict) or trace.get("acceptance_column") is None:
        return workload
    return {**workload, "trace": {key: value for key, value in trace.items() if key != "acceptance_column"}}


def _replica(scenario: Scenario, raw: dict[str, Any], name: str, group: int, sized: bool = False) -> Scenario:
    """One replica's single-engine scenario. A replica is one engine: a data-parallel size given to it is
    refused (it ran one engine per replica, its other ranks and their GPUs dropped without a word).
    `sized`: also size its KV pool, so that a group's engine the GPU cannot hold (a tensor-parallel size
    the heads do not divide, a pool under one block) is refused naming the group, as its other settings are."""
    try:
        replica = make_scenario({**raw, "name": name}, scenario.base_dir)
        if replica.engine.data_parallel_size > 1:
            raise KvsimError(f"engine.data_parallel_size={replica.engine.data_parallel_size}: a fleet's replicas are "
                             "single engines (a data-parallel group per replica is not modelled); give more "
                             "replicas, or drop replicas to run one data-parallel group")
        if sized:
            num_gpu_blocks(load_model(replica.model), load_gpu(replica.gpu), replica.engine)
        return replica
    except KvsimError as error:
        if isinstance(scenario.replicas, int):
            raise
        raise KvsimError(f"replicas[{group}]: {error}") from None


def _group_engine(spec: Scenario, rng: np.random.Generator, group: int | None) -> EngineParts:
    """`build_engine`, its refusal naming the replica group (`_replica`'s form): a group's offload tier under one
    block was `engine.kv_offload.cpu_bytes=...`, a field of the scenario's engine, which had no `kv_offload`."""
    try:
        return build_engine(spec, rng)
    except KvsimError as error:
        if group is None:
            raise
        raise KvsimError(f"replicas[{group}]: {error}") from None


class FleetView:
    """What the router reads of the replicas (`kvsim.fleet.router.FleetState`), cheaply at every arrival.

    A replica's outstanding requests are the ones dispatched to it that have not ended: every
    request it is given is waiting, running or swapped out until it is finished or rejected (at
    once, on arrival), so the count is `dispatched − ended`, two lengths a replica.
    """

    def __init__(self, engines: list[Engine]) -> None:
        self.engines = engines
        self.dispatched = [0] * len(engines)
        self._ended = [e.scheduler.records.status_codes for e in engines]  # their lengths: requests ended
        self.now_s = 0.0  # the instant the arrival being routed is delivered

    def add(self, engine: Engine) -> None:
        """A replica built while the run goes (an autoscaled fleet's), after the others: `engines` grows by it."""
        self.engines.append(engine)
        self.dispatched.append(0)
        self._ended.append(engine.scheduler.records.status_codes)

    def outstanding(self) -> list[int]:
        return list(map(sub, self.dispatched, map(len, self._ended)))

    def kv_usage(self) -> list[float]:
        """Each replica's usage now, mid-burst included (`Engine.kv_usage`)."""
        return [engine.kv_usage(self.now_s) for engine in self.engines]


class Routes:
    """The router's decisions, one row per request in arrival order, in compact columns."""

    REASONS = ("turn", "least_outstanding", "least_kv", "affinity", "new_prefix", "over_bound")

    def __init__(self) -> None:
        self.request_id, self.arrival_s = array("q"), array("d")
        self.replica, self.reason, self.matched_tokens = array("q"), array("b"), array("q")

    def add(self, req: Request, decision: Decision) -> None:
        self.request_id.append(req.request_id)
        self.arrival_s.append(req.arrival_s)
        self.replica.append(decision.replica)
        self.reason.append(self.REASONS.index(decision.reason))
        self.matched_tokens.append(decision.matched_tokens)

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        reasons = np.array(self.REASONS, dtype=object)
        return pd.DataFrame({
            "request_id": np.frombuffer(self.request_id, dtype=np.int64) if self.request_id else np.zeros(0, np.int64),
            "arrival_s": np.frombuffer(self.arrival_s, dtype=np.float64) if self.arrival_s else np.zeros(0),
            "replica": np.frombuffer(self.replica, dtype=np.int64) if self.replica else np.zeros(0, np.int64),
            "reason": reasons[np.frombuffer(self.reason, dtype=np.int8).astype(np.int64)] if self.reason
            else np.zeros(0, dtype=object),
            "matched_tokens": np.frombuffer(self.matched_tokens, dtype=np.int64) if self.matched_tokens
            else np.zeros(0, np.int64),
        })


def fleet_tables(routes_df: pd.DataFrame, summary: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """A fleet's own tables (`RunResult.tables`): the router's decisions and one row per replica."""
    import pandas as pd

    return {"routes": routes_df, "replicas": pd.DataFrame(summary["per_replica"])}


def simulate_fleet(scenario: Scenario, check: bool = False, progress: ProgressFn | None = None,
                   bursts: bool = True, out_dir: str | Path | None = None,
                   steps_format: StepsFormat = "auto", memory_limit_bytes: int | None = None) -> RunResult:
    """Simulate the scenario's replicas behind its router; one replica gives `simulate`'s result.

    `out_dir`: write the run there as it goes (`RunResult.write`'s files and rules). Every replica's
    step rows then stream to disk in chunks (one part file per replica, concatenated in replica
    order when the run ends: `steps.parquet` with pyarrow, else `steps.csv`; `steps_format`
    chooses), so memory stays bounded however many steps the fleet runs. A fleet that cannot fit in
    `memory_limit_bytes` [the machine's memory] is refused before any replica is built or any folder
    made (`kvsim.results.budget.check_engines_memory`).
    """
    expect_scenario(scenario)
    expect_flag(check, "check")  # `check="no"` ran every check
    expect_flag(bursts, "bursts")  # `bursts="no"` ran bursts
    check_engines_memory(scenario, replica_groups(scenario), memory_limit_bytes,
                         steps_in_memory=scenario.steps == "all" and out_dir is None)
    if out_dir is None:
        return _run_fleet(scenario, check, progress, bursts)
    final = check_output_dir(out_dir, "run")  # refused before simulating, not after
    resolve_format(steps_format)  # as `RunResult.write`: steps kept or not ('xml' with steps none was written)
    with output_directory(out_dir, "run") as tmp:
        result = _run_fleet(scenario, check, progress, bursts, (tmp, final, steps_format))
        write_run_files(tmp, result, steps=False, final=final)
    return result


def replica_engines(scenario: Scenario, specs: list[Scenario], observe_kv: bool,
                    writers: Sequence[StepWriter | None] | None = None, num_replicas: int | None = None,
                    rng: np.random.Generator | None = None,
                    ) -> tuple[list[EngineParts], list[Engine], RequestStream | Conversations]:
    """One engine per replica scenario in `specs`, and the traffic: one generator seeded by `scenario.seed`
    (the run's only source of randomness; `rng` where the caller holds it) builds the engines in order, then draws
    the requests (built at arrival, let go when they end; capped at the largest replica's max_model_len, then by
    the replica that serves each, `Request.cap_output`). `scenario.steps` holds for the
    whole fleet: `sampled` keeps at most MAX_SAMPLED_STEPS rows in all; a replica with a writer in
    `writers` streams its rows there, labelled with its `replica`; if any replica speculates, every one
    has the `draft_rejected` column (one table). `observe_kv`: a dispatcher reads every engine's KV usage.
    `num_replicas`: the fleet's size where `specs` are its first replicas only, all alike (an autoscaled fleet
    builds the others as it starts them, `replica_engine`; building draws nothing from `rng`)."""
    rng = np.random.default_rng(scenario.seed) if rng is None else rng
    groups = ([g for g, group in enumerate(scenario.replicas) for _ in range(group.count)]
              if isinstance(scenario.replicas, list) and len(specs) == sum(g.count for g in scenario.replicas)
              else [None] * len(specs))
    parts = [_group_engine(spec, rng, group) for spec, group in zip(specs, groups, strict=True)]
    requests = iter_requests(scenario, max(p.spec.max_model_len for p in parts), rng)
    speculates = any(p.scheduler.speculation is not None for p in parts)
    engines = [replica_engine(scenario, p, num_replicas or len(parts), speculates, observe_kv, writer, i)
               for i, (p, writer) in enumerate(zip(parts, writers or [None] * len(parts), strict=True))]
    return parts, engines, requests


def replica_engine(scenario: Scenario, parts: EngineParts, num_replicas: int, speculates: bool, observe_kv: bool,
                   writer: StepWriter | None = None, index: int = 0) -> Engine:
    """Replica `index`'s engine of built `parts`, in a fleet of `num_replicas` (`replica_engines`' rules: its share
    of MAX_SAMPLED_STEPS, the `draft_rejected` column where any replica `speculates`)."""
    recorder = StepRecorder(scenario.steps, writer, {"replica": index} if writer else None,
                            max_sampled_rows=max(2, MAX_SAMPLED_STEPS // num_replicas), draft_column=speculates)
    return Engine(parts.scheduler, parts.latency, recorder, observe_kv=observe_kv)


def _run_fleet(scenario: Scenario, check: bool, progress: ProgressFn | None, bursts: bool,
               streamed: tuple[Path, Path, StepsFormat] | None = None) -> RunResult:
    """The fleet's run; `streamed`: (the output's temporary folder, its final path, the steps format)."""
    import pandas as pd

    if scenario.kv_transfer_config is not None:
        raise KvsimError("kv_transfer_config: a disaggregated fleet; use kvsim.fleet.disagg.simulate_disagg")
    if scenario.autoscaler is not None:
        raise KvsimError("autoscaler: an autoscaled fleet; use kvsim.fleet.autoscaled.simulate_autoscaled")

    specs = replica_scenarios(scenario)
    writers = [StepWriter(streamed[0], streamed[2], name=f".steps-r{i}") if streamed is not None
               and scenario.steps != "none" else None for i in range(len(specs))]
    reads_kv = scenario.router.policy == "least_kv"  # the router reads KV usage, mid-burst too
    parts, engines, requests = replica_engines(scenario, specs, reads_kv, writers)
    view = FleetView(engines)
    config = scenario.router
    block_size = scenario.engine.block_size
    router = Router(config.policy, len(parts), block_size, config.load_bound, config.load_slack, config.match_threshold,
                    max_prefix_blocks=prefix_table_blocks((p.spec.kv_cache_size_tokens for p in parts), block_size))
    routes = Routes()

    def dispatch(req: Request, now: float) -> int:
        view.now_s = now
        decision = router.route(req, view)
        routes.add(req, decision)
        view.dispatched[decision.replica] += 1
        return decision.replica

    run_engines([[engine] for engine in engines], requests, dispatch, check, progress, bursts,
                max_in_flight=scenario.workload.max_concurrency)
    streams = writers[0] is not None  # then the replicas keep no steps of their own
    replica_specs = [spec.model_copy(update={"steps": "none"}) for spec in specs] if streams else specs
    runs = [engine_result(spec, p, e.recorder) for spec, p, e in zip(replica_specs, parts, engines, strict=True)]
    requests_df = fleet_requests([run.request_columns for run in runs])
    routes_df = routes.frame()
    summary = fleet_summary(scenario, requests_df, runs, routes_df)
    tables = fleet_tables(routes_df, summary)
    if not streams:
        steps_df = pd.concat([run.steps.assign(replica=i) for i, run in enumerate(runs)], ignore_index=True)
        return RunResult.of_frames(scenario, requests_df, steps_df, summary, runs, tables)
    assert streamed is not None and writers[0] is not None
    tmp, final, _ = streamed
    dest = tmp / f"steps.{writers[0].format}"
    concat_step_files([w.path for w in writers if w is not None], dest)
    return RunResult.of_frames(scenario, requests_df, None, summary, runs, tables, steps_path=final / dest.name)


def fleet_requests(tables: Sequence[Mapping[str, np.ndarray]], replicas: Sequence[int] | None = None,
                   ) -> pd.DataFrame:
    """Every replica's requests (`tables[i]`, its `request_columns`) with its `replica` (`replicas[i]`; default
    i), in request id order (ties: replica order), built from their columns at once (no per-replica DataFrame;
    an optional column one replica's requests lack is 0 there, `concat_request_columns`)."""
    import pandas as pd

    columns = concat_request_columns([dict(table) for table in tables])
    counts = [len(table["request_id"]) for table in tables]
    ids = np.arange(len(tables), dtype=np.int64) if replicas is None else np.asarray(replicas, dtype=np.int64)
    columns["replica"] = np.repeat(ids, counts)
    order = np.argsort(columns["request_id"], kind="stable")
    return pd.DataFrame({name: values[order] for name, values in columns.items()})


def fleet_output_tokens(requests_df: pd.DataFrame) -> int:
    """The output tokens of a fleet's finished requests, every sample's (`output_tokens` × `num_samples`)."""
    finished = requests_df[requests_df["status"] == "finished"]
    return int((finished["output_tokens"] * finished["num_samples"]).sum())


def _served_s(pools: Sequence[tuple[int, Sequence[float]]], start_s: float, end_s: float) -> float:
    """The time [start_s, end_s] less the time each pool (its slots, its flat [start, end) pairs up) was down in
    it, weighted by its share of the slots: the duration over which an autoscaled fleet's `draft_rejected_share`
    spreads its speculating pools, each counted only while it serves (a replica up for a tenth of the run
    diluted the share as if it had held its pool all along). Pools up throughout give end_s − start_s exactly."""
    span_s, total = end_s - start_s, sum(slots for slots, _ in pools)

    def up_s(up: Sequence[float]) -> float:
        pairs = zip(up[::2], up[1::2], strict=True)
        return sum(max(0.0, min(end, end_s) - max(start, start_s)) for start, end in pairs)
    return span_s - sum(slots / total * (span_s - up_s(up)) for slots, up in pools)


def fleet_summary(scenario: Scenario, requests_df: pd.DataFrame, runs: list[RunResult],
                  routes_df: pd.DataFrame, replica_ids: Sequence[int] | None = None,
                  up_periods: Sequence[Sequence[float]] | None = None) -> dict[str, Any]:
    """Fleet-wide headline numbers: latency percentiles over every request, totals over replicas (with KV
    offload, `kv_offload`: the books of the replicas that have a tier, per tier and in total,
    `kvsim.kv.offload_connector.combine_summaries`; each replica's is in its summary; with speculative decoding,
    `spec_decode`: the replicas' counters summed and its rates derived from the sums, as one engine's are,
    `kvsim.results.metrics.combined_counters`, its `draft_rejected_share` over the speculating replicas' pools
    for the fleet's duration). `replica_ids` number the `per_replica` rows (default 0, 1, ...; an autoscaled
    fleet's: the slots it used; `up_periods`, each one's flat [start, end) pairs serving: its KV pool counts in
    `kv_cache_usage_mean` only then, `kvsim.results.together.means_together`, and in `draft_rejected_share` only
    then, `_served_s`)."""
    finished = requests_df[requests_df["status"] == "finished"]
    end_s = max((r.summary["duration_s"] + float(r.request_columns["arrival_s"].min()) for r in runs
                 if len(r.request_columns["arrival_s"])), default=0.0)
    duration = max(end_s - float(requests_df["arrival_s"].min()), 0.0) if len(requests_df) else 0.0
    output_tokens = fleet_output_tokens(requests_df)
    # block counts (v0's rate) only where every replica runs v0: a v1 replica counts none, so a fleet mixing the
    # two gave the v0 replicas' block rate alone; it then gives the token rate, which every replica counts
    every_v0 = all(r.scenario.engine.scheduler == "v0" for r in runs)
    queries, hits, query_blocks, hit_blocks = (
        sum(r.summary.get(f"num_prefix_cache_{kind}", 0) for r in runs) if every_v0 or "tokens" in kind else 0
        for kind in ("query_tokens", "hit_tokens", "query_blocks", "hit_blocks"))
    per_replica = [{
        "replica": i, "name": r.summary["scenario"], "gpu": r.summary["gpu"], "model": r.summary["model"],
        "tensor_parallel_size": r.scenario.engine.tensor_parallel_size, "num_requests": r.summary["num_requests"],
        "num_finished": r.summary["num_finished"], "mean_running": r.summary["mean_running"],
        "kv_cache_usage_mean": r.summary["kv_cache_usage_perc"]["mean"],
        "num_preemptions": r.summary["num_preemptions"],
        "prefix_cache_hit_rate": r.summary["prefix_cache_hit_rate"], "ttft_p90_s": r.summary["ttft_s"]["p90"],
        "tpot_p90_s": r.summary["tpot_s"]["p90"], "e2e_p90_s": r.summary["e2e_s"]["p90"],
    } for i, r in zip(range(len(runs)) if replica_ids is None else replica_ids, runs, strict=True)]
    counts = [row["num_requests"] for row in per_replica]
    # The rate the client offered: of the instants its arrival process made requests due. A closed-loop client
    # sends each `client_queue_s` after that, once a slot frees (vllm bench serve's request-rate timer runs apart
    # from its concurrency semaphore); the send rate is then the engine's completion rate (~ requests_per_s).
    due = requests_df["arrival_s"] - requests_df["client_queue_s"] if "client_queue_s" in requests_df \
        else requests_df["arrival_s"]
    span_s = float(due.max() - due.min()) if len(due) > 1 else 0.0
    offload = [(r.summary["kv_offload"], r.summary["duration_s"]) for r in runs if "kv_offload" in r.summary]
    extra = {"kv_offload": combine_summaries(*zip(*offload, strict=True))} if offload else {}
    pools = [(r.totals, r.summary["num_gpu_blocks"], i) for i, r in enumerate(runs) if r.totals is not None]
    together = means_together([totals for totals, _, _ in pools], [blocks for _, blocks, _ in pools],
                              None if up_periods is None else [up_periods[i] for _, _, i in pools])
    spec = combined_counters([r.counters for r in runs if r.counters is not None]).spec_decode
    if spec is not None:
        extra["spec_decode"] = spec.summary(duration if up_periods is None or not duration else _served_s(
            [(r.counters.spec_decode.num_total_slots, up) for r, up in zip(runs, up_periods, strict=True)
             if r.counters is not None and r.counters.spec_decode is not None],
            float(requests_df["arrival_s"].min()), end_s))
    return {
        "scenario": scenario.name, "num_replicas": len(runs), "router": scenario.router.policy,
        "num_gpus": sum(row["tensor_parallel_size"] for row in per_replica), "seed": scenario.seed,
        "num_requests": int(len(requests_df)), "num_finished": int(len(finished)),
        "num_rejected": sum(r.summary["num_rejected"] for r in runs),
        "reject_reasons": dict(sum((Counter(r.summary["reject_reasons"]) for r in runs), Counter()).most_common()),
        "duration_s": duration,
        "output_tokens_per_s": output_tokens / duration if duration else 0.0,
        "requests_per_s": len(finished) / duration if duration else 0.0,
        "offered_rate_per_s": (len(due) - 1) / span_s if span_s else 0.0,
        **{key: percentiles(requests_df[key].to_numpy(dtype=float)) for key in ("ttft_s", "tpot_s", "e2e_s",
                                                                                "queue_s")},
        "mean_running": together["mean_running"],
        "num_preemptions": sum(r.summary["num_preemptions"] for r in runs),
        "kv_cache_usage_mean": together["kv_cache_usage_mean"],
        **prefix_cache_hit_rate(queries, hits, query_blocks, hit_blocks),
        "num_prefix_cache_query_tokens": queries, "num_prefix_cache_hit_tokens": hits,
        "requests_per_replica": {"min": min(counts), "max": max(counts), "mean": float(np.mean(counts))},
        "route_reasons": {str(k): int(v) for k, v in sorted(Counter(routes_df["reason"]).items())},
        "per_replica": per_replica, **extra,
        **optional_column_summaries(requests_df),
    }
