"""Object stores against a real S3 API: moto's standalone server, a separate
process on 127.0.0.1, stands in for S3.  Ingest to ``s3://``, fit from
``s3://`` on the two worker processes of a ``deploy/local-cluster.sh``
cluster, predict to ``s3://``, and a fit killed mid-way resumed from an
``s3://`` checkpoint.  Credentials and the endpoint reach client and workers
only through the standard environment variables (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL) and appear in no model, checkpoint
or log."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="s3:// stores need s3fs (pip install 'dkernel[s3]')")
pytest.importorskip("moto.server", reason="the local S3 API is moto's server (moto[server])")

from _cluster import recipe_cluster  # noqa: E402
from distributed import Client  # noqa: E402

from dkernel.cli import main  # noqa: E402
from dkernel.data import open_dataset, write_store  # noqa: E402
from dkernel.data.plan import ChunkPlan  # noqa: E402
from dkernel.datasets import make_store  # noqa: E402
from dkernel.io import load_model, read_npz  # noqa: E402

BUCKET = "dkernel-test"
SECRET = "dkernel-Secret-Key-0f9e8d7c6b5a"  # distinctive, to search files and logs for it
KEY_ID = "DKERNELTESTKEYID0001"
N_ROWS, D, CHUNK, BATCH, EPOCHS, LANES = 2000, 4, 250, 128, 2, 4
TOTAL_STEPS = sum(ChunkPlan((CHUNK,) * (N_ROWS // CHUNK), BATCH, LANES, 5).steps_per_epoch(e)
                  for e in range(EPOCHS))
FIT = ["--solver", "dsg", "--task", "classification", "--kernel", "gaussian", "--bandwidth", "2",
       "--features", "256", "--block-size", "32", "--batch-size", str(BATCH), "--epochs",
       str(EPOCHS), "--lanes", str(LANES), "--seed", "5", "--quiet",
       # block steps: a resumed fit recomputes nothing, so it is bit-identical
       "--preconditioner", "none"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The environment of an S3 API server on 127.0.0.1 with an empty bucket."""
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as fh:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                   str(port)], stdout=fh, stderr=subprocess.STDOUT)
    env = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    mp = pytest.MonkeyPatch()
    try:
        for k, v in env.items():
            mp.setenv(k, v)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto server did not start: {log.read_text()}")
                time.sleep(0.1)
        import fsspec

        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir(BUCKET)
        yield env, fs
    finally:
        mp.undo()
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):
    """Two single-threaded ``dask worker`` processes that know the S3
    environment (and nothing else: no storage options are ever passed)."""
    env, _ = s3
    state = tmp_path_factory.mktemp("cluster")
    with recipe_cluster(state, 2, env=env) as address:
        yield address, state


@pytest.fixture(scope="module")
def csv_file(tmp_path_factory):
    local = make_store(tmp_path_factory.mktemp("data") / "train.zarr", N_ROWS, D,
                       chunk_rows=CHUNK, kind="classification", random_state=2)
    data = open_dataset(local)
    X, y = data.X.compute(scheduler="sync"), data.y.compute(scheduler="sync")
    path = Path(local).parent / "train.csv"
    with open(path, "w") as f:
        f.write(",".join([f"x{j}" for j in range(D)] + ["label"]) + "\n")
        for row, label in zip(X, y):
            f.write(",".join(repr(float(v)) for v in row) + f",{int(label)}\n")
    return str(path), X, y


@pytest.fixture(scope="module")
def s3_store(s3, csv_file):
    path, _, _ = csv_file
    url = f"s3://{BUCKET}/train.zarr"
    assert main(["ingest", path, "--out", url, "--chunk-rows", str(CHUNK)]) == 0
    return url


def _executed(client: Client) -> dict[str, int]:
    return client.run(lambda dask_worker: dask_worker.state.executed_count)


