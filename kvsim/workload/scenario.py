"""A scenario file: model, GPU, engine, workload, latency model and seed, validated once.

    name: lab-8k
    model: llama-3.1-8b            # preset or HF config.json path
    gpu: h100-80gb                 # preset or YAML path
    engine: {max_model_len: 8192, allocator: paged, scheduler: v1}
    workload:
      num_requests: 500
      arrival: {process: poisson, rate: 8}
      prompt_len: {dist: lognormal, mean: 1024, p99: 6000}
      output_len: {dist: lognormal, mean: 256, p99: 1024}
    latency: {model: roofline}
    seed: 0

Unknown keys, wrong types and bad values raise `KvsimError` naming the dotted field.
Relative paths (traces, profiles) are relative to the scenario file; `builtin:NAME`
refers to the data shipped in `kvsim/workload/data/`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from kvsim.model.config import MAX_FIXED_COST_S, GPULink, gpu_presets, model_presets
from kvsim.model.engine_config import MAX_ENGINES, EngineConfig
from kvsim.model.errors import (
    KvsimError,
    cut,
    first_repeat,
    from_validation_error,
    near_path,
    not_a_file,
    reading,
    section_hint,
    shown,
)
from kvsim.model.spec import Label, Settings, WholeSettings
from kvsim.model.yaml_io import load_json, load_yaml, settings_text, yaml_problem
from kvsim.workload.files import data_file, path_texts
from kvsim.workload.fleet_layout import (
    PREFIX_CACHING,
    AutoscalerConfig,
    KVTransferConfig,
    ReplicaGroup,
    Router,
    group_speculates,
    settled_groups,
)
from kvsim.workload.overrides import Overrides, apply_overrides
from kvsim.workload.traffic import Workload

DATA_DIR = Path(__file__).parent / "data"
DEFAULT_SCENARIO = DATA_DIR / "default_scenario.yaml"
REPORT_SCENARIO = DATA_DIR / "report_scenario.yaml"
DATA_SUFFIXES = (".csv", ".jsonl", ".json")  # a trace or a length table, maybe gzipped; not the README or scenarios


def builtin_data() -> dict[str, Path]:
    """The data shipped in DATA_DIR that `builtin:NAME` names, by NAME (the file name less its suffixes)."""
    files = (path for path in DATA_DIR.iterdir() if path.is_file())
    return {path.name.split(".")[0]: path for path in sorted(files)
            if Path(path.name.removesuffix(".gz")).suffix in DATA_SUFFIXES}


class LatencyConfig(Settings):
    """`roofline` (datasheet rates at achievable fractions), `calibrated` or `constant` (tests).

    `profile` (calibrated) is a kvsim profile CSV, an LLMServingSim profile bundle folder or a
    Vidur `mlp.csv` (see `kvsim.latency.profiles`). `overhead_s`, when given, replaces the modelled CPU
    overhead per step (fixed + per sequence, `kvsim.latency.roofline`) by a constant.
    """

    model: Literal["roofline", "calibrated", "constant"] = "roofline"
    profile: str | None = None
    overhead_s: float | None = Field(default=None, ge=0, le=MAX_FIXED_COST_S)
    overlap_swap: bool = False
    step_s: float = Field(default=0.01, gt=0, le=MAX_FIXED_COST_S)

    @model_validator(mode="after")
    def _profile_given(self) -> LatencyConfig:
        if self.model == "calibrated" and not self.profile:
            raise ValueError("model=calibrated needs a profile path")
        return self

    @model_validator(mode="after")
    def _fields_the_model_reads(self) -> LatencyConfig:
        """`profile` is read by the calibrated model only, `step_s` by the constant one only, and `overhead_s`
        and `overlap_swap` by the roofline (the calibrated model's fallback too): given to a model that does
        not read it, a field was dropped without a word (`profile: nope.csv` beside `model: roofline` ran the
        roofline, the file never opened). A written scenario carries every default, so only another value is
        refused."""
        self.refuse_unread("model", {"profile": ("calibrated",), "step_s": ("constant",),
                                     "overhead_s": ("roofline", "calibrated"),
                                     "overlap_swap": ("roofline", "calibrated")}, shown)
        return self


StepsMode = Literal["none", "sampled", "all"]  # which per-step rows a run keeps and writes

class Scenario(WholeSettings):
    error_name = "scenario"  # `kvsim.Scenario(...)` refuses a bad field as `load_scenario` does

    name: Label = "scenario"
    description: str = ""
    model: str = "llama-3.1-8b"
    gpu: str = "h100-80gb"
    engine: EngineConfig = EngineConfig()
    workload: Workload
    latency: LatencyConfig = LatencyConfig()
    gpu_link: GPULink | None = None
    """Replaces the GPU's link: one cluster's interconnect (e.g. PCIe through host memory when
    peer-to-peer is off) rather than the GPU's datasheet."""
    seed: int = Field(default=0, ge=0)  # numpy's generators take a non-negative seed
    steps: StepsMode = Field(default="all", description="per-step rows kept and written: all, sampled "
                             "(at most 100,000 evenly spaced) or none; the summary always uses every step")
    replicas: int | list[ReplicaGroup] | None = Field(default=None, description="a fleet behind `router`")
    router: Router = Router()
    kv_transfer_config: KVTransferConfig | None = Field(
        default=None, exclude_if=lambda config: config is None,
        description="disaggregated prefill/decode: replica groups carry kv_role")
    autoscaler: AutoscalerConfig | None = Field(
        default=None, exclude_if=lambda config: config is None,
        description="replica count follows an HPA-style policy; new replicas serve after startup_s")
    base_dir: str = Field(default=".", exclude=True)

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        """`Scenario.model_validate(fields)`, refusing a bad field as `Scenario(...)` does. Pydantic validates
        through `WholeSettings.__init__`, as `__init__(**fields)`: a key that is no string is refused first (a
        TypeError, "keywords must be strings", there)."""
        keys = [key for key in obj if not isinstance(key, str)] if isinstance(obj, dict) else []
        if keys:  # YAML's `1: x` or `~: x`
            raise KvsimError(f"{shown(keys[0])}: a key must be a string, not {type(keys[0]).__name__}")
        return super().model_validate(obj, **kwargs)

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **kwargs: Any) -> Self:
        """`Scenario.model_validate_json(text)`: the JSON read as kvsim reads JSON (`load_json`: a key given twice
        refused, not its last kept), then validated as `model_validate` does; pydantic's raised its multi-line
        ValidationError, no `KvsimError`."""
        import json

        try:
            fields = load_json(json_data if isinstance(json_data, str) else bytes(json_data).decode())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise KvsimError(f"scenario JSON: not valid JSON ({error})") from None
        return cls.model_validate(fields, **kwargs)

    @classmethod
    def model_validate_strings(cls, obj: Any, **kwargs: Any) -> Self:
        """`Scenario.model_validate_strings(fields)`, refusing a bad field as `model_validate` does (pydantic's
        raised its multi-line ValidationError, no `KvsimError`)."""
        try:
            return super().model_validate_strings(obj, **kwargs)
        except ValidationError as error:
            raise from_validation_error(error, model=Scenario, name="scenario") from None

    @field_validator("router", mode="before")
    @classmethod
    def _no_router(cls, value: Any) -> Any:
        """`router: null` is the default router (one engine has nothing to route; a fleet round-robins)."""
        return Router() if value is None else value

    @model_validator(mode="before")
    @classmethod
    def _groups_settled(cls, data: Any) -> Any:
        """Bad groups named, a group's prefix caching settled (`kvsim.workload.fleet_layout.settled_groups`); a
        `pathlib.Path` read as its text, as `kvsim.simulate` reads it (`Scenario(model=Path(...))` was "Input
        should be a valid string")."""
        return settled_groups(path_texts(data))

    @model_validator(mode="after")
    def _speculation_single_sequence(self) -> Scenario:
        if self.engine.speculative_config is not None and self.workload.beam_width:
            raise ValueError("engine.speculative_config speculates for single sequences: give no beam_width "
                             f"(got beam_width={self.workload.beam_width})")
        trace = self.workload.trace
        groups = self.replicas if isinstance(self.replicas, list) else []
        speculates = any(group_speculates(self.engine, group) for group in groups) if groups else \
            self.engine.speculative_config is not None
        if trace is not None and trace.acceptance_column is not None and not speculates:  # a group's drafts read it
            raise ValueError(f"workload.trace.acceptance_column={trace.acceptance_column!r} needs "
                             "engine.speculative_config (the drafts whose acceptance it gives)"
                             + (", in the scenario's engine or a replica group's" if groups else ""))
        if trace is not None and trace.acceptance_column is not None and self.workload.n > 1:
            raise ValueError(f"workload.n={self.workload.n} with workload.trace.acceptance_column="
                             f"{trace.acceptance_column!r}: the column gives the verify steps of one reply, not of "
                             "each sample's; give n=1, or drop the column to draw acceptance per sample")
        return self

    @model_validator(mode="after")
    def _replicas_positive(self) -> Scenario:
        if isinstance(self.replicas, int) and not 0 < self.replicas <= MAX_ENGINES:
            raise ValueError(f"replicas={self.replicas}: expected 1..{MAX_ENGINES}")
        if isinstance(self.replicas, list) and not self.replicas:
            raise ValueError("replicas=[]: give a count or at least one replica group")
        if isinstance(self.replicas, list) and (total := sum(g.count for g in self.replicas)) > MAX_ENGINES:
            counts = " + ".join(str(g.count) for g in self.replicas)  # each group within it, the fleet past it
            raise ValueError(f"replicas: groups of {cut(counts)} = {total:,} replicas, more than kvsim builds "
                             f"(1..{MAX_ENGINES})")
        names = [g.name for g in self.replicas if g.name is not None] if isinstance(self.replicas, list) else []
        if (twice := first_repeat(names)) is not None:  # both groups named their replicas NAME-0, NAME-1, ...
            raise ValueError(f"replicas: two groups are named {twice!r}; a group's name labels its replicas")
        roles = [g.kv_role for g in self.replicas] if isinstance(self.replicas, list) else []
        if self.kv_transfer_config is not None:
            for role in ("kv_producer", "kv_consumer"):
                if role not in roles:
                    given = f"kv_roles {roles}" if isinstance(self.replicas, list) else \
                        f"replicas={self.replicas}, no groups"  # a count (2) was shown as its roles, []
                    raise ValueError(f"kv_transfer_config: no replica group with kv_role={role} ({given})")
            if None in roles:
                raise ValueError(f"replicas[{roles.index(None)}].kv_role=None: every group of a disaggregated "
                                 "fleet is kv_producer or kv_consumer")
        elif any(roles):
            raise ValueError("kv_role is set on a replica group but kv_transfer_config is missing")
        if self.kv_transfer_config is not None and self.router != Router():  # the pools' routers route, not this
            raise ValueError(f"router.policy={self.router.policy!r}: a disaggregated fleet routes each pool with "
                             "kv_transfer_config.prefill_router and decode_router; set those and drop the router "
                             "(router=null)")
        if self.autoscaler is not None and not isinstance(self.replicas, int):
            raise ValueError(f"autoscaler: needs replicas as a count (the start), not replicas={self.replicas_shown}")
        if self.autoscaler is not None and self.kv_transfer_config is not None:
            raise ValueError("autoscaler with kv_transfer_config: autoscaling a disaggregated fleet is not modelled")
        multi_turn = self.workload.multi_turn
        if multi_turn is not None and multi_turn.timing == "after_reply" and self.kv_transfer_config is not None:
            raise ValueError("workload.multi_turn.timing=after_reply with kv_transfer_config: a client that waits "
                             "for each reply in front of a disaggregated fleet is not modelled")
        if self.workload.max_concurrency is not None and self.kv_transfer_config is not None:
            raise ValueError(f"workload.max_concurrency={self.workload.max_concurrency} with kv_transfer_config: a "
                             "closed-loop client in front of a disaggregated fleet is not modelled")
        if self.replicas is None and self.router != Router():  # one engine: nothing to route, so say so
            raise ValueError(f"router.policy={self.router.policy!r}: a router spreads requests over replicas; "
                             "set replicas (a fleet) or drop the router (router=null)")
        return self

    @property
    def is_fleet(self) -> bool:
        return self.replicas is not None

    @property
    def replicas_shown(self) -> str:
        """`replicas` for an error line, as a scenario gives it: a count, or its groups' fields (not the repr
        of kvsim's `ReplicaGroup` objects, every unset field included)."""
        if not isinstance(self.replicas, list):
            return repr(self.replicas)
        return shown([{key: value for key, value in group.model_dump(exclude_none=True).items() if value != {}}
                      for group in self.replicas])

    def resolve_path(self, path: str, field: str) -> Path:
        """`builtin:NAME` → the data file NAME.* shipped in kvsim/workload/data/ (a name, not a pattern or a
        path: `builtin:README`, `builtin:*` and `builtin:../x` name none); a relative path → relative to the
        scenario file. `field` (e.g. `latency.profile`) names the scenario field that gave `path` in an error."""
        if path.startswith("builtin:"):
            name = path.removeprefix("builtin:")
            shipped = builtin_data()
            if name not in shipped:
                raise KvsimError(f"{field}={shown(path)}: no built-in data named {shown(name)} "
                                 f"(there are: {', '.join(shipped)})")
            return shipped[name]
        if not path.strip():  # `base_dir / ''` is the scenario's folder, read as a file that cannot be read
            raise KvsimError(f"{field}={path!r}: is empty: name a file")
        resolved = data_file(Path(self.base_dir) / path)  # `x.csv` may be found as `x.csv.gz`
        problem = not_a_file(resolved)  # /dev/zero, a pipe: reading never ends
        if problem is not None:
            hint = near_path(resolved) if problem == "file not found" else ""
            raise KvsimError(f"{field}={path!r}: {problem}: {resolved}{hint}")
        return resolved

    def variant_fields(self, exclude: set[str] | None = None) -> dict[str, Any]:
        """The scenario's fields (JSON, less `exclude`) to build another scenario from (a fleet's replica, a plan's
        candidate), its engine changed or not: every field, but `enable_prefix_caching` where it was not given.
        The built engine then takes its own scheduler's default (vLLM's: v1 on, v0 off), as the scenario file run
        with that engine would, and does not count it as given (only a given value is said unread beside a slab
        allocator: `EngineConfig.unread_settings`)."""
        out = self.model_dump(mode="json", exclude=exclude)
        if PREFIX_CACHING not in self.engine.model_fields_set:
            del out["engine"][PREFIX_CACHING]
        return out

    def dump_into(self, folder: str | Path) -> dict[str, Any]:
        """The scenario's fields for a `scenario.yaml` written into `folder`, which `kvsim run` runs again from
        there: each relative data path (a trace's `path`, a length `table`, a latency `profile`: relative to
        the scenario file) made absolute, unless it names a file inside `folder`, which stays relative (a
        replay's `sim/` keeps its workload beside its scenario). `enable_prefix_caching` left at its default is
        left out where an engine of the run (a replica group's included) allocates slabs: written, the replay would
        warn that the slab allocator never reads it, a setting the user never gave
        (`EngineConfig.unread_settings`); read back, every engine takes the same default."""
        inside = Path(folder).resolve()

        def portable(node: Any) -> Any:
            if isinstance(node, list):
                return [portable(item) for item in node]
            if not isinstance(node, dict):
                return node
            out = {key: portable(value) for key, value in node.items()}
            for key in DATA_PATH_FIELDS:
                value = out.get(key)
                if isinstance(value, str) and not value.startswith("builtin:") and not Path(value).is_absolute():
                    resolved = (Path(self.base_dir) / value).resolve()
                    if not resolved.is_relative_to(inside):
                        out[key] = str(resolved)
            return out

        replica_groups = self.replicas if isinstance(self.replicas, list) else []
        allocators = {self.engine.allocator, *(group.engine.get("allocator", "paged") for group in replica_groups)}
        out = portable(self.variant_fields() if allocators != {"paged"} else self.model_dump(mode="json"))
        groups = out["replicas"] if isinstance(out.get("replicas"), list) else []
        presets_of = (("model", model_presets()), ("gpu", gpu_presets()))  # listed once, not per section
        for node in (out, *groups, out["engine"].get("speculative_config") or {}):  # a draft model too
            for key, presets in presets_of:
                if isinstance(node.get(key), str):
                    node[key] = _absolute_config(node[key], presets)
        return out


