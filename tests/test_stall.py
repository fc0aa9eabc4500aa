"""A fit whose workers Dask has paused for memory stops with an error that says
what to change, instead of waiting for ever (dkernel.engine.stall)."""

from __future__ import annotations

import contextlib
import logging
import os
import time

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

from dkernel import DSGRegressor
from dkernel.engine import WorkersPaused, stall
from dkernel.engine.cluster import workers_info


@pytest.fixture
def fast_watch(monkeypatch):
    monkeypatch.setattr(stall, "_CHECK_SECONDS", 0.3)
    monkeypatch.setattr(stall, "_WARN_SECONDS", 0.5)
    monkeypatch.setattr(stall, "_FAIL_SECONDS", 2.0)


def test_fit_on_paused_workers_raises_with_the_fix(fast_watch, tmp_path):
    from dkernel.data import write_store

    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 3)).astype(np.float32)
    y = X[:, 0].copy()
    store = str(tmp_path / "s.zarr")
    write_store(store, X, y, chunk_rows=250)
    # a pause threshold of 1% of 1 GB: the worker's interpreter alone passes it, so
    # the worker pauses as soon as its memory monitor runs and never resumes -- the
    # state a too-small memory limit leaves a real worker in.  The scheduler waits
    # its connect timeout for a running worker to scatter to: 3 s here.
    with dask.config.set({"distributed.worker.memory.pause": 0.01,
                          "distributed.worker.memory.spill": False,
                          "distributed.worker.memory.target": False,
                          "distributed.comm.timeouts.connect": "3s"}):
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                               memory_limit="1GB", dashboard_address=":0",
                               silence_logs=logging.CRITICAL)
        client = Client(cluster)
    with cluster, client:
        deadline = time.monotonic() + 30
        while not any(w.get("status") == "paused"
                      for w in workers_info(client).values()):
            assert time.monotonic() < deadline, "the worker never paused"
            time.sleep(0.1)
        # a store: the chunk reads are queued on the paused worker
        t0 = time.monotonic()
        with pytest.warns(RuntimeWarning, match="paused for"), \
                pytest.raises(WorkersPaused, match=r"every worker has been paused by Dask's "
                                                   r"memory guard.*MiB memory limit.*"
                                                   r"--memory-limit"):
            # (the rule for a cluster only partly paused also fires, at twice the
            # interval, with another message: a watch that lost this rule passed)
            DSGRegressor(n_features=256, n_epochs=1, client=client).fit(store)
        # stopped by the watch (2 s without progress), not by a test timeout
        assert time.monotonic() - t0 < 20
        # in memory: the scheduler finds no running worker to scatter the rows to
        with pytest.raises(WorkersPaused, match="no running worker could take its data"):
            DSGRegressor(n_features=256, n_epochs=1, client=client).fit(X, y)


def test_wait_running_returns_on_a_running_cluster(client):
    futs = [client.submit(np.add, i, 1, pure=False) for i in range(4)]
    stall.wait_running(client, futs)
    assert client.gather(futs) == [1, 2, 3, 4]
    stall.wait_running(client, [None, 3])  # nothing to wait for


@contextlib.contextmanager
def _one_worker():
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as c:
        yield cluster, c


def _lose_every_worker(cluster, c):
    cluster.scale(0)
    deadline = time.monotonic() + 30
    while workers_info(c) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_fit_whose_workers_are_all_lost_stops_instead_of_waiting_for_ever(fast_watch,
                                                                            monkeypatch):
    # A worker without scipy died of its first task; the fit's pass over y then
    # waited on a cluster of no workers for ever, and SIGTERM could not end it.
    monkeypatch.setenv("DKERNEL_WORKER_TIMEOUT", "1")
    with _one_worker() as (cluster, c):
        fut = c.submit(time.sleep, 60, pure=False)
        _lose_every_worker(cluster, c)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="has had no workers for .* DKERNEL_WORKER_TIMEOUT"):
            stall.wait_running(c, [fut], label="a step")
        assert time.monotonic() - t0 < 10


def test_results_lost_with_every_worker_stop_the_gather_instead_of_waiting_for_ever(
        fast_watch, monkeypatch):
    # every worker of an external cluster killed mid-fit: the finished step's
    # results went with them, distributed rescheduled the keys ("Couldn't gather 2
    # keys, rescheduling") and the gather waited for ever for a worker to compute them
    monkeypatch.setenv("DKERNEL_WORKER_TIMEOUT", "1")
    monkeypatch.setattr(stall, "_GATHER_SECONDS", 1.0)
    with _one_worker() as (cluster, c):
        futs = [c.submit(np.add, i, 1, pure=False) for i in range(2)]
        assert stall.gather(c, futs) == [1, 2]  # a gather of finished results
        _lose_every_worker(cluster, c)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="has had no workers for .* DKERNEL_WORKER_TIMEOUT"):
            stall.gather(c, futs, label="a step")
        assert time.monotonic() - t0 < 15


