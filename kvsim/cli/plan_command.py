"""`kvsim plan`: the cheapest fleet meeting latency SLOs (`kvsim.planning.plan`), and its output: the ranked
table, the evidence and the choice on the terminal, plan.csv / .json / .md and the Pareto figure in its folder, and
with `--offload-size` the CPU tier its answer needs. Listed in `kvsim.cli.COMMANDS`, imported only when it runs;
its annotations are objects, as `kvsim.cli` explains."""

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from kvsim.cli.progress import points_text, updater
from kvsim.cli.shared import (
    INT_FLAG,
    Format,
    check_workers,
    parse_size_flag,
    user_errors,
    warn,
    warn_unread,
)
from kvsim.model.errors import KvsimError, first_repeat, not_a_file, reading
from kvsim.model.units import counted, share


def plan(
    scenario: Annotated[str | None, typer.Argument(help="Scenario YAML: the fleet's traffic (trace or rate + "
                                                         "length mix); omitted: the built-in default.")] = None,
    spec_file: Annotated[str | None, typer.Option("--spec", help="YAML with plan fields (slo, gpus, ...)")] = None,
    slo: Annotated[list[str] | None, typer.Option("--slo", help="METRIC.STAT=SECONDS (METRIC: ttft_s, tpot_s, "
                                                                "e2e_s, queue_s; STAT: mean, p50, p90, p99), e.g. "
                                                                "ttft_s.p90=2; METRIC.STAT@PRIORITY=SECONDS for one "
                                                                "class")] = None,
    gpus: Annotated[list[str] | None, typer.Option("--gpu", help="Candidate GPU (repeat)")] = None,
    tp_sizes: Annotated[list[int] | None, typer.Option("-tp", "--tensor-parallel-size", "--tp", parser=INT_FLAG,
                                                       help="Candidate tensor-parallel size (repeat) "
                                                            "[the scenario's]")] = None,
    knobs: Annotated[list[str] | None, typer.Option("--engine", help="Knob values: max_num_seqs=128,256")] = None,
    costs: Annotated[list[str] | None, typer.Option("--gpu-hourly-cost", help="GPU=PRICE per GPU-hour")] = None,
    max_replicas: Annotated[int | None, typer.Option("--max-replicas", parser=INT_FLAG,
                                                     help="Most replicas a candidate may take [64]")] = None,
    router: Annotated[str | None, typer.Option("--router", help="round_robin, least_outstanding, least_kv, "
                                                                "affinity [least_outstanding]")] = None,
    search: Annotated[str | None, typer.Option("--search", help="replicas: bisect each candidate's replica "
                                                                "count on whole fleets; rate: the highest rate "
                                                                "one replica sustains (homogeneous fleets) "
                                                                "[replicas]")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a scenario field")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Directory [plans/NAME]")] = None,
    dask_address: Annotated[str | None, typer.Option("--dask-address", help="Existing Dask scheduler")] = None,
    workers: Annotated[int | None, typer.Option("--workers", parser=INT_FLAG,
                                                help="LocalCluster processes; 1: run here [all cores]")] = None,
    memory_limit: Annotated[str | None, typer.Option("--memory-limit", help="Bound every simulated point by this "
                                                     "memory estimate, e.g. 64GiB [this machine's]")] = None,
    xpyd: Annotated[list[str] | None, typer.Option(
        "--xpyd", help="Disaggregated splits to rank beside the colocated fleets, e.g. 1P1D,2P1D (repeat); "
                       "auto: every split up to each colocated answer's size")] = None,
    kv_transfer_config: Annotated[str | None, typer.Option(
        "--kv-transfer-config", help="vLLM's flag: JSON for the splits' link, e.g. '{\"kv_link\": \"nvlink\"}' "
                                     "[rdma]")] = None,
    output_format: Annotated[Format, typer.Option("--format")] = Format.table,
    offload_sizes: Annotated[list[str] | None, typer.Option(
        "--offload-size", help="Also size a KV offload tier for the cheapest colocated answer: a CPU tier "
                                "size per replica to try (repeat), e.g. 64GiB")] = None,
) -> None:
    """The cheapest fleet meeting latency SLOs: fewest replicas per candidate GPU / TP / engine knobs, and
    with --xpyd disaggregated prefill/decode splits of each, all ranked by cost. With --offload-size, also the
    CPU offload tier each replica of the cheapest colocated answer needs (`kvsim.planning.offload_sizing`)."""
    import yaml

    from kvsim.model.yaml_io import load_yaml, settings_text, yaml_problem
    from kvsim.planning.plan import plan as run_plan
    from kvsim.planning.plan import refuse_replaced_overrides, spec_from_options
    from kvsim.planning.plan_checks import check_candidates
    from kvsim.planning.plan_rate import sized_traffic
    from kvsim.planning.search import close_client, dask_client
    from kvsim.planning.spec import candidates
    from kvsim.results.output_checks import check_output_dir, errors_name_output, safe_component
    from kvsim.results.output_dir import claim_directory
    from kvsim.results.render import rows_to_csv, rows_to_markdown, to_json
    from kvsim.workload.generate import short_trace_said_once
    from kvsim.workload.scenario import load_scenario

    with user_errors(), short_trace_said_once():  # check_candidates says it, not plan's every point
        check_workers(workers, dask_address)
        base = load_scenario(scenario, overrides or [])
        raw: dict = {}
        if spec_file is not None:
            problem = not_a_file(spec_file, file_kind="a spec YAML file")  # a FIFO or a folder was "file not found"
            if problem is not None:
                raise KvsimError(f"spec={spec_file!r}: {problem}")
            with reading(spec_file, "spec"):
                try:
                    raw = load_yaml(settings_text(spec_file, "spec")) or {}
                except yaml.YAMLError as error:
                    raise KvsimError(f"spec={spec_file!r}: not valid YAML: {yaml_problem(error)}") from None
            if not isinstance(raw, dict):
                raise KvsimError(f"spec={spec_file!r}: expected a mapping")
        if not tp_sizes and "tensor_parallel_sizes" not in raw:
            tp_sizes = [base.engine.tensor_parallel_size]  # the scenario's TP unless candidates are given
        limit_bytes = None if memory_limit is None else parse_size_flag(memory_limit, "--memory-limit")
        spec = spec_from_options(raw, slo or [], gpus or [], tp_sizes or [], knobs or [], costs or [],
                                 max_replicas, router, search, limit_bytes, xpyd, kv_transfer_config)
        refuse_replaced_overrides(overrides or [], spec)
        limit_name = "plan.memory_limit_bytes" if limit_bytes is None else "--memory-limit"
        stand_ins = check_candidates(base, spec, limit_name, "--xpyd" if xpyd else "plan.xpyd")
        sizes = [parse_size_flag(size, "--offload-size") for size in offload_sizes or []]
        if (twice := first_repeat(sizes)) is not None:  # each size is one tier to size: a row apiece
            raise KvsimError(f"--offload-size: {twice:,} bytes is given twice")
        if sizes:  # a size under one block, or a TTFT SLO it cannot size, was found once the whole plan had run
            from kvsim.planning.offload_sizing import check_sizes, ttft_slo

            ttft_slo(spec.slo)
            colocated = [c.scenario(base, 1, spec.router) for c in candidates(spec)
                         if c.split is None and stand_ins.of(c) is None]
            check_sizes([base, *colocated], sizes, field="--offload-size")
        out_path = f"plans/{safe_component(base.name)}" if output is None else output
        check_output_dir(out_path, "plan")
        warn_unread([c.scenario(base, c.smallest_fleet, spec.router) for c in candidates(spec)  # those it simulates
                     if stand_ins.of(c) is None])
        client = None if workers == 1 and not dask_address else dask_client(dask_address, workers)
        try:  # a full disk was 'No space left on device', naming no --output: the writes below name it
            out_dir = claim_directory(out_path, "plan", PLAN_FILES)  # made only once every input is good
            with updater("plan") as update, errors_name_output(out_path, out_dir, named_only=True):
                def on_point(finished: int, simulated: int, open_searches: int, num_searches: int) -> None:
                    assert update is not None
                    update(points_text(finished, simulated, open_searches, num_searches), None, None, None)

                rows, simulated = run_plan(base, spec, out_dir, client, on_point, warn, stand_ins)
        finally:
            if client is not None:
                close_client(client)
        with errors_name_output(out_path, out_dir):
            write_plan(rows, out_dir, base.name)
        traffic = sized_traffic(base) if output_format is Format.table else ""
        if sizes:
            from kvsim.planning.offload_sizing import size_offload, sizing_base, ttft_slo, write_sizing

            limit, stat = ttft_slo(spec.slo)
            sized, sized_for = sizing_base(base, spec, rows)
            sizing = size_offload(sized, sizes, (0.5, 1.0, 2.0), ttft_slo_s=limit, ttft_percentile=stat,
                                  workers=workers or 1, dask_address=dask_address, sized_for=sized_for)
            with errors_name_output(out_path, out_dir):
                write_sizing(sizing, out_dir)
    if output_format is Format.table:
        print_plan(rows, base.name, out_dir, simulated, spec.verify_factor, traffic)
        if sizes:
            typer.echo(offload_line(sizing))
    else:
        writers = {Format.csv: rows_to_csv, Format.json: to_json, Format.markdown: rows_to_markdown}
        sys.stdout.write(writers[output_format](rows))


