"""Ingest: idx / npy / CSV / libsvm files -> row-chunked zarr stores, streamed, atomic."""

from __future__ import annotations

import gzip
import os
import struct
import tracemalloc

import numpy as np
import pytest
import zarr

from dkernel.cli import main
from dkernel.data import open_dataset
from dkernel.data.ingest import (
    IngestError,
    guess_format,
    ingest,
    ingest_csv,
    ingest_fashion_mnist,
    ingest_idx,
    ingest_libsvm,
    ingest_npy,
)
from dkernel.data.ingest.csv import _csv_source

_IDX_CODES = {np.dtype("u1"): 0x08, np.dtype("i1"): 0x09, np.dtype("i2"): 0x0B,
              np.dtype("i4"): 0x0C, np.dtype("f4"): 0x0D, np.dtype("f8"): 0x0E}


def write_idx(path, a: np.ndarray) -> str:
    """An idx file as LeCun describes it: 0x0000, type byte, ndim, big-endian dims and data."""
    a = np.asarray(a)
    body = bytes([0, 0, _IDX_CODES[a.dtype], a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape)
    body += a.astype(a.dtype.newbyteorder(">")).tobytes()
    path = os.fspath(path)
    with (gzip.open(path, "wb") if path.endswith(".gz") else open(path, "wb")) as f:
        f.write(body)
    return path


def read_store(path):
    g = zarr.open_group(os.fspath(path), mode="r")
    return g, g["X"][:], (g["y"][:] if "y" in g else None)


def leftovers(folder) -> list[str]:
    return [n for n in os.listdir(folder) if ".tmp-" in n]


# ---------------------------------------------------------------------- idx

@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_images_and_labels_round_trip_with_bytes_scaled_to_unit_interval(tmp_path, suffix):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(13, 5, 4), dtype=np.uint8)
    images[0, 0, 0], images[1, 0, 0] = 0, 255
    labels = rng.integers(0, 10, size=13, dtype=np.uint8)
    img = write_idx(tmp_path / f"img-idx3-ubyte{suffix}", images)
    lab = write_idx(tmp_path / f"lab-idx1-ubyte{suffix}", labels)

    out = ingest_idx(img, tmp_path / "s.zarr", lab, chunk_rows=5)

    g, X, y = read_store(out)
    assert X.dtype == np.float32 and X.shape == (13, 20)
    # x / 255 in float32 is exactly what the reader must produce, bit for bit.
    np.testing.assert_array_equal(X, images.reshape(13, 20).astype(np.float32) / np.float32(255))
    assert X.min() == 0.0 and X.max() == 1.0
    np.testing.assert_array_equal(y, labels)
    assert y.dtype == np.int32
    assert g.attrs["item_shape"] == [5, 4]


@pytest.mark.parametrize("dtype", ["i2", "i4", "f4", "f8"])
def test_idx_wider_types_are_read_big_endian_and_left_unscaled(tmp_path, dtype):
    a = (np.arange(24).reshape(6, 4) * 1000 - 7000).astype(dtype)
    out = ingest_idx(write_idx(tmp_path / "a.idx", a), tmp_path / "s.zarr", dtype="float64")
    _, X, y = read_store(out)
    np.testing.assert_array_equal(X, a.astype(np.float64))
    assert y is None


def test_idx_no_scale_keeps_byte_values(tmp_path):
    a = np.array([[0, 7], [200, 255]], dtype=np.uint8)
    out = ingest_idx(write_idx(tmp_path / "a-ubyte", a), tmp_path / "s.zarr", scale=False)
    np.testing.assert_array_equal(read_store(out)[1], a.astype(np.float32))