def _absolute_config(name_or_path: str, presets: list[str]) -> str:
    """A model or GPU given as a relative path (a file, or a model's folder), not a preset, made absolute:
    `load_model` and `load_gpu` read it from the working folder, and a written `scenario.yaml` must run again
    from any folder."""
    path = Path(name_or_path)
    return str(path.resolve()) if name_or_path not in presets and not path.is_absolute() and path.exists() \
        else name_or_path


DATA_PATH_FIELDS = ("path", "table", "profile")
"""The scenario fields (at any depth) that name a data file relative to the scenario file (`resolve_path`)."""


def make_scenario(raw: dict[str, Any], base_dir: str | Path = ".") -> Scenario:
    if "base_dir" in raw:  # the field kvsim sets: given in a file, it was replaced without a word
        raise KvsimError(f"base_dir={shown(raw['base_dir'])}: unknown key (kvsim resolves a scenario's relative "
                         "paths from the folder of its file)")
    return Scenario.model_validate({**raw, "base_dir": str(base_dir)})  # not Scenario(**raw): a key may be no str


def expect_scenario(value: Any, name: str = "scenario") -> Scenario:
    """`value` when it is a `Scenario`, else a `KvsimError` naming it: the fleet APIs and `run_many` given a dict of
    fields stopped with an AttributeError deep in the run (`kvsim.simulate` takes a dict; they take a Scenario)."""
    if not isinstance(value, Scenario):
        raise KvsimError(f"{name}={shown(value)}: expected a Scenario (kvsim.load_scenario(path, overrides) or "
                         "kvsim.Scenario(**fields) makes one)")
    return value


