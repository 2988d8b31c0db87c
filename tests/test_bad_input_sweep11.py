"""Bad input found by the eleventh sweep (output paths, a plan folder written again, values of a field that
takes one of several types): each exits 2 with one line naming the field and the value, and writes nothing,
never a traceback, a field the user never wrote, or one plan's answers beside another's."""

import json

import pytest
from conftest import one_line_exit_2
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.model.errors import KvsimError

runner = CliRunner()


@pytest.mark.parametrize("output", ["~kvsim-no-such-user/out", "~kvsim-no-such-user"])
def test_an_output_in_an_unknown_users_home_is_one_line(tmp_path, monkeypatch, output):
    """`-o ~name/out` for a user the machine has not: pathlib's expanduser raised RuntimeError("Could not
    determine home directory."), a traceback (os.path.expanduser leaves such a path as it is)."""
    monkeypatch.chdir(tmp_path)
    line = one_line_exit_2(["run", "--set", "workload.num_requests=2", "-o", output])
    assert line == (f"--output={output!r}: starts with '~kvsim-no-such-user', the home folder of a user this "
                    "machine does not know; kvsim only replaces output it wrote itself (choose a new path)")
    assert list(tmp_path.iterdir()) == []


def test_a_plan_written_again_drops_the_earlier_plans_offload_sizing(tmp_path):
    """A plan folder that an earlier `kvsim plan --offload-size` wrote, planned again without the flag: the
    earlier tier sizing (its SLO, its chosen fleet) stayed beside the new plan.csv, read as this plan's."""
    from kvsim.cli.plan_command import PLAN_FILES
    from kvsim.results.output_dir import claim_directory

    out = claim_directory(tmp_path / "plan", "plan", PLAN_FILES)  # as the earlier plan left it
    earlier = {"offload_points.csv": "cpu_bytes\n1\n", "offload_pays.csv": "load\n1\n",
               "offload_hurts.csv": "load\n1\n", "offload_sizing.json": json.dumps({"ttft_slo_s": 2.0})}
    for name, text in earlier.items():
        (out / name).write_text(text)
    result = runner.invoke(app, ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=100",
                                 "--set", "workload.num_requests=5", "--set", "workload.arrival.rate=1",  # light: settles fast
                                 "--max-replicas", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [".kvsim-output", "pareto.png", "plan.csv", "plan.json",
                                                     "plan.md", "points.jsonl"]


@pytest.mark.parametrize(("item", "message"), [
    # pydantic names each member of a union in the location: `replicas.int`, a field the user never wrote,
    # and the member that fails first (an integer) where the list got as far as its bad item
    ("replicas=[{count: 1}, 5]", "replicas.1=5: a section, not one value: set its fields (count, name, model, gpu, "
                                 "engine, kv_role), e.g. replicas.1.count=..."),
    ("replicas=abc", "replicas='abc': Input should be a valid integer, unable to parse string as an integer"),
    ("replicas={a: 1}", "replicas={'a': 1}: Input should be a valid integer"),  # the value was left out
    ("engine.speculative_config={method: ngram, num_speculative_tokens: 2, acceptance_rates: [0.5, abc]}",
     "engine.speculative_config.acceptance_rates.1='abc': Input should be a valid number, unable to parse "
     "string as a number"),
    ("engine.speculative_config={method: ngram, num_speculative_tokens: 2, acceptance_rates: abc}",
     "engine.speculative_config.acceptance_rates='abc': Input should be a valid number, unable to parse string "
     "as a number"),
    ("name={a: 1}", "name={'a': 1}: Input should be a valid string"),  # a mapping for text: no value was shown
])
def test_a_field_of_several_types_is_named_as_written(tmp_path, item, message):
    assert one_line_exit_2(["run", "--set", item, "-o", str(tmp_path / "out")]) == message
    assert list(tmp_path.iterdir()) == []


def test_simulate_names_a_union_field_as_written():
    """The library API reports the same line (`kvsim.simulate` raises the error the CLI prints)."""
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError, match=r"^replicas\.1=5: a section, not one value: set its fields \(count, "):
        kvsim.simulate(None, replicas=[{"count": 1}, 5])


@pytest.mark.parametrize("command", [["run", "-o", "{d}/out"], ["capacity"]])
def test_a_model_of_more_layers_than_kvsim_holds_is_refused(tmp_path, command):
    """`num_hidden_layers: 10**12` in a config.json: a MemoryError (a traceback) making the per-layer attention
    kinds, before any check of the weights could say they do not fit."""
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 10**12, "intermediate_size": 128, "vocab_size": 1000,
              "max_position_embeddings": 4096}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    argv = [part.replace("{d}", str(tmp_path)) for part in command]
    assert one_line_exit_2([*argv, "--set" if argv[0] == "run" else "--model",
                            f"model={tmp_path / 'm'}" if argv[0] == "run" else str(tmp_path / "m")]) == (
        "model m.num_layers=1000000000000: Input should be less than or equal to 65536")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


@pytest.mark.parametrize("progress", [lambda fraction: None, lambda: None, lambda a, b, c, d: None, len])
def test_a_progress_function_that_cannot_take_three_arguments_is_refused_before_the_run(progress):
    """`progress` is called with (simulated seconds, done, total): one that cannot take them was a TypeError traceback
    from inside the run; now refused up front, naming it."""
    import kvsim

    with pytest.raises(KvsimError, match=r"^progress=.*: expected a function \(simulated_s, done, total\) or None$"):
        kvsim.simulate(workload__num_requests=2, progress=progress)


def test_progress_functions_that_take_three_arguments_still_run():
    import kvsim

    calls = []
    kvsim.simulate(workload__num_requests=2, progress=lambda *args: calls.append(args))
    kvsim.simulate(workload__num_requests=2, progress=lambda f, d, t, extra=None: calls.append((f, d, t)))
    assert calls and all(len(call) == 3 for call in calls)


def test_load_scenario_refuses_a_default_that_is_not_a_path():
    """`load_scenario(None, default=5)` read open file descriptor 5 as the scenario."""
    import kvsim

    with pytest.raises(KvsimError, match=r"^default=5: expected a YAML path$"):
        kvsim.load_scenario(None, default=5)
