"""Sweep 19: input handling left by earlier sweeps (one line naming the field and value, exit 2, nothing written)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import benchmark_script, one_line_exit_2  # tests/ is on sys.path
from pydantic import ValidationError

from kvsim.model.errors import KvsimError
from kvsim.results.output_dir import output_directory
from kvsim.workload.traces import TraceColumns, read_lengths, read_mooncake
from kvsim.workload.traffic import PriorityClass

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
BENCHES = ("allocators", "disagg", "fleet", "scale", "simulator", "speedup", "startup", "vidur")


def _bench(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(BENCHMARKS / f"bench_{name}.py"), *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.mark.parametrize("name", BENCHES)
def test_a_bench_refuses_to_overwrite_a_file_it_did_not_write(tmp_path, name):
    """`bench_*.py --output notes.json` replaced any file; now only an earlier result of the same bench (a JSON
    object of its keys), refused before the bench runs (each exits in about its import time here)."""
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": 1}\n')
    done = _bench(name, "--output", str(mine))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "notes.json" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"bench_{name}.py: error: ")
    assert mine.read_text() == '{"mine": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json"]


@pytest.mark.parametrize("name", BENCHES)
def test_a_bench_may_replace_its_committed_result(name):
    """The committed benchmarks/results/NAME.json is a JSON object of exactly the keys the bench writes, so
    re-running the bench with its default --output replaces it (the keys are read from the committed file)."""
    module = benchmark_script(f"bench_{name}")
    committed = json.loads((BENCHMARKS / "results" / f"{name}.json").read_text())
    assert frozenset(committed) == module.RESULT_KEYS


def test_a_run_over_validates_sim_folder_names_the_workload_as_validates(tmp_path):
    """`kvsim run V/sim/scenario.yaml -o V/sim` (repeating a validation in place) is refused, since the run would
    replace sim/ and delete the replayed workload.jsonl its scenario reads; the refusal said that file was one
    "kvsim did not write", when validate wrote it (its marker lists sim/workload.jsonl)."""
    out = tmp_path / "V"
    with output_directory(out, "validation") as tmp:  # as write_validation lays out V
        with output_directory(tmp / "sim", "run") as sim:
            (sim / "summary.json").write_text("{}\n")
        (tmp / "sim" / "workload.jsonl").write_text("{}\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    line = one_line_exit_2(["run", "--set", "workload.num_requests=2", "-o", str(out / "sim")])
    assert line == (f"--output={str(out / 'sim')!r}: holds 'workload.jsonl', which belongs to the kvsim validation "
                    f"output around it ({str(out)!r}), not to 'run' output: replacing the folder would delete it "
                    "(choose a new path)")
    assert "did not write" not in line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_strangers_file_in_a_run_inside_a_kvsim_output_is_still_one_kvsim_did_not_write(tmp_path):
    """Only a file the enclosing output's marker lists is named as that output's: a user's notes are not."""
    out = tmp_path / "V"
    with output_directory(out, "validation") as tmp, output_directory(tmp / "sim", "run") as sim:
        (sim / "summary.json").write_text("{}\n")
    (out / "sim" / "notes.md").write_text("mine\n")
    line = one_line_exit_2(["run", "--set", "workload.num_requests=2", "-o", str(out / "sim")])
    assert line.endswith("holds 'notes.md', which kvsim did not write; kvsim only replaces output it wrote itself "
                         "(choose a new path)")
    assert (out / "sim" / "notes.md").read_text() == "mine\n"


@pytest.mark.parametrize(("cell", "priority"), [("1.0", 1), ("-2.00", -2), (" +3.0 ", 3), ("4", 4)])
def test_a_trace_priority_of_an_integral_float_is_read_as_the_yaml_class_reads_it(tmp_path, cell, priority):
    """`workload.priority.classes[].priority: 1.0` is 1 (pydantic's lax int, as every integer of the scenario),
    while a trace's priority column refused 1.0 as "not an integer": one scenario, two rules. The column now
    reads an integral float (a CSV cell, a JSON number) as the integer it is, as pydantic does."""
    table = tmp_path / "l.csv"
    table.write_text(f"num_prefill_tokens,num_decode_tokens,prio\n10,5,{cell}\n")
    assert [r.priority for r in read_lengths(table, TraceColumns(priority="prio"))] == [priority]
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text(json.dumps({"timestamp": 0, "input_length": 16, "output_length": 4, "hash_ids": [0],
                                 "prio": float(priority)}) + "\n")
    assert read_mooncake(jsonl, TraceColumns(priority="prio"))[0].priority == priority
    assert PriorityClass(name="c", priority=float(priority), weight=1).priority == priority  # the YAML side
    assert PriorityClass(name="c", priority=cell, weight=1).priority == priority


