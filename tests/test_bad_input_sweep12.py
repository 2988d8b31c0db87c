"""Bad input found by the twelfth sweep (a machine without a home folder, the Python API's `Scenario`, sizes and
time costs without a bound, numbers written with underscores or as numpy booleans, YAML aliases and documents,
JSON keys and ServeGen windows given twice, a flag beside a `--set` of its field, names on two lines): each exits
2 with one line naming the field and the value, and writes nothing, never a traceback, a hang, or a value read
as another without a word."""

import pytest
from conftest import one_line_exit_2
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.model.errors import KvsimError

runner = CliRunner()
RUN = ["run", "--set", "workload.num_requests=3", "--set", "steps=none"]


def _set(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


@pytest.fixture
def no_home(monkeypatch):
    """HOME unset, and no passwd entry for this user (a container run under an arbitrary user id): pathlib's
    `Path.home()` raises RuntimeError("Could not determine home directory.") there."""
    import pwd

    def no_entry(uid):
        raise KeyError(uid)

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)


def test_a_run_writes_its_output_on_a_machine_without_a_home_folder(tmp_path, no_home):
    """Every write asked `Path.home()` whether the output was the home folder: a RuntimeError traceback, for any
    `-o` and for the default `runs/NAME`."""
    result = runner.invoke(app, [*RUN, "-o", str(tmp_path / "out"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "summary.json").exists()


def test_an_output_under_a_home_folder_that_is_not_known_says_so(tmp_path, monkeypatch, no_home):
    """`-o ~/out` there was refused as "the home folder of a user this machine does not know": the user is this
    one, whose home folder no variable or passwd entry gives."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2([*RUN, "-o", "~/out"]) == (
        "--output='~/out': starts with '~', but this user has no home folder (HOME is not set and the user has no "
        "passwd entry); kvsim only replaces output it wrote itself (choose a new path)")
    assert list(tmp_path.iterdir()) == []


LENGTHS = {"prompt_len": {"dist": "fixed", "value": 8}, "output_len": {"dist": "fixed", "value": 8}}


@pytest.mark.parametrize("build", ["init", "model_validate"])
def test_a_scenario_built_in_python_refuses_a_field_in_one_line(build):
    """`kvsim.Scenario` is the API's: built directly, a bad field raised pydantic's ValidationError (four lines,
    a link to pydantic's docs), not the `KvsimError` `load_scenario` and `simulate` raise for the same field."""
    import kvsim

    fields = {"workload": {"num_requests": 0, **LENGTHS}}
    with pytest.raises(KvsimError) as error:
        kvsim.Scenario(**fields) if build == "init" else kvsim.Scenario.model_validate(fields)
    assert str(error.value) == "workload.num_requests=0: Input should be greater than 0"


def test_a_scenario_built_in_python_still_builds():
    import kvsim

    assert kvsim.Scenario(workload={"num_requests": 2, **LENGTHS}).workload.num_requests == 2


@pytest.mark.parametrize(("argv", "field"), [
    (["capacity", "-dp", "4097"], "engine.data_parallel_size"),  # named as run names it (tidy29)
    ([*RUN, "--set", "engine.data_parallel_size=100000000000"], "engine.data_parallel_size"),
])
def test_a_data_parallel_size_past_the_engines_kvsim_runs_is_refused(tmp_path, argv, field):
    """`capacity -dp 100000000000` priced a hundred billion GPUs serving: replicas are bounded at 4,096 engines
    (`replicas`, a group's `count`), a data-parallel group's ranks were not."""
    value = argv[-1].rpartition("=")[2]
    assert one_line_exit_2([*argv, "-o", str(tmp_path / "out")] if argv[0] == "run" else argv) == (
        f"{field}={value}: Input should be less than or equal to 4096")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("item", "bound"), [
    # a system prompt is a prompt: at most the 2**53 tokens a drawn or read prompt may have (struct.error was
    # raised packing 10**20 into the request's int64 at its arrival, mid-run)
    ("workload.shared_prefix={tokens: 100000000000000000000}", "workload.shared_prefix.tokens=100000000000000000000: "
                                                               f"Input should be less than or equal to {2**53}"),
    # each request's prefix is drawn by numpy from [0, num_prefixes), an int64 range: 10**20 was a ValueError
    ("workload.shared_prefix={tokens: 16, num_prefixes: 100000000000000000000}",
     f"workload.shared_prefix.num_prefixes=100000000000000000000: Input should be less than or equal to {2**63 - 1}"),
], ids=["tokens", "num-prefixes"])
def test_a_shared_prefix_past_what_kvsim_counts_is_refused(tmp_path, item, bound):
    assert one_line_exit_2([*RUN, *_set(item), "-o", str(tmp_path / "out")]) == bound
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("items", "field"), [
    (["latency.overhead_s=1.7e308"], "latency.overhead_s"),
    (["latency={model: constant, step_s: 1.7e308}"], "latency.step_s"),
    (["gpu_link={kind: nvlink, bandwidth_bytes_per_s: 1e11, latency_s: 1.7e308}", "engine.tensor_parallel_size=2"],
     "gpu_link.latency_s"),
    (["gpu_link={kind: nvlink, bandwidth_bytes_per_s: 1e11, latency_s: 0, collective_latency_s: 1.7e308}",
      "engine.tensor_parallel_size=2"], "gpu_link.collective_latency_s"),
    (["kv_transfer_config={kv_link_latency_s: 1.7e308}", "replicas=[{kv_role: kv_producer}, {kv_role: kv_consumer}]"],
     "kv_transfer_config.kv_link_latency_s"),
], ids=["overhead", "constant-step", "link-latency", "collective-latency", "kv-link-latency"])
def test_a_fixed_cost_of_more_than_an_hour_is_refused(tmp_path, items, field):
    """A step costing 1.7e308 s ends the first step at 1.7e308 s and the second past the largest float: an
    AssertionError in the clock, mid-run (a link's latency the same, at tensor parallel 2; a KV link's made
    every TTFT 1.7e308 s and numpy's mean of them overflow). No link hop or GPU step takes an hour."""
    message = one_line_exit_2([*RUN, *_set(*items), "-o", str(tmp_path / "out")])
    # YAML 1.1 reads 1.7e308 (no sign after the e) as text, which pydantic then reads as a number: shown as written
    assert message == f"{field}='1.7e308': Input should be less than or equal to 3600"
    assert list(tmp_path.iterdir()) == []


def test_a_fixed_cost_of_an_hour_still_runs():
    import kvsim

    result = kvsim.simulate(None, workload__num_requests=2, steps="none", latency__overhead_s=3600)
    assert result.summary["num_finished"] == 2


UNDERSCORE = "a number written with an underscore (Python would read {}); write the digits without it"


@pytest.mark.parametrize(("item", "message"), [
    # YAML 1.1 (PyYAML) reads 1_6 as 16 and 0.9_5 as 0.95, pydantic reads the text '1_6' as 16 too: a slip for
    # 1.6 or 16 ran as 16 without a word. JSON, vLLM's config files, and YAML 1.2 read neither as a number.
    ("engine.block_size=1_6", "engine: block_size='1_6': " + UNDERSCORE.format(16)),
    ("engine.block_size='1_6'", "engine: block_size='1_6': " + UNDERSCORE.format(16)),  # quoted: the same text
    ("engine.gpu_memory_utilization=0.9_5", "engine: gpu_memory_utilization='0.9_5': " + UNDERSCORE.format(0.95)),
    ("seed=1_000_000", "seed='1_000_000': " + UNDERSCORE.format(1000000)),  # a grouping is refused too
    ("workload.arrival={process: poisson, rate: 1_0}", "workload.arrival: rate='1_0': " + UNDERSCORE.format(10)),
    ("engine.speculative_config={method: ngram, num_speculative_tokens: 2, acceptance_rates: [0.5, 0.5_0]}",
     "engine.speculative_config: acceptance_rates[1]='0.5_0': " + UNDERSCORE.format(0.5)),
    ("replicas=[{engine: {max_num_seqs: 1_0}}]", "replicas[0]: engine: max_num_seqs='1_0': " + UNDERSCORE.format(10)),
], ids=["int", "quoted", "float", "grouped", "nested", "list-item", "replica-group"])
def test_a_number_written_with_an_underscore_is_refused(tmp_path, item, message):
    assert one_line_exit_2([*RUN, *_set(item), "-o", str(tmp_path / "out")]) == message
    assert list(tmp_path.iterdir()) == []


def test_a_number_written_with_an_underscore_in_a_scenario_file_is_refused(tmp_path):
    (tmp_path / "s.yaml").write_text("engine: {max_num_seqs: 6_4}\nworkload: {num_requests: 3, prompt_len: "
                                     "{dist: fixed, value: 8}, output_len: {dist: fixed, value: 8}}\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        "engine: max_num_seqs='6_4': " + UNDERSCORE.format(64))
    assert not (tmp_path / "out").exists()


def test_simulate_refuses_a_number_written_with_an_underscore():
    import kvsim

    with pytest.raises(KvsimError, match=r"^engine: block_size='1_6': a number written with an underscore"):
        kvsim.simulate(None, workload__num_requests=2, engine__block_size="1_6")


def test_text_written_with_an_underscore_stays_text():
    """YAML 1.1 read `name: 1_0` as the number 10 (then refused as no string); it is the text written."""
    from kvsim.workload.scenario import load_scenario

    assert load_scenario(None, ["name=1_0"]).name == "1_0"


@pytest.mark.parametrize(("argv", "flag", "value", "number"), [
    (["capacity"], "--block-size", "1_6", 16),
    (["capacity"], "--gpu-memory-utilization", "0.9_5", 0.95),
    (["capacity"], "-dp", "1_0", 10),
    (["run"], "--max-num-seqs", "1_0", 10),
], ids=["capacity-int", "capacity-float", "short-flag", "run-int"])
def test_a_flag_written_with_an_underscore_is_refused(tmp_path, argv, flag, value, number):
    """typer reads a flag's number as pydantic does: `--block-size 1_6` was 16."""
    names = {"-dp": "'--data-parallel-size' / '-dp'"}
    out = ["-o", str(tmp_path / "out")] if argv == ["run"] else []
    assert one_line_exit_2([*argv, flag, value, *out]) == (
        f"Invalid value for {names.get(flag, repr(flag))}: {value!r}: {UNDERSCORE.format(number)} "
        f"(see 'kvsim {argv[0]} --help')")
    assert list(tmp_path.iterdir()) == []


def test_a_flags_number_is_still_read():
    result = runner.invoke(app, ["capacity", "--block-size", "32", "--gpu-memory-utilization", "0.95",
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    assert '"block_size": 32' in result.stdout
    assert one_line_exit_2(["capacity", "--block-size", "x"]) == (  # pydantic's message, after the value (sweep 16)
        "Invalid value for '--block-size': 'x': Input should be a valid integer, unable to parse string as an integer "
        "(see 'kvsim capacity --help')")


def test_a_list_flag_item_written_with_an_underscore_is_refused():
    assert one_line_exit_2(["capacity", "--context-lengths", "1024,2_048"]) == (
        "--context-lengths='1024,2_048': '2_048' is " + UNDERSCORE.format(2048))


@pytest.mark.parametrize(("fmt", "text", "message"), [
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1_0,44\n",
     "t.csv:2: ContextTokens='1_0' is not an integer"),
    ("lengths", "num_prefill_tokens,num_decode_tokens\n10,3_0\n", "t.csv:2: num_decode_tokens='3_0' is not an integer"),
], ids=["azure", "lengths"])
def test_a_trace_number_written_with_an_underscore_is_refused(tmp_path, fmt, text, message):
    """int() read a trace's `1_0` tokens as 10."""
    (tmp_path / "t.csv").write_text(text)
    arrival = "arrival: {process: trace}, " if fmt == "azure" else ""
    (tmp_path / "s.yaml").write_text(f"workload: {{num_requests: 1, {arrival}trace: {{format: {fmt}, path: t.csv}}}}\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == \
        f"{tmp_path}/{message}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--slo", "ttft_s.p90=1_0", "--slo ttft_s.p90='1_0': expected seconds"),
    ("--gpu-hourly-cost", "h100-80gb=2_5", "--gpu-hourly-cost h100-80gb='2_5': expected a price per hour"),
])
def test_a_plan_flag_written_with_an_underscore_is_refused(tmp_path, flag, value, message):
    argv = ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "tpot_s.p90=1", flag, value]
    assert one_line_exit_2([*argv, "-o", str(tmp_path / "out")]) == message
    assert list(tmp_path.iterdir()) == []


def test_a_yaml_base_60_float_is_refused(tmp_path):
    """`1:30` (YAML 1.1's base-60 integer, 90) was refused; `1:30.5`, its float form, was read as 90.5."""
    value = "{turns: 2, think_time_s: 1:30.5}"
    column = value.index("1:30.5") + 1  # of the value, as YAML reads it; 1:30.5 is 1 × 60 + 30.5 = 90.5
    assert one_line_exit_2([*RUN, *_set(f"workload.multi_turn={value}"), "-o", str(tmp_path / "out")]) == (
        f"--set 'workload.multi_turn={value}': the value is not valid YAML (1:30.5 reads as 90.5 (a YAML 1.1 "
        f"base-60 number): write the number without a colon, or quote it at line 1, column {column})")
    assert list(tmp_path.iterdir()) == []


def _alias_bomb(levels: int) -> str:
    """`a0` a list of 10 scalars, each `a<i>` a list of 10 aliases of `a<i-1>` (a "billion laughs" of `levels`)."""
    lines = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_yaml_aliases_that_repeat_too_many_values_are_refused(tmp_path):
    """Nine levels of ten aliases (10**9 values) never ended: the scenario's checks walk every value an alias
    repeats before its keys are even looked at. a0 holds 11 values (the list, 10 scalars), a<i> 1 + 10 times
    a<i-1>'s; read once, the text has a0's 11 nodes and one list node per later level."""
    levels = 4
    sizes = [11]
    for _ in range(levels):
        sizes.append(1 + 10 * sizes[-1])
    repeated = sum(sizes) - (11 + levels)  # 11 + 111 + 1,111 + 11,111 + 111,111 - 15 = 124,440
    (tmp_path / "s.yaml").write_text(_alias_bomb(levels))
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        f"scenario {tmp_path}/s.yaml: not valid YAML: its aliases repeat {repeated:,} values, more than kvsim reads "
        "(100,000)")
    assert not (tmp_path / "out").exists()


