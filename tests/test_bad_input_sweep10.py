"""Bad input found by the tenth sweep, around the recent surfaces (conversations sent after each reply, the
closed-loop client, models given as folders, per-step files, the library API): each exits 2 with one line
naming the field and the value, and writes nothing, never a traceback, a hang or a run whose clock cannot
reach its requests."""

import pytest
from conftest import one_line_exit_2

RUN = ["run", "--set", "workload.num_requests=6", "--set", "steps=none"]
MT = "workload.multi_turn"


def _set(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


@pytest.mark.parametrize(("settings", "message"), [
    # Poisson gaps have a mean of 1/rate = 1e308 s: which request passes 1.8e308 s first is drawn
    (["workload.arrival.rate=1e-308"], "workload.arrival.rate=1e-308: request "),
    # constant gaps of 1e310 s (1 / a subnormal rate): request 1 (0-based) would arrive past the largest float
    # (1.8e308); a finite instant past 2**32 s is refused too (test_bad_input_sweep13)
    (["workload.arrival={process: constant, rate: 1e-310}"],
     "workload.arrival.rate=1e-310: request 1 of 6 would arrive at inf s"),
    # turn k of a conversation is sent k think times after its first (open) or after turn k-1 ended (after_reply):
    # turn 3 is 2 think times of 1e308 s out either way
    ([f"{MT}.turns=3", f"{MT}.think_time_s=1e308"], f"{MT}.think_time_s=1e+308: turn 3 of a conversation would be "
     "sent at inf s"),
    ([f"{MT}.turns=3", f"{MT}.think_time_s=1e308", f"{MT}.timing=after_reply"],
     f"{MT}.think_time_s=1e+308: turn 3 of a conversation would be sent at inf s"),
    ([f"{MT}.turns=3", f"{MT}.think_time_s=1e308", f"{MT}.timing=after_reply", "replicas=2",
      "workload.max_concurrency=2"], f"{MT}.think_time_s=1e+308: turn 3 of a conversation would be sent at inf s"),
], ids=["poisson-rate", "constant-rate", "think-open", "think-after-reply", "think-after-reply-fleet-closed"])
def test_an_instant_past_the_largest_float_is_refused(tmp_path, settings, message):
    """A rate of 1e-308 ended in an AssertionError in the clock, a think time of 1e308 s in an AssertionError
    (open) or SimPy's 'no scheduled events left' (after_reply): the clock cannot reach an instant of inf s."""
    out = tmp_path / "out"
    assert one_line_exit_2([*RUN, *_set(*settings), "-o", str(out)]).startswith(message)
    assert not out.exists()


def test_a_trace_scaled_past_the_largest_float_is_refused(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:4{s}.000000,10,10\n" for s in (6, 7, 8)))
    out = tmp_path / "out"
    # the second row is 1 s after the first: 1 / 1e-310 s, past the largest float
    assert one_line_exit_2([*RUN, *_set("workload.num_requests=3", "workload.arrival={process: trace}",
                                        f"workload.trace={{format: azure, path: {trace}, rate_scale: 1e-310}}",
                                        "workload.prompt_len=null", "workload.output_len=null"),
                            "-o", str(out)]).startswith("workload.trace.rate_scale=1e-310: request 1 of 3 would "
                                                        "arrive at inf s")
    assert not out.exists()


@pytest.mark.parametrize("timing", ["open", "after_reply"])
def test_more_turns_than_an_int64_is_one_conversation(timing):
    """turns=10**23 (open timing) ended in an OverflowError traceback; a conversation holds at most the run's
    requests, so it is the same run as turns equal to num_requests."""
    import kvsim

    def run(turns):
        settings = {"workload.num_requests": 6, "steps": "none", "workload.multi_turn.turns": turns,
                    "workload.multi_turn.timing": timing, "workload.multi_turn.think_time_s": 0.5}
        return kvsim.simulate(kvsim.load_scenario(None, settings)).summary

    assert run(10**23) == run(6)


@pytest.mark.parametrize(("settings", "warnings"), [
    # the scenario's slab placement, read by the group that allocates slabs
    (["engine.slab_placement=first-fit", "replicas=[{engine: {allocator: slab-max}}]"], []),
    # a group's own setting its paged allocator never reads, said with the group
    (["replicas=[{count: 2}, {engine: {slab_placement: first-fit}}]"],
     ["replicas[1]: engine.slab_placement=first-fit is unread: the paged allocator places no slabs"]),
    (["replicas=[{engine: {prefix_cache: radix, enable_prefix_caching: false}}]"],
     ["replicas[0]: engine.prefix_cache=radix is unread: enable_prefix_caching is false, so no prefix is cached"]),
    # the scenario's own setting no group reads: said once, as the single engine says it
    (["engine.slab_placement=first-fit", "replicas=[{count: 1}, {engine: {max_num_seqs: 8}}]"],
     ["engine.slab_placement=first-fit is unread: the paged allocator places no slabs"]),
], ids=["group-allocates-slabs", "group-slab-placement", "group-radix-off", "scenario-slab-placement"])
def test_a_fleet_warns_of_the_settings_its_replicas_do_not_read(tmp_path, settings, warnings):
    """Only the scenario's `engine` section was asked: a replica group's own unread setting ran without a word,
    and a scenario setting a group reads was warned of as unread."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, [*RUN, *_set(*settings), "-o", str(tmp_path / "out"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [f"kvsim: warning: {line}" for line in warnings]


def test_a_fleet_does_not_warn_of_a_setting_its_group_reads(tmp_path):
    """The scenario's engine turns caching off, the only group turns it on: the group's radix tree caches, so
    `prefix_cache: radix` is read (a file: a `--set` of the scenario's enable_prefix_caching beside the group's own is
    refused, sweep 16)."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    (tmp_path / "s.yaml").write_text(
        "engine: {prefix_cache: radix, enable_prefix_caching: false}\nreplicas: [{engine: {enable_prefix_caching: "
        "true}}]\nworkload: {num_requests: 6, prompt_len: {dist: fixed, value: 64}, output_len: {dist: fixed, "
        "value: 8}}\nsteps: none\n")
    result = CliRunner().invoke(app, ["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


@pytest.fixture(scope="module")
def result():
    import kvsim

    return kvsim.simulate(workload__num_requests=4)  # keeps its steps: a format is read


@pytest.mark.parametrize("steps_format", ["xlsx", "CSV", 3])
def test_run_result_write_refuses_a_steps_format_it_does_not_write(tmp_path, result, steps_format):
    """`RunResult.write(path, "xlsx")` wrote CSV text into steps.xlsx, and said nothing."""
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError, match=rf"^steps_format={steps_format!r}: expected auto, parquet or csv$"):
        result.write(tmp_path / "out", steps_format)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("name", "why"), [
    ("a\0b", "holds a NUL character, which no file name can"),  # was a bare ValueError from os.path.realpath
    ("a" * 300, "cannot write there (File name too long)"),  # was a bare OSError from is_symlink
], ids=["nul", "name-too-long"])
def test_run_result_write_refuses_a_path_no_file_can_have(tmp_path, result, name, why):
    from kvsim.model.errors import KvsimError

    out = str(tmp_path / name)
    with pytest.raises(KvsimError) as error:
        result.write(out)
    assert str(error.value).startswith(f"out_dir={out!r}: {why}")
    assert list(tmp_path.iterdir()) == []


def test_a_model_name_too_long_for_a_file_is_refused_as_the_model():
    """`--model` with a 300-character name was refused in a line naming kvsim's presets folder
    (`.../kvsim/model/presets/models/aaa...json: File name too long`), not the model given."""
    name = "a" * 300
    message = one_line_exit_2(["capacity", "--model", name])
    assert message.startswith(f"model={name!r}: not a preset (")
    assert message.endswith(") nor a file (File name too long)")


@pytest.mark.parametrize(("engine", "message"), [
    ("{tensor_parallel_size: 3}", "replicas[1]: tensor_parallel_size=3: must divide llama-3.1-8b's 32 attention heads"),
    ("{kv_cache_memory_bytes: 1}", "replicas[1]: engine.kv_cache_memory_bytes=1: a KV pool of 1 B holds no block of "),
], ids=["tp", "kv-bytes"])
def test_a_replica_group_the_gpu_cannot_hold_is_refused_naming_the_group(tmp_path, engine, message):
    """Its other settings named the group (`replicas[1]: engine.max_num_seqs=0: ...`); these named a setting the
    scenario's own engine section does not hold."""
    out = tmp_path / "out"
    assert one_line_exit_2([*RUN, *_set(f"replicas=[{{count: 1}}, {{engine: {engine}}}]"), "-o", str(out)]
                           ).startswith(message)
    assert not out.exists()


def test_a_rate_past_the_largest_float_is_one_line_in_a_process_of_its_own(tmp_path):
    """Run as a user runs it: numpy's 'RuntimeWarning: overflow encountered in accumulate' (two lines) came
    before the error, which CliRunner does not show."""
    import os
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "kvsim", "run", *_set("workload.num_requests=6",
                                                                       "workload.arrival={process: constant, rate: 1e-310}"),
                           "-o", str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "default"})
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "kvsim: error: workload.arrival.rate=1e-310: request 1 of 6 would arrive at inf s (past the largest float); "
        "give a larger rate or fewer requests"], done.stderr
    assert not out.exists()