PLAN_FILES = ["points.jsonl", "plan.csv", "plan.json", "plan.md", "pareto.png",
              ".plan.csv.tmp", ".plan.json.tmp", ".plan.md.tmp", ".pareto.tmp.png",  # all `plan` writes
              "offload_points.csv", "offload_pays.csv", "offload_hurts.csv", "offload_sizing.json",  # --offload-size
              ".offload_points.csv.tmp", ".offload_pays.csv.tmp", ".offload_hurts.csv.tmp", ".offload_sizing.json.tmp"]


def offload_line(sizing: Any) -> str:
    """`kvsim plan --offload-size`'s one-line answer (`kvsim.planning.offload_sizing.OffloadSizing`)."""
    f = sizing.facts
    size = sizing.size_for_ttft_bytes
    found = ("not met by any size tried" if size is None else "met without a tier" if not size
             else f"met from a CPU tier of {size / 2**30:g} GiB a replica")
    # without a TTFT SLO no size is sought (`ttft_slo`): it read 'no TTFT SLO not met by any size tried'
    slo = (f"TTFT {f['ttft_percentile']} <= {f['ttft_slo_s']} s {found}" if f["ttft_slo_s"] is not None
           else "no TTFT SLO to size a tier for")
    largest = f"the largest tier ({f['largest_bytes'] / 2**30:g} GiB)"
    pays = (f"{largest} cuts TTFT p90 by 5 % at no load tried" if sizing.pays_from_load is None
            else f"{largest} cuts TTFT p90 by >= 5 % from load x{sizing.pays_from_load:g} of the scenario's")
    return (f"offload ({f['sized_for']}): {slo}; {pays}; "
            "offload_points.csv, offload_pays.csv, offload_hurts.csv, offload_sizing.json")


