"""Settings a run never reads are said, not silently dropped: `engine.slab_placement` beside the paged
allocator and `engine.prefix_cache: radix` with prefix caching off (`EngineConfig.unread_settings`)."""

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.model.engine_config import make_engine

SMALL = ["--set", "workload.num_requests=5", "--format", "json"]


@pytest.mark.parametrize(("fields", "unread"), [
    ({}, []),
    ({"allocator": "slab-max", "slab_placement": "first-fit"}, []),  # read: slabs are placed
    ({"slab_placement": "first-fit"}, ["slab_placement"]),  # paged places no slabs
    ({"slab_placement": "buddy"}, []),  # the default, which every written scenario.yaml spells out
    ({"prefix_cache": "radix"}, []),  # v1 caches prefixes by default: the radix tree is read
    ({"prefix_cache": "radix", "enable_prefix_caching": False}, ["prefix_cache"]),
    ({"allocator": "slab-pow2", "enable_prefix_caching": False}, []),
    # a slab pool caches nothing (`SlabAllocator.enable_caching` is False): caching given true is dropped; v1's
    # default (on) is no setting of the user's, and the paged allocator reads it
    ({"allocator": "slab-max", "enable_prefix_caching": True}, ["enable_prefix_caching"]),
    ({"allocator": "slab-oracle", "scheduler": "v0", "enable_prefix_caching": True}, ["enable_prefix_caching"]),
    ({"allocator": "slab-max"}, []),
    ({"enable_prefix_caching": True}, []),
    ({"enforce_eager": True}, []),  # v1's steps are padded to CUDA-graph sizes unless eager
    ({"scheduler": "v0", "enforce_eager": True}, ["enforce_eager"]),
    ({"scheduler": "static", "enforce_eager": True}, ["enforce_eager"]),
    ({"scheduler": "v0"}, []),
])
def test_unread_settings_name_exactly_the_fields_a_run_ignores(fields, unread):
    said = make_engine(**fields).unread_settings()
    assert list(said) == unread
    assert all(line.startswith(f"engine.{field}=") for field, line in said.items())  # each line names its field


def test_a_run_warns_of_unread_settings_on_stderr_and_still_runs(tmp_path):
    result = CliRunner().invoke(app, ["run", *SMALL, "--set", "engine.slab_placement=first-fit",
                                      "--set", "engine.prefix_cache=radix", "--set", "engine.enable_prefix_caching=false",
                                      "-o", str(tmp_path / "out")], prog_name="kvsim")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_requests"] == 5
    assert result.stderr.splitlines() == [
        "kvsim: warning: engine.slab_placement=first-fit is unread: the paged allocator places no slabs",
        "kvsim: warning: engine.prefix_cache=radix is unread: enable_prefix_caching is false, so no prefix is cached"]
    clean = CliRunner().invoke(app, ["run", *SMALL, "-o", str(tmp_path / "clean")], prog_name="kvsim")
    assert clean.exit_code == 0 and clean.stderr == ""
    rerun = CliRunner().invoke(app, ["run", str(tmp_path / "clean" / "scenario.yaml"), "--format", "json",
                                     "-o", str(tmp_path / "rerun")], prog_name="kvsim")  # every field written out
    assert rerun.exit_code == 0 and rerun.stderr == ""


@pytest.mark.parametrize("slabs", [["--set", "engine.allocator=slab-max"],
                                   ["--set", "replicas=[{engine: {allocator: slab-max}}]"]])  # a group's slabs
def test_prefix_caching_given_beside_slabs_warns_and_its_default_stays_quiet_in_a_replay(tmp_path, slabs):
    """`enable_prefix_caching: true` beside a slab allocator was read by nothing, without a word. Said only when
    given: v1 turns caching on by default, and a slab run's written scenario.yaml (a fleet's whose group allocates
    slabs too) leaves that default out, so running it again says nothing either."""
    given = CliRunner().invoke(app, ["run", *SMALL, *slabs, "--set", "engine.enable_prefix_caching=true",
                                     "-o", str(tmp_path / "given")], prog_name="kvsim")
    assert given.exit_code == 0 and given.stderr.splitlines() == [
        "kvsim: warning: engine.enable_prefix_caching=true is unread: allocator slab-max reserves a slab per "
        "request and caches no prefix"]
    quiet = CliRunner().invoke(app, ["run", *SMALL, *slabs, "-o", str(tmp_path / "quiet")], prog_name="kvsim")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    rerun = CliRunner().invoke(app, ["run", str(tmp_path / "quiet" / "scenario.yaml"), "--format", "json",
                                     "-o", str(tmp_path / "rerun")], prog_name="kvsim")
    assert rerun.exit_code == 0 and rerun.stderr == ""
    assert json.loads(rerun.stdout) == json.loads(quiet.stdout)  # the same run


