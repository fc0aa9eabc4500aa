"""Stores written by tasks on the workers are complete or absent, also when a
task fails while others are still writing: the temporary store is removed
only once no task writes into it any more, and it is never shared."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from dkernel.cli import main
from dkernel.data import write_store
from dkernel.data.store import atomic_store, run_writes, store_location
from dkernel.datasets import make_blobs_classification


def _write_after(folder: str, i: int, seconds: float) -> int:
    """A write task: chunk 0 is refused at once, the others write after ``seconds``."""
    if i == 0:
        raise ValueError("chunk 0 is bad")
    time.sleep(seconds)
    with open(os.path.join(folder, str(i)), "w"):
        pass
    return i


def _executing(client) -> int:
    return sum(client.run(lambda dask_worker: len(dask_worker.state.executing)).values())


def test_a_failed_write_returns_only_when_no_task_writes_any_more(client, tmp_path):
    # raising at the first error (client.gather) left the task running on the
    # other worker to write after the temporary store was removed
    futures = [client.submit(_write_after, str(tmp_path), i, 1.0, pure=False)
               for i in range(8)]
    with pytest.raises(ValueError, match="chunk 0 is bad"):
        run_writes(client, futures)
    written = sorted(os.listdir(tmp_path))
    assert _executing(client) == 0
    time.sleep(1.5)  # longer than a task: anything still running would have written
    assert sorted(os.listdir(tmp_path)) == written
    assert len(written) < 7, "the outstanding tasks were cancelled, not run"


def _slow_rows(block, started):
    open(started, "a").close()  # (the test loses the worker once a write task runs)
    time.sleep(60)
    return block


def _kill_once_started(worker, started):
    deadline = time.monotonic() + 60
    while not os.path.exists(started) and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.kill()


def test_a_write_whose_workers_are_all_lost_stops_and_leaves_nothing(tmp_path, monkeypatch):
    # a prediction (ingest, make-store) whose workers were all lost waited for
    # ever on its write tasks, where a fit stops after DKERNEL_WORKER_TIMEOUT
    import logging

    import dask.array as da
    from distributed import Client, LocalCluster

    from dkernel.data import store
    from dkernel.data.store import write_arrays

    monkeypatch.setenv("DKERNEL_WORKER_TIMEOUT", "1")
    monkeypatch.setattr(store, "_CHECK_SECONDS", 0.3)
    started = tmp_path / "started"
    X = da.from_array(np.ones((40, 2), np.float32), chunks=10).map_blocks(
        _slow_rows, started=str(started),
        meta=np.empty((0, 0), np.float32))  # (no meta: dask calls it to learn one)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "p.zarr"
    with LocalCluster(n_workers=0, dashboard_address=":0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as c:
        for progress in (None, _NoBar):
            # a worker without a nanny, killed: lost, as a node that goes down
            # (this file on its path: it could not unpickle _slow_rows, and died of that)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
            worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                                       cluster.scheduler_address, "--no-nanny", "--nthreads",
                                       "1", "--no-dashboard"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, env=env)
            killer = threading.Thread(target=_kill_once_started, args=(worker, started))
            try:
                c.wait_for_workers(1, timeout=60)
                started.unlink(missing_ok=True)
                killer.start()
                t0 = time.monotonic()
                with pytest.raises(RuntimeError, match=f"^writing '{out}' stopped: the cluster "
                                                       "has had no workers for .* "
                                                       "DKERNEL_WORKER_TIMEOUT"):
                    write_arrays(c, out, {"X": X}, 10, progress=progress)
                assert time.monotonic() - t0 < 25
                assert os.listdir(tmp_path / "out") == []
            finally:
                worker.kill()
                worker.wait(30)
                if killer.is_alive():
                    killer.join()
            assert started.exists()  # the worker ran a write task before it was lost


class _NoBar:
    def __init__(self, total, unit):
        pass

    def update(self):
        pass

    def close(self):
        pass


def test_two_writes_in_one_process_get_their_own_temporary_stores(tmp_path):
    out = tmp_path / "s.zarr"
    # (both overwrite: without it the later commit refuses the earlier's store)
    with atomic_store(out, overwrite=True) as a, atomic_store(out, overwrite=True) as b:
        first, second = store_location(a, out), store_location(b, out)
        assert first != second
        assert ".s.zarr.tmp-" in first and ".s.zarr.tmp-" in second
        assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p)
                                                      for p in (first, second))
    assert os.listdir(tmp_path) == ["s.zarr"]


def test_a_prediction_refused_early_leaves_no_store(client, tmp_path, capsys):
    X, y = make_blobs_classification(3000, 4)
    train = write_store(tmp_path / "train.zarr", X, y, chunk_rows=100)
    model = str(tmp_path / "m.npz")
    assert main(["fit", train, "--bandwidth", "2", "--features", "64", "--epochs", "1",
                 "--out", model, "--quiet", "--scheduler", client.scheduler.address]) == 0
    X[150, 1] = np.nan  # in the second of 30 chunks, while the others are being written
    bad = write_store(tmp_path / "nan.zarr", X, chunk_rows=100)
    capsys.readouterr()
    assert main(["predict", model, bad, "--out", str(tmp_path / "p.zarr"),
                 "--scheduler", client.scheduler.address]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    # one line for the error, after the progress lines of the chunks written
    assert "first bad row: 150" in err[-1] and all(e.startswith("predict: ") for e in err[:-1])
    while _executing(client):
        time.sleep(0.1)
    assert sorted(os.listdir(tmp_path)) == ["m.npz", "nan.zarr", "train.zarr"]


def test_overwrite_replaces_a_store_or_an_empty_folder_and_nothing_else(tmp_path, capsys):
    # --overwrite took a folder of the user's notes with it; a file failed with
    # "[Errno 20] Not a directory"
    X, y = make_blobs_classification(200, 3)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me\n")
    text = tmp_path / "out.txt"
    text.write_text("keep me too\n")
    for path, kind in ((notes, "a folder that is not a zarr store"), (text, "a file")):
        with pytest.raises(FileExistsError, match=f"is {kind}; --overwrite replaces only a store"):
            write_store(path, X, y, overwrite=True)
        assert main(["make-store", str(path), "--rows", "100", "--overwrite", "--quiet"]) == 1
        assert kind in capsys.readouterr().err
    assert (notes / "todo.txt").read_text() == "keep me\n" and text.read_text() == "keep me too\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    store = write_store(tmp_path / "s.zarr", X, y)
    for path in (empty, store):
        write_store(path, X[:50], y[:50], overwrite=True)
        assert main(["info", str(path), "--json"]) == 0
        assert '"n_rows": 50' in capsys.readouterr().out


def test_overwrite_of_an_object_store_prefix_replaces_only_a_store():
    # the prefix is removed recursively: a prefix of other objects is refused,
    # and what an interrupted copy of a store left (its arrays' metadata
    # without the group's, which is copied last) is replaced
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    X, y = make_blobs_classification(40, 3)
    fs.pipe_file("/overwrite/other/notes.txt", b"keep")
    with pytest.raises(FileExistsError, match="holds something other than a zarr store"):
        write_store("memory://overwrite/other", X, y, overwrite=True)
    assert fs.cat_file("/overwrite/other/notes.txt") == b"keep"
    fs.pipe_file("/overwrite/left/X/zarr.json", b"{}")
    assert write_store("memory://overwrite/left", X, y, overwrite=True) == "memory://overwrite/left"
    assert fs.exists("/overwrite/left/zarr.json")


def test_a_write_landing_after_the_cleanup_is_removed_too(tmp_path):
    """zarr writes on its own event-loop thread: a chunk write in flight when
    SIGTERM interrupted an ingest made the temporary folder again after it was
    removed (seen once in the suite beside two CPU hogs)."""
    import threading

    from dkernel.data.store import _remove_settled

    tmp = tmp_path / ".s.zarr.tmp-1-abc"
    (tmp / "X" / "c").mkdir(parents=True)

    def late_write() -> None:
        time.sleep(0.1)
        (tmp / "X" / "c").mkdir(parents=True, exist_ok=True)
        (tmp / "X" / "c" / "0").write_bytes(b"chunk")

    writer = threading.Thread(target=late_write)
    writer.start()
    _remove_settled(str(tmp))
    writer.join(timeout=10)
    assert not tmp.exists()


def test_an_output_another_run_wrote_meanwhile_is_kept_without_overwrite(tmp_path):
    # two `dkernel fit --out same.npz` at once both exited 0 and the second
    # model replaced the first; a store's commit removed the other one's store
    import zarr

    from dkernel.files import read_npz, write_npz_atomic

    model = str(tmp_path / "m.npz")
    write_npz_atomic(model, {"a": np.zeros(1)}, {"who": "first"})  # the other run's
    with pytest.raises(FileExistsError, match="appeared while"):
        write_npz_atomic(model, {"a": np.ones(1)}, {"who": "second"}, exclusive=True)
    assert read_npz(model)[1]["who"] == "first"
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []
    path = str(tmp_path / "t.zarr")
    with pytest.raises(FileExistsError, match="appeared while"):
        with atomic_store(path) as g:
            g.attrs["who"] = "mine"
            zarr.open_group(path, mode="w").attrs["who"] = "theirs"
    assert zarr.open_group(path, mode="r").attrs["who"] == "theirs"
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []
    write_npz_atomic(model, {"a": np.ones(1)}, {"who": "second"})  # overwrite: replaced
    assert read_npz(model)[1]["who"] == "second"


def test_a_write_removes_the_temporary_stores_of_killed_writers_on_this_host(tmp_path):
    # a SIGKILLed `dkernel predict` left its .NAME.tmp-... store for good
    import subprocess

    from dkernel.data.store import _writer

    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process has now
    me = _writer()  # host and pid namespace
    stale = tmp_path / f".s.zarr.tmp-{me}-{dead.pid}-0123456789ab"
    alive = tmp_path / f".s.zarr.tmp-{me}-{os.getpid()}-0123456789ab"  # a write in flight
    # another host whose name starts with this one's, another pid namespace:
    # not ours to judge
    host, ns = me.rsplit("-", 1)
    longer = tmp_path / f".s.zarr.tmp-{host}-gpu-{ns}-{dead.pid}-0123456789ab"
    other_ns = tmp_path / f".s.zarr.tmp-{host}-1-{dead.pid}-0123456789ab"
    for folder in (stale, alive, longer, other_ns):
        folder.mkdir()
    with atomic_store(tmp_path / "s.zarr") as g:
        g.attrs["ok"] = True
    assert sorted(os.listdir(tmp_path)) == sorted(["s.zarr", alive.name, longer.name,
                                                   other_ns.name])


def test_a_model_is_saved_where_the_filesystem_makes_no_hard_links(tmp_path, monkeypatch):
    # FAT, SMB, most FUSE mounts refuse os.link: the exclusive commit lost the
    # model after the whole fit
    import errno

    from dkernel.files import read_npz, write_npz_atomic

    def no_links(*args):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    model = str(tmp_path / "m.npz")
    write_npz_atomic(model, {"a": np.ones(1)}, {"who": "first"}, exclusive=True)
    assert read_npz(model)[1]["who"] == "first"
    with pytest.raises(FileExistsError, match="appeared while"):
        write_npz_atomic(model, {"a": np.ones(1)}, {"who": "second"}, exclusive=True)
    assert os.listdir(tmp_path) == ["m.npz"]


def test_an_output_at_a_symbolic_link_is_written_where_the_link_points(tmp_path, capsys):
    # a store was written whole, then "Cannot call rmtree on a symbolic link"; a
    # dangling link was blamed on "another run writing the same path"; a model
    # replaced the link itself and left the file it pointed to as it was
    from dkernel.files import read_npz, write_npz_atomic

    X, y = make_blobs_classification(200, 3)
    real = write_store(tmp_path / "real.zarr", X, y)
    os.symlink(real, tmp_path / "link.zarr")
    os.symlink(tmp_path / "later.zarr", tmp_path / "dangling.zarr")
    write_store(tmp_path / "link.zarr", X[:50], y[:50], overwrite=True)
    assert main(["make-store", str(tmp_path / "dangling.zarr"), "--rows", "60", "--quiet"]) == 0
    for path, rows in (("link.zarr", 50), ("real.zarr", 50), ("later.zarr", 60)):
        assert main(["info", str(tmp_path / path), "--json"]) == 0
        assert f'"n_rows": {rows}' in capsys.readouterr().out
    assert os.path.islink(tmp_path / "link.zarr") and os.path.islink(tmp_path / "dangling.zarr")
    os.symlink(tmp_path / "m.npz", tmp_path / "m_link.npz")
    write_npz_atomic(tmp_path / "m_link.npz", {"a": np.ones(1)}, {"who": "first"}, exclusive=True)
    write_npz_atomic(tmp_path / "m_link.npz", {"a": np.ones(1)}, {"who": "second"})
    assert os.path.islink(tmp_path / "m_link.npz")
    assert read_npz(tmp_path / "m.npz")[1]["who"] == "second"


def test_a_full_disk_names_the_store_and_leaves_nothing(tmp_path):
    # "[Errno 28] No space left on device" named no store (or a temporary chunk)
    import errno

    with pytest.raises(OSError, match=r"store '.*out\.zarr' could not be written: No space"):
        with atomic_store(str(tmp_path / "out.zarr")):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert os.listdir(tmp_path) == []