def print_plan(rows: list[dict], name: str, out_dir: Path, simulated: int, verify_factor: int, traffic: str) -> None:
    """`kvsim plan`'s terminal answer: the ranked table, prices, memory bounds met, the traffic every fleet is sized
    for (`traffic`: `kvsim.planning.plan_rate.sized_traffic`), the choice, the files, and how long each chosen
    fleet's verification run was (`verify_factor` × a probe's requests; 0: none ran)."""
    import typer
    from rich.console import Console

    from kvsim.results.render import rows_to_rich

    columns = ("rank", "candidate", "replicas", "lower_bound_replicas", "num_gpus", "cost_per_hour",
             "usd_per_million_output_tokens", "headroom", "verified", "limiting_factor")
    Console().print(rows_to_rich([{k: r.get(k) for k in columns} for r in rows], title=f"kvsim plan: {name}"))
    typer.echo(f"prices: {'; '.join(sorted({r['price_source'] for r in rows}))}")
    for r in rows:
        if r["memory_limited"]:
            typer.echo(f"memory: {r['candidate']}: {r['limiting_factor']}")
        elif r.get("verify_memory"):
            typer.echo(f"memory: {r['candidate']}: not verified: {r['verify_memory']}")
        if r["feasible"] and r.get("evidence_num_requests"):
            typer.echo(evidence_line(r))
        if r["feasible"] and r.get("rejected_fraction"):  # else it read as serving all the traffic
            typer.echo(f"refused, {r['candidate']}: {share(r['rejected_fraction'])} of the requests can never be "
                       "served (over max_model_len or the KV pool: the run's reject_reasons); the replicas, SLOs "
                       "and cost are for the rest")
        if r.get("verify_run") == "search":
            typer.echo(search_run_line(r))
        elif trace_capped(r, verify_factor):
            typer.echo(trace_capped_line(r, verify_factor))
        if r.get("gap_breakdown"):
            typer.echo(f"gap to the floor, {r['candidate']}: {r['gap_breakdown']} (replicas over the run behind "
                       f"the answer, at the rate it served; {r['bound_binds']} floor binds)")
    typer.echo(f"traffic sized for: {traffic}")
    typer.echo(chosen_text(rows))
    whole = (" (at most a trace's whole; not re-run where the search took it all: the verification lines)"
             if any(r.get("verify_run") == "search" or trace_capped(r, verify_factor) for r in rows) else "")
    verified = (f"each chosen fleet re-run with {verify_factor}x the requests{whole}, one replica more while that "
                "long run fails" if verify_factor else "none: verify_factor is 0, no chosen fleet re-run")
    typer.echo(f"{counted(simulated, 'point')} simulated now; results in {out_dir}/ (plan.csv, plan.json, plan.md, "
               f"pareto.png, points.jsonl); verify_* columns: {verified}")


