"""The least latency any request can see: SLOs no fleet can meet, found before anything is simulated.

    floor = slo_floor(scenario)                  # None where no floor is proved (see below)
    missed = unreachable_slos(floor, slo)        # {"ttft_s.p90": its floor, ...}: nothing meets those

A token is sampled at the end of a step, and a step lasts at least the fastest one there is, t_1: one sequence
computing one token from an empty context and sampling it (the latency model's `step_time`; the constant and
roofline models' step times grow with tokens, sequences and context, and a step that samples nothing, a prefill
chunk short of the prompt's end, is no token's). So, without speculative decoding (a verify step emits several
tokens), every servable request has

    TTFT ≥ ⌈u / C⌉ · t_1     its uncached prompt u takes at least that many steps of at most C tokens
                             (C = max_num_batched_tokens; u = 1 with prefix caching on or an offload
                             tier, whose load time is left out: a full hit or load still
                             computes the prompt's last token), the last of which samples the first token
    TPOT ≥ t_1               each later token is sampled by a step of its own
    E2E  ≥ O · t_1           O output tokens, each at a step's end after its arrival

whatever the fleet, the router or the load: more replicas only take queueing away. The floor is per request and
a window's percentile (or mean) is over some of them, so it is the least such floor over every servable request
the traffic can have, u and O the least prompt and output any run of it can hold, at any length
(`kvsim.workload.least_lengths`: from the length distributions and every row of a trace a run can take, not from
the base traffic's first requests: a plan's probes and verification runs are longer and take later draws and
rows). An SLO below it is missed at every count and every run length. `queue_s` has none (an idle replica admits
at once). A calibrated profile interpolates measured times, which need not grow with the batch, and a speculative
step emits up to K + 1 tokens: no floor is claimed there (None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvsim.latency.step_plan import StepPlan
from kvsim.planning.slo import parse_slo_key
from kvsim.workload.scenario import Scenario

FLOOR_LATENCY_MODELS = ("constant", "roofline")
FLOAT_SLACK = 1e-9  # a run's times are sums of step times: 0.02 s steps gave a TPOT of 0.019999999999999993


@dataclass(frozen=True, slots=True)
class SloFloor:
    """The least TTFT, TPOT and E2E (seconds) any servable request of a traffic (at any length) sees on one engine
    shape, from `step_s`, the fastest step (one sequence sampling one token from an empty context)."""

    step_s: float
    ttft_s: float
    tpot_s: float
    e2e_s: float


def slo_floor(scenario: Scenario) -> SloFloor | None:
    """The floor of `scenario`'s traffic, at any `num_requests`, on its engine shape; None where none is proved (a
    calibrated latency model, speculative decoding) or no request can be served (every prompt reaches
    max_model_len)."""
    from kvsim.engine.builder import make_latency, resolve_engine
    from kvsim.workload.least_lengths import least_lengths

    spec = resolve_engine(scenario)
    engine = spec.engine
    if scenario.latency.model not in FLOOR_LATENCY_MODELS or engine.speculative_config is not None:
        return None
    least = least_lengths(scenario, spec.max_model_len)
    if least is None:
        return None
    fastest = StepPlan()
    fastest.add(1, 0, 1, logits_row=True)
    step_s = make_latency(spec).step_time(fastest)
    chunk = engine.resolved_max_num_batched_tokens(spec.max_model_len, spec.gpu)
    # at best all but its last token hit the GPU cache or load from an offload tier (the load time left out)
    uncached = 1 if engine.enable_prefix_caching or engine.has_offload_tier else least.prompt_len
    return SloFloor(step_s, math.ceil(uncached / chunk) * step_s, step_s, least.output_len * step_s)


def unreachable_slos(floor: SloFloor | None, slo: dict[str, float]) -> dict[str, float]:
    """Each SLO (`METRIC.STAT`, or `@PRIORITY`) whose limit is below the floor of its metric (beyond float noise,
    `FLOAT_SLACK`), with that floor."""
    if floor is None:
        return {}
    least = {"ttft_s": floor.ttft_s, "tpot_s": floor.tpot_s, "e2e_s": floor.e2e_s}
    return {key: least[metric] for key, limit in slo.items()
            if (metric := parse_slo_key(key)[0]) in least and limit < least[metric] * (1 - FLOAT_SLACK)}


def unreachable_text(missed: dict[str, float], slo: dict[str, float], step_s: float) -> str:
    """One line: the SLOs no fleet meets and their floors, from the fastest step."""
    parts = ", ".join(f"{key} <= {slo[key]:g} s (at least {value:.4g} s)" for key, value in missed.items())
    return (f"no fleet can meet {parts}: every token takes a step of at least {step_s:.4g} s (one sequence alone), "
            "however many replicas share the traffic")


@dataclass(slots=True)
class Unsearched:
    """A plan's stand-in for a candidate's search where nothing is simulated (its SLOs under their floor here, its
    engine over its GPU: `kvsim.planning.plan_checks.UnfitSearch`): it asks for no point, holds no point back under a
    memory limit and has no answer's metrics; its `row`, the subclass's, says why it is infeasible."""

    candidate: Any  # a `kvsim.planning.spec.Candidate`

    def next_scenario(self) -> None:
        return None

    def observe(self, metrics: Any) -> None:
        raise AssertionError(f"{self.candidate.label}: a candidate that is not searched asks for no point")

    def memory_block(self) -> None:
        return None

    def answer_metrics(self) -> None:
        return None


@dataclass(slots=True)
class UnreachableSearch(Unsearched):
    """A candidate whose SLOs its floor rules out: nothing is simulated, and its row says why."""

    floor: SloFloor
    missed: dict[str, float]
    slo: dict[str, float]

    def row(self, hourly_cost: float | None) -> dict[str, Any]:
        """Infeasible, with the SLOs' headroom at their floors (negative: each limit short of its floor)."""
        return self.candidate.unsearched_row(min((self.slo[k] - v) / self.slo[k] for k, v in self.missed.items()),
                                             unreachable_text(self.missed, self.slo, self.floor.step_s))