def _fake_fashion(folder, n_train=30, n_test=12, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    data = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        write_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"), images)
        write_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"), labels)
        data[split] = (images, labels)
    return data


def test_fashion_mnist_folder_gives_train_and_test_stores_of_unit_pixels(tmp_path):
    data = _fake_fashion(tmp_path / "fm-src")

    out = ingest_fashion_mnist(tmp_path / "fm", tmp_path / "fm-src", chunk_rows=8)

    assert sorted(os.listdir(out)) == ["test.zarr", "train.zarr"]
    for split, (images, labels) in data.items():
        _, X, y = read_store(os.path.join(out, f"{split}.zarr"))
        assert X.shape == (len(images), 784) and X.dtype == np.float32
        assert X.min() >= 0.0 and X.max() <= 1.0
        np.testing.assert_array_equal(X, images.reshape(-1, 784) / np.float32(255))
        np.testing.assert_array_equal(y, labels)
        ds = open_dataset(os.path.join(out, f"{split}.zarr"), require_y=True)
        assert ds.row_chunks[0] == 8 and ds.y.chunks[0] == ds.X.chunks[0]


def test_fashion_mnist_with_a_missing_file_names_it_and_writes_nothing(tmp_path):
    _fake_fashion(tmp_path / "src")
    os.remove(tmp_path / "src" / "t10k-labels-idx1-ubyte.gz")
    missing = r"t10k-labels-idx1-ubyte\(\.gz\) not found.*--source"
    with pytest.raises(FileNotFoundError, match=missing):
        ingest_fashion_mnist(tmp_path / "fm", tmp_path / "src")
    assert not os.path.exists(tmp_path / "fm")


def test_fashion_mnist_test_split_failing_leaves_no_train_store(tmp_path):
    _fake_fashion(tmp_path / "src")
    # Truncate the gzip stream of the test images: detected only while streaming them.
    write_idx(tmp_path / "t.idx", np.zeros((12, 28, 28), np.uint8))
    with open(tmp_path / "t.idx", "rb") as f:
        raw = f.read()
    with gzip.open(tmp_path / "src" / "t10k-images-idx3-ubyte.gz", "wb") as f:
        f.write(raw[:-100])
    with pytest.raises(IngestError, match="file ends after 11 of 12 items"):
        ingest_fashion_mnist(tmp_path / "fm", tmp_path / "src", chunk_rows=4)
    assert not os.path.exists(tmp_path / "fm")


# ---------------------------------------------------------------------- npy

def test_npy_rows_and_labels_round_trip_with_items_flattened(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(11, 3, 2))
    y = rng.normal(size=(11, 2)).astype(np.float32)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)

    out = ingest(tmp_path / "X.npy", tmp_path / "s.zarr", labels=tmp_path / "y.npy", chunk_rows=4)

    _, Xs, ys = read_store(out)
    np.testing.assert_array_equal(Xs, X.reshape(11, 6).astype(np.float32))
    np.testing.assert_array_equal(ys, y)
    assert Xs.dtype == np.float32 and ys.dtype == np.float32


# ---------------------------------------------------------------------- csv

def test_csv_with_header_stores_the_named_target_as_y(tmp_path):
    (tmp_path / "d.csv").write_text("a,label,b\n1.5,0,2\n\n-3,1,4e-1\n5,2,6\n")
    out = ingest_csv(tmp_path / "d.csv", tmp_path / "s.zarr", target="label")
    g, X, y = read_store(out)
    np.testing.assert_array_equal(X, np.array([[1.5, 2], [-3, 0.4], [5, 6]], np.float32))
    np.testing.assert_array_equal(y, [0, 1, 2])
    assert y.dtype == np.int32  # integer labels stay integers
    assert g.attrs["columns"] == ["a", "b"] and g.attrs["target"] == "label"
    assert sorted(g.keys()) == ["X", "y"]


def test_csv_labels_are_float64_unless_all_whole_and_int64_when_large(tmp_path):
    (tmp_path / "f.csv").write_text("1,0.5\n2,3\n")
    _, _, y = read_store(ingest_csv(tmp_path / "f.csv", tmp_path / "f.zarr", chunk_rows=1))
    assert y.dtype == np.float64 and y.tolist() == [0.5, 3.0]
    # float32 kept 3 distinct values of 1e8 + 3 x (x in [0, 1)), off by up to 4
    (tmp_path / "t.csv").write_text("".join(f"{i},{1e8 + 3 * i / 1000}\n" for i in range(1000)))
    _, _, y = read_store(ingest_csv(tmp_path / "t.csv", tmp_path / "t.zarr"))
    np.testing.assert_array_equal(y, 1e8 + 3 * np.arange(1000) / 1000)
    (tmp_path / "big.csv").write_text("1,3000000000\n2,-1\n3,7\n")
    _, _, y = read_store(ingest_csv(tmp_path / "big.csv", tmp_path / "b.zarr", chunk_rows=2))
    assert y.dtype == np.int64 and y.tolist() == [3000000000, -1, 7]
    _, _, y = read_store(ingest_csv(tmp_path / "big.csv", tmp_path / "c.zarr", y_dtype="float64"))
    assert y.dtype == np.float64


