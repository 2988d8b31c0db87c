"""`kvsim plan`: the cheapest fleet that meets latency SLOs for a given traffic.

    spec = PlanSpec(slo={"ttft_s.p90": 2.0, "tpot_s.p90": 0.1}, gpus=["h100-80gb", "h200"],
                    tensor_parallel_sizes=[1, 2], engine={"max_num_seqs": [128, 256]})
    rows = plan(base_scenario, spec, out_dir)          # ranked, cheapest first

The base scenario's workload is the whole fleet's traffic (a trace, or a rate and a length
mix). Each candidate (GPU × TP × engine knobs) gets the fewest replicas that meet every SLO
at that traffic: counts 1, 2, 4, … are tried until one meets it, then bisection between the
last miss and the first hit (`kvsim.planning.replica_search`; the count just below, where its probe missed an SLO
only within the percentile's confidence interval, is run again long before it is given up). This assumes that
adding a replica never breaks an SLO (more replicas, less load each), which holds for the load-aware routers and
round robin alike.

A count passes only when its fleet is stable and meets every SLO over the steady-state
measurement window (`kvsim.planning.steady_state`); the chosen count is then re-run with 10×
the requests, and while that long run fails, one replica more is tried long (`kvsim.planning.verify`:
`replicas` is the count that held, `searched_replicas` the probes' answer, `verified`, `verify_*`).

For each candidate the table gives the cost per hour (replicas × TP × the GPU's hourly
price: the planner's, or the shipped list's, `price_source`), the cost per million output tokens (that
over the output rate the run behind the answer serves in its steady-state window,
`kvsim.planning.cost.window_output_tokens_per_s`; a rate search with no long run: its answer probe's, scaled
to the whole traffic, `RateSearch.output_tokens_per_s`), GPUs, replicas, the headroom
(the smallest relative slack of an SLO at that count), the limiting factor (the SLO that
failed with one replica fewer, and what that fleet was short of: when it kept up, KV memory if it
preempted, else compute; when it did not, only that it was over capacity, since any overloaded engine fills
its KV and preempts: `kvsim.planning.slo.shortage`), the window's evidence, and the first-principles floor
(`kvsim.planning.bounds`: `lower_bound_replicas`, which bound binds, `replicas_over_bound`) with the gap to it
(`gap_*`), both of the run behind the answer, its requests at the rate it served them (`answer_floor`); a row
with no run behind its answer (no answer, a split, a rate search without long runs) has the floor of the traffic
its evidence columns describe, at the rate that traffic was offered, and no gap.

A candidate whose latency floor rules out an SLO (`kvsim.planning.slo_floor`: every token takes at least the
fastest step, so a TTFT, TPOT or E2E limit under that is missed at any count) is not searched: its row says so.

`xpyd: [1P1D, 2P1D]` adds those disaggregated prefill/decode splits of every candidate shape, each one
fixed fleet judged the same way (`kvsim.planning.xpyd`), ranked with the colocated rows by cost
(`topology`, `usd_per_million_output_tokens`). Every point is memory-estimated first
(`kvsim.planning.memory`, `memory_limit_bytes`): a search stops at the most replicas that fit and
marks its row `memory_limited`; a plan nothing of which fits is refused before it starts.

`search: rate` sizes a homogeneous fleet instead from the highest load one replica sustains
(`kvsim.planning.plan_rate`): one single-replica bisection per candidate, then
`replicas = ceil((1 + capacity_headroom) · target rate / max rate per replica)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from kvsim.model.errors import KvsimError, empty_item, expect_function, shown
from kvsim.model.units import read_number
from kvsim.model.yaml_io import flag_mapping, load_yaml
from kvsim.planning.bounds import ReplicaFloor, gap_breakdown, gap_text, replica_floor, run_floor
from kvsim.planning.cost import (
    GpuPrice,
    cost_per_million_output_tokens,
    gpu_price,
    usd_rounded,
)
from kvsim.planning.plan_checks import StandIns, UnfitSearch, check_candidates
from kvsim.planning.plan_rate import (
    RateSearch,
    offered_rate_per_s,
    scaled_traffic,
)
from kvsim.planning.point import POINT_FORMAT, point_metrics, point_problem
from kvsim.planning.replica_search import ReplicaSearch
from kvsim.planning.search import Metrics, PointStore, run_searches, scenario_hash
from kvsim.planning.slo import slo_limit_problem
from kvsim.planning.slo_floor import UnreachableSearch, Unsearched, slo_floor, unreachable_slos
from kvsim.planning.spec import (
    Candidate,
    PlanSpec,
    auto_splits,
    candidates,
    cost_problem,
    make_plan_spec,
)
from kvsim.planning.verify import traffic_of
from kvsim.planning.xpyd import XpydSearch
from kvsim.results.output_dir import claim_directory
from kvsim.workload.overrides import override_items
from kvsim.workload.scenario import Scenario

POINTS_FILE = "points.jsonl"  # the file in a plan's folder that keeps its finished points


AnySearch = ReplicaSearch | RateSearch | XpydSearch | UnreachableSearch | UnfitSearch


def rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Feasible first, then by cost per hour (priced rows first), then fewer GPUs, then cost per million output
    tokens, then more headroom, then candidate name, so that equal rows come in one order whatever order the
    candidates ran in; every row with every column (None where a row has no value), in the order they first appear.

    Costs are compared as `usd_rounded` prints them, to 4 significant digits: a relative tolerance (about 0.01 %),
    so the float noise of one price summed two ways (3 GPUs at $2.30, 6.8999999999999995, and 2 at $3.45, 6.9)
    is a tie, and a difference in the digits the table shows is an order, at $100 an hour or $0.001 alike. (An
    absolute $0.0001 tied costs that round alike, however far apart: $0.00006 and $0.00014 per Mtok.)"""
    def usd(value: float | None) -> float:
        return math.inf if (rounded := usd_rounded(value)) is None else rounded

    def key(row: dict[str, Any]) -> tuple:
        cost, room = row["cost_per_hour"], row["headroom"]
        return (not row["feasible"], cost is None, usd(cost), row["num_gpus"] or 0,
                usd(row.get("usd_per_million_output_tokens")), -room if room is not None else math.inf,
                row["candidate"])
    columns = list(dict.fromkeys(["rank", *(k for row in rows for k in row)]))
    ranked = [{"rank": i + 1, **row} for i, row in enumerate(sorted(rows, key=key))]
    return [{k: row.get(k) for k in columns} for row in ranked]


