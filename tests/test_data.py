"""Opening datasets from NumPy, dask and zarr stores by path or fsspec URL."""

from __future__ import annotations

import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import zarr

from dkernel.data import open_dataset, write_store
from dkernel.data.store import atomic_store


def test_store_by_path_and_file_url_open_lazily_with_row_chunks(tmp_path):
    X = np.random.default_rng(0).standard_normal((1000, 5)).astype(np.float32)
    y = np.arange(1000)
    path = write_store(tmp_path / "s.zarr", X, y, chunk_rows=300)
    for source in (path, f"file://{path}"):
        data = open_dataset(source)
        assert isinstance(data.X, da.Array) and data.row_chunks == (300, 300, 300, 100)
        assert data.y.chunks[0] == data.X.chunks[0]
        np.testing.assert_array_equal(data.X.compute(), X)


def test_a_store_rows_read_in_one_task_are_the_dask_arrays_rows(tmp_path):
    from dkernel.data.dataset import read_store_rows

    rng = np.random.default_rng(1)
    X = rng.standard_normal((1000, 5)).astype(np.float32)
    y = rng.standard_normal(1000)
    data = open_dataset(write_store(tmp_path / "s.zarr", X, y, chunk_rows=300))
    assert data.store is not None and data.store.root == str(tmp_path / "s.zarr")
    Xc, yc = read_store_rows(data.store, 300, 600)
    np.testing.assert_array_equal(Xc, data.X.blocks[1].compute())
    np.testing.assert_array_equal(yc, data.y.blocks[1].compute())
    Xr, yr = read_store_rows(data.store, 900, 1000, np.array([0, 7, 99]))
    np.testing.assert_array_equal(Xr, X[[900, 907, 999]])
    np.testing.assert_array_equal(yr, y[[900, 907, 999]])
    # y given apart from the store, or rows taken out of it: no store reader
    assert open_dataset(tmp_path / "s.zarr", y).store is None
    assert open_dataset(data.X[::2], data.y[::2]).store is None


def test_memory_url_store_round_trip():
    X = np.ones((40, 3), dtype=np.float32)
    g = zarr.open_group("memory://dkernel-test.zarr", mode="w")
    g.create_array("X", shape=X.shape, chunks=(16, 3), dtype=X.dtype)[:] = X
    data = open_dataset("memory://dkernel-test.zarr")
    with dask.config.set(scheduler="sync"):  # memory:// lives in this process only
        assert data.X.sum().compute() == 120
    assert data.y is None and data.row_chunks == (16, 16, 8)


def test_a_memory_url_store_read_by_worker_processes_is_refused(client):
    # each worker process has a memory:// file system of its own: a fit read
    # zeros there, trained on them and scored 1.0
    from dkernel import DSGRegressor

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3)).astype(np.float32)
    write_store("memory://dkernel-test/procs.zarr", X, X[:, 0].copy(), chunk_rows=50,
                overwrite=True)
    with pytest.raises(FileNotFoundError, match="lives in the process that wrote it"):
        DSGRegressor(n_features=64, n_epochs=1, bandwidth=1.0,
                     client=client).fit("memory://dkernel-test/procs.zarr")
    with pytest.raises(FileNotFoundError, match="lives in the process that wrote it"):
        open_dataset("memory://dkernel-test/procs.zarr").X.sum().compute()


def test_column_chunked_dask_input_is_rechunked_to_whole_rows():
    X = da.ones((100, 10), chunks=(25, 5))
    data = open_dataset(X)
    assert data.X.chunks[1] == (10,) and data.n_chunks == 4


def test_numpy_input_is_chunked_by_rows_and_kept_for_scattering():
    X = np.zeros((50, 2))
    data = open_dataset(X, np.zeros(50), chunk_rows=20)
    assert data.row_chunks == (20, 20, 10) and data.host is not None


