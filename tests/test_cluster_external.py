"""Fits through a real external cluster: a ``dask scheduler`` and two ``dask
worker`` processes on 127.0.0.1, started and stopped by the deploy recipe
``deploy/local-cluster.sh``; and determinism across clusters (docs/design.md §1: same
seed + data + chunking give the same model whatever the workers)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _cluster import recipe_env
from distributed import Client, LocalCluster

from dkernel import DSGClassifier
from dkernel.cli import main
from dkernel.data import open_dataset
from dkernel.datasets import make_store
from dkernel.engine import local_cluster
from dkernel.engine.cluster import WORKER_MALLOC, workers_info
from dkernel.io import load_model

RECIPE = Path(__file__).resolve().parents[1] / "deploy" / "local-cluster.sh"

# Small but not trivial: 8 chunks, so the 4-lane steps and the chunk homes
# (chunk c lives on worker c mod n_workers) spread over both workers.
N_ROWS, D, CHUNK = 2000, 5, 250
FIT = {"kernel": "gaussian", "bandwidth": "auto", "n_features": 256, "block_size": 64,
       "batch_size": 128, "n_epochs": 2, "random_state": 7}


def _recipe(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # this interpreter's dask CLI first on PATH, as the other recipe tests do:
    # without it a suite run as .venv/bin/python -m pytest found no 'dask'
    return subprocess.run(["bash", str(RECIPE), *args], check=False, capture_output=True, text=True,
                          timeout=timeout, env=recipe_env())


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill_groups(state: Path) -> list[int]:
    """SIGKILL the process groups recorded by the recipe; the pids that were still alive."""
    alive = []
    for name in ("workers.pid", "scheduler.pid"):
        f = state / name
        if f.exists():
            pid = int(f.read_text().strip())
            if _group_alive(pid):
                alive.append(pid)
                os.killpg(pid, signal.SIGKILL)
    return alive


def _start(state: Path, workers: int) -> str:
    # --port 0: any free port (read back from the scheduler file), so parallel
    # runs never collide; --idle-timeout: the scheduler exits on its own should
    # this test process die before its finalizer runs (workers follow it via
    # the recipe's --death-timeout).
    proc = _recipe("start", "--dir", str(state), "--port", "0", "--workers", str(workers),
                   "--threads", "1", "--memory-limit", "1GiB", "--timeout", "60",
                   "--idle-timeout", "300")
    if proc.returncode != 0:
        _kill_groups(state)
        pytest.fail(f"deploy/local-cluster.sh start failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads((state / "scheduler.json").read_text())["address"]


class _External(str):
    """The scheduler address, plus the recipe's state folder."""
    state: Path


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    """Address of a scheduler with two single-threaded worker processes.

    Teardown goes through the recipe's ``stop`` and fails (a test error) if
    any process of either group survived it."""
    state = tmp_path_factory.mktemp("dask-cluster")
    address = _External(_start(state, workers=2))
    address.state = state
    pids = [int((state / f).read_text()) for f in ("scheduler.pid", "workers.pid")]
    survivors: list[int] = []
    try:
        yield address
    finally:
        try:
            stop = _recipe("stop", "--dir", str(state), timeout=60)
        finally:
            survivors = _kill_groups(state)  # whatever survived a failed or slow stop
    assert stop.returncode == 0, stop.stderr
    assert survivors == [] and not any(_group_alive(p) for p in pids)
    assert not (state / "scheduler.pid").exists() and not (state / "scheduler.json").exists()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.zarr"
    return make_store(path, N_ROWS, D, chunk_rows=CHUNK, kind="classification", random_state=1)


def _executed(client: Client) -> dict[str, int]:
    """Tasks each worker has executed so far."""
    return client.run(lambda dask_worker: dask_worker.state.executed_count)