def plan(base: Scenario, spec: PlanSpec, out_dir: str | Path, client: Any = None,
         on_point: Any = None, on_note: Callable[[str], None] | None = None,
         stand_ins: StandIns | None = None) -> tuple[list[dict[str, Any]], int]:
    """Search every candidate; returns the ranked rows and how many points were simulated now.

    Finished points are kept in `out_dir/points.jsonl`, so a rerun resumes where it stopped; points there of
    another `POINT_FORMAT`, or whose metrics are malformed (`point_problem`), are simulated again, and `on_note`
    gets one line saying so (one for each reason) before any point runs. A `base` that is no Scenario, a `spec`
    that is no PlanSpec, an `out_dir` that is no path, an `on_point` or `on_note` that is no function of its
    arguments and a `client` that is no Dask client are each a `KvsimError` naming it before any point (a notebook's
    path or dict was an AttributeError, an `out_dir` of None a TypeError, deep in the plan; `on_point=5` a TypeError
    after the first point had run and been stored).
    `out_dir` follows kvsim's output rule (`kvsim.results.output_dir`), as `kvsim plan`'s `-o` and
    `RunResult.write` do: it is new (made here once the candidates are good) or a plan folder kvsim made, whose
    marker then lists points.jsonl; a folder kvsim did not make (a bare `tempfile.mkdtemp()`, a user's) is refused,
    where points.jsonl was written into it. `stand_ins`: what `check_candidates` returned for this `base` and
    `spec` (`kvsim plan` checked them before it made its folder), so no candidate's fit is sized again; None: new.
    """
    from kvsim.workload.generate import short_trace_said_once
    from kvsim.workload.scenario import expect_scenario

    expect_scenario(base, "base")
    if not isinstance(spec, PlanSpec):
        raise KvsimError(f"spec={shown(spec)}: expected a PlanSpec (kvsim.planning.spec.make_plan_spec(fields) "
                         "makes one)")
    if not isinstance(out_dir, (str, Path)) or not str(out_dir).strip():
        raise KvsimError(f"out_dir={shown(out_dir)}: expected the folder that keeps the plan's points.jsonl")
    # the callbacks and the client are first used after a point has run and been stored (a TypeError or an
    # AttributeError then, the folder made and the work done): checked here, before anything
    expect_function(on_point, "on_point", 4, "a function (finished, simulated, open, searches) or None")
    expect_function(on_note, "on_note", 1, "a function (line) or None")
    if client is not None and not callable(getattr(client, "submit", None)):
        raise KvsimError(f"client={shown(client)}: expected a Dask client (distributed.Client) or None")
    with short_trace_said_once():  # a short trace: said by the first read, not by every point's
        return _plan(base, spec, out_dir, client, on_point, on_note, stand_ins)