@pytest.mark.parametrize(("groups", "said"), [
    ("[{engine: {allocator: slab-max}}]", []),  # v1's default caching, not given: no setting of the user's
    ("[{count: 1}, {engine: {allocator: slab-max, enable_prefix_caching: true}}]",
     ["replicas[1]: engine.enable_prefix_caching=true is unread: allocator slab-max reserves a slab per request "
      "and caches no prefix"]),
])
def test_a_slab_group_says_prefix_caching_unread_only_where_given(groups, said):
    """A replica group's engine is the scenario's with the group's on top: the scenario's default caching reached
    each group as a given `enable_prefix_caching: true`, and a slab group said it unread though no one set it."""
    from kvsim.fleet.run import unread_by_setting
    from kvsim.workload.scenario import load_scenario

    assert list(unread_by_setting(load_scenario(None, [f"replicas={groups}"])).values()) == said


@pytest.mark.parametrize(("model", "unread"), [("llama-3.1-8b", ["enable_expert_parallel"]), ("qwen3-30b-a3b", [])])
def test_expert_parallelism_on_a_dense_model_is_said_unread(model, unread):
    """vLLM's --enable-expert-parallel places a model's experts; a dense model has none, so the flag does nothing
    there (it was accepted without a word)."""
    from kvsim.model.config import load_model

    said = make_engine(enable_expert_parallel=True).unread_settings(load_model(model))
    assert list(said) == unread
    assert make_engine().unread_settings(load_model("llama-3.1-8b")) == {}


def test_a_fleet_says_expert_parallelism_unread_for_its_dense_group_only(tmp_path):
    """Replica groups serving a dense and an MoE model under one `engine` section that turns expert parallelism
    on: only the dense group ignores it, so no line is said for the whole scenario (the MoE group reads it)."""
    from kvsim.fleet.run import unread_by_setting
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario(None, ["engine.enable_expert_parallel=true", "engine.max_model_len=4096",
                                    "replicas=[{count: 1}, {count: 1, model: qwen3-30b-a3b}]"])
    assert list(unread_by_setting(scenario).values()) == []
    dense = load_scenario(None, ["engine.enable_expert_parallel=true", "replicas=2"])
    assert list(unread_by_setting(dense).values()) == [
        "engine.enable_expert_parallel=true is unread: llama-3.1-8b is dense, with no experts to place"]


def test_a_setting_every_group_ignores_for_its_own_reason_is_said_once():
    """`swap_space` under one `engine` section, a v1 group and a static one: vLLM v1 preempts by recompute and takes
    `--swap-space` without using it, the static scheduler preempts by recompute too (`EngineConfig.can_swap`), so no
    engine of the run reads it. Each group says so in its own words ("scheduler v1 never swaps", "scheduler static
    never swaps"), and comparing the lines said nothing; the settings are compared (the first group's line)."""
    from kvsim.fleet.run import unread_by_setting
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario(None, ["engine.swap_space=8", "engine.max_model_len=4096",
                                    "replicas=[{count: 1}, {count: 1, engine: {scheduler: static}}]"])
    assert list(unread_by_setting(scenario).values()) == ["engine.swap_space=8 is unread: scheduler v1 never swaps"]


UNREAD = ["--set", "engine.slab_placement=first-fit", "--set", "engine.kv_cache_memory_bytes=8GiB",
          "--set", "engine.gpu_memory_utilization=0.8"]
SLABS = "kvsim: warning: engine.slab_placement=first-fit is unread: the paged allocator places no slabs"
UTILIZATION = ("kvsim: warning: engine.gpu_memory_utilization=0.8 is unread: kv_cache_memory_bytes sizes the KV "
               "pool, as in vLLM")
PLAN = ["plan", "--slo", "ttft_s.p90=2", "--gpu", "h100-80gb", "--workers", "1"]


