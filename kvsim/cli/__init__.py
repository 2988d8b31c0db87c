"""The `kvsim` command line: parse flags → validated config → call the library → print/write.

No domain logic lives here. Every `KvsimError` becomes one line on stderr and exit code 2.
The commands' annotations are objects, not strings (no `from __future__ import annotations` here or in
`kvsim.cli.profiles`): typer reads a command's annotations each time it builds it, and would compile and
evaluate each string twice (~10 ms of every command line).

The commands are listed in `COMMANDS` (name -> where its function is, in `--help`'s order) and each is built
into its click command, its module imported, only when it is asked for (`LazyCommands`): a `kvsim run` builds
`run` alone, where typer built all seven and imported `kvsim plan`'s and the profile commands' modules at every
start (callgrind, the bench's Mooncake scenario: 1924 -> 1887 M instructions for one request, 11,779 -> 11,740 M
for the whole run). `--help` builds them all; usage errors, their suggestions and exit codes are click's and
typer's as before.
"""

import json
import sys
from collections.abc import Iterator, MutableMapping
from importlib import import_module
from pathlib import Path
from typing import Annotated, Any

import typer

from kvsim.cli.interrupts import installed as interrupts_installed
from kvsim.cli.progress import run_progress, study_text, updater
from kvsim.cli.shared import (
    DEFAULT_GPU,
    DEFAULT_MODEL,
    INT_FLAG,
    TOKENS_FLAG,
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
    OneLineUsageErrors,
    RunFormat,
    SpeculativeConfigOpt,
    StepsFormatOption,
    StepsOption,
    TpOpt,
    ValidateFormat,
    beyond_max_model_len,
    capacity_headline,
    check_workers,
    collector_off,
    fixed_length_scenario,
    load_with_flags,
    parse_int_list,
    parse_size_flag,
    run_collector,
    run_flags,
    user_errors,
    warn,
    warn_unread,
)
from kvsim.cli.terminal import escape_unencodable_output, usable_terminal_size
from kvsim.model.errors import KvsimError, shown

COMMANDS = {
    "capacity": "kvsim.cli:capacity",
    "run": "kvsim.cli:run",
    "plan": "kvsim.cli.plan_command:plan",
    "calibrate": "kvsim.cli.profiles:calibrate",
    "import-profile": "kvsim.cli.profiles:import_profile",
    "report": "kvsim.cli:report",
    "validate": "kvsim.cli:validate",
}
"""Every command: its name -> `module:function`, in the order `--help` lists them."""
TYPER_SETTINGS: dict[str, Any] = {"pretty_exceptions_enable": False, "add_completion": False, "rich_markup_mode": None}
"""The app's typer settings, and each command's (`build_command`). Help text is plain: rich markup would swallow
"[default ...]" and other brackets."""


def build_command(name: str) -> Any:  # click's Command, which typer vendors
    """The click command `name` runs (`COMMANDS`): its function imported and built by typer, as the app's own
    commands are (`typer.main.get_command` of an app of that one command, with the app's settings)."""
    module, _, function = COMMANDS[name].partition(":")
    one = typer.Typer(**TYPER_SETTINGS)
    one.command(name)(getattr(import_module(module), function))
    return typer.main.get_command(one)


class LazyCommands(MutableMapping[str, Any]):
    """The group's commands (click's `Group.commands`): every name of `COMMANDS`, in its order, each built
    (`build_command`) the first time it is looked up, and kept."""

    def __init__(self, built: dict[str, Any]) -> None:
        self._built = dict(built)

    def __getitem__(self, name: str) -> Any:
        if name not in self._built and name in COMMANDS:
            self._built[name] = build_command(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        raise TypeError(f"{name}: kvsim's commands are fixed")

    def __iter__(self) -> Iterator[str]:
        return iter([*COMMANDS, *(name for name in self._built if name not in COMMANDS)])

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._built))


