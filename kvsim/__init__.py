"""kvsim: a discrete-event capacity simulator for LLM serving with a paged KV cache.

The library API (typed; the CLI is a thin layer over it):

    simulate(scenario, /, *, check=False, progress=None, **overrides) -> RunResult
        scenario: a Scenario, a YAML path, a dict of scenario fields, or None for the built-in default;
        any kind of scenario, through `kvsim.fleet.run.simulate_scenario`; a fleet's
        result has per-replica sections
    load_scenario(path=None, overrides=None) -> Scenario
        overrides: {"engine.block_size": 32} or ["engine.block_size=32"] (the CLI's --set)
    Scenario, RunResult (requests/steps DataFrames, summary, a fleet's replicas and tables; write, to_parquet)

`import kvsim` imports nothing but the standard library: `Scenario` and `load_scenario` load
pydantic on first use, simpy loads only when a simulation runs, and pandas only when a result's
`requests` or `steps` DataFrame is asked for (`kvsim run` never imports it).
So the `kvsim` command (`kvsim.__main__`) is inside its Ctrl-C handling before any heavy import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsim.model.version import __version__

if TYPE_CHECKING:  # names for annotations only: the package's namespace is its API (`__dir__`)
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any

    from kvsim.results.run_result import RunResult
    from kvsim.workload.scenario import Scenario, load_scenario

__all__ = ["RunResult", "Scenario", "__version__", "load_scenario", "simulate"]


def simulate(scenario: Scenario | str | Path | Mapping[str, Any] | None = None, /, *, check: bool = False,
             progress: Callable[[float, int, int], None] | None = None,
             **overrides: Any) -> RunResult:
    """Simulate `scenario` (a Scenario, a YAML path, a dict of its fields, or None: the built-in default).

    `overrides` replace fields: `seed=3`, or a nested field with double underscores,
    `engine__block_size=32` (a whole section too: `workload__prompt_len={"dist": "fixed", "value": 512}`).
    `check=True` runs every allocator's `check_invariants()` after each step. `progress`, if given, is called as
    the run goes with (simulated seconds so far, requests done, requests in all).
    A fleet scenario (`replicas` set) runs its replicas behind its router; its result has one section per
    replica (`replicas`) and the fleet's tables (`tables`: routes, ...). A router set over one replica, which has
    nothing to choose, is said as a warning on the `kvsim` logger, as `kvsim run` says it
    (`kvsim.fleet.run.lone_routers`).
    """
    import logging

    from kvsim.engine.loop import expect_progress
    from kvsim.fleet.run import lone_routers, simulate_scenario
    from kvsim.model.errors import expect_flag
    from kvsim.workload.scenario import resolve_scenario

    expect_flag(check, "check")  # `check="no"` ran every check
    expect_progress(progress)  # before the scenario is read, as `check`
    fields = {key.replace("__", "."): value for key, value in overrides.items()}
    resolved = resolve_scenario(scenario, fields)
    result = simulate_scenario(resolved, check=check, progress=progress)
    for line in lone_routers(resolved):  # as `kvsim run` says them (a plan's probes do not: `lone_routers`)
        logging.getLogger("kvsim").warning(line)
    return result


def __getattr__(name: str) -> Any:
    """The API's heavier names, imported on first use (PEP 562)."""
    if name == "RunResult":
        from kvsim.results.run_result import RunResult

        return RunResult
    if name == "Scenario":
        from kvsim.workload.scenario import Scenario

        return Scenario
    if name == "load_scenario":
        from kvsim.workload.scenario import load_scenario

        return load_scenario
    raise AttributeError(f"module 'kvsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The API, `__all__` (PEP 562): what a notebook's tab completion offers, the lazy names included and
    no import helpers or subpackages."""
    return sorted(__all__)