def test_csv_without_header_defaults_to_last_column_target_or_none(tmp_path):
    (tmp_path / "d.tsv").write_text("1\t2\t3\n4\t5\t6\n")
    _, X, y = read_store(ingest_csv(tmp_path / "d.tsv", tmp_path / "a.zarr"))
    np.testing.assert_array_equal(X, [[1, 2], [4, 5]])
    np.testing.assert_array_equal(y, [3, 6])
    _, X, y = read_store(ingest_csv(tmp_path / "d.tsv", tmp_path / "b.zarr", target=0))
    np.testing.assert_array_equal(X, [[2, 3], [5, 6]])
    np.testing.assert_array_equal(y, [1, 4])
    _, X, y = read_store(ingest_csv(tmp_path / "d.tsv", tmp_path / "c.zarr", target=None))
    np.testing.assert_array_equal(X, [[1, 2, 3], [4, 5, 6]])
    assert y is None


def test_a_first_line_mixing_numbers_and_gaps_is_refused_not_taken_for_a_header(tmp_path):
    # ",2,0" (a data row with a missing value) was read as a header and dropped
    (tmp_path / "g.csv").write_text(",2,0\n1,2,1\n3,4,0\n")
    for first in (",2,0", "1,?,0", "1,NA,0"):
        (tmp_path / "g.csv").write_text(f"{first}\n1,2,1\n3,4,0\n")
        with pytest.raises(IngestError, match=r"line 1 is numbers with missing values.*--header"):
            ingest_csv(tmp_path / "g.csv", tmp_path / "g.zarr")
        assert not (tmp_path / "g.zarr").exists()
    # said explicitly, such a line is a header (columns named "1", "NA", "0")
    _, X, y = read_store(ingest_csv(tmp_path / "g.csv", tmp_path / "h.zarr", header=True))
    np.testing.assert_array_equal(X, [[1, 2], [3, 4]])
    # pandas' header of unnamed columns mixes numbers and names: still a header
    (tmp_path / "p.csv").write_text("0,1,y\n1,2,1\n3,4,0\n")
    g, X, y = read_store(ingest_csv(tmp_path / "p.csv", tmp_path / "p.zarr"))
    assert g.attrs["columns"] == ["0", "1"] and y.tolist() == [1, 0]


def test_pandas_numbered_header_is_refused_and_a_byte_order_mark_is_no_header(tmp_path):
    # DataFrame(array).to_csv(index=False) writes "0,1,2": stored as data it
    # added a row and a label; Excel's UTF-8 CSV starts with a byte-order mark,
    # which made the first data row a "header" that was dropped
    (tmp_path / "n.csv").write_text("0,1,2\n1.5,2,0\n3,4,1\n")
    with pytest.raises(IngestError, match=r"line 1 reads 0,1,2: column names 0..2 .*--header"):
        ingest_csv(tmp_path / "n.csv", tmp_path / "n.zarr")
    g, X, y = read_store(ingest_csv(tmp_path / "n.csv", tmp_path / "h.zarr", header=True))
    assert X.shape == (2, 2) and g.attrs["columns"] == ["0", "1"]
    (tmp_path / "b.csv").write_bytes(b"\xef\xbb\xbf1.5,2,0\n3,4,1\n5,6,2\n")
    _, X, y = read_store(ingest_csv(tmp_path / "b.csv", tmp_path / "b.zarr"))
    np.testing.assert_array_equal(X, [[1.5, 2], [3, 4], [5, 6]])
    (tmp_path / "bh.csv").write_bytes(b"\xef\xbb\xbfa,b,y\n1.5,2,0\n")
    g, X, y = read_store(ingest_csv(tmp_path / "bh.csv", tmp_path / "bh.zarr"))
    assert g.attrs["columns"] == ["a", "b"] and y.tolist() == [0]


def test_csv_gzip_whitespace_delimited_is_read(tmp_path):
    with gzip.open(tmp_path / "d.csv.gz", "wt") as f:
        f.write("x1 x2  y\n 1  2  1\n3 4 0\n")
    _, X, y = read_store(ingest(tmp_path / "d.csv.gz", tmp_path / "s.zarr"))
    np.testing.assert_array_equal(X, [[1, 2], [3, 4]])
    np.testing.assert_array_equal(y, [1, 0])