def test_a_score_whose_workers_are_all_lost_stops_instead_of_waiting_for_ever(fast_watch,
                                                                              monkeypatch):
    # a fit stopped after DKERNEL_WORKER_TIMEOUT; score (and evaluate's metric
    # pass, chunkwise) then waited on a cluster of no workers for ever
    import dask.array as da

    from dkernel import KernelCCA
    from dkernel.engine.progress import chunkwise

    monkeypatch.setenv("DKERNEL_WORKER_TIMEOUT", "1")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    y = X[:, 0] + 0.1 * rng.normal(size=400)
    with _one_worker() as (cluster, c):
        reg = DSGRegressor(n_features=64, n_epochs=1, client=c).fit(X, y)
        cca = KernelCCA(1, n_features=64, n_epochs=1, init_rows=100, client=c).fit(X, X[:, :2])
        Xd, yd = da.from_array(X, chunks=100), da.from_array(y, chunks=100)
        assert reg.score(Xd, yd) > 0.5  # (the same wait, workers present)
        _lose_every_worker(cluster, c)
        calls = [lambda: reg.score(Xd, yd), lambda: cca.score(Xd, Xd[:, :2]),
                 lambda: chunkwise(np.sum, [Xd], 1, "r2", True),
                 lambda: chunkwise(np.sum, [Xd], 1, "r2", False)]
        for call in calls:
            t0 = time.monotonic()
            with pytest.raises(RuntimeError, match="^scoring stopped: the cluster has had no "
                                                   "workers for"):
                call()
            assert time.monotonic() - t0 < 15


def _bad_or_held(block, release):
    if block[0, 0] == 0:
        raise ValueError("a bad chunk")
    deadline = time.monotonic() + 90
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)  # (held until the test has seen the error)
    return block.sum(axis=0)


def test_a_metric_pass_with_progress_raises_a_chunks_error_without_waiting_for_the_rest(
        client, tmp_path):
    # (as its as_completed loop did before it learnt to stop on a cluster of no workers)
    import functools

    import dask.array as da

    from dkernel.engine.progress import chunkwise

    X = da.from_array(np.r_[np.zeros((10, 1)), np.ones((10, 1))], chunks=10)
    release, t0 = tmp_path / "release", time.monotonic()
    try:
        with pytest.raises(ValueError, match="a bad chunk"):
            chunkwise(functools.partial(_bad_or_held, release=str(release)), [X], 1, "r2", True)
        assert time.monotonic() - t0 < 60  # (not once the held chunk gave up, at 90 s)
    finally:
        release.touch()


def _times_out():
    raise TimeoutError("a socket's own timeout")


def test_a_task_that_raises_timeout_error_raises_it_instead_of_a_retry_for_ever(client):
    # the gather's own time limit caught the task's TimeoutError and waited again, for ever
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="a socket's own timeout"):
        stall.result(client, client.submit(_times_out, pure=False))
    assert time.monotonic() - t0 < 20


def test_tasks_waiting_on_one_paused_worker_stop_the_fit_when_the_rest_idle(fast_watch):
    # One of two workers stayed paused with a step's tasks on it, the other
    # idle, and the fit waited for ever: only every worker paused was caught.
    # A real `dask worker` whose pause threshold its interpreter alone passes,
    # and a task only it may run.
    import os
    import subprocess
    import sys

    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as c:
        env = {**os.environ, "DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "0.01",
               "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False",
               "DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False"}
        worker = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
             "--nthreads", "1", "--memory-limit", "1GB", "--no-nanny", "--no-dashboard"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not any(w.get("status") == "paused" for w in workers_info(c).values()):
                assert time.monotonic() < deadline, "the worker never paused"
                time.sleep(0.1)
            paused = next(a for a, w in workers_info(c).items() if w.get("status") == "paused")
            fut = c.submit(np.add, 1, 1, workers=[paused], allow_other_workers=False)
            t0 = time.monotonic()
            with pytest.warns(RuntimeWarning, match="paused for"), \
                    pytest.raises(WorkersPaused, match=r"while 1 of 2 workers were paused"):
                stall.wait_running(c, [fut], label="a step")
            assert time.monotonic() - t0 < 20  # twice _FAIL_SECONDS (2 s here), not for ever
            # a task a running worker holds is being worked on: no such stop
            slow = c.submit(time.sleep, 6, pure=False)
            stall.wait_running(c, [slow], label="a step")
        finally:
            worker.terminate()
            worker.wait(30)


@pytest.mark.parametrize("estimator", ["EigenProRegressor", "DSGRegressor"])
def test_a_failed_fit_leaves_no_futures_or_data_on_the_cluster(client, estimator):
    # the client keeps a task's error, and its traceback held the frames holding the
    # fit's futures: every failed fit left them (a kernel EigenPro fit meeting a NaN
    # chunk pinned 90% of X in worker memory) for the rest of the session
    import gc

    import dask.array as da

    import dkernel

    def bad_chunk_2(b, block_info=None):
        if block_info[0]["chunk-location"][0] == 2:
            if estimator == "DSGRegressor":  # (its read raises)
                raise ValueError("a NaN or infinity in the source")
            b = b.copy()
            b[5, 0] = np.nan
        return b

    def held(dask_scheduler):
        return len(dask_scheduler.tasks)

    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 5)).astype(np.float32)
    y = da.from_array(np.sin(X[:, 0]), chunks=500)
    Xd = da.from_array(X, chunks=(500, 5)).map_blocks(bad_chunk_2, dtype=X.dtype)
    gc.collect()
    before = (len(client.futures), client.run_on_scheduler(held))  # (a shared client)
    for _ in range(2):
        with pytest.raises(ValueError, match="NaN or infinity"):
            getattr(dkernel, estimator)(n_epochs=1, bandwidth=1.0, client=client).fit(Xd, y)
    gc.collect()

    def left() -> tuple[int, int]:
        return len(client.futures), client.run_on_scheduler(held)
    deadline = time.monotonic() + 60  # (a pass over y beside the sample may still end)
    while left() > before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left() <= before
