"""Per-class SLOs in `kvsim plan` (`METRIC.STAT@PRIORITY`): judged over one priority's requests in the
steady-state window; bad syntax or a class the workload lacks is one line, exit 2, nothing written.

Expected values are worked out by hand from the hand-built tables below, never from kvsim's output.
"""

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.model.errors import KvsimError
from kvsim.planning.slo import parse_slo_key, probe_passes, slo_values
from kvsim.planning.spec import check_slo_classes, make_plan_spec
from kvsim.planning.verify import evidence_columns
from kvsim.planning.window import STABLE, window_evidence
from kvsim.workload.scenario import resolve_scenario

runner = CliRunner()
MIX = {"classes": [{"name": "chat", "priority": 0, "weight": 1}, {"name": "batch", "priority": 1, "weight": 1}]}


def two_classes(with_priority=True):
    """1 req/s for 1000 s, even ids priority 0 with TTFT 0.2 s, odd ids priority 1 with TTFT 1.0 s; every
    request done 0.5 s after it arrives (stable). Over the window: p90 of class 0 is 0.2, of class 1 is 1.0,
    and of everyone 1.0 (half the sample is 1.0, so the 90th percentile is)."""
    n = 1000
    arrival = np.arange(float(n))
    priority = np.arange(n) % 2
    ttft = np.where(priority == 0, 0.2, 1.0)
    table = {"arrival_s": arrival, "finish_s": arrival + 1.5, "first_scheduled_s": arrival + 1.0,
             "first_token_s": arrival + ttft, "status": np.array(["finished"] * n, dtype=object),
             "ttft_s": ttft, "tpot_s": np.full(n, 0.01), "e2e_s": np.full(n, 1.5), "queue_s": np.zeros(n),
             "output_tokens": np.full(n, 10), "num_samples": np.ones(n, int)}
    if with_priority:
        table["priority"] = priority
    return table


def test_a_class_slo_is_judged_over_that_class_only():
    ev = window_evidence(two_classes())
    assert ev["verdict"] == STABLE
    values = slo_values(ev, {"ttft_s.p90@0": 0.5, "ttft_s.p90@1": 0.5, "ttft_s.p90": 0.5})
    assert values == {"ttft_s.p90@0": pytest.approx(0.2), "ttft_s.p90@1": pytest.approx(1.0),
                      "ttft_s.p90": pytest.approx(1.0)}
    assert probe_passes(ev, {"ttft_s.p90@0": 0.5})  # the interactive class meets its SLO ...
    assert not probe_passes(ev, {"ttft_s.p90@0": 0.5, "ttft_s.p90@1": 0.5})  # ... the batch class does not
    assert probe_passes(ev, {"ttft_s.p90@0": 0.5, "ttft_s.p90@1": 2.0})
    # each class holds half the window's requests
    assert ev["by_priority"]["0"]["ttft_s"]["n"] + ev["by_priority"]["1"]["ttft_s"]["n"] == ev["num_in_window"]
    assert abs(ev["by_priority"]["0"]["ttft_s"]["n"] - ev["by_priority"]["1"]["ttft_s"]["n"]) <= 1


def test_class_columns_carry_value_and_interval():
    ev = window_evidence(two_classes())
    cols = evidence_columns(ev, {"ttft_s.p90@1": 2.0, "e2e_s.mean@0": 2.0})
    assert cols["ttft_s.p90@1"] == pytest.approx(1.0) and cols["ttft_s.p90@1_ci"] == "1–1"
    assert cols["e2e_s.mean@0"] == pytest.approx(1.5) and "e2e_s.mean@0_ci" not in cols


def test_a_class_with_no_request_in_the_window_misses_and_a_run_without_priorities_is_class_zero():
    ev = window_evidence(two_classes())
    assert slo_values(ev, {"ttft_s.p90@7": 1.0}) == {"ttft_s.p90@7": math.inf}
    assert evidence_columns(ev, {"ttft_s.p90@7": 1.0})["ttft_s.p90@7_ci"] is None
    plain = window_evidence(two_classes(with_priority=False))  # no column: every request has priority 0
    assert "by_priority" not in plain
    assert slo_values(plain, {"ttft_s.p90@0": 1.0})["ttft_s.p90@0"] == pytest.approx(1.0)
    assert slo_values(plain, {"ttft_s.p90@1": 1.0})["ttft_s.p90@1"] == math.inf


