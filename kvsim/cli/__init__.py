"""The `kvsim` command line: parse flags → validated config → call the library → print/write.

No domain logic lives here. Every `KvsimError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvsim.cli.progress import points_text, run_progress, study_text, updater
from kvsim.cli.shared import (
    PLAN_FILES,
    BlockSizeOpt,
    BlocksOverrideOpt,
    Format,
    GpuOpt,
    GpuUtilOpt,
    HourlyCostOpt,
    KvBytesOpt,
    KvDtypeOpt,
    LatencyChoice,
    MaxModelLenOpt,
    MaxNumSeqsOpt,
    ModelOpt,
    RunFormat,
    StepsFormatOption,
    StepsOption,
    TpOpt,
    ValidateFormat,
    beyond_max_model_len,
    capacity_headline,
    fixed_length_scenario,
    parse_int_list,
    parse_size_flag,
    user_errors,
    write_plan,
)
from kvsim.model.errors import KvsimError, reading

if TYPE_CHECKING:
    from kvsim.fleet.autoscaled import AutoscaledResult
    from kvsim.fleet.disagg import DisaggResult
    from kvsim.fleet.driver import FleetResult
    from kvsim.results.run_result import RunResult

app = typer.Typer(
    help="kvsim: capacity simulator for LLM serving with a paged KV cache.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # help text is plain: rich markup would swallow "[default ...]" and other brackets
)

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "h100-80gb"
DEFAULT_CONTEXT_LENGTHS = "1024,2048,4096,8192,16384,32768"


def _print_version(value: bool) -> None:
    if value:
        from kvsim.model.version import __version__

        typer.echo(f"kvsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print kvsim's version and exit.")] = False,
) -> None:
    """kvsim: capacity simulator for LLM serving with a paged KV cache."""


@app.command()
def capacity(
    model: ModelOpt = DEFAULT_MODEL,
    gpu: GpuOpt = DEFAULT_GPU,
    max_model_len: MaxModelLenOpt = None,
    block_size: BlockSizeOpt = None,
    gpu_memory_utilization: GpuUtilOpt = None,
    kv_cache_dtype: KvDtypeOpt = None,
    kv_cache_memory_bytes: KvBytesOpt = None,
    num_gpu_blocks_override: BlocksOverrideOpt = None,
    tensor_parallel_size: TpOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option("--max-num-batched-tokens")] = None,
    data_parallel_size: Annotated[int | None, typer.Option("--data-parallel-size", "-dp")] = None,
    enable_expert_parallel: Annotated[bool, typer.Option("--enable-expert-parallel")] = False,
    disable_hybrid_kv_cache_manager: Annotated[bool, typer.Option("--disable-hybrid-kv-cache-manager")] = False,
    context_lengths: Annotated[str, typer.Option("--context-lengths")] = DEFAULT_CONTEXT_LENGTHS,
    shared_prefix_tokens: Annotated[int, typer.Option("--shared-prefix-tokens")] = 0,
    num_sequences: Annotated[int, typer.Option("--num-sequences")] = 100,
    output_format: Annotated[Format, typer.Option("--format")] = Format.table,
    gpu_hourly_cost: HourlyCostOpt = None,
    sustained: Annotated[bool, typer.Option("--sustained", help="Also simulate, per context length, the "
                                            "highest rate one replica sustains (steady state, prompt c/2 + "
                                            "output c/2) and price its output tokens (slower: minutes)")] = False,
) -> None:
    """Closed-form KV capacity: pool, blocks, and max concurrent sequences per context length."""
    from functools import partial

    from kvsim.latency.roofline import RooflineLatency, cohort_output_tokens_per_s
    from kvsim.model.capacity import plan_capacity
    from kvsim.model.config import load_gpu, load_model, make_engine
    from kvsim.planning.cost import add_capacity_costs, add_sustained_costs, gpu_price
    from kvsim.results.render import rows_to_csv, rows_to_markdown, rows_to_rich, to_json

    with user_errors():
        engine = make_engine(
            max_model_len=max_model_len,
            block_size=block_size,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_dtype=kv_cache_dtype,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            num_gpu_blocks_override=num_gpu_blocks_override,
            tensor_parallel_size=tensor_parallel_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            data_parallel_size=data_parallel_size,
            enable_expert_parallel=enable_expert_parallel or None,
            disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager or None,
        )
        plan = plan_capacity(
            load_model(model),
            load_gpu(gpu),
            engine,
            parse_int_list(context_lengths, "--context-lengths"),
            shared_prefix_tokens=shared_prefix_tokens,
            num_sequences=num_sequences if shared_prefix_tokens else 0,
        )
        price = gpu_price(plan.gpu, gpu_hourly_cost)
        latency = RooflineLatency(load_model(model), load_gpu(gpu), engine)
        data = add_capacity_costs(plan.to_dict(), price, engine.tensor_parallel_size,
                                  engine.resolved_max_num_seqs(load_gpu(gpu)),
                                  partial(cohort_output_tokens_per_s, latency))
        if sustained:
            data = add_sustained_costs(data, price, engine.tensor_parallel_size,
                                       partial(fixed_length_scenario, model, gpu, engine))
    used = {k for r in data["rows"] for k, v in r.items() if v is not None}  # drop columns that are empty in every row
    rows = [{k: v for k, v in r.items() if k in used} for r in data["rows"]]
    if output_format in (Format.table, Format.markdown):  # CSV and JSON keep the documented 0
        rows = [beyond_max_model_len(r, plan.max_model_len) for r in rows]
    if output_format is Format.json:
        sys.stdout.write(to_json(data))
    elif output_format is Format.csv:
        sys.stdout.write(rows_to_csv(rows))
    elif output_format is Format.markdown:
        headline = [{"quantity": k, "value": v} for k, v in data.items() if k not in ("rows", "kv_types")]
        sys.stdout.write(rows_to_markdown(headline) + "\n" + rows_to_markdown(data["kv_types"]) + "\n"
                         + rows_to_markdown(rows))
    else:
        from rich.console import Console

        console = Console()
        console.print(capacity_headline(plan))
        console.print(rows_to_rich(data["kv_types"], title="KV by attention type (one request at max_model_len)"))
        cost_keys = ("concurrent_sequences", "usd_per_concurrent_user_hour", "output_tokens_per_s_closed_form",
                     "usd_per_million_output_tokens", "sustained_rate_per_s", "output_tokens_per_s_sustained",
                     "usd_per_million_output_tokens_sustained")
        console.print(rows_to_rich([{k: v for k, v in r.items() if k not in cost_keys} for r in rows],
                                   title="Max concurrent sequences by context length"))
        costs = [{"context_len": r["context_len"], **{k: r[k] for k in cost_keys if k in r}} for r in rows
                 if r["context_len"] <= plan.max_model_len]
        if costs and len(costs[0]) > 2:  # a price is known
            console.print(rows_to_rich(costs, title=f"Cost at that concurrency ({data['gpu_price_source']})"))


@app.command()
def run(
    scenario: Annotated[str | None, typer.Argument(help="Scenario YAML; omitted: the built-in default.")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a field: engine.block_size=32")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Directory for results [runs/NAME]")] = None,
    output_format: Annotated[RunFormat, typer.Option("--format")] = RunFormat.table,
    check: Annotated[bool, typer.Option("--check", help="check_invariants() after every step")] = False,
    steps: Annotated[StepsOption | None, typer.Option(
        "--steps", help="Per-step rows to keep and write: all, sampled (at most 100,000) or none; "
                        "the summary uses every step. Default: the scenario's `steps` (all).")] = None,
    steps_format: Annotated[StepsFormatOption, typer.Option(
        "--steps-format", help="File the per-step rows stream to as the run goes: steps.parquet (needs "
                               "pyarrow), steps.csv, or auto: parquet when pyarrow is installed",
    )] = StepsFormatOption.auto,
    memory_limit: Annotated[str | None, typer.Option("--memory-limit", help="Refuse a run estimated to need "
                                                     "more memory than this, e.g. 64GiB [this machine's]")] = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    scheduling_policy: Annotated[str | None, typer.Option(
        "--scheduling-policy", help="vLLM's flag: fcfs or priority (engine.scheduling_policy)")] = None,
    speculative_config: Annotated[str | None, typer.Option(
        "--speculative-config", help="vLLM's flag, a JSON object (engine.speculative_config), e.g. "
                                     "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3, "
                                     "\"acceptance_rates\": 0.8}'")] = None,
    kv_transfer_config: Annotated[str | None, typer.Option(
        "--kv-transfer-config", help="vLLM's flag: JSON for the scenario's kv_transfer_config, e.g. "
                                     "'{\"kv_connector\": \"NixlConnector\", \"kv_link\": \"rdma\"}' (replica groups "
                                     "carry kv_role)")] = None,
) -> None:
    """Simulate a scenario: per-request latency, per-step KV usage and waste, preemptions, queueing.

    A scenario with `replicas` simulates that fleet behind its `router` (see `kvsim.fleet.driver`);
    with `kv_transfer_config`, a disaggregated prefill/decode fleet (`kvsim.fleet.disagg`); with
    `autoscaler`, an autoscaled fleet (`kvsim.fleet.autoscaled`).
    """
    from kvsim.engine.simulate import simulate
    from kvsim.results.output_dir import check_output_dir, safe_component
    from kvsim.results.step_writer import resolve_format
    from kvsim.workload.scenario import load_scenario

    with user_errors():
        limit_bytes = None if memory_limit is None else parse_size_flag(memory_limit, "--memory-limit")
        flags = [f"steps={steps.value}"] if steps else []
        flags += [f"engine.max_num_seqs={max_num_seqs}"] if max_num_seqs is not None else []
        flags += [f"engine.{name}={value}" for name, value in (("scheduling_policy", scheduling_policy),
                                                                 ("speculative_config", speculative_config)) if value]
        flags += [f"kv_transfer_config={kv_transfer_config}"] if kv_transfer_config is not None else []
        spec = load_scenario(scenario, [*(overrides or []), *flags])
        out_dir = output or f"runs/{safe_component(spec.name)}"
        check_output_dir(out_dir, "run")  # refuse before simulating, not after
        resolve_format(steps_format.value)  # parquet without pyarrow: refused before simulating too
        with run_progress("run", enabled=output_format is RunFormat.table) as progress:
            result: RunResult | FleetResult | DisaggResult | AutoscaledResult
            if spec.kv_transfer_config is not None:
                from kvsim.fleet.disagg import simulate_disagg

                result = simulate_disagg(spec, check=check, progress=progress)
                result.write(out_dir)
            elif spec.autoscaler is not None:
                from kvsim.fleet.autoscaled import simulate_autoscaled

                result = simulate_autoscaled(spec, check=check, progress=progress)
                result.write(out_dir)
            elif spec.is_fleet:  # written as it runs: the steps stream into the output's temporary folder
                from kvsim.fleet.driver import simulate_fleet  # not imported by a single engine's run

                result = simulate_fleet(spec, check=check, progress=progress, out_dir=out_dir,
                                        steps_format=steps_format.value, memory_limit_bytes=limit_bytes)
            else:
                result = simulate(spec, check=check, progress=progress, memory_limit_bytes=limit_bytes,
                                  out_dir=out_dir, steps_format=steps_format.value)
            written = Path(out_dir)
    if output_format is RunFormat.json:
        from kvsim.results.render import to_json

        sys.stdout.write(to_json(result.summary))
        return
    from rich.console import Console

    from kvsim.results.render import fleet_table, summary_table

    console = Console()
    console.print(fleet_table(result.summary) if spec.is_fleet else summary_table(result.summary))
    files = ", ".join(sorted(p.name for p in written.expanduser().iterdir() if not p.name.startswith(".")))
    console.print(f"results written to {written}/ ({files})")


@app.command()
def plan(
    scenario: Annotated[str | None, typer.Argument(help="Scenario YAML: the fleet's traffic (trace or rate + "
                                                         "length mix); omitted: the built-in default.")] = None,
    spec_file: Annotated[str | None, typer.Option("--spec", help="YAML with plan fields (slo, gpus, ...)")] = None,
    slo: Annotated[list[str] | None, typer.Option("--slo", help="METRIC.STAT=SECONDS, e.g. ttft_s.p90=2")] = None,
    gpus: Annotated[list[str] | None, typer.Option("--gpu", help="Candidate GPU (repeat)")] = None,
    tp_sizes: Annotated[list[int] | None, typer.Option("-tp", "--tensor-parallel-size", "--tp",
                                                       help="Candidate tensor-parallel size (repeat) "
                                                            "[the scenario's]")] = None,
    knobs: Annotated[list[str] | None, typer.Option("--engine", help="Knob values: max_num_seqs=128,256")] = None,
    costs: Annotated[list[str] | None, typer.Option("--gpu-hourly-cost", help="GPU=PRICE per GPU-hour")] = None,
    max_replicas: Annotated[int | None, typer.Option("--max-replicas")] = None,
    router: Annotated[str | None, typer.Option("--router", help="round_robin, least_outstanding, least_kv, "
                                                                "affinity")] = None,
    search: Annotated[str | None, typer.Option("--search", help="replicas: bisect each candidate's replica "
                                                                "count on whole fleets; rate: the highest rate "
                                                                "one replica sustains (homogeneous fleets)")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a scenario field")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Directory [plans/NAME]")] = None,
    dask_address: Annotated[str | None, typer.Option("--dask-address", help="Existing Dask scheduler")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="LocalCluster processes; 1: run here")] = None,
    output_format: Annotated[Format, typer.Option("--format")] = Format.table,
) -> None:
    """The cheapest fleet meeting latency SLOs: fewest replicas per candidate GPU / TP / engine knobs."""
    import yaml

    from kvsim.planning.plan import check_candidates, spec_from_options
    from kvsim.planning.plan import plan as run_plan
    from kvsim.planning.search import close_client, dask_client
    from kvsim.results.output_dir import check_output_dir, claim_directory, safe_component
    from kvsim.results.render import rows_to_csv, rows_to_markdown, rows_to_rich, to_json
    from kvsim.workload.scenario import load_scenario

    with user_errors():
        base = load_scenario(scenario, overrides or [])
        raw: dict = {}
        if spec_file is not None:
            if not Path(spec_file).is_file():
                raise KvsimError(f"spec={spec_file!r}: file not found")
            with reading(spec_file, "spec"):
                try:
                    raw = yaml.safe_load(Path(spec_file).read_text()) or {}
                except yaml.YAMLError as error:
                    mark = getattr(error, "problem_mark", None)
                    where = f" (line {mark.line + 1})" if mark is not None else ""
                    raise KvsimError(f"spec={spec_file!r}: not valid YAML{where}") from None
            if not isinstance(raw, dict):
                raise KvsimError(f"spec={spec_file!r}: expected a mapping")
        if not tp_sizes and "tensor_parallel_sizes" not in raw:
            tp_sizes = [base.engine.tensor_parallel_size]  # the scenario's TP unless candidates are given
        spec = spec_from_options(raw, slo or [], gpus or [], tp_sizes or [], knobs or [], costs or [],
                                 max_replicas, router, search)
        check_candidates(base, spec)
        out_path = output or f"plans/{safe_component(base.name)}"
        check_output_dir(out_path, "plan")
        client = None if workers == 1 and not dask_address else dask_client(dask_address, workers)
        try:
            out_dir = claim_directory(out_path, "plan", PLAN_FILES)  # made only once every input is good
            with updater("plan") as update:
                def on_point(finished: int, simulated: int, open_searches: int, num_searches: int) -> None:
                    assert update is not None
                    update(points_text(finished, simulated, open_searches, num_searches), None, None, None)

                rows, simulated = run_plan(base, spec, out_dir, client, on_point)
        finally:
            if client is not None:
                close_client(client)
        write_plan(rows, out_dir, base.name)
    if output_format is Format.table:
        from rich.console import Console

        shown = ("rank", "candidate", "replicas", "lower_bound_replicas", "num_gpus", "cost_per_hour", "headroom",
                 "verified", "limiting_factor")
        Console().print(rows_to_rich([{k: r.get(k) for k in shown} for r in rows], title=f"kvsim plan: {base.name}"))
        sources = sorted({r["price_source"] for r in rows})
        typer.echo(f"prices: {'; '.join(sources)}")
        for r in rows:
            if r.get("gap_breakdown"):
                typer.echo(f"gap to the floor, {r['candidate']}: {r['gap_breakdown']} (replicas at the traffic's "
                           f"rate, from the run behind the answer; {r['bound_binds']} floor binds)")
        typer.echo(f"{simulated} points simulated now; results in {out_dir}/ (plan.csv, plan.json, plan.md, "
                   f"pareto.png, points.jsonl); verify_* columns: each chosen fleet re-run with 10x the requests, "
                   f"one replica more while that long run fails")
    else:
        writers = {Format.csv: rows_to_csv, Format.json: to_json, Format.markdown: rows_to_markdown}
        sys.stdout.write(writers[output_format](rows))


@app.command()
def calibrate(
    gpu: Annotated[str, typer.Option("--gpu", help="Name recorded in the profile (e.g. h200)")],
    model: ModelOpt = DEFAULT_MODEL,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Profile CSV to write")] = None,
    block_size: Annotated[str, typer.Option("--block-sizes", help="Comma-separated block sizes")] = "16",
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="auto or fp8")] = "auto",
    tensor_parallel_size: TpOpt = None,
    quick: Annotated[bool, typer.Option("--quick", help="A small grid for a smoke run")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the grid and exit")] = False,
) -> None:
    """Time the Triton paged-attention kernels and the model's GEMMs on a GPU into a profile CSV."""
    from kvsim.model.config import load_model, make_engine
    from kvsim.results.output_dir import check_output_file

    with user_errors():
        spec = load_model(model)
        engine = make_engine(tensor_parallel_size=tensor_parallel_size)
        if kv_cache_dtype not in ("auto", "fp8"):
            raise KvsimError(f"--kv-cache-dtype={kv_cache_dtype!r}: calibrate measures auto or fp8")
        sizes = parse_int_list(block_size, "--block-sizes")
        if output is not None and not dry_run:
            check_output_file(output)  # refuse before loading torch and measuring, not after
        from kernels import grid as calibration_grid  # standard library only: --dry-run needs no torch

        shapes = calibration_grid.LayerShapes(
            num_heads=max(1, spec.num_attention_heads // engine.tensor_parallel_size),
            num_kv_heads=max(1, spec.num_kv_heads // engine.tensor_parallel_size), head_dim=spec.head_dim,
            hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size // engine.tensor_parallel_size,
            vocab_size=spec.vocab_size // engine.tensor_parallel_size, gated_mlp=spec.gated_mlp, dtype=spec.dtype,
            kv_dtype=kv_cache_dtype, model=spec.name, tensor_parallel_size=engine.tensor_parallel_size)
        base = calibration_grid.QUICK_GRID if quick else calibration_grid.DEFAULT_GRID
        grid = dataclasses.replace(base, block_sizes=tuple(sizes))
        points = calibration_grid.plan(shapes, grid)
        if dry_run:
            from kvsim.results.render import rows_to_csv

            sys.stdout.write(rows_to_csv([{k: p.get(k, "") for k in ("kind", "op", "batch", "context_len",
                                                                        "query_len", "num_tokens", "k", "n",
                                                                        "block_size")} for p in points]))
            typer.echo(f"{len(points)} measurements for {spec.name} ({shapes})", err=True)
            return
        try:
            from kernels import calibrate as harness
        except ImportError as error:
            raise KvsimError(f"calibrate needs torch and triton ({error.name} is missing): "
                             "pip install -e '.[kernels]'") from None
        if not harness.has_cuda():
            raise KvsimError("no CUDA device: calibration times kernels on a GPU (--dry-run prints the grid)")
        if output is None:
            raise KvsimError("--output is required: the profile CSV to write")
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("calibrating", total=len(points))
            path = harness.measure(shapes, grid, gpu, Path(output),
                                   progress=lambda done, total: bar.update(task, completed=done))
    typer.echo(f"profile written to {path}")


@app.command("import-profile")
def import_profile(
    source: Annotated[str, typer.Argument(help="An LLMServingSim profile bundle folder, a Vidur mlp.csv or a "
                                               "kvsim profile CSV")],
    output: Annotated[str, typer.Option("--output", "-o", help="kvsim profile CSV to write")],
    model: ModelOpt = DEFAULT_MODEL,
    gpu: GpuOpt = DEFAULT_GPU,
    tensor_parallel_size: TpOpt = None,
    kv_cache_dtype: KvDtypeOpt = None,
    repository: Annotated[str | None, typer.Option("--source-repository", help="e.g. owner/name")] = None,
    commit: Annotated[str | None, typer.Option("--source-commit", help="The source's commit")] = None,
    licence: Annotated[str | None, typer.Option("--source-licence", help="The source's licence, e.g. MIT")] = None,
) -> None:
    """Convert a measured profile into kvsim's profile CSV, checked against the model, GPU, KV dtype and TP."""
    from kvsim.latency.profiles import with_source
    from kvsim.latency.profiles.loader import load_profile
    from kvsim.latency.profiles.native import write_native
    from kvsim.model.config import load_gpu, load_model, make_engine

    with user_errors():
        engine = make_engine(tensor_parallel_size=tensor_parallel_size, kv_cache_dtype=kv_cache_dtype)
        profile = load_profile(Path(source), load_model(model), load_gpu(gpu), engine)
        path = write_native(with_source(profile, repository, commit, licence), Path(output))
    typer.echo(f"profile {profile.name} ({len(profile.rows)} rows, kinds {', '.join(sorted(profile.kinds()))}) "
               f"written to {path}")


@app.command()
def report(
    scenario: Annotated[str | None, typer.Argument(help="Base scenario YAML [a KV-bound built-in one]")] = None,
    model: Annotated[str | None, typer.Option("--model")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu")] = None,
    max_model_len: MaxModelLenOpt = None,
    block_size: BlockSizeOpt = None,
    gpu_memory_utilization: GpuUtilOpt = None,
    kv_cache_dtype: KvDtypeOpt = None,
    kv_cache_memory_bytes: KvBytesOpt = None,
    num_gpu_blocks_override: BlocksOverrideOpt = None,
    tensor_parallel_size: TpOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a scenario field")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="Report directory")] = "report",
    quick: Annotated[bool, typer.Option("--quick", help="Fewer, smaller runs (a smoke test)")] = False,
    workers: Annotated[int | None, typer.Option("--workers", help="Local processes [all cores]")] = None,
    dask_address: Annotated[str | None, typer.Option("--dask-address", help="Run on a Dask cluster")] = None,
    gpu_hourly_cost: HourlyCostOpt = None,
) -> None:
    """Capacity-planning report: Markdown + HTML with figures and the CSV behind each."""
    from kvsim.report.build import build_report
    from kvsim.report.studies import StudyConfig
    from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario

    engine_flags = {"max_model_len": max_model_len, "block_size": block_size,
                    "gpu_memory_utilization": gpu_memory_utilization, "kv_cache_dtype": kv_cache_dtype,
                    "kv_cache_memory_bytes": kv_cache_memory_bytes, "num_gpu_blocks_override": num_gpu_blocks_override,
                    "tensor_parallel_size": tensor_parallel_size, "max_num_seqs": max_num_seqs}
    sets = [f"engine.{k}={v}" for k, v in engine_flags.items() if v is not None]
    sets += [f"{k}={v}" for k, v in (("model", model), ("gpu", gpu)) if v is not None]
    with user_errors():
        base = load_scenario(scenario, sets + (overrides or []), default=REPORT_SCENARIO)
        cfg = StudyConfig.quick() if quick else StudyConfig()
        cfg = StudyConfig(**{**cfg.__dict__, "workers": workers, "dask_address": dask_address,
                             "gpu_hourly_cost": gpu_hourly_cost})
        from kvsim.planning.cost import gpu_price

        gpu_price(base.gpu, gpu_hourly_cost)  # a bad price fails before any run
        with updater("report") as update:
            def on_study(index: int, num_studies: int, name: str, runs_done: int, runs_submitted: int) -> None:
                assert update is not None
                update(study_text(index, num_studies, name, runs_done, runs_submitted), runs_done,
                       runs_submitted or None, name)

            out = build_report(base, output, cfg, progress=on_study)
    typer.echo(f"report written to {out}/report.html (and report.md, figures, CSVs, alerts.yaml)")


@app.command()
def validate(
    measured: Annotated[str, typer.Argument(help="A measured-run folder (as benchmarks/validation_set/measured/"
                                                 "<hw>/<case>) or a `vllm bench serve --save-result "
                                                 "--save-detailed` JSON")],
    latency: Annotated[LatencyChoice, typer.Option("--latency")] = LatencyChoice.roofline,
    profile: Annotated[str | None, typer.Option("--profile", help="Measured profile for --latency calibrated "
                                                                  "[the run's bundle under profiles/, if any]")] = None,
    workload: Annotated[str | None, typer.Option("--workload", help="The run's workload [from meta.json]")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Preset or config.json [from the run]")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Preset or GPU file [from the run]")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a scenario field")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Directory [validation/NAME-LATENCY]")] = None,
    output_format: Annotated[ValidateFormat, typer.Option("--format")] = ValidateFormat.table,
) -> None:
    """Replay a real vLLM run in kvsim and tabulate the errors (TTFT, TPOT, E2E, throughput, queues)."""
    from kvsim.results.output_dir import check_output_dir, safe_component
    from kvsim.validation import compare as v
    from kvsim.validation.measured import load_measured

    with user_errors():
        run = load_measured(measured, workload)
        out_path = output or f"validation/{safe_component(run.name, 'run')}-{latency.value}"
        check_output_dir(out_path, "validation")  # refuse before replaying, not after
        if profile is None and latency is LatencyChoice.calibrated and Path(measured).is_dir():
            found = v.default_profile(Path(measured), run)
            profile = str(found) if found else None
        with run_progress("validate") as progress:
            result = v.validate(run, latency=latency.value, profile=profile, model=model, gpu=gpu,
                                overrides=overrides or [], measured_path=measured, progress=progress)
        out_dir = v.write_validation(result, out_path)
    if output_format is ValidateFormat.json:
        from kvsim.results.render import to_json

        sys.stdout.write(to_json(v.to_json(result)))
    elif output_format is ValidateFormat.markdown:
        sys.stdout.write(v.markdown(result))
    else:
        from rich.console import Console

        from kvsim.results.render import rows_to_rich

        console = Console()
        console.print(rows_to_rich(v.table_rows(result), title=v.headline(result)))
        for note in result.notes:
            console.print(f"note: {note}")
    typer.echo(f"validation written to {out_dir}/ (validation.md, validation.json, figures, sim/)", err=True)

def main() -> None:
    app()