# ------------------------------------------------------------------- libsvm

def test_libsvm_sparse_rows_are_densified(tmp_path):
    (tmp_path / "d.svm").write_text(
        "# a comment line\n"
        "+1 1:0.5 4:2\n"
        "-1 qid:3 2:-1.5   # trailing comment\n"
        "\n"
        "2\n"
        "0 3:7 1:1\n")
    expected = np.array([[0.5, 0, 0, 2], [0, -1.5, 0, 0], [0, 0, 0, 0], [1, 0, 7, 0]], np.float32)
    _, X, y = read_store(ingest_libsvm(tmp_path / "d.svm", tmp_path / "a.zarr", chunk_rows=3))
    np.testing.assert_array_equal(X, expected)
    np.testing.assert_array_equal(y, [1, -1, 2, 0])
    _, X, _ = read_store(ingest_libsvm(tmp_path / "d.svm", tmp_path / "b.zarr", n_features=6))
    np.testing.assert_array_equal(X, np.pad(expected, ((0, 0), (0, 2))))
    _, X, _ = read_store(ingest_libsvm(tmp_path / "d.svm", tmp_path / "c.zarr", zero_based=True))
    np.testing.assert_array_equal(X, np.pad(expected, ((0, 0), (1, 0))))


def test_libsvm_labels_past_2_to_the_24_stay_exact_or_are_refused(tmp_path):
    # float32 holds whole numbers exactly only up to 2**24: 16777217 became
    # 16777216, merging two classes without a word.
    (tmp_path / "big.svm").write_text("16777217 1:1\n16777216 1:2\n3 2:1\n")
    _, _, y = read_store(ingest_libsvm(tmp_path / "big.svm", tmp_path / "a.zarr"))
    assert y.tolist() == [16777217, 16777216, 3]
    with pytest.raises(IngestError, match="label 16777217 is not exact in float32; pass y_dtype"):
        ingest_libsvm(tmp_path / "big.svm", tmp_path / "b.zarr", y_dtype="float32")
    assert not (tmp_path / "b.zarr").exists()
    # real-valued targets round as any float32 does
    (tmp_path / "r.svm").write_text("0.1 1:1\n")
    _, _, y = read_store(ingest_libsvm(tmp_path / "r.svm", tmp_path / "c.zarr", y_dtype="float32"))
    assert y.dtype == np.float32


# ----------------------------------------------------------------- chunking

def _ten_rows(tmp_path, fmt):
    X = np.arange(30, dtype=np.float64).reshape(10, 3) / 4
    y = np.arange(10) % 3
    if fmt == "csv":
        path = tmp_path / "d.csv"
        rows = (",".join(map(str, [*r, t])) + "\n" for r, t in zip(X, y, strict=True))
        path.write_text("".join(rows))
        return path, {}, X, y
    if fmt == "libsvm":
        path = tmp_path / "d.svm"
        path.write_text("".join(f"{t} " + " ".join(f"{j + 1}:{v}" for j, v in enumerate(r)) + "\n"
                                for r, t in zip(X, y, strict=True)))
        return path, {}, X, y
    if fmt == "npy":
        np.save(tmp_path / "X.npy", X)
        np.save(tmp_path / "y.npy", y)
        return tmp_path / "X.npy", {"labels": tmp_path / "y.npy"}, X, y
    Xi = np.arange(30, dtype=np.uint8).reshape(10, 3)
    write_idx(tmp_path / "l-idx1-ubyte", y.astype(np.uint8))
    return (write_idx(tmp_path / "i-idx2-ubyte.gz", Xi), {"labels": tmp_path / "l-idx1-ubyte"},
            Xi / 255, y)


