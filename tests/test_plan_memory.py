"""`kvsim plan --memory-limit`: every point is memory-estimated first, and the limit bounds the search.

The bound below is derived by hand from `kvsim.results.budget`'s floor for the toy fleet of
`tests/test_plan.py` (100 requests, 64-token replies, max_num_seqs 8, 400 GPU blocks, scheduler v1: no CPU
swap pool, as vLLM v1 never swaps and ignores --swap-space), with R requests a probe:

    requests  160 B · R                    steps (kept in memory)  160 B · R · 64 / 8
    per replica  400 · 4 · 8 B + (400 − 257) · 28 B + 100,000 B = 116,804 B
                 (4 list slots a GPU block, an int object for each block id past CPython's small ints 0-256)

so n replicas fit under L bytes when 160·R·(1 + 8) + 116,804·n ≤ L. The limits below are under 1 MiB, so
the rows state sizes in KiB (one decimal, thousands separated).
"""

import json
import math

import pytest
from test_plan import SLO, toy  # tests/ is on sys.path
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.planning.plan import make_plan_spec, plan

runner = CliRunner()
PER_REPLICA_BYTES = 400 * 4 * 8 + (400 - 257) * 28 + 100_000


def kib(num_bytes):
    return f"{num_bytes / 2**10:,.1f} KiB"


def fits(limit_bytes, num_requests):
    """The most replicas whose floor fits under the limit (the formula above)."""
    return math.floor((limit_bytes - 160 * num_requests * (1 + 64 // 8)) / PER_REPLICA_BYTES)


def spec(limit_bytes=None):
    raw = {"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8, "gpu_hourly_cost": {"h100-80gb": 2.0}}
    return make_plan_spec({**raw, "memory_limit_bytes": limit_bytes} if limit_bytes else raw)


@pytest.fixture(scope="module")
def free_answer(tmp_path_factory):
    """(replicas, requests a probe) of the toy's plan without a limit, which both replica-search tests bound;
    planned once for the module (a plan is a function of its inputs)."""
    (row,), _ = plan(toy(), spec(), tmp_path_factory.mktemp("free") / "plan")
    return row["replicas"], row["requests_per_probe"]


def test_the_limit_bounds_the_replica_search_and_is_said(tmp_path, free_answer):
    needed, run_length = free_answer
    limit = 900_000  # R = 400: 576,000 B of requests and steps, then room for 2 replicas (809,608 B), not 3
    cap = fits(limit, run_length)
    assert PER_REPLICA_BYTES == 116_804 and cap == 2 < needed  # the limit stops the search below the answer
    rows, simulated = plan(toy(), spec(limit), tmp_path / "bounded")
    row = rows[0]
    assert not row["feasible"] and row["memory_limited"] and row["replicas"] is None
    assert row["memory_bound_replicas"] == cap and row["requests_per_probe"] == run_length
    over = 160 * run_length * 9 + PER_REPLICA_BYTES * (cap + 1)  # 3 replicas: 926,412 B = 904.7 KiB
    assert row["limiting_factor"].endswith(f"even at {cap} replicas; {cap + 1} replicas would need "
                                           f"{kib(over)} > limit {kib(limit)}; answer bounded by memory")
    lines = [json.loads(line) for line in (tmp_path / "bounded" / "points.jsonl").read_text().splitlines()]
    simulated_counts = [int(p["name"].rsplit("/x", 1)[1]) for p in lines if "evidence" in p["metrics"]]
    assert len(simulated_counts) == simulated and max(simulated_counts) <= cap  # no point over the bound ran
    notes = [p for p in lines if "evidence" not in p["metrics"]]
    assert [(n["name"].rsplit("/x", 1)[1], n["metrics"]["verdict"]) for n in notes] == [(str(cap + 1),
                                                                                         "memory_limited")]
    assert notes[0]["metrics"]["memory_limit_bytes"] == limit
    again, simulated_again = plan(toy(), spec(limit), tmp_path / "bounded")  # resumes; the note is not doubled
    assert simulated_again == 0 and again == rows
    assert len((tmp_path / "bounded" / "points.jsonl").read_text().splitlines()) == len(lines)


def test_a_limit_above_the_answer_changes_nothing_but_can_skip_the_long_verification(tmp_path, free_answer):
    needed, run_length = free_answer
    limit = 160 * run_length * 9 + PER_REPLICA_BYTES * needed  # exactly the answer's floor
    assert fits(limit, run_length) == needed
    rows, _ = plan(toy(), spec(limit), tmp_path / "bounded")
    row = rows[0]
    assert row["feasible"] and row["replicas"] == needed and not row["memory_limited"]
    # the 10x verification run (10 · R requests) has a larger floor: it is skipped and said so
    assert row["verified"] is None and f"the {10 * run_length}-request verification run would need" in \
        row["verify_memory"]


def test_plan_command_prints_the_memory_bound(tmp_path):
    scenario = tmp_path / "toy.yaml"
    scenario.write_text(json.dumps(toy().model_dump(mode="json")))
    result = runner.invoke(app, ["plan", str(scenario), "--slo", "ttft_s.p90=0.3", "--slo", "e2e_s.p99=2",
                                 "--gpu", "h100-80gb", "--max-replicas", "8", "--workers", "1",
                                 "--memory-limit", "900000", "-o", str(tmp_path / "plan")])
    assert result.exit_code == 0, result.output
    assert "memory: h100-80gb tp1: " in result.stdout and "answer bounded by memory" in result.stdout


def test_the_limit_bounds_the_rate_search_fleet(tmp_path):
    """`--search rate`: the fleet the rate gives must fit on the whole traffic (R = 100 requests), and a
    probe's run (one replica: 9 · 160 B · n + 116,804 B) doubles from 100 requests only while it fits."""
    base = toy()
    raw = {"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8, "search": "rate", "rel_tol": 0.02,
           "verify_factor": 0}
    free, _ = plan(base, make_plan_spec(raw), tmp_path / "free")
    needed = free[0]["replicas"]
    limit = 160 * 100 * 9 + PER_REPLICA_BYTES * (needed - 1) + 1000  # one replica short of the answer
    assert needed > 1 and fits(limit, 100) == needed - 1
    longest = 100
    while 2 * longest <= 32_000 and 9 * 160 * 2 * longest + PER_REPLICA_BYTES <= limit:
        longest *= 2
    rows, _ = plan(base, make_plan_spec({**raw, "memory_limit_bytes": limit}), tmp_path / "bounded")
    row = rows[0]
    assert not row["feasible"] and row["memory_limited"] and row["memory_bound_replicas"] == needed - 1
    over = 160 * 100 * 9 + PER_REPLICA_BYTES * needed
    assert 2**10 <= limit < 2**20 and row["limiting_factor"].startswith(
        f"over {needed - 1} replicas ({needed} replicas would need {kib(over)} > limit {kib(limit)}; answer bounded "
        "by memory); ")
    assert row["requests_per_probe"] is None or row["requests_per_probe"] <= longest
