"""Bad input found by the fourteenth sweep (integers of hundreds of digits echoed whole, ...): each exits 2 with
one line naming the field and the value, and writes nothing, never a traceback or a value echoed back whole."""

import pytest
from conftest import one_line_exit_2

RUN = ["run", "--set", "workload.num_requests=3", "--set", "steps=none"]
BIG = "9" * 400
CUT = "9" * 57 + "..."  # README: a value shown in an error is cut to 60 characters


def _files(folder):
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "--set", f"engine.max_model_len={BIG}"],
     f"max_model_len={CUT}: exceeds llama-3.1-8b's max_position_embeddings=131072"),
    (["run", "--set", f"engine.tensor_parallel_size={BIG}"],
     f"tensor_parallel_size={CUT}: must divide llama-3.1-8b's 32 attention heads"),
    (["run", "--set", f"engine.max_num_seqs={BIG}"],
     "engine.max_num_batched_tokens=8192: vLLM refuses this: max_num_batched_tokens (8192) must be greater than "
     f"or equal to max_num_seqs ({CUT})"),
    (["capacity", "-tp", BIG], f"tensor_parallel_size={CUT}: must divide llama-3.1-8b's 32 attention heads"),
    (["capacity", "--block-size", BIG], f"block_size={CUT}: vLLM accepts 1, 8, 16, 32, 64, 128, 256"),
    (["plan", "--slo", "ttft_s.p90=2", "--gpu", "h100-80gb", "-tp", BIG],
     f"tensor_parallel_size={CUT}: must divide llama-3.1-8b's 32 attention heads"),
])
def test_a_huge_integer_is_cut_in_the_error_line(tmp_path, monkeypatch, argv, expected):
    """An integer field takes any size, and the messages naming it as `field={value}` printed all 400 digits."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2(argv) == expected
    assert _files(tmp_path) == []


@pytest.mark.parametrize(("flags", "expected"), [
    (["--set", "latency={model: calibrated, profile: nope.csv}"], "latency.profile='nope.csv': file not found: "),
    (["--set", "workload.prompt_len={dist: empirical, table: nope.csv, column: prompt}"],
     "workload.prompt_len.table='nope.csv': file not found: "),
    (["--set", "workload.output_len={dist: empirical, table: 'builtin:nope', column: output}"],
     "workload.output_len.table='builtin:nope': no built-in data named 'nope' (there are: "),
])
def test_a_missing_data_file_names_the_field_that_gave_it(tmp_path, monkeypatch, flags, expected):
    """A missing latency profile or length table was reported as `path='...'`, a field the user had not set."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2([*RUN, *flags]).startswith(expected)
    assert _files(tmp_path) == []


@pytest.mark.parametrize("command", [RUN, ["plan", "--slo", "ttft_s.p90=2", "--gpu", "h100-80gb"]])
@pytest.mark.parametrize("output", ["a\nb", "a\tb", "a\x1b[31mb"])
def test_an_output_folder_with_a_control_character_is_refused(tmp_path, monkeypatch, command, output):
    """`-o $'a\\nb'` made a folder whose name split the "results written to" line in two, as a scenario name
    with a newline split error lines before `Label` refused it."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2([*command, "-o", output]) == (
        f"--output={output!r}: holds the control character {output[1]!r}; name a folder with one line of printable "
        "text; kvsim only replaces output it wrote itself (choose a new path)")
    assert _files(tmp_path) == []


@pytest.mark.parametrize("flags", [["--steps", "none"], ["--set", "steps=none"]])
@pytest.mark.parametrize("steps_format", ["csv", "parquet", "auto"])
def test_a_steps_format_for_a_run_keeping_no_steps_is_refused(tmp_path, monkeypatch, flags, steps_format):
    """`--steps-format` chooses the steps file, and steps=none writes none: the flag was dropped without a word,
    where kvsim refuses a flag another makes it ignore (`capacity --num-sequences` without a shared prefix,
    `validate --profile` without `--latency calibrated`)."""
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--set", "workload.num_requests=3", *flags, "--steps-format", steps_format]
    assert one_line_exit_2(argv) == (f"--steps-format={steps_format}: chooses the file the steps are written to, "
                                     "but this run keeps none (steps=none)")
    assert _files(tmp_path) == []


def test_a_steps_format_for_sampled_steps_still_writes_that_file(tmp_path):
    """`sampled` keeps a steps file, so the flag is read there."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    argv = ["run", "--set", "workload.num_requests=3", "--steps", "sampled", "--steps-format", "csv",
            "-o", str(tmp_path / "out")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "steps.csv").is_file()


WORKLOAD = {"num_requests": 3, "prompt_len": {"dist": "fixed", "value": 5}, "output_len": {"dist": "fixed", "value": 2}}


@pytest.mark.parametrize(("fields", "message"), [
    ({"seed": "-5", "workload": WORKLOAD}, "seed='-5': Input should be greater than or equal to 0"),
    ({"workload": {"num_requests": "1_0"}}, "workload: num_requests='1_0': a number written with an underscore"),
    ({"nope": "1", "workload": WORKLOAD}, "nope: unknown key"),
])
def test_model_validate_strings_refuses_as_model_validate_does(fields, message):
    """Pydantic's `model_validate_strings` raised its multi-line ValidationError, no `KvsimError`."""
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError) as raised:
        kvsim.Scenario.model_validate_strings(fields)
    assert str(raised.value).startswith(message)
    with pytest.raises(KvsimError) as direct:
        kvsim.Scenario.model_validate(fields)
    assert str(direct.value) == str(raised.value)
    assert kvsim.Scenario.model_validate_strings({"seed": "7", "workload": WORKLOAD}).seed == 7


@pytest.mark.parametrize(("fields", "message"), [
    ({"seed": -5, "workload": WORKLOAD}, "seed=-5: Input should be greater than or equal to 0"),
    ({"nope": 3, "workload": WORKLOAD}, "nope: unknown key"),
    ({}, "workload: required field is missing"),
])
def test_model_construct_validates_as_model_validate_does(fields, message):
    """Pydantic's `model_construct` skips validation: a seed of -5 reached numpy mid-run, an unknown key was kept
    and a scenario without a workload was made."""
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError) as raised:
        kvsim.Scenario.model_construct(**fields)
    assert str(raised.value).startswith(message)


def test_model_construct_keeps_pydantics_fields_set():
    import kvsim

    made = kvsim.Scenario.model_construct(workload=WORKLOAD, seed=3)
    assert (made.seed, made.model_fields_set) == (3, {"workload", "seed"})
    assert kvsim.Scenario.model_construct({"workload"}, workload=WORKLOAD, seed=3).model_fields_set == {"workload"}
    assert made == kvsim.Scenario.model_validate({"workload": WORKLOAD, "seed": 3})
