"""Ingest idx / npy / CSV / libsvm files into dataset stores, one chunk at a time.

Every reader yields row blocks of at most ``chunk_rows`` rows, and the writer
appends each block to row-chunked, compressed zarr arrays ``X`` and ``y`` that
grow as blocks arrive (the row count of a text file is not known up front).
Memory therefore stays bounded by one chunk whatever the file size: ``.npy``
is memory-mapped, idx is read block by block (through gzip when compressed),
CSV and libsvm are read line by line into a chunk buffer.  Output is written
under a temporary name and renamed into place when complete
(:func:`dkernel.data.store.atomic_store`), so a failed ingest leaves nothing.

Errors are one line naming the file (and line, for text): a non-numeric
value, ragged rows, a bad idx magic number, a missing file, image / label
count mismatches.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from dkernel.data.store import atomic_store, create_array, default_chunk_rows
from dkernel.data.store import check_out as _check_out
from dkernel.data.validate import check_numeric_dtype, check_positive

__all__ = [
    "FASHION_MNIST_DIR", "FORMATS", "IngestError", "guess_format", "ingest", "ingest_csv",
    "ingest_fashion_mnist", "ingest_idx", "ingest_libsvm", "ingest_npy",
]

#: Where ``apt-get install dataset-fashion-mnist`` puts the idx files.
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_FASHION_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                  "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}

FORMATS = ("idx", "npy", "csv", "libsvm", "parquet")

# idx type byte -> big-endian dtype (LeCun's MNIST page).
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


PathLike = str | os.PathLike


class IngestError(ValueError):
    """Input that cannot be ingested; the message names the file (and line)."""


@dataclass
class _Source:
    """What a reader found in the headers, and the row blocks it will yield.

    ``blocks(chunk_rows)`` yields (X, y) blocks of ``chunk_rows`` rows (the last
    may be shorter); a reader may reuse a block's memory once the next is asked for.
    """

    n_inputs: int
    blocks: Callable[[int], Iterator[tuple[np.ndarray, np.ndarray | None]]]
    y_dtype: np.dtype | None = None
    y_tail: tuple[int, ...] = ()
    attrs: dict = field(default_factory=dict)
    #: y's dtype is decided once every label is seen: integers if all are
    #: whole numbers (int32, or int64 if they need it), else float32.
    y_auto: bool = False


# ----------------------------------------------------------------- public API

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
        :func:`ingest_libsvm` or :func:`dkernel.data.tabular.ingest_parquet`
        (read in parallel on the Dask workers).

    Returns
    -------
    str
        The output path.
    """
    fmt = (format or guess_format(path)).lower()
    fmt = "libsvm" if fmt == "svmlight" else fmt
    from dkernel.data.tabular import ingest_parquet

    readers = {"idx": ingest_idx, "npy": ingest_npy, "csv": ingest_csv, "libsvm": ingest_libsvm,
               "parquet": ingest_parquet}
    if fmt not in readers:
        raise IngestError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    return readers[fmt](path, out, **options)


def ingest_idx(path: PathLike, out: PathLike, labels: PathLike | None = None, *,
               scale: bool = True, dtype: Any = "float32", chunk_rows: int | None = None,
               overwrite: bool = False) -> str:
    """Ingest an idx file (``.gz`` or not) of images, and optionally its labels.

    Each item is flattened to one row (28 x 28 images give 784 columns).

    Parameters
    ----------
    path : str or os.PathLike
        idx file of items (e.g. ``train-images-idx3-ubyte.gz``).
    out : str or os.PathLike
        Output store.
    labels : str or os.PathLike, optional
        1-D idx file with one label per item, stored as ``y`` (integer labels
        as int32).
    scale : bool, default True
        Divide unsigned-byte items by 255 so pixels lie in [0, 1]; other idx
        types are stored unscaled.
    dtype : str or numpy.dtype, default "float32"
        dtype of ``X``.
    chunk_rows : int, optional
        Rows per chunk (default: at most 8192 rows and ~32 MB).
    overwrite : bool, default False
        Replace an existing store at ``out``.

    Returns
    -------
    str
        The output path.
    """
    _check_out(out, overwrite)
    return _ingest_one(out, _idx_source(path, labels, scale, dtype), chunk_rows, dtype, overwrite)


