"""What `kvsim plan` searches: the SLOs, the candidates (GPU × TP × engine knobs) and the search's knobs.

    spec = make_plan_spec({"slo": {"ttft_s.p90": 2.0, "ttft_s.p90@0": 0.5}, "gpus": ["h100-80gb"]})
    check_slo_classes(base, spec)          # every `@PRIORITY` is a class the workload has
    for candidate in candidates(spec): candidate.scenario(base, replicas, spec.router)
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from kvsim.model.engine_config import MAX_ENGINES
from kvsim.model.errors import KvsimError, first_repeat, from_validation_error, shown
from kvsim.model.spec import Settings
from kvsim.model.units import ascii_int
from kvsim.planning.slo import check_slo, parse_slo_key
from kvsim.workload.scenario import Scenario, expect_scenario, make_scenario

ROUTERS = ("round_robin", "least_outstanding", "least_kv", "affinity")


def _refuse_repeats(values: list[Any], name: str | None = None) -> None:
    """Raise ValueError naming the first value that equals one before it (`name=value` if named)."""
    twice = first_repeat(values)
    if twice is not None:
        raise ValueError(f"{twice!r} is given twice" if name is None else f"{name}={twice!r} is given twice")


class PlanSpec(Settings):
    """What to search: SLOs (`metric.stat: seconds`, or `metric.stat@priority: seconds` for one priority
    class's requests), candidate GPUs, TP sizes, engine knob grid."""

    slo: dict[str, float] = Field(min_length=1)
    gpus: list[str] = Field(min_length=1)
    tensor_parallel_sizes: list[int] = Field(default=[1], min_length=1)
    engine: dict[str, list[Any]] = Field(default_factory=dict)
    max_replicas: int = Field(default=64, gt=0, le=MAX_ENGINES)
    router: str = "least_outstanding"
    gpu_hourly_cost: dict[str, float] = Field(default_factory=dict)
    search: Literal["replicas", "rate"] = "replicas"  # bisect the replica count, or the rate one replica takes
    capacity_headroom: float = Field(default=0.1, ge=0, le=10)  # rate search: spare capacity kept, a fraction
    # rate search: the first run length bisects to this; at least 1e-9 (nine digits, far past a probe's noise):
    # under float64's resolution (about 1e-16) the bisection's bounds never came that close and the plan never ended
    rel_tol: float = Field(default=0.05, ge=1e-9, le=1)
    probe_requests: int = Field(default=2000, gt=0)  # rate search: the workload's first requests per probe
    max_probe_requests: int = Field(default=32_000, gt=0)  # a probe's run length doubles up to this
    verify_factor: int = Field(default=10, ge=0)  # the chosen fleet re-run with this × a probe's requests (0: not)
    memory_limit_bytes: int | None = Field(default=None, gt=0)  # a point's memory floor bound (None: the machine's)
    xpyd: list[str] = Field(default_factory=list)  # disaggregated splits beside the colocated fleets: 1P1D, 2P1D,
    #                                                 ...; `auto`: every split up to each shape's colocated answer
    kv_transfer_config: dict[str, Any] = Field(default_factory=dict)  # the splits' link (vLLM's --kv-transfer-config)

    @field_validator("slo")
    @classmethod
    def _known_slos(cls, slo: dict[str, float]) -> dict[str, float]:
        check_slo(slo)
        return slo

    @field_validator("xpyd")
    @classmethod
    def _splits(cls, splits: list[str]) -> list[str]:
        given = [text for text in splits if not is_auto(text)]
        for text in given:
            parse_split(text)
        if len({parse_split(text) for text in given}) < len(given) or len(given) < len(splits) - 1:
            raise ValueError("a split is given twice")
        return splits

    @model_validator(mode="after")
    def _splits_within_max_replicas(self) -> PlanSpec:
        """A split is a fleet of x + y instances: one past `max_replicas` ran anyway (the colocated search
        stops there)."""
        for text in self.xpyd:
            if not is_auto(text) and sum(parse_split(text)) > self.max_replicas:
                raise ValueError(f"xpyd={text}: {sum(parse_split(text))} instances, more than "
                                 f"max_replicas={self.max_replicas}")
        return self

    @model_validator(mode="after")
    def _rate_knobs_need_a_rate_search(self) -> PlanSpec:
        """`capacity_headroom`, `rel_tol` and `probe_requests` size a rate search only (a replica search's probes
        start at the scenario's `workload.num_requests`): beside `search: replicas` (the default) one was dropped
        without a word. Their defaults pass."""
        self.refuse_unread("search", dict.fromkeys(("capacity_headroom", "rel_tol", "probe_requests"), ("rate",)),
                           "{:g}".format, only="search=rate")
        return self

    @model_validator(mode="after")
    def _link_needs_splits(self) -> PlanSpec:
        if self.kv_transfer_config and not self.xpyd:
            raise ValueError(f"kv_transfer_config={self.kv_transfer_config}: sets the link of xPyD candidates; "
                             "give the splits with --xpyd (e.g. 1P1D,2P1D)")
        return self

    @field_validator("router")
    @classmethod
    def _known_router(cls, router: str) -> str:
        if router not in ROUTERS:
            raise ValueError(f"expected one of {', '.join(ROUTERS)}")  # the field and value lead the line
        return router

    @field_validator("gpus", "tensor_parallel_sizes")
    @classmethod
    def _each_once(cls, values: list[Any]) -> list[Any]:
        """A candidate given twice would be searched twice and ranked beside itself (as a split, `_splits`)."""
        _refuse_repeats(values)
        return values

    @field_validator("engine")
    @classmethod
    def _each_value_once(cls, engine: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, values in engine.items():
            if not values:  # the grid is a product over knobs: an empty list left no candidate at all
                raise ValueError(f"{name}=[]: give at least one value for a knob (or leave it out)")
            _refuse_repeats(values, name)
        return engine

    @field_validator("tensor_parallel_sizes")
    @classmethod
    def _positive_tp(cls, sizes: list[int]) -> list[int]:
        bad = next((tp for tp in sizes if tp <= 0), None)
        if bad is not None:  # the field and the list lead the line: it said the list twice, not which item
            raise ValueError(f"{bad} is not a positive tensor-parallel size")
        return sizes

    @field_validator("engine")
    @classmethod
    def _no_tp_knob(cls, engine: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """TP is a candidate dimension (it multiplies GPUs and cost), not an engine knob."""
        if "tensor_parallel_size" in engine:
            raise ValueError(f"tensor_parallel_size={engine['tensor_parallel_size']}: give TP sizes with "
                             "-tp/--tensor-parallel-size (or tensor_parallel_sizes), so GPUs and cost count them")
        return engine

    @field_validator("gpu_hourly_cost")
    @classmethod
    def _positive_cost(cls, costs: dict[str, float]) -> dict[str, float]:
        for gpu, cost in costs.items():
            if (problem := cost_problem(cost)) is not None:  # as `kvsim.planning.cost.gpu_price` will check it, after
                raise ValueError(f"{gpu}={cost}: {problem}")  # the search; inf refused before
        return costs

    @model_validator(mode="after")
    def _costs_for_candidates(self) -> PlanSpec:
        """A price for a GPU that is not a candidate is a typo or a forgotten `--gpu`: refuse it."""
        stray = sorted(set(self.gpu_hourly_cost) - set(self.gpus))
        if stray:
            raise ValueError(f"gpu_hourly_cost names {stray[0]!r}, which is not a candidate GPU "
                             f"(gpus: {', '.join(self.gpus)})")
        return self

    @model_validator(mode="after")
    def _costs_within_a_float(self) -> PlanSpec:
        """A fleet's cost per hour is the price × its GPUs: past a float's range (`1e308` × 3 GPUs) it was inf,
        ranked as every other and a traceback printing the answer, after the whole search. The plan's largest
        fleet is `max_replicas` replicas (a split's instances are at most as many) of its largest TP."""
        num_gpus = self.max_replicas * max(self.tensor_parallel_sizes)
        for gpu, cost in self.gpu_hourly_cost.items():
            if not math.isfinite(cost * num_gpus):
                raise ValueError(f"gpu_hourly_cost: {gpu}={cost:g}: its largest fleet ({num_gpus:,} GPUs: "
                                 f"max_replicas={self.max_replicas} of TP {max(self.tensor_parallel_sizes)}) would "
                                 "cost more per hour than a float holds")
        return self


def cost_problem(cost: float) -> str | None:
    """Why `cost` (a finite number) is no GPU's hourly cost, or None: `PlanSpec`'s rule, which `kvsim plan
    --gpu-hourly-cost` applies to the number it reads, so that its error echoes the text given (`-2`, not `-2.0`)."""
    return "an hourly cost must be a positive, finite price in USD per GPU-hour" if cost <= 0 else None


# ASCII digits: `\d` holds other scripts' (`１P1D` ran as 1P1D), which no flag kvsim reads is written in
SPLIT = re.compile(r"([0-9]+)P([0-9]+)D", re.IGNORECASE | re.ASCII)
AUTO = "auto"  # as a split: every split of x + y <= the instances of the shape's colocated answer


def is_auto(text: str) -> bool:
    return isinstance(text, str) and text.strip().lower() == AUTO


def parse_split(text: str) -> tuple[int, int]:
    """`2P1D` -> (2 prefill instances, 1 decode instance); a `ValueError` naming the text otherwise (a count of
    more digits than `int()` converts, too: its own advice to raise Python's limit was the line)."""
    match = SPLIT.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r}: expected xPyD (x prefill and y decode instances), e.g. 1P1D or 2P1D, or auto")
    num_prefill, num_decode = ascii_int(match[1]), ascii_int(match[2])
    if num_prefill is None or num_decode is None:
        raise ValueError(f"{shown(text)}: more instances than kvsim builds ({MAX_ENGINES:,})")
    if num_prefill == 0 or num_decode == 0:
        pool = "prefill (kv_producer)" if num_prefill == 0 else "decode (kv_consumer)"
        raise ValueError(f"{text!r}: needs at least 1 {pool} instance")
    return num_prefill, num_decode


def make_plan_spec(raw: dict[str, Any]) -> PlanSpec:
    try:
        return PlanSpec.model_validate(raw)  # not **raw: a key may not be a str
    except ValidationError as error:
        raise from_validation_error(error, prefix="plan") from None


def workload_priorities(base: Scenario) -> set[int] | None:
    """The request priorities `base`'s workload gives: its class mix's, {0} without one, None when a
    trace's priority column sets them (any value may appear; a class no request has then misses)."""
    w = base.workload
    if w.trace is not None and w.trace.priority_column is not None:
        return None
    return {c.priority for c in w.priority.classes} if w.priority is not None else {0}


def check_slo_classes(base: Scenario, spec: PlanSpec) -> None:
    """Refuse an SLO for a priority class no request of `base` can have (a typo would pass vacuously
    or never): a `KvsimError` naming the SLO and the workload's classes."""
    known = workload_priorities(base)
    if known is None:
        return
    for key in spec.slo:
        priority = parse_slo_key(key)[2]
        if priority is not None and priority not in known:
            w = base.workload
            classes = (", ".join(f"{c.name}={c.priority}" for c in w.priority.classes) if w.priority is not None
                       else "none: every request has priority 0")
            raise KvsimError(f"slo {key}: no request of this workload has priority {priority} "
                             f"(workload.priority classes: {classes})")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One deployment shape: GPU, tensor-parallel size and engine settings; colocated (replica count
    searched), or an xPyD `split` (x prefill + y decode instances of that shape, every instance at that
    TP, over the link `kv_transfer_config`, a JSON object)."""

    gpu: str
    tensor_parallel_size: int
    knobs: tuple[tuple[str, Any], ...] = ()
    split: tuple[int, int] | None = None
    kv_transfer_config: str = "{}"

    def __post_init__(self) -> None:
        """The fields a scenario does not check for it (`scenario` gives the GPU and TP to `make_scenario`), each a
        `KvsimError` naming it: a notebook's `knobs=5` was a TypeError, `split=(1,)` an IndexError and a
        `kv_transfer_config` that is no JSON object a JSONDecodeError, at the first `scenario`."""
        if not isinstance(self.knobs, tuple) or not all(
                isinstance(knob, tuple) and len(knob) == 2 and isinstance(knob[0], str) for knob in self.knobs):
            raise KvsimError(f"knobs={shown(self.knobs)}: expected a tuple of (engine field, value) pairs")
        if self.split is not None and (not isinstance(self.split, tuple) or len(self.split) != 2 or any(
                isinstance(count, bool) or not isinstance(count, int) or count < 1 for count in self.split)):
            raise KvsimError(f"split={shown(self.split)}: expected (prefill instances, decode instances), each 1 or "
                             "more")
        try:
            link = json.loads(self.kv_transfer_config) if isinstance(self.kv_transfer_config, str) else None
        except json.JSONDecodeError:
            link = None
        if not isinstance(link, dict):
            raise KvsimError(f"kv_transfer_config={shown(self.kv_transfer_config)}: expected a JSON object's text, "
                             "e.g. '{\"kv_link\": \"rdma\"}'")

    @property
    def label(self) -> str:
        knobs = "".join(f" {k}={v}" for k, v in self.knobs)
        split = f" {self.topology}" if self.split else ""
        return f"{self.gpu} tp{self.tensor_parallel_size}{knobs}{split}"

    @property
    def topology(self) -> str | None:
        """A split's `xPyD` (None: colocated)."""
        return f"{self.split[0]}P{self.split[1]}D" if self.split else None

    def split_columns(self) -> dict[str, Any]:
        """A plan row's columns of a split: its topology and instance counts (none for a colocated candidate)."""
        if self.split is None:
            return {}
        return {"topology": self.topology, "prefill_instances": self.split[0], "decode_instances": self.split[1]}

    def unsearched_row(self, headroom: float | None, limiting_factor: str) -> dict[str, Any]:
        """The infeasible plan row of this candidate where nothing was simulated, `limiting_factor` saying why (an
        SLO under its latency floor, an engine that does not fit its GPU)."""
        return {"candidate": self.label, "gpu": self.gpu, "tensor_parallel_size": self.tensor_parallel_size,
                **dict(self.knobs), **self.split_columns(), "feasible": False, "memory_limited": False,
                "replicas": None, "num_gpus": None, "cost_per_hour": None, "headroom": headroom,
                "limiting_factor": limiting_factor}

    @property
    def smallest_fleet(self) -> int:
        """The fewest instances this candidate runs: 1 replica, or a split's x + y."""
        return sum(self.split) if self.split else 1

    def scenario(self, base: Scenario, replicas: int, router: str) -> Scenario:
        """The base scenario's traffic on `replicas` replicas of this candidate behind `router` (a split:
        its x + y instances, each pool behind `router` unless `kv_transfer_config` names a pool's router). The
        base's `enable_prefix_caching` left at its default stays a default (`Scenario.variant_fields`): a knob
        `scheduler: v0` caches nothing, as vLLM's v0 engine, and a slab candidate does not say it unread."""
        raw = expect_scenario(base, "base").variant_fields()  # a notebook's path was an AttributeError
        raw["engine"] = {**raw["engine"], "tensor_parallel_size": self.tensor_parallel_size, **dict(self.knobs)}
        raw.update(gpu=self.gpu, replicas=replicas, router={**raw["router"], "policy": router},
                   name=f"{base.name}/{self.label.replace(' ', '_')}/x{replicas}")
        if self.split is not None:  # each pool's router routes a split; the fleet's router is left as it was
            raw["router"] = base.router.model_dump(mode="json")
            num_prefill, num_decode = self.split
            if replicas != num_prefill + num_decode:  # it was an assert: a notebook's call may give another count
                raise KvsimError(f"replicas={shown(replicas)}: the split {self.topology} runs its "
                                 f"{num_prefill} + {num_decode} = {num_prefill + num_decode} instances")
            raw["replicas"] = [{"count": num_prefill, "name": "prefill", "kv_role": "kv_producer"},
                               {"count": num_decode, "name": "decode", "kv_role": "kv_consumer"}]
            raw["kv_transfer_config"] = {"prefill_router": {"policy": router}, "decode_router": {"policy": router},
                                         **json.loads(self.kv_transfer_config)}
        return make_scenario(raw, base.base_dir)


def candidates(spec: PlanSpec) -> list[Candidate]:
    """Every combination of GPU, TP size and engine knob values, in the order given: colocated, then
    each xPyD split of each (`spec.xpyd`)."""
    names = list(spec.engine)
    grid = itertools.product(*(spec.engine[name] for name in names))
    knob_sets = [tuple(zip(names, values, strict=True)) for values in grid]
    shapes = [(gpu, tp, knobs) for gpu in spec.gpus for tp in spec.tensor_parallel_sizes for knobs in knob_sets]
    given = [parse_split(text) for text in spec.xpyd if not is_auto(text)]
    return [Candidate(*shape) for shape in shapes] + [with_split(Candidate(*shape), split, spec)
                                                      for split in given for shape in shapes]


def with_split(shape: Candidate, split: tuple[int, int], spec: PlanSpec) -> Candidate:
    """`shape` (a colocated candidate) as the xPyD `split` over the plan's link."""
    return dataclasses.replace(shape, split=split, kv_transfer_config=json.dumps(spec.kv_transfer_config,
                                                                                 sort_keys=True))


def has_auto(spec: PlanSpec) -> bool:
    """Whether the plan asks for the automatic splits (`xpyd: [auto]`)."""
    return any(is_auto(text) for text in spec.xpyd)


def auto_splits(spec: PlanSpec, shape: Candidate, num_replicas: int) -> list[Candidate]:
    """With `xpyd: [auto]`: every split x + y <= `num_replicas` (the shape's colocated answer, so no
    split uses more GPUs than it), fewest instances first, fewer prefill first; the given splits
    excepted (they are candidates already)."""
    if not has_auto(spec):
        return []
    given = {parse_split(text) for text in spec.xpyd if not is_auto(text)}
    splits = [(x, total - x) for total in range(2, num_replicas + 1) for x in range(1, total)]
    return [with_split(shape, split, spec) for split in splits if split not in given]


