"""idx files (LeCun's MNIST format, ``.gz`` or not), and Fashion-MNIST from them.

The header is checked (magic number, dimensions, the size of an uncompressed
file) before anything is written; items are read block by block, through gzip
when compressed, and each item becomes one row (28 x 28 images: 784 columns).
"""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from dkernel.data.ingest.common import IngestError, PathLike, open_bytes, store_params
from dkernel.data.ingest.writer import Source, write_stores
from dkernel.data.store import check_out
from dkernel.files import expands_user

#: Where ``apt-get install dataset-fashion-mnist`` puts the idx files.
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_FASHION_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                  "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}

# idx type byte -> big-endian dtype (LeCun's MNIST page).
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@expands_user("path", "out", "labels")
@store_params
def ingest_idx(path: PathLike, out: PathLike, labels: PathLike | None = None, *,
               scale: bool = True, dtype: Any = "float32", chunk_rows: int | None = None,
               overwrite: bool = False, progress: Any = None) -> str:
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
    {store params}
    """
    check_out(out, overwrite)
    write_stores({out: _idx_source(path, labels, scale, dtype)}, chunk_rows, dtype, overwrite,
                 progress)
    return os.fspath(out)


@expands_user("out", "source")
def ingest_fashion_mnist(out: PathLike, source: PathLike | None = None, *,
                         chunk_rows: int | None = None, overwrite: bool = False,
                         progress: Any = None) -> str:
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
    out, sources = os.fspath(out), {}
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
        sources[os.path.join(out, f"{split}.zarr")] = _idx_source(*found, True, "float32")
    for path in sources:
        check_out(path, overwrite)
    write_stores(sources, chunk_rows, "float32", overwrite, progress)
    return out


def _read(f: IO[bytes], nbytes: int, path: str) -> bytes:
    try:
        return f.read(nbytes)
    except (OSError, EOFError) as exc:  # corrupt or truncated gzip
        raise IngestError(f"{path}: cannot read: {exc}") from None


def _idx_header(path: PathLike) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, dims, header bytes) of an idx file; checks magic number and size."""
    path = os.fspath(path)
    with open_bytes(path) as f:
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
    with open_bytes(path) as f:
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
                dtype: Any) -> Source:
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
    return Source(n_inputs, blocks, y_dtype, (), attrs, total=int(dims[0]))


