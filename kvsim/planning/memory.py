"""A plan's memory bound: every fleet a search would simulate is estimated first, against one limit.

    memory = MemoryBound.of(spec.memory_limit_bytes)       # None: this machine's memory
    memory.most_replicas(lambda n: candidate.scenario(base, n, router), spec.max_replicas)

The estimate is `kvsim run`'s (`kvsim.results.budget.estimate_engines_bytes`: requests once, every
engine's blocks and fixed cost, the step rows a point keeps in memory), so a point the plan would
simulate is never one that `kvsim run --memory-limit` refuses. A search treats the limit as a bound
it cannot pass: it tries no count, and no longer run, whose floor exceeds it, and says so in its row
(`memory_limited`, and the limiting factor names the count, its estimate and the limit). The floor
grows with the replica count (each replica adds its blocks and fixed cost), which `most_replicas`'s
bisection relies on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsim.results.budget import estimate_engines_bytes, in_unit_of, machine_memory_bytes, size_unit

if TYPE_CHECKING:
    from kvsim.workload.scenario import Scenario


@dataclass(frozen=True, slots=True)
class MemoryBound:
    """The limit a plan's points must fit in, and whether the planner gave it: `name` is the setting that gave
    it, the flag `--memory-limit` or a spec file's `plan.memory_limit_bytes`, so an error names what was written."""

    limit_bytes: int
    given: bool
    name: str = "--memory-limit"

    @classmethod
    def of(cls, limit_bytes: int | None, name: str = "--memory-limit") -> MemoryBound:
        if limit_bytes is None:
            return cls(machine_memory_bytes(), given=False)
        return cls(limit_bytes, given=True, name=name)

    def needed_bytes(self, scenario: Scenario) -> int:
        """The floor of the memory `kvsim.planning.point.point_metrics` needs to simulate `scenario`."""
        from kvsim.fleet.driver import replica_groups

        return sum(estimate_engines_bytes(replica_groups(scenario), steps_in_memory=scenario.steps == "all").values())

    def fits(self, scenario: Scenario) -> bool:
        return self.needed_bytes(scenario) <= self.limit_bytes

    def most_replicas(self, scenario_for: Callable[[int], Scenario], upper: int) -> int:
        """The largest count in [0, upper] whose fleet fits (0: not even one replica), by bisection."""
        if self.fits(scenario_for(upper)):
            return upper
        low, high = 0, upper  # fleet(low) fits (0 trivially), fleet(high) does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self.fits(scenario_for(mid)) else (low, mid)
        return low

    def size(self, num_bytes: int) -> str:
        return f"{in_unit_of(num_bytes, self.limit_bytes)} {size_unit(self.limit_bytes)[0]}"

    @property
    def label(self) -> str:
        """The limit as the planner set it: `--memory-limit 8.0 GiB`, `plan.memory_limit_bytes=900000 (878.9 KiB)`
        from a spec file, or this machine's memory."""
        if self.given and self.name.startswith("--"):
            return f"{self.name} {self.size(self.limit_bytes)}"
        if self.given:
            return f"{self.name}={self.limit_bytes} ({self.size(self.limit_bytes)})"
        return f"memory limit {self.size(self.limit_bytes)} (this machine's; raise it with --memory-limit)"

    def over(self, what: str, scenario: Scenario) -> str:
        """`what` (e.g. "9 replicas") would need X > the limit: the words a memory-limited row carries."""
        return f"{what} would need {self.size(self.needed_bytes(scenario))} > limit {self.size(self.limit_bytes)}"


def bounded_by_memory(over: str) -> str:
    """A memory-limited row's words: what would not fit, its estimate and the limit (`MemoryBound.over`)."""
    return f"{over}; answer bounded by memory"
