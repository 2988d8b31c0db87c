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



def test_a_bad_no_worker_timeout_is_refused_before_any_cluster_or_folder(tmp_path, monkeypatch):
    """The searches read it at their first wait: `kvsim plan --workers 2` started its LocalCluster, made its
    folder, then stopped with Dask's traceback of the cluster torn down above the error line."""
    from conftest import one_line_exit_2  # tests/ is on sys.path

    from kvsim.planning.search import NO_WORKERS_TIMEOUT_ENV

    monkeypatch.setenv(NO_WORKERS_TIMEOUT_ENV, "soon")
    out = tmp_path / "plan"
    assert one_line_exit_2(["plan", "--gpu", "h100-80gb", "--workers", "2", "--slo", "ttft_s.p90=2",
                            "-o", str(out)]) == f"{NO_WORKERS_TIMEOUT_ENV}='soon': expected a positive number of seconds"
    assert not out.exists()

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


def whole_point() -> dict:
    """A point's metrics as `kvsim.planning.point.point_metrics` makes them (a 100-request run judged stable),
    written out field by field from `window_evidence`'s docstring, not read from a run."""
    stats = {"n": 63, "mean": 0.04, "p50": 0.03, "p50_ci": [0.02, 0.04], "p90": 0.09, "p90_ci": [0.07, 0.12],
             "p99": 0.12, "p99_ci": [0.1, 0.12]}
    evidence = {"num_requests": 100, "num_rejected": 0, "rejected_fraction": 0.0, "verdict": "stable",
                "window_start_s": 11.5, "window_s": 40.3, "num_in_window": 63, "offered_per_s": 1.57,
                "served_per_s": 1.64, "served_over_offered": 1.05, "backlog_trend": -0.008,
                "backlog_trend_low": -0.027, "backlog_end": 4, "early_overload": None, "mean_service_s": 1.34,
                "mean_running": 2.55, "output_tokens_per_s": 385.5,
                **{metric: dict(stats) for metric in ("ttft_s", "tpot_s", "e2e_s", "queue_s")}}
    return {"num_replicas": 1, "num_gpus": 1, "num_requests": 100, "num_finished": 100, "num_rejected": 0,
            "duration_s": 59.8, "requests_per_s": 1.67, "output_tokens_per_s": 396.0, "num_preemptions": 0,
            "kv_cache_usage_mean": 0.008, "prefix_cache_hit_rate": 0.0, "offered_rate_per_s": 1.72,
            "evidence": evidence, "work": {"busy_replica_s": 56.6, "recomputed_tokens": 0}}


def damaged(path: tuple[str, ...], value) -> dict:
    """`whole_point()` with the field at `path` set to `value` (`...`: the field removed)."""
    point = whole_point()
    *parents, last = path
    section = point
    for key in parents:
        section = section[key]
    if value is ...:
        del section[last]
    else:
        section[last] = value
    return point


@pytest.mark.parametrize(("path", "value", "problem"), [
    (("evidence", "ttft_s", "p90"), "abc", "evidence.ttft_s.p90='abc': Input should be a valid number"),  # ValueError
    (("evidence", "ttft_s", "p90"), -5, "evidence.ttft_s.p90=-5: Input should be greater than or equal to 0"),  # met
    (("evidence", "ttft_s", "p90"), float("nan"), "evidence.ttft_s.p90=nan: Input should be a finite number"),
    (("evidence", "ttft_s", "p90"), True, "evidence.ttft_s.p90=True: Input should be a valid number"),
    (("evidence", "ttft_s"), ..., "evidence.ttft_s: required field is missing"),  # KeyError
    (("evidence", "verdict"), ..., "evidence.verdict: required field is missing"),  # KeyError
    (("evidence", "verdict"), "fine", "evidence.verdict='fine': Input should be 'stable', "),  # "is fine" as a failure
    (("evidence", "ttft_s", "p90_ci"), [0.1], "evidence.ttft_s.p90_ci=[0.1]: List should have at least 2 items"),
    (("evidence", "num_requests"), "100", "evidence.num_requests='100': Input should be a valid integer"),
    (("work", "busy_replica_s"), "x", "work.busy_replica_s='x': Input should be a valid number"),
    (("offered_rate_per_s",), None, "offered_rate_per_s=None: Input should be a valid number"),  # a TypeError
    (("offered_rate_per_s",), float("nan"), "offered_rate_per_s=nan: Input should be greater than or equal to 0"),
])
def test_a_point_no_run_makes_is_named_by_its_field(path, value, problem):
    """`point_problem` finds what a resumed plan read as a point: a ValueError, KeyError or TypeError traceback
    deep in the search, or a verdict on a value no run makes (a negative p90 met every SLO)."""
    from kvsim.planning.point import point_problem

    assert point_problem(whole_point()) is None
    found = point_problem(damaged(path, value))
    assert found is not None and found.startswith(problem), found