def resolve_scenario(scenario: Scenario | str | Path | Mapping[str, Any] | None,
                     overrides: Overrides = ()) -> Scenario:
    """A `Scenario` from a Scenario, a YAML path, a dict of scenario fields or None (the built-in
    default), with `overrides` applied."""
    if scenario is None or isinstance(scenario, (str, Path)):
        return load_scenario(scenario, overrides)
    if isinstance(scenario, Scenario):
        if not overrides:
            return scenario
        raw, base_dir = scenario.model_dump(), scenario.base_dir
    elif isinstance(scenario, Mapping):
        raw, base_dir = copy.deepcopy(dict(scenario)), "."
    else:
        raise KvsimError(f"scenario={scenario!r}: expected a Scenario, a YAML path or a dict of scenario fields")
    return make_scenario(apply_overrides(raw, overrides), base_dir)


def load_scenario(path: str | Path | None = None, overrides: Overrides | None = None,
                  default: str | Path = DEFAULT_SCENARIO) -> Scenario:
    """Read a YAML scenario (or the built-in `default` when `path` is None) and apply `overrides`
    (a dict of dotted keys to values, or `--set`-style strings; see `Overrides`). Relative data paths are
    relative to the scenario file's folder, or with the built-in default to the working folder."""
    if path is not None and not isinstance(path, (str, Path)):  # Path() would raise a bare TypeError
        raise KvsimError(f"scenario={shown(path)}: expected a YAML path (`kvsim.simulate` also takes a dict of "
                         "scenario fields)")
    if not isinstance(default, (str, Path)):  # an int was read as an open file descriptor
        raise KvsimError(f"default={shown(default)}: expected a YAML path")
    file = Path(default) if path is None else Path(path)
    problem = not_a_file(file if path is None else path, file_kind="a scenario YAML file")
    if problem is not None:  # a FIFO or /dev/zero was "file not found"
        hint = near_scenario(file) if problem == "file not found" else ""
        raise KvsimError(f"scenario={str(path)!r}: {problem}{hint}")
    try:
        with reading(file, "scenario"):
            raw = load_yaml(settings_text(file, "scenario")) or {}
    except yaml.YAMLError as error:
        raise KvsimError(f"scenario {file}: not valid YAML: {yaml_problem(error)}") from None
    if not isinstance(raw, dict):
        raise KvsimError(f"scenario {file}: expected a mapping at the top level")
    if not raw and not overrides:  # it read "workload: required field is missing", naming no file
        raise KvsimError(f"scenario {file}: the file is empty (a scenario names at least its workload; "
                         "`kvsim run` without a file runs the built-in default)")
    raw.setdefault("name", file.stem)
    # a built-in default names no data file of its own: a path an override gives is the caller's, relative to the
    # working folder as a dict scenario's are (`--set workload.trace.path=t.csv` was looked for in kvsim's package)
    return make_scenario(apply_overrides(raw, overrides or ()), file.parent if path is not None else ".")