def test_failed_store_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.zarr"
    with pytest.raises(RuntimeError):
        with atomic_store(target) as g:
            g.create_array("X", shape=(2, 2), dtype="f4")
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_existing_store_is_not_overwritten_by_default(tmp_path):
    path = write_store(tmp_path / "s.zarr", np.ones((4, 2)))
    with pytest.raises(FileExistsError, match="already exists"):
        write_store(path, np.ones((4, 2)))


@pytest.mark.parametrize("d", [1, 2, 3, 5])
def test_synthetic_classes_need_no_more_inputs_than_classes(d):
    # ``make-store --task classification --inputs 2`` stopped with numpy's
    # "operands could not be broadcast"
    from dkernel.datasets import make_blobs_classification

    X, y = make_blobs_classification(300, d, n_classes=3)
    assert X.shape == (300, d) and set(np.unique(y)) == {0, 1, 2}


def test_a_stores_y_chunked_otherwise_is_aligned_and_lazy_inputs_are_named(tmp_path):
    # valid zarr from another writer: y in other chunks than X (the message
    # said "rechunk y", which a path gives no handle on)
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    X = np.arange(200, dtype=np.float32).reshape(100, 2)
    g.create_array("X", data=X, chunks=(30, 2))
    g.create_array("y", data=np.arange(100.0), chunks=(45,))
    data = open_dataset(str(tmp_path / "s.zarr"))
    assert data.y.chunks[0] == data.X.chunks[0]
    np.testing.assert_array_equal(data.y.compute(), np.arange(100.0))
    # a dask DataFrame, unknown chunk sizes and a path for y: one line each
    # (AttributeError, "cannot convert float NaN to integer" and "'str' object
    # has no attribute 'ndim'" before)
    dd = pytest.importorskip("dask.dataframe")
    pd = pytest.importorskip("pandas")
    ddf = dd.from_pandas(pd.DataFrame(X, columns=["a", "b"]), npartitions=2)
    with pytest.raises(TypeError, match=r"X is a dask DataFrame; pass X.to_dask_array\("):
        open_dataset(ddf)
    with pytest.raises(ValueError, match="X has unknown chunk sizes"):
        open_dataset(ddf.to_dask_array())
    with pytest.raises(ValueError, match="y has unknown chunk sizes"):
        open_dataset(X, ddf["a"].to_dask_array())
    with pytest.raises(TypeError, match="y is a path"):
        open_dataset(str(tmp_path / "s.zarr"), "y.zarr")


def test_stale_consolidated_metadata_does_not_hide_rows(tmp_path):
    # rows appended after consolidate_metadata: the consolidated copy said 50
    # rows of 100, and fit, predict and info used half the data
    path = str(tmp_path / "c.zarr")
    X = np.arange(150, dtype=np.float64).reshape(50, 3)
    g = zarr.open_group(path, mode="w", zarr_format=2)
    g.create_array("X", data=X, chunks=(10, 3))
    zarr.consolidate_metadata(path)
    arr = zarr.open_array(f"{path}/X", mode="a")
    arr.resize((100, 3))
    arr[50:] = X
    assert open_dataset(path).n_rows == 100


def test_write_store_checks_what_it_writes(tmp_path):
    # lists and DataFrames were tracebacks; y of other rows, a 1-D X, text y and
    # chunk_rows=0 were written into stores every later command refused
    import pandas as pd
    import scipy.sparse

    X = np.random.default_rng(0).normal(size=(50, 3))
    y = (X[:, 0] > 0).astype(int)
    for i, (Xa, ya) in enumerate([(X.tolist(), y.tolist()), (pd.DataFrame(X), pd.Series(y))]):
        data = open_dataset(write_store(tmp_path / f"ok{i}.zarr", Xa, ya))
        np.testing.assert_array_equal(data.X.compute(), X)
    for Xa, ya, kw, error, match in [
            (scipy.sparse.csr_matrix(X), y, {}, TypeError, "toarray"),
            (X, y[:-3], {}, ValueError, "y has shape \\(47,\\) but X has 50 rows"),
            (X[:, 0], y, {}, ValueError, "X must be 2-D"),
            (X[:0], y[:0], {}, ValueError, "X must be 2-D"),
            (X, y.astype(str), {}, TypeError, "y holds text"),
            (X, y, {"chunk_rows": 0}, ValueError, "chunk_rows must be > 0")]:
        with pytest.raises(error, match=match):
            write_store(tmp_path / "bad.zarr", Xa, ya, **kw)
        assert not (tmp_path / "bad.zarr").exists()


