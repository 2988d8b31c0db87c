"""Adaptive searches over simulated points, run on Dask futures, with a store that survives crashes.

    store = PointStore(out_dir / "points.jsonl")
    run_searches(searches, evaluate, store, client)     # client: a dask.distributed.Client, or None

A *search* proposes one scenario at a time (`next_scenario()`), learns its metrics
(`observe(metrics)`) and proposes the next, or None when it is done (e.g. a bisection on
replica count). Many searches run at once: each has at most one point in flight, submitted
as a Dask future; `as_completed` hands back whichever finishes first, and its search
proposes its next point. Dask does all the scheduling, retries a task whose worker died
(`distributed.scheduler.allowed-failures`), and `client=None` runs points in this process.

Every finished point is appended to the store at once (one JSON line, flushed and fsynced),
keyed by the hash of its scenario, so a crash or a killed worker loses no finished point and
a rerun takes stored points instead of simulating them again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

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
    """Finished points as JSON lines `{"hash", "name", "metrics"}`; a torn last line is ignored."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.points: dict[str, Metrics] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    row = json.loads(line)
                    self.points[row["hash"]] = row["metrics"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut short by a crash: that point is simply not done

    def __contains__(self, key: str) -> bool:
        return key in self.points

    def add(self, key: str, name: str, metrics: Metrics) -> None:
        self.points[key] = metrics
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps({"hash": key, "name": name, "metrics": metrics}) + "\n")
            f.flush()
            os.fsync(f.fileno())


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
    from dask.distributed import as_completed

    in_flight: dict[Any, tuple[Search, str, Scenario]] = {}
    queue = as_completed()
    for search in searches:
        if (submitted := advance(search)) is not None:
            in_flight[submitted[0]] = (search, submitted[1], submitted[2])
            queue.add(submitted[0])
    for future in queue:
        search, key, scenario = in_flight.pop(future)
        record(key, scenario, future.result(), search, fresh=True)
        if (submitted := advance(search)) is not None:
            in_flight[submitted[0]] = (search, submitted[1], submitted[2])
            queue.add(submitted[0])
    return simulated


def dask_client(address: str | None, workers: int | None) -> Any:
    """A client of the cluster at `address`, or of a new LocalCluster of `workers` processes.

    Close it with `close_client`, which also stops a LocalCluster it started.
    """
    from kvsim.model.errors import KvsimError

    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise KvsimError("the search runs on Dask: pip install -e '.[dist]' (or --workers 1 to run here)") from None
    if address:
        try:
            return Client(address, timeout=10)
        except (OSError, TimeoutError) as error:
            raise KvsimError(f"dask_address={address!r}: cannot connect ({error})") from None
    from kvsim.planning.sweep import sigint_ignored

    # A Ctrl-C is the parent's to report, in one line: the workers ignore SIGINT, and log only errors
    # (not a warning per task cancelled when the parent stops them).
    saved = os.environ.get(WORKER_LOG_LEVEL)
    os.environ[WORKER_LOG_LEVEL] = "error"  # read by each worker process as it starts
    try:
        with sigint_ignored():
            cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
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