def test_ingest_to_s3_stores_the_csv_rows_and_integer_labels(s3, s3_store, csv_file):
    _, fs = s3
    _, X, y = csv_file
    data = open_dataset(s3_store)
    assert data.row_chunks == (CHUNK,) * (N_ROWS // CHUNK)
    np.testing.assert_array_equal(data.X.compute(scheduler="sync"), X.astype(np.float32))
    labels = data.y.compute(scheduler="sync")
    assert labels.dtype == np.int32  # integer labels stay integers
    np.testing.assert_array_equal(labels, y)
    # nothing left of the temporary prefix the store was written under
    assert [k for k in fs.ls(BUCKET) if ".tmp-" in k] == []


def test_fit_from_s3_on_two_workers_then_predict_to_s3(s3, cluster, s3_store, csv_file, tmp_path):
    env, fs = s3
    address, _ = cluster
    _, X, y = csv_file
    model_url = f"s3://{BUCKET}/models/model.npz"
    with Client(address, set_as_default=False) as probe:
        before = _executed(probe)
        assert main(["fit", s3_store, *FIT, "--scheduler", address, "--out", model_url]) == 0
        after = _executed(probe)
    assert len(after) == 2 and all(after[w] > before.get(w, 0) for w in after), (before, after)
    model = load_model(model_url)
    assert float((model.predict(X) == y).mean()) > 0.6  # 3 classes: chance ~1/3

    pred_url = f"s3://{BUCKET}/pred.zarr"
    assert main(["predict", model_url, s3_store, "--scheduler", address, "--out", pred_url]) == 0
    import zarr

    stored = zarr.open_group(pred_url, mode="r")["y_pred"][:]
    np.testing.assert_array_equal(stored, model.predict(X))
    assert [k for k in fs.ls(BUCKET) if ".tmp-" in k] == []
    # outputs in object stores are replaced only with --overwrite
    argv = ["predict", model_url, s3_store, "--scheduler", address, "--out", pred_url, "--quiet"]
    assert main(argv) == 1
    assert main([*argv, "--overwrite"]) == 0
    with pytest.raises(FileExistsError, match="already exists"):
        write_store(pred_url, np.zeros((4, 2), np.float32))
    # the model names no credential: it holds the store URL, never keys
    fs.invalidate_cache()
    blob = fs.cat_file(f"{BUCKET}/models/model.npz")
    assert SECRET.encode() not in blob and KEY_ID.encode() not in blob


def test_an_s3_copy_short_of_chunks_is_named_instead_of_read_as_zeros(s3, s3_store):
    # zarr reads a missing chunk as its fill value: a copy cut short (an
    # interrupted `aws s3 sync`) opened and fitted on zeros without a word,
    # where a local store's missing chunks were already counted
    _, fs = s3
    fs.invalidate_cache()
    copy = f"{BUCKET}/short.zarr"
    fs.copy(s3_store.removeprefix("s3://"), copy, recursive=True)
    for name, lost in (("X", 3), ("y", 1)):
        chunks = sorted(k for k in fs.find(f"{copy}/{name}") if "/c/" in k)
        assert len(chunks) == N_ROWS // CHUNK
        fs.rm(chunks[:lost])
    fs.invalidate_cache()
    with pytest.warns(UserWarning) as said:
        open_dataset(f"s3://{copy}")
    said = [str(w.message) for w in said]
    n = N_ROWS // CHUNK
    assert any(f"s3://{copy}: 3 of the {n} chunks of its array 'X' are not stored" in m
               and "incomplete copy" in m for m in said), said
    assert any(f"1 of the {n} chunks of its array 'y' are not stored" in m for m in said), said


def _dkernel(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "dkernel", *args], stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_fit_killed_mid_way_resumes_from_an_s3_checkpoint_to_the_same_model(s3, cluster, s3_store,
                                                                            tmp_path):
    env, fs = s3
    address, state = cluster
    ref_url, out_url = f"s3://{BUCKET}/ref.npz", f"s3://{BUCKET}/resumed.npz"
    ckpt_url = f"s3://{BUCKET}/ckpt/fit.ckpt.npz"
    assert main(["fit", s3_store, *FIT, "--scheduler", address, "--out", ref_url]) == 0

    # A reader polls the checkpoint the whole time the fit rewrites it: every
    # read must be a complete file (written to a temporary key, verified, and
    # only then copied onto the checkpoint's key).
    reads, errors, stop = [], [], threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                reads.append(int(read_npz(ckpt_url)[1]["step"]))
            except FileNotFoundError:
                pass
            except Exception as exc:  # a half-written or unreadable checkpoint
                errors.append(repr(exc))
            time.sleep(0.02)

    log = tmp_path / "fit.log"
    fit = ["fit", s3_store, *FIT, "--scheduler", address, "--checkpoint", ckpt_url,
           "--checkpoint-every", "1", "--out", out_url]
    reader = threading.Thread(target=poll, daemon=True)
    reader.start()
    proc = _dkernel(fit, env, log)
    try:
        deadline = time.monotonic() + 120
        while not reads or reads[-1] < TOTAL_STEPS // 2:
            assert proc.poll() is None, f"the fit ended before the kill:\n{log.read_text()}"
            assert time.monotonic() < deadline, "no checkpoint past half-way within 120 s"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    killed_at = int(read_npz(ckpt_url)[1]["step"])
    assert TOTAL_STEPS // 2 <= killed_at < TOTAL_STEPS
    assert not fs.exists(f"{BUCKET}/resumed.npz")

    proc = _dkernel([*fit, "--resume"], env, log)
    assert proc.wait(timeout=180) == 0, log.read_text()
    stop.set()
    reader.join(timeout=10)
    assert errors == [], errors[:3]
    assert len(reads) > 10 and reads == sorted(reads), reads  # never an older checkpoint
    assert not fs.exists(ckpt_url.removeprefix("s3://")), "a finished fit removes its checkpoint"
    assert [k for k in fs.find(BUCKET) if ".tmp-" in k] == []
    # bit-identical: the resumed fit replays the plan from the exact saved state
    np.testing.assert_array_equal(load_model(out_url).coef_, load_model(ref_url).coef_)

    # No credential in any model, nor in the fit's output or the cluster's logs.
    fs.invalidate_cache()
    for key in (f"{BUCKET}/ref.npz", f"{BUCKET}/resumed.npz"):
        blob = fs.cat_file(key)
        assert SECRET.encode() not in blob and KEY_ID.encode() not in blob
    for path in [log, *state.glob("*.log")]:
        text = path.read_text(errors="replace")
        assert SECRET not in text and KEY_ID not in text, path


def test_parquet_on_s3_is_ingested_to_s3_by_the_workers(s3, cluster, csv_file):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    _, fs = s3
    address, _ = cluster
    _, X, y = csv_file
    for i, rows in enumerate((slice(0, 1200), slice(1200, N_ROWS))):
        cols = {f"x{j}": X[rows, j].astype(np.float32) for j in range(D)}
        with fs.open(f"{BUCKET}/table/part-{i}.parquet", "wb") as f:
            pq.write_table(pa.table({**cols, "label": y[rows].astype(np.int64)}), f,
                           row_group_size=300)
    url = f"s3://{BUCKET}/from-parquet.zarr"
    assert main(["ingest", f"s3://{BUCKET}/table", "--format", "parquet", "--target", "label",
                 "--chunk-rows", str(CHUNK), "--out", url, "--scheduler", address]) == 0
    data = open_dataset(url)
    np.testing.assert_array_equal(data.X.compute(scheduler="sync"), X.astype(np.float32))
    labels = data.y.compute(scheduler="sync")
    assert labels.dtype == np.int64 and np.array_equal(labels, y)
    fs.invalidate_cache()
    assert [k for k in fs.ls(BUCKET) if ".tmp-" in k] == []


@pytest.mark.parametrize("argv", [["info", "s3://bucket/x.zarr"],
                                  ["fit", "s3://bucket/x.zarr", "--solver", "dsg",
                                   "--out", "m.npz"]])
def test_an_s3_url_without_s3fs_names_the_extra_in_one_line(argv, tmp_path):
    """Without s3fs (hidden from a fresh interpreter), an s3:// store stops with
    one line that names ``dkernel[s3]``, not fsspec's advice deep in a traceback."""
    code = ("import sys\nsys.modules['s3fs'] = None  # as if it were not installed\n"
            "from dkernel.cli import main\n"
            f"sys.exit(main({argv!r}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'dkernel[s3]'" in lines[0], run.stderr


def test_a_chained_url_is_checked_link_by_link():
    """fsspec's chained URLs (simplecache::s3://...) name a file system a link; each
    must exist, and an unknown one is refused in one line."""
    from dkernel.files import require_protocol

    require_protocol("simplecache::memory://bucket/store.zarr")
    with pytest.raises(ValueError, match="no file system for nosuch://"):
        require_protocol("simplecache::nosuch://bucket/store.zarr")


def test_an_unwritable_url_output_is_refused_before_any_work(s3, s3_store, capsys):
    # a missing bucket failed only once the whole fit was done, and the model was lost
    capsys.readouterr()
    assert main(["fit", s3_store, *FIT, "--out", "s3://no-such-bucket/m.npz"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dkernel: error: --out 's3://no-such-bucket/m.npz' cannot be written")
    assert "dsg" not in err  # no fit started: no progress line


def test_an_unreachable_endpoint_is_one_line_naming_the_fix(tmp_path):
    # the right error, then ~100 lines of "Exception ignored in: <coroutine
    # FsspecStore.get>" from the process's exit; and the advice was "a store is a
    # zarr group holding arrays 'X'", whatever the failure
    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{_free_port()}"}
    proc = subprocess.run([sys.executable, "-m", "dkernel", "info", f"s3://{BUCKET}/none.zarr"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "check the endpoint and the network (e.g. AWS_ENDPOINT_URL)" in proc.stderr
