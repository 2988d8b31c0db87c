"""Small defects other helpers noticed (tidy29): each with the behaviour a user (or vLLM) expects.

Found: `kvsim --version >&-` and `kvsim --help >&-` exited 0 without a word (`> /dev/full`: a traceback), where
`kvsim run >&-` says it in one line, exit 2: click answers the group's own options while it parses them, outside
the commands' `unwritable_stdout`, and `--version` alone is answered before the CLI loads (`kvsim.__main__`).
`StudyConfig` (the report's knobs) took any value: `num_requests='x'` was accepted, `load_fractions=()` an
IndexError and `preemption_window_s=0` a ZeroDivisionError mid-report. `kvsim capacity` named an engine field
without its section (`data_parallel_size=0`) where `kvsim run` names it `engine.data_parallel_size=0`. A trace's
acceptance column was refused in a fleet where only some replica groups speculate ("needs
engine.speculative_config"), though one group reads it.
"""

from __future__ import annotations

import errno
import io
import json
import os
import sys

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path

from kvsim.model.errors import KvsimError
from kvsim.report.studies import StudyConfig
from kvsim.workload.scenario import make_scenario


def _exit_status(argv: list[str]) -> int:
    """The status `kvsim ARGV` exits with, run as the console script runs it (`kvsim.__main__.main`)."""
    from kvsim.__main__ import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["kvsim", *argv])
        with pytest.raises(SystemExit) as stop:
            main()
    return int(stop.value.code or 0)


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_the_groups_own_options_say_a_closed_stdout_in_one_line(monkeypatch, capsys, argv):
    """Python sets `sys.stdout` to None when it starts with descriptor 1 closed (`>&-`); the line a write to a
    closed descriptor fails with is EBADF's (os.strerror), exit 2, as `kvsim run >&-` says it."""
    monkeypatch.setattr(sys, "stdout", None)
    assert _exit_status(argv) == 2
    assert capsys.readouterr().err == f"kvsim: error: standard output: {os.strerror(errno.EBADF)}\n"
    sys.stdout.close()  # the null device `unwritable_stdout` put in its place


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_the_groups_own_options_say_a_full_stdout_in_one_line(monkeypatch, capsys, argv):
    """`> /dev/full` refuses every write with ENOSPC: it was a traceback, exit 1."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    # text written through to the descriptor, unbuffered: no refused line is held, to be refused again on close
    with io.TextIOWrapper(open("/dev/full", "wb", buffering=0), encoding="utf-8", write_through=True) as full:
        monkeypatch.setattr(sys, "stdout", full)
        assert _exit_status(argv) == 2
    assert capsys.readouterr().err == f"kvsim: error: standard output: {os.strerror(errno.ENOSPC)}\n"
    sys.stdout.close()


def test_bare_kvsim_with_stdout_closed_prints_its_usage_on_stderr_and_leaves_stdout_closed(monkeypatch, capsys):
    """A bare `kvsim` is a usage error (click: the help on stderr, exit 2) and writes nothing to stdout: it stays
    None, as Python started, so that Python's flush at exit does not fail on a stand-in (exit 120)."""
    monkeypatch.setattr(sys, "stdout", None)
    assert _exit_status([]) == 2
    assert sys.stdout is None
    assert "Usage: " in capsys.readouterr().err


@pytest.mark.parametrize(("fields", "line"), [
    ({"num_requests": "x"}, "num_requests='x': "),
    ({"num_requests": 0}, "num_requests=0: "),  # a report of no requests measures nothing
    ({"num_requests": True}, "num_requests=true: "),  # not 1 (the project's rule for `true` as a number)
    ({"load_fractions": ()}, "load_fractions=(): "),  # the load grid is read from its first fraction
    ({"load_fractions": (0.5, -1.0)}, "load_fractions.1=-1.0: "),  # a rate of -1 x the knee
    ({"ttft_slo_s": float("nan")}, "ttft_slo_s=nan: "),
    ({"usage_alert": 1.5}, "usage_alert=1.5: "),  # kv_cache_usage_perc is a fraction: never above 1
    ({"preemption_window_s": 0}, "preemption_window_s=0: "),  # the alert's rate divides by it
    ({"shared_prefix_counts": ()}, "shared_prefix_counts=(): "),
    ({"workers": 0}, "workers=0: "),
    ({"gpu_hourly_cost": -1.0}, "gpu_hourly_cost=-1.0: "),
    ({"speculation_batch_sizes": (0,)}, "speculation_batch_sizes.0=0: "),  # max_num_seqs=0 serves nothing
    ({"num_request": 5}, "num_request: unknown key (did you mean num_requests?)"),
])
def test_a_bad_study_config_field_is_one_line_naming_it(fields, line):
    with pytest.raises(KvsimError) as refused:
        StudyConfig(**fields)
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)
    with pytest.raises(KvsimError) as copied:  # a changed copy is checked as a new one
        StudyConfig.quick().model_copy(update=fields)
    assert str(copied.value) == str(refused.value)