def ingest_npy(path: PathLike, out: PathLike, labels: PathLike | None = None, *,
               dtype: Any = "float32", chunk_rows: int | None = None,
               overwrite: bool = False) -> str:
    """Ingest a ``.npy`` array (memory-mapped, so read one chunk at a time).

    Parameters
    ----------
    path : str or os.PathLike
        ``.npy`` file holding X (n x d; 1-D becomes one column, >2-D is
        flattened per row).
    out : str or os.PathLike
        Output store.
    labels : str or os.PathLike, optional
        ``.npy`` file holding y (n or n x c), stored with its own dtype.
    dtype : str or numpy.dtype, default "float32"
        dtype of ``X``.
    chunk_rows : int, optional
        Rows per chunk (default: at most 8192 rows and ~32 MB).
    overwrite : bool, default False
        Replace an existing store at ``out``.

    Returns
    -------
    str
        The output path.
    """
    _check_out(out, overwrite)
    return _ingest_one(out, _npy_source(path, labels), chunk_rows, dtype, overwrite)


def ingest_csv(path: PathLike, out: PathLike, *, target: int | str | None = -1,
               header: bool | None = None, delimiter: str | None = "auto", dtype: Any = "float32",
               y_dtype: Any = "auto", chunk_rows: int | None = None,
               overwrite: bool = False) -> str:
    """Ingest a delimited text file (``.gz`` or not), read line by line.

    Parameters
    ----------
    path : str or os.PathLike
        CSV / TSV file; blank lines are skipped.
    out : str or os.PathLike
        Output store.
    target : int, str or None, default -1
        The column stored as ``y``: a header name or a (possibly negative)
        index; the last column by default; None stores no ``y``.
    header : bool, optional
        Whether the first line names the columns.  Default: detected (a header
        is a first line with any non-numeric field).
    delimiter : str or None, default "auto"
        Field separator; "auto" picks ``,``, tab or ``;`` from the first line,
        else whitespace; None means runs of whitespace.
    dtype : str or numpy.dtype, default "float32"
        dtype of ``X``.
    y_dtype : str or numpy.dtype, default "auto"
        dtype of ``y``; "auto": integer labels stay integers (int32, or int64
        when they need it), any other target is float32.
    chunk_rows : int, optional
        Rows per chunk (default: at most 8192 rows and ~32 MB).
    overwrite : bool, default False
        Replace an existing store at ``out``.

    Returns
    -------
    str
        The output path.
    """
    _check_out(out, overwrite)
    auto = isinstance(y_dtype, str) and y_dtype == "auto"
    src = _csv_source(path, target, header, delimiter,
                      np.dtype("float64") if auto else np.dtype(y_dtype))
    src.y_auto = auto and src.y_dtype is not None
    return _ingest_one(out, src, chunk_rows, dtype, overwrite)


def ingest_libsvm(path: PathLike, out: PathLike, *, n_features: int | None = None,
                  zero_based: bool = False, dtype: Any = "float32", y_dtype: Any = "float32",
                  chunk_rows: int | None = None, overwrite: bool = False) -> str:
    """Ingest a libsvm / svmlight text file; sparse rows are densified per chunk.

    Lines read ``label index:value index:value ... [# comment]``; ``qid:``
    fields are ignored.

    Parameters
    ----------
    path : str or os.PathLike
        libsvm file (``.gz`` or not).
    out : str or os.PathLike
        Output store.
    n_features : int, optional
        Number of columns.  Default: one more than the largest index, found
        by an extra pass over the file.
    zero_based : bool, default False
        Whether indices start at 0 (libsvm's own files start at 1).
    dtype, y_dtype : str or numpy.dtype, default "float32"
        dtypes of ``X`` and ``y``.
    chunk_rows : int, optional
        Rows per chunk (default: at most 8192 rows and ~32 MB).
    overwrite : bool, default False
        Replace an existing store at ``out``.

    Returns
    -------
    str
        The output path.
    """
    _check_out(out, overwrite)  # before the extra pass over a possibly large file
    src = _libsvm_source(path, n_features, zero_based, np.dtype(dtype), np.dtype(y_dtype))
    return _ingest_one(out, src, chunk_rows, dtype, overwrite)


