"""Writing dataset stores: a zarr group with row-chunked, compressed X (and y),
created under a temporary name and renamed into place when complete."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

DEFAULT_CHUNK_ROWS = 8192
#: Ingest chunks hold at most this many bytes of X (as in dkernel.data.dataset)
#: and DEFAULT_CHUNK_ROWS rows, so wide data does not get gigabyte chunks.
CHUNK_BYTES = 32 * 2**20


def default_chunk_rows(n_inputs: int, dtype: Any) -> int:
    """Rows of an ingested chunk when none are given: at most
    ``DEFAULT_CHUNK_ROWS`` rows and ``CHUNK_BYTES`` of X."""
    row_bytes = max(1, int(n_inputs) * np.dtype(dtype).itemsize)
    return max(1, min(DEFAULT_CHUNK_ROWS, CHUNK_BYTES // row_bytes))


def check_out(out: str | os.PathLike, overwrite: bool) -> None:
    """Refuse an existing local output unless ``overwrite`` (before any work)."""
    out = os.fspath(out)
    if not overwrite and "://" not in out and os.path.exists(out):
        raise FileExistsError(f"{out} already exists; remove it, choose another --out, "
                              "or pass --overwrite (overwrite=True)")


@contextmanager
def atomic_store(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Any]:
    """Yield a new zarr group at a temporary sibling of ``path``; on success it
    is moved to ``path``, on failure removed (no partial output).

    Local paths are renamed into place.  Object stores (``s3://``, ...) have
    no rename: the finished store is copied key by key on the server, the
    group's own metadata (``zarr.json``) last, then the temporary prefix is
    removed.  Until that last key lands there is no group at ``path`` --
    opening it fails instead of reading missing chunks as zeros -- so a store
    at ``path`` is always complete.
    """
    import zarr

    path = os.fspath(path)
    if "://" in path and not path.startswith("file://"):
        yield from _atomic_object_store(path, overwrite)
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


# The keys that make a folder of chunks a zarr group (v3, and v2's).
_GROUP_METADATA = ("zarr.json", ".zgroup", ".zattrs", ".zmetadata")


def _atomic_object_store(url: str, overwrite: bool) -> Iterator[Any]:
    import fsspec
    import zarr

    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/")
    if fs.exists(root) and not overwrite:
        raise FileExistsError(f"{url!r} already exists; remove it or choose another output path")
    head, _, name = url.rstrip("/").rpartition("/")
    tmp_url = f"{head}/.{name}.tmp-{uuid.uuid4().hex[:12]}"
    _, tmp = fsspec.core.url_to_fs(tmp_url)
    try:
        yield zarr.open_group(tmp_url, mode="w")
        fs.invalidate_cache()  # workers wrote chunks this process has not listed
        keys = fs.find(tmp)
        last = [k for k in keys if k.rpartition("/")[0] == tmp
                and k.rpartition("/")[2] in _GROUP_METADATA]
        body = [k for k in keys if k not in last]
        if fs.exists(root):
            fs.rm(root, recursive=True)
        for batch in (body, last):
            if batch:
                fs.copy(batch, [root + k[len(tmp):] for k in batch])
    finally:
        try:
            fs.rm(tmp, recursive=True)
        except FileNotFoundError:
            pass


def store_location(group: Any, path: str | os.PathLike) -> str:
    """Where workers open ``group`` (from :func:`atomic_store`): its temporary
    directory or temporary object-store prefix, until it is renamed into place."""
    root = getattr(group.store, "root", None)
    if root is not None:
        return str(root)
    fs, sub = getattr(group.store, "fs", None), getattr(group.store, "path", None)
    if fs is not None and sub is not None:
        protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
        return f"{protocol}://{sub}"
    return os.fspath(path)


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
