"""Ingest idx / npy / CSV / libsvm / Parquet files into dataset stores, one chunk at a time.

One module per format (:mod:`.idx` with Fashion-MNIST, :mod:`.npy`, :mod:`.csv`,
:mod:`.libsvm`, :mod:`.parquet`).  The serial readers yield row blocks of at
most ``chunk_rows`` rows that :mod:`.writer` appends to row-chunked,
compressed zarr arrays ``X`` and ``y``, so memory stays bounded by one chunk
whatever the file size: ``.npy`` is memory-mapped, idx is read block by block
(through gzip when compressed), CSV and libsvm are read line by line into a
chunk buffer.  The parallel readers (Parquet, and CSV / libsvm with
``--parallel``) run on the Dask workers of the ``client`` they are handed
(:mod:`.parallel`), each output chunk written by one worker.  Either way the
output is written under a temporary name and moved into place when complete,
so a failed ingest leaves nothing.

Errors are one line naming the file (and line, for text): a non-numeric
value, ragged rows, a bad idx magic number, a missing file, image / label
count mismatches.
"""

from __future__ import annotations

import os
from typing import Any

from dkernel.data.ingest.common import (  # noqa: F401
    IngestError,
    PathLike,
    cast_finite,
    first_nonfinite,
    is_gzip,
)
from dkernel.data.ingest.csv import ingest_csv, ingest_csv_parallel
from dkernel.data.ingest.idx import FASHION_MNIST_DIR, ingest_fashion_mnist, ingest_idx
from dkernel.data.ingest.libsvm import ingest_libsvm, ingest_libsvm_parallel
from dkernel.data.ingest.npy import ingest_npy
from dkernel.data.ingest.parquet import ingest_parquet

# first_nonfinite, cast_finite and is_gzip: importable from here as before the split
from dkernel.files import expands_user

__all__ = [
    "FASHION_MNIST_DIR", "FORMATS", "IngestError", "guess_format", "ingest", "ingest_csv",
    "ingest_csv_parallel", "ingest_fashion_mnist", "ingest_idx", "ingest_libsvm",
    "ingest_libsvm_parallel", "ingest_npy", "ingest_parquet",
]

FORMATS = ("idx", "npy", "csv", "libsvm", "parquet")


def guess_format(path: PathLike) -> str:
    """The ingest format implied by a file name (``.gz`` is looked through).

    Raises
    ------
    IngestError
        If the name does not say; pass ``format=`` (``--format``) then.
    """
    name = os.path.basename(os.fspath(path)).lower().removesuffix(".gz")
    if name.endswith(".npy"):
        return "npy"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".tsv")):
        return "csv"
    if name.endswith((".libsvm", ".svm", ".svmlight")):
        return "libsvm"
    if name.endswith(("-ubyte", ".idx")) or ".idx" in name:
        return "idx"
    raise IngestError(f"{os.fspath(path)}: cannot tell the format from the file name; "
                      f"pass --format (one of {', '.join(FORMATS)})")


@expands_user("path", "out")
def ingest(path: PathLike, out: PathLike, format: str | None = None,
           **options: Any) -> str:
    """Ingest one file into a dataset store, choosing the reader by ``format``.

    Parameters
    ----------
    path : str or os.PathLike
        Input file.
    out : str or os.PathLike
        Output store (a zarr group holding ``X`` and usually ``y``).
    format : {"idx", "npy", "csv", "libsvm", "parquet"}, optional
        Default: guessed from the file name (:func:`guess_format`).
    **options
        Passed to :func:`ingest_idx`, :func:`ingest_npy`, :func:`ingest_csv`,
        :func:`ingest_libsvm` or :func:`ingest_parquet` (read in parallel on
        the Dask workers of ``client=``, default the current client).

    Returns
    -------
    str
        The output path.
    """
    fmt = (format or guess_format(path)).lower()
    fmt = "libsvm" if fmt == "svmlight" else fmt
    readers = {"idx": ingest_idx, "npy": ingest_npy, "csv": ingest_csv, "libsvm": ingest_libsvm,
               "parquet": ingest_parquet}
    if fmt not in readers:
        raise IngestError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    return readers[fmt](path, out, **options)