LONGER_CHECK = ("a longer check needs a longer trace, or its lengths as a table (trace.format lengths, arrival.process "
                "poisson), which a run resamples to any count")


def search_run_line(row: dict) -> str:
    """The line for a row whose verification is the search's own run (`verify_run` "search"): the trace held no
    more requests than the search's runs took, so a 10x run would repeat that run; whether its steady-state
    window held, and what traffic would give a longer check."""
    held = "every SLO met" if row["verified"] else "not every SLO met"
    return (f"verification, {row['candidate']}: not re-run: the trace holds {row['verify_num_requests']:,} requests "
            f"and the search's run took them all, so verify_* is that run (window {row['verify_verdict']}, {held}); "
            + LONGER_CHECK)


def trace_capped(row: dict, verify_factor: int) -> bool:
    """Whether `row`'s long run took fewer than `verify_factor` × its search's probe length (`requests_per_probe`,
    what `kvsim.planning.verify.Verification.long_requests` multiplies; not `search_num_requests`, the run behind
    `searched_replicas`, which a near miss's long rerun can be): a finite trace held no more, so the footer's
    "re-run with 10x the requests" did not hold for it."""
    long_run, probe = row.get("verify_num_requests"), row.get("requests_per_probe")
    return (row.get("verify_run") == "long" and long_run is not None and probe is not None
            and long_run < verify_factor * probe)


def trace_capped_line(row: dict, verify_factor: int) -> str:
    """The line for a row whose long run a finite trace cut short of `verify_factor` × the search's probe: how long
    it was, against the probes, so the planner does not read the footer's 10x as this candidate's check. The Azure
    hour (19,366 requests) searched on 3,000-request probes was verified on 6.5x, with "10x" printed."""
    long_run, probe = row["verify_num_requests"], row["requests_per_probe"]
    return (f"verification, {row['candidate']}: the long run took the trace's whole, {long_run:,} requests, "
            f"{long_run / probe:.3g}x the search's {probe:,}-request probes, not {verify_factor}x: the trace holds no "
            "more; " + LONGER_CHECK)