def test_yaml_aliases_that_repeat_a_few_values_still_load(tmp_path):
    from kvsim.workload.scenario import load_scenario

    (tmp_path / "s.yaml").write_text("engine: &e {max_num_seqs: 8}\nreplicas: [{engine: *e}, {engine: *e}]\n"
                                     "workload: {num_requests: 3, prompt_len: &len {dist: fixed, value: 8}, "
                                     "output_len: *len}\n")
    scenario = load_scenario(tmp_path / "s.yaml")
    assert [group.engine for group in scenario.replicas] == [{"max_num_seqs": 8}] * 2


@pytest.mark.parametrize("value", ["&a [*a]", "&a [1, [2, *a]]"])
def test_a_yaml_list_holding_itself_is_refused(tmp_path, value):
    """PyYAML builds a list that holds itself (a mapping it refuses): the scenario's checks then recursed without
    end, a RecursionError traceback."""
    assert one_line_exit_2([*RUN, *_set(f"name={value}"), "-o", str(tmp_path / "out")]) == (
        f"--set 'name={value}': the value is not valid YAML (an alias refers to a node that holds it (a loop) at "
        "line 1, column 1)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("argv", "message"), [
    # the flag won wherever it stood: after the --set (run applies flags last) as before it
    (["run", "--set", "engine.max_num_seqs=10", "--max-num-seqs", "5"],
     "--max-num-seqs=5: sets engine.max_num_seqs, which --set 'engine.max_num_seqs=10' sets too; give each field once"),
    (["run", "--steps", "none", "--set", "steps=all"],
     "--steps='none': sets steps, which --set 'steps=all' sets too; give each field once"),
    # the flag's JSON replaces the whole section, dropping the field the --set gave
    (["run", "--set", "kv_transfer_config.kv_link=nvlink", "--kv-transfer-config", "{}"],
     "--kv-transfer-config='{}': sets kv_transfer_config, replacing kv_transfer_config.kv_link, which --set "
     "'kv_transfer_config.kv_link=nvlink' sets too; give each field once"),
    # report applied its flags first, so there the --set won
    (["report", "--quick", "--max-num-seqs", "4", "--set", "engine.max_num_seqs=5"],
     "--max-num-seqs=4: sets engine.max_num_seqs, which --set 'engine.max_num_seqs=5' sets too; give each field once"),
], ids=["run-flag-last", "run-flag-first", "run-flag-section", "report"])
def test_a_flag_and_a_set_of_the_same_field_are_refused(tmp_path, argv, message):
    assert one_line_exit_2([*argv, "-o", str(tmp_path / "out")]) == message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["run"], ["report", "--quick"]])