def ingest_fashion_mnist(out: PathLike, source: PathLike | None = None, *,
                         chunk_rows: int | None = None, overwrite: bool = False) -> str:
    """Ingest Fashion-MNIST into ``out/train.zarr`` and ``out/test.zarr``.

    Each store holds ``X`` (pixels / 255, float32, 784 columns) and ``y``
    (int32 class 0-9).  Both stores are written or neither is.

    Parameters
    ----------
    out : str or os.PathLike
        Output folder.
    source : str or os.PathLike, optional
        Folder holding the four idx files, gzipped or not (default
        ``/usr/share/datasets/fashion-mnist``).
    chunk_rows : int, optional
        Rows per chunk (default 8192).
    overwrite : bool, default False
        Replace existing stores.

    Returns
    -------
    str
        The output folder.
    """
    folder = os.fspath(source if source is not None else FASHION_MNIST_DIR)
    sources = {}
    for split, names in _FASHION_FILES.items():
        found = []
        for name in names:
            hits = [p for p in (os.path.join(folder, name + ".gz"), os.path.join(folder, name))
                    if os.path.isfile(p)]
            if not hits:
                raise FileNotFoundError(
                    f"Fashion-MNIST file {name}(.gz) not found in {folder}; install it with "
                    "'apt-get install dataset-fashion-mnist' or pass --source DIR")
            found.append(hits[0])
        sources[split] = _idx_source(found[0], found[1], True, "float32")
    out = os.fspath(out)
    for split in sources:
        _check_out(os.path.join(out, f"{split}.zarr"), overwrite)
    created = _missing_parents(os.path.join(out, "train.zarr"))
    try:
        with ExitStack() as stack:  # both renamed into place only if both succeed
            for split, src in sources.items():
                path = os.path.join(out, f"{split}.zarr")
                group = stack.enter_context(atomic_store(path, overwrite))
                _write(group, src, chunk_rows, "float32")
    except BaseException:
        _remove_empty(created)
        raise
    return out


# ------------------------------------------------------------------- writing

def _ingest_one(out: PathLike, src: _Source, chunk_rows: int | None, dtype: Any,
                overwrite: bool) -> str:
    created = _missing_parents(os.fspath(out))
    try:
        with atomic_store(out, overwrite) as group:
            _write(group, src, chunk_rows, dtype)
    except BaseException:
        _remove_empty(created)
        raise
    return os.fspath(out)


def first_nonfinite(block: np.ndarray) -> tuple[int, int, int] | None:
    """(row, column, rows holding any) of the first NaN / infinity in a float
    block, None when there is none (or the block is not float)."""
    if block.dtype.kind != "f":
        return None
    bad = ~np.isfinite(block)
    if not bad.any():
        return None
    row, col = (np.argwhere(bad)[0].tolist() + [0])[:2]
    return row, col, int(bad.reshape(len(bad), -1).any(axis=1).sum())


def cast_finite(block: np.ndarray, dtype: Any, refuse: Callable[[np.ndarray], None]) -> np.ndarray:
    """``block`` as ``dtype``, ``refuse`` called on it before the cast (an integer
    cast would hide a NaN) and on the cast result (1e39 is finite, and infinite in
    float32): NaN or infinity written into a store would only stop a fit later."""
    refuse(block)
    with np.errstate(over="ignore", invalid="ignore"):  # refused just below
        out = block.astype(dtype, copy=False)
    if out is not block:
        refuse(out)
    return out


def _finite(block: np.ndarray, dtype: Any, start: int, name: str, src: _Source) -> np.ndarray:
    """``block`` as ``dtype`` (:func:`cast_finite`), naming the row of a NaN or infinity."""
    def refuse(b: np.ndarray) -> None:
        bad = first_nonfinite(b)
        if bad is not None:
            where = f", column {bad[1] + 1}" if b.ndim == 2 and name == "X" else ""
            raise IngestError(
                f"{src.attrs.get('source')}: NaN or infinity in {name} at data row "
                f"{start + bad[0]}{where} (as {np.dtype(dtype)}); drop or impute missing values, "
                "or rescale values beyond the stored type, before ingesting")
    return cast_finite(block, dtype, refuse)


