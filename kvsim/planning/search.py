"""Adaptive searches over simulated points, run on Dask futures, with a store that survives crashes.

    store = PointStore(out_dir / "points.jsonl")
    run_searches(searches, evaluate, store, client)     # client: a dask.distributed.Client, or None

A *search* proposes one scenario at a time (`next_scenario()`), learns its metrics
(`observe(metrics)`) and proposes the next, or None when it is done (e.g. a bisection on
replica count). Many searches run at once: each has at most one point in flight, submitted
as a Dask future; ``wait(..., FIRST_COMPLETED)` hands back whichever finishes first, and its search
proposes its next point. Dask does all the scheduling, retries a task whose worker died
(`distributed.scheduler.allowed-failures`), and `client=None` runs points in this process. A
cluster left with no worker for a minute (`KVSIM_DASK_NO_WORKERS_TIMEOUT_S` sets the seconds) is
reported (`KvsimError`), not waited on forever.

Every finished point is appended to the store at once (one JSON line, flushed and fsynced),
keyed by the hash of its scenario, so a crash or a killed worker loses no finished point and
a rerun takes stored points instead of simulating them again. Each line carries the store's `point_format`
(what the metrics mean): a point of another format (an older kvsim's), or one whose metrics the store's `problem`
refuses (a damaged or hand-edited line), is simulated again, never reused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kvsim.model.errors import KvsimError, cut, not_a_file
from kvsim.model.units import counted
from kvsim.model.yaml_io import load_json

if TYPE_CHECKING:
    from kvsim.workload.scenario import Scenario

Metrics = dict[str, Any]
OnPoint = Callable[[int, int, int, int], None]  # (points finished, of which simulated in this run,
#                                                 searches still open, searches)


class Search(Protocol):
    def next_scenario(self) -> Scenario | None: ...

    def observe(self, metrics: Metrics) -> None: ...


def scenario_hash(scenario: Scenario) -> str:
    """A stable key for a scenario: its validated fields and the folder its relative paths start from."""
    raw = {"scenario": scenario.model_dump(mode="json"), "base_dir": str(Path(scenario.base_dir).resolve())}
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:20]


class PointStore:
    """Finished points as JSON lines `{"hash", "name", "format", "metrics"}`, read and written line-atomically.

    A line that is not a whole point (cut short by a crash, not UTF-8, not JSON, or without the metric
    keys `required` names, as points from an older kvsim) is skipped, so that point is simulated again;
    the hashes of whole lines without those keys (a plan's memory-limited notes) are in `other_keys`.
    A point that `problem` finds fault with (a value no run makes: a hand edit, a damaged or foreign file;
    `problem` returns one line naming the field and value, or None) is skipped too, and `damaged` holds the
    hashes of those with no whole line, each with its line number and problem (`damaged_text` says so).
    A point whose `format` is not `point_format` (a line without one is format 0: written before points
    carried it) is stale: its metrics were computed by another kvsim, so it is simulated again too, and
    `stale` holds the hashes of those with no current line (`stale_text` says so in one line); a `format` that
    is no integer (`"4"`, `true`) is no kvsim's: the point is damaged.
    Each point is appended with one `write` of a whole line; a file whose last line was torn gets a
    newline first, so the new point never joins the torn one.
    """

    def __init__(self, path: str | Path, required: tuple[str, ...] = (), point_format: int = 0,
                 problem: Callable[[Metrics], str | None] | None = None) -> None:
        self.path = Path(path)
        self.points: dict[str, Metrics] = {}
        self.other_keys: set[str] = set()
        self.required = required
        self.point_format = point_format
        self.stale: dict[str, int] = {}  # hash → the format of a stale point with no current line
        self.damaged: dict[str, tuple[int, str]] = {}  # hash → (line number, problem) of a point skipped as damaged
        # a FIFO in its place blocked the read for good, a folder was "cannot write there (Is a directory)"
        if problem_text := not_a_file(self.path, missing="", file_kind="a points file (JSON lines)"):
            raise KvsimError(f"{self.path}: {problem_text}")
        if self.path.exists():
            for number, raw in enumerate(self.path.read_bytes().split(b"\n"), start=1):
                row = self._parse(raw)
                if row is None:
                    continue
                key, metrics, fmt = row
                if any(not isinstance(metrics.get(k), dict) for k in self.required):
                    self.other_keys.add(key)
                elif not isinstance(fmt, int) or isinstance(fmt, bool):  # no kvsim writes it: was "format -1"
                    self.damaged.setdefault(key, (number, f"format={cut(json.dumps(fmt))} is not a point format "
                                                          "(an integer)"))
                elif fmt != point_format:
                    self.stale[key] = fmt
                elif problem is not None and (fault := problem(metrics)) is not None:
                    self.damaged.setdefault(key, (number, fault))
                else:
                    self.points[key] = metrics
        for key in self.points:
            self.stale.pop(key, None)
            self.damaged.pop(key, None)

    def damaged_text(self) -> str | None:
        """One line on the damaged points a run simulates again, naming the first (None: there are none)."""
        if not self.damaged:
            return None
        number, fault = min(self.damaged.values())
        more = f" (and {counted(len(self.damaged) - 1, 'more damaged point')})" if len(self.damaged) > 1 else ""
        return (f"{self.path}: line {number}: {fault}: not a point kvsim wrote{more}; "
                "will be simulated again, not reused")

    def stale_text(self) -> str | None:
        """One line on the stale points a run simulates again (None: there are none)."""
        if not self.stale:
            return None
        formats = ", ".join(str(fmt) for fmt in sorted(set(self.stale.values())))
        return (f"{self.path}: {counted(len(self.stale), 'point')} of point format {formats}, "
                f"written by another kvsim (this one writes format {self.point_format}), "
                "will be simulated again, not reused")

    @staticmethod
    def _parse(raw: bytes) -> tuple[str, Metrics, Any] | None:
        try:
            row = load_json(raw.decode("utf-8"))
        except ValueError:  # not UTF-8, not JSON, nested too deeply (json.loads: a RecursionError), a key twice
            return None
        if not isinstance(row, dict) or not isinstance(row.get("hash"), str) or not isinstance(row.get("metrics"),
                                                                                              dict):
            return None
        return row["hash"], row["metrics"], row.get("format", 0)

    def __contains__(self, key: str) -> bool:
        return key in self.points

    def add(self, key: str, name: str, metrics: Metrics) -> None:
        self.points[key] = metrics
        self.stale.pop(key, None)
        self.damaged.pop(key, None)
        self._append(key, name, metrics)

    def note(self, key: str, name: str, metrics: Metrics) -> None:
        """A line that is not a point (no `required` keys): written once per key, never read back as one."""
        if key not in self.other_keys:
            self.other_keys.add(key)
            self._append(key, name, metrics)

    def _append(self, key: str, name: str, metrics: Metrics) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps({"hash": key, "name": name, "format": self.point_format, "metrics": metrics})
                + "\n").encode()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # the last line was torn: end it before this point
            os.write(fd, line)
            os.fsync(fd)
        except OSError as error:  # a full disk: `write` names no file, so the error could not say whose it was
            raise OSError(error.errno, error.strerror, str(self.path)) from None
        finally:
            os.close(fd)


def run_searches(searches: Sequence[Search], evaluate: Callable[[Scenario], Metrics], store: PointStore,
                 client: Any = None, on_point: OnPoint | None = None) -> int:
    """Drive every search to its end; returns how many points were simulated (not taken from the store)."""
    finished = simulated = 0
    num_open = len(searches)

    def record(key: str, scenario: Scenario, metrics: Metrics, search: Search, fresh: bool) -> None:
        nonlocal finished, simulated
        if fresh:
            store.add(key, scenario.name, metrics)
            simulated += 1
        finished += 1
        search.observe(metrics)
        if on_point is not None:
            on_point(finished, simulated, num_open, len(searches))

    def advance(search: Search) -> tuple[Any, str, Scenario] | None:
        """Feed the search stored points until it needs a new one; submit that (or run it here)."""
        nonlocal num_open
        while (scenario := search.next_scenario()) is not None:
            key = scenario_hash(scenario)
            if key in store:
                record(key, scenario, store.points[key], search, fresh=False)
            elif client is None:
                record(key, scenario, evaluate(scenario), search, fresh=True)
            else:
                return client.submit(evaluate, scenario, key=f"kvsim-point-{key}"), key, scenario
        num_open -= 1
        return None

    if client is None:
        for search in searches:
            advance(search)
        return simulated
    in_flight: dict[Any, tuple[Search, str, Scenario]] = {}
    for search in searches:
        if (submitted := advance(search)) is not None:
            in_flight[submitted[0]] = (search, submitted[1], submitted[2])
    while in_flight:
        for future in _finished(list(in_flight), client):
            search, key, scenario = in_flight.pop(future)
            record(key, scenario, future.result(), search, fresh=True)
            if (submitted := advance(search)) is not None:
                in_flight[submitted[0]] = (search, submitted[1], submitted[2])
    return simulated


NO_WORKERS_TIMEOUT_S = 60.0  # a cluster with no worker for this long cannot finish a point
NO_WORKERS_TIMEOUT_ENV = "KVSIM_DASK_NO_WORKERS_TIMEOUT_S"  # replaces it (seconds, positive)


def no_workers_timeout_s() -> float:
    """NO_WORKERS_TIMEOUT_S, or the positive number of seconds the environment's NO_WORKERS_TIMEOUT_ENV gives."""
    from kvsim.model.units import read_number

    text = os.environ.get(NO_WORKERS_TIMEOUT_ENV)
    if text is None:
        return NO_WORKERS_TIMEOUT_S
    try:
        value = read_number(text, float)  # not `1_0`, which float() reads as 10
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise KvsimError(f"{NO_WORKERS_TIMEOUT_ENV}={text!r}: expected a positive number of seconds")
    return value


def _finished(futures: list[Any], client: Any) -> list[Any]:
    """The futures that have finished, as soon as one has (in submission order); a `KvsimError` once the
    cluster has had no worker for `no_workers_timeout_s()` (its only worker died, say), never a silent wait."""
    import time

    from dask.distributed import wait

    timeout_s = no_workers_timeout_s()
    poll_s = min(5.0, timeout_s / 4)
    idle_since: float | None = None
    while True:
        try:
            done, _ = wait(futures, timeout=poll_s, return_when="FIRST_COMPLETED")
        except TimeoutError:
            done = set()
        if done:
            return [f for f in futures if f in done]
        if client.scheduler_info().get("workers"):
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > timeout_s:
            raise KvsimError(f"dask cluster {client.scheduler.address}: no worker for {timeout_s:g} s "
                             "(they died or never joined); the finished points are kept in points.jsonl")


def dask_client(address: str | None, workers: int | None) -> Any:
    """A client of the cluster at `address`, or of a new LocalCluster of `workers` processes.

    Close it with `close_client`, which also stops a LocalCluster it started. A bad NO_WORKERS_TIMEOUT_ENV,
    which the searches read, is refused first: it stopped `kvsim plan` at its first wait, its folder made and
    Dask's traceback of the cluster torn down under the error line.
    """

    no_workers_timeout_s()
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise KvsimError("the search runs on Dask: pip install -e '.[dist]' (or --workers 1 to run here)") from None
    from kvsim.planning.sweep import connect_dask, interrupts_ignored

    if address:
        return connect_dask(address)

    # A Ctrl-C or a hang-up is the parent's to report, in one line: the workers ignore SIGINT and SIGHUP, and log
    # only errors (not a warning per task cancelled when the parent stops them).
    saved = os.environ.get(WORKER_LOG_LEVEL)
    os.environ[WORKER_LOG_LEVEL] = "error"  # read by each worker process as it starts
    try:
        with interrupts_ignored():
            # ":0": the scheduler's HTTP server on a free port (None still takes 8787, and a second plan on the
            # machine then warns that the port is in use)
            cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1, processes=True,
                                   dashboard_address=":0")
    finally:
        if saved is None:
            os.environ.pop(WORKER_LOG_LEVEL)
        else:
            os.environ[WORKER_LOG_LEVEL] = saved
    return Client(cluster)


WORKER_LOG_LEVEL = "DASK_LOGGING__DISTRIBUTED"  # dask's config key logging.distributed, as an environment variable


def close_client(client: Any) -> None:
    """Close a client from `dask_client`, and the LocalCluster it started (an external cluster stays up).
    Dask's shutdown warnings ("worker process still alive, killing") are held back: noise, not news."""
    import logging

    cluster = getattr(client, "cluster", None)
    logger = logging.getLogger("distributed")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        client.close()
        if cluster is not None:
            cluster.close()
    finally:
        logger.setLevel(level)
