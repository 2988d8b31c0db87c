"""Bad input found by the sixteenth sweep. Each is refused (exit 2, one line naming the field and the value,
nothing written) or, where vLLM itself accepts it, warned of in one line while the run goes on unchanged."""

import pytest
from conftest import one_line_exit_2
from typer.testing import CliRunner

from kvsim.cli import app

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