def _write(group: Any, src: _Source, chunk_rows: int | None, dtype: Any) -> int:
    """Append the source's blocks to growing X / y arrays; returns the row count."""
    dtype = np.dtype(dtype)
    if src.n_inputs == 0:
        raise IngestError(f"{src.attrs.get('source')}: rows have no columns; nothing to ingest")
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(src.n_inputs, dtype)
    check_positive("chunk_rows", chunk_rows, integer=True)
    X = create_array(group, "X", (chunk_rows, src.n_inputs), dtype, chunk_rows)
    # y_auto: labels go to a float64 side array first (exact for integers up
    # to 2**53) and are copied, chunk by chunk, into y once their type is known.
    y_name = "_y_float64" if src.y_auto else "y"
    y = None if src.y_dtype is None else create_array(group, y_name, (chunk_rows, *src.y_tail),
                                                      src.y_dtype, chunk_rows)
    whole, lo, hi = True, 0.0, 0.0
    n = 0
    for Xb, yb in src.blocks(chunk_rows):
        k = Xb.shape[0]
        # Blocks are whole chunks (all but the last), so every write is chunk-aligned.
        X.resize((n + k, src.n_inputs))
        X[n:n + k] = _finite(Xb, dtype, n, "X", src)
        if y is not None:
            y.resize((n + k, *src.y_tail))
            y[n:n + k] = _finite(yb, src.y_dtype, n, "y", src)
            if src.y_auto and k:
                with np.errstate(invalid="ignore"):
                    whole = whole and bool(np.all(np.isfinite(yb) & (yb == np.round(yb))))
                lo, hi = min(lo, float(yb.min())), max(hi, float(yb.max()))
        n += k
    if n == 0:
        raise IngestError(f"{src.attrs.get('source')}: no data rows; nothing to ingest")
    if y is not None and src.y_auto:
        info = np.iinfo(np.int32)
        final = (np.dtype("float32") if not (whole and -2.0**63 <= lo and hi < 2.0**63) else
                 np.dtype("int32") if info.min <= lo and hi <= info.max else np.dtype("int64"))
        out = create_array(group, "y", (n, *src.y_tail), final, chunk_rows)
        for a in range(0, n, chunk_rows):  # float32 makes 1e39 infinite: refused by row
            out[a:a + chunk_rows] = _finite(y[a:a + chunk_rows], final, a, "y", src)
        del group[y_name]
    group.attrs.update(src.attrs)
    return n


def _missing_parents(path: str) -> list[str]:
    """Ancestors of ``path`` that do not exist yet, deepest first (to clean up on failure)."""
    if "://" in path:
        return []
    missing, parent = [], os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    return missing


def _remove_empty(folders: list[str]) -> None:
    for d in folders:
        try:
            os.rmdir(d)
        except OSError:
            return


# ------------------------------------------------------------------- helpers

