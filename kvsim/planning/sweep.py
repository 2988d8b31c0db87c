"""Run many scenarios: local worker processes by default, a Dask cluster when given an address.

    summaries = run_many(scenarios, workers=2)                       # local processes
    summaries = run_many(scenarios, dask_address="tcp://host:8786")  # pip install -e '.[dist]'

Results come back in the order of `scenarios`. Each run is independent and deterministic
(its own seed), so the way runs are spread over workers never changes a result.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvsim.model.errors import KvsimError, expect_count, expect_flag

if TYPE_CHECKING:
    import pandas as pd

    from kvsim.workload.scenario import Scenario


@dataclass(frozen=True, slots=True)
class SweepResult:
    """A run's summary, its per-step table when asked for (`keep_steps`), and its steady-state evidence
    (`kvsim.planning.steady_state.window_evidence`, computed where the run ran) when asked for (a run that
    stalled: verdict *stalled*, and an empty summary; `_run_one`)."""

    summary: dict[str, Any]
    steps: pd.DataFrame | None
    evidence: dict[str, Any] | None = None
    short_trace: tuple | None = None  # the short-trace warning's arguments, said by `run_many`'s process
    unsent_turns: tuple | None = None  # after_reply turns never sent: the warning's arguments, said there too


def worker_signals() -> None:
    """Worker-process initializer: a Ctrl-C at the terminal reaches every process of its group, as does the
    SIGHUP of the terminal closing, and the parent alone reports it (one line, exit 130 or 129); a worker that
    took it too would print its own traceback. The parent's shutdown stops the workers. A forked worker's SIGTERM
    is the system's again (the CLI's, `kvsim.cli.interrupts`, is the parent's: a pool stopping its workers by
    SIGTERM would have a traceback from each)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def interrupts_ignored() -> Iterator[None]:
    """Ignore SIGINT and SIGHUP while worker processes are started (a Dask LocalCluster's): a process started
    with a signal ignored keeps ignoring it, as `worker_signals` makes a pool's workers, so a Ctrl-C or the
    terminal's hang-up, which reach the whole process group, are the parent's to report. (With the CLI's SIGHUP
    handler in place a spawned worker started with the system's default, and the hang-up killed it.) A signal in
    those few seconds is lost (press Ctrl-C again); off the main thread, where no handler can be set, nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run_one(args: tuple[Scenario, bool, bool]) -> SweepResult:
    """One run of any kind (`kvsim.fleet.run.simulate_scenario`; a fleet's summary is its fleet summary). A run
    that stalls for good (`HeldKvStall`) is, when its evidence is asked for, a failed probe as a `kvsim plan` point
    reads it (`kvsim.planning.point`): the evidence *stalled* and an empty summary (the run never ended); asked
    for summaries alone, the stall stops the sweep with its line, as `kvsim run` does."""
    from kvsim.engine.turns import unsent_turns_kept
    from kvsim.fleet.run import simulate_scenario
    from kvsim.model.errors import HeldKvStall
    from kvsim.planning.window import stalled_evidence, window_evidence
    from kvsim.workload.generate import short_trace_unsaid

    scenario, keep_steps, evidence = args
    with short_trace_unsaid() as kept, unsent_turns_kept() as unsent:  # `run_many` says them, in its own process
        try:
            result = simulate_scenario(scenario)
        except HeldKvStall as stall:
            if not evidence:
                raise
            return SweepResult({}, None, stalled_evidence(scenario.workload.num_requests, str(stall)),
                               kept[0] if kept else None)
    return SweepResult(result.summary, result.steps if keep_steps else None,
                       window_evidence(result.requests, transfers=result.tables.get("transfers")) if evidence else None,
                       kept[0] if kept else None, unsent[0] if unsent else None)


def connect_dask(address: str) -> Any:
    """A dask.distributed Client of the scheduler at `address`; an address that is malformed or does not
    answer within 10 s (or dask not installed) is a `KvsimError` naming it, not a traceback."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise KvsimError(f"dask_address={address!r}: dask.distributed is not installed: pip install -e '.[dist]' "
                         "(or leave --dask-address out to run here)") from None
    try:
        return Client(address, timeout=10)
    except (OSError, TimeoutError, ValueError, TypeError) as error:
        raise KvsimError(f"dask_address={address!r}: cannot connect ({error})") from None


