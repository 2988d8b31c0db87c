"""Judging one run's window evidence (`kvsim.planning.window.window_evidence`) against SLOs: does the probe pass,
by how much, and if not, why.

    evidence = window_evidence(result.requests)                  # JSON-safe, SLO-independent
    ok = probe_passes(evidence, {"ttft_s.p90": 2.0})             # stable and every SLO met
    ok = probe_passes(evidence, {"ttft_s.p90@0": 0.5})           # ... over priority-0 requests only

A rate passes only when its probe is stable *and* every SLO percentile, taken over the servable
requests that arrived inside the window, is within its limit. An SLO may name one priority class,
`METRIC.STAT@PRIORITY` (vLLM's integer request priority, as the summary's `by_priority` keys it):
its percentile is then taken over the window's requests of that priority only (`parse_slo_key`).
Each percentile comes with a 95 % order-statistic confidence interval (the ranks n·p ∓
1.96·√(n·p·(1−p)) of the sorted sample, the normal approximation of the binomial): latencies of
neighbouring requests are correlated in a queue, so read it as a lower bound on the uncertainty.
Requests the engine refuses (prompt over `max_model_len`, more KV than the pool ever holds) are
counted apart: neither offered nor SLO misses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from kvsim.model.errors import KvsimError, shown
from kvsim.model.units import ascii_int
from kvsim.planning.window import SLO_METRICS, SLO_STATS, STABLE, STALLED, metric_stats

SLO_KEY_FORMAT = "METRIC.STAT or METRIC.STAT@PRIORITY"


def parse_slo_key(key: str) -> tuple[str, str, int | None]:
    """`ttft_s.p90` → ("ttft_s", "p90", None); `ttft_s.p90@1` → ("ttft_s", "p90", 1): the SLO over priority-1
    requests. A malformed key raises `KvsimError` naming it (a `ValueError` too, which a pydantic validator
    wraps). The class is an integer as `str(int)` writes it: `int()` also read `1_0` as 10, `+1`, `01` and a
    fullwidth `１` as 1 (two keys of one class: two limits), and refused more digits than it converts with its own
    advice (`kvsim.model.units.ascii_int`)."""
    if not isinstance(key, str):
        raise KvsimError(f"{shown(key)}: expected {SLO_KEY_FORMAT}, a string")
    name, at, cls = key.partition("@")
    metric, _, stat = name.partition(".")
    if metric not in SLO_METRICS or stat not in SLO_STATS:
        raise KvsimError(f"{key!r}: expected {SLO_KEY_FORMAT} with METRIC in {SLO_METRICS}, STAT in {SLO_STATS}")
    if not at:
        return metric, stat, None
    magnitude = ascii_int(cls.removeprefix("-"))
    priority = None if magnitude is None else -magnitude if cls.startswith("-") else magnitude
    if priority is not None and str(priority) == cls:
        return metric, stat, priority
    raise KvsimError(f"{key!r}: the class after '@' must be an integer request priority, got {cls!r}")


def check_slo(slo: Mapping[str, float]) -> None:
    """A `KvsimError` naming the first SLO whose key `parse_slo_key` refuses or whose limit is no positive, finite
    number of seconds (a limit of 0 divided `headroom` by zero). Every reader of an SLO here checks the whole SLO
    first, whatever the run's verdict: a bad key is refused on an overloaded run as on a stable one. An SLO that is
    no mapping is one too (a notebook's list of keys was an AttributeError; a bad key or limit given to
    `probe_passes` was a plain `ValueError`, not kvsim's error type)."""
    if not isinstance(slo, Mapping):
        raise KvsimError(f"slo={shown(slo)}: expected a mapping of SLO keys to seconds, e.g. {{'ttft_s.p90': 2}}")
    for key, limit in slo.items():
        parse_slo_key(key)
        if (problem := slo_limit_problem(limit)) is not None:
            raise KvsimError(f"{key}={shown(limit)}: {problem}")


def slo_limit_problem(limit: Any) -> str | None:
    """Why `limit` is no SLO limit (no positive, finite number of seconds), or None: `check_slo`'s rule, which
    `kvsim plan --slo` applies to the number it reads, so that its error echoes the text given (`-1`, not `-1.0`)."""
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit < math.inf:
        return "must be a positive, finite number of seconds"
    return None


def slo_stats(evidence: Mapping[str, Any], metric: str, priority: int | None) -> Mapping[str, Any]:
    """The window's stats of `metric`, over every request or over one priority's (empty when none arrived).
    A run whose table has no `priority` column gave every request priority 0."""
    if priority is None or ("by_priority" not in evidence and priority == 0):
        return evidence[metric]
    return evidence.get("by_priority", {}).get(str(priority), {}).get(metric) or metric_stats(np.zeros(0))


def slo_values(evidence: Mapping[str, Any], slo: Mapping[str, float]) -> dict[str, float]:
    """Each SLO's measured value over the window, or over its class's requests there (inf when none
    produced one); an `evidence` without that figure (a hand-made dict, not `window_evidence`'s) is a `KvsimError`
    naming the SLO."""
    check_slo(slo)
    out = {}
    for key in slo:
        metric, stat, priority = parse_slo_key(key)
        try:  # a hand-made dict with a verdict but no such figure was a KeyError, TypeError or AttributeError
            value = slo_stats(evidence, metric, priority)[stat]
            out[key] = math.inf if value is None else float(value)
        except (KeyError, TypeError, AttributeError, ValueError):
            raise KvsimError(f"evidence: no number for {key}; expected a run's window evidence "
                             "(kvsim.planning.window.window_evidence(result.requests))") from None
    return out


def headroom(evidence: Mapping[str, Any], slo: Mapping[str, float]) -> float:
    """min over SLOs of (limit − value) ÷ limit: ≥ 0 means every SLO is met in the window (inf: no SLO)."""
    values = slo_values(evidence, slo)
    return min(((limit - values[key]) / limit for key, limit in slo.items()), default=math.inf)


def verdict(evidence: Mapping[str, Any]) -> str:
    """The run's verdict in `evidence`, or a `KvsimError` naming a value that is no window evidence (None, a
    `RunResult`, a table: a TypeError or KeyError in the SLO readers)."""
    if not isinstance(evidence, Mapping) or "verdict" not in evidence:
        raise KvsimError(f"evidence={shown(evidence)}: expected a run's window evidence "
                         "(kvsim.planning.window.window_evidence(result.requests))")
    return evidence["verdict"]


def probe_passes(evidence: Mapping[str, Any], slo: Mapping[str, float]) -> bool:
    """Stable over the window and every SLO within its limit there (no SLO: stability alone, the capacity)."""
    check_slo(slo)
    return verdict(evidence) == STABLE and headroom(evidence, slo) >= 0


def shortage(evidence: Mapping[str, Any], num_preemptions: int) -> str:
    """What a failed run says it was short of (the plan's limiting factor), from its verdict and preemptions.

    A run that keeps up (stable) but misses an SLO says which resource made it wait: preempting means its
    KV pool could not hold the batch its traffic needs ("KV memory (preempting while it keeps up)"), else
    requests queued for compute or batch slots ("compute (queueing)"). A run that does not keep up
    (overloaded, backlogged) says only that it is over capacity: its waiting queue grows, so the scheduler
    admits until the KV pool is full and then preempts whatever resource binds; its preemptions are a symptom,
    not the cause (the first-principles floor, `kvsim.planning.bounds`, says which binds). A stalled run was
    short of KV memory: its queue's head could not fit beside requests holding their KV (`HeldKvStall`)."""
    if evidence["verdict"] == STALLED:
        return "KV memory (stalled: the queue's head cannot fit beside requests holding their KV, vLLM's deadlock)"
    if evidence["verdict"] == STABLE:
        return "KV memory (preempting while it keeps up)" if num_preemptions else "compute (queueing)"
    return ("over capacity (preempting: an overloaded batch fills the KV whatever binds)" if num_preemptions
            else "over capacity (queueing)")


def missed_within_noise(evidence: Mapping[str, Any], slo: Mapping[str, float]) -> bool:
    """Whether a stable run missed SLOs only within its sample's noise: each missed percentile's 95 % confidence
    interval reaches down to its limit, so a longer run may well meet it. A mean has no interval here, and an
    unstable verdict is no SLO's noise: False for those, and for a run that missed nothing."""
    check_slo(slo)
    if verdict(evidence) != STABLE:
        return False
    missed = [key for key, value in slo_values(evidence, slo).items() if value > slo[key]]
    for key in missed:
        metric, stat, priority = parse_slo_key(key)
        low = slo_stats(evidence, metric, priority).get(f"{stat}_ci", (None, None))[0]
        if low is None or low > slo[key]:
            return False
    return bool(missed)


def why_failed(evidence: Mapping[str, Any] | None, slo: Mapping[str, float]) -> str | None:
    """'is overloaded' / 'is backlogged' / 'is stalled' when the system was not stable, else 'misses' and the SLOs
    missed."""
    check_slo(slo)
    if evidence is None:
        return None
    if (state := verdict(evidence)) != STABLE:
        return f"is {state}"
    missed = [k for k, v in slo_values(evidence, slo).items() if v > slo[k]]
    return "misses " + ", ".join(missed) if missed else None