def test_a_fleet_table_with_missing_priorities_counts_them_as_priority_zero():
    table = two_classes()
    table["priority"] = np.where(table["priority"] == 0, np.nan, 1.0)  # a replica without the column
    ev = window_evidence(table)
    assert set(ev["by_priority"]) == {"0", "1"}
    assert ev["by_priority"]["0"]["ttft_s"]["p90"] == pytest.approx(0.2)


@pytest.mark.parametrize(("key", "parsed"), [("ttft_s.p90", ("ttft_s", "p90", None)),
                                             ("tpot_s.p99@1", ("tpot_s", "p99", 1)),
                                             ("e2e_s.mean@-2", ("e2e_s", "mean", -2))])
def test_slo_keys_parse(key, parsed):
    assert parse_slo_key(key) == parsed


@pytest.mark.parametrize(("key", "needle"), [("ttft_s.p90@chat", "integer request priority, got 'chat'"),
                                             ("ttft_s.p95@0", "METRIC.STAT@PRIORITY"),
                                             ("ttft_s@0", "METRIC.STAT@PRIORITY"),
                                             ("ttft_s.p90@", "got ''")])
def test_bad_slo_keys_are_refused_naming_the_key(key, needle):
    with pytest.raises(KvsimError, match="plan") as info:
        make_plan_spec({"slo": {key: 1.0}, "gpus": ["h100-80gb"]})
    assert needle in str(info.value) and key in str(info.value)


def test_an_slo_for_a_class_the_workload_lacks_is_refused():
    mixed = resolve_scenario(None, {"workload.priority": MIX})
    check_slo_classes(mixed, make_plan_spec({"slo": {"ttft_s.p90@1": 1.0, "ttft_s.p90@0": 1.0},
                                             "gpus": ["h100-80gb"]}))
    with pytest.raises(KvsimError, match=r"slo ttft_s.p90@2: no request of this workload has priority 2 "
                                         r"\(workload.priority classes: chat=0, batch=1\)"):
        check_slo_classes(mixed, make_plan_spec({"slo": {"ttft_s.p90@2": 1.0}, "gpus": ["h100-80gb"]}))
    plain = resolve_scenario(None, {})
    check_slo_classes(plain, make_plan_spec({"slo": {"ttft_s.p90@0": 1.0}, "gpus": ["h100-80gb"]}))
    with pytest.raises(KvsimError, match="none: every request has priority 0"):
        check_slo_classes(plain, make_plan_spec({"slo": {"ttft_s.p90@1": 1.0}, "gpus": ["h100-80gb"]}))


@pytest.mark.parametrize(("slo", "needle"), [("ttft_s.p90@chat=1", "ttft_s.p90@chat"),
                                             ("ttft_s.p90@3=1", "priority 3")])
def test_cli_refuses_a_bad_class_slo_in_one_line(tmp_path, slo, needle):
    out = tmp_path / "plan"
    result = runner.invoke(app, ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", slo, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()


def test_plan_sizes_a_fleet_for_the_interactive_class_alone(tmp_path):
    """With priority scheduling class 0 jumps the queue: near saturation (11.5 req/s on the toy, whose replica
    serves about 8 / 1.3 s ≈ 6 req/s, so 2 replicas run at ~95 %) its TTFT p90 meets a limit with fewer
    replicas than the same limit over every request, or over class 1, needs. The row names the class's value."""
    from kvsim.planning.plan import plan
    from tests.test_plan import toy

    base = resolve_scenario(toy(), {"workload.priority": MIX, "engine.scheduling_policy": "priority",
                                    "workload.arrival.rate": 11.5})
    rows = {}
    # one plan folder for the three SLOs: a point is a function of its scenario, so each plan reuses the probes an
    # earlier one ran (as `kvsim plan -o` on its own folder) and ranks the rows separate folders give
    for key in ("ttft_s.p90@0", "ttft_s.p90@1", "ttft_s.p90"):
        spec = make_plan_spec({"slo": {key: 0.3}, "gpus": ["h100-80gb"], "max_replicas": 8, "verify_factor": 0})
        (rows[key],) = plan(base, spec, tmp_path / "plan")[0]
    assert all(row["feasible"] for row in rows.values())
    assert rows["ttft_s.p90@0"]["replicas"] < rows["ttft_s.p90@1"]["replicas"]
    assert rows["ttft_s.p90@0"]["replicas"] < rows["ttft_s.p90"]["replicas"]
    assert rows["ttft_s.p90@0"]["ttft_s.p90@0"] <= 0.3 and "ttft_s.p90@0_ci" in rows["ttft_s.p90@0"]
