"""What a newcomer meets first: the version, help that shows its defaults, tables that fit 80 columns."""

import re
import tomllib
from pathlib import Path

from typer.testing import CliRunner

from kvsim.cli import app

REPO = Path(__file__).resolve().parents[1]
COMMANDS_PAGE = REPO / "docs" / "commands.md"  # the commands' flags, engine defaults and warnings (the README links it)
PLAN_PAGE = REPO / "docs" / "fleets-and-plan.md"
runner = CliRunner()


def test_version_is_the_packages():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["dynamic"] == ["version"]  # read from kvsim/model/version.py, one source
    version = (REPO / "kvsim" / "model" / "version.py").read_text().split('__version__ = "')[1].split('"')[0]
    assert result.output == f"kvsim {version}\n"


def test_help_keeps_text_in_square_brackets():
    """Rich markup would read "[all cores]" as a style tag and drop it."""
    result = runner.invoke(app, ["report", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "[all cores]" in result.output and "[a KV-bound built-in one]" in result.output
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert "[runs/NAME]" in result.output


def test_capacity_table_fits_80_columns_without_cutting_and_names_max_model_len():
    result = runner.invoke(app, ["capacity", "--max-model-len", "8192", "--context-lengths", "4096,8192,16384"],
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output  # folded, not truncated
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert "exceeds" in result.output and "max_model_len" in result.output
    # too wide for one table at 80 columns: one field/value table per row; the 16,384-token one says why
    # it holds nothing
    record = result.output.split("│ context_len")[3]
    assert record.split("│")[1].strip() == "16,384" and "paged_max_seqs     │ exceeds max_model_len" in record


def test_capacity_markdown_says_exceeds_and_csv_keeps_zero():
    args = ["capacity", "--max-model-len", "8192", "--context-lengths", "8192,16384"]
    markdown = runner.invoke(app, [*args, "--format", "markdown"]).output
    row = markdown.split("| 16,384 |")[1].splitlines()[0]
    # every concurrency-derived column (bf16, fp8, the capped count, the throughput) says why, none prints 0
    assert row.count("exceeds max_model_len") == 5 and "| 0 |" not in row
    csv = runner.invoke(app, [*args, "--format", "csv"]).output.splitlines()
    header, last = csv[0].split(","), csv[-1].split(",")
    assert last[header.index("context_len")] == "16384" and last[header.index("paged_max_seqs")] == "0"


FLAG = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")


def test_every_flag_the_readme_command_table_names_is_in_that_commands_help():
    """The README's command table is where a newcomer learns the options, and docs/commands.md has each row in
    full: each `-x`/`--flag` a row of either names (its usage and its description) must be one `kvsim CMD --help`
    lists, spelt the same; and the engine flags docs/commands.md says capacity and report take as in vLLM must be
    theirs."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    reference = COMMANDS_PAGE.read_text(encoding="utf-8")
    rows = []
    for page in (readme, reference):
        table = [line for line in page.splitlines() if line.startswith("| `kvsim ")]
        assert len(table) == 7  # run, calibrate, import-profile, report, validate, plan, capacity
        rows += table
    engine_flags = reference.split("Flags use vLLM's engine-argument names", 1)[1].split("; `kvsim run` takes", 1)[0]
    for row in rows:
        command = row.removeprefix("| `kvsim ").split()[0].rstrip("`")
        named = set(FLAG.findall(row)) - {"-e"}  # `pip install -e '.[dist]'`
        if command in ("capacity", "report"):  # "[--model --gpu engine flags]"
            named |= set(re.findall(r"`(--[a-z-]+)`", engine_flags))
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "300"})
        assert result.exit_code == 0, command
        assert named - set(FLAG.findall(result.output)) == set(), command


def test_plan_help_lists_the_slo_metrics_and_stats_it_takes():
    """`--slo METRIC.STAT=SECONDS` said neither which metrics nor which statistics: a newcomer learned them
    from the error a guess (`ttft_s.p95`) got."""
    from kvsim.planning.window import SLO_METRICS, SLO_STATS

    result = runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "300"})
    text = " ".join(result.output.split())
    assert f"METRIC: {', '.join(SLO_METRICS)}; STAT: {', '.join(SLO_STATS)}" in text
    readme = " ".join((REPO / "README.md").read_text().split())
    assert (f"METRIC `{'`, `'.join(SLO_METRICS[:-1])}` or `{SLO_METRICS[-1]}`, "
            f"STAT `{'`, `'.join(SLO_STATS[:-1])}` or `{SLO_STATS[-1]}`") in readme


def test_a_section_given_whole_replaces_the_scenarios_section_as_the_readme_says():
    """docs/commands.md's example: on the default scenario (max_model_len 8192), `--set engine.max_num_seqs=8
    --set 'engine={block_size: 32}'` leaves block size 32 and nothing else of the engine section set before."""
    from kvsim.workload.scenario import load_scenario

    assert load_scenario(None).engine.max_model_len == 8192
    engine = load_scenario(None, ["engine.max_num_seqs=8", "engine={block_size: 32}"]).engine
    assert (engine.block_size, engine.max_model_len, engine.max_num_seqs) == (32, None, None)
    engine = load_scenario(None, ["engine.max_num_seqs=8", "engine.block_size=32"]).engine
    assert (engine.block_size, engine.max_model_len, engine.max_num_seqs) == (32, 8192, 8)


def test_plan_spec_fields_and_defaults_in_the_readme_and_help_are_planspecs():
    """`--spec FILE` took fields the README never listed (`probe_requests`, `verify_factor`, ...), and `--help` gave
    no default for `--max-replicas`, `--router`, `--search` or `--workers` (the fields: docs/fleets-and-plan.md)."""
    from kvsim.planning.spec import PlanSpec

    page = " ".join(PLAN_PAGE.read_text(encoding="utf-8").split())
    sentence = page.split("`--spec FILE` is a YAML mapping of the plan's fields", 1)[1].split("; a replica search", 1)[0]
    named = dict(re.findall(r"`([a-z_]+)`(?: \(`?([\w.]+)`?\))?", sentence.split("top):", 1)[1]))
    assert set(named) == set(PlanSpec.model_fields)
    for field, default in named.items():
        if default:  # "`engine` (the knob grid)" gives none
            assert str(PlanSpec.model_fields[field].default) == default, field
    text = " ".join(runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "300"}).output.split())
    fields = PlanSpec.model_fields
    assert f"[{fields['max_replicas'].default}]" in text.split("--max-replicas", 1)[1].split("--router")[0]
    assert f"[{fields['router'].default}]" in text.split("--router", 1)[1].split("--search")[0]
    assert f"[{fields['search'].default}]" in text.split("--search", 1)[1].split("--set")[0]


def test_the_readmes_engine_defaults_are_the_engines():
    """docs/commands.md's sentence on unset engine fields, against `EngineConfig`'s resolution on the GPUs it names
    (the numbers are vLLM's `EngineArgs.get_batch_defaults`, kvsim/model/batch_defaults.py)."""
    from kvsim.model.config import load_gpu
    from kvsim.model.engine_config import EngineConfig
    from kvsim.workload.scenario import load_scenario

    reference = " ".join(COMMANDS_PAGE.read_text(encoding="utf-8").split())
    assert ("`block_size` 16, `gpu_memory_utilization` 0.9, `kv_cache_dtype: auto`, `max_model_len` the model's; "
            in reference)
    engine = EngineConfig()
    assert (engine.block_size, engine.gpu_memory_utilization, engine.kv_cache_dtype, engine.max_model_len) == (
        16, 0.9, "auto", None)
    said = {  # (gpu, usage_context, scheduler): (max_num_seqs, max_num_batched_tokens at max_model_len 1024)
        ("h100-80gb", "openai_api_server", "v1"): (1024, 8192), ("h200", "llm_class", "v1"): (1024, 16384),
        ("b200", "openai_api_server", "v1"): (1024, 8192), ("a100-80gb", "openai_api_server", "v1"): (256, 2048),
        ("l4", "llm_class", "v1"): (256, 8192), ("h100-80gb", "openai_api_server", "v0"): (256, 2048),
        ("h100-80gb", "openai_api_server", "static"): (1024, 2048),
    }
    for (gpu, context, scheduler), expected in said.items():
        engine = load_scenario(None, [f"engine.usage_context={context}", f"engine.scheduler={scheduler}"]).engine
        spec = load_gpu(gpu)
        assert (engine.resolved_max_num_seqs(spec), engine.resolved_max_num_batched_tokens(1024, spec)) == expected
    assert engine.resolved_max_num_batched_tokens(8192, load_gpu("l4")) == 8192  # max(max_model_len, 2048)


WARNED = [  # (overrides on the default scenario, the setting said unread, how docs/commands.md's paragraph names it)
    (["engine.enable_expert_parallel=true"], "enable_expert_parallel", "`enable_expert_parallel`"),
    (['engine.speculative_config={method: eagle, num_speculative_tokens: 2, acceptance_rates: 0.8, model: x/y}'],
     "speculative_config", "`speculative_config.model`"),
    (["engine.slab_placement=first-fit"], "slab_placement", "`engine.slab_placement`"),
    (["engine.allocator=slab-max", "engine.enable_prefix_caching=true"], "enable_prefix_caching",
     "`engine.enable_prefix_caching: true`"),
    (["engine.prefix_cache=radix", "engine.enable_prefix_caching=false"], "prefix_cache", "`engine.prefix_cache: radix`"),
    (["engine.kv_cache_memory_bytes=20GiB", "engine.gpu_memory_utilization=0.8"], "gpu_memory_utilization",
     "`engine.gpu_memory_utilization`"),
    (["engine.swap_space=8"], "swap_space", "`engine.swap_space`"),
    (["engine.scheduler=v0", "engine.enforce_eager=true"], "enforce_eager", "`engine.enforce_eager: true`"),
    (["engine.disable_hybrid_kv_cache_manager=true"], "disable_hybrid_kv_cache_manager",
     "`disable_hybrid_kv_cache_manager: true`"),
    (["gpu_link={kind: nvlink, bandwidth_bytes_per_s: 4.5e11, latency_s: 1e-6}"], "gpu_link", "`gpu_link`"),
    (["latency.overlap_swap=true"], "latency.overlap_swap", "`latency.overlap_swap: true`"),
    (["replicas=2", "router.policy=affinity", "engine.enable_prefix_caching=false"], "router.policy",
     "`router.policy: affinity`"),
]


def test_the_readme_names_every_setting_kvsim_warns_is_unread():
    """docs/commands.md's paragraph of warnings ('An input vLLM itself accepts but that changes nothing is said
    instead' to 'Every command that simulates') is where a user looks up a `kvsim: warning:` line; four
    settings kvsim warns of were missing from it (docs34: gpu_memory_utilization beside
    kv_cache_memory_bytes, an EAGLE head's model, gpu_link at TP 1, a router over one replica). Each case
    makes `unread_by_setting` (or `lone_routers`) say its setting, and docs/commands.md names it; the settings the
    source can say are counted, so a new warning fails here until it has a case and a place in docs/commands.md."""
    from kvsim.fleet.run import lone_routers, unread_by_setting
    from kvsim.workload.scenario import load_scenario

    reference = " ".join(COMMANDS_PAGE.read_text(encoding="utf-8").split())
    paragraph = reference.split("An input vLLM itself accepts but that changes nothing is said instead")[1]
    paragraph = paragraph.split("Every command that simulates a scenario warns")[0]
    for overrides, setting, named in WARNED:
        assert setting in unread_by_setting(load_scenario(None, overrides)), overrides
        assert named in paragraph, named
    lone = lone_routers(load_scenario(None, ["replicas=1", "router.policy=least_kv"]))
    assert lone and "routes over one replica" in lone[0]
    assert "router set over one replica" in paragraph and "`kv_producer`" in paragraph
    sources = [REPO / "kvsim" / "model" / "engine_config.py", REPO / "kvsim" / "fleet" / "run.py"]
    said = {key for path in sources for key in re.findall(r'(?:unread|common)\["([^"]+)"\] =', path.read_text())}
    assert said == {setting for _overrides, setting, _named in WARNED}