class Commands(OneLineUsageErrors):
    """kvsim's command group (`OneLineUsageErrors`) with its commands built as they are asked for
    (`LazyCommands`), after any the app registered itself (none)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(dict(self.commands))


app = typer.Typer(
    cls=Commands,
    help="kvsim: capacity simulator for LLM serving with a paged KV cache.",
    no_args_is_help=True,
    **TYPER_SETTINGS,
)

DEFAULT_CONTEXT_LENGTHS = "1024,2048,4096,8192,16384,32768"
# what the closed-form and the sustained columns each assume, under the cost table with --sustained: the
# sustained output rate above the closed-form one read as a contradiction (tests/test_bad_input_tidy28.py)
SUSTAINED_NOTE = ("Closed form (concurrent_sequences, output_tokens_per_s_closed_form): a cohort of sequences of "
                  "prompt c/2 + output c/2 started together, each ending with all c tokens of context_len c, so "
                  "pool / c of them fit (max_num_seqs caps both). Sustained: Poisson arrivals of the same lengths "
                  "in steady state, where a running sequence holds its prompt and its output so far, about 3c/4 "
                  "on average, so more run at once and output_tokens_per_s_sustained can exceed the closed form. "
                  "The sustained rate is the search's, on probes of sustained_requests_per_probe requests, not re-run "
                  "longer; kvsim report verifies its rate in runs 10x as long.")


def _print_version(value: bool) -> None:
    if value:
        from kvsim.model.version import VERSION_LINE

        typer.echo(VERSION_LINE)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print kvsim's version and exit.")] = False,
) -> None:
    """kvsim: capacity simulator for LLM serving with a paged KV cache."""


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
    max_num_batched_tokens: Annotated[int | None, typer.Option("--max-num-batched-tokens", parser=TOKENS_FLAG)] = None,
    speculative_config: SpeculativeConfigOpt = None,
    data_parallel_size: Annotated[int | None, typer.Option("--data-parallel-size", "-dp", parser=INT_FLAG)] = None,
    enable_expert_parallel: Annotated[bool, typer.Option("--enable-expert-parallel")] = False,
    disable_hybrid_kv_cache_manager: Annotated[bool, typer.Option("--disable-hybrid-kv-cache-manager")] = False,
    context_lengths: Annotated[str, typer.Option("--context-lengths")] = DEFAULT_CONTEXT_LENGTHS,
    shared_prefix_tokens: Annotated[int, typer.Option("--shared-prefix-tokens", parser=INT_FLAG)] = 0,
    num_sequences: Annotated[int | None, typer.Option(
        "--num-sequences", parser=INT_FLAG, help="Sequences sharing the --shared-prefix-tokens prefix [100]")] = None,
    output_format: Annotated[Format, typer.Option("--format")] = Format.table,
    gpu_hourly_cost: HourlyCostOpt = None,
    sustained: Annotated[bool, typer.Option("--sustained", help="Also simulate, per context length, the "
                                            "highest rate one replica sustains (steady state, prompt c/2 + "
                                            "output c/2) and price its output tokens (slower: minutes)")] = False,
) -> None:
    """Closed-form KV capacity: pool, blocks, and max concurrent sequences per context length."""
    from functools import partial

    from kvsim.model.capacity_plan import plan_capacity
    from kvsim.model.config import load_gpu, load_model
    from kvsim.model.engine_config import make_engine
    from kvsim.model.yaml_io import flag_mapping
    from kvsim.planning.cost import add_capacity_costs, closed_form_output_rate, engine_gpus, gpu_price
    from kvsim.results.render import rows_to_csv, rows_to_markdown, rows_to_rich, to_json

    with user_errors():
        if num_sequences is not None and num_sequences < 0:
            raise KvsimError(f"--num-sequences={num_sequences}: must be >= 0")
        if num_sequences is not None and not shared_prefix_tokens:  # it would be ignored silently
            raise KvsimError(f"--num-sequences={num_sequences}: counts the sequences sharing a prefix, so it "
                             "needs --shared-prefix-tokens > 0")
        engine = make_engine(
            "engine",  # its errors name the field as `kvsim run`'s do
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
            speculative_config=None if speculative_config is None else flag_mapping(speculative_config,
                                                                                     "--speculative-config"),
        )
        plan = plan_capacity(
            load_model(model),
            load_gpu(gpu),
            engine,
            parse_int_list(context_lengths, "--context-lengths"),
            shared_prefix_tokens=shared_prefix_tokens,
            num_sequences=(100 if num_sequences is None else num_sequences) if shared_prefix_tokens else 0,
        )
        price = gpu_price(plan.gpu, gpu_hourly_cost)
        data = add_capacity_costs(plan.to_dict(), price, engine.tensor_parallel_size,
                                  engine.resolved_max_num_seqs(load_gpu(gpu)),
                                  closed_form_output_rate(load_model(model), load_gpu(gpu), engine))
        if sustained:
            from kvsim.planning.cost import add_sustained_costs

            probe = partial(fixed_length_scenario, model, gpu, engine)
            warn_unread([probe(plan.max_model_len)])  # the probes differ only in their lengths
            data = add_sustained_costs(data, price, engine_gpus(engine), probe, warn=warn)  # a DP group serves them
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

        console = Console(emoji=False)  # names as written: `:fire:` is no emoji (the headline is markup)
        console.print(capacity_headline(plan))
        console.print(rows_to_rich(data["kv_types"], title="KV by attention type (one request at max_model_len)"))
        # the sustained rate beside its evidence (its probes' length, whether the search settled): they were printed
        # in the concurrency table above, away from the rate and the price they qualify
        cost_keys = ("concurrent_sequences", "usd_per_concurrent_user_hour", "output_tokens_per_s_closed_form",
                     "usd_per_million_output_tokens", "sustained_rate_per_s", "sustained_requests_per_probe",
                     "sustained_converged", "output_tokens_per_s_sustained", "usd_per_million_output_tokens_sustained")
        console.print(rows_to_rich([{k: v for k, v in r.items() if k not in cost_keys} for r in rows],
                                   title="Max concurrent sequences by context length"))
        costs = [{"context_len": r["context_len"], **{k: r[k] for k in cost_keys if k in r}} for r in rows
                 if r["context_len"] <= plan.max_model_len]
        if costs and len(costs[0]) > 2:  # a price is known
            console.print(rows_to_rich(costs, title=f"Cost at that concurrency ({data['gpu_price_source']})"))
            beyond = [f"{r['context_len']:,}" for r in rows if r["context_len"] > plan.max_model_len]
            if beyond:  # left out of the cost table without a word: its "(1 of 3)" of six lengths said nothing
                console.print(f"No cost at context_len {', '.join(beyond)}: past max_model_len={plan.max_model_len:,}, "
                              "vLLM refuses such requests (none can be served).", markup=False)
            if "sustained_rate_per_s" in costs[0]:
                console.print(SUSTAINED_NOTE, markup=False)


def run(
    scenario: Annotated[str | None, typer.Argument(help="Scenario YAML; omitted: the built-in default.")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a field: engine.block_size=32")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Directory for results [runs/NAME]")] = None,
    output_format: Annotated[RunFormat, typer.Option("--format")] = RunFormat.table,
    check: Annotated[bool, typer.Option("--check", help="check_invariants() after every step")] = False,
    steps: Annotated[StepsOption | None, typer.Option(
        "--steps", help="Per-step rows to keep and write: all, sampled (at most 100,000) or none; "
                        "the summary uses every step. Default: the scenario's `steps` (all).")] = None,
    steps_format: Annotated[StepsFormatOption | None, typer.Option(
        "--steps-format", help="File the per-step rows stream to as the run goes: steps.parquet (needs pyarrow), "
                               "steps.csv, or auto (default): parquet when pyarrow is installed; not with steps none",
    )] = None,
    memory_limit: Annotated[str | None, typer.Option("--memory-limit", help="Refuse a run estimated to need "
                                                     "more memory than this, e.g. 64GiB [this machine's]")] = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    scheduling_policy: Annotated[str | None, typer.Option(
        "--scheduling-policy", help="vLLM's flag: fcfs or priority (engine.scheduling_policy)")] = None,
    speculative_config: SpeculativeConfigOpt = None,
    kv_transfer_config: Annotated[str | None, typer.Option(
        "--kv-transfer-config", help="vLLM's flag: JSON for the scenario's kv_transfer_config, e.g. "
                                     "'{\"kv_connector\": \"NixlConnector\", \"kv_link\": \"rdma\"}' (replica groups "
                                     "carry kv_role)")] = None,
) -> None:
    """Simulate a scenario: per-request latency, per-step KV usage and waste, preemptions, queueing.

    A scenario with `replicas` simulates that fleet behind its `router` (see `kvsim.fleet.driver`);
    with `kv_transfer_config`, a disaggregated prefill/decode fleet (`kvsim.fleet.disagg`); with
    `autoscaler`, an autoscaled fleet (`kvsim.fleet.autoscaled`): all through `kvsim.fleet.run`.
    """
    # The imports and the scenario allocate objects that all outlive the run: the collector is off while
    # they are made (collecting them finds nothing: ~0.015 CPU s), then frozen for the run (`run_collector`).
    with collector_off():
        from kvsim.fleet.run import simulate_scenario
        from kvsim.results.output_checks import check_output_dir, safe_component
        from kvsim.results.step_writer import resolve_format

        with user_errors():
            limit_bytes = None if memory_limit is None else parse_size_flag(memory_limit, "--memory-limit")
            flags = run_flags(steps.value if steps else None, max_num_seqs, scheduling_policy, speculative_config,
                              kv_transfer_config)
            spec = load_with_flags(scenario, overrides or [], flags)
            out_dir = f"runs/{safe_component(spec.name)}" if output is None else output
            if steps_format is not None and spec.steps == "none":  # it would be ignored silently
                raise KvsimError(f"--steps-format={steps_format.value}: chooses the file the steps are written to, "
                                 "but this run keeps none (steps=none)")
            steps_format = steps_format or StepsFormatOption.auto
            check_output_dir(out_dir, "run")  # refuse before simulating, not after
            resolve_format(steps_format.value)  # parquet without pyarrow: refused before simulating too
    with run_collector(), user_errors(), run_progress("run", enabled=output_format is RunFormat.table) as progress:
        result = simulate_scenario(spec, check=check, progress=progress, out_dir=out_dir,
                                   steps_format=steps_format.value, memory_limit_bytes=limit_bytes)
        written = Path(out_dir)
    from kvsim.results.render import all_rejected

    rejected = all_rejected(result.summary)
    if rejected is not None:
        warn(rejected)
    warn_unread([spec])
    from kvsim.fleet.run import lone_routers

    for line in lone_routers(spec):
        warn(line)
    if output_format is RunFormat.json:
        from kvsim.results.render import to_json

        sys.stdout.write(to_json(result.summary))
        return
    from rich.console import Console

    from kvsim.results.render import fleet_table, summary_table

    console = Console(emoji=False, markup=False)  # names, paths as given: not `:fire:` as an emoji, `[red]` as markup
    console.print(fleet_table(result.summary) if spec.is_fleet else summary_table(result.summary))
    files = ", ".join(sorted(p.name for p in written.expanduser().iterdir() if not p.name.startswith(".")))
    console.print(f"results written to {written}/ ({files})")


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
    workers: Annotated[int | None, typer.Option("--workers", parser=INT_FLAG,
                                                help="Local processes [all cores]")] = None,
    dask_address: Annotated[str | None, typer.Option("--dask-address", help="Run on a Dask cluster")] = None,
    gpu_hourly_cost: HourlyCostOpt = None,
) -> None:
    """Capacity-planning report: Markdown + HTML with figures and the CSV behind each."""
    from kvsim.report.study_config import StudyConfig
    from kvsim.workload.scenario import REPORT_SCENARIO

    engine_flags = {"max_model_len": max_model_len, "block_size": block_size,
                    "gpu_memory_utilization": gpu_memory_utilization, "kv_cache_dtype": kv_cache_dtype,
                    "kv_cache_memory_bytes": kv_cache_memory_bytes, "num_gpu_blocks_override": num_gpu_blocks_override,
                    "tensor_parallel_size": tensor_parallel_size, "max_num_seqs": max_num_seqs}
    flags = {**{f"engine.{k}": v for k, v in engine_flags.items()}, "model": model, "gpu": gpu}
    sets = {f"--{k.removeprefix('engine.').replace('_', '-')}={shown(v)}":
            f"{k}={json.dumps(v) if isinstance(v, str) else v}"  # a quoted text: '' stays '', not null (as run's)
            for k, v in flags.items() if v is not None}
    with user_errors():
        check_workers(workers, dask_address)
        base = load_with_flags(scenario, overrides or [], sets, default=REPORT_SCENARIO)  # flags after --sets
        from kvsim.planning.cost import gpu_price

        gpu_price(base.gpu, gpu_hourly_cost)  # a bad price fails before any run, told as --gpu-hourly-cost's
        cfg = StudyConfig.quick() if quick else StudyConfig()
        cfg = cfg.model_copy(update={"workers": workers, "dask_address": dask_address,
                                     "gpu_hourly_cost": gpu_hourly_cost})
        cfg.refuse_count_override(overrides or [])
        from kvsim.model.config import load_gpu
        from kvsim.report.fleet_study import ROUTERS, fleet_plan_spec

        try:  # the fleet section plans at this price: one it refuses fails before any run, told as the flag's
            fleet_plan_spec(cfg, base, load_gpu(base.gpu).name, cfg.ttft_slo_s, ROUTERS[0])
        except KvsimError as error:
            if gpu_hourly_cost is None:  # the list price: never past a float
                raise
            raise KvsimError(f"--gpu-hourly-cost={gpu_hourly_cost:g}: the fleet section's plan refuses it "
                             f"({error})") from None
        from kvsim.report.build import build_report, studied_variants  # matplotlib: once the input is good

        warn_unread(studied_variants(base))
        with updater("report") as update:
            def on_study(index: int, num_studies: int, name: str, runs_done: int, runs_submitted: int) -> None:
                assert update is not None
                update(study_text(index, num_studies, name, runs_done, runs_submitted), runs_done,
                       runs_submitted or None, name)

            out = build_report(base, output, cfg, progress=on_study)
    typer.echo(f"report written to {out}/report.html (and report.md, figures, CSVs, alerts.yaml)")


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
    figures: Annotated[bool, typer.Option("--figures/--no-figures", help="Draw the two PNG figures")] = True,
) -> None:
    """Replay a real vLLM run in kvsim and tabulate the errors (TTFT, TPOT, E2E, throughput, queues)."""
    from kvsim.results.output_checks import check_output_dir, safe_component
    from kvsim.validation import compare as v
    from kvsim.validation.measured import load_measured
    from kvsim.validation.replay import default_profile

    with user_errors():
        if profile is not None and latency is not LatencyChoice.calibrated:
            raise KvsimError(f"--profile={profile!r}: only --latency calibrated reads a profile; "
                             f"--latency {latency.value} would ignore it")
        run = load_measured(measured, workload)
        out_path = f"validation/{safe_component(run.name, 'run')}-{latency.value}" if output is None else output
        check_output_dir(out_path, "validation")  # refuse before replaying, not after
        if profile is None and latency is LatencyChoice.calibrated and Path(measured).is_dir():
            found = default_profile(Path(measured), run)
            profile = str(found) if found else None
        with run_progress("validate") as progress:
            result = v.validate(run, latency=latency.value, profile=profile, model=model, gpu=gpu,
                                overrides=overrides or [], measured_path=measured, progress=progress)
        warn_unread([result.scenario])
        out_dir = v.write_validation(result, out_path, figures)
    if output_format is ValidateFormat.json:
        from kvsim.results.render import to_json

        sys.stdout.write(to_json(v.to_json(result)))
    elif output_format is ValidateFormat.markdown:
        sys.stdout.write(v.markdown(result, figures))
    else:
        from rich.console import Console

        from kvsim.results.render import rows_to_rich

        console = Console()
        console.print(rows_to_rich(v.table_rows(result), title=v.headline(result)))
        for note in result.notes:
            console.print(f"note: {note}", markup=False, emoji=False)  # it may quote a name or a path
    typer.echo(f"validation written to {out_dir}/ (validation.md, validation.json, {'figures, ' * figures}sim/)",
               err=True)

def main() -> None:
    with interrupts_installed():
        escape_unencodable_output()
        usable_terminal_size()
        app()