def test_a_study_config_keeps_its_defaults_and_the_values_given():
    """The defaults the report ran with (they were a dataclass's) and a quick config's, unchanged."""
    assert StudyConfig().num_requests == 200 and StudyConfig().load_fractions[0] == 0.125
    quick = StudyConfig.quick().model_copy(update={"workers": 2, "rate_verify_factor": 0})
    assert (quick.num_requests, quick.workers, quick.rate_verify_factor, quick.offload_loads) == (60, 2, 0, (1.0,))


@pytest.mark.parametrize(("capacity", "run"), [
    (["--data-parallel-size", "0"], ["--set", "engine.data_parallel_size=0"]),
    (["--max-num-seqs", "0"], ["--set", "engine.max_num_seqs=0"]),
    (["--gpu-memory-utilization", "2"], ["--set", "engine.gpu_memory_utilization=2.0"]),
    *[([flag, spec], [flag, spec]) for flag, spec in [
        ("--speculative-config", '{"method": "bogus", "num_speculative_tokens": 2}'),
        ("--speculative-config", '{"method": "ngram"}'),
    ]],
])
def test_capacity_names_an_engine_field_as_run_does(tmp_path, monkeypatch, capacity, run):
    """The same bad engine field, given to `kvsim capacity` as a flag and to `kvsim run` as a flag or a setting:
    one line, the same words (run's always had the `engine.` prefix: the scenario's section)."""
    monkeypatch.chdir(tmp_path)
    said = one_line_exit_2(["capacity", *capacity])
    assert said.startswith("engine.")
    assert said == one_line_exit_2(["run", *run, "--output", "out"])


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": 1}


def _mixed_fleet(tmp_path, engine, groups):
    """Two requests at t = 0 (prompt 16, reply 10; acceptance lengths [4, 1, 3] and [2, 2]) round-robined over
    one replica of each of `groups`, 10 ms a step."""
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 0, "input_length": 16, "output_length": 10, "hash_ids": [i],
                                        "accepted": accepted}) + "\n" for i, accepted in enumerate([[4, 1, 3], [2, 2]])))
    return make_scenario({"name": "mixed", "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 200, **engine},
                          "workload": {"num_requests": 2, "arrival": {"process": "trace"},
                                       "trace": {"format": "mooncake", "path": str(path), "acceptance_column": "accepted"}},
                          "latency": {"model": "constant", "step_s": 0.01},
                          "replicas": groups})


@pytest.mark.parametrize(("engine", "groups"), [
    ({}, [{"engine": {"speculative_config": NGRAM}}, {}]),  # only the first group speculates
    ({"speculative_config": NGRAM}, [{}, {"engine": {"speculative_config": None}}]),  # the second opts out
])
def test_an_acceptance_column_is_read_by_the_groups_that_speculate(tmp_path, engine, groups):
    """Request 0 goes to the speculating replica: prefill (token 1) at 10 ms, verify steps emitting the trace's 4, 1
    and 3 tokens end at 20, 30 and 40 ms, the model's 1 (the trace spent) gives token 10 at 50 ms, as
    tests/test_trace_columns.py works out for one engine. Request 1 goes to the replica without drafts: one token a
    step, 10 steps, 100 ms; its acceptance lengths unread."""
    import kvsim

    result = kvsim.simulate(_mixed_fleet(tmp_path, engine, groups), check=True)
    assert result.requests["finish_s"].tolist() == pytest.approx([0.05, 0.10])


def test_an_acceptance_column_no_group_reads_is_still_refused(tmp_path):
    with pytest.raises(KvsimError) as refused:
        _mixed_fleet(tmp_path, {}, [{}, {"engine": {"max_num_seqs": 8}}])
    assert str(refused.value) == ("workload.trace.acceptance_column='accepted' needs engine.speculative_config (the "
                                  "drafts whose acceptance it gives), in the scenario's engine or a replica group's")
