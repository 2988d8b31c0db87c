"""Bad input found by the sixteenth sweep. Each is refused (exit 2, one line naming the field and the value,
nothing written) or, where vLLM itself accepts it, warned of in one line while the run goes on unchanged.

Found: a `--set` (or `kvsim.simulate`'s `engine__...`) of a field a replica group gives for its own replicas, and a
group's `null` beside a flag, reached none of that group's replicas; `-0.0` inside a list or a group's engine was
written back as `-0.0`; `kvsim plan` and `kvsim report` said a short trace once per run; a disaggregated fleet of
block sizes vLLM's NixlConnector cannot pair ran; a misspelt preset listed every preset without the nearest; a blank
model name, data path or file argument was read as the working folder (or said 'file not found'); a blank name ran;
a number flag typer could not read was refused without its value, one of 1e400 as inf; import-profile read `-o ''` as the working
folder, after converting the whole profile; a GPU name too long for a file named no field."""

import pytest
from conftest import one_line_exit_2
from typer.testing import CliRunner

from kvsim.cli import app

RUN = ["run", "--set", "workload.num_requests=3", "--set", "steps=none"]
FLEET = ("workload: {num_requests: 3, prompt_len: {dist: fixed, value: 8}, output_len: {dist: fixed, value: 4}}\n"
         "steps: none\nreplicas:\n  - {count: 1}\n  - {count: 1, engine: {max_num_seqs: GROUP}, gpu: a100-80gb}\n")


def _files(folder):
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def _per_group(field):
    return f"give each field once (per group: --set replicas.1.{field}=...)"