@pytest.mark.parametrize("config", ["folder", "loop"])
def test_a_model_folder_whose_config_json_is_not_a_file_says_so(tmp_path, config):
    """A folder holding a config.json folder (or a config.json link to itself) was refused as 'a folder without
    a config.json', which it is not."""
    folder = tmp_path / "m"
    folder.mkdir()
    if config == "folder":
        (folder / "config.json").mkdir()
    else:
        (folder / "config.json").symlink_to(folder / "config.json")
    message = one_line_exit_2(["capacity", "--model", str(folder)])
    assert message.startswith(f"model={str(folder)!r}: not a preset (")
    assert message.endswith(") nor a file (a folder whose config.json is not a file)")


def test_a_draft_model_folder_without_config_json_is_refused(tmp_path):
    import json

    (tmp_path / "draft").mkdir()
    out = tmp_path / "out"
    spec = {"method": "draft_model", "model": str(tmp_path / "draft"), "num_speculative_tokens": 2,
            "acceptance_rates": 0.8}
    message = one_line_exit_2([*RUN, "--speculative-config", json.dumps(spec), "-o", str(out)])
    assert message.startswith(f"engine.speculative_config: model={str(tmp_path / 'draft')!r}: not a preset (")
    assert message.endswith(") nor a file (a folder without a config.json)")
    assert not out.exists()