def test_a_flag_beside_a_set_section_giving_its_field_is_refused(tmp_path, command):
    """review13: `--set 'engine={max_num_seqs: 8}' --max-num-seqs 5` ran at 5: the flag, applied after the --set,
    replaced the one field the section gave, its 8 dropped without a word, as a `--set engine.max_num_seqs=8`
    beside the flag was before it was refused. A section that does not give the field is no conflict (the test
    after this one)."""
    argv = [*command, "--set", "engine={max_num_seqs: 8}", "--max-num-seqs", "5", "-o", str(tmp_path / "out")]
    assert one_line_exit_2(argv) == ("--max-num-seqs=5: sets engine.max_num_seqs, which --set "
                                     "'engine={max_num_seqs: 8}' gives too; give each field once")
    assert list(tmp_path.iterdir()) == []


def test_a_flag_inside_a_section_a_set_gives_is_kept(tmp_path, monkeypatch):
    """`report --max-num-seqs 4 --set 'engine={block_size: 32}'`: the --set replaced the engine section after the
    flag, and the report ran at the default max_num_seqs. Its flags now come after the --set, as run's do."""
    from kvsim.report import build

    seen = {}

    def build_report(base, output, cfg, progress=None):
        seen["engine"] = base.engine
        return output

    monkeypatch.setattr(build, "build_report", build_report)
    result = runner.invoke(app, ["report", "--quick", "--workers", "1", "--max-num-seqs", "4", "--set",
                                 "engine={block_size: 32}", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert (seen["engine"].max_num_seqs, seen["engine"].block_size) == (4, 32)


def test_a_set_given_twice_keeps_the_last_value():
    """Repeated `--set`s are applied in order (as Helm's): the last value stands."""
    from kvsim.workload.scenario import load_scenario

    assert load_scenario(None, ["seed=1", "seed=2"]).seed == 2


CONTROL = "holds the control character {}; a name labels output rows, tables and one-line errors, so it is one line " \
          "of printable text"


@pytest.mark.parametrize(("item", "message"), [
    ('name="a\\nb"', "name='a\\nb': " + CONTROL.format("'\\n'")),
    ('replicas=[{name: "x\\ty"}]', "replicas.0.name='x\\ty': " + CONTROL.format("'\\t'")),
    ('workload.priority={classes: [{name: "\\e[31mred", priority: 0, weight: 1}]}',
     "workload.priority.classes.0.name='\\x1b[31mred': " + CONTROL.format("'\\x1b'")),
], ids=["scenario-newline", "group-tab", "class-escape"])
def test_a_name_with_a_control_character_is_refused(tmp_path, item, message):
    """A scenario named `a<newline>b` split an error naming its replicas over two lines (`replicas (a` / `b/g1-0,
    kv_consumer): ...`), against the one-line rule; an escape in a class name reached the terminal's tables."""
    assert one_line_exit_2([*RUN, *_set(item), "-o", str(tmp_path / "out")]) == message
    assert list(tmp_path.iterdir()) == []


def test_a_name_of_any_printable_text_still_runs():
    import kvsim

    assert kvsim.simulate(None, name="名前 ok", workload__num_requests=2, steps="none").summary["scenario"] == "名前 ok"


def test_a_json_trace_row_giving_a_key_twice_is_refused(tmp_path):
    """`json` keeps the last of two equal keys: a Mooncake row giving `input_length` twice (two rows pasted into
    one) was read as its last, where a YAML scenario or a config.json giving a key twice is refused."""
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 5, "input_length": 600, "output_length": 10, '
                                      '"hash_ids": [1]}\n')
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 1, arrival: {process: trace}, "
                                     "trace: {format: mooncake, path: t.jsonl}}\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        f"{tmp_path}/t.jsonl:1: not JSON (duplicate key 'input_length': give each key once)")
    assert not (tmp_path / "out").exists()


def test_a_json_flag_giving_a_key_twice_is_refused():
    flag = '{"method": "ngram", "num_speculative_tokens": 2, "num_speculative_tokens": 5}'
    position = flag.index('"num_speculative_tokens": 5')  # where the key is given again
    shown = repr(flag)[:57] + "..."  # a value is shown in at most 60 characters
    assert one_line_exit_2(["capacity", "--speculative-config", flag]) == (
        f"--speculative-config={shown}: not JSON (duplicate key 'num_speculative_tokens': give each key once at "
        f"character {position})")


def test_an_empty_length_table_is_not_said_to_have_a_header(tmp_path):
    """A 0-byte length table was refused as "the table has a header but no rows": it has neither."""
    (tmp_path / "t.csv").write_text("")
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 1, trace: {format: lengths, path: t.csv}}\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        f"{tmp_path}/t.csv: no requests (the file is empty)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("workload__num_requests", "np.True_", "workload: num_requests=true: expected a number, not a boolean"),
    ("engine__gpu_memory_utilization", "np.False_", "engine: gpu_memory_utilization=false: expected a number, not a "
                                                    "boolean"),
])
def test_simulate_refuses_a_numpy_boolean_for_a_number(field, value, message):
    """`true` for a number is refused (pydantic reads it as 1); numpy's booleans are no bool subclass and passed:
    `workload__num_requests=mask.any()` ran one request."""
    import numpy as np

    import kvsim

    with pytest.raises(KvsimError) as error:
        kvsim.simulate(None, steps="none", **{field: {"np.True_": np.True_, "np.False_": np.False_}[value]})
    assert str(error.value) == message


