"""Open X / y from NumPy, dask or zarr (path or fsspec URL) and validate shapes."""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

from dkernel._stack import user_stacklevel
from dkernel.data.validate import (
    check_finite_chunk,
    check_memory_visible,
    check_numeric_dtype,
    memory_root,
)
from dkernel.files import require_protocol, user_path

# Default row-chunk size for in-memory input: ~32 MB per chunk keeps tasks
# coarse enough to amortise scheduling yet far below worker memory.
_CHUNK_BYTES = 32 * 2**20
_MIN_CHUNKS = 8


@dataclass(frozen=True)
class StoreArrays:
    """The zarr arrays behind a store's X and y, for reading a row chunk in one
    task (:func:`read_store_rows`) instead of building a dask graph per chunk."""

    X: Any
    y: Any | None
    #: the local folder every worker must see (None for URLs such as s3://)
    root: str | None
    #: the store's path or URL, for messages
    url: str = ""


@dataclass
class Dataset:
    """Row-chunked X (n x d) and optional y with the same row chunks."""

    X: da.Array
    y: da.Array | None = None
    source: str = "array"
    #: The NumPy arrays behind X / y when the input was in memory: the engine
    #: scatters their chunks to the workers once instead of re-sending a graph
    #: that embeds the whole array.
    host: tuple[np.ndarray, np.ndarray | None] | None = None
    #: The zarr arrays behind X / y when both come from one store (X, y as
    #: dask arrays are the same data; derived datasets have none).
    store: StoreArrays | None = None

    @property
    def n_rows(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_inputs(self) -> int:
        return int(self.X.shape[1])

    @property
    def row_chunks(self) -> tuple[int, ...]:
        return tuple(int(c) for c in self.X.chunks[0])

    @property
    def n_chunks(self) -> int:
        return len(self.X.chunks[0])

    def row_offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.row_chunks)])


def _open_zarr_group(url: str, storage_options: dict | None):
    import zarr

    if "://" not in url and not os.path.exists(url):
        raise FileNotFoundError(f"no dataset store at {url!r}: the path does not exist; create "
                                "one with 'dkernel ingest' or check the path")
    if "://" not in url:
        # Workers read the chunks themselves, from their own working directory.
        url = os.path.abspath(url)
    require_protocol(url)
    # the arrays' own metadata, not a consolidated copy: one that went stale
    # (rows appended after consolidate_metadata) hid half the rows (zarr 2 reads
    # its own unless told otherwise)
    own = {"use_consolidated": False} if int(zarr.__version__.split(".")[0]) >= 3 else {}
    try:
        return zarr.open_group(url, mode="r", storage_options=storage_options, **own)
    except Exception as exc:  # zarr raises several types for "not a group here"
        raise FileNotFoundError(
            f"cannot open {url!r} as a zarr dataset store ({type(exc).__name__}: {exc}); "
            f"{_open_remedy(exc, url)}") from None


def _open_remedy(exc: BaseException, url: str) -> str:
    """What to change when a store cannot be opened: every failure was told
    "a store is a zarr group...", wrong credentials and a missing bucket too."""
    kind, text = type(exc).__name__, str(exc).replace(url, "").lower()
    if "://" not in url:
        return ("check the folder's permissions" if isinstance(exc, PermissionError) else
                "a store is a zarr group holding arrays 'X' and optionally 'y'")
    if isinstance(exc, PermissionError) or "credential" in kind.lower() or \
            "forbidden" in text or "access denied" in text:
        return "check the credentials (e.g. AWS_* in the environment, or storage_options)"
    if "endpoint" in kind.lower() or "could not connect" in text or "cannot connect" in text \
            or "connection" in kind.lower():
        return "check the endpoint and the network (e.g. AWS_ENDPOINT_URL)"
    if "bucket" in text:
        return "check the bucket's name"
    return "a store is a zarr group holding arrays 'X' and optionally 'y'"


#: The fields of a file's record that change when it is rewritten (local, S3,
#: GCS, and Azure's lower-case spelling).
_STAMP_KEYS = ("mtime", "ino", "size", "ETag", "LastModified", "created", "generation",
               "md5Hash", "etag", "last_modified")


