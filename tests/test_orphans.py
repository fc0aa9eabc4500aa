"""A LocalCluster started by dkernel dies with its coordinator, SIGKILL included,
whatever start method Dask is configured with: dkernel's own LocalCluster
always starts its workers by spawn (``dkernel.engine.cluster._START_METHOD``).

Under fork, two workers were still running 5 minutes after ``kill -9`` of a
``dkernel fit`` (issue 32, once in three tries), so the test also checks that
the workers were spawned whatever the configuration asked for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from dkernel.data import write_store
from dkernel.datasets import make_blobs_classification

#: Seconds the workers get to notice that their coordinator is gone: each
#: watches a pipe from it and exits at once when it closes.
GONE_WITHIN = 15.0


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    X, y = make_blobs_classification(1200, 4, random_state=1)
    return write_store(tmp_path_factory.mktemp("orphans") / "train.zarr", X, y, chunk_rows=300)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_sigkill_of_the_coordinator_leaves_no_worker(store, tmp_path, method):
    ckpt = tmp_path / "m.npz.ckpt.npz"
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD": method}
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "dkernel", "fit", store, "--features", "256", "--epochs", "400",
         "--batch-size", "100", "--workers", "2", "--checkpoint-every", "2", "--quiet",
         "--out", str(tmp_path / "m.npz")],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not ckpt.exists():  # the workers are computing steps
            assert coordinator.poll() is None, coordinator.stderr.read()
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.2)
        children = psutil.Process(coordinator.pid).children(recursive=True)
        workers = [p for p in children if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) == 2, [p.cmdline() for p in children]
        coordinator.kill()
        coordinator.wait()
        start = time.monotonic()
        gone, alive = psutil.wait_procs(children, timeout=GONE_WITHIN)
        took = time.monotonic() - start
        for p in alive:
            p.kill()
        assert not alive, (f"{len(alive)} of {len(children)} processes of the killed "
                           f"coordinator still alive after {GONE_WITHIN:g} s: "
                           f"{[p.pid for p in alive]}")
        print(f"{method}: {len(children)} processes gone {took:.2f} s after the SIGKILL")
    finally:
        if coordinator.poll() is None:
            os.killpg(coordinator.pid, signal.SIGKILL)


_INTERRUPTED_START = """
import os, signal, sys, threading, time
import psutil
from dkernel.engine.cluster import local_cluster

if __name__ == "__main__":
    threading.Timer(float(sys.argv[1]), os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        local_cluster(2).close()
        print("started")
    except KeyboardInterrupt:
        print("interrupted")
    deadline = time.monotonic() + 15  # (GONE_WITHIN)
    while True:
        alive = [p for p in psutil.Process().children(recursive=True) if p.is_running()
                 and p.status() != psutil.STATUS_ZOMBIE
                 and "resource_tracker" not in " ".join(p.cmdline())]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    print(len(alive))
"""


@pytest.mark.parametrize("delay", [0.3, 0.8])
def test_ctrl_c_while_the_cluster_starts_leaves_no_worker(tmp_path, delay):
    # a Ctrl-C in the start's first second (a notebook's interrupt as a fit
    # begins) left both workers running for the rest of the session: the close
    # came while they were starting, and distributed's close then fails
    script = tmp_path / "start.py"
    script.write_text(_INTERRUPTED_START)
    run = subprocess.run([sys.executable, str(script), str(delay)], capture_output=True,
                         text=True, timeout=120)
    lines = run.stdout.split()
    assert lines[-1] == "0", run.stdout + run.stderr[-2000:]
    if lines[0] != "interrupted":
        pytest.skip(f"the cluster started within {delay} s: nothing to interrupt")



def test_a_program_read_from_standard_input_is_refused_before_any_worker_starts(tmp_path):
    # each spawned worker re-runs the main script first, and '<stdin>' is no file:
    # the start failed after 30 lines of "Nanny failed to start"
    program = ("import numpy as np\nfrom dkernel import DSGRegressor\n"
               "X = np.ones((50, 2))\nDSGRegressor(n_features=8, n_epochs=1).fit(X, X[:, 0])\n")
    proc = subprocess.run([sys.executable, "-"], input=program, capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "RuntimeError: dkernel's local cluster starts worker processes, which first re-run the "
        "main script, and '<stdin>' is not a file (a program read from standard input?): save it "
        "to a file and run that, or pass client=distributed.Client(processes=False)")
    assert "Nanny" not in proc.stderr


def test_a_script_fitting_outside_its_main_guard_is_refused_before_any_worker_starts(tmp_path):
    # every spawned worker re-ran the script's top level, whose fit started a cluster
    # of its own in a process still bootstrapping: about 340 lines of "Nanny failed to
    # start" after 30 s
    script = tmp_path / "unguarded.py"
    script.write_text("import numpy as np\nfrom dkernel import DSGRegressor\n"
                      "X = np.ones((50, 2))\n"
                      "DSGRegressor(n_features=8, n_epochs=1).fit(X, X[:, 0])\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "RuntimeError: dkernel's local cluster starts worker processes, which first re-run the "
        "main script, and unguarded.py line 4 starts this cluster outside an `if __name__ == "
        "\"__main__\":` block, so every worker would start one too: put the script's work "
        "under that guard, or pass client=distributed.Client(processes=False)")
    assert "Nanny" not in proc.stderr


@pytest.mark.parametrize(("source", "line", "guarded"), [
    ("fit()\n", 1, False),
    ("if __name__ == '__main__':\n    fit()\n", 2, True),
    ("if '__main__' == __name__ and True:\n    x = 1\n    fit()\n", 3, True),
    ("try:\n    if __name__ == '__main__':\n        fit()\nfinally:\n    pass\n", 3, True),
    ("if __name__ == '__main__':\n    pass\nelse:\n    fit()\n", 4, False),
    ("if __name__ != '__main__':\n    fit()\n", 2, False),
    ("with open('f') as f:\n    fit()\n", 2, False),
])
def test_the_main_guard_is_read_from_the_scripts_syntax(source, line, guarded):
    import ast

    from dkernel.engine._main_script import _guarded

    assert _guarded(ast.parse(source).body, line) is guarded