@pytest.mark.parametrize("fmt", ["csv", "libsvm", "npy", "idx"])
def test_chunks_hold_the_requested_rows_with_a_partial_last_chunk(tmp_path, fmt):
    path, options, X, y = _ten_rows(tmp_path, fmt)
    assert guess_format(path) == fmt

    out = ingest(path, tmp_path / "s.zarr", chunk_rows=4, **options)

    g, Xs, ys = read_store(out)
    assert g["X"].chunks == (4, 3) and g["y"].chunks == (4,)
    assert len(os.listdir(os.path.join(out, "X", "c"))) == 3  # rows 0-3, 4-7 and 8-9
    ds = open_dataset(out)
    assert ds.row_chunks == (4, 4, 2) and ds.y.chunks[0] == (4, 4, 2)
    np.testing.assert_allclose(Xs, X, rtol=1e-7)  # float32 of the same values
    np.testing.assert_array_equal(ys, y)


def test_default_chunk_rows_keep_wide_chunks_near_32_megabytes(tmp_path):
    np.save(tmp_path / "X.npy", np.zeros((3, 100_000), np.float32))
    g, _, _ = read_store(ingest_npy(tmp_path / "X.npy", tmp_path / "s.zarr"))
    assert g["X"].chunks[0] == 32 * 2**20 // (100_000 * 4)


# ----------------------------------------------------------------- bad input