def _plan(base: Scenario, spec: PlanSpec, out_dir: str | Path, client: Any, on_point: Any,
          on_note: Callable[[str], None] | None, stand_ins: StandIns | None) -> tuple[list[dict[str, Any]], int]:
    stand_ins = check_candidates(base, spec, stand_ins=stand_ins)  # bad knob values fail here, before simulating
    searches = [search_for(c, base, spec, stand_ins) for c in candidates(spec)]
    folder = claim_directory(out_dir, "plan", [POINTS_FILE])
    store = PointStore(folder / POINTS_FILE, required=("evidence", "work"), point_format=POINT_FORMAT,
                       problem=point_problem)
    for note in (store.stale_text(), store.damaged_text()):
        if note is not None and on_note is not None:
            on_note(note)
    evaluate = partial(point_metrics, memory_limit_bytes=spec.memory_limit_bytes)
    simulated = run_searches(searches, evaluate, store, client, on_point)
    # xpyd: [auto]: then the splits no larger than each shape's colocated answer
    splits: list[AnySearch] = [stand_ins.of(c) or XpydSearch(c, base, spec) for s in searches
                               if s.candidate.split is None
                               for c in auto_splits(spec, s.candidate, s.row(None)["replicas"] or 0)]
    simulated += run_searches(splits, evaluate, store, client, on_point)
    searches += splits
    note_memory_limited(searches, store)
    rows = []
    for s in searches:
        c, price = s.candidate, hourly_price(spec, s.candidate.gpu)
        row = s.row(price.usd_per_gpu_hour)
        tokens_per_s = row.get("output_tokens_per_s")
        if tokens_per_s is None and row["feasible"] and isinstance(s, RateSearch):  # from its long run or probe
            tokens_per_s = s.output_tokens_per_s()
        bound: dict[str, Any] = {"lower_bound_replicas": None, "bound_binds": None}  # an unfit engine has none
        gap: dict[str, float] = {}
        if not isinstance(s, UnfitSearch):
            shape = Candidate(c.gpu, c.tensor_parallel_size, c.knobs)  # the floor counts colocated replicas
            floor, gap = answer_floor(base, shape, spec, row, s.answer_metrics())
            bound = {"lower_bound_replicas": floor.replicas, "bound_binds": floor.binds}
        rows.append({"topology": "colocated", **row, "output_tokens_per_s": tokens_per_s,
                     "usd_per_million_output_tokens": cost_per_million_output_tokens(
                         price, row["num_gpus"], tokens_per_s) if row["feasible"] and tokens_per_s else None,
                     **bound, "replicas_over_bound": round(row["replicas"] / bound["lower_bound_replicas"], 3)
                     if row["replicas"] else None,
                     **{f"gap_{k}": v for k, v in gap.items()}, "gap_breakdown": gap_text(gap, row["replicas"]),
                     "price_source": price.source})
    return rank(rows), simulated


def search_for(c: Candidate, base: Scenario, spec: PlanSpec, stand_ins: StandIns) -> AnySearch:
    """The candidate's search; a stand-in that simulates nothing when its latency floor rules out an SLO at any
    replica count (`kvsim.planning.slo_floor`: a split's instances are the shape's engines too), or when its engine
    does not fit its GPU or cannot be split (`stand_ins`: `kvsim.planning.plan_checks.unfit_search`'s)."""
    if (unfit := stand_ins.of(c)) is not None:
        return unfit
    floor = slo_floor(Candidate(c.gpu, c.tensor_parallel_size, c.knobs).scenario(base, 1, spec.router))
    if floor is not None and (missed := unreachable_slos(floor, spec.slo)):
        return UnreachableSearch(c, floor, missed, spec.slo)
    if c.split is not None:
        return XpydSearch(c, base, spec)
    return RateSearch(c, base, spec) if spec.search == "rate" else ReplicaSearch(c, base, spec)