def _from_store(group: Any, name: str, url: str, storage_options: dict | None) -> da.Array:
    """``group[name]`` as a dask array whose name changes when the array is
    rewritten.

    The array's name is the identity of its chunks: workers cache blocks
    derived from a chunk (feature blocks, kernel rows) under it, across fits
    (:mod:`dkernel.engine.cache`).  Dask's own token for a zarr array depends
    only on its path and metadata, so a store rewritten at the same path with
    other data of the same shape kept its name, and a later fit on a
    long-lived cluster would read blocks computed from the old data.  The
    modification records of X's files (mtime, size and inode of a local
    file, ETag / LastModified of an object) are part of the name: a rewrite
    (``dkernel ingest --overwrite``, :func:`write_store`) or a chunk written
    in place gives a new name.  Listing them costs one stat per chunk (0.25 s
    for 20,000 local chunks; one LIST request per 1000 objects).
    """
    from dask.base import tokenize

    arr = group[name]
    local = url.removeprefix("file://") if url.startswith("file://") or "://" not in url \
        else None
    where = url if local is None else os.path.abspath(local)  # ./s.zarr is s.zarr
    stamp: Any = None
    chunks: int | None = None  # chunk files found (check_chunks_present)
    try:
        # X's every chunk (workers cache blocks derived from them); y's metadata
        # only: nothing is cached under y's name, and its walk doubled the cost
        if local is not None:
            folder = os.path.join(where, name)
            if name == "X":  # (one walk serves the stamp and the count)
                stamp = _local_stamp(folder)
                chunks = stamp[-1]
            else:
                stamp = [os.stat(os.path.join(folder, m)).st_mtime_ns
                         for m in ("zarr.json", ".zarray")
                         if os.path.exists(os.path.join(folder, m))]
        else:
            import fsspec

            fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
            prefix = f"{root.rstrip('/')}/{name}"
            # one LIST of the array's objects stamps X and counts the chunks of
            # both: a missing chunk reads as zeros (an interrupted `aws s3 sync`
            # fitted without a word); y's stamp stays its metadata
            listed = _fs_call(fs, "find", prefix, detail=True)
            stamp = _fs_stamp(fs, prefix, listed if name == "X" else {})
            if listed:  # (empty: a file system that cannot list; nothing to count)
                chunks = sum(bool(_CHUNK_FILE.match(k.rsplit("/", 1)[-1])) for k in listed)
    except (ImportError, OSError, ValueError):
        stamp = None  # no file system record: the path and metadata alone name it
    if local is not None or chunks is not None:
        check_chunks_present(arr, name, where, os.path.join(where, name), chunks)
    token = tokenize(where, name, arr.shape, str(arr.dtype), arr.chunks, stamp)
    return da.from_zarr(arr, name=f"from-zarr-{token}")


def check_chunks_present(arr: Any, name: str, where: str, folder: str,
                         present: int | None = None) -> None:
    """Warn about a store array whose chunks are not all there; refuse one that
    claims far more than it holds.

    zarr reads a missing chunk as the array's fill value, so an interrupted
    copy fitted without a word: 3 of 4 chunks of X deleted gave accuracy
    0.507 where the whole store gives 0.994, and a shape edited to 1e8 rows
    fitted 99.998% made-up rows for 11 minutes (1e12: a MemoryError in dask).
    A missing chunk is not always damage: zarr's writers leave out a chunk
    that holds only the fill value (a y of zeros, or an in-place write of
    zeros into a store dkernel wrote whole, :func:`~dkernel.data.store.create_array`),
    so it is said, with what dkernel knows of the writer.  ``present``: the
    chunk files, where a walk of ``folder`` counted them already."""
    total, present = chunk_files(arr, folder, present)
    if present >= total:
        return
    what = (f"{where}: {total - present} of the {total} chunks of its array {name!r} are not "
            f"stored, and zarr reads a missing chunk as the fill value "
            f"({np.asarray(arr.fill_value).item()!r})")
    if total - present > _MOST_MISSING:  # (dask's graph of them alone would not fit)
        raise ValueError(f"{what}: its shape ({arr.shape[0]} rows) claims far more than the "
                         "store holds (edited, or a copy cut short); copy or write it again")
    writer = ("dkernel wrote every chunk of it, so unless it was written in place since, the "
              "store is an incomplete copy" if arr.attrs.get(EVERY_CHUNK_WRITTEN) else
              "a writer may leave out chunks that hold only that value; if these should hold "
              "data, the store is incomplete")
    import warnings

    warnings.warn(f"{what}; {writer}: copy or write it again", UserWarning,
                  stacklevel=user_stacklevel())