def _ran_on_every_worker(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    assert len(after) == 2, f"expected two workers, found {sorted(after)}"
    delta = {w: after[w] - before.get(w, 0) for w in after}
    assert all(v > 0 for v in delta.values()), f"a worker ran no task: {delta}"
    return delta


def _accuracy(model, store: str) -> float:
    data = open_dataset(store)
    X, y = data.X.compute(scheduler="sync"), data.y.compute(scheduler="sync")
    return float((model.predict(X) == y).mean())


def test_cli_fit_runs_on_both_workers_of_external_scheduler(external, store, tmp_path, client):
    out = tmp_path / "model.npz"
    with Client(external, set_as_default=False) as probe:
        before = _executed(probe)
        rc = main(["fit", store, "--solver", "dsg", "--task", "classification",
                   "--kernel", "gaussian",
                   "--bandwidth", "auto", "--features", "256", "--block-size", "64",
                   "--batch-size", "128", "--epochs", "2", "--seed", "7",
                   "--scheduler", external, "--out", str(out), "--quiet"])
        assert rc == 0
        _ran_on_every_worker(before, _executed(probe))
    model = load_model(out)
    # the same model as the Python API on the in-process cluster: the CLI passed
    # every setting, and the external cluster changed nothing
    ref = DSGClassifier(**FIT, client=client).fit(store)
    np.testing.assert_array_equal(model.coef_, ref.coef_)
    # 3 non-linear classes: chance is ~1/3; a working fit is far above it.
    assert _accuracy(model, store) > 0.6


def test_cli_fit_reads_scheduler_address_from_environment(external, store, tmp_path, monkeypatch):
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", external)
    out = tmp_path / "model.npz"
    with Client(external, set_as_default=False) as probe:
        before = _executed(probe)
        assert main(["fit", store, "--features", "128", "--block-size", "64", "--epochs", "1",
                     "--batch-size", "128", "--out", str(out), "--quiet"]) == 0
        _ran_on_every_worker(before, _executed(probe))
    assert out.exists()


def test_cli_fit_reads_scheduler_address_from_the_dask_configuration(external, store, tmp_path,
                                                                     monkeypatch):
    # scheduler-address in ~/.config/dask was ignored: the fit ran on a LocalCluster of
    # the machine it was typed on, exit 0
    import dask

    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    out = tmp_path / "model.npz"
    with Client(external, set_as_default=False) as probe, \
            dask.config.set({"scheduler-address": external}):
        before = _executed(probe)
        assert main(["fit", store, "--features", "128", "--block-size", "64", "--epochs", "1",
                     "--batch-size", "128", "--out", str(out), "--quiet"]) == 0
        _ran_on_every_worker(before, _executed(probe))


def test_python_api_fit_and_lazy_predict_on_external_cluster(external, store):
    with Client(external, set_as_default=False) as c:
        before = _executed(c)
        model = DSGClassifier(**FIT, client=c).fit(store)
        _ran_on_every_worker(before, _executed(c))
        data = open_dataset(store)
        pred = model.predict(data.X)  # lazy: computed on the external cluster
        acc = c.compute((pred == data.y).mean()).result()
    # the lazy prediction on the external cluster is the eager one, row for row
    assert acc == _accuracy(model, store) and acc > 0.6
    assert model.coef_.shape == (256, 3)


def test_a_client_that_is_not_the_default_runs_the_whole_fit(external, store, tmp_path):
    # a process whose only client was made with set_as_default=False: the fit's
    # thread that passes over y beside the sample read waited through
    # distributed.wait, and make_store's writes through as_completed, both of
    # which ask for the default client ("No clients found")
    made = str(tmp_path / "made.zarr")
    script = (f"from distributed import Client\n"
              f"from dkernel import DSGClassifier\n"
              f"from dkernel.datasets import make_store\n"
              f"with Client({str(external)!r}, set_as_default=False) as c:\n"
              f"    make_store({made!r}, 1000, 3, chunk_rows=250, client=c)\n"
              f"    m = DSGClassifier(**{FIT!r}, client=c).fit({str(store)!r})\n"
              f"    print(m.score({str(store)!r}))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.split()[-1]) > 0.6


def test_same_seed_data_and_chunking_give_identical_model_on_any_cluster(external, store, client):
    with Client(external, set_as_default=False) as c:
        on_external = DSGClassifier(**FIT, client=c).fit(store)
    assert on_external.lanes_ == 2  # lanes="auto": one per worker, recorded
    on_local_2 = DSGClassifier(**FIT, client=client).fit(store)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as c1:
        # the recorded width reproduces the fit on a cluster of another size
        on_local_1 = DSGClassifier(**{**FIT, "lanes": on_external.lanes_}, client=c1).fit(store)
    for other in (on_local_2, on_local_1):
        assert other.bandwidth_ == on_external.bandwidth_
        # Bit-identical, not merely close: the plan, the feature seeds and the
        # order of the partial-gradient sums never depend on the cluster.
        assert np.array_equal(other.coef_, on_external.coef_)
    assert np.any(on_external.coef_ != 0)
    # and a different seed really gives a different model (the comparison can fail)
    other_seed = DSGClassifier(**{**FIT, "random_state": 8}, client=client).fit(store)
    assert not np.array_equal(other_seed.coef_, on_external.coef_)


def test_recipe_reports_status_and_refuses_a_second_start(external):
    state = str(external.state)
    status = _recipe("status", "--dir", state)
    assert status.returncode == 0 and f"{external}, 2 worker(s) registered" in status.stdout
    assert _recipe("address", "--dir", state).stdout.strip() == external
    again = _recipe("start", "--dir", state, "--port", "0", "--workers", "1")
    assert again.returncode != 0
    assert again.stderr.startswith("local-cluster.sh: error: a cluster is already running")
    with Client(external, set_as_default=False) as c:  # the refused start touched nothing
        assert len(workers_info(c)) == 2


def test_recipe_rejects_bad_options_before_starting_anything(tmp_path):
    state = tmp_path / "cluster"
    for args, message in ((["--workers", "0"], "--workers must be a positive integer"),
                          (["--port", "http"], "--port must be a number"),
                          (["--tls-cert", "x.pem"], "TLS needs all of"),
                          (["--frobnicate", "1"], "unknown option '--frobnicate'")):
        proc = _recipe("start", "--dir", str(state), *args)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert not (state / "scheduler.pid").exists()


def test_recipe_stops_at_once_when_its_workers_exit_at_start_and_start_takes_help(tmp_path):
    # a --memory-limit 'dask worker' refuses waited the whole --timeout (60 s)

    proc = _recipe("start", "--help")
    assert proc.returncode == 0 and "usage: local-cluster.sh" in proc.stdout, proc.stderr
    state = tmp_path / "cluster"
    t0 = time.monotonic()
    proc = _recipe("start", "--dir", str(state), "--port", "0", "--workers", "1",
                   "--memory-limit", "4Gigs", "--timeout", "60")
    assert proc.returncode != 0 and "'dask worker' exited at start" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 40
    # the scheduler it had started is stopped too
    assert "no scheduler running" in _recipe("status", "--dir", str(state)).stderr
    # and its wait for workers: the Python behind it lived on, orphaned, for ever
    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "-f", str(state)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "a process of the failed start is still running"
        time.sleep(0.2)


def test_relative_store_path_reaches_workers_started_in_another_folder(external, tmp_path,
                                                                       monkeypatch, client):
    # The recipe's workers run in the folder pytest started in; the client here
    # runs in tmp_path and names the store relative to it.
    monkeypatch.chdir(tmp_path)
    make_store("rel.zarr", N_ROWS, D, chunk_rows=CHUNK, kind="classification", random_state=1)
    assert main(["fit", "rel.zarr", "--features", "256", "--block-size", "64", "--epochs", "2",
                 "--batch-size", "128", "--seed", "7", "--scheduler", external,
                 "--out", "model.npz", "--quiet"]) == 0
    model = load_model("model.npz")
    # the workers read the right file: the same model as the in-process fit of it
    ref = DSGClassifier(**{**FIT, "lanes": model.lanes_}, client=client).fit("rel.zarr")
    np.testing.assert_array_equal(model.coef_, ref.coef_)
    assert _accuracy(model, str(tmp_path / "rel.zarr")) > 0.6


def test_store_not_visible_on_workers_is_an_error_not_zeros(client, tmp_path):
    # What a worker on a host without the shared file system sees: zarr would
    # read the missing chunks as fill values (zeros) and the fit would
    # "succeed" on garbage.
    path = make_store(tmp_path / "train.zarr", 1000, D, chunk_rows=CHUNK, random_state=1)
    data = open_dataset(path)
    os.rename(path, tmp_path / "elsewhere.zarr")
    with pytest.raises(FileNotFoundError, match="not visible on worker host"):
        DSGClassifier(bandwidth=1.0, n_features=64, n_epochs=1, client=client).fit(data.X, data.y)


def _can_unshare_mounts() -> bool:
    try:
        return subprocess.run(["unshare", "--mount", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_unshare_mounts(), reason="needs unshare --mount (root)")
def test_an_output_the_workers_do_not_see_is_refused_not_written_as_zeros(tmp_path):
    # A real worker whose output folder is another disk (a tmpfs mounted over it
    # in its own mount namespace), as on a host without the shared file system:
    # predict, ingest and make-store wrote their chunks there, renamed a store
    # of metadata only and reported success; every value read back as 0.
    from dkernel.datasets import make_store as make

    out = tmp_path / "out"
    out.mkdir()
    with LocalCluster(n_workers=0, dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as c:
        worker = subprocess.Popen(
            ["unshare", "--mount", "bash", "-c", f"mount -t tmpfs none {out} && exec \"$@\"", "x",
             sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
             "--nthreads", "1", "--no-dashboard"],
            env=recipe_env(), start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        try:
            c.wait_for_workers(1, timeout=60)
            with pytest.raises(FileNotFoundError, match="is not visible on the workers"):
                make(out / "ms.zarr", 1000, D, chunk_rows=CHUNK, random_state=1, client=c)
            assert os.listdir(out) == []  # no store, no temporary left on the client's side
        finally:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def _worker_malloc(c):
    return list(c.run(lambda: {k: os.environ.get(k) for k in WORKER_MALLOC}).values())


def test_workers_of_the_recipe_and_of_dkernels_local_cluster_get_its_malloc_settings(
        external, monkeypatch):
    # Dask's default MALLOC_TRIM_THRESHOLD_ made every chunk-sized buffer fault in
    # fresh pages (a chunk read 25 ms instead of 6 ms): both routes that start
    # workers for dkernel give them WORKER_MALLOC before the process starts
    want = {k: str(v) for k, v in WORKER_MALLOC.items()}
    with Client(external, set_as_default=False) as c:
        assert _worker_malloc(c) == [want, want]
    # any earlier LocalCluster leaves Dask's value in this process's environment,
    # where it would win over the configuration
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = dict(os.environ)
    with local_cluster(1, silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as c:
        assert _worker_malloc(c) == [want]
    assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "65536"  # put back
    # and nothing else the nannies wrote (OMP_NUM_THREADS=1 ran every later
    # subprocess of the caller on one BLAS thread)
    assert {k: v for k, v in os.environ.items() if k != "__DASK_PARENT_PID"} == \
        {k: v for k, v in before.items() if k != "__DASK_PARENT_PID"}


_RESTART = """
import os, signal, time
from dkernel.engine.cluster import connect

if __name__ == "__main__":
    for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED"):
        os.environ.pop(key, None)
    with connect(None, n_workers=1) as c:
        print("after start", os.environ.get("OMP_NUM_THREADS"))
        pid = next(iter(c.run(os.getpid).values()))
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if pid not in c.run(os.getpid).values():
                    break
            except Exception:
                pass
            time.sleep(0.2)
        print("after restart", os.environ.get("OMP_NUM_THREADS"))
        os.environ["OPENBLAS_NUM_THREADS"] = "3"  # someone else's setting
    print("after close", os.environ.get("OMP_NUM_THREADS"), os.environ.get("PYTHONHASHSEED"),
          os.environ.get("OPENBLAS_NUM_THREADS"))
"""


def test_the_default_cluster_takes_back_what_a_restarted_workers_nanny_wrote(tmp_path):
    # a worker restarted (a memory-limit kill) has its nanny write OMP_NUM_THREADS=1
    # and the rest into this process again, after the start's own clean-up; a
    # value another thread set meanwhile is not the nanny's and stays
    script = tmp_path / "restart.py"
    script.write_text(_RESTART)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300)
    assert run.stdout.splitlines() == ["after start None", "after restart 1",
                                       "after close None None 3"], run.stdout + run.stderr[-2000:]


@pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and two cores to pin the process to one")
def test_the_embedded_cluster_starts_a_worker_per_core_the_process_may_use():
    # os.cpu_count() is the host's: pinned to one core (taskset here; a container's
    # CPU quota alike), the default cluster started a worker per host core
    code = ("from dkernel.engine.cluster import connect\n"
            "with connect() as c: print(len(c.nthreads()))")
    run = subprocess.run(["taskset", "-c", str(min(os.sched_getaffinity(0))), sys.executable,
                          "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1"]


def test_a_cluster_without_workers_is_waited_for_then_refused_in_one_line(monkeypatch, tmp_path,
                                                                          capsys):
    # The fit's tasks waited for a worker for ever, printing nothing (a scheduler
    # whose workers died, or a deployment whose workers never started).
    import threading

    from dkernel import DSGRegressor

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(600, 3)), rng.normal(size=600)
    store = make_store(tmp_path / "s.zarr", 600, 3, chunk_rows=200, kind="regression")
    monkeypatch.setenv("DKERNEL_WORKER_TIMEOUT", "2")
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        with pytest.raises(RuntimeError, match="has had no workers for 2 s; start workers"):
            DSGRegressor(n_features=64, n_epochs=1, client=client).fit(X, y)
        assert main(["fit", str(store), "--features", "64", "--epochs", "1", "--out",
                     str(tmp_path / "m.npz"), "--scheduler", cluster.scheduler_address]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert "has had no workers for 2 s" in err[-1] and not (tmp_path / "m.npz").exists()
        # the engine's logged warning in the CLI's one-line form (it was Python's bare line)
        assert err[0].startswith("dkernel: warning: the Dask scheduler at "), err
        # a worker that joins while a fit waits (a pod starting, an adaptive
        # cluster scaling up for the pending task) is used
        monkeypatch.setenv("DKERNEL_WORKER_TIMEOUT", "60")
        threading.Timer(1.0, cluster.scale, args=(1,)).start()
        m = DSGRegressor(n_features=64, n_epochs=1, client=client).fit(X, y)
        assert m.lanes_ == 1 and np.isfinite(m.predict(X)).all()


def test_a_worker_timeout_of_zero_refuses_at_once_and_a_bad_one_is_named(monkeypatch):
    # distributed reads wait_for_workers(timeout=0) as no deadline: "0" waited for
    # ever; "junk" and "-3" failed inside float() / distributed's parse_timedelta

    from dkernel.engine.cluster import require_workers

    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as client:
        monkeypatch.setenv("DKERNEL_WORKER_TIMEOUT", "0")
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match="has had no workers for 0 s"):
            require_workers(client)
        assert time.perf_counter() - t0 < 5
        for bad in ("junk", "-3", "nan", "inf"):
            monkeypatch.setenv("DKERNEL_WORKER_TIMEOUT", bad)
            with pytest.raises(ValueError, match=f"DKERNEL_WORKER_TIMEOUT='{bad}' is not a number"):
                require_workers(client)
        monkeypatch.setenv("DKERNEL_WORKER_TIMEOUT", "0.5")
        with pytest.raises(RuntimeError, match="no workers for 0.5 s"):
            require_workers(client)


def test_a_port_that_is_not_a_scheduler_is_named_within_the_timeout(external):
    """A port that accepts and never answers held Client() for ever (its timeout
    does not cover the handshake), and bad addresses gave int() errors."""
    import socket

    from dkernel.engine.cluster import _check_address, _probe_scheduler

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
    try:
        start = time.monotonic()
        with pytest.raises(ConnectionError, match="did not answer as a Dask scheduler within 2 s"):
            _probe_scheduler(address, None, timeout=2)
        assert time.monotonic() - start < 10
    finally:
        silent.close()
    _probe_scheduler(external, None, timeout=20)  # a scheduler answers
    for bad, message in (("tcp://127.0.0.1:notaport", "is not protocol://host:port"),
                         ("tcp://127.0.0.1", "is not protocol://host:port"),
                         ("http://127.0.0.1:8787", "http:// is not a protocol Dask speaks")):
        with pytest.raises(ValueError, match=message):
            _check_address(bad)
    assert _check_address("127.0.0.1:8786") == "tcp://127.0.0.1:8786"  # as distributed reads it


def test_a_fit_without_a_client_leaves_no_scheduler_behind():
    """distributed memoises handler methods unbounded (core._expects_comm), so
    each cluster a fit started kept its Scheduler, and a logging handler,
    alive for the life of the process."""
    import gc
    import weakref

    from distributed import Scheduler

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = (X[:, 0] > 0).astype(int)
    gc.collect()
    before = set(map(id, Scheduler._instances))
    DSGClassifier(n_features=32, n_epochs=1).fit(X, y)
    gc.collect()
    started = [weakref.ref(s) for s in Scheduler._instances if id(s) not in before]
    assert not [r for r in started if r() is not None and r().status.name == "closed"]
