"""kvsim: a discrete-event capacity simulator for LLM serving with a paged KV cache.

`import kvsim` stays light: no torch, triton or matplotlib (and no simpy until a
simulation runs). Heavier entry points are loaded on first use.
"""

from __future__ import annotations

from kvsim.version import __version__

__all__ = ["__version__", "load_scenario", "simulate"]


def simulate(scenario, check: bool = False, progress=None):  # noqa: ANN001 - re-exported below
    """`kvsim.simulate(scenario) -> RunResult`: see `kvsim.engine.simulate` (imported on first use)."""
    from kvsim.engine import simulate as _simulate

    return _simulate(scenario, check=check, progress=progress)


def load_scenario(path=None, overrides=None):  # noqa: ANN001
    """Read and validate a scenario YAML (None: the built-in default); see `kvsim.scenario`."""
    from kvsim.scenario import load_scenario as _load

    return _load(path, overrides)
