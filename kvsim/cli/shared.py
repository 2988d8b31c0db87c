"""What the `kvsim` commands share: option types and choices, flag parsers, the one-line error rule, warnings,
the few text helpers of the capacity output (`kvsim.cli` defines the commands; `kvsim plan`'s output is
`kvsim.cli.plan_command`'s).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from kvsim.cli.stdout import unwritable_stdout
from kvsim.model.errors import KvsimError, empty_item, first_repeat, shown
from kvsim.model.sizes import parse_max_model_len, parse_token_count
from kvsim.model.units import read_number, underscore_problem

OUTPUT_OPTION = "--output"  # every command's option for the output it writes


class Format(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"
    markdown = "markdown"


@contextmanager
def collector_off() -> Iterator[None]:
    """Python's cyclic garbage collector off inside, as it was after: for a stretch that only makes objects
    which live on (imports, a loaded scenario), where every collection would walk them for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


RUN_YOUNG_COLLECTION = 100_000  # net container allocations between young collections during a run (Python: 700)


@contextmanager
def run_collector() -> Iterator[None]:
    """The cyclic garbage collector as a simulation wants it inside, as it was after: every object that exists
    on entry (imports, the loaded scenario: all outlive the run) frozen, so that no collection walks them (a
    full collection fewer: ~0.04 CPU s of the bench's 2 s runs), and the youngest generation collected every
    `RUN_YOUNG_COLLECTION` allocations rather than 700 (a run's objects live a step or a request's lifetime, and
    are freed by their reference counts: the frequent young collections found little, 0.4 % of the Mooncake
    bench run's instructions, 14.41 → 14.35 G at 100,000, 14.37 G at 20,000; peak RSS 150 MB either way,
    +1 MB); unfrozen and reset after, so an in-process caller (CliRunner) keeps its usual collection."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(RUN_YOUNG_COLLECTION, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@contextmanager
def user_errors() -> Iterator[None]:
    """Print a `KvsimError` as one line and exit 2: the CLI never shows a traceback for bad input. An output is
    named as the option that gives it (every command's `--output`), not as Python's parameter (`out_dir`)."""
    try:
        yield
    except KvsimError as error:
        typer.echo(f"kvsim: error: {error.named(OUTPUT_OPTION)}", err=True)
        raise typer.Exit(2) from None
    except OSError as error:  # e.g. an output directory that cannot be written
        where = f"{error.filename}: " if error.filename else ""
        typer.echo(f"kvsim: error: {where}{error.strerror or error}", err=True)
        raise typer.Exit(2) from None


@contextmanager
def one_line_usage_errors() -> Iterator[None]:
    """Print a usage error (an unknown option or command, a value outside an option's choices, a missing
    argument) as one line, as `user_errors` does, instead of click's usage banner, hint and error, and
    exit 2 as click does. A usage error is a `typer.TyperException` that click would show as a
    `typer.BadParameter` is shown; one that shows otherwise (a bare `kvsim` printing its help) is left
    to click."""
    try:
        yield
    except typer.TyperException as error:
        if getattr(type(error), "show", None) is not typer.BadParameter.show:
            raise
        ctx = getattr(error, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        typer.echo(f"kvsim: error: {_field_as_set(error, ctx) or error.format_message()}{hint}", err=True)
        raise typer.Exit(2) from None


def _field_as_set(error: Exception, ctx: Any) -> str | None:
    """For an option the command lacks that names a scenario field, where the command takes `--set`: say how to
    give it (`kvsim run --gpu h100` offered "Possible options: --output"); else None. Only click's NoSuchOption
    carries `possibilities` (typer vendors click privately, so it is told by that attribute, not its class). A
    section (`--router least_kv`) is told by the field that takes the value (`--set router.policy=least_kv`):
    `--set router=VALUE` would be refused, pointing there."""
    from kvsim.workload.scenario import section_set_hint, set_for_flag

    flag = getattr(error, "option_name", None)
    if not hasattr(error, "possibilities") or not isinstance(flag, str) or ctx is None or not any(
            "--set" in getattr(param, "opts", ()) for param in ctx.command.params):
        return None
    key = set_for_flag(flag)
    if key is None:
        return None
    section = section_set_hint(key, _flag_value(flag, ctx.meta.get(_ARGS_KEY, [])))
    if section:
        return f"No such option: {flag}: {key} is a section of the scenario, not one value{section}"
    return f"No such option: {flag}: {key} is a scenario field; give it as --set {key}=VALUE"


_ARGS_KEY = "kvsim.command_args"  # `ctx.meta`'s key for the command's own arguments (`OneLineUsageErrors`)


def _flag_value(flag: str, args: list[str]) -> str | None:
    """The value given to `flag` in `args` (`--router least_kv`, `--router=least_kv`), or None."""
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1] if i + 1 < len(args) else None
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
    return None


class OneLineUsageErrors(TyperGroup):
    """kvsim's command group: its usage errors, and its commands', print as one line
    (`one_line_usage_errors`); a command's own bad input already does (`user_errors`), and a standard output it
    cannot write does (`unwritable_stdout`): a command's, and the group's own `--help` and `--version`, which
    click answers while it parses the group's arguments (`make_context`; `kvsim --help >&-` exited 0 without a
    word, `> /dev/full` was a traceback)."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:  # click's Context, which typer vendors
        with one_line_usage_errors(), unwritable_stdout():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with one_line_usage_errors(), log_warnings_said(), unwritable_stdout():
            return super().invoke(ctx)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """click's, keeping the command's arguments in `ctx.meta` (shared with the command's context), where a
        usage error's hint reads the value an unknown option was given (`_field_as_set`)."""
        ctx.meta[_ARGS_KEY] = args[1:]
        return super().resolve_command(ctx, args)