def test_a_stalled_point_is_a_whole_point():
    """A run that stalled is a point with no values (`stalled_metrics`): a resumed plan reuses it."""
    from test_plan import toy  # tests/ is on sys.path

    from kvsim.planning.point import point_problem, stalled_metrics

    assert point_problem(stalled_metrics(toy(), "held KV")) is None


def test_a_stalled_point_of_traffic_arriving_at_one_instant_is_a_whole_point():
    """`stalled_metrics` takes the rate its traffic offered from `plan_rate.offered_rate_per_s`: (n − 1) / span,
    inf where the span is 0 (one request here; so for any traffic whose requests all arrive at once). The check
    refused that inf ("Input should be a finite number") as a value no run makes, so a resumed plan simulated
    such a point again every time; as points.jsonl holds it (JSON's Infinity) it is a whole point."""
    import math

    from test_plan import toy  # tests/ is on sys.path

    from kvsim.planning.point import point_problem, stalled_metrics
    from kvsim.workload.scenario import make_scenario

    raw = toy().model_dump(mode="json")
    raw["workload"]["num_requests"] = 1
    metrics = json.loads(json.dumps(stalled_metrics(make_scenario(raw), "held KV")))
    assert metrics["offered_rate_per_s"] == math.inf and point_problem(metrics) is None


def test_point_store_skips_a_damaged_point_and_says_which_line_until_it_is_replaced(tmp_path):
    from kvsim.planning.point import point_problem

    path = tmp_path / "points.jsonl"
    path.write_text("\n".join(json.dumps({"hash": key, "name": key, "format": 4, "metrics": metrics})
                              for key, metrics in [("a", whole_point()), ("b", damaged(("evidence", "verdict"), 3)),
                                                   ("c", damaged(("work",), {}))]) + "\n")
    store = PointStore(path, required=("evidence", "work"), point_format=4, problem=point_problem)
    assert set(store.points) == {"a"} and set(store.damaged) == {"b", "c"}
    assert store.damaged_text() == (f"{path}: line 2: evidence.verdict=3: Input should be 'stable', 'backlogged', "
                                    "'overloaded', 'no servable requests', 'stalled' or 'too short': not a point kvsim "
                                    "wrote (and 1 more damaged point); will be simulated again, not reused")
    store.add("b", "b", whole_point())
    store.add("c", "c", whole_point())
    again = PointStore(path, required=("evidence", "work"), point_format=4, problem=point_problem)
    assert set(again.points) == {"a", "b", "c"} and again.damaged_text() is None


def test_a_plan_resumed_from_a_damaged_point_simulates_it_again(tmp_path):
    """The point the plan needs is on file with a p90 of 'abc': the plan stopped with a ValueError traceback
    (`float('abc')` in `slo_values`). It now says so in one warning and simulates the point."""
    from test_plan import toy  # tests/ is on sys.path

    from kvsim.planning.plan import make_plan_spec, plan
    from kvsim.planning.point import POINT_FORMAT
    from kvsim.planning.search import scenario_hash
    from kvsim.planning.spec import candidates
    from kvsim.results.output_dir import claim_directory

    workload = toy().workload  # at 2 req/s one replica of the toy meets the SLO in one 100-request run
    base = toy().model_copy(update={"workload": workload.model_copy(
        update={"arrival": workload.arrival.model_copy(update={"rate": 2.0})})})
    spec = make_plan_spec({"slo": {"ttft_s.p90": 0.3}, "gpus": ["h100-80gb"], "max_replicas": 1, "verify_factor": 0})
    key = scenario_hash(candidates(spec)[0].scenario(base, 1, spec.router))
    point = damaged(("evidence", "ttft_s", "p90"), "abc")
    line = json.dumps({"hash": key, "name": "x", "format": POINT_FORMAT, "metrics": point})
    folder = claim_directory(tmp_path / "plan", "plan", ["points.jsonl"])  # a plan folder, its points damaged
    (folder / "points.jsonl").write_text(line + "\n")
    notes: list[str] = []
    rows, simulated = plan(base, spec, folder, on_note=notes.append)
    assert simulated == 1 and rows[0]["replicas"] == 1
    assert notes == [f"{folder / 'points.jsonl'}: line 1: evidence.ttft_s.p90='abc': Input should be a valid "
                     "number: not a point kvsim wrote; will be simulated again, not reused"]


@pytest.mark.parametrize(("make", "problem"), [(lambda path: __import__("os").mkfifo(path), "not a regular file (a FIFO)"),
                                               (lambda path: path.mkdir(), "is a directory, not a points file (JSON lines)")])
def test_a_points_jsonl_that_is_no_file_is_refused_unread(tmp_path, make, problem):
    """A FIFO in a plan folder's points.jsonl blocked the resumed plan's read for good; a folder there was refused
    as "--output=...: cannot write there (Is a directory)", naming the plan's folder, not what is wrong in it."""
    from kvsim.model.errors import KvsimError

    make(tmp_path / "points.jsonl")
    with pytest.raises(KvsimError) as refused:
        PointStore(tmp_path / "points.jsonl", required=("evidence",))
    assert str(refused.value) == f"{tmp_path / 'points.jsonl'}: {problem}"