def near_scenario(path: Path) -> str:
    """` (did you mean X?)` for a scenario `path` that names no file: the nearest YAML file (`near_path`), for a bare
    name also in the working folder's `scenarios/`, where the README's examples keep them (`paper-paged`:
    `scenarios/paper-paged.yaml`)."""
    return near_path(path, "*.y*ml", [Path("scenarios")] if path.parent == Path(".") else [])


BENCH_FLAGS = {"request_rate": "workload.arrival.rate", "num_prompts": "workload.num_requests"}  # vllm bench serve


def set_for_flag(flag: str) -> str | None:
    """The `--set` key of the scenario field an option names (`--gpu`: `gpu`; `--max-model-len`, vLLM's spelling of
    an engine field: `engine.max_model_len`; `--num-requests`: `workload.num_requests`), or None: a command without
    that option tells the user to give it as `--set KEY=VALUE` (`kvsim run --gpu h100` was "No such option").
    Only a long option names a field: a short one is a letter, not a field's name (`-n 2` was told as
    `workload.n`, parallel samples, where a user of `head -n` or `wc -l` means a count of requests). `vllm bench
    serve`'s `--request-rate` and `--num-prompts` name the workload's `arrival.rate` and `num_requests`."""
    if not flag.startswith("--"):
        return None
    name = flag[2:].replace("-", "_")
    if name in BENCH_FLAGS:
        return BENCH_FLAGS[name]
    for prefix, fields in (("", Scenario.model_fields), ("engine.", EngineConfig.model_fields),
                           ("workload.", Workload.model_fields)):
        if name in fields:
            return prefix + name
    return None


