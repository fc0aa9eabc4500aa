"""Writing dataset stores: a zarr group with row-chunked, compressed X (and y),
created under a temporary name and renamed into place when complete."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

DEFAULT_CHUNK_ROWS = 8192


@contextmanager
def atomic_store(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Any]:
    """Yield a new zarr group at a temporary sibling of ``path``; on success it
    is renamed to ``path``, on failure removed (no partial output)."""
    import zarr

    path = os.fspath(path)
    if "://" in path and not path.startswith("file://"):
        # Object stores have no atomic rename; write in place (but never over
        # an existing store unless asked to).
        import fsspec

        fs, root = fsspec.core.url_to_fs(path)
        if fs.exists(root) and not overwrite:
            raise FileExistsError(f"{path!r} already exists; remove it or choose another output path")
        yield zarr.open_group(path, mode="w")
        return
    path = path.removeprefix("file://")
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path!r} already exists; remove it or choose another output path")
    parent = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield zarr.open_group(tmp, mode="w")
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def store_location(group: Any, path: str | os.PathLike) -> str:
    """Where workers open ``group`` (from :func:`atomic_store`): the temporary
    directory of a local store, the URL of a remote one."""
    root = getattr(group.store, "root", None)
    return str(root) if root is not None else os.fspath(path)


def create_array(group: Any, name: str, shape: tuple, dtype: Any, chunk_rows: int) -> Any:
    """A row-chunked, compressed array in ``group`` (all columns in one chunk)."""
    chunks = (max(1, min(chunk_rows, max(1, shape[0]))),) + tuple(shape[1:])
    return group.create_array(name, shape=shape, chunks=chunks, dtype=np.dtype(dtype))


def write_store(path: str | os.PathLike, X: Any, y: Any = None, *,
                chunk_rows: int = DEFAULT_CHUNK_ROWS, overwrite: bool = False,
                attrs: dict | None = None) -> str:
    """Write X (and y) -- NumPy or dask -- as a dataset store; returns the path."""
    import dask.array as da

    with atomic_store(path, overwrite) as group:
        for name, a in (("X", X), ("y", y)):
            if a is None:
                continue
            arr = create_array(group, name, tuple(a.shape), a.dtype, chunk_rows)
            if isinstance(a, da.Array):
                da.store(a.rechunk(arr.chunks), arr, lock=False)
            else:
                for i in range(0, a.shape[0], arr.chunks[0]):
                    arr[i : i + arr.chunks[0]] = np.asarray(a[i : i + arr.chunks[0]])
        if attrs:
            group.attrs.update(attrs)
    return os.fspath(path)
