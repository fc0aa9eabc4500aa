"""A cluster is checked before work is sent: a worker with another dkernel, or
none, is refused in one line naming it and both versions, and
``--upload-package`` sends this client's dkernel to it instead.

The workers are real ``dask worker`` processes on 127.0.0.1 started with
``python -S`` and a PYTHONPATH of this environment's site-packages: no site
hook runs, so the editable install's import hook does not, and the worker
imports the dkernel the test puts first on its path (a copy with another
``__version__``), or none at all."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from _cluster import stop_process_groups
from distributed import Client

import dkernel
from dkernel import load_model
from dkernel.cli import main
from dkernel.data import write_store
from dkernel.datasets import make_blobs_classification
from dkernel.engine import connect
from dkernel.engine.versions import PACKAGES, worker_versions

FIT = ["--features", "64", "--block-size", "32", "--epochs", "1", "--batch-size", "100",
       "--quiet"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    X, y = make_blobs_classification(600, 3, random_state=4)
    return write_store(tmp_path_factory.mktemp("versions") / "train.zarr", X, y, chunk_rows=200)


def _other_dkernel(root: Path, version: str) -> Path:
    shutil.copytree(Path(dkernel.__file__).parent, root / "dkernel",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "dkernel" / "_version.py").write_text(f'__version__ = "{version}"\n')
    return root


@contextmanager
def _cluster(tmp_path: Path, first_on_path: list[Path]) -> Iterator[tuple[str, str]]:
    """(scheduler address, worker address) of a scheduler and one nanny-run
    worker whose imports come from ``first_on_path`` then site-packages."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "PYTHONPATH"))}
    scheduler_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                               "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                               "--scheduler-file", str(scheduler_file), "--idle-timeout", "300"],
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            assert time.monotonic() < deadline, "the scheduler did not start in 60 s"
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written whole, but give the writer its close
        address = json.loads(scheduler_file.read_text())["address"]
        path = [*map(str, first_on_path), sysconfig.get_paths()["purelib"]]
        procs.append(subprocess.Popen(
            [sys.executable, "-S", "-m", "distributed.cli.dask_worker", address,
             "--nthreads", "1", "--memory-limit", "1GiB", "--no-dashboard",
             "--death-timeout", "60", "--local-directory", str(tmp_path / "space")],
            # cwd: "python -m" puts it first on sys.path, and a checkout's holds dkernel/
            env={**env, "PYTHONPATH": os.pathsep.join(path)}, cwd=tmp_path, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(address, timeout="20s") as c:
            c.wait_for_workers(1, timeout=60)
            (worker,) = c.nthreads()
        yield address, worker
    finally:
        stop_process_groups(procs)


@pytest.mark.slow
@pytest.mark.parametrize("other", ["0.0.9+other", None])
def test_a_worker_with_another_dkernel_is_refused_then_sent_ours(store, tmp_path, capsys,
                                                                  other):
    if other is None and Path(dkernel.__file__).is_relative_to(sysconfig.get_paths()["purelib"]):
        pytest.skip("dkernel is installed in site-packages (not editable): every worker has it")
    first = [_other_dkernel(tmp_path / "other", other)] if other else []
    out = tmp_path / "model.npz"
    mine = dkernel.__version__
    with _cluster(tmp_path, first) as (address, worker):
        assert main(["fit", store, *FIT, "--scheduler", address, "--out", str(out)]) == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        runs = f"runs dkernel {other}" if other else "has no dkernel"
        assert line == (
            f"dkernel: error: worker {worker} {runs} and this client dkernel {mine}: install "
            f"dkernel {mine} on the workers (one image or environment for client and workers, "
            "see deploy/README.md), or pass --upload-package (upload_package=True) to send "
            "this client's dkernel to them")
        assert not out.exists()

        assert main(["fit", store, *FIT, "--scheduler", address, "--upload-package",
                     "--out", str(out)]) == 0
        assert load_model(out).coef_.shape[0] == 64
        # the workers keep it (restarted with it first on their path)
        with Client(address, timeout="20s") as c:
            assert {v["dkernel"] for v in worker_versions(c).values()} == {mine}
            with connect(c) as same:
                assert same is c


def test_a_cluster_running_this_dkernel_passes_and_other_packages_only_warn(client, caplog):
    from dkernel.engine.versions import _warn_other_versions

    theirs = worker_versions(client)
    assert set(theirs) == set(client.nthreads())
    assert all(set(v) == set(PACKAGES) and v["dkernel"] == dkernel.__version__
               for v in theirs.values())
    with caplog.at_level(logging.WARNING, logger="dkernel.engine"):
        mine = next(iter(theirs.values()))
        _warn_other_versions({**mine, "numpy": "0.0.1"}, theirs)
    (worker, *_) = sorted(theirs)
    assert (f"worker {worker} runs numpy {mine['numpy']} and this client numpy 0.0.1 "
            f"({len(theirs)} of {len(theirs)} workers differ)" in caplog.text
            if len(theirs) > 1 else
            f"worker {worker} runs numpy {mine['numpy']} and this client numpy 0.0.1;"
            in caplog.text)


def test_upload_package_applies_to_a_cluster_at_scheduler_only(store, tmp_path, capsys):
    assert main(["fit", store, *FIT, "--upload-package", "--out",
                 str(tmp_path / "m.npz")]) == 1
    assert "--upload-package sends dkernel to the workers of a cluster at --scheduler" in \
        capsys.readouterr().err