def warn(text: str) -> None:
    """`text` as one warning line on stderr: `kvsim: warning: TEXT`."""
    typer.echo(f"kvsim: warning: {text}", err=True)


class _WarningLine(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        warn(record.getMessage())


@contextmanager
def log_warnings_said() -> Iterator[None]:
    """While a command runs, the warnings kvsim's library logs (`logging.getLogger("kvsim...")`: a trace shorter
    than workload.num_requests, a calibrated profile's gap, conversations skipped) are said as `warn` says the
    others, one `kvsim: warning: ...` line on stderr: with no handler configured, Python's last-resort handler
    printed the bare message. Records still propagate (to pytest's caplog, a notebook's own handlers)."""
    logger, handler = logging.getLogger("kvsim"), _WarningLine(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def warn_unread(scenarios: list[Any]) -> None:
    """Warn of each setting that no engine of a command's runs reads: the settings of
    `kvsim.fleet.run.unread_by_setting` that every one of `scenarios` (the scenario a command loaded, and the
    variants it simulates of it) leaves unread, each with the first scenario's line (variants may say why
    differently: a plan's `scheduler=v1,static` candidates both ignore `swap_space`, each for its own scheduler); a
    setting one variant reads (a plan candidate's knob, the report's slab allocators) runs. Every command that
    simulates a scenario calls it: run, plan, report, capacity --sustained, validate."""
    from kvsim.fleet.run import unread_by_setting

    said = [unread_by_setting(scenario) for scenario in scenarios]
    for setting, line in said[0].items():
        if all(setting in other for other in said[1:]):
            warn(line)


def parse_int_list(text: str, field: str) -> list[int]:
    """`1024,4096` → [1024, 4096]; anything else (a value given twice included: it would make a row, or
    a calibration point, twice; an empty item, `1024,,4096` or `1024,`: a value left out) is an error naming
    the flag."""
    if not text.strip():
        raise KvsimError(f"{field}={text!r}: expected at least one integer")
    if (gap := empty_item(text)) is not None:  # skipped, it ran without the value the gap stood for
        raise KvsimError(f"{field}={text!r}: item {gap} is empty")
    for part in text.split(","):
        if (problem := underscore_problem(part)) is not None:  # int() read `1_024` as 1024
            raise KvsimError(f"{field}={text!r}: {part.strip()!r} is {problem}")
    try:
        values = [read_number(part, int) for part in text.split(",")]  # ASCII: int() reads other scripts' digits
    except ValueError:
        raise KvsimError(f"{field}={text!r}: expected comma-separated integers") from None
    twice = first_repeat(values)
    if twice is not None:
        raise KvsimError(f"{field}={text!r}: {twice} is given twice")
    return values


def run_flags(steps: str | None, max_num_seqs: int | None, scheduling_policy: str | None,
              speculative_config: str | None, kv_transfer_config: str | None) -> dict[str, str]:
    """`kvsim run`'s vLLM-style flags that are given, each as given (`--max-num-seqs=5`) -> the override it makes
    (`engine.max_num_seqs=5`). An empty flag is refused, never no setting: a JSON flag must be a JSON object, and
    a quoted name stays '' (not null)."""
    import json

    from kvsim.model.yaml_io import flag_mapping

    if speculative_config is not None:  # vLLM's flag: a JSON object, checked as capacity's is
        flag_mapping(speculative_config, "--speculative-config")
    if kv_transfer_config is not None:  # vLLM's flag: a mapping, checked as plan's is
        flag_mapping(kv_transfer_config, "--kv-transfer-config")
    return {f"{flag}={shown(value)}": f"{field}={text}" for flag, field, value, text in (
        ("--steps", "steps", steps, steps),
        ("--max-num-seqs", "engine.max_num_seqs", max_num_seqs, max_num_seqs),
        ("--scheduling-policy", "engine.scheduling_policy", scheduling_policy, json.dumps(scheduling_policy)),
        ("--speculative-config", "engine.speculative_config", speculative_config, speculative_config),
        ("--kv-transfer-config", "kv_transfer_config", kv_transfer_config, kv_transfer_config)) if value is not None}


def refuse_flag_beside_set(flags: dict[str, str], overrides: list[str]) -> None:
    """`flags`: each vLLM-style flag as given (`--max-num-seqs=5`) -> the override it makes (`engine.max_num_seqs=5`),
    applied after the `--set` ones (`overrides`): a `--set` of the same field, of one inside the section a flag
    replaces, or of a section whose value gives the flag's field (`engine={max_num_seqs: 8}`), is refused naming the
    flag. The flag won wherever it stood on the command line (`run`; in `report` the `--set` did): one of the two
    values was dropped without a word, where repeated `--set`s keep the last."""
    from kvsim.workload.overrides import held_by_section, override_items, undone_by

    items = override_items(overrides)
    keys = [key for key, _, _ in items]
    for flag, item in flags.items():
        key = item.partition("=")[0]
        done = undone_by(key, keys)
        if done is not None:
            replacing = "" if done == key else f", replacing {done}"
            raise KvsimError(f"{flag}: sets {key}{replacing}, which {items[keys.index(done)][2]} sets too; "
                             "give each field once")
        section = held_by_section(key, items)
        if section is not None:
            raise KvsimError(f"{flag}: sets {key}, which {section[2]} gives too; "
                             "give each field once")


def load_with_flags(scenario: str | None, overrides: list[str], flags: dict[str, str], **load: Any):
    """The scenario (`load_scenario(scenario, ..., **load)`: a path, None for the default) with the `--set`
    `overrides` and then a command's vLLM-style `flags` (`run_flags`) applied; a flag that one of them would drop is
    refused naming it: a `--set` of its field (`refuse_flag_beside_set`), or a replica group giving the field for
    its own replicas (`replicas: [{engine: {max_num_seqs: 64}}]` beside `--max-num-seqs 8`: the group's value won,
    and the flag reached no engine of that group without a word), as such a `--set` is
    (`kvsim.workload.overrides.refuse_replaced_by_group`)."""
    from kvsim.workload.overrides import FlagOverride
    from kvsim.workload.scenario import load_scenario

    refuse_flag_beside_set(flags, overrides)
    return load_scenario(scenario, [*overrides, *(FlagOverride(item, flag) for flag, item in flags.items())], **load)


def parse_size_flag(text: str, flag: str) -> int:
    """`64GiB`, `500MB` or a byte count → bytes; anything else is an error naming the flag, and a size of none
    (`0`, `0GiB`: no run fits under a limit of 0 B, no tier of 0 B holds a block) one saying it must be positive."""
    from kvsim.model.sizes import MAX_BYTES, parse_size

    try:
        value = parse_size(text)
    except ValueError:
        value = None
    if isinstance(value, (int, float)) and value == 0:
        raise KvsimError(f"{flag}={shown(text)}: must be positive: give a size such as 64GiB, 500MB or 4096")
    if not isinstance(value, int) or not 0 < value <= MAX_BYTES:
        raise KvsimError(f"{flag}={shown(text)}: expected a size such as 64GiB, 500MB or 4096 (at most "
                         f"{MAX_BYTES:,} B)")
    return value


PROCESSES_PER_CPU = 4
"""`--workers` beyond this many per CPU is refused: the processes would only share the CPUs, each holding its
own interpreter and imports (about 100 MB), and a slip like `--workers 100000` forked thousands of them."""


def check_workers(workers: int | None, dask_address: str | None) -> None:
    """`--workers`: a count of local processes, at least 1 and at most `PROCESSES_PER_CPU` per CPU (None: the
    command's default, one per CPU). `--dask-address`: not empty (an unset shell variable would have run
    everything here, as if the flag were not given)."""
    if dask_address is not None and not dask_address.strip():
        raise KvsimError(f"--dask-address={dask_address!r}: is empty: name a scheduler (tcp://host:8786), "
                         "or leave the flag out to run here")
    if workers is not None and workers < 1:
        raise KvsimError(f"--workers={workers}: expected at least 1 process (1 runs here)")
    cpus = os.cpu_count() or 1
    if workers is not None and workers > PROCESSES_PER_CPU * cpus:
        raise KvsimError(f"--workers={workers}: more than {PROCESSES_PER_CPU} processes per CPU ({cpus} here); "
                         "give at most one per CPU, or a cluster with --dask-address")


def _number_flag(kind: type[int] | type[float], before: Any = None) -> Any:
    """A flag's parser: `kind` as typer reads it (pydantic's lax mode, which takes `1_0` as 10), except that
    text with an underscore is refused (`kvsim.model.units.underscore_problem`), as the same value in a scenario
    or a `--set` is, and a number that is not finite (`inf`, `nan`, `1e400`), as a `Settings` field refuses it; a
    refusal names the value as given, as a `--set`'s does (`--gpu-memory-utilization 1e400` was shown as inf).
    `before`, where given, reads the text first as the field's own validator does (`32k`: `parse_token_count`)."""
    from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError

    # an int is finite already, and the check would make a float of it (10**400: OverflowError)
    finite: Any = Annotated[float, Field(allow_inf_nan=False)] if kind is float else kind
    adapter = TypeAdapter(finite if before is None else Annotated[finite, BeforeValidator(before)])

    def parse(value: Any) -> Any:
        problem = underscore_problem(value)
        if problem is not None:
            raise typer.BadParameter(f"{value!r}: {problem}")
        try:
            return adapter.validate_python(value)
        except ValidationError as error:  # its message, after the value (typer's own left `nan`, `1e400` unsaid)
            raise typer.BadParameter(f"{value!r}: {error.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    return parse


INT_FLAG, FLOAT_FLAG = _number_flag(int), _number_flag(float)
"""`parser=` of every integer and every number flag."""
TOKENS_FLAG = _number_flag(int, parse_token_count)
"""`parser=` of a flag vLLM reads with `human_readable_int` (`--max-num-batched-tokens 8k`)."""

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "h100-80gb"
ModelOpt = Annotated[str, typer.Option("--model", help="Preset name or path to a HF config.json.")]
GpuOpt = Annotated[str, typer.Option("--gpu", help="Preset name or path to a GPU YAML/JSON file.")]
MaxModelLenOpt = Annotated[int | None, typer.Option("--max-model-len", parser=_number_flag(int, parse_max_model_len),
                                                    help="Tokens: 32768, 32k (32,000) or 32K (32,768)")]
BlockSizeOpt = Annotated[int | None, typer.Option("--block-size", parser=INT_FLAG)]
GpuUtilOpt = Annotated[float | None, typer.Option("--gpu-memory-utilization", parser=FLOAT_FLAG)]
KvDtypeOpt = Annotated[str | None, typer.Option(  # every value of kvsim.model.engine_config.KVCacheDtype
    "--kv-cache-dtype", help="auto, fp8, fp8_e4m3, fp8_e5m2, float16, bfloat16")]
KvBytesOpt = Annotated[str | None, typer.Option("--kv-cache-memory-bytes", help="e.g. 12GiB")]
BlocksOverrideOpt = Annotated[int | None, typer.Option("--num-gpu-blocks-override", parser=INT_FLAG)]
TpOpt = Annotated[int | None, typer.Option("--tensor-parallel-size", "-tp", parser=INT_FLAG)]
SpeculativeConfigOpt = Annotated[str | None, typer.Option(
    "--speculative-config", help="vLLM's flag, a JSON object (engine.speculative_config), e.g. "
                                 "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"acceptance_rates\": 0.8}'")]


MaxNumSeqsOpt = Annotated[int | None, typer.Option("--max-num-seqs", parser=INT_FLAG,
                                                   help="Sequences per step [vLLM's default for the GPU]")]
HourlyCostOpt = Annotated[float | None, typer.Option(
    "--gpu-hourly-cost", parser=FLOAT_FLAG,
    help="USD per GPU-hour [the GPU's list on-demand price as of a date, see the output]")]


def beyond_max_model_len(row: dict, max_model_len: int) -> dict:
    """A context above max_model_len holds no sequence because vLLM refuses it, not for want of memory:
    say so instead of printing 0."""
    if row["context_len"] <= max_model_len:
        return row
    kept = ("context_len", "blocks_per_seq")
    return {k: v if k in kept or v is None else "exceeds max_model_len" for k, v in row.items()}


class StepsOption(StrEnum):
    none = "none"
    sampled = "sampled"
    all = "all"


class StepsFormatOption(StrEnum):
    auto = "auto"
    parquet = "parquet"
    csv = "csv"


class RunFormat(StrEnum):
    table = "table"
    json = "json"


class LatencyChoice(StrEnum):
    roofline = "roofline"
    calibrated = "calibrated"


class ValidateFormat(StrEnum):
    table = "table"
    json = "json"
    markdown = "markdown"


def capacity_headline(plan) -> str:  # plan: kvsim.model.capacity_plan.CapacityPlan
    """`capacity`'s first lines, rich markup: the model and GPU in bold, each escaped (a name, or a file's, holding
    `[red]` is shown as it is written)."""
    from rich.markup import escape

    gib = 2**30
    return (
        f"[bold]{escape(plan.model)}[/] on [bold]{escape(plan.gpu)}[/]  kv_cache_dtype={plan.kv_cache_dtype}  "
        f"block_size={plan.block_size}  max_model_len={plan.max_model_len:,}\n"
        f"KV: {plan.bytes_per_token:,} B/token, {plan.bytes_per_block:,} B/block, "
        f"{plan.num_kv_groups} KV group(s) of {plan.layers_per_kv_group} layers\n"
        f"params {plan.num_params / 1e9:.2f}B ({plan.active_params_per_token / 1e9:.2f}B active per token); "
        f"weights {plan.weights_bytes / gib:.2f} GiB per GPU; KV pool {plan.kv_pool_bytes / gib:.2f} GiB = "
        f"{plan.num_gpu_blocks:,} blocks ({plan.num_token_slots:,} token slots)\n"
        f"vLLM 'maximum concurrency' at max_model_len: {plan.max_concurrency:.2f}x "
        f"(fp8 KV: {plan.num_gpu_blocks_fp8:,} blocks, {plan.max_concurrency_fp8:.2f}x)"
    )


def fixed_length_scenario(model: str, gpu: str, engine, context_len: int):  # engine: EngineConfig
    """`capacity --sustained`'s traffic at one context length: prompt c/2 + output c/2, Poisson arrivals."""
    from kvsim.workload.scenario import make_scenario

    half = context_len // 2
    return make_scenario({"name": f"capacity-{context_len}", "model": model, "gpu": gpu, "steps": "none",
                          "engine": engine.model_dump(mode="json", exclude_unset=True),
                          "workload": {"num_requests": 200, "arrival": {"process": "poisson", "rate": 1.0},
                                       "prompt_len": {"dist": "fixed", "value": half},
                                       "output_len": {"dist": "fixed", "value": context_len - half}}})
