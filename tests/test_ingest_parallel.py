"""Parallel ingest on the Dask workers: Parquet (pyarrow) and large CSV files
(byte ranges, pandas' pyarrow engine) -> row-chunked zarr stores written by
the workers, complete or absent, with integer labels kept integers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

pa = pytest.importorskip("pyarrow", reason="Parquet ingest reads with pyarrow")
pq = pytest.importorskip("pyarrow.parquet", reason="Parquet ingest reads with pyarrow")

from dkernel.cli import main  # noqa: E402
from dkernel.data import open_dataset  # noqa: E402
from dkernel.data.ingest import IngestError, ingest, ingest_csv  # noqa: E402
from dkernel.data.tabular import ingest_csv_parallel, ingest_parquet  # noqa: E402


def _table(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, 7, n).astype(np.int64)


def _write_parquet(folder, X, y, parts: int) -> str:
    """A folder of ``parts`` Parquet files, each with several row groups."""
    os.makedirs(folder, exist_ok=True)
    for i, (Xi, yi) in enumerate(zip(np.array_split(X, parts), np.array_split(y, parts))):
        cols = {f"f{j}": Xi[:, j] for j in range(X.shape[1])}
        cols["label"] = yi
        pq.write_table(pa.table(cols), os.path.join(folder, f"part-{i}.parquet"),
                       row_group_size=97)
    return str(folder)


def _leftovers(folder) -> list[str]:
    return [n for n in os.listdir(folder) if ".tmp-" in n]


def test_parquet_folder_is_ingested_on_the_workers_with_integer_labels(client, tmp_path):
    X, y = _table(1000, 6, 0)
    src = _write_parquet(tmp_path / "table", X, y, parts=3)
    before = client.run(lambda dask_worker: dask_worker.state.executed_count)
    # tasks of two 128-row chunks: 4 tasks, their edges cutting the 97-row groups
    out = ingest_parquet(src, tmp_path / "s.zarr", target="label", chunk_rows=128, client=client,
                         blocksize=2 * 128 * 6 * 4)
    after = client.run(lambda dask_worker: dask_worker.state.executed_count)
    assert all(after[w] > before[w] for w in after), "every worker reads and writes chunks"
    g = zarr.open_group(out, mode="r")
    assert g["X"].chunks == (128, 6) and g["X"].dtype == np.float32
    np.testing.assert_array_equal(g["X"][:], X)
    assert g["y"].dtype == np.int64  # integer labels stay integers
    np.testing.assert_array_equal(g["y"][:], y)
    assert g.attrs["columns"] == [f"f{j}" for j in range(6)] and g.attrs["target"] == "label"
    assert _leftovers(tmp_path) == []
    data = open_dataset(out)  # a valid dataset store: aligned X / y chunks
    assert data.n_rows == 1000 and data.n_chunks == 8


def test_parquet_single_file_through_ingest_and_the_cli(client, tmp_path, capsys):
    X, y = _table(300, 3, 1)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": X[:, 0], "label": y, "b": X[:, 1], "c": X[:, 2]}), path)
    out = ingest(path, tmp_path / "api.zarr", target="label", chunk_rows=100, client=client)
    np.testing.assert_array_equal(zarr.open_group(out, mode="r")["X"][:], X)
    assert main(["ingest", str(path), "--out", str(tmp_path / "cli.zarr"), "--target", "label",
                 "--chunk-rows", "100", "--scheduler", client.scheduler.address]) == 0
    printed, err = capsys.readouterr()
    assert "X 300 x 3 float32, y (300,) int64, 3 chunk(s) of 100 rows" in printed, printed
    assert "ingest: 1/1 tasks" in err, err  # the workers' writes, counted as they finish


def test_pandas_index_columns_are_dropped_and_numbered_parts_read_in_number_order(client,
                                                                                tmp_path):
    import pandas as pd

    # a shuffled split keeps pandas' index, written as a last column
    # "__index_level_0__": it was the default target, and the label a feature
    X, y = _table(200, 2, 3)
    df = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "label": y}).sample(frac=0.5, random_state=0)
    df.to_parquet(tmp_path / "s.parquet")
    g = zarr.open_group(ingest_parquet(tmp_path / "s.parquet", tmp_path / "s.zarr",
                                       client=client), mode="r")
    assert g.attrs["columns"] == ["a", "b"] and g.attrs["target"] == "label"
    assert g.attrs["dropped_index_columns"] == ["__index_level_0__"]
    np.testing.assert_array_equal(g["y"][:], df["label"].to_numpy())
    # named, an index column is the target
    g = zarr.open_group(ingest_parquet(tmp_path / "s.parquet", tmp_path / "i.zarr",
                                       target="__index_level_0__", client=client), mode="r")
    np.testing.assert_array_equal(g["y"][:], df.index.to_numpy())
    # part.10 after part.9 (dask and Spark do not zero-pad part numbers)
    os.makedirs(tmp_path / "parts")
    for i, (Xi, yi) in enumerate(zip(np.array_split(X, 12), np.array_split(y, 12))):
        pq.write_table(pa.table({"a": Xi[:, 0], "b": Xi[:, 1], "label": yi}),
                       tmp_path / "parts" / f"part.{i}.parquet")
    g = zarr.open_group(ingest_parquet(tmp_path / "parts", tmp_path / "p.zarr", client=client),
                        mode="r")
    np.testing.assert_array_equal(g["X"][:], X)


def test_parquet_with_a_text_column_is_refused_naming_it_and_writes_nothing(client, tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1.0, 2.0], "city": ["x", "y"], "label": [0, 1]}), path)
    with pytest.raises(IngestError, match="column 'city' is .*not numeric"):
        ingest_parquet(path, tmp_path / "s.zarr", client=client)
    assert not (tmp_path / "s.zarr").exists() and _leftovers(tmp_path) == []


def test_parquet_failing_while_workers_write_leaves_no_output(client, tmp_path):
    # The last file has a label missing: found only by the worker that reads
    # it, while the other tasks write their chunks.
    X, y = _table(600, 2, 2)
    src = _write_parquet(tmp_path / "table", X, y, parts=3)
    bad = pa.table({"f0": pa.array([1.0] * 10, pa.float32()),
                    "f1": pa.array([2.0] * 10, pa.float32()),
                    "label": pa.array([0] * 9 + [None], pa.int64())})
    pq.write_table(bad, os.path.join(src, "part-9.parquet"))
    with pytest.raises(IngestError, match="target column 'label' has 1 missing value"):
        ingest_parquet(src, tmp_path / "s.zarr", chunk_rows=64, client=client, blocksize=64 * 2 * 4)
    assert not (tmp_path / "s.zarr").exists() and _leftovers(tmp_path) == []


def test_parquet_files_with_different_columns_are_refused_naming_the_file(client, tmp_path):
    X, y = _table(100, 2, 4)
    src = _write_parquet(tmp_path / "table", X, y, parts=2)
    pq.write_table(pa.table({"f0": [1.0], "other": [2.0], "label": [1]}),
                   os.path.join(src, "part-5.parquet"))
    with pytest.raises(IngestError, match="part-5.parquet: its columns differ"):
        ingest_parquet(src, tmp_path / "s.zarr", client=client)
    assert not (tmp_path / "s.zarr").exists()


def test_csv_read_in_byte_ranges_equals_the_serial_reader_and_keeps_integer_labels(client,
                                                                                   tmp_path):
    X, y = _table(2000, 4, 3)
    path = tmp_path / "d.csv"
    with open(path, "w") as f:
        f.write("a,b,c,d,label\n")
        for row, label in zip(X, y):
            f.write(",".join(repr(float(v)) for v in row) + f",{label}\n")
    # 8 kB byte ranges: ~10 partitions whose row counts do not match the chunks
    out = ingest_csv_parallel(path, tmp_path / "p.zarr", chunk_rows=300, client=client,
                              blocksize=8192)
    serial = ingest_csv(path, tmp_path / "s.zarr", chunk_rows=300)
    gp, gs = zarr.open_group(out, mode="r"), zarr.open_group(serial, mode="r")
    np.testing.assert_array_equal(gp["X"][:], gs["X"][:])
    np.testing.assert_array_equal(gp["X"][:], X)
    assert gp["y"].dtype == gs["y"].dtype == np.int32  # as the serial reader types them
    np.testing.assert_array_equal(gp["y"][:], y)
    assert gp["X"].chunks == (300, 4)


def test_parallel_and_serial_csv_ingest_type_labels_alike(client, tmp_path):
    # "0.000000" labels were float64 in parallel and int32 in serial ingest (a
    # classifier's classes_ and predictions then floats or ints by a speed flag)
    for labels, expected in ((["0.000000", "1.000000", "2.000000"], np.int32),
                             (["0", "1", "2"], np.int32), (["0.5", "1", "2"], np.float64),
                             (["3000000000", "-1", "7"], np.int64)):
        path = tmp_path / "l.csv"
        path.write_text("a,label\n" + "".join(f"{i},{v}\n" for i, v in enumerate(labels * 40)))
        kw = dict(target="label", overwrite=True)
        par = ingest_csv_parallel(path, tmp_path / "p.zarr", client=client, blocksize=256, **kw)
        ser = ingest_csv(path, tmp_path / "s.zarr", **kw)
        yp, ys = (zarr.open_group(o, mode="r")["y"][:] for o in (par, ser))
        assert yp.dtype == ys.dtype == expected, (labels, yp.dtype, ys.dtype)
        np.testing.assert_array_equal(yp, ys)


def test_cli_parallel_csv_without_header_and_no_target(client, tmp_path, capsys):
    (tmp_path / "d.csv").write_text("".join(f"{i} {2 * i}\n" for i in range(50)))
    assert main(["ingest", str(tmp_path / "d.csv"), "--out", str(tmp_path / "s.zarr"),
                 "--parallel", "--no-target", "--chunk-rows", "20",
                 "--scheduler", client.scheduler.address]) == 0
    out, err = capsys.readouterr()
    assert "X 50 x 2 float32, 3 chunk(s) of 20 rows" in out
    assert "ingest: 3/3 chunks" in err, err
    # the first pass, counting the rows of every part of the file, said nothing
    assert "ingest: 1/1 parts counted" in err, err
    X = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")["X"][:]
    np.testing.assert_array_equal(X[:, 1], 2 * np.arange(50))


def test_missing_values_are_refused_on_the_workers_as_the_serial_reader_refuses_them(client,
                                                                                     tmp_path):
    # The workers wrote NaN for empty CSV fields and Parquet nulls (a CSV over
    # 64 MB takes this path unasked); the serial reader names the field.
    csv = tmp_path / "miss.csv"
    csv.write_text("a,b,label\n1,2,0\n3,,1\n5,6,0\n")
    with pytest.raises(IngestError, match="empty value"):
        ingest_csv(csv, tmp_path / "serial.zarr", target="label")
    missing = "missing or non-finite value in column '{}' at data row 1"
    with pytest.raises(IngestError, match=missing.format("b")):
        ingest_csv_parallel(csv, tmp_path / "p.zarr", target="label", client=client)
    pq.write_table(pa.table({"a": pa.array([1.0, None, 3.0]), "b": [1.0, 2.0, 3.0],
                             "label": [0, 1, 0]}), tmp_path / "n.parquet")
    with pytest.raises(IngestError, match=missing.format("a")):
        ingest_parquet(tmp_path / "n.parquet", tmp_path / "q.zarr", client=client)
    header_only = tmp_path / "h.csv"
    header_only.write_text("a,b,label\n")
    with pytest.raises(IngestError, match="no data rows"):  # it said "column 'a' is string"
        ingest_csv_parallel(header_only, tmp_path / "h.zarr", target="label", client=client)
    assert not any((tmp_path / n).exists() for n in ("p.zarr", "q.zarr", "h.zarr"))
    assert _leftovers(tmp_path) == []


def test_a_ragged_row_and_an_unnamed_gzip_are_read_or_refused_naming_the_file(client, tmp_path):
    import gzip

    # the parser's "CSV parse error: Expected 3 columns, got 2" named no file
    lines = ["a,b,label"] + [f"{i},{i + 1},{i % 2}" for i in range(400)]
    lines[300] = "5,1"
    csv = tmp_path / "ragged.csv"
    csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(IngestError, match=r"ragged.csv: .*Expected 3 columns, got 2"):
        ingest_csv_parallel(csv, tmp_path / "r.zarr", target="label", client=client,
                            blocksize=1000)
    # gzip is known by its first bytes, as the serial reader knows it, not by the name
    lines[300] = "5,1,1"
    (tmp_path / "table.csv").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    g = zarr.open_group(ingest_csv_parallel(tmp_path / "table.csv", tmp_path / "g.zarr",
                                            target="label", client=client), mode="r")
    assert g["X"].shape == (400, 2) and g["y"][299] == 1  # (data row 299 is line 301)


def test_a_missing_value_past_the_first_part_of_a_csv_is_named_by_row(client, tmp_path):
    # the first part types column b as integers; an empty field further down
    # stopped ingest with dask's "Mismatched dtypes" table and its advice, and a
    # fraction (a valid number the serial reader takes) the same way
    lines = ["a,b,label"] + [f"{i},{i + 1},{i % 2}" for i in range(400)]
    lines[300] = "5,,1"
    csv = tmp_path / "late.csv"
    csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(IngestError, match="missing or non-finite value in column 'b' at data "
                                          "row 299"):
        ingest_csv_parallel(csv, tmp_path / "p.zarr", target="label", client=client,
                            blocksize=1000)
    assert not (tmp_path / "p.zarr").exists()
    # a fraction in a column typed as integers is a number: read as the serial reader reads it
    lines[300] = "5,6,0.5"
    csv.write_text("\n".join(lines) + "\n")
    out = ingest_csv_parallel(csv, tmp_path / "f.zarr", target="label", client=client,
                              blocksize=1000)
    y = zarr.open_group(out, mode="r")["y"][:]
    assert y[299] == 0.5 and y[0] == 0 and len(y) == 400
    lines[300] = "5,x,1"  # text: named, not guessed
    csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(IngestError, match="column\\(s\\) 'b' hold text"):
        ingest_csv_parallel(csv, tmp_path / "t.zarr", target="label", client=client,
                            blocksize=1000)


def test_a_value_beyond_float32_is_refused_not_written_as_infinity(client, tmp_path):
    # the finite check ran before the cast: 1e39 passed it and became inf in the store
    csv = tmp_path / "big.csv"
    csv.write_text("a,b,label\n1,2,0\n3,1e39,1\n5,6,0\n")
    with pytest.raises(IngestError, match="non-finite value in column 'b' at data row 1"):
        ingest_csv_parallel(csv, tmp_path / "p.zarr", target="label", client=client)
    assert not (tmp_path / "p.zarr").exists()


def _idle(client, timeout: float = 60.0) -> None:
    """Wait until the cluster runs and holds no task: anything a failed ingest
    left running has written what it was going to write."""
    import time

    def busy(dask_scheduler=None):
        return sum(ts.state in ("waiting", "queued", "processing", "no-worker")
                   for ts in dask_scheduler.tasks.values())

    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(busy) or any(client.run(
            lambda dask_worker: len(dask_worker.state.executing)).values()):
        assert time.monotonic() < deadline, "the cluster is still busy"
        time.sleep(0.1)


def test_a_csv_refused_early_leaves_nothing_while_other_parts_were_still_being_written(
        client, tmp_path):
    # A CI run on a loaded machine left .p.zarr.tmp-<pid> beside the output:
    # the error came from the first failed task while the other tasks kept
    # writing chunks into the temporary store after it was removed.  Here the
    # second of ~40 byte ranges holds a missing value; the others are still
    # to be parsed and written when it is refused.
    rng = np.random.default_rng(7)
    X = rng.standard_normal((40_000, 4))
    lines = ["a,b,c,d,label"] + [",".join(f"{v:.6f}" for v in row) + f",{i % 3}"
                                 for i, row in enumerate(X)]
    csv = tmp_path / "many.csv"
    csv.write_text("\n".join(lines) + "\n")
    # the first ingest on fresh workers spends seconds importing readers and
    # codecs; a loaded machine's CI run was past that
    ingest_csv_parallel(csv, tmp_path / "warm.zarr", target="label", client=client,
                        blocksize=50_000)
    lines[1_500] = "1,,2,3,0"
    csv.write_text("\n".join(lines) + "\n")
    for _ in range(3):  # whether a write was under way at the refusal is timing: try thrice
        with pytest.raises(IngestError, match="missing or non-finite value in column 'b' at "
                                              "data row 1499") as refused:
            ingest_csv_parallel(csv, tmp_path / "p.zarr", target="label", chunk_rows=500,
                                client=client, blocksize=50_000)
        _idle(client)  # the refusal (and its traceback) still held, as a caller holds it
        assert refused.value is not None
        assert sorted(os.listdir(tmp_path)) == ["many.csv", "warm.zarr"]


def test_a_parallel_reader_without_a_client_says_how_to_get_one(tmp_path):
    """The data layer is handed its client and never connects: with none given and
    none running (a fresh process), it refuses before any task, naming the fix."""
    import subprocess
    import sys

    X, y = _table(20, 2, 0)
    src = _write_parquet(tmp_path / "table", X, y, parts=1)
    code = ("from dkernel.data.ingest import ingest_parquet\n"
            f"ingest_parquet({src!r}, {str(tmp_path / 's.zarr')!r})")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert "no Dask client is running: pass client=" in run.stderr, run.stderr
    assert not os.path.exists(tmp_path / "s.zarr")


def test_a_parallel_reader_connects_to_a_scheduler_address_for_the_call(client, tmp_path):
    """``scheduler=`` (the keyword earlier versions took) still works: a client of
    its own for the call, closed afterwards; with client= as well it refuses."""
    from dkernel.data import open_dataset
    from dkernel.data.ingest import ingest_parquet

    X, y = _table(50, 3, 1)
    src = _write_parquet(tmp_path / "table", X, y, parts=2)
    out = ingest_parquet(src, tmp_path / "s.zarr", scheduler=client.scheduler.address)
    data = open_dataset(out)
    np.testing.assert_allclose(data.X.compute(), X.astype(np.float32))
    with pytest.raises(ValueError, match="client= or scheduler=, not both"):
        ingest_parquet(src, tmp_path / "t.zarr", client=client,
                       scheduler=client.scheduler.address)


def test_csv_blocks_shrink_to_fit_small_workers():
    # a 60 MB CSV in one 64 MB block on two 500 MB workers: killed four times,
    # then "all those workers died" (8 restarts with a 70 MB file); 15 MB blocks
    # ingest it in 7 s
    from distributed import Client, LocalCluster

    from dkernel.data.ingest.csv import _fitting_block

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, memory_limit="480MB",
                      dashboard_address=None) as cluster, Client(cluster) as c:
        assert _fitting_block(c, 64 * 2**20) == 480_000_000 // 32
        assert _fitting_block(c, 2**20) == 2**20  # never larger than asked
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, memory_limit=0,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        assert _fitting_block(c, 64 * 2**20) == 64 * 2**20  # no limit: as asked


def test_a_header_with_spaces_names_the_same_columns_in_both_readers(client, tmp_path):
    # "a, b, label": the serial reader found 'label', the parallel one only ' label'
    path = tmp_path / "s.csv"
    path.write_text("a, b, label\n" + "".join(f"{i}.5, {2 * i}, {i % 2}\n" for i in range(40)))
    out = ingest_csv_parallel(path, tmp_path / "p.zarr", target="label", client=client)
    serial = ingest_csv(path, tmp_path / "q.zarr", target="label")
    gp, gs = zarr.open_group(out, mode="r"), zarr.open_group(serial, mode="r")
    np.testing.assert_array_equal(gp["X"][:], gs["X"][:])
    np.testing.assert_array_equal(gp["y"][:], gs["y"][:])