def run_many(scenarios: Sequence[Scenario], keep_steps: bool = False, workers: int | None = None,
             dask_address: str | None = None, evidence: bool = False,
             on_done: Callable[[], None] | None = None) -> list[SweepResult]:
    """Simulate every scenario; `workers=1` runs in this process (no pickling); `evidence` adds each
    run's steady-state window evidence. `on_done()` is called in this process as each run finishes
    (for progress; it never changes a result). A trace shorter than a run asks is warned of once, here, when
    the runs are done, unless the command around said it already (`kvsim.workload.generate.say_short_traces`);
    a run's after_reply turns never sent, each run's, here too (`kvsim.engine.turns.say_unsent_turns`).
    Anything but a list of Scenarios (one Scenario too), a `workers` that is no count of at least 1, a `keep_steps`
    or `evidence` that is no bool or an `on_done` that is no function is a `KvsimError` before any run (a dict of
    fields was an AttributeError deep in the run, `workers=2.5` and `on_done=5` a TypeError)."""
    from kvsim.engine.turns import say_unsent_turns
    from kvsim.model.errors import shown
    from kvsim.workload.generate import say_short_traces
    from kvsim.workload.scenario import Scenario, expect_scenario

    # one Scenario iterates its fields (pydantic): it was refused as `scenarios[0]=('name', 'default')`
    if isinstance(scenarios, (str, bytes, dict, Scenario)) or not isinstance(scenarios, Iterable):
        raise KvsimError(f"scenarios={shown(scenarios)}: expected a list of Scenarios"
                         + (" (one scenario: [scenario])" if isinstance(scenarios, Scenario) else ""))
    scenarios = [expect_scenario(scenario, f"scenarios[{i}]") for i, scenario in enumerate(scenarios)]
    if workers is not None:  # a NumPy integer is a count too
        workers = expect_count(workers, "workers", 1, "a count of processes, 1 or more (None: one per CPU)")
    expect_flag(keep_steps, "keep_steps")  # "no" kept steps, as truthy text
    expect_flag(evidence, "evidence")
    if on_done is not None and not callable(on_done):  # a TypeError after the first run, its work lost
        raise KvsimError(f"on_done={shown(on_done)}: expected a function of no arguments, or None")
    results = _run_all([(s, keep_steps, evidence) for s in scenarios], workers, dask_address, on_done or (lambda: None))
    say_short_traces([r.short_trace for r in results if r.short_trace is not None])
    for result in results:  # each run's, as a run here says it (`kvsim.engine.turns.say_unsent_turns`)
        if result.unsent_turns is not None:
            say_unsent_turns(result.unsent_turns)
    return results


def run_evidence(scenarios: Sequence[Scenario], workers: int | None = None,
                 dask_address: str | None = None) -> list[dict[str, Any]]:
    """Each scenario's steady-state window evidence, one per scenario in their order (`run_many` with
    `evidence`), so a caller may zip them with its scenarios: a run without evidence is a bug, raised, never
    dropped (a rate search would then pair probes with other probes' evidence, or fail its length check)."""
    evidence = []
    for result in run_many(scenarios, workers=workers, dask_address=dask_address, evidence=True):
        if result.evidence is None:  # `_run_one` computes it whenever asked
            raise RuntimeError("run_many(evidence=True) returned a run without its evidence")
        evidence.append(result.evidence)
    return evidence


def _run_all(jobs: list[tuple[Scenario, bool, bool]], workers: int | None, dask_address: str | None,
             done: Callable[[], None]) -> list[SweepResult]:
    if dask_address:
        with connect_dask(dask_address) as client:
            from dask.distributed import as_completed

            futures = client.map(_run_one, jobs, pure=False)
            for _ in as_completed(futures):
                done()
            return client.gather(futures)
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    results = []
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            results.append(_run_one(job))
            done()
        return results
    with ProcessPoolExecutor(max_workers=workers, initializer=worker_signals) as pool:
        for result in pool.map(_run_one, jobs, chunksize=1):
            results.append(result)
            done()
    return results
