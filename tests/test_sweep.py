"""Sweeps give the same results in-process, over local processes and on a Dask cluster."""

import pytest

from kvsim.model.errors import KvsimError
from kvsim.planning.sweep import run_many
from kvsim.report.studies import variant
from kvsim.workload.scenario import load_scenario


def scenarios():
    base = load_scenario(None, ["workload.num_requests=40"])
    return [variant(base, f"workload.arrival.rate={rate}") for rate in (5, 50)]


def test_local_processes_match_in_process():
    serial = run_many(scenarios(), workers=1)
    parallel = run_many(scenarios(), workers=2, keep_steps=True)
    assert [r.summary for r in serial] == [r.summary for r in parallel]
    assert serial[0].steps is None and parallel[0].steps is not None


def test_dask_cluster_matches_in_process():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        on_dask = run_many(scenarios(), dask_address=cluster.scheduler_address)
    assert [r.summary for r in on_dask] == [r.summary for r in run_many(scenarios(), workers=1)]


def test_dask_missing_is_a_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_dask(name, *args, **kwargs):
        if name.startswith("dask"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(KvsimError, match="pip install"):
        run_many(scenarios(), dask_address="tcp://127.0.0.1:1")


def _sigint_handler_name() -> str:
    import signal

    return str(signal.getsignal(signal.SIGINT))


def _sigterm_handler_name() -> str:
    import signal

    return str(signal.getsignal(signal.SIGTERM))


def _sighup_handler_name() -> str:
    import signal

    return str(signal.getsignal(signal.SIGHUP))


def test_worker_processes_leave_a_ctrl_c_to_the_parent():
    """A terminal's Ctrl-C reaches every process of its group; workers ignore it, so only the parent
    prints its one line (no traceback per worker). Pool workers through their initializer; a
    LocalCluster's because they start with SIGINT and SIGHUP ignored."""
    import signal
    from concurrent.futures import ProcessPoolExecutor

    from kvsim.cli.interrupts import _on_signal
    from kvsim.planning.search import close_client, dask_client
    from kvsim.planning.sweep import worker_signals

    previous = signal.signal(signal.SIGTERM, _on_signal)  # the CLI's: a forked worker's is the system's again
    previous_hup = signal.signal(signal.SIGHUP, _on_signal)  # the CLI's: the terminal's hang-up is the parent's
    try:
        with ProcessPoolExecutor(max_workers=1, initializer=worker_signals) as pool:
            assert pool.submit(_sigint_handler_name).result() == str(signal.SIG_IGN)
            assert pool.submit(_sighup_handler_name).result() == str(signal.SIG_IGN)
            assert pool.submit(_sigterm_handler_name).result() == str(signal.SIG_DFL)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGHUP, previous_hup)
    pytest.importorskip("dask.distributed")
    before = signal.getsignal(signal.SIGINT)
    previous_hup = signal.signal(signal.SIGHUP, _on_signal)  # as the CLI has it (`kvsim.cli.interrupts.install`)
    try:
        client = dask_client(None, 1)
        try:
            assert list(client.run(_sigint_handler_name).values()) == [str(signal.SIG_IGN)]
            # a worker spawned with the system's default died of the terminal's hang-up
            assert list(client.run(_sighup_handler_name).values()) == [str(signal.SIG_IGN)]
        finally:
            close_client(client)
        assert signal.getsignal(signal.SIGHUP) is _on_signal
    finally:
        signal.signal(signal.SIGHUP, previous_hup)
    assert signal.getsignal(signal.SIGINT) is before  # the parent's own handler is back


def test_run_evidence_gives_one_per_scenario_and_never_drops_a_run(monkeypatch):
    """A rate search zips its probes with their evidence (`kvsim.planning.steady_state.search_rates`): each of the
    two runs of 40 requests has its window evidence, counting those 40, and a run without evidence (which
    `_run_one` never returns when asked for it) is raised, not left out."""
    import kvsim.planning.sweep as sweep

    evidence = sweep.run_evidence(scenarios(), workers=1)
    assert [ev["num_requests"] for ev in evidence] == [40, 40]
    monkeypatch.setattr(sweep, "_run_one", lambda job: sweep.SweepResult({}, None, None))
    with pytest.raises(RuntimeError, match="without its evidence"):
        sweep.run_evidence(scenarios(), workers=1)