def test_an_object_store_a_worker_cannot_read_is_named_with_the_fix():
    # a worker without the store's credentials said only "Unable to locate credentials"
    from dkernel.data.dataset import StoreArrays, read_store_rows

    class Unreadable:  # an s3:// array as a worker without AWS_* sees it
        store = None

        def __getitem__(self, key):
            raise RuntimeError("Unable to locate credentials")

    store = StoreArrays(Unreadable(), None, None, "s3://bucket/train.zarr")
    with pytest.raises(OSError, match=r"cannot read rows 0:10 of s3://bucket/train.zarr "
                                      r"\(RuntimeError: Unable to locate credentials\); every "
                                      "worker needs the store's credentials"):
        read_store_rows(store, 0, 10)


def test_a_store_with_chunks_not_stored_is_said_not_read_as_zeros_in_silence(tmp_path):
    """zarr reads a missing chunk as its fill value: a copy short of 3 of its 4
    chunks of X fitted (accuracy 0.507 against 0.994) and dkernel info called
    it complete; a shape edited to 1e12 rows died in dask with a MemoryError.
    zarr's writers leave out chunks of fill values, so a missing chunk is
    said, not refused, unless the shape claims far more than is stored."""
    import json
    import os

    import zarr

    X = np.zeros((4000, 3), np.float32)
    X[:1000] = 1
    y = np.zeros(4000, np.int64)
    path = write_store(tmp_path / "s.zarr", X, y, chunk_rows=1000)
    # dkernel writes every chunk, zeros too, so a missing one is news
    assert zarr.open_array(os.path.join(path, "X")).nchunks_initialized == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_dataset(path).n_rows == 4000
    os.remove(os.path.join(path, "y", "c", "3"))
    # (an rsync temporary beside the chunks is not one)
    open(os.path.join(path, "y", "c", ".3.Xa81kq"), "w").close()
    with pytest.warns(UserWarning, match=r"1 of the 4 chunks of its array 'y' are not stored.*"
                                         r"fill value \(0\); dkernel wrote every chunk of it"):
        open_dataset(path)
    # the shape claims more rows than the chunk files hold
    path = write_store(tmp_path / "t.zarr", X, y, chunk_rows=1000)
    meta = os.path.join(path, "X", "zarr.json")
    with open(meta) as f:
        doc = json.load(f)
    doc["shape"][0] = 10**12
    with open(meta, "w") as f:
        json.dump(doc, f)
    with pytest.raises(ValueError, match=r"999999996 of the 1000000000 chunks.*its shape "
                                         r"\(1000000000000 rows\) claims far more"):
        open_dataset(path)
    # another writer leaves out chunks of fill values (zarr's default): said as such
    g = zarr.open_group(str(tmp_path / "foreign.zarr"), mode="w")
    g.create_array("X", data=X, chunks=(1000, 3))
    g.create_array("y", data=y, chunks=(1000,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert open_dataset(str(tmp_path / "foreign.zarr")).n_rows == 4000
    said = [str(w.message) for w in caught]
    assert any("3 of the 4 chunks of its array 'X' are not stored" in m and
               "may leave out chunks that hold only that value" in m for m in said), said
    assert any("4 of the 4 chunks of its array 'y' are not stored" in m for m in said), said