# "\u0661" (ARABIC-INDIC DIGIT ONE) and "\uff11" (FULLWIDTH DIGIT ONE): Python's int() and re's \\d read them as 1,
# pydantic's int does not (nor does a CSV of integers anyone means), so the column refused them neither
@pytest.mark.parametrize("cell", ["1.5", "1.", "1e0", "1_0", "true", ".0", "\u0661", "-\uff11", "\u0661.0"])
def test_a_trace_priority_that_is_no_integer_is_still_refused_as_the_yaml_class_refuses_it(tmp_path, cell):
    table = tmp_path / "l.csv"
    table.write_text(f"num_prefill_tokens,num_decode_tokens,prio\n10,5,{cell}\n")
    with pytest.raises(KvsimError, match=re.escape(f"l.csv:2: priority column prio={cell!r} is not an integer")):
        read_lengths(table, TraceColumns(priority="prio"))
    with pytest.raises(ValidationError):
        PriorityClass(name="c", priority=cell, weight=1)


AUTOSCALED = ["run", "--set", "workload.num_requests=2", "--set", "replicas=1",
              "--set", "autoscaler={min_replicas: 1, max_replicas: 2, target: 1}"]


@pytest.mark.parametrize(("router", "named"), [
    ([], "router.policy=round_robin (the default): an autoscaled fleet routes by load (set router.policy to "
         "least_outstanding or least_kv); round_robin takes the replicas in turn, blind to their load"),
    (["--set", "router.policy=round_robin"], "router.policy=round_robin: an autoscaled fleet routes by load"),
    (["--set", "router.policy=affinity"], "router.policy=affinity: an autoscaled fleet routes by load (set "
     "router.policy to least_outstanding or least_kv); affinity's memory of which replica holds a prefix is not "
     "kept across scaling"),
])
def test_an_autoscaler_behind_a_router_that_is_not_by_load_names_that_router(tmp_path, router, named):
    """An autoscaled fleet with the default round_robin router was refused with "affinity's memory of replicas is
    not kept across scaling": true of affinity only, and it did not say the policy was the default one."""
    out = tmp_path / "out"
    line = one_line_exit_2([*AUTOSCALED, *router, "-o", str(out)])
    assert line.startswith(named)
    assert ("affinity" in line) == ("affinity" in " ".join(router))
    assert not out.exists()


def test_priority_classes_under_fcfs_are_accepted_and_order_nothing_as_vllm_v1():
    """vLLM v1 does not refuse a non-zero priority under FCFS (its processor passes `priority` to the
    EngineCoreRequest unchecked; `create_request_queue(FCFS)` is a deque that never reads it): the refusal
    "Got priority N but Priority scheduling is not enabled" is v0's engine. So kvsim runs such a scenario, and
    every request's timings are those of the same scenario without classes (the class draw comes after every
    other draw, so lengths and arrivals are the same)."""
    import kvsim

    workload = {"num_requests": 40, "arrival": {"process": "poisson", "rate": 50.0},
                "prompt_len": {"dist": "fixed", "value": 256}, "output_len": {"dist": "fixed", "value": 64}}
    base = {"steps": "none", "engine": {"max_num_seqs": 4}, "workload": workload}
    classes = {"classes": [{"name": "a", "priority": 0, "weight": 1}, {"name": "b", "priority": 3, "weight": 1}]}
    plain = kvsim.simulate(base).requests
    marked = kvsim.simulate({**base, "workload": {**base["workload"], "priority": classes}}).requests
    assert set(marked["priority"]) == {0, 3}
    shared = [c for c in plain.columns if c != "priority"]
    assert marked[shared].equals(plain[shared])
    served = kvsim.simulate({**base, "engine": {"max_num_seqs": 4, "scheduling_policy": "priority"},
                             "workload": {**base["workload"], "priority": classes}}).requests
    assert not served["ttft_s"].equals(plain["ttft_s"])  # a queue forms: under `priority` the classes reorder it
