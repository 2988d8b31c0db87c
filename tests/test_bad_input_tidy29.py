"""Small defects other helpers noticed (tidy29): each with the behaviour a user (or vLLM) expects.

Found: `kvsim --version >&-` and `kvsim --help >&-` exited 0 without a word (`> /dev/full`: a traceback), where
`kvsim run >&-` says it in one line, exit 2: click answers the group's own options while it parses them, outside
the commands' `unwritable_stdout`, and `--version` alone is answered before the CLI loads (`kvsim.__main__`).
`StudyConfig` (the report's knobs) took any value: `num_requests='x'` was accepted, `load_fractions=()` an
IndexError and `preemption_window_s=0` a ZeroDivisionError mid-report. `kvsim capacity` named an engine field
without its section (`data_parallel_size=0`) where `kvsim run` names it `engine.data_parallel_size=0`. A trace's
acceptance column was refused in a fleet where only some replica groups speculate ("needs
engine.speculative_config"), though one group reads it. A router set over a fleet of one replica (`replicas: 1`,
`router.policy: least_kv`; a disaggregated `prefill_router` over one producer) ran without a word.
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


def _default_with(fields):
    """The built-in default scenario, 2 requests, with `fields` (whole sections) replaced."""
    from kvsim.workload.scenario import load_scenario

    return load_scenario(None, {"workload.num_requests": 2, **fields})


LONE = "routes over one replica ({}): every request goes to it, and the router has nothing to choose"


@pytest.mark.parametrize(("fields", "lines"), [
    ({"replicas": 1, "router": {"policy": "least_kv"}}, [f"router.policy=least_kv {LONE.format('replicas=1')}"]),
    ({"replicas": [{"count": 1}], "router": {"policy": "least_outstanding"}},
     [f"router.policy=least_outstanding {LONE.format('replica groups of one replica in all')}"]),
    ({"replicas": 1}, []),  # no router given: the default round robin, nothing set to no effect
    ({"replicas": 2, "router": {"policy": "least_kv"}}, []),
    ({"replicas": 1, "router": {"policy": "least_kv"}, "autoscaler": {"max_replicas": 4}}, []),  # it may scale out
    ({"replicas": [{"count": 1, "kv_role": "kv_producer"}, {"count": 2, "kv_role": "kv_consumer"}],
      "kv_transfer_config": {"prefill_router": {"policy": "least_kv"}, "decode_router": {"policy": "round_robin"}}},
     ["kv_transfer_config.prefill_router.policy=least_kv routes over one prefill instance (one replica with "
      "kv_role=kv_producer): every request goes to it, and the router has nothing to choose"]),
    ({"replicas": [{"count": 1, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}],
      "kv_transfer_config": {}}, []),  # the pools' default routers (disagg-1p1d.yaml's 1P1D)
])
def test_a_router_over_one_replica_is_said(fields, lines):
    from kvsim.fleet.run import lone_routers

    assert lone_routers(_default_with(fields)) == lines


def test_run_and_simulate_say_a_lone_router_and_a_plan_probe_does_not(tmp_path, monkeypatch, caplog):
    """`kvsim run` warns on stderr, `kvsim.simulate` on the `kvsim` logger; `simulate_scenario`, which `kvsim plan`'s
    probes call (kvsim.planning.point, kvsim.planning.sweep) for candidates of one replica too, says nothing."""
    import logging

    from typer.testing import CliRunner

    import kvsim
    from kvsim.cli import app
    from kvsim.fleet.run import simulate_scenario

    monkeypatch.chdir(tmp_path)
    line = f"router.policy=least_kv {LONE.format('replicas=1')}"
    argv = ["run", "--set", "replicas=1", "--set", "router.policy=least_kv", "--set", "workload.num_requests=2"]
    result = CliRunner().invoke(app, [*argv, "-o", "out", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert f"kvsim: warning: {line}" in result.stderr.splitlines()
    scenario = _default_with({"replicas": 1, "router": {"policy": "least_kv"}})
    with caplog.at_level(logging.WARNING, logger="kvsim"):
        simulate_scenario(scenario)
        assert caplog.messages == []
        kvsim.simulate(scenario)
    assert caplog.messages == [line]