def chunk_files(arr: Any, folder: str, present: int | None = None) -> tuple[int, int]:
    """(chunks the array's shape needs, chunk files in ``folder``): shards where
    it has them (one file each).  Counted from the files, by their names (a
    chunk key is digits: "0.0" in zarr 2, "c/0/0" in zarr 3; an rsync
    temporary ".0.Xa81kq" is not one); zarr's ``nchunks_initialized`` builds
    every key first, 1e9 of them for a shape edited to 1e12 rows."""
    grid = getattr(arr, "shards", None) or arr.chunks
    total = math.prod(-(-int(n) // int(c)) for n, c in zip(arr.shape, grid))
    if present is None:
        present = sum(sum(1 for f in files if _CHUNK_FILE.match(f))
                      for _, _, files in os.walk(folder))
    return total, present


#: A chunk file's name (the last part of its key).
_CHUNK_FILE = re.compile(r"^\d+(\.\d+)*$")

#: Missing chunks beyond which an array is refused, not warned about.
_MOST_MISSING = 1_000_000

#: Attribute of a store array every chunk of which was written
#: (:func:`dkernel.data.store.create_array`): :func:`check_chunks_present` says
#: that a chunk missing there is damage unless the store was written in place.
EVERY_CHUNK_WRITTEN = "dkernel_every_chunk_written"


def _fs_stamp(fs: Any, prefix: str, files: dict | None = None) -> str:
    """A digest of the modification records of an array's objects under
    ``prefix`` on an fsspec file system: ``files``, its listing
    (``fs.find(prefix, detail=True)``; None: listed here); its metadata alone
    where that is empty (y, or a file system that cannot list)."""
    if files is None:
        files = _fs_call(fs, "find", prefix, detail=True)
    if not files:
        files = {m: _fs_call(fs, "info", f"{prefix}/{m}") for m in ("zarr.json", ".zarray")
                 if _fs_call(fs, "exists", f"{prefix}/{m}")}
    return hashlib.sha1(repr(sorted(
        (key, sorted((k, str(v)) for k, v in info.items() if k in _STAMP_KEYS))
        for key, info in files.items())).encode()).hexdigest()


def _fs_call(fs: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """``fs.method(...)``; on an asynchronous file system (zarr 3's stores wrap
    even a local one so) its coroutine, run on zarr's loop (the synchronous
    method raised "Loop is not running")."""
    if getattr(fs, "asynchronous", False):
        from zarr.core.sync import sync

        return sync(getattr(fs, f"_{method}")(*args, **kwargs))
    return getattr(fs, method)(*args, **kwargs)


def _stamped_zarr(arr: Any, chunks: Any = None) -> da.Array:
    """A zarr array object as a dask array named, as :func:`_from_store` names a
    store's, by where its chunks live and their modification records: dask's
    own name for it depends on its path and metadata only, so an array written
    in place (``z[:] = X_new``) kept its name, and a second fit on a long-lived
    cluster trained on the old data's cached feature blocks (R^2 -0.107 where
    the same fit on a cleared cache reached 0.973).  An array in memory has no
    such record: its content names it (read once, here).  Where no record can
    be read, the name is dask's, as before."""
    from dask.base import tokenize

    store, path = arr.store, str(getattr(arr, "path", "") or "")
    stamp: Any = None
    try:
        if getattr(store, "fs", None) is not None:  # fsspec: s3://, gs://, file://, ...
            where = f"{str(store.path).rstrip('/')}/{path}".rstrip("/")
            stamp = (where, _fs_stamp(store.fs, where))
        elif type(store).__name__ == "MemoryStore":
            stamp = ("memory", tokenize(np.asarray(arr[...])))
        else:  # a folder: zarr 3's LocalStore (root), zarr 2's DirectoryStore (path)
            root = getattr(store, "root", None) or getattr(store, "path", None)
            if root is not None and os.path.isdir(str(root)):
                where = os.path.abspath(os.path.join(str(root), path))
                stamp = (where, _local_stamp(where))
    except Exception:  # (no record readable: dask's name, path and metadata)
        stamp = None
    chunks = arr.chunks if chunks is None else chunks
    if stamp is None:
        return da.from_zarr(arr, chunks=chunks)
    return da.from_zarr(arr, chunks=chunks, name=_STAMPED + tokenize(
        stamp, arr.shape, str(arr.dtype), chunks))


#: Name prefix of a zarr array :func:`_stamped_zarr` named: validation then
#: :func:`open_dataset` see it twice a fit, and stamped it twice (a stat of
#: every chunk file, or a whole in-memory array read and hashed, each time).
_STAMPED = "from-zarr-stamped-"


def _zarr_source(arr: da.Array) -> Any:
    """The zarr array a ``da.from_zarr`` array reads, or None for any other dask array."""
    if not arr.name.startswith("from-zarr-") or arr.name.startswith(_STAMPED):
        return None
    graph = arr.__dask_graph__()
    source = graph.get(f"original-{arr.name}") if hasattr(graph, "get") else None
    if source is None or not type(source).__module__.startswith("zarr"):
        return None
    # only the read itself: a graph with more in it is another array
    return source if len(graph) == 1 + math.prod(len(c) for c in arr.chunks) else None


def _local_stamp(folder: str) -> tuple[int, int, int, int, int]:
    """(files, bytes, newest mtime in ns, sum of inodes, chunk files) of a local
    array's files: a chunk written in place, or replaced by a rename, changes
    the first four (about 15 us a file: 0.3 s for 20,000 chunks); the last is
    :func:`check_chunks_present`'s count."""
    n = size = newest = inodes = chunks = 0
    folders = [folder]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    folders.append(e.path)
                    continue
                st = e.stat()
                n, size, inodes = n + 1, size + st.st_size, inodes + st.st_ino
                newest = max(newest, st.st_mtime_ns)
                chunks += bool(_CHUNK_FILE.match(e.name))
    return n, size, newest, inodes, chunks


def _visible_on_workers(arr: da.Array, url: str) -> da.Array:
    """Guard the chunk reads of a local store: zarr reads a chunk it cannot find
    as fill values, so a worker without the store (no shared file system)
    would silently train on zeros."""
    if url.startswith("memory://"):
        return arr.map_blocks(check_memory_visible, "/" + url[len("memory://"):].lstrip("/"),
                              dtype=arr.dtype)
    if "://" in url and not url.startswith("file://"):
        return arr
    root = os.path.abspath(url.removeprefix("file://"))
    return arr.map_blocks(_check_store_visible, root, dtype=arr.dtype)


def read_store_rows(store: StoreArrays, start: int, stop: int,
                    rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows ``start:stop`` of X and y (``rows`` of them, relative to ``start``,
    when given), read on a worker.  A chunk read through dask's graph of the
    same arrays was three tasks and ~6 ms of client time to build; on 2
    workers and 2 cores that client time came out of the workers' share."""
    if store.root is not None:
        _check_store_visible(None, store.root)
    memory = memory_root(store.X.store)
    if memory is not None:
        check_memory_visible(None, memory)
    try:
        X = np.asarray(store.X[start:stop])
        y = None if store.y is None else np.asarray(store.y[start:stop])
    except Exception as exc:
        if store.root is not None or memory is not None or \
                isinstance(exc, (MemoryError, ValueError, TypeError, KeyError)):
            raise  # (a local store, or an error of the data, not of the access)
        # an object store's error on a worker came as bare text ("Unable to locate
        # credentials", "Forbidden"), naming neither the worker nor the store
        raise OSError(f"a worker ({_worker_name()}) cannot read rows {start}:{stop} of "
                      f"{store.url} ({type(exc).__name__}: {exc}); every worker needs the "
                      "store's credentials and endpoint (e.g. AWS_* in each worker's "
                      "environment) and network access to it") from exc
    if rows is not None:
        X, y = X[rows], None if y is None else y[rows]
    return X, y


def _worker_name() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        import socket

        return socket.gethostname()


def _check_store_visible(block: Any, root: str) -> Any:
    if not os.path.isdir(root):
        import socket

        raise FileNotFoundError(
            f"the dataset store {root!r} is not visible on worker host {socket.gethostname()!r}; "
            "every worker must reach the data under the same path (a shared file system) "
            "or use a URL such as s3://")
    return block


def as_dask_rows(a: Any, name: str, chunk_rows: int | None = None) -> da.Array:
    """``a`` as a dask array chunked by rows only (columns in one chunk)."""
    if isinstance(a, da.Array):
        source = _zarr_source(a)
        arr = a if source is None else _stamped_zarr(source, a.chunks)
        if arr.ndim == 2 and len(arr.chunks[1]) > 1:
            arr = arr.rechunk({1: -1})
        if chunk_rows is not None:
            arr = arr.rechunk({0: chunk_rows})
        return arr
    if hasattr(a, "shape") and hasattr(a, "dtype") and not isinstance(a, np.ndarray) \
            and type(a).__module__.startswith("zarr"):
        return as_dask_rows(_stamped_zarr(a), name, chunk_rows)
    if isinstance(a, (list, tuple)):
        a = np.asarray(a)
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise TypeError(f"{name} must be a NumPy/dask/zarr array or a store path, got "
                        f"{type(a).__name__}")
    if chunk_rows is None:
        row_bytes = max(1, int(np.prod(a.shape[1:], dtype=np.int64)) * a.dtype.itemsize)
        chunk_rows = max(1, min(max(1, a.shape[0]), _CHUNK_BYTES // row_bytes))
        # at least _MIN_CHUNKS chunks of >= 1024 rows, so lanes="auto" can give
        # every worker of a small cluster a share of each step
        chunk_rows = min(chunk_rows, max(1024, -(-a.shape[0] // _MIN_CHUNKS)))
    chunks = (chunk_rows,) + tuple(-1 for _ in a.shape[1:])
    return da.from_array(a, chunks=chunks)


def open_dataset(X: Any, y: Any = None, *, require_y: bool = False, chunk_rows: int | None = None,
                 storage_options: dict | None = None, name: str = "X") -> Dataset:
    """Open and validate a dataset; nothing is computed except for in-memory input.

    Parameters
    ----------
    X : str, os.PathLike, numpy.ndarray, dask.array.Array or zarr.Array
        A path / fsspec URL of a zarr group holding ``X`` (and ``y``), or the
        feature matrix itself (n x d).
    y : array-like, optional
        Targets with the same number of rows and row chunks as X.  When X is a
        store and y is None, the store's ``y`` is used if present.
    require_y : bool
        Raise if no targets are found (fitting a supervised model).
    chunk_rows : int, optional
        Row-chunk size for in-memory input (default ~32 MB per chunk).
    name : str
        What errors about X call it (a parameter of the caller's, e.g. ``X_numerator``).

    Raises
    ------
    FileNotFoundError, TypeError, ValueError
        With a message naming the problem: missing store, non-numeric dtype,
        wrong dimensionality, empty data, X/y row or chunk mismatch, and (for
        NumPy input, checked at once) NaN / infinity.
    """
    source = "array"
    store = None
    if isinstance(X, (str, os.PathLike)):
        source = user_path(X)
        group = _open_zarr_group(source, storage_options)
        if "X" not in group:
            raise ValueError(f"store {source!r} has no array 'X' (found: {sorted(group.keys())})")
        Xa = _visible_on_workers(_from_store(group, "X", source, storage_options), source)
        if y is None:
            local = "://" not in source or source.startswith("file://")
            store = StoreArrays(group["X"], group["y"] if "y" in group else None,
                                os.path.abspath(source.removeprefix("file://")) if local else None,
                                source)
            if "y" in group:
                y = _visible_on_workers(_from_store(group, "y", source, storage_options), source)
        X = Xa
    in_memory = isinstance(X, np.ndarray) or isinstance(X, (list, tuple))
    if isinstance(X, (list, tuple)):
        X = np.asarray(X)
    _check_lazy_rows(X, name)
    if not hasattr(X, "ndim"):
        raise TypeError(f"{name} must be an array or a store path, got {type(X).__name__}")
    if X.ndim != 2:
        hint = f" (reshape a single feature with {name}.reshape(-1, 1))" if X.ndim == 1 else ""
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape "
                         f"{X.shape}{hint}")
    check_numeric_dtype(np.dtype(X.dtype), name)
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {X.shape}); a dataset needs at least one row "
                         "and column")
    if in_memory:
        check_finite_chunk(np.asarray(X), name, 0)
    Xd = as_dask_rows(X, name, chunk_rows)
    yd = None
    if y is not None:
        y_in_memory = isinstance(y, (np.ndarray, list, tuple))
        if isinstance(y, (list, tuple)):
            y = np.asarray(y)
        if isinstance(y, (str, os.PathLike)):
            raise TypeError(f"y is a path ({os.fspath(y)!r}); a store holds X and y together "
                            "(dkernel ingest, write_store): pass that store alone, or y as "
                            "an array")
        _check_lazy_rows(y, "y")
        if y.ndim not in (1, 2):
            raise ValueError(f"y must be 1-D or 2-D, got shape {y.shape}")
        check_numeric_dtype(np.dtype(y.dtype), "y")
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"y has {y.shape[0]} rows but X has {X.shape[0]}; they must describe "
                             "the same samples")
        if y_in_memory:
            check_finite_chunk(np.asarray(y), "y", 0)
            yd = da.from_array(np.asarray(y),
                               chunks=(Xd.chunks[0],) + tuple(-1 for _ in y.shape[1:]))
        else:
            yd = as_dask_rows(y, "y")
            if store is not None and tuple(yd.chunks[0]) != tuple(Xd.chunks[0]):
                # a store's own y, written chunked otherwise by another tool: y is
                # small, and a path gives the user nothing to rechunk
                yd = yd.rechunk({0: Xd.chunks[0]})
            if tuple(yd.chunks[0]) != tuple(Xd.chunks[0]):
                raise ValueError(
                    f"X and y have different row chunks ({_short(Xd.chunks[0])} vs "
                    f"{_short(yd.chunks[0])}); rechunk y with y.rechunk({{0: X.chunks[0]}}) "
                    "or re-ingest both from one source")
    elif require_y:
        raise ValueError(f"no targets: pass y, or use a store with an array 'y' ({source})")
    host = None
    if in_memory and (y is None or isinstance(y, np.ndarray)):
        host = (np.asarray(X), None if y is None else np.asarray(y))
    return Dataset(Xd, yd, source, host, store)


def _check_lazy_rows(a: Any, name: str) -> None:
    """Refuse a dask DataFrame / Series, and a dask array whose row chunks are
    unknown (``ddf.to_dask_array()``): a fit plans its steps on known rows."""
    if hasattr(a, "to_dask_array") and not isinstance(a, da.Array):
        raise TypeError(f"{name} is a dask {type(a).__name__}; pass "
                        f"{name}.to_dask_array(lengths=True) (numeric columns)")
    if isinstance(a, da.Array) and any(math.isnan(c) for c in a.chunks[0]):
        raise ValueError(f"{name} has unknown chunk sizes (a dask array made from a "
                         f"DataFrame); pass ddf.to_dask_array(lengths=True), or call "
                         f"{name}.compute_chunk_sizes() first")


def _short(chunks: tuple) -> str:
    c = tuple(int(v) for v in chunks)
    return str(c) if len(c) <= 6 else f"({c[0]}, {c[1]}, ..., {c[-1]}; {len(c)} chunks)"