def note_memory_limited(searches: Sequence[AnySearch], store: PointStore) -> None:
    """Each point a search could not pass for memory, in `points.jsonl` as `{"verdict": "memory_limited",
    "memory_bytes", "memory_limit_bytes"}` (no `evidence`: a rerun never takes it for a simulated point,
    and judges the bound again under its own limit); once per point and limit."""
    for search in searches:
        if isinstance(search, Unsearched):  # simulates nothing: no point of it was held back
            continue
        block = search.memory_block()
        if block is None:
            continue
        memory, scenario = search.memory, block[1]
        key = f"{scenario_hash(scenario)}-memory-{memory.limit_bytes}"
        store.note(key, scenario.name, {"verdict": "memory_limited", "memory_bytes": memory.needed_bytes(scenario),
                                        "memory_limit_bytes": memory.limit_bytes})


def answer_floor(base: Scenario, shape: Candidate, spec: PlanSpec, row: dict[str, Any],
                 metrics: Metrics | None) -> tuple[ReplicaFloor, dict[str, float]]:
    """A row's floor and the gap between its `replicas` and that floor (`kvsim.planning.bounds`), both of the run
    behind the answer (`metrics`: its requests, the traffic's first `num_requests` at the row's
    `evidence_traffic_scale`, at the rate it served them), so that they add up to the replicas that run had.

    With no such run (no answer, a split's, a rate search's without long runs) there is no gap, and the floor is of
    the traffic the row's evidence columns describe: the plan's traffic, its first `evidence_num_requests` (else
    `requests_per_probe`; with neither, nothing ran: the plan's own traffic) requests, all of them (a rate search's
    probe ran a fraction f of that traffic on one replica; the fleet serves the whole), at the rate they were
    offered. The base traffic's own rate (its first `workload.num_requests` arrivals) described none of those runs
    where they ran more requests (a trace's later arrivals, a longer probe). A probe that offers no rate (a burst at
    t=0 that the memory bound kept from doubling past) has no floor, `ceil(inf)` replicas (an OverflowError after
    the whole search): the floor is then the plan's own traffic's, which `check_traffic_rate` saw offer one."""
    if not row["replicas"] or metrics is None:
        num_requests = row.get("evidence_num_requests") or row.get("requests_per_probe") or base.workload.num_requests
        traffic = traffic_of(base, num_requests)
        rate_per_s = offered_rate_per_s(traffic)
        if math.isinf(rate_per_s):
            traffic, rate_per_s = base, offered_rate_per_s(base)
        return replica_floor(shape.scenario(traffic, 1, spec.router), rate_per_s), {}
    traffic = scaled_traffic(base, row.get("evidence_traffic_scale") or 1.0, metrics["num_requests"])
    floor = run_floor(shape.scenario(traffic, 1, spec.router), metrics["num_finished"], metrics["duration_s"])
    work = metrics["work"]
    return floor, gap_breakdown(floor, row["replicas"], work["busy_replica_s"], work["recomputed_tokens"])


def hourly_price(spec: PlanSpec, gpu: str) -> GpuPrice:
    """The planner's price for `gpu` when given, else the shipped list price (`kvsim.planning.cost`)."""
    return gpu_price(gpu, spec.gpu_hourly_cost.get(gpu))


def _assignments(items: list[str], flag: str, example: str) -> list[tuple[str, str]]:
    """Each `NAME=VALUE` of a repeatable `flag`, in order; one without `=`, a name or a value is refused with the
    flag's `example` (`--gpu-hourly-cost 4.76`, one price for one candidate, said only `expected NAME=VALUE`)."""
    pairs: list[tuple[str, str]] = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise KvsimError(f"{flag} {shown(item)}: expected NAME=VALUE, e.g. {flag} {example}")
        if any(key.strip() == given for given, _ in pairs):  # not the last one silently
            raise KvsimError(f"{flag} {shown(item)}: {key.strip()} is given twice")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _flag_number(flag: str, key: str, value: str, expected: str, problem: Callable[[float], str | None]) -> float:
    """`value`, a `flag`'s `key=value` (`--slo ttft_s.p90=2`), read as a float; a `KvsimError` naming the text given
    where it is none, or none finite: `1e400` read as inf was refused as `plan.slo.ttft_s.p90=inf`, a value never
    written (as sweep 16 found of the number flags typer reads); or where `problem` (the field's own rule) refuses
    the number: `PlanSpec` echoed the float it was given (`--slo ttft_s.p90=-1` as `-1.0`), not the text."""
    try:
        number = read_number(value, float)
    except ValueError:
        raise KvsimError(f"{flag} {key}={shown(value)}: expected {expected}") from None
    if not math.isfinite(number):
        raise KvsimError(f"{flag} {key}={shown(value)}: expected {expected}, a finite number")
    if (why := problem(number)) is not None:
        raise KvsimError(f"{flag} {key}={shown(value)}: {why}")
    return number


