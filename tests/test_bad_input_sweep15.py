"""Bad input found by the fifteenth sweep: inputs kvsim took without a word although it ignored them or they
contradicted another. Each is refused (exit 2, one line naming the field and the value, nothing written) or, where
vLLM itself accepts it, warned of in one line while the run goes on unchanged."""

import json

import pytest
from conftest import one_line_exit_2
from test_bad_input_sweep14 import SKEW_RUN_ARGV
from typer.testing import CliRunner

from kvsim.cli import app

RUN = ["run", "--set", "workload.num_requests=3", "--set", "steps=none"]
MARKUP = "x[/]y [bold]z[/bold] :fire:"  # as markup: a MarkupError ([/] closes nothing), z in bold, an emoji


def _files(folder):
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def _plain(renderable, width=200):
    from rich.console import Console

    console = Console(width=width, record=True, color_system=None)  # markup on: as capacity's, plan's consoles
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("width", [200, 40])  # one table, or one small table per row
def test_a_table_prints_names_and_its_title_as_written(width):
    """`plan`'s title (the scenario's name), `validate`'s (the run's, model's and GPU's names) and the rows of
    both and of `capacity` were rich markup: `[/]` in a name stopped the command with a MarkupError after its
    simulations, `[bold]` vanished."""
    from kvsim.results.render import rows_to_rich

    text = _plain(rows_to_rich([{"candidate": MARKUP, "replicas": 2}], title=f"kvsim plan: {MARKUP}", width=width),
                  width)
    assert all(text.count(word) == 2 for word in MARKUP.split()), text  # in the title and the row, maybe wrapped


def test_capacity_shows_a_gpu_name_as_written_and_keeps_its_bold_headline(tmp_path, monkeypatch):
    """capacity's headline is markup on purpose (the model and GPU in bold): a GPU file's `name` is escaped in it."""
    from pathlib import Path

    import yaml

    import kvsim

    monkeypatch.chdir(tmp_path)
    gpu = yaml.safe_load((Path(kvsim.__file__).parent / "model/presets/gpus.yaml").read_text())["h100-80gb"]
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({**gpu, "name": MARKUP}))
    result = CliRunner().invoke(app, ["capacity", "--gpu", "g.yaml"], prog_name="kvsim")
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.startswith(f"llama-3.1-8b on {MARKUP}  kv_cache_dtype=auto"), result.stdout


TRACE = "workload.trace={format: lengths, path: 'builtin:bwb_lengths'}"


@pytest.mark.parametrize(("flags", "expected"), [
    ([],  # the built-in default draws both lengths
     "workload: prompt_len={'dist': 'lognormal', 'mean': 1024.0, 'p99': 6000.0}: the trace (format=lengths) gives "
     "each request's lengths, so prompt_len and output_len would be ignored; give prompt_len and output_len, or a "
     "trace, not both (set prompt_len and output_len to null to keep the trace's)"),
    (["--set", "workload.prompt_len=null"],
     "workload: output_len={'dist': 'lognormal', 'mean': 256.0, 'p99': 1024.0}: the trace (format=lengths) gives "
     "each request's lengths, so output_len would be ignored; give prompt_len and output_len, or a trace, not both "
     "(set output_len to null to keep the trace's)"),
])
def test_a_length_distribution_beside_a_trace_is_refused(tmp_path, monkeypatch, flags, expected):
    """Every trace format gives each request's prompt and output lengths: a `prompt_len` or `output_len` beside
    one was never read (the run replayed the trace's lengths without a word)."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2([*RUN, "--set", TRACE, *flags, "-o", "out"]) == expected
    assert _files(tmp_path) == []


def test_a_trace_without_length_distributions_runs(tmp_path):
    result = CliRunner().invoke(app, [*RUN, "--set", TRACE, "--set", "workload.prompt_len=null",
                                      "--set", "workload.output_len=null", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, (result.output, result.exception)

AZURE_TWO_ROWS = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,10,10\n2023-11-16 18:17:04.1,10,5\n"


@pytest.mark.parametrize(("num_requests", "warned"), [(5, True), (2, False), (1, False)])
def test_a_trace_with_fewer_rows_than_asked_runs_them_with_one_warning(tmp_path, monkeypatch, caplog, num_requests,
                                                                        warned):
    """`workload.num_requests: 5` over a trace of 2 rows ran 2 requests without a word (the summary had 2). vLLM's
    benchmark takes a `--num-prompts` larger than its dataset too, so the run goes on, saying so once."""
    import json
    import logging

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(AZURE_TWO_ROWS)
    (tmp_path / "s.yaml").write_text(f"workload:\n  num_requests: {num_requests}\n  arrival: {{process: trace}}\n"
                                     "  trace: {format: azure, path: t.csv}\nsteps: none\n")
    with caplog.at_level(logging.WARNING):
        result = CliRunner().invoke(app, ["run", "s.yaml", "-o", "out", "--format", "json"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.stdout)["num_requests"] == min(num_requests, 2)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == (
        ["workload.num_requests=5: t.csv holds 2 requests from start_s=0; the run has those 2"] if warned else [])

FLEET = ("workload: {num_requests: 3, prompt_len: {dist: fixed, value: 8}, output_len: {dist: fixed, value: 4}}\n"
         "steps: none\nreplicas:\n  - {count: 1}\n  - {count: 1, engine: {max_num_seqs: 64}, gpu: a100-80gb}\n")


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "f.yaml", "--max-num-seqs", "8"],
     "--max-num-seqs=8: sets engine.max_num_seqs, which replicas.1.engine.max_num_seqs=64 sets for that group's "
     "replicas; give each field once (per group: --set replicas.1.engine.max_num_seqs=...)"),
    (["report", "f.yaml", "--max-num-seqs", "8"],
     "--max-num-seqs=8: sets engine.max_num_seqs, which replicas.1.engine.max_num_seqs=64 sets for that group's "
     "replicas; give each field once (per group: --set replicas.1.engine.max_num_seqs=...)"),
    (["report", "f.yaml", "--gpu", "h100-80gb"],
     "--gpu='h100-80gb': sets gpu, which replicas.1.gpu='a100-80gb' sets for that group's replicas; give each field "
     "once (per group: --set replicas.1.gpu=...)"),
])
def test_a_flag_a_replica_group_overrides_is_refused(tmp_path, monkeypatch, argv, expected):
    """A replica group's own engine settings (and model, GPU) replace the scenario's: `--max-num-seqs 8` beside
    a group giving `max_num_seqs: 64` left that group at 64 without a word, as a `--set` of the flag's field is
    refused (`--max-num-seqs 5 --set engine.max_num_seqs=10`)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.yaml").write_text(FLEET)
    assert one_line_exit_2([*argv, "-o", "out"]) == expected
    assert _files(tmp_path) == ["f.yaml"]