def _bad_inputs(tmp_path):
    p = tmp_path
    (p / "nonnum.csv").write_text("a,b,y\n1,2,0\n3,abc,1\n")
    (p / "ragged.csv").write_text("1,2,0\n3,4,1\n5,6\n")
    (p / "empty-value.csv").write_text("1,2,0\n3,,1\n")
    (p / "late.csv").write_text("".join(f"{i},{i},0\n" for i in range(500)) + "1,x,0\n")
    (p / "late-ragged.csv").write_text("".join(f"{i},{i},0\n" for i in range(20)) + "1,1\n")
    (p / "empty.csv").write_text("\n\n")
    (p / "zero.svm").write_text("1 1:2\n0 0:1\n")
    (p / "token.svm").write_text("1 1:2\n0 3=1\n")
    (p / "multi.svm").write_text("1 1:2\n0,1 3:1\n")
    (p / "wide.svm").write_text("1 1:2\n0 9:1\n")
    (p / "bad-magic-ubyte").write_bytes(b"\x08\x03\x00\x00" + bytes(16))
    write_idx(p / "img-ubyte", np.zeros((5, 2, 2), np.uint8))
    write_idx(p / "lab4-ubyte", np.zeros(4, np.uint8))
    (p / "short-ubyte").write_bytes((p / "img-ubyte").read_bytes()[:-3])
    np.save(p / "X.npy", np.zeros((5, 2)))
    np.save(p / "y4.npy", np.zeros(4))
    # Random content does not compress, so half the gzip bytes cut the stream mid-data.
    rng = np.random.default_rng(3)
    write_idx(p / "noise-ubyte.gz", rng.integers(0, 256, (50, 8, 8), dtype=np.uint8))
    (p / "cut-ubyte.gz").write_bytes((p / "noise-ubyte.gz").read_bytes()[:1500])
    text = gzip.compress("".join(f"{v},1\n" for v in rng.normal(size=3000)).encode())
    (p / "cut.csv.gz").write_bytes(text[:len(text) // 2])
    (p / "binary.csv").write_bytes(bytes(range(128, 256)))
    return [
        (lambda o: ingest_csv(p / "nonnum.csv", o),
         r"nonnum\.csv:3: non-numeric value 'abc' in column 2 \('b'\)"),
        (lambda o: ingest_csv(p / "ragged.csv", o),
         r"ragged\.csv:3: 2 values but 3 columns.*ragged"),
        (lambda o: ingest_csv(p / "empty-value.csv", o),
         r"empty-value\.csv:2: empty value in column 2"),
        (lambda o: ingest_csv(p / "late.csv", o, chunk_rows=16),
         r"late\.csv:501: non-numeric value 'x'"),
        (lambda o: ingest_csv(p / "late-ragged.csv", o, chunk_rows=10),
         r"late-ragged\.csv:21: 2 values but 3"),
        (lambda o: ingest_csv(p / "empty.csv", o), r"empty\.csv: no data rows"),
        (lambda o: ingest_csv(p / "nonnum.csv", o, target="z"),
         r"no column named 'z' \(columns: a, b, y\)"),
        (lambda o: ingest_libsvm(p / "zero.svm", o),
         r"zero\.svm:2: feature index 0; .*--zero-based"),
        (lambda o: ingest_libsvm(p / "token.svm", o),
         r"token\.svm:2: cannot read '3=1' as index:value"),
        (lambda o: ingest_libsvm(p / "multi.svm", o),
         r"multi\.svm:2: non-numeric label '0,1'; multi-label"),
        (lambda o: ingest_libsvm(p / "wide.svm", o, n_features=4),
         r"wide\.svm:2: feature index 9 is beyond n_features=4"),
        (lambda o: ingest_idx(p / "bad-magic-ubyte", o),
         r"bad-magic-ubyte: bad idx magic number 0x08030000"),
        (lambda o: ingest_idx(p / "img-ubyte", o, p / "lab4-ubyte"),
         r"lab4-ubyte has 4 labels but .*img-ubyte has 5 items"),
        (lambda o: ingest_idx(p / "short-ubyte", o),
         r"short-ubyte: 33 bytes, but its idx header \[5, 2, 2\] needs 36"),
        (lambda o: ingest_npy(p / "X.npy", o, p / "y4.npy"),
         r"y4\.npy has 4 rows but .*X\.npy has 5"),
        (lambda o: ingest_npy(p / "nonnum.csv", o), r"nonnum\.csv: cannot read as \.npy"),
        (lambda o: ingest_idx(p / "cut-ubyte.gz", o, chunk_rows=8),
         r"cut-ubyte\.gz: cannot read: Compressed file ended"),
        (lambda o: ingest_csv(p / "cut.csv.gz", o, chunk_rows=100),
         r"cut\.csv\.gz: cannot read past line \d+: Compressed file ended"),
        (lambda o: ingest_csv(p / "binary.csv", o), r"binary\.csv: not UTF-8 text near line 1"),
        (lambda o: ingest(p / "missing.csv", o), r"missing\.csv: does not exist"),
        (lambda o: ingest(p / "X.npy", o, chunk_rows=0), r"chunk_rows must be > 0"),
        (lambda o: guess_format(p / "data.bin"), r"data\.bin: cannot tell the format .*--format"),
    ]


def test_each_bad_input_gives_a_one_line_error_naming_it_and_leaves_no_output(tmp_path):
    cases = _bad_inputs(tmp_path)
    for i, (call, pattern) in enumerate(cases):
        out = tmp_path / "out" / f"s{i}.zarr"
        with pytest.raises((IngestError, FileNotFoundError, ValueError), match=pattern) as info:
            call(out)
        assert "\n" not in str(info.value)
        assert not os.path.exists(tmp_path / "out"), f"case {i} left output behind"
    assert leftovers(tmp_path) == []


def test_existing_output_is_kept_unless_overwrite_is_asked(tmp_path):
    np.save(tmp_path / "X.npy", np.ones((3, 2)))
    out = ingest_npy(tmp_path / "X.npy", tmp_path / "s.zarr")
    np.save(tmp_path / "X.npy", np.zeros((4, 2)))
    with pytest.raises(FileExistsError, match="already exists"):
        ingest_npy(tmp_path / "X.npy", out)
    assert read_store(out)[1].shape == (3, 2)
    ingest_npy(tmp_path / "X.npy", out, overwrite=True)
    assert read_store(out)[1].shape == (4, 2)


# ---------------------------------------------------------------- streaming

def test_csv_reader_never_holds_more_than_chunk_rows_rows(tmp_path):
    n, chunk_rows = 2_503, 100
    (tmp_path / "d.csv").write_text("".join(f"{i},{i % 7},{i % 2}\n" for i in range(n)))
    sizes = [X.shape[0] for X, _ in _csv_source(tmp_path / "d.csv", -1, None, "auto",
                                                np.dtype("f4")).blocks(chunk_rows)]
    assert max(sizes) == chunk_rows and sum(sizes) == n and sizes[-1] == 3


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_csv_and_npy_ingest_peak_memory_is_bounded_by_a_chunk_not_the_file(tmp_path):
    n, d, chunk_rows = 60_000, 20, 500
    rng = np.random.default_rng(2)
    X = rng.normal(size=(n, d))
    np.save(tmp_path / "X.npy", X)
    np.savetxt(tmp_path / "d.csv", X, delimiter=",", fmt="%.6g")
    data_bytes = X.nbytes  # 9.6 MB parsed; the CSV text is about as large
    # The first ingest in a process imports modules (several MB of Python objects);
    # warm up so only the ingest's own buffers are measured.
    ingest_csv(tmp_path / "d.csv", tmp_path / "warm.zarr", target=None, chunk_rows=n)
    ingest_npy(tmp_path / "X.npy", tmp_path / "warm-n.zarr", chunk_rows=n)
    # One chunk is 500 rows (80 KB as float64, ~100 KB of text lines); measured peaks
    # are ~0.4 MB (csv) and ~0.25 MB (npy) with zarr's buffers.  Holding the file
    # would take >= data_bytes, ten times the bound.
    peak_csv = _peak_bytes(lambda: ingest_csv(tmp_path / "d.csv", tmp_path / "c.zarr",
                                              target=None, chunk_rows=chunk_rows))
    peak_npy = _peak_bytes(lambda: ingest_npy(tmp_path / "X.npy", tmp_path / "n.zarr",
                                              chunk_rows=chunk_rows))
    assert peak_csv < data_bytes / 10, peak_csv
    assert peak_npy < data_bytes / 10, peak_npy
    np.testing.assert_array_equal(read_store(tmp_path / "n.zarr")[1], X.astype(np.float32))
    np.testing.assert_allclose(read_store(tmp_path / "c.zarr")[1], X, rtol=1e-5)  # %.6g text


# ---------------------------------------------------------------------- cli

def test_cli_ingests_a_csv_and_reports_the_store(tmp_path, capsys):
    rows = "".join(f"{i},{2 * i},{i % 2}\n" for i in range(9))
    (tmp_path / "d.csv").write_text("a,b,label\n" + rows)
    out = tmp_path / "s.zarr"
    assert main(["ingest", str(tmp_path / "d.csv"), "--out", str(out), "--target", "label",
                 "--chunk-rows", "4"]) == 0
    printed, err = capsys.readouterr()
    assert "X 9 x 2 float32" in printed
    assert "ingest: 1/1 MB" in err, err  # text: progress in MB of the file read
    g, _, y = read_store(out)
    assert g["X"].chunks == (4, 2)
    np.testing.assert_array_equal(y, np.arange(9) % 2)


def test_cli_fashion_mnist_from_a_source_folder(tmp_path, capsys):
    _fake_fashion(tmp_path / "src", n_train=9, n_test=3)
    assert main(["ingest", "fashion-mnist", "--source", str(tmp_path / "src"),
                 "--out", str(tmp_path / "fm")]) == 0
    printed, err = capsys.readouterr()
    assert "train.zarr: X 9 x 784 float32, y (9,) int32" in printed
    # a progress line a store, in rows (an idx header gives the count)
    assert "ingest: 9/9 rows" in err and "ingest: 3/3 rows" in err, err
    assert "test.zarr: X 3 x 784 float32" in printed


@pytest.mark.parametrize("args, message", [
    (["bad.csv"], "bad.csv:2: non-numeric value 'q'"),
    (["bad.csv", "--n-inputs", "3"], "--n-inputs applies to libsvm input, not csv"),
    (["bad.csv", "--format", "libsvm", "--n-inputs", "3"], "bad.csv:1: non-numeric label '1,2'"),
    (["data.bin"], "cannot tell the format"),
    (["fashion-mnist", "--source", "nowhere"], "not found in nowhere"),
])
def test_cli_errors_are_one_line_and_exit_1(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.csv").write_text("1,2\nq,3\n")
    (tmp_path / "data.bin").write_bytes(b"\0")
    assert main(["ingest", *args, "--out", "o.zarr"]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "o.zarr")


def test_serial_ingest_refuses_nan_and_values_beyond_float32_naming_the_row(tmp_path):
    # "nan" / "inf" fields and 1e39 (finite in float64, inf in float32) were
    # written into the store, to stop a fit later
    from dkernel.data.ingest import IngestError, ingest_csv, ingest_npy

    for text, row in (("1,2,0\n3,1e39,1\n", 1), ("1,2,0\n3,4,1\nnan,6,0\n", 2)):
        csv = tmp_path / f"t{row}.csv"
        csv.write_text(text)
        with pytest.raises(IngestError, match=f"NaN or infinity in [Xy] at data row {row}"):
            ingest_csv(csv, tmp_path / f"t{row}.zarr", overwrite=True)
        assert not (tmp_path / f"t{row}.zarr").exists()
    # whole labels beyond int64 were cast to int64's minimum: float64 keeps them
    csv = tmp_path / "huge.csv"
    csv.write_text("1,2,0\n3,4,1e19\n")
    y = zarr.open_group(ingest_csv(csv, tmp_path / "huge.zarr"), mode="r")["y"][:]
    assert y.dtype == np.float64 and y[1] == 1e19
    # a target beyond float32's range is refused, naming the row: fits compute in
    # float32 (stored as float64 it passed, and the fit said "diverged at step 0")
    csv.write_text("1,2,0.5\n3,4,1e39\n")
    with pytest.raises(IngestError, match="y at data row 1 is beyond float32's range"):
        ingest_csv(csv, tmp_path / "h39.zarr")
    X = np.zeros((5, 2))
    X[3, 1] = np.inf
    np.save(tmp_path / "x.npy", X)
    with pytest.raises(IngestError, match="at data row 3, column 2"):
        ingest_npy(tmp_path / "x.npy", tmp_path / "n.zarr")
    y = np.zeros(5)
    y[4] = np.nan
    np.save(tmp_path / "x.npy", np.zeros((5, 2)))
    np.save(tmp_path / "y.npy", y)
    with pytest.raises(IngestError, match="NaN or infinity in y at data row 4"):
        ingest_npy(tmp_path / "x.npy", tmp_path / "m.zarr", tmp_path / "y.npy")


def test_cli_ingest_passes_its_reader_flags(tmp_path):
    # the reader flags reach the readers through the CLI (none was given to it)
    from dkernel.cli import main

    def stored(name):
        g = zarr.open_group(str(tmp_path / name), mode="r")
        return g["X"][:], (g["y"][:] if "y" in g else None)

    a = (np.arange(24, dtype=np.uint8) * 10).reshape(6, 2, 2)
    write_idx(tmp_path / "a-ubyte", a)
    assert main(["ingest", str(tmp_path / "a-ubyte"), "--no-scale", "--out",
                 str(tmp_path / "i.zarr"), "--quiet"]) == 0
    assert stored("i.zarr")[0].max() == 230  # --no-scale
    (tmp_path / "z.svm").write_text("1 0:1.5 1:2\n0 1:3 2:4\n")
    assert main(["ingest", str(tmp_path / "z.svm"), "--zero-based", "--out",
                 str(tmp_path / "z.zarr"), "--quiet"]) == 0
    np.testing.assert_array_equal(stored("z.zarr")[0], [[1.5, 2, 0], [0, 3, 4]])  # --zero-based
    (tmp_path / "s.txt").write_text('"height, cm";weight;label\n170;60;0\n180;80;1\n')
    assert main(["ingest", str(tmp_path / "s.txt"), "--format", "csv", "--delimiter", ";",
                 "--out", str(tmp_path / "s.zarr"), "--quiet"]) == 0
    X, y = stored("s.zarr")
    np.testing.assert_array_equal(X, [[170, 60], [180, 80]])  # --delimiter
    np.testing.assert_array_equal(y, [0, 1])
    np.save(tmp_path / "X.npy", np.arange(12, dtype=np.float32).reshape(6, 2))
    np.save(tmp_path / "y.npy", np.array([0, 1, 0, 1, 1, 0]))
    assert main(["ingest", str(tmp_path / "X.npy"), "--labels", str(tmp_path / "y.npy"),
                 "--out", str(tmp_path / "n.zarr"), "--quiet"]) == 0
    np.testing.assert_array_equal(stored("n.zarr")[1], [0, 1, 0, 1, 1, 0])  # --labels


@pytest.mark.parametrize("y_dtype", ["float32", "int64"])
def test_csv_stores_y_in_the_given_y_dtype(tmp_path, y_dtype):
    from dkernel.data import open_dataset
    from dkernel.data.ingest import ingest_csv

    p = tmp_path / "a.csv"
    p.write_text("a,b,label\n" + "".join(f"{i * 0.1},{i * 0.2},{i % 2}\n" for i in range(50)))
    out = ingest_csv(p, tmp_path / "s.zarr", target="label", y_dtype=y_dtype)
    y = open_dataset(out).y
    assert y.dtype == np.dtype(y_dtype)
    np.testing.assert_array_equal(np.asarray(y), np.arange(50) % 2)
