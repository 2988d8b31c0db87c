"""Simulating one engine, or a lockstep data-parallel group, from a scenario.

Both run through the one driver (`kvsim.engine.loop.run_engines`: one arrival process, one step
loop; a fleet's replicas use it too, from `kvsim.fleet.driver`). `simulate(scenario)` builds the
allocator, scheduler, latency model and workload from a validated `Scenario` and returns a
`RunResult` (DataFrames + summary). Same scenario and seed → identical results: the only
randomness is one `numpy.random.Generator(seed)`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.engine.builder import build_engine, engine_result, finished_requests
from kvsim.engine.lockstep_recorder import LockstepRecorder
from kvsim.engine.loop import ProgressFn, least_loaded, run_engine, run_engines
from kvsim.engine.recorder import StepRecorder
from kvsim.engine.runtime import Engine
from kvsim.kv.offload_connector import combine_summaries
from kvsim.model.errors import KvsimError, expect_flag
from kvsim.results.budget import check_engines_memory
from kvsim.results.metrics import combined_counters, summarize
from kvsim.results.output_checks import check_output_dir
from kvsim.results.output_dir import output_directory
from kvsim.results.records import concat_request_columns
from kvsim.results.run_result import RunResult, write_run_files
from kvsim.results.step_writer import StepsFormat, StepWriter, resolve_format
from kvsim.sched.v1 import data_parallel_fan_out
from kvsim.workload.generate import iter_requests
from kvsim.workload.scenario import Scenario, StepsMode


def simulate_data_parallel(scenario: Scenario, check: bool = False, memory_limit_bytes: int | None = None,
                           writer: StepWriter | None = None, steps_path: Path | None = None) -> RunResult:
    """`data_parallel_size` engines, each with its own scheduler and KV pool, behind vLLM's DP
    load balancer: stepping in lockstep for an MoE model (`kvsim.engine.loop.step_loop`), each on its own
    for a dense one (vLLM runs those ranks as independent engines, `DPEngineCoreProc` being for MoE only:
    vllm/v1/engine/core.py, `run_engine_core`), without decode bursts either way. A request with n > 1 samples is
    fanned out before the balancer routes each child (`kvsim.sched.v1.data_parallel_fan_out`). The result holds
    every request (column `dp_rank`: for a fanned-out request, the rank whose child ended last) and the engines'
    steps (those `scenario.steps` keeps, in (`time_s`, `dp_rank`) order); the summary describes the deployment:
    running and waiting counts and scheduler counters summed over the engines, pool shares averaged over them
    (`kvsim.results.together.dp_group_steps`), with KV offload its tiers' books over the ranks
    (`kvsim.kv.offload_connector.combine_summaries`).
    The steps stream through a `LockstepRecorder`: to `writer`, if given (they are read back from
    `steps_path`, where the writer's file lands), else kept in memory (`all`) or sampled."""
    check_engines_memory(scenario, [(scenario, scenario.engine.data_parallel_size)], memory_limit_bytes,
                         steps_in_memory=scenario.steps == "all" and writer is None)
    rng = np.random.default_rng(scenario.seed)
    parts = [build_engine(scenario, rng) for _ in range(scenario.engine.data_parallel_size)]
    schedulers = [p.scheduler for p in parts]
    lockstep = parts[0].spec.model.moe is not None
    steps = LockstepRecorder(scenario.steps, len(parts), writer, lockstep=lockstep)
    group = [Engine(p.scheduler, p.latency, steps.rank(i)) for i, p in enumerate(parts)]
    requests = iter_requests(scenario, parts[0].spec.max_model_len, rng)
    run_engines([group] if lockstep else [[engine] for engine in group], requests,
                lambda req, now: least_loaded(group), check, bursts=False,
                max_in_flight=scenario.workload.max_concurrency, fan_out=data_parallel_fan_out(schedulers))
    tables: list[dict[str, np.ndarray]] = []  # each rank's requests by request_id, with its dp_rank
    for i, (p, engine) in enumerate(zip(parts, group, strict=True)):
        table = finished_requests(p, engine.recorder)
        table["dp_rank"] = np.full(len(table["request_id"]), i, dtype=np.int64)
        tables.append(table)
    del table
    request_columns = concat_request_columns(tables, consume=True)
    order = np.argsort(request_columns["request_id"], kind="stable")
    for name, values in request_columns.items():  # one column at a time: one extra copy at most
        request_columns[name] = values[order]
    counters = [s.counters() for s in schedulers]
    group_counters = combined_counters(counters)
    summary = summarize(request_columns, steps.totals, group_counters,
                        {**parts[0].facts, "data_parallel_size": len(parts)})
    offloads = [s.offload.summary(summary["duration_s"], steps.totals.end_s) for s in schedulers
                if s.offload is not None]
    if offloads:  # every rank has the same tiers; their books over the group's run
        summary["kv_offload"] = combine_summaries(offloads, [summary["duration_s"]] * len(offloads))
    streamed = writer is not None and scenario.steps == "all"
    return RunResult(scenario=scenario, request_columns=request_columns,
                     step_columns=None if streamed else steps.kept_columns(), summary=summary,
                     steps_path=steps_path if streamed else None, totals=steps.totals,
                     counters=group_counters)


def simulate(scenario: Scenario, check: bool = False, progress: ProgressFn | None = None,
             bursts: bool = True, steps: StepsMode | None = None,
             memory_limit_bytes: int | None = None, out_dir: str | Path | None = None,
             steps_format: StepsFormat = "auto") -> RunResult:
    """Simulate a scenario end to end. `check=True` runs `check_invariants()` after every step.

    With `engine.data_parallel_size` > 1, the DP engines run together (`simulate_data_parallel`).
    `steps` overrides the scenario's `steps` (which per-step rows the result keeps and writes).
    A run that cannot fit in `memory_limit_bytes` [the machine's memory] is refused up front.

    `out_dir`: write the run there as it goes (`RunResult.write`'s files and rules: new or an
    earlier kvsim run, swapped in complete). The per-step rows then stream to disk in chunks
    (`steps.parquet` with pyarrow, else `steps.csv`; `steps_format` chooses) instead of staying
    in memory, and the result's `steps` reads them back from there when asked; a data-parallel
    group's rows too, in (`time_s`, `dp_rank`) order (`kvsim.engine.lockstep_recorder`).
    A `check` or `bursts` that is not True or False is a `KvsimError` naming it (`bursts="no"` ran bursts).
    """
    expect_flag(check, "check")
    expect_flag(bursts, "bursts")
    if steps is not None:
        scenario = scenario.model_copy(update={"steps": steps})
    if scenario.replicas is not None:
        raise KvsimError(f"replicas={scenario.replicas_shown}: a fleet scenario; use kvsim.fleet.driver.simulate_fleet")
    speculates = scenario.engine.speculative_config is not None  # step rows get `draft_rejected`
    if out_dir is None:
        if scenario.engine.data_parallel_size > 1:
            return simulate_data_parallel(scenario, check, memory_limit_bytes)
        return simulate_single(scenario, check, progress, bursts, memory_limit_bytes,
                               StepRecorder(scenario.steps, draft_column=speculates))
    final = check_output_dir(out_dir, "run")  # refused before simulating, not after
    resolve_format(steps_format)  # as `RunResult.write`: steps kept or not ('xml' with steps none was written)
    with output_directory(out_dir, "run") as tmp:
        writer = StepWriter(tmp, steps_format) if scenario.steps != "none" else None
        steps_path = None if writer is None else final / writer.path.name
        if scenario.engine.data_parallel_size > 1:
            result = simulate_data_parallel(scenario, check, memory_limit_bytes, writer, steps_path)
        else:
            result = simulate_single(scenario, check, progress, bursts, memory_limit_bytes,
                                     StepRecorder(scenario.steps, writer, draft_column=speculates), steps_path)
        write_run_files(tmp, result, steps=False, final=final)
    return result


def simulate_single(scenario: Scenario, check: bool, progress: ProgressFn | None, bursts: bool,
                    memory_limit_bytes: int | None, recorder: StepRecorder, steps_path: Path | None = None,
                    ) -> RunResult:
    """One engine, its requests drawn lazily (`iter_requests`), its steps into `recorder` (whose writer,
    if any, puts them at `steps_path` once the output is swapped in)."""
    rng = np.random.default_rng(scenario.seed)  # the run's only source of randomness
    parts = build_engine(scenario, rng, memory_limit_bytes, steps_in_memory=recorder.keeps_all_rows)
    requests = iter_requests(scenario, parts.spec.max_model_len, rng)
    run_engine(parts.scheduler, parts.latency, requests, check=check, progress=progress, bursts=bursts,
               recorder=recorder, max_in_flight=scenario.workload.max_concurrency)
    return engine_result(scenario, parts, recorder, steps_path=steps_path)
