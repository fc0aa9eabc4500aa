"""``.npy`` arrays, memory-mapped so that only one chunk is read at a time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dkernel.data.ingest.common import IngestError, PathLike, store_params
from dkernel.data.ingest.writer import Source, write_stores
from dkernel.data.store import check_out
from dkernel.data.validate import check_numeric_dtype
from dkernel.files import expands_user


@expands_user("path", "out", "labels")
@store_params
def ingest_npy(path: PathLike, out: PathLike, labels: PathLike | None = None, *,
               dtype: Any = "float32", chunk_rows: int | None = None,
               overwrite: bool = False, progress: Any = None) -> str:
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
    {store params}
    """
    check_out(out, overwrite)
    write_stores({out: _npy_source(path, labels)}, chunk_rows, dtype, overwrite, progress)
    return os.fspath(out)


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


def _npy_source(path: PathLike, labels: PathLike | None) -> Source:
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
        return Source(n_inputs, blocks, None, (), attrs, total=int(Xm.shape[0]))
    return Source(n_inputs, blocks, ym.dtype.newbyteorder("="), tuple(ym.shape[1:]), attrs,
                  total=int(Xm.shape[0]))


