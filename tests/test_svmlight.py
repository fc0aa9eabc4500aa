"""libsvm ingest through scikit-learn's reader, range by range: in this process
and on the workers, the same rows as one whole-file read; errors name the line."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest
import zarr
from sklearn.datasets import load_svmlight_file

from dkernel.cli import main
from dkernel.data.ingest import IngestError, ingest_libsvm
from dkernel.data.svmlight import byte_ranges, ingest_libsvm_parallel, read_range


def _write(path, n=300, d=12, seed=0, unsorted_every=0, extras=True):
    """A libsvm file of n rows (some empty), comments, blank lines and qid fields;
    every ``unsorted_every``-th row lists its indices in reverse."""
    rng = np.random.default_rng(seed)
    X = np.where(rng.random((n, d)) < 0.3, rng.normal(size=(n, d)).round(3), 0.0)
    y = rng.integers(-1, 3, n).astype(float)
    lines = ["# header comment"] if extras else []
    for i in range(n):
        idx = np.flatnonzero(X[i])
        if unsorted_every and i % unsorted_every == 0:
            idx = idx[::-1]
        qid = "qid:7 " if extras and i % 11 == 0 else ""
        lines.append(f"{y[i]:g} {qid}" + " ".join(f"{j + 1}:{X[i, j]:g}" for j in idx)
                     + ("  # note" if extras and i % 13 == 0 else ""))
        if extras and i % 17 == 0:
            lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return X.astype(np.float32), y


@pytest.mark.parametrize("unsorted_every", [0, 5])
def test_ranges_give_every_line_once(tmp_path, unsorted_every):
    # any cut of the file: scikit-learn's offset/length rule (and our reader's
    # copy of it for unsorted rows) gives each line to exactly one range
    X, y = _write(tmp_path / "d.svm", unsorted_every=unsorted_every)
    for blocksize in (1, 7, 64, 333, 10**9):
        parts = [read_range(str(tmp_path / "d.svm"), r, 12, False) for r in
                 byte_ranges(str(tmp_path / "d.svm"), blocksize)]
        Xr = np.vstack([p[0].toarray() for p in parts])
        yr = np.concatenate([p[1] for p in parts])
        np.testing.assert_array_equal(Xr, X)
        np.testing.assert_array_equal(yr, y)


def test_sorted_files_take_scikit_learns_reader(tmp_path):
    _write(tmp_path / "d.svm", extras=False)
    X, y = read_range(str(tmp_path / "d.svm"), (0, -1), 12, False)
    Xs, ys = load_svmlight_file(str(tmp_path / "d.svm"), n_features=12, dtype=np.float32)
    np.testing.assert_array_equal(X.toarray(), Xs.toarray())
    np.testing.assert_array_equal(y, ys)


def test_gzip_is_one_range(tmp_path):
    X, y = _write(tmp_path / "d.svm")
    (tmp_path / "d.svm.gz").write_bytes(gzip.compress((tmp_path / "d.svm").read_bytes()))
    assert byte_ranges(str(tmp_path / "d.svm.gz"), 64) == [(0, -1)]
    Xr, yr = read_range(str(tmp_path / "d.svm.gz"), (0, -1), 12, False)
    np.testing.assert_array_equal(Xr.toarray(), X)


def test_parallel_ingest_matches_serial(tmp_path, client):
    X, y = _write(tmp_path / "d.svm", n=500, unsorted_every=7)
    serial = ingest_libsvm(tmp_path / "d.svm", tmp_path / "s.zarr", chunk_rows=64)
    par = ingest_libsvm_parallel(tmp_path / "d.svm", tmp_path / "p.zarr", chunk_rows=64,
                                 client=client, blocksize=700)  # ~20 ranges
    a, b = zarr.open_group(serial, mode="r"), zarr.open_group(par, mode="r")
    assert b["X"].shape == (500, 12) and b["X"].chunks == (64, 12)
    np.testing.assert_array_equal(b["X"][:], a["X"][:])
    np.testing.assert_array_equal(b["X"][:], X)
    np.testing.assert_array_equal(b["y"][:], y.astype(np.float32))


def test_parallel_errors_name_the_line_and_leave_no_store(tmp_path, client):
    _write(tmp_path / "d.svm", n=400, extras=False)
    lines = (tmp_path / "d.svm").read_text().splitlines()
    lines[350] = "1 3=1 4:2"
    (tmp_path / "d.svm").write_text("\n".join(lines) + "\n")
    with pytest.raises(IngestError, match=r"d\.svm:351: cannot read '3=1' as index:value"):
        ingest_libsvm_parallel(tmp_path / "d.svm", tmp_path / "p.zarr", client=client,
                               blocksize=500)
    assert not os.path.exists(tmp_path / "p.zarr")


def test_cli_parallel_libsvm(tmp_path, client, capsys):
    X, _ = _write(tmp_path / "d.svm", n=200)
    assert main(["ingest", str(tmp_path / "d.svm"), "--out", str(tmp_path / "c.zarr"),
                 "--parallel", "--scheduler", client.scheduler.address]) == 0
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "c.zarr"), mode="r")["X"][:], X)
    err = capsys.readouterr().err
    assert "ingest: 1/1 chunks" in err and "ingest: 1/1 parts counted" in err, err
    # read here: progress in MB of the file read
    assert main(["ingest", str(tmp_path / "d.svm"), "--out", str(tmp_path / "s.zarr")]) == 0
    assert "ingest: 1/1 MB" in capsys.readouterr().err


def test_cli_parses_large_files_on_the_workers_by_default(tmp_path, client, monkeypatch):
    from dkernel.cli import ingest as cli_ingest

    monkeypatch.setattr(cli_ingest, "_PARALLEL_BYTES", 1000)  # "large" for this test
    X, _ = _write(tmp_path / "big.svm", n=300)
    assert os.path.getsize(tmp_path / "big.svm") > 1000
    assert main(["ingest", str(tmp_path / "big.svm"), "--out", str(tmp_path / "b.zarr"),
                 "--scheduler", client.scheduler.address]) == 0
    prefixes = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes))
    assert "dense_range" in prefixes  # parsed by tasks on the workers
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "b.zarr"), mode="r")["X"][:], X)


def test_counting_rows_matches_parsing_them(tmp_path):
    # with n_features given the first pass only counts data lines; it must
    # agree with the parser on every cut (comments, blank lines, no final newline)
    from dkernel.data.svmlight import scan_range

    _write(tmp_path / "d.svm", n=200, unsorted_every=9)
    text = (tmp_path / "d.svm").read_text()
    (tmp_path / "e.svm").write_text(text.rstrip("\n") + "\r\n# end\n3 1:1")
    for name in ("d.svm", "e.svm"):
        path = str(tmp_path / name)
        for blocksize in (1, 50, 400, 10**9):
            for r in byte_ranges(path, blocksize):
                parsed = len(read_range(path, r, 12, False)[1])
                assert scan_range(path, r, False, 12) == (parsed, 12)


def test_a_width_claimed_by_one_index_is_refused_unless_given(tmp_path):
    """A 20-byte file with the index 300000000 ingested into a 2 x 3e8 store
    (1.7 GB of memory); 2^31 failed with "value too large to convert to int"."""
    for index in (300_000_000, 3_000_000_000):
        path = tmp_path / f"w{index}.svm"
        path.write_text(f"1 {index}:1\n0 1:2\n")
        with pytest.raises(IngestError, match=rf"makes {index} columns, .* GB a dense float32 "
                                              r"row.*pass n_features \(--n-inputs\)"):
            ingest_libsvm(str(path), str(tmp_path / f"w{index}.zarr"))
    # (the size is the store's dtype's: it said float32 whatever --dtype was)
    with pytest.raises(IngestError, match=r"makes 300000000 columns, 2.2 GB a dense float64 row"):
        ingest_libsvm(str(tmp_path / "w300000000.svm"), str(tmp_path / "w.zarr"), dtype="float64")