def _open_bytes(path: PathLike) -> IO[bytes]:
    """Open a file for reading, through gzip when its first bytes say so."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        what = "is a folder, not a file" if os.path.isdir(path) else "does not exist"
        raise FileNotFoundError(f"{path}: {what}")
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")  # type: ignore[return-value]


def is_gzip(path: PathLike) -> bool:
    """Whether the file's first bytes are gzip's magic number (whatever its name)."""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _open_text(path: PathLike) -> IO[str]:
    return io.TextIOWrapper(_open_bytes(path), encoding="utf-8")


def _numbered_lines(path: PathLike, f: IO[str]) -> Iterator[tuple[int, str]]:
    """(line number, text) of the non-blank lines, with decoding errors named."""
    lineno = 0
    try:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                yield lineno, line.rstrip("\r\n")
    except UnicodeDecodeError:
        raise IngestError(f"{os.fspath(path)}: not UTF-8 text near line {lineno + 1}; is this "
                          "a binary file? pass --format if the name misleads") from None
    except (OSError, EOFError) as exc:  # corrupt or truncated gzip
        raise IngestError(f"{os.fspath(path)}: cannot read past line {lineno}: {exc}") from None


def _read(f: IO[bytes], nbytes: int, path: str) -> bytes:
    try:
        data = f.read(nbytes)
    except (OSError, EOFError) as exc:
        raise IngestError(f"{path}: cannot read: {exc}") from None
    return data


# ----------------------------------------------------------------------- idx

def _idx_header(path: PathLike) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, dims, header bytes) of an idx file; checks magic number and size."""
    path = os.fspath(path)
    with _open_bytes(path) as f:
        magic = _read(f, 4, path)
        if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in _IDX_DTYPES \
                or magic[3] == 0:
            shown = "0x" + magic.hex() if magic else "an empty file"
            raise IngestError(f"{path}: bad idx magic number {shown}; an idx file starts with "
                              "0x0000 then a type byte (0x08-0x0E) and the number of dimensions")
        raw = _read(f, 4 * magic[3], path)
        if len(raw) < 4 * magic[3]:
            raise IngestError(f"{path}: idx header ends early (truncated file)")
        dims = struct.unpack(f">{magic[3]}I", raw)
        gz = isinstance(f, gzip.GzipFile)
    dtype = np.dtype(_IDX_DTYPES[magic[2]])
    head = 4 + 4 * len(dims)
    if not gz:  # an uncompressed file's size is known up front; a gzip's only at its end
        expected = head + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
        size = os.path.getsize(path)
        if size != expected:
            raise IngestError(f"{path}: {size} bytes, but its idx header {list(dims)} needs "
                              f"{expected}; the file is truncated or not idx")
    return dtype, dims, head


def _idx_blocks(path: str, dtype: np.dtype, dims: tuple[int, ...], head: int,
                chunk_rows: int) -> Iterator[np.ndarray]:
    row = int(np.prod(dims[1:], dtype=np.int64))
    with _open_bytes(path) as f:
        _read(f, head, path)
        for start in range(0, dims[0], chunk_rows):
            k = min(chunk_rows, dims[0] - start)
            buf = _read(f, k * row * dtype.itemsize, path)
            if len(buf) != k * row * dtype.itemsize:
                got = start + len(buf) // max(1, row * dtype.itemsize)
                raise IngestError(f"{path}: file ends after {got} of {dims[0]} items "
                                  "(truncated download?)")
            yield np.frombuffer(buf, dtype=dtype).reshape(k, row)


