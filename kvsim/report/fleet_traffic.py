"""Which shipped trace the report's fleet section serves: the first that the report's engine can serve.

The section answers "how many GPUs for this traffic" with real traffic: arrival times and lengths from a
production trace shipped in `kvsim/workload/data`. Two are tried, in this order:

1. the Mooncake FAST'25 conversation slice: real arrivals, lengths and 512-token prefix `hash_ids`, so a
   prefix cache has real reuse to find and the routers comparison (affinity against load-only routing) means
   something. Its prompts are long (14k tokens on average over the first 300, median 8.8k);
2. the Azure LLM inference trace 2023, conversation service: real arrivals and lengths (900 tokens on average
   over the first 300, the longest 4,107), but no prompt content, so no prefix is known to be shared.

A trace is served when at most `UNSERVABLE_SHARE` of its first requests have prompts of max_model_len or more
(those vLLM refuses; served, they are refused and counted, never truncated): sizing the rest of a trace refused
mostly would answer another question. The first trace served is chosen, so an engine that takes Mooncake's
prompts keeps the routers comparison; one that does not (the report's L4 default, max_model_len 4,096: 210 of
Mooncake's first 300 prompts are longer) is sized on Azure's lengths, and the section says so and why. When
neither is served, nothing is sized.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.workload.rows_read import read_rows
from kvsim.workload.scenario import Scenario
from kvsim.workload.traces import NO_COLUMNS, TraceRecord

UNSERVABLE_SHARE = 0.5  # more of a trace than this at max_model_len or over: not served, the next one tried


@dataclass(frozen=True, slots=True)
class FleetTrace:
    """A shipped trace the fleet section may serve: its scenario `workload.trace`, and how the report names it."""

    path: str  # `builtin:NAME`
    format: str  # the scenario's `workload.trace.format` (a key of `ROW_READERS`)
    name: str  # short, in the section's title and the summary: "Mooncake"
    label: str  # "the Mooncake conversation trace"
    source: str  # whose traffic, before "real arrivals" in the section's first sentence
    attribution: str  # what it carries besides lengths, and its licence's attribution, after them
    has_prefixes: bool  # prompt blocks carry identities: a prefix cache and the affinity router have reuse to find


MOONCAKE = FleetTrace("builtin:mooncake_conversation_head", "mooncake", "Mooncake",
                      "the Mooncake conversation trace", "Kimi's production traffic",
                      "512-token prefix hashes; Apache-2.0, Qin et al., FAST 2025", True)
AZURE_CONV = FleetTrace("builtin:azure_conv", "azure", "Azure conversation",
                        "the Azure LLM inference trace's conversation service", "Azure's production traffic, 2023",
                        "lengths alone, no prompt content; CC-BY 4.0, Patel et al., Splitwise, ISCA 2024", False)
TRACES = (MOONCAKE, AZURE_CONV)  # tried in this order (module docstring)


@dataclass(frozen=True, slots=True)
class TraceTried:
    """One trace's first requests and how many of them the engine refuses (prompt ≥ max_model_len)."""

    trace: FleetTrace
    records: list[TraceRecord]
    num_too_long: int

    @property
    def served(self) -> bool:
        return self.num_too_long <= UNSERVABLE_SHARE * len(self.records)


def records(base: Scenario, trace: FleetTrace, num_requests: int) -> list[TraceRecord]:
    """The first `num_requests` requests of `trace`, read from the shipped file `base` resolves it to (parsed once
    for this and the section's runs: `read_rows`)."""
    return read_rows(base.resolve_path(trace.path, "workload.trace.path"), trace.format, NO_COLUMNS)[:num_requests]


def choose(base: Scenario, num_requests: int, max_model_len: int) -> list[TraceTried]:
    """`TRACES` tried in order up to the first served (the last, its `served` true); all of them when none is."""
    tried = []
    for trace in TRACES:
        head = records(base, trace, num_requests)
        tried.append(TraceTried(trace, head, sum(r.prompt_len >= max_model_len for r in head)))
        if tried[-1].served:
            break
    return tried
