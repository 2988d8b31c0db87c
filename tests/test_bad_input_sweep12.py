"""Bad input found by the twelfth sweep (a machine without a home folder, the Python API's `Scenario`, sizes
without a bound, numbers written with underscores, YAML aliases, a field set twice, labels on two lines): each
exits 2 with one line naming the field and the value, and writes nothing, never a traceback, a hang, or a
value read as another without a word."""

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
    (["capacity", "-dp", "4097"], "data_parallel_size"),
    ([*RUN, "--set", "engine.data_parallel_size=100000000000"], "engine.data_parallel_size"),
])
def test_a_data_parallel_size_past_the_engines_kvsim_runs_is_refused(tmp_path, argv, field):
    """`capacity -dp 100000000000` priced a hundred billion GPUs serving: replicas are bounded at 4,096 engines
    (`replicas`, a group's `count`), a data-parallel group's ranks were not."""
    value = argv[-1].rpartition("=")[2]
    assert one_line_exit_2([*argv, "-o", str(tmp_path / "out")] if argv[0] == "run" else argv) == (
        f"{field}={value}: Input should be less than or equal to 4096")
    assert list(tmp_path.iterdir()) == []