def test_a_flag_no_replica_group_gives_reaches_every_group(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.yaml").write_text(FLEET)
    result = CliRunner().invoke(app, ["run", "f.yaml", "--scheduling-policy", "priority", "-o", "out"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "scheduling_policy: priority" in (tmp_path / "out" / "scenario.yaml").read_text()


@pytest.mark.parametrize(("fields", "unread"), [
    ({"swap_space": 12}, "engine.swap_space=12 is unread: scheduler v1 never swaps"),
    ({"swap_space": 0, "scheduler": "static", "allocator": "slab-max"},
     "engine.swap_space=0 is unread: scheduler static never swaps"),
    ({"swap_space": 12, "scheduler": "v0", "preemption_mode": "recompute"},
     "engine.swap_space=12 is unread: preemption_mode=recompute never swaps"),
    ({"swap_space": 12, "scheduler": "v0", "preemption_mode": "swap"}, None),  # swap preemption moves KV there
    ({"swap_space": 12, "scheduler": "v0"}, None),  # v0 swaps a group of several sequences by default
    ({"scheduler": "v0", "preemption_mode": "recompute"}, None),  # the default, which scenario.yaml spells out
])
def test_a_swap_space_no_preemption_swaps_into_is_said_unread(fields, unread):
    """vLLM v1 preempts by recompute only and takes `--swap-space` without reading it (kvsim's v1 and static
    schedulers never swap either, nor v0 under preemption_mode=recompute): the setting ran without a word."""
    from kvsim.model.engine_config import make_engine

    assert make_engine(**fields).unread_settings().get("swap_space") == unread


def test_a_run_with_an_unread_swap_space_warns_once_and_runs_as_without_it(tmp_path):
    runs = {}
    for name, extra in (("swap", ["--set", "engine.swap_space=12"]), ("plain", [])):
        result = CliRunner().invoke(app, [*RUN, "--set", "workload.num_requests=20", *extra, "--format", "json",
                                          "-o", str(tmp_path / name)], prog_name="kvsim")
        assert result.exit_code == 0, (result.output, result.exception)
        runs[name] = result
    assert runs["swap"].stderr.splitlines() == [
        "kvsim: warning: engine.swap_space=12 is unread: scheduler v1 never swaps"]
    assert runs["plain"].stderr == ""
    assert (tmp_path / "swap" / "requests.csv").read_text() == (tmp_path / "plain" / "requests.csv").read_text()


@pytest.mark.parametrize(("meta_edit", "field"), [
    (("alpha_default: 0.05", "alpha_default: -1000"), "meta.yaml skew_fit.per_tp.1.alpha_default"),
    (("  per_tp:\n    1:\n      alpha_default: 0.05\n", "  alpha_default: -1000\n  per_tp:\n    1:\n"),
     "meta.yaml skew_fit.alpha_default"),  # no per-TP default: the fit's pooled one
])
def test_a_bundles_negative_alpha_default_is_named_by_its_meta_yaml_field(tmp_path, monkeypatch, meta_edit, field):
    """The error named `attention_skew_alpha_default`, the key of kvsim's own profile CSV, for a value the user
    wrote in a bundle's meta.yaml (where no such key exists)."""
    from test_skew import skew_bundle

    monkeypatch.chdir(tmp_path)
    meta = skew_bundle(tmp_path / "bf16") / "meta.yaml"
    assert meta_edit[0] in meta.read_text()
    meta.write_text(meta.read_text().replace(*meta_edit))
    message = one_line_exit_2(SKEW_RUN_ARGV)
    assert message.startswith(f"profile meta-llama/Llama-3.1-8B/bf16/tp1: {field}: alpha=-1000 makes a step's "
                              "attention -"), message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["--set", "file"])
def test_a_yaml_11_binary_integer_is_refused_as_its_octal_is(tmp_path, monkeypatch, where):
    """PyYAML reads `0b10000` as 16 (YAML 1.1), where YAML 1.2 reads the text `0b10000`: kvsim refuses the YAML 1.1
    forms YAML 1.2 reads otherwise (`016`, `1:30`), and took this one in silence."""
    monkeypatch.chdir(tmp_path)
    if where == "file":
        (tmp_path / "s.yaml").write_text("engine: {block_size: 0b10000}\nworkload: {num_requests: 3, prompt_len: "
                                         "{dist: fixed, value: 8}, output_len: {dist: fixed, value: 4}}\n")
        argv, start = ["run", "s.yaml"], "scenario s.yaml: not valid YAML: "
    else:
        argv, start = [*RUN, "--set", "engine.block_size=0b10000"], "--set 'engine.block_size=0b10000': the value is " \
            "not valid YAML ("
    assert one_line_exit_2([*argv, "-o", "out"]).startswith(
        f"{start}0b10000 reads as 16 (a YAML 1.1 binary integer): write the number in decimal, without a leading "
        "zero, 0b or a colon, or quote it")
    assert not (tmp_path / "out").exists()


def test_a_hex_integer_and_a_negative_zero_read_as_every_yaml_reads_them(tmp_path):
    """`0x10` is 16 in YAML 1.1 and 1.2 alike, so it is kept; `-0.0` passes a non-negative field and is 0, as the
    integer `-0` is (it was written back as `-0.0` and shown as `-0`)."""
    import yaml

    result = CliRunner().invoke(app, [*RUN, "--set", "engine.block_size=0x10", "--set", "engine.swap_space=-0.0",
                                      "--set", "latency.overhead_s=-0.0", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, (result.output, result.exception)
    written = yaml.safe_load((tmp_path / "out" / "scenario.yaml").read_text())
    assert written["engine"]["block_size"] == 16
    for value in (written["engine"]["swap_space"], written["latency"]["overhead_s"]):
        assert value == 0 and str(value) == "0.0"
    assert result.stderr.splitlines() == ["kvsim: warning: engine.swap_space=0 is unread: scheduler v1 never swaps"]


def test_a_v0_swap_space_is_unread_when_every_request_is_one_sequence(tmp_path):
    """vLLM v0 with preemption_mode unset preempts a group of one running sequence by recompute and swaps only
    a group of several (`Scheduler._preempt`: RECOMPUTE when `get_max_num_running_seqs() == 1`): with n = 1 and no
    beam search, swap_space is never read. The run warns so and runs as without it, preemptions included; with
    n = 2 the same swap space is read (no warning)."""
    tight = ["--set", "engine={scheduler: v0, num_gpu_blocks_override: 200, max_model_len: 2048}",
             "--set", "workload.num_requests=20", "--format", "json"]
    runs = {}
    for name, extra in (("swap", ["--set", "engine.swap_space=12"]), ("plain", []),
                        ("n2", ["--set", "engine.swap_space=12", "--set", "workload.n=2"])):
        result = CliRunner().invoke(app, ["run", *tight, *extra, "-o", str(tmp_path / name)], prog_name="kvsim")
        assert result.exit_code == 0, (result.output, result.exception)
        runs[name] = result
    assert runs["swap"].stderr.splitlines() == [
        "kvsim: warning: engine.swap_space=12 is unread: v0 preempts a single sequence by recompute (preemption_mode "
        "unset), and workload.n=1 sends no other"]
    assert runs["plain"].stderr == "" and runs["n2"].stderr == ""
    summary = json.loads((tmp_path / "swap" / "summary.json").read_text())
    assert summary["num_preemptions"] > 0
    assert (tmp_path / "swap" / "requests.csv").read_text() == (tmp_path / "plain" / "requests.csv").read_text()
