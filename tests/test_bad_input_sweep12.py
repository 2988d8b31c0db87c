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