@pytest.mark.parametrize(("group", "argv", "expected"), [
    ("64", ["--set", "engine.max_num_seqs=8"],
     "--set 'engine.max_num_seqs=8': sets engine.max_num_seqs, which replicas.1.engine.max_num_seqs=64 sets for that "
     f"group's replicas; {_per_group('engine.max_num_seqs')}"),
    ("64", ["--set", "engine={max_num_seqs: 8}"],  # a section giving the field
     "--set 'engine={max_num_seqs: 8}': sets engine.max_num_seqs, which replicas.1.engine.max_num_seqs=64 sets for "
     f"that group's replicas; {_per_group('engine.max_num_seqs')}"),
    ("64", ["--set", "gpu=h100-80gb"],
     f"--set 'gpu=h100-80gb': sets gpu, which replicas.1.gpu='a100-80gb' sets for that group's replicas; "
     f"{_per_group('gpu')}"),
    ("null", ["--max-num-seqs", "8"],  # null: the engine's default, which replaces the scenario's value too
     "--max-num-seqs=8: sets engine.max_num_seqs, which replicas.1.engine.max_num_seqs=None sets for that group's "
     f"replicas; {_per_group('engine.max_num_seqs')}"),
    ("null", ["--set", "engine.max_num_seqs=8"],
     "--set 'engine.max_num_seqs=8': sets engine.max_num_seqs, which replicas.1.engine.max_num_seqs=None sets for "
     f"that group's replicas; {_per_group('engine.max_num_seqs')}"),
])
def test_a_setting_a_replica_group_replaces_is_refused(tmp_path, monkeypatch, group, argv, expected):
    """A replica group's own engine settings (and model, GPU) replace the scenario's for its replicas
    (`kvsim.fleet.driver`): `--set engine.max_num_seqs=8` beside a group giving 64 left that group at 64 without a
    word, as sweep 15 refused for `--max-num-seqs` (a group's `max_num_seqs: null`, its engine's default, let the
    flag through too)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.yaml").write_text(FLEET.replace("GROUP", group))
    assert one_line_exit_2(["run", "f.yaml", *argv, "-o", "out"]) == expected
    assert _files(tmp_path) == ["f.yaml"]


def test_a_setting_a_replica_group_replaces_is_refused_in_python_too(tmp_path):
    import kvsim
    from kvsim.model.errors import KvsimError

    (tmp_path / "f.yaml").write_text(FLEET.replace("GROUP", "64"))
    with pytest.raises(KvsimError, match=r"^override 'engine.max_num_seqs': sets engine.max_num_seqs, which "
                                         r"replicas.1.engine.max_num_seqs=64 sets"):
        kvsim.simulate(str(tmp_path / "f.yaml"), engine__max_num_seqs=8)


@pytest.mark.parametrize("argv", [
    ["--set", "engine.block_size=32"],  # no group gives it: every replica takes it
    ["--set", "replicas.1.engine.max_num_seqs=8"],  # one group's own
    ["--set", "gpu=h100-80gb", "--set", "replicas.1.gpu=null"],  # null: the scenario's GPU
])
def test_a_setting_every_group_takes_runs(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.yaml").write_text(FLEET.replace("GROUP", "64"))
    result = CliRunner().invoke(app, ["run", "f.yaml", *argv, "-o", "out"])
    assert result.exit_code == 0, (result.output, result.exception)


def test_a_negative_zero_in_a_list_or_a_group_is_read_as_zero(tmp_path, monkeypatch):
    """Sweep 14 read a scalar `-0.0` as 0.0 (it passes `ge=0`, and `-0` is the integer 0), but one inside a list
    (`acceptance_rates`) or a replica group's engine mapping was kept, and written back to `scenario.yaml` as
    `-0.0`."""
    import yaml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(
        "workload: {num_requests: 3, prompt_len: {dist: fixed, value: 8}, output_len: {dist: fixed, value: 4}}\n"
        "steps: none\nengine:\n  speculative_config: {method: ngram, num_speculative_tokens: 2, "
        "acceptance_rates: [0.8, -0.0]}\nreplicas:\n  - {count: 1, engine: {watermark: -0.0}}\n")
    result = CliRunner().invoke(app, ["run", "s.yaml", "-o", "out"])
    assert result.exit_code == 0, (result.output, result.exception)
    text = (tmp_path / "out" / "scenario.yaml").read_text()
    assert "-0.0" not in text, text
    written = yaml.safe_load(text)
    assert written["engine"]["speculative_config"]["acceptance_rates"] == [0.8, 0.0]
    assert str(written["replicas"][0]["engine"]["watermark"]) == "0.0"
    assert result.stderr == ""

AZURE_TWO_ROWS = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,10,10\n2023-11-16 18:17:04.1,10,5\n"
SHORT_TRACE_LINE = "workload.num_requests=5: t.csv holds 2 requests from start_s=0; the run has those 2"


def _short_trace_scenario(folder):
    (folder / "t.csv").write_text(AZURE_TWO_ROWS)
    (folder / "s.yaml").write_text("workload:\n  num_requests: 5\n  arrival: {process: trace}\n"
                                   "  trace: {format: azure, path: t.csv}\nsteps: none\n")


def _warnings(caplog):
    import logging

    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_plan_says_a_short_trace_once(tmp_path, monkeypatch, caplog):
    """Sweep 15's warning for a trace shorter than `workload.num_requests` came once per probed point (and once per
    read of the traffic in the parent: 5 lines for a plan of 2 replicas at most), from whichever process ran it."""
    import logging

    monkeypatch.chdir(tmp_path)
    _short_trace_scenario(tmp_path)
    with caplog.at_level(logging.WARNING):
        result = CliRunner().invoke(app, ["plan", "s.yaml", "--slo", "ttft_s.p90=2", "--gpu", "h100-80gb",
                                          "--workers", "1", "--max-replicas", "2", "-o", "plan", "--format", "csv"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert _warnings(caplog) == [SHORT_TRACE_LINE]


def test_many_runs_say_a_short_trace_once_and_one_run_says_it(tmp_path, monkeypatch, caplog):
    """`kvsim report`'s runs go through `run_many` (`report --quick` said it 160 times): its runs are quiet, and it
    says it once when they are done unless the command said it already (sweep 18: a `run_many` on its own said
    nothing); a run on its own says it each time."""
    import logging

    import kvsim
    from kvsim.planning.sweep import run_many
    from kvsim.workload.generate import short_trace_said_once
    from kvsim.workload.scenario import load_scenario

    monkeypatch.chdir(tmp_path)
    _short_trace_scenario(tmp_path)
    scenarios = [load_scenario("s.yaml", [f"seed={seed}"]) for seed in range(3)]
    with caplog.at_level(logging.WARNING):
        with short_trace_said_once():
            run_many(scenarios, workers=1)
            assert _warnings(caplog) == [SHORT_TRACE_LINE]
            with short_trace_said_once():  # inside another: the outer one decides
                kvsim.simulate(scenarios[0])
            kvsim.simulate(scenarios[1])
        assert _warnings(caplog) == [SHORT_TRACE_LINE]
        kvsim.simulate(scenarios[0])
    assert _warnings(caplog) == [SHORT_TRACE_LINE] * 2

DISAGG = ("model: llama-3.1-8b\nengine: {max_model_len: 8192}\nsteps: none\n"
          "workload: {num_requests: 3, prompt_len: {dist: fixed, value: 100}, output_len: {dist: fixed, value: 4}}\n"
          "kv_transfer_config: {kv_link: rdma}\nreplicas:\n"
          "  - {count: 1, name: p, kv_role: kv_producer, engine: {block_size: P_SIZE, tensor_parallel_size: P_TP}}\n"
          "  - {count: 1, name: d, kv_role: kv_consumer, engine: {block_size: D_SIZE, tensor_parallel_size: D_TP}}\n")


def _disagg(folder, p_size, d_size, p_tp=1, d_tp=1):
    text = DISAGG
    for key, value in (("P_SIZE", p_size), ("D_SIZE", d_size), ("P_TP", p_tp), ("D_TP", d_tp)):
        text = text.replace(key, str(value))
    (folder / "s.yaml").write_text(text)


@pytest.mark.parametrize(("sizes", "expected"), [
    ((32, 16), "replicas (s/d-0, kv_consumer): engine.block_size=16, but (s/p-0, kv_producer) has "
               "engine.block_size=32: vLLM's NixlConnector reads a prefill instance's blocks into a decode instance's "
               "only when the decode block size is a multiple of the prefill's; give the decode instances a "
               "block_size of 32 or more"),
    ((16, 32, 2, 1), "replicas (s/d-0, kv_consumer): engine.block_size=32, but (s/p-0, kv_producer) has "
                     "engine.block_size=16: vLLM's NixlConnector reads a prefill instance's blocks into a decode "
                     "instance's from several prefill ranks (tensor_parallel_size 2 there, 1 here) only between equal "
                     "block sizes; give both the same block_size"),
])
def test_block_sizes_nixl_cannot_pair_are_refused(tmp_path, monkeypatch, sizes, expected):
    """vLLM's NixlConnector: the decode worker reads the prefill worker's blocks, and its handshake asserts
    `local block_size % remote block_size == 0` (`TransferTopology.block_size_ratio`) and, reading from more prefill
    ranks than it has without MLA, `block_size_ratio == 1`. A prefill pool of 32-token blocks beside a decode pool of
    16 ran as if vLLM paired them."""
    monkeypatch.chdir(tmp_path)
    _disagg(tmp_path, *sizes)
    assert one_line_exit_2(["run", "s.yaml", "-o", "out"]) == expected
    assert _files(tmp_path) == ["s.yaml"]


@pytest.mark.parametrize("sizes", [(16, 16), (16, 32), (8, 256), (16, 32, 1, 2), (16, 16, 2, 1)])
def test_block_sizes_nixl_pairs_run(tmp_path, monkeypatch, sizes):
    monkeypatch.chdir(tmp_path)
    _disagg(tmp_path, *sizes)
    result = CliRunner().invoke(app, ["run", "s.yaml", "-o", "out"])
    assert result.exit_code == 0, (result.output, result.exception)


@pytest.mark.parametrize(("flag", "name", "hint"), [
    ("--gpu", "h100", " (did you mean h100-80gb or h100-pcie?)"),  # the presets it begins
    ("--gpu", "H200", " (did you mean h200?)"),  # case aside
    ("--model", "llama-3.1-8", " (did you mean llama-3.1-8b?)"),  # the nearest
    ("--model", "llama3.1-8b", " (did you mean llama-3.1-8b?)"),
    ("--model", "llama", ""),  # begins six: the list says it
    ("--model", "nope", ""),
])
def test_an_unknown_preset_is_answered_with_the_nearest(tmp_path, monkeypatch, flag, name, hint):
    """A misspelt field is answered with the nearest one (`did you mean max_num_seqs?`); a misspelt model or GPU
    preset listed every preset and left the reader to find it."""
    monkeypatch.chdir(tmp_path)
    message = one_line_exit_2(["capacity", flag, name])
    assert message.startswith(f"{flag.removeprefix('--')}={name!r}: not a preset (")
    assert message.endswith(f") nor a file{hint}"), message


@pytest.mark.parametrize("argv", [["capacity", "--model", ""], ["run", "--set", "model=''", "-o", "out"],
                                  ["capacity", "--model", "  "]])
def test_a_blank_model_is_refused_not_read_from_the_working_folder(tmp_path, monkeypatch, argv):
    """`Path('')` is the working folder: `--model ''` (an unset `$MODEL`) read the config.json there as the model,
    without a word."""
    import shutil
    from pathlib import Path

    import kvsim

    monkeypatch.chdir(tmp_path)
    shutil.copy(Path(kvsim.__file__).parent / "model/presets/models/llama-3.1-8b.json", tmp_path / "config.json")
    blank = argv[-3].partition("=")[2].strip("'") if argv[0] == "run" else argv[-1]
    assert one_line_exit_2(argv) == f"model={blank!r}: is empty: name a preset, a config.json or a model's folder"
    assert _files(tmp_path) == ["config.json"]


BLANK = "is blank; a name labels output rows, tables and one-line errors, so it holds a character other than a space"


@pytest.mark.parametrize(("setting", "field"), [
    ("name=''", "name"),
    ("name='   '", "name"),
    ("workload.priority={classes: [{name: ' ', priority: 0, weight: 1}]}", "workload.priority.classes.0.name"),
])
def test_a_blank_name_is_refused(tmp_path, monkeypatch, setting, field):
    """A scenario named '' or '   ' ran, wrote to `runs/scenario` and titled its tables with nothing (a replica
    group's '' was refused, its '   ' not)."""
    monkeypatch.chdir(tmp_path)
    value = setting.partition("=")[2].strip("'") if field == "name" else " "
    assert one_line_exit_2([*RUN, "--set", setting]) == f"{field}={value!r}: {BLANK}"
    assert _files(tmp_path) == []


def test_a_blank_replica_group_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.yaml").write_text(FLEET.replace("GROUP", "64"))
    assert one_line_exit_2(["run", "f.yaml", "--set", "replicas.0.name='  '", "-o", "out"]) == \
        f"replicas.0.name='  ': {BLANK}"


@pytest.mark.parametrize(("argv", "flag", "value"), [
    (["capacity"], "'--num-sequences'", "nan"),
    (["capacity"], "'--max-model-len'", "1e400"),
    (["capacity"], "'--gpu-memory-utilization'", " "),
    (["capacity"], "'--gpu-memory-utilization'", "1e400"),  # was shown as inf (gpu_memory_utilization=inf)
    (["capacity"], "'--gpu-hourly-cost'", "nan"),
    (["plan", "--slo", "ttft_s.p90=1", "--gpu", "h100-80gb"], "'--max-replicas'", "inf"),
])
def test_a_number_flag_typer_cannot_read_is_named_with_its_value(tmp_path, monkeypatch, argv, flag, value):
    """`--num-sequences nan` said `Invalid value for '--num-sequences': Input should be a valid integer, ...`,
    naming the flag but not what was given (a `--set` names both)."""
    monkeypatch.chdir(tmp_path)
    option = flag.strip("'")
    kind = "a finite number" if value in ("1e400", "nan") and option in ("--gpu-memory-utilization",
                                                                         "--gpu-hourly-cost") else \
        "a valid number, unable to parse string as a number" if option == "--gpu-memory-utilization" else \
        "a valid integer, unable to parse string as an integer"
    assert one_line_exit_2([*argv, option, value]) == (
        f"Invalid value for {flag}: {value!r}: Input should be {kind} (see 'kvsim {argv[0]} --help')")
    assert _files(tmp_path) == []


@pytest.mark.parametrize("output", ["", "  "])
def test_import_profile_refuses_an_empty_output_before_reading_the_profile(tmp_path, monkeypatch, output):
    """`-o ''` was `Path('')`, the working folder: refused as `--output='.': is the working directory`, a value
    not given, and only once the whole profile had been read and converted."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2(["import-profile", "no-such-profile", "-o", output]) == (
        f"--output={output!r}: is empty: name a file; kvsim only replaces output it wrote itself (choose a new path)")
    assert _files(tmp_path) == []


@pytest.mark.parametrize(("setting", "field", "path"), [
    ("workload.trace={format: azure, path: ''}", "workload.trace.path", ""),
    ("workload.trace={format: lengths, path: '  '}", "workload.trace.path", "  "),
    ("latency={model: calibrated, profile: '  '}", "latency.profile", "  "),
])
def test_a_blank_data_path_is_refused_as_empty(tmp_path, monkeypatch, setting, field, path):
    """A trace's `path: ''` was the scenario's folder (`base_dir / ''`): `workload.trace.path .: cannot read (Is a
    directory)`, naming a value not given; '  ' was `file not found` with the spaces after it."""
    monkeypatch.chdir(tmp_path)
    lengths = ["--set", "workload.prompt_len=null", "--set", "workload.output_len=null"] if "trace" in field else []
    assert one_line_exit_2([*RUN, *lengths, "--set", setting, "-o", "out"]) == f"{field}={path!r}: is empty: name a file"
    assert _files(tmp_path) == []


@pytest.mark.parametrize("argv", [["capacity", "--gpu", "g" * 300], ["run", *RUN[1:], "--set", "gpu=" + "g" * 300]])
def test_a_gpu_name_too_long_for_a_file_is_refused_as_the_gpu(tmp_path, monkeypatch, argv):
    """As a model's (sweep 10): `--gpu` and 300 characters said `kvsim: error: ggg...: File name too long`, naming
    no field (the OSError of `Path.is_file`)."""
    monkeypatch.chdir(tmp_path)
    message = one_line_exit_2(argv)
    assert message.startswith(f"gpu='{'g' * 300}': not a preset (a100-40gb, "), message
    assert message.endswith(") nor a file (File name too long)"), message
    assert _files(tmp_path) == []


MEASURED = "benchmarks/validation_set/measured/RTXPRO6000/Llama-3.1-8B"


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "  "], "scenario='  ': is empty"),
    (["plan", "--spec", " ", "--slo", "ttft_s.p90=2", "--gpu", "h100-80gb"], "spec=' ': is empty"),
    (["validate", "   "], "measured='   ': is empty"),
    (["validate", MEASURED, "--workload", "  "], "workload='  ': is empty"),
    (["validate", MEASURED, "--latency", "calibrated", "--profile", "  "],
     "--profile='  ': is empty: name a measured profile bundle or CSV"),
])
def test_a_blank_file_argument_is_refused_as_empty(tmp_path, monkeypatch, argv, expected):
    """'' was refused as empty (`Path('')` is the working folder); '  ' was 'file not found', and a validate
    `--profile '  '` was made absolute first: `latency.profile='/work/...  ': file not found`."""
    from pathlib import Path

    argv = [str(Path(__file__).parent.parent / arg) if arg == MEASURED else arg for arg in argv]
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2([*argv, "-o", "out"]) == expected
    assert _files(tmp_path) == []