def test_a_servegen_client_listed_twice_is_refused(tmp_path):
    """`clients: [0, 0]` drew client 0's arrivals twice over: the run's traffic at twice its trace's rate."""
    import json

    (tmp_path / "sg").mkdir()
    (tmp_path / "sg" / "chunk-0-trace.csv").write_text("0,1,1\n")
    (tmp_path / "sg" / "chunk-0-dataset.json").write_text(json.dumps(
        {"0": {"input_tokens": "{100: 1.0}", "output_tokens": "{10: 1.0}"}}))
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 5, arrival: {process: trace}, "
                                     "trace: {format: servegen, path: sg, clients: [0, 0]}}\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        "workload.trace.clients=[0, 0]: 0 is given twice")
    assert not (tmp_path / "out").exists()


def test_a_scenario_file_of_two_yaml_documents_says_so_in_a_sentence(tmp_path):
    """PyYAML's problem alone read "not valid YAML: but found another document": the half of a sentence its
    context begins ("expected a single document in the stream")."""
    workload = "workload: {num_requests: 2, prompt_len: {dist: fixed, value: 8}, output_len: {dist: fixed, value: 8}}"
    (tmp_path / "s.yaml").write_text(f"---\n{workload}\n---\n{workload}\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        f"scenario {tmp_path}/s.yaml: not valid YAML: expected a single document in the stream, but found another "
        "document at line 3, column 1")  # the second `---`
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("rows", "message"), [
    ("0,1,1\n0,1,1\n", "window='0' overlaps line 1's window from 0 s"),  # given twice: drawn twice
    ("0,1,1\n300,1,1\n", "window='300' overlaps line 1's window from 0 s"),  # [300, 900) over [0, 600)
], ids=["twice", "overlapping"])
def test_servegen_windows_that_overlap_are_refused(tmp_path, rows, message):
    """Each row of a ServeGen `chunk-<client>-trace.csv` is a 600-s window of arrivals at its rate: a window
    given twice drew its arrivals twice (twice the rate), without a word."""
    import json

    (tmp_path / "sg").mkdir()
    (tmp_path / "sg" / "chunk-0-trace.csv").write_text(rows)
    (tmp_path / "sg" / "chunk-0-dataset.json").write_text(json.dumps(
        {"0": {"input_tokens": "{100: 1.0}", "output_tokens": "{10: 1.0}"}}))
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 5, arrival: {process: trace}, "
                                     "trace: {format: servegen, path: sg}}\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        f"{tmp_path}/sg/chunk-0-trace.csv:2: {message} (each row is a 600-s window of its own)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("key", "message"), [
    ("1_6", "by_num_gpus key='1_6': a number written with an underscore (Python would read 16); write the digits "
            "without it"),
    ("true", "by_num_gpus key=true: expected a number, not a boolean"),
])
def test_a_number_key_written_with_an_underscore_or_as_a_boolean_is_refused(tmp_path, key, message):
    """review13: a GPU file's `link.by_num_gpus` is keyed by GPU count (dict[int, ...]); the check of misread
    numbers read a dict's values only, so a key `1_6` (text since YAML reads no underscore) was the fit at 16 GPUs
    and a key `true` the fit at 1 GPU (pydantic's lax int), without a word."""
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text("memory_bytes: 80GiB\nmemory_type: hbm\nhbm_bandwidth_bytes_per_s: 3.35e12\nfp16_flops: 989e12\n"
                   "fp8_flops: null\nhost_link_bandwidth_bytes_per_s: 64e9\n"
                   "link: {kind: nvlink, bandwidth_bytes_per_s: 450e9, latency_s: 0.789e-6,\n"
                   f"       by_num_gpus: {{2: {{efficiency: 0.6, fixed_s: 16.0e-6}}, {key}: {{efficiency: 0.9, "
                   "fixed_s: 1.0e-6}}}\n")
    assert one_line_exit_2(["capacity", "--gpu", str(gpu)]) == f"gpu gpu.link: {message}"