@pytest.mark.parametrize(("command", "simulates", "said"), [
    ([*PLAN, *UNREAD], "kvsim.planning.plan.plan", [SLABS, UTILIZATION]),
    ([*PLAN, *UNREAD, "--engine", "allocator=paged,slab-max"], "kvsim.planning.plan.plan", [UTILIZATION]),
    ([*PLAN], "kvsim.planning.plan.plan", []),
    # a candidate is built from the base's fields: v1's default caching stays a default, not a setting given
    ([*PLAN, "--set", "engine.allocator=slab-max"], "kvsim.planning.plan.plan", []),
    ([*PLAN, "--set", "engine.allocator=slab-max", "--set", "engine.enable_prefix_caching=true"],
     "kvsim.planning.plan.plan", ["kvsim: warning: engine.enable_prefix_caching=true is unread: allocator slab-max "
                                  "reserves a slab per request and caches no prefix"]),
    ([*PLAN, "--set", "engine.swap_space=8", "--set", "engine.max_model_len=2048", "--engine", "scheduler=v1,static"],
     "kvsim.planning.plan.plan", ["kvsim: warning: engine.swap_space=8 is unread: scheduler v1 never swaps"]),
    (["report", *UNREAD], "kvsim.report.build.build_report", [UTILIZATION]),
    (["capacity", "--sustained", "--max-model-len", "4096", "--kv-cache-memory-bytes", "8GiB",
      "--gpu-memory-utilization", "0.8"], "kvsim.planning.cost.add_sustained_costs", [UTILIZATION]),
    (["validate", "RUN", "--gpu", "h100-80gb", "--set", "engine.slab_placement=first-fit"],
     "kvsim.validation.compare.write_validation", [SLABS]),
])
def test_every_command_that_simulates_a_scenario_warns_of_its_unread_settings(tmp_path, monkeypatch, command,
                                                                             simulates, said):
    """`kvsim run` alone said the settings no engine reads; plan, report, capacity --sustained and validate simulated
    the same scenarios without a word. Each says them once its inputs are checked (the simulation is stubbed out: it
    stops the command there). A setting some variant reads is not said: a plan candidate's slab allocator, and the
    report's slab studies, place slabs (`slab_placement`); `kv_cache_memory_bytes` sizes every pool, so
    `gpu_memory_utilization` beside it is read by none."""
    import importlib

    from kvsim.model.errors import KvsimError

    def stopped(*args, **kwargs):
        raise KvsimError("stopped")

    module, name = simulates.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(module), name, stopped)
    if "RUN" in command:
        from test_validate import write_run  # tests/ is on sys.path

        command = [str(write_run(tmp_path)) if arg == "RUN" else arg for arg in command]
    output = [] if command[0] == "capacity" else ["-o", str(tmp_path / "out")]
    result = CliRunner().invoke(app, [*command, *output], prog_name="kvsim")
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.splitlines() == [*said, "kvsim: error: stopped"]


@pytest.mark.parametrize(("sets", "caching"), [
    ([], {"v1": True, "v0": False}),  # each scheduler's own default: vLLM's V0 engine caches no prefix unless asked
    (["engine.scheduler=v0"], {"v1": True, "v0": False}),  # a v0 base's default is no setting either
    (["engine.enable_prefix_caching=true"], {"v1": True, "v0": True}),  # given: every candidate keeps it
    (["engine.enable_prefix_caching=false"], {"v1": False, "v0": False}),
    (["engine.scheduler=v0", "engine.enable_prefix_caching=false"], {"v1": False, "v0": False}),
])
def test_a_plan_candidate_s_scheduler_knob_takes_its_own_default_prefix_caching(sets, caching):
    """A plan candidate is the base's fields with its knobs on top. The base's v1 default caching reached a
    `scheduler: v0` candidate as a given `enable_prefix_caching: true`, so it ran v0 with caching on where the same
    base run with `--set engine.scheduler=v0` (and vLLM's V0 engine, `EngineArgs.enable_prefix_caching` None) runs
    it off; a v0 base's default (off) reached a v1 candidate the same way. A value the base gives is kept."""
    from kvsim.planning.spec import candidates, make_plan_spec
    from kvsim.workload.scenario import load_scenario

    base = load_scenario(None, sets)
    spec = make_plan_spec({"slo": {"ttft_s.p90": 2.0}, "gpus": ["h100-80gb"], "engine": {"scheduler": ["v1", "v0"]}})
    built = {dict(c.knobs)["scheduler"]: c.scenario(base, 1, spec.router).engine for c in candidates(spec)}
    assert {name: engine.enable_prefix_caching for name, engine in built.items()} == caching
    for name, engine in built.items():  # as the base file run with that scheduler
        assert engine.enable_prefix_caching == load_scenario(None, [*sets, f"engine.scheduler={name}"]).engine \
            .enable_prefix_caching