def _section(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """The spec's mapping `name` (created empty when absent), to which a flag adds."""
    section = raw.setdefault(name, {})
    if not isinstance(section, dict):
        raise KvsimError(f"plan.{name}={shown(section)}: Input should be a valid dictionary")
    return section


def refuse_replaced_overrides(overrides: list[str], spec: PlanSpec) -> None:
    """Refuse a `--set` of a field every candidate sets its own way (`Candidate.scenario`: the GPU, the TP
    size, an engine knob the plan varies; a router needs replicas, which plan refuses already) to another
    value than the candidates take: it was replaced without a word, so `plan --set gpu=h200 --gpu h100-80gb`
    planned H100s. The same value is fine."""
    decided: dict[str, tuple[str, list[Any]]] = {
        "gpu": ("--gpu (the spec's gpus)", spec.gpus),
        "engine.tensor_parallel_size": ("--tensor-parallel-size (the spec's tensor_parallel_sizes)",
                                        spec.tensor_parallel_sizes)}
    for knob, values in spec.engine.items():
        decided[f"engine.{knob}"] = (f"--engine {knob}=... (the spec's engine)", values)
    for key, value, label in override_items(overrides):
        if key.strip() in decided:
            flag, values = decided[key.strip()]
            if [value] != list(values):
                raise KvsimError(f"{label}: the plan's candidates set {key.strip()} ({', '.join(map(str, values))}); "
                                 f"give it with {flag}")


def spec_from_options(raw: dict[str, Any], slo: list[str], gpus: list[str], tp_sizes: list[int], knobs: list[str],
                      costs: list[str], max_replicas: int | None, router: str | None,
                      search: str | None = None, memory_limit_bytes: int | None = None,
                      xpyd: list[str] | None = None, kv_transfer_config: str | None = None) -> PlanSpec:
    """A `PlanSpec` from a spec file's mapping (may be empty) with command-line flags on top (`xpyd`:
    splits, each item comma-separated; `kv_transfer_config`: a JSON object)."""
    import yaml

    raw = dict(raw)
    if xpyd:
        raw["xpyd"] = [split.strip() for item in xpyd for split in item.split(",")]
    if kv_transfer_config is not None:
        raw["kv_transfer_config"] = flag_mapping(kv_transfer_config, "--kv-transfer-config")
    for key, value in _assignments(slo, "--slo", "ttft_s.p90=2"):
        _section(raw, "slo")[key] = _flag_number("--slo", key, value, "seconds", slo_limit_problem)
    for key, value in _assignments(costs, "--gpu-hourly-cost", "h100-80gb=4.76"):
        _section(raw, "gpu_hourly_cost")[key] = _flag_number("--gpu-hourly-cost", key, value, "a price per hour",
                                                              cost_problem)
    for key, value in _assignments(knobs, "--engine", "max_num_seqs=128,256"):
        section = _section(raw, "engine")
        if (gap := empty_item(value)) is not None:  # `1,,2` or `1,2,`: the gap read as null, a candidate at the default
            raise KvsimError(f"--engine {key}={shown(value)}: item {gap} is empty")
        try:
            section[key] = [load_yaml(v) for v in value.split(",")]
        except yaml.YAMLError:
            raise KvsimError(f"--engine {key}={shown(value)}: not a comma-separated list of values") from None
    if gpus:
        raw["gpus"] = gpus
    if tp_sizes:
        raw["tensor_parallel_sizes"] = tp_sizes
    if max_replicas is not None:
        raw["max_replicas"] = max_replicas
    if router is not None:
        raw["router"] = router
    if search is not None:
        raw["search"] = search
    if memory_limit_bytes is not None:
        raw["memory_limit_bytes"] = memory_limit_bytes
    for field, flag, example in (("slo", "--slo", "ttft_s.p90=2"), ("gpus", "--gpu", "h100-80gb")):
        if field not in raw:  # 'plan.gpus: required field is missing' named a field no flag is called
            raise KvsimError(f"plan.{field}: required field is missing: give {flag} (e.g. {flag} {example}, "
                             f"repeatable) or `{field}` in a --spec file")
    return make_plan_spec(raw)
