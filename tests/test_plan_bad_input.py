"""`kvsim plan` refuses bad input in one line, exit 2, with nothing written; its point store survives damage."""

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.planning.search import PointStore

runner = CliRunner()
BASE = ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=2"]


@pytest.mark.parametrize(("extra", "needle"), [
    (["--slo", "tpot_s.p90=inf"], "finite"),  # another key: the same one twice is refused as such
    (["--slo", "tpot_s.p90=nan"], "finite"),
    (["-tp", "3"], "tensor_parallel_size=3"),
    (["--engine", "tensor_parallel_size=2"], "--tensor-parallel-size"),
    (["--engine", "max_num_seqs=[1,"], "--engine max_num_seqs"),
    (["--set", "replicas=2"], "replicas=2"),
    (["--dask-address", "::not an address::", "--workers", "2"], "dask_address"),
])
def test_refused_in_one_line_before_any_folder(tmp_path, extra, needle):
    out = tmp_path / "plan"
    result = runner.invoke(app, [*BASE, *extra, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()


def test_an_unknown_router_is_named_once(tmp_path):
    """The field and its value lead a refusal line once (`plan.router='foo': router='foo': ...` said it twice)."""
    result = runner.invoke(app, [*BASE, "--router", "foo", "-o", str(tmp_path / "plan")])
    assert result.exit_code == 2 and result.stderr.strip() == (
        "kvsim: error: plan.router='foo': expected one of round_robin, least_outstanding, least_kv, affinity")


def test_bad_yaml_spec_is_one_line(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("slo: {ttft_s.p90: [\n")
    out = tmp_path / "plan"
    result = runner.invoke(app, [*BASE, "--spec", str(spec), "-o", str(out)])
    assert result.exit_code == 2 and "not valid YAML" in result.stderr and not out.exists()


@pytest.mark.parametrize(("text", "needle"), [
    ("slo: {ttft_s.p90: true}\n", "plan: slo.ttft_s.p90=true: expected a number, not a boolean"),
    ("slo: {ttft_s.p90: 2}\ngpu_hourly_cost: {h100-80gb: true}\n",
     "plan: gpu_hourly_cost.h100-80gb=true: expected a number, not a boolean"),
    ("slo: {ttft_s.p90: 2}\nmax_replicas: true\n", "max_replicas=true: expected a number, not a boolean"),
    ("slo: {ttft_s.p90: 2}\ntensor_parallel_sizes: [1, true]\n",
     "plan: tensor_parallel_sizes[1]=true: expected a number, not a boolean")])
def test_a_boolean_slo_or_price_in_a_spec_is_one_line(tmp_path, text, needle):
    """Pydantic's lax mode read `true` as 1: a 1-second SLO, a $1 GPU-hour, one replica nobody asked for, or
    (an item of a list: the base's check had looked at whole values only) a TP size of 1 searched in silence."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    out = tmp_path / "plan"
    result = runner.invoke(app, ["plan", "--gpu", "h100-80gb", "--workers", "1", "--spec", str(spec), "-o", str(out)])
    assert result.exit_code == 2 and needle in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


def test_point_store_skips_corrupt_rows_and_ends_a_torn_line(tmp_path):
    path = tmp_path / "points.jsonl"
    good = {"hash": "a", "name": "x", "metrics": {"evidence": {"verdict": "stable"}}}
    path.write_bytes(b"".join([
        json.dumps(good).encode() + b"\n",
        b"[1, 2]\n", b'{"hash": 3}\n', b'{"hash": "b", "metrics": 5}\n', b"\xff\xfe\n",
        b'{"hash": "g", "metrics": ' + b"9" * 5000 + b"}\n",  # an int too long to convert: a ValueError, not JSON's
        b'{"hash": "c", "metrics": {"old": 1}}\n',  # a point from before the evidence existed
        b'{"hash": "d", "metr',  # torn by a crash
    ]))
    store = PointStore(path, required=("evidence",))
    assert set(store.points) == {"a"}
    store.add("e", "y", {"evidence": {"verdict": "stable"}})
    again = PointStore(path, required=("evidence",))
    assert set(again.points) == {"a", "e"}
    assert path.read_bytes().endswith(b"\n") and path.read_bytes().count(b'"hash": "e"') == 1


def test_points_of_another_format_are_simulated_again_not_reused(tmp_path):
    """A line without a format stamp (written before points carried one) or of another format is stale: not a
    point to reuse, named in one line until a current point of that hash replaces it."""
    path = tmp_path / "points.jsonl"
    old = {"hash": "a", "name": "x", "metrics": {"evidence": {}, "work": {"recomputed_tokens": 7}}}
    path.write_text(json.dumps(old) + "\n" + json.dumps({**old, "hash": "b", "format": 3}) + "\n")
    store = PointStore(path, required=("evidence",), point_format=1)
    assert not store.points and store.stale == {"a": 0, "b": 3}
    assert store.stale_text() == (f"{path}: 2 points of point format 0, 3, written by another kvsim (this one "
                                  "writes format 1), will be simulated again, not reused")
    store.add("a", "x", {"evidence": {}, "work": {"recomputed_tokens": 5}})
    again = PointStore(path, required=("evidence",), point_format=1)
    assert again.points == {"a": {"evidence": {}, "work": {"recomputed_tokens": 5}}} and again.stale == {"b": 3}
    assert "1 point of point format 3" in again.stale_text()
    assert json.loads(path.read_text().splitlines()[-1])["format"] == 1


def test_a_cluster_whose_only_worker_is_gone_is_reported_within_the_timeout(tmp_path, monkeypatch):
    """The cluster's one worker leaves after the first point (and a cluster that never had one): the
    search stops with one line naming the cluster and the timeout, and keeps the finished point."""
    distributed = pytest.importorskip("dask.distributed")
    from test_plan import SLO, toy  # tests/ is on sys.path

    from kvsim.model.errors import KvsimError
    from kvsim.planning.plan import make_plan_spec, plan
    from kvsim.planning.search import NO_WORKERS_TIMEOUT_ENV

    monkeypatch.setenv(NO_WORKERS_TIMEOUT_ENV, "1")
    spec = make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8})
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
        def leave(finished, simulated, *_):
            if simulated == 1:
                cluster.scale(0)

        with pytest.raises(KvsimError, match=r"dask cluster .*: no worker for 1 s \(they died or never joined\)"):
            plan(toy(), spec, tmp_path / "died", client=client, on_point=leave)
    assert len((tmp_path / "died" / "points.jsonl").read_text().splitlines()) == 1
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client, pytest.raises(KvsimError, match="no worker for 1 s"):
        plan(toy(), spec, tmp_path / "never", client=client)


def test_a_bad_no_worker_timeout_is_one_line(monkeypatch):
    from kvsim.model.errors import KvsimError
    from kvsim.planning.search import NO_WORKERS_TIMEOUT_ENV, no_workers_timeout_s

    for text in ("0", "-1", "soon", "inf"):
        monkeypatch.setenv(NO_WORKERS_TIMEOUT_ENV, text)
        with pytest.raises(KvsimError, match=f"{NO_WORKERS_TIMEOUT_ENV}={text!r}: expected a positive number"):
            no_workers_timeout_s()


def test_points_judged_before_the_per_replica_queue_test_are_simulated_again(tmp_path):
    """A fleet's verdict holds each replica's waiting queue to its own margin since 7db66e8 (round robin over
    three 4-slot replicas and a 1-slot one at 1.1× its limit read stable, now backlogged), so a point stored
    before (format 1) may carry a verdict the fleet no longer gets: a resumed plan must not reuse it."""
    from kvsim.planning.plan import POINT_FORMAT

    path = tmp_path / "points.jsonl"
    old = {"hash": "a", "name": "uneven", "format": 1, "metrics": {"evidence": {"verdict": "stable"}, "work": {}}}
    path.write_text(json.dumps(old) + "\n")
    store = PointStore(path, required=("evidence", "work"), point_format=POINT_FORMAT)
    assert not store.points and store.stale == {"a": 1}



def _toy_at_2_per_s():
    """The plan tests' toy at 2 req/s: one replica holds it, stable."""
    from test_plan import toy  # tests/ is on sys.path

    from kvsim.workload.scenario import make_scenario

    raw = toy().model_dump(mode="json")
    raw["workload"]["arrival"]["rate"] = 2.0
    return make_scenario(raw)


def _one_point_plan(tmp_path, on_note=None):
    """A plan of one replica of `_toy_at_2_per_s` with no long run: one stable point, `points.jsonl`'s one line."""
    from kvsim.planning.plan import make_plan_spec, plan

    spec = make_plan_spec({"slo": {"ttft_s.p90": 2.0}, "gpus": ["h100-80gb"], "max_replicas": 1, "verify_factor": 0})
    return plan(_toy_at_2_per_s(), spec, tmp_path, on_note=on_note)


def test_a_point_whose_metrics_are_malformed_is_simulated_again_with_one_line(tmp_path):
    """A points.jsonl line of this kvsim's format was reused as it stood: with its verdict gone `kvsim plan` stopped
    on a KeyError's traceback. Such a line is simulated again, with one line naming it (as a line of another format
    is), and the plan's answer is the undamaged one's; the line written then is whole, and reused."""
    first, simulated = _one_point_plan(tmp_path)
    assert simulated == 1
    points = tmp_path / "points.jsonl"
    row = json.loads(points.read_text())
    del row["metrics"]["evidence"]["verdict"]
    points.write_text(json.dumps(row) + "\n")
    notes: list[str] = []
    again, simulated = _one_point_plan(tmp_path, notes.append)
    assert notes == [f"{points}: 1 point with malformed metrics (line 1: evidence.verdict=None is not a verdict) "
                     "will be simulated again, not reused"]
    assert simulated == 1 and json.dumps(again) == json.dumps(first)
    assert _one_point_plan(tmp_path, notes.append)[1] == 0 and len(notes) == 1


@pytest.fixture(scope="module")
def whole_point():
    from kvsim.planning.plan import Candidate
    from kvsim.planning.point import point_metrics

    return point_metrics(Candidate("h100-80gb", 1).scenario(_toy_at_2_per_s(), 1, "round_robin"))  # as plan's


@pytest.mark.parametrize(("damage", "why"), [
    (lambda m: m["evidence"].update(verdict="fine"), "evidence.verdict='fine' is not a verdict"),
    (lambda m: m["evidence"]["ttft_s"].update(p90="x"), "evidence.ttft_s.p90='x' is not a number"),
    (lambda m: m["evidence"]["tpot_s"].pop("p99"), "evidence.tpot_s.p99 is missing"),
    (lambda m: m["evidence"].update(e2e_s=[1.0]), "evidence.e2e_s=[1.0] is not statistics"),
    (lambda m: m["evidence"].update(num_requests=1.5), "evidence.num_requests=1.5 is not an integer"),
    (lambda m: m["evidence"].update(by_priority={"0": {"queue_s": {"p50": 1.0}}}),
     "evidence.by_priority.0.queue_s.mean is missing"),
    (lambda m: m["evidence"].update(by_priority=[]), "evidence.by_priority=[] is not statistics by priority"),
    (lambda m: m.update(num_preemptions="3"), "num_preemptions='3' is not a number"),
    (lambda m: m.pop("offered_rate_per_s"), "offered_rate_per_s is missing"),
    (lambda m: m["work"].update(busy_replica_s=True), "work.busy_replica_s=True is not a number"),
])
def test_a_malformed_metric_or_slo_field_is_named(whole_point, damage, why):
    """What `point_metrics` made (and a stalled point's metrics) passes; each field the searches read, damaged,
    is named with its value (the summary's and work's figures are numbers or null; an SLO metric's mean and
    percentiles too, over every request and over each priority's)."""
    import copy

    from kvsim.planning.point import point_problem, stalled_metrics

    assert point_problem(whole_point) is None
    assert point_problem(stalled_metrics(_toy_at_2_per_s(), "stalled")) is None
    damaged = copy.deepcopy(whole_point)
    damage(damaged)
    assert point_problem(damaged) == why


def test_the_point_store_names_the_first_malformed_point_and_forgets_one_added_again(tmp_path):
    path = tmp_path / "points.jsonl"
    metrics = {"evidence": {}, "work": {}}
    path.write_text("".join(json.dumps({"hash": key, "name": key, "metrics": metrics}) + "\n" for key in "ab"))
    store = PointStore(path, required=("evidence", "work"), problem=lambda m: "bad")
    assert store.malformed == {"a": (1, "bad"), "b": (2, "bad")} and not store.points
    assert store.malformed_text() == (f"{path}: 2 points with malformed metrics (line 1: bad) will be simulated "
                                      "again, not reused")
    store.add("a", "a", metrics)
    assert store.malformed == {"b": (2, "bad")}
    assert set(PointStore(path, required=("evidence", "work")).points) == {"a", "b"}  # no problem: all reused
