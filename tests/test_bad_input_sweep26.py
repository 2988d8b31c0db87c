"""Bad input found by the twenty-sixth sweep (the notebook API, `kvsim plan` under a memory limit, fleets, the
environment). Each is refused (the CLI: exit 2, one line naming the field and the value, nothing written; the
Python API: a `KvsimError`), or said as it is.

Found: an assignment to a loaded scenario or one of its sections (`scenario.seed = 5`, `scenario.engine.block_size
= -1`) raised pydantic's multi-line ValidationError, no `KvsimError`. A plan row whose evidence was a probe that
offers no rate (a burst at t=0 that the memory bound kept a rate search's probes from doubling past) made
`answer_floor` a floor of infinite replicas, an OverflowError at `ceil(inf)` after the whole search. A standard
output that cannot be written (`kvsim run > /dev/full`) was an OSError traceback after the run's files were
written. A fleet's affinity router ran without a word where no replica caches prefixes (now a warning line). The
notebooks' planning helpers: `plan(base, spec, out_dir)` given a path, a dict of the spec's fields or no folder, the
SLO readers (`probe_passes`, `why_failed`, `missed_within_noise`) given no evidence or a list for the SLO, and
`window_evidence` given the RunResult itself stopped with an AttributeError, TypeError or KeyError; `run_many` of one
Scenario named its first field as `scenarios[0]`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys

import pytest

from kvsim.model.errors import KvsimError


@pytest.mark.parametrize(("section", "field", "value"), [
    ("", "seed", 5),
    ("engine", "block_size", -1),
    ("workload", "num_requests", 10),
    ("", "bogus", 1),  # not a field at all: refused the same way, never kept
])
def test_an_assignment_to_a_scenario_is_one_kvsim_error_line(section, field, value):
    """A section is frozen once validated; pydantic refused an assignment with its multi-line ValidationError
    ("1 validation error for Scenario / seed / Instance is frozen [type=frozen_instance, ...]")."""
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario()
    target = getattr(scenario, section) if section else scenario
    before = getattr(target, field, None)
    with pytest.raises(KvsimError) as error:
        setattr(target, field, value)
    text = str(error.value)
    assert "\n" not in text and text.startswith(f"{field}={value}: ") and ".model_copy(update=" in text
    assert getattr(target, field, None) == before


def test_a_scenario_still_copies_with_a_change():
    """The way the error names: a copy with the change, the original untouched."""
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario()
    assert (scenario.model_copy(update={"seed": 5}).seed, scenario.seed) == (5, 0)


def _burst_then_steady(tmp_path):
    """A Mooncake trace of 64 requests of 100 + 10 tokens: 4 at t=0, then one every 200 ms to 12 s."""
    from kvsim.workload.scenario import load_scenario

    times_ms = [0, 0, 0, 0, *range(200, 12_001, 200)]
    rows = [{"timestamp": t, "input_length": 100, "output_length": 10, "hash_ids": [i]} for i, t in enumerate(times_ms)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    (tmp_path / "s.yaml").write_text(
        f"name: burst\nworkload:\n  num_requests: {len(rows)}\n  arrival: {{process: trace}}\n"
        "  trace: {format: mooncake, path: t.jsonl}\n", encoding="utf-8")
    return load_scenario(tmp_path / "s.yaml")


def test_the_floor_of_a_probe_that_offers_no_rate_is_the_plans_traffics(tmp_path):
    """A rate search's first probe is the trace's first `probe_requests` = 4, all at t=0; it doubles while a probe
    is too short to judge, but only while the doubled probe fits the memory limit. Stopped at 4, the row's
    evidence (`requests_per_probe` 4) spans no time: (4 − 1) / 0 s, an infinite rate, and `answer_floor` gave a
    floor of infinite replicas (`ReplicaFloor.replicas` is an OverflowError). The floor is then of the plan's whole
    traffic, which `check_traffic_rate` saw offer a rate: 64 requests over 12 s, (64 − 1) / 12 = 5.25 req/s."""
    from kvsim.planning.plan import answer_floor, candidates
    from kvsim.planning.spec import make_plan_spec

    base = _burst_then_steady(tmp_path)
    spec = make_plan_spec({"slo": {"ttft_s.p90": 2}, "gpus": ["h100-80gb"], "search": "rate", "probe_requests": 4})
    shape = next(iter(candidates(spec)))
    floor, gap = answer_floor(base, shape, spec, {"replicas": None, "requests_per_probe": 4}, None)
    assert floor.rate_per_s == pytest.approx(5.25) and floor.num_requests == 64
    assert floor.replicas == 1 and gap == {}  # 5.25 req/s of 110-token requests: a fraction of one H100


def test_the_floor_of_a_probe_with_a_rate_is_still_the_probes(tmp_path):
    """A probe that spans time keeps its own floor: the first 8 requests, 4 at 0 and 4 at 0.2 .. 0.8 s, offer
    (8 − 1) / 0.8 s = 8.75 req/s."""
    from kvsim.planning.plan import answer_floor, candidates
    from kvsim.planning.spec import make_plan_spec

    base = _burst_then_steady(tmp_path)
    spec = make_plan_spec({"slo": {"ttft_s.p90": 2}, "gpus": ["h100-80gb"], "search": "rate", "probe_requests": 4})
    floor, _ = answer_floor(base, next(iter(candidates(spec))), spec, {"replicas": None, "requests_per_probe": 8}, None)
    assert floor.rate_per_s == pytest.approx(8.75) and floor.num_requests == 8


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_standard_output_that_cannot_be_written_is_one_line(monkeypatch, capsys):
    """`kvsim run > /dev/full`: the run's files were written, then printing its table raised OSError (ENOSPC), a
    traceback of 50 lines, exit 1. `unwritable_stdout` (around every command) says it in one line, exit 2."""
    import typer

    from kvsim.cli.stdout import unwritable_stdout

    full = open("/dev/full", "w", encoding="utf-8")  # noqa: SIM115  (closed below)
    monkeypatch.setattr(sys, "stdout", full)
    try:
        with pytest.raises(typer.Exit) as stop, unwritable_stdout():
            print("x" * 10_000, flush=True)
    finally:
        with contextlib.suppress(OSError):  # the line it could not write is still in its buffer
            full.close()
    assert stop.value.exit_code == 2
    assert capsys.readouterr().err == "kvsim: error: standard output: No space left on device\n"
    assert sys.stdout is not full and sys.stdout.name == os.devnull  # Python's flush at exit cannot fail again
    sys.stdout.close()


@pytest.mark.parametrize("error", [OSError(errno.EPIPE, "Broken pipe"), OSError(errno.ENOSPC, "No space left on device")])
def test_other_os_errors_pass_through(error):
    """A closed pipe stays click's (exit 1, no word, as `head`'s writers); an OSError while stdout writes fine (a
    file's) is not said to be stdout's."""
    from kvsim.cli.stdout import unwritable_stdout

    with pytest.raises(OSError) as raised, unwritable_stdout():
        raise error
    assert raised.value is error



@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_command_whose_stdout_is_full_says_so_in_one_line():
    """The whole command (a process: CliRunner captures stdout in memory): `kvsim capacity > /dev/full`, one line
    on stderr, exit 2, where it was an OSError traceback, exit 1."""
    import subprocess

    with open("/dev/full", "w", encoding="utf-8") as full:
        done = subprocess.run([sys.executable, "-m", "kvsim", "capacity", "--context-lengths", "1024"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (2, "kvsim: error: standard output: No space left on device\n")


AFFINITY_LINE = ("router.policy=affinity has no prefix to follow: no replica caches prefixes "
                 "(engine.enable_prefix_caching=false without an engine.kv_offload tier, or a slab allocator), so no "
                 "routed prompt finds its prefix cached; least_outstanding balances the load")


@pytest.mark.parametrize(("overrides", "said"), [
    (["engine.enable_prefix_caching=false"], True),
    (["engine.allocator=slab-max"], True),  # a slab pool caches nothing, prefix caching on or off
    (["engine.scheduler=v0"], True),  # v0's default: caching off, as vLLM's
    (["replicas.0.engine.enable_prefix_caching=false"], False),  # the other group caches: affinity finds it
    ([], False),
    (["engine.enable_prefix_caching=false", "router.policy=least_outstanding"], False),
    # a replica's CPU tier keeps prefixes with caching off (vLLM's --no-enable-prefix-caching + offloading
    # connector): a prompt routed after its prefix loads it from there; a tier of 0 bytes is no tier
    (["engine.enable_prefix_caching=false", "engine.kv_offload={cpu_bytes: 4GiB}"], False),
    (["engine.enable_prefix_caching=false", "engine.kv_offload={cpu_bytes: 0}"], True),
])
def test_an_affinity_router_without_a_prefix_cache_is_said(overrides, said):
    """`router.policy=affinity` sends a prompt to the replica its prefix was last sent to, for that replica's
    cached blocks; with no replica caching prefixes it ran without a word, routing prompts by prefixes no replica
    holds (lab-5's system prompt, 40 requests on 2 replicas: 37 routed by "affinity", none a hit)."""
    from kvsim.fleet.run import unread_by_setting
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario(None, ["replicas=[{count: 1}, {count: 1}]", "router.policy=affinity", *overrides])
    assert (unread_by_setting(scenario).get("router.policy") == AFFINITY_LINE) is said
    assert said or "router.policy" not in unread_by_setting(scenario)


def test_the_cli_says_it_in_one_warning_line_and_runs(tmp_path):
    """`kvsim run` warns once and runs as before (the route table and results unchanged: a warning only)."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--set", "workload.num_requests=4", "--set", "replicas=2", "--set",
                                      "router.policy=affinity", "--set", "engine.enable_prefix_caching=false",
                                      "-o", str(out)], prog_name="kvsim")
    assert result.exit_code == 0, result.output
    assert [line for line in result.stderr.splitlines() if "warning" in line] == [f"kvsim: warning: {AFFINITY_LINE}"]
    assert (out / "routes.csv").is_file()


def _tiny():
    from kvsim.workload.scenario import load_scenario

    return load_scenario(None, ["workload.num_requests=4"])


@pytest.mark.parametrize(("arguments", "message"), [
    (("x.yaml", "spec", "out"), "base='x.yaml': expected a Scenario"),  # an AttributeError ('str' ... 'replicas')
    ((None, {"slo": {"ttft_s.p90": 2}}, "out"), "spec={'slo': {'ttft_s.p90': 2}}: expected a PlanSpec"),
    ((None, "spec", None), "out_dir=None: expected the folder"),  # a TypeError from pathlib
    ((None, "spec", 5), "out_dir=5: expected the folder"),
    ((None, "spec", " "), "out_dir=' ': expected the folder"),
])
def test_the_plan_function_refuses_what_it_cannot_plan_before_any_point(tmp_path, monkeypatch, arguments, message):
    """`kvsim.planning.plan.plan(base, spec, out_dir)` (the fleet-sizing notebook's call) given a path, a dict of
    the spec's fields or no folder stopped deep inside with an AttributeError or TypeError."""
    from kvsim.planning.plan import plan
    from kvsim.planning.spec import make_plan_spec

    monkeypatch.chdir(tmp_path)
    spec = make_plan_spec({"slo": {"ttft_s.p90": 2}, "gpus": ["h100-80gb"]})
    base, given_spec, out_dir = arguments
    with pytest.raises(KvsimError) as error:
        plan(_tiny() if base is None else base, spec if given_spec == "spec" else given_spec, out_dir)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("reader", "arguments", "message"), [
    ("probe_passes", (None, {"ttft_s.p90": 2}), "evidence=None: expected a run's window evidence"),
    ("probe_passes", ({}, {"ttft_s.p90": 2}), "evidence={}: expected a run's window evidence"),  # a KeyError
    ("why_failed", ({"num_requests": 3}, {"ttft_s.p90": 2}), "evidence={'num_requests': 3}: expected"),
    ("missed_within_noise", ([1], {"ttft_s.p90": 2}), "evidence=[1]: expected a run's window evidence"),
    ("probe_passes", ({"verdict": "stable"}, ["ttft_s.p90"]), "slo=['ttft_s.p90']: expected a mapping of SLO keys"),
])
def test_the_slo_readers_name_what_is_no_evidence_or_slo(reader, arguments, message):
    """A TypeError ('NoneType' object is not subscriptable), a KeyError ('verdict') or an AttributeError ('list'
    object has no attribute 'items') from a notebook's slip: the evidence or the SLO swapped or left out."""
    from kvsim.planning import slo

    with pytest.raises(KvsimError) as error:
        getattr(slo, reader)(*arguments)
    assert str(error.value).startswith(message)


def test_window_evidence_names_a_value_that_is_no_table():
    """`window_evidence(result)` (the RunResult, not its `requests`) and `window_evidence(None)` raised a TypeError
    ("argument of type 'RunResult' is not iterable")."""
    import kvsim
    from kvsim.planning.window import window_evidence

    result = kvsim.simulate(_tiny())
    for value, shown_as in ((None, "None"), (result, "RunResult(")):
        with pytest.raises(KvsimError, match=r"^requests=") as error:
            window_evidence(value)
        assert shown_as in str(error.value) and str(error.value).endswith(
            ": expected a run's requests table (RunResult.requests)")


def test_run_many_of_one_scenario_says_to_give_a_list():
    """A Scenario iterates its fields (pydantic), so `run_many(scenario)` was refused as
    `scenarios[0]=('name', 'default')`, a value the user never wrote."""
    from kvsim.planning.sweep import run_evidence, run_many

    for function in (run_many, run_evidence):
        with pytest.raises(KvsimError, match=r"^scenarios=Scenario\(name='default'.*: expected a list of Scenarios "
                                             r"\(one scenario: \[scenario\]\)$"):
            function(_tiny(), workers=1)