def _idx_source(path: PathLike, labels: PathLike | None, scale: bool,
                dtype: Any) -> _Source:
    path = os.fspath(path)
    x_dtype, dims, head = _idx_header(path)
    n_inputs = int(np.prod(dims[1:], dtype=np.int64))
    byte_scale = scale and x_dtype == np.uint8
    out_dtype = np.dtype(dtype)
    if byte_scale and out_dtype.kind != "f":
        raise IngestError(f"scaling bytes to [0, 1] needs a float dtype, got {out_dtype}; "
                          "pass scale=False (--no-scale) to keep raw values")
    y_dtype, l_raw, ldims, lhead, lpath = None, None, (), 0, None
    if labels is not None:
        lpath = os.fspath(labels)
        l_raw, ldims, lhead = _idx_header(lpath)
        if len(ldims) != 1:
            raise IngestError(f"{lpath}: a labels file has one dimension, this one has "
                              f"{list(ldims)}")
        if ldims[0] != dims[0]:
            raise IngestError(f"{lpath} has {ldims[0]} labels but {path} has {dims[0]} items; "
                              "pair each images file with its own labels file")
        y_dtype = np.dtype(np.int32) if l_raw.kind in "iu" else l_raw.newbyteorder("=")

    def blocks(chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        ys = _idx_blocks(lpath, l_raw, ldims, lhead, chunk_rows) if lpath else None
        # One output buffer for all chunks: the writer copies each block into the
        # store before asking for the next, and fresh pages are slow (docs/design.md §4).
        buf = np.empty((min(chunk_rows, dims[0]), n_inputs), out_dtype)
        for xb in _idx_blocks(path, x_dtype, dims, head, chunk_rows):
            X = buf[:xb.shape[0]]
            X[...] = xb
            if byte_scale:
                np.divide(X, out_dtype.type(255), out=X)
            yield X, None if ys is None else next(ys).reshape(-1).astype(y_dtype)

    attrs = {"source": path, "format": "idx", "item_shape": list(dims[1:]),
             "scaled": bool(byte_scale)}
    if lpath:
        attrs["labels"] = lpath
    return _Source(n_inputs, blocks, y_dtype, (), attrs)


# ----------------------------------------------------------------------- npy

def _load_npy(path: PathLike, name: str) -> np.ndarray:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: does not exist")
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise IngestError(f"{path}: cannot read as .npy ({exc}); .npz and compressed .npy are "
                          "not supported, save with numpy.save") from None
    if not isinstance(a, np.ndarray):
        raise IngestError(f"{path}: holds several arrays (.npz); save X and y with numpy.save")
    if a.ndim == 0:
        raise IngestError(f"{path}: holds a scalar, not an array of rows")
    try:
        check_numeric_dtype(a.dtype, f"{name} in {path}")
    except TypeError as exc:
        raise IngestError(str(exc)) from None
    return a


def _npy_source(path: PathLike, labels: PathLike | None) -> _Source:
    Xm = _load_npy(path, "X")
    ym = None
    if labels is not None:
        ym = _load_npy(labels, "y")
        if ym.ndim > 2:
            raise IngestError(f"{os.fspath(labels)}: y must be 1-D or 2-D, got shape {ym.shape}")
        if ym.shape[0] != Xm.shape[0]:
            raise IngestError(f"{os.fspath(labels)} has {ym.shape[0]} rows but {os.fspath(path)} "
                              f"has {Xm.shape[0]}; they must describe the same samples")

    def blocks(chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        for i in range(0, Xm.shape[0], chunk_rows):
            # Slice the memory map first: only this block is read (and reshaped).
            xb = np.asarray(Xm[i:i + chunk_rows])
            yield (xb.reshape(xb.shape[0], -1),
                   None if ym is None else np.asarray(ym[i:i + chunk_rows]))

    attrs = {"source": os.fspath(path), "format": "npy"}
    if labels is not None:
        attrs["labels"] = os.fspath(labels)
    n_inputs = int(np.prod(Xm.shape[1:], dtype=np.int64))
    if ym is None:
        return _Source(n_inputs, blocks, None, (), attrs)
    return _Source(n_inputs, blocks, ym.dtype.newbyteorder("="), tuple(ym.shape[1:]), attrs)


# ----------------------------------------------------------------------- csv

def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _csv_source(path: PathLike, target: int | str | None, header: bool | None,
                delimiter: str | None, y_dtype: np.dtype) -> _Source:
    path = os.fspath(path)
    with _open_text(path) as f:
        first = next(_numbered_lines(path, f), None)
    if first is None:
        raise IngestError(f"{path}: no data rows; nothing to ingest")
    if delimiter == "auto":
        delimiter = next((d for d in (",", "\t", ";") if d in first[1]), None)

    def split(line: str) -> list[str]:
        if delimiter is None:
            return line.split()
        return [v.strip() for v in next(csv.reader([line], delimiter=delimiter, quotechar='"'))]

    fields = split(first[1])
    n_cols = len(fields)
    if header is None:
        header = not all(_is_number(v) for v in fields)
    names = fields if header else None
    t = None
    if target is not None:
        if isinstance(target, str) and names is not None and target in names:
            t = names.index(target)
        else:
            try:
                t = int(target)
            except (TypeError, ValueError):
                where = f"columns: {', '.join(names[:20])}" if names else "the file has no header"
                raise IngestError(f"{path}: no column named {target!r} ({where}); pass a column "
                                  "name or index, or --no-target") from None
            if not -n_cols <= t < n_cols:
                raise IngestError(f"{path}: target index {t} is out of range for {n_cols} columns")
            t %= n_cols
    if n_cols - (t is not None) < 1:
        raise IngestError(f"{path}: only the target column is present; there are no features "
                          "(use --no-target to store the column as X)")

    def diagnose(lines: list[str], numbers: list[int], exc: Exception) -> IngestError:
        for lineno, line in zip(numbers, lines, strict=True):
            vals = split(line)
            if len(vals) != n_cols:
                return IngestError(f"{path}:{lineno}: {len(vals)} values but {n_cols} columns "
                                   f"(line {first[0]}); every row needs the same number "
                                   "(ragged rows)")
            for j, v in enumerate(vals):
                if not _is_number(v):
                    col = f"column {j + 1}" + (f" ({names[j]!r})" if names else "")
                    what = "empty value" if v == "" else f"non-numeric value {v!r}"
                    return IngestError(f"{path}:{lineno}: {what} in {col}; encode or impute it "
                                       "before ingesting")
        return IngestError(f"{path}:{numbers[0]}-{numbers[-1]}: cannot parse these rows ({exc})")

    def parse(lines: list[str], numbers: list[int]) -> tuple[np.ndarray, np.ndarray | None]:
        try:
            A = np.loadtxt(lines, delimiter=delimiter, dtype=np.float64, ndmin=2, comments=None,
                           quotechar='"')
        except ValueError as exc:
            raise diagnose(lines, numbers, exc) from None
        if A.shape[1] != n_cols:  # loadtxt only sees ragged rows within one chunk
            raise diagnose(lines, numbers, ValueError(f"{A.shape[1]} columns"))
        if t is None:
            return A, None
        return np.delete(A, t, axis=1), A[:, t].astype(y_dtype)

    def blocks(chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        lines: list[str] = []
        numbers: list[int] = []
        with _open_text(path) as f:
            for lineno, line in _numbered_lines(path, f):
                if header and lineno == first[0]:
                    continue
                lines.append(line)
                numbers.append(lineno)
                if len(lines) == chunk_rows:
                    yield parse(lines, numbers)
                    lines, numbers = [], []
        if lines:
            yield parse(lines, numbers)

    attrs: dict = {"source": path, "format": "csv"}
    if names is not None:
        attrs["columns"] = [v for j, v in enumerate(names) if j != t]
    if t is not None:
        attrs["target"] = names[t] if names is not None else t
    return _Source(n_cols - (t is not None), blocks, None if t is None else y_dtype, (), attrs)


# -------------------------------------------------------------------- libsvm

def _libsvm_source(path: PathLike, n_features: int | None, zero_based: bool,
                   dtype: np.dtype, y_dtype: np.dtype) -> _Source:
    """scikit-learn's reader over byte ranges of the file (:mod:`dkernel.data.svmlight`),
    re-blocked into chunks of ``chunk_rows`` dense rows."""
    from dkernel.data import svmlight

    path = os.fspath(path)
    _open_bytes(path).close()  # missing file: fail before any pass
    ranges = svmlight.byte_ranges(path)
    if n_features is None:  # the width must be known before the first dense chunk
        n_features = svmlight.width(path, [svmlight.scan_range(path, r, zero_based) for r in ranges],
                                    None)
    check_positive("n_features", n_features, integer=True)

    def blocks(chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        # Reused for every chunk (the writer stores each block before the next).
        X = np.empty((chunk_rows, n_features), dtype=dtype)
        y = np.empty(chunk_rows, dtype=y_dtype)
        k = 0
        for rng in ranges:
            Xr, yr = svmlight.read_range(path, rng, n_features, zero_based, dtype)
            a = 0
            while a < len(yr):
                take = min(chunk_rows - k, len(yr) - a)
                X[k : k + take] = Xr[a : a + take].toarray()
                y[k : k + take] = yr[a : a + take]
                a, k = a + take, k + take
                if k == chunk_rows:
                    yield X, y
                    k = 0
        if k:
            yield X[:k], y[:k]

    return _Source(n_features, blocks, y_dtype, (), {"source": path, "format": "libsvm"})