def section_set_hint(key: str, value: str | None) -> str:
    """For a `set_for_flag` key that names a section of the scenario, one that takes no single value (`router`;
    not `replicas`, which also takes a count): how to give the field that takes `value` with `--set`
    (": set its field, --set router.policy=least_kv", where `--set router=least_kv` would be refused pointing to
    `router.policy`), else the section's fields; "" for a key that takes one value."""
    from typing import get_args

    *parents, name = key.split(".")
    sections: dict[str, type[Settings]] = {"": Scenario, "engine": EngineConfig, "workload": Workload}
    if ".".join(parents) not in sections:  # a `BENCH_FLAGS` key deeper down (`workload.arrival.rate`): one value
        return ""
    info = sections[".".join(parents)].model_fields[name]
    pending, scalar = [info.annotation, *info.metadata], False
    while pending:  # `X | None`, `int | list[Group]`, `Annotated[A | B, ...]`: is any member one value?
        item = pending.pop()
        members = [*get_args(item), *getattr(item, "__metadata__", ())]
        scalar = scalar or (isinstance(item, type) and not hasattr(item, "model_fields")
                            and item is not type(None) and not members)
        pending += [m for m in members if isinstance(m, type) or get_args(m)]
    return "" if scalar else section_hint(Scenario, tuple(key.split(".")), key, value, setter="--set ")
