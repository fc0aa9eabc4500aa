"""Parquet ingest throughput: ``dkernel ingest`` (read on the workers, zarr
chunks written by the workers) against a plain pyarrow read of the same file
in the same run (docs/design.md §4: timings are ratios against a peer).

    python benchmarks/ingest_throughput.py --gb 1.0 --workers 2 --folder /tmp/ingest-bench
    python benchmarks/ingest_throughput.py --libsvm-mb 300     # and a libsvm file

Writes a Parquet file of random float32 features and an int64 label (random
floats barely compress, so the file is about ``--gb`` GB), then times
  * pyarrow: ``pyarrow.parquet.read_table`` (decode to Arrow, one process,
    pyarrow's own thread pool), and the same plus the copy into one float32
    NumPy matrix -- what any ingest must at least do;
  * dkernel: :func:`dkernel.data.ingest.ingest_parquet` into a local zarr
    store on a LocalCluster of ``--workers`` single-threaded processes
    (started before the clock), including the compressed zarr writes.
Throughput is the Parquet file's size divided by the seconds.

Needs pyarrow and dask[dataframe]: ``pip install 'dkernel[bench]'`` (or ``[ingest]``).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import time

import numpy as np


def make_parquet(path: str, gb: float, d: int, seed: int = 0) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows_per_group = 131072
    n_groups = max(1, int(gb * 2**30 / (rows_per_group * (4 * d + 8))))
    rng = np.random.default_rng(seed)
    schema = pa.schema([(f"f{j}", pa.float32()) for j in range(d)] + [("label", pa.int64())])
    with pq.ParquetWriter(path, schema, compression="snappy") as w:
        for _ in range(n_groups):
            X = rng.standard_normal((rows_per_group, d), dtype=np.float32)
            y = rng.integers(0, 10, rows_per_group)
            cols = [pa.array(X[:, j]) for j in range(d)] + [pa.array(y)]
            w.write_table(pa.Table.from_arrays(cols, schema=schema), row_group_size=rows_per_group)
    return n_groups * rows_per_group


def make_libsvm(path: str, mb: float, d: int, seed: int = 0) -> int:
    """A libsvm file of about ``mb`` MB: random rows, ~half their d features set."""
    rng = np.random.default_rng(seed)
    n = 0
    with open(path, "w") as f:
        while f.tell() < mb * 1e6:
            X = np.where(rng.random((20000, d)) < 0.5, rng.standard_normal((20000, d)), 0.0)
            y = rng.integers(0, 10, 20000)
            f.write("".join(f"{t} " + " ".join(f"{j + 1}:{v:.5g}" for j in np.flatnonzero(r)
                                               for v in (r[j],)) + "\n"
                            for r, t in zip(X, y)))
            n += 20000
    return n


def libsvm_leg(args, client) -> None:
    """dkernel's libsvm ingest on the workers against scikit-learn's reader of
    the whole file in one process (the same parser, without ranges or writes)."""
    from sklearn.datasets import load_svmlight_file

    from dkernel.data.ingest import ingest_libsvm_parallel

    # the name carries every setting that made the file: a file reused under
    # another --features would not parse at that width
    src = os.path.join(args.folder, f"table-{args.libsvm_mb:g}mb-{args.features}f.libsvm")
    out = os.path.join(args.folder, "libsvm.zarr")
    if not os.path.exists(src):
        n = make_libsvm(src, args.libsvm_mb, args.features)
        print(f"wrote {src}: {n} rows x {args.features}")
    else:
        print(f"reusing {src}")
    mb = os.path.getsize(src) / 1e6
    t = time.perf_counter()
    load_svmlight_file(src, n_features=args.features, dtype=np.float32)
    t_sk = time.perf_counter() - t
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    ingest_libsvm_parallel(src, out, n_features=args.features, client=client)
    t_ingest = time.perf_counter() - t
    print(f"libsvm: {mb:.0f} MB; scikit-learn load_svmlight_file (1 process): {t_sk:.2f} s "
          f"{mb / t_sk:.0f} MB/s; dkernel ingest ({args.workers} workers, zarr): {t_ingest:.2f} s "
          f"{mb / t_ingest:.0f} MB/s ({t_sk / t_ingest:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--gb", type=float, default=1.0, help="approximate Parquet file size (GiB)")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--folder", default="/tmp/dkernel-ingest-bench")
    ap.add_argument("--libsvm-mb", type=float, default=0.0,
                    help="also time libsvm ingest on a file of about this many MB")
    args = ap.parse_args()

    import pyarrow.parquet as pq
    from distributed import Client, LocalCluster

    from dkernel.data.ingest import ingest_parquet

    os.makedirs(args.folder, exist_ok=True)
    # the name carries every setting that made the file, so that another --gb
    # or --features writes its own file instead of timing an old one
    src = os.path.join(args.folder, f"table-{args.gb:g}gb-{args.features}f.parquet")
    out = os.path.join(args.folder, "table.zarr")
    if not os.path.exists(src):
        t = time.perf_counter()
        n = make_parquet(src, args.gb, args.features)
        print(f"wrote {src}: {n} rows x {args.features} in {time.perf_counter() - t:.1f} s")
    mb = os.path.getsize(src) / 1e6
    meta = pq.ParquetFile(src).metadata
    # both legs and the header take the width from the file they time
    n, d = meta.num_rows, meta.num_columns - 1
    if d != args.features:
        raise SystemExit(f"{src} has {d} feature columns, but --features is {args.features}: "
                         "delete the file to have it rewritten")
    print(f"input: {mb:.0f} MB Parquet ({src}), {n} rows x {d} float32 + int64 label")

    t = time.perf_counter()
    table = pq.read_table(src)
    t_read = time.perf_counter() - t
    X = np.empty((table.num_rows, d), np.float32)
    for j in range(d):
        X[:, j] = table.column(j).to_numpy()
    t_numpy = time.perf_counter() - t
    del table, X

    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        ingest_parquet(src, out, target="label", client=client)
        t_ingest = time.perf_counter() - t
        if args.libsvm_mb:
            libsvm_leg(args, client)
    zbytes = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
    print(f"pyarrow read_table:             {t_read:7.2f} s  {mb / t_read:7.0f} MB/s")
    print(f"pyarrow read_table + to NumPy:  {t_numpy:7.2f} s  {mb / t_numpy:7.0f} MB/s")
    print(f"dkernel ingest ({args.workers} workers, zarr): {t_ingest:7.2f} s  "
          f"{mb / t_ingest:7.0f} MB/s  ({t_numpy / t_ingest:.2f}x the NumPy read; "
          f"store {zbytes / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