def evidence_line(row: dict) -> str:
    """A feasible row's evidence in one line, the window columns of plan.csv: the run behind the answer (its
    long run when one held) and, when the search's probe was another run, what that probe showed."""
    from kvsim.planning.slo import parse_slo_key

    def slos(prefix: str) -> str:
        out = []
        for key, value in row.items():
            if not key.startswith(prefix) or "." not in key[len(prefix):]:
                continue
            try:
                parse_slo_key(key[len(prefix):])
            except ValueError:  # an interval column, not an SLO's value
                continue
            ci = row.get(f"{key}_ci")
            out.append(f"{key[len(prefix):]} {value:.4g}" + (f" (95 % CI {ci})" if ci else ""))
        return ", ".join(out)

    # a rate search's rows add a run's replicas and traffic scale; its xPyD rows, ranked in one table with them
    # (`rank_rows`: every row has every column), hold None there: their run is the split on the traffic itself
    ratio, scale = row["served_over_offered"], row.get("evidence_traffic_scale") or 1.0
    size = row.get("evidence_replicas") or row["replicas"]
    split = row.get("topology", "colocated") != "colocated"  # an xPyD split's `replicas` counts its instances
    fleet = f"{row['topology']} ({counted(size, 'instance')})" if split else counted(size, "replica")
    traffic = f" on {scale:.4g}× the traffic" if scale != 1.0 else ""  # a rate search's long run below its count,
    #                                                                      or its one-replica probe
    text = (f"evidence, {row['candidate']}: {fleet}, "
            f"{row['evidence_num_requests']:,}-request run{traffic}: "
            f"{row['verdict']} over its window ({row['num_in_window']:,} requests in {row['window_s']:,.0f} s, served/"
            f"offered {'-' if ratio is None else f'{ratio:.3f}'}); {slos('')}")
    if row.get("search_num_requests") != row["evidence_num_requests"]:  # the answer rests on a long run
        if row.get("capacity_headroom") is not None:  # a rate search's
            probe = f"one-replica probe at {row['rate_per_replica']:.4g} req/s"
        elif row.get("searched_replicas") is None:  # an xPyD split's: one fixed fleet, no count searched
            probe = f"probe of {row['topology']}"
        else:  # a replica search's
            probe = f"probe of {counted(row['searched_replicas'], 'replica')}"
        text += f"; the search's {probe} ({row['search_num_requests']:,} requests): {slos('search_')}"
    return text


def chosen_text(rows: list[dict]) -> str:
    """The plan's answer in one line: the first ranked row when it meets the SLOs. Its prices are the table's cells
    (`cell_text`: 4 significant digits), in dollars: the line printed $47.686 per million output tokens under a
    table that said 47.69."""
    from kvsim.results.render import cell_text

    best = rows[0] if rows else None
    if best is None or not best["feasible"]:
        return "chosen: none: no candidate meets every SLO within its limits (see limiting_factor)"
    cost = "no price" if best["cost_per_hour"] is None else f"${cell_text(best['cost_per_hour'])}/hour"
    per_token = best.get("usd_per_million_output_tokens")
    tokens = "" if per_token is None else f", ${cell_text(per_token)} per million output tokens"
    gpus = f"{best['num_gpus']} GPU{'s' * (best['num_gpus'] != 1)}"
    return f"chosen: {best['candidate']} x{best['replicas']} ({best['topology']}): {gpus}, {cost}{tokens}"


def write_plan(rows: list[dict], out_dir: Path, name: str) -> None:
    """plan.csv / .json / .md and the Pareto figure, all written whole, then each renamed into place (a full disk
    stops the writes before any rename: writing and renaming each in turn left this plan's plan.csv beside the
    last one's plan.md); an earlier plan's offload sizing in the folder is removed (it sized that plan's answer:
    `--offload-size` sizes this one's afresh), so the folder never shows one plan beside another's tier."""
    import os

    from kvsim.planning.offload_sizing import OFFLOAD_FILES
    from kvsim.report.build import pareto_figure
    from kvsim.results.render import rows_to_csv, rows_to_markdown, to_json

    for stale in OFFLOAD_FILES:
        (out_dir / stale).unlink(missing_ok=True)

    written = {file: out_dir / f".{file}.tmp" for file in ("plan.csv", "plan.json", "plan.md")}
    written["pareto.png"] = out_dir / ".pareto.tmp.png"
    try:
        for file, write in (("plan.csv", rows_to_csv), ("plan.json", to_json), ("plan.md", rows_to_markdown)):
            written[file].write_text(write(rows), encoding="utf-8")
        pareto_figure(rows, written["pareto.png"], f"{name}: candidates meeting the SLOs")
    except BaseException:
        for tmp in written.values():
            tmp.unlink(missing_ok=True)
        raise
    for file, tmp in written.items():
        os.replace(tmp, out_dir / file)