V1_GROUPS = [{"count": 1, "engine": {"scheduler": "v1"}}, {"count": 1, "engine": {"allocator": "slab-max", "scheduler": "v1"}}]
SLAB_GROUP_SAID = ("replicas[1]: engine.enable_prefix_caching=true is unread: allocator slab-max reserves a slab per "
                   "request and caches no prefix")


@pytest.mark.parametrize(("engine", "said"), [
    ({"scheduler": "v0"}, []),  # nobody set caching
    ({"scheduler": "v0", "enable_prefix_caching": True}, [SLAB_GROUP_SAID]),
])
def test_a_slab_group_naming_another_scheduler_says_prefix_caching_unread_only_where_given(tmp_path, engine, said):
    """A group naming another scheduler than the scenario's is given the caching it would otherwise lose
    (`settled_groups`): the scenario's value, else its scheduler's default, written into the group. A v1 slab
    group under a v0 scenario that never set caching was written v1's default (on) and said it unread. Each
    group still caches as its scheduler's default says (v1: on), and the scenario.yaml run again is the same."""
    from kvsim.fleet.driver import replica_scenarios
    from kvsim.fleet.run import unread_by_setting
    from kvsim.workload.scenario import make_scenario, resolve_scenario

    scenario = resolve_scenario({"engine": engine, "workload": resolve_scenario(None).workload.model_dump(mode="json"),
                                 "replicas": V1_GROUPS})
    assert list(unread_by_setting(scenario).values()) == said
    assert [r.engine.enable_prefix_caching for r in replica_scenarios(scenario)] == [True, True]
    again = make_scenario(scenario.dump_into(tmp_path), tmp_path)
    assert list(unread_by_setting(again).values()) == said
    assert [r.engine for r in replica_scenarios(again)] == [r.engine for r in replica_scenarios(scenario)]


@pytest.mark.parametrize("scheduler", ["v1", "v0", "static"])
def test_enforce_eager_is_said_unread_exactly_where_the_padding_ignores_it(scheduler):
    """`enforce_eager: true` changes a run only through the CUDA-graph padding of its steps
    (`kvsim.latency.cudagraph.engine_padding`, priced for v1 alone): on the v0 and static schedulers it was accepted
    and dropped without a word. Said unread exactly where the padding is the same with and without it."""
    from kvsim.latency.cudagraph import engine_padding

    eager, graphs = make_engine(scheduler=scheduler, enforce_eager=True), make_engine(scheduler=scheduler)
    unchanged = engine_padding(eager, 256, 8192) == engine_padding(graphs, 256, 8192)
    assert ("enforce_eager" in eager.unread_settings()) == unchanged
    assert unchanged == (scheduler != "v1")


def test_enforce_eager_on_v0_warns_and_runs_as_without_it(tmp_path):
    """The warning is true: a v0 run with `enforce_eager: true` is the same run as without it."""
    v0 = ["--set", "engine.scheduler=v0"]
    eager = CliRunner().invoke(app, ["run", *SMALL, *v0, "--set", "engine.enforce_eager=true",
                                     "-o", str(tmp_path / "eager")], prog_name="kvsim")
    assert eager.exit_code == 0, eager.output
    assert eager.stderr.splitlines() == ["kvsim: warning: engine.enforce_eager=true is unread: kvsim pads steps to "
                                         "CUDA-graph sizes for scheduler v1 only (got v0)"]
    plain = CliRunner().invoke(app, ["run", *SMALL, *v0, "-o", str(tmp_path / "plain")], prog_name="kvsim")
    assert plain.exit_code == 0 and plain.stderr == ""
    assert json.loads(eager.stdout) == json.loads(plain.stdout)
