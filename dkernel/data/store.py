"""Writing dataset stores: a zarr group with row-chunked, compressed X (and y),
created under a temporary name and renamed into place when complete.  Tasks
that write such a store on the workers run through :func:`run_writes`, which
on a failure stops them all before the temporary store is removed;
:func:`write_arrays` writes dask arrays that way (ingest, predictions)."""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import socket
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from dkernel._stack import user_stacklevel
from dkernel._workers import NoWorkersWatch, workers_or_none
from dkernel.data.dataset import EVERY_CHUNK_WRITTEN
from dkernel.data.validate import (
    check_memory_visible,
    check_numeric_dtype,
    check_positive,
    memory_root,
)
from dkernel.files import expands_user, local_target, url_fs

DEFAULT_CHUNK_ROWS = 8192
#: Ingest chunks hold at most this many bytes of X (as in dkernel.data.dataset)
#: and DEFAULT_CHUNK_ROWS rows, so wide data does not get gigabyte chunks.
CHUNK_BYTES = 32 * 2**20


def default_chunk_rows(n_inputs: int, dtype: Any, chunk_rows: int | None = None) -> int:
    """Rows of an ingested chunk: ``chunk_rows`` (checked) when given, else at
    most ``DEFAULT_CHUNK_ROWS`` rows and ``CHUNK_BYTES`` of X."""
    if chunk_rows is not None:
        check_positive("chunk_rows", chunk_rows, integer=True)
        return chunk_rows
    row_bytes = max(1, int(n_inputs) * np.dtype(dtype).itemsize)
    return max(1, min(DEFAULT_CHUNK_ROWS, CHUNK_BYTES // row_bytes))


def check_out(out: str | os.PathLike, overwrite: bool) -> None:
    """Refuse an existing local output unless ``overwrite`` (before any work),
    and with it one that is not a store (:func:`check_replaceable`)."""
    out = os.fspath(out)
    if not overwrite and "://" not in out and os.path.exists(out):
        raise FileExistsError(f"{out} already exists; remove it, choose another --out, "
                              "or pass --overwrite (overwrite=True)")
    if overwrite and "://" not in out:
        check_replaceable(out)


def check_replaceable(path: str) -> None:
    """Refuse to replace an existing local ``path`` that is neither a zarr store
    nor an empty folder: ``--overwrite`` replaces an earlier output, and took a
    folder of the user's notes with it (or failed on a file with "Not a
    directory")."""
    path = local_target(path.removeprefix("file://"))
    if not os.path.exists(path):
        return
    if os.path.isdir(path) and (not os.listdir(path) or any(
            os.path.exists(os.path.join(path, key)) for key in _GROUP_METADATA)):
        return
    kind = "a folder that is not a zarr store" if os.path.isdir(path) else "a file"
    raise FileExistsError(f"{path!r} is {kind}; --overwrite replaces only a store written "
                          "before: remove it yourself or choose another output path")


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
    path = local_target(path.removeprefix("file://"))
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path!r} already exists; remove it or choose another output path")
    check_replaceable(path)
    parent = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(parent, exist_ok=True)
    # unique per call: two writes in one process (threads, a retry after a
    # failure whose tasks were still writing) never share a temporary store
    # the writer's host, pid namespace and pid: a later write removes what a killed one left
    tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp-{_writer()}-{os.getpid()}-"
                               f"{uuid.uuid4().hex[:12]}")
    try:
        try:
            yield zarr.open_group(tmp, mode="w")
        except OSError as e:
            if e.errno not in _FULL:
                raise
            # (it named no file, or the temporary store's chunk)
            raise OSError(e.errno, f"store {path!r} could not be written: {e.strerror or e}; "
                                   "its partial copy was removed, and what was at that path "
                                   "before is as it was") from e
        if overwrite and os.path.exists(path):
            shutil.rmtree(path)
        try:
            # without overwrite a store another writer put at path meanwhile
            # stays: rename refuses a non-empty folder (an empty one is free)
            os.rename(tmp, path)
        except OSError as e:
            if overwrite or e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            raise FileExistsError(
                f"{path!r} appeared while this store was written (another run writing the "
                "same path?); it was kept: remove it or choose another output path") from None
    except BaseException:
        _remove_settled(tmp)
        raise
    _remove_dead_writers(parent, os.path.basename(path))


#: errno of a disk that takes no more (:func:`atomic_store` names the store).
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


def _remove_dead_writers(parent: str, name: str) -> None:
    """Remove the temporary stores of writes to ``parent/name`` whose process,
    on this host, is gone: a killed ``dkernel predict`` left 12 MB (make-store:
    up to its whole size) that no later write removed."""
    if os.name != "posix":  # (elsewhere os.kill(pid, 0) is no question)
        return
    prefix = f".{name}.tmp-{_writer()}-"
    for entry in os.listdir(parent):
        match = re.fullmatch(r"(\d+)-[0-9a-f]{12}", entry[len(prefix):])
        if not entry.startswith(prefix) or match is None:
            continue  # (another host's, or another pid namespace's: not ours to judge)
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        except PermissionError:  # alive, another user's
            continue


def _writer() -> str:
    """This process's host and pid namespace, as temporary stores name them:
    containers that share a host name but not their pids are told apart."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{socket.gethostname()}-{ns}"


def _remove_settled(tmp: str, quiet: float = 0.3, limit: float = 10.0) -> None:
    """Remove ``tmp`` until it stays gone for ``quiet`` seconds.  zarr writes on
    its own event-loop thread: a write in flight when Ctrl-C or SIGTERM
    interrupted the caller finishes after the first removal and makes the
    folder again (a half store left behind on a loaded machine)."""
    deadline, gone_since = time.monotonic() + limit, None
    while time.monotonic() < deadline:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since >= quiet:
            return
        time.sleep(0.05)


# The keys that make a folder of chunks a zarr group (v3, and v2's).
_GROUP_METADATA = ("zarr.json", ".zgroup", ".zattrs", ".zmetadata")


def _holds_zarr(fs: Any, root: str) -> bool:
    """Whether the object-store prefix ``root`` is a zarr store, or what an
    interrupted copy of one left: its arrays' metadata without the group's,
    which is copied last."""
    names = ("zarr.json", ".zarray") + _GROUP_METADATA
    return any(key.rpartition("/")[2] in names for key in fs.find(root, maxdepth=2))


def _atomic_object_store(url: str, overwrite: bool) -> Iterator[Any]:
    import fsspec
    import zarr

    fs, root = url_fs(url)
    root = root.rstrip("/")
    if fs.exists(root) and not overwrite:
        raise FileExistsError(f"{url!r} already exists; remove it or choose another output path")
    if fs.exists(root) and not _holds_zarr(fs, root):
        # the prefix is removed recursively below: only an earlier store's
        raise FileExistsError(f"{url!r} holds something other than a zarr store; --overwrite "
                              "replaces only a store written before: remove it yourself or "
                              "choose another output path")
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
    """A row-chunked, compressed array in ``group`` (all columns in one chunk).

    Every chunk is written, zeros too (zarr leaves out a chunk of fill values
    by default), and the array says so: a chunk missing later is then a
    damaged copy, refused (:func:`~dkernel.data.dataset.check_chunks_present`)."""
    chunks = (max(1, min(chunk_rows, max(1, shape[0]))),) + tuple(shape[1:])
    return group.create_array(name, shape=shape, chunks=chunks, dtype=np.dtype(dtype),
                              attributes={EVERY_CHUNK_WRITTEN: True},
                              config={"write_empty_chunks": True})


@expands_user("path")
def write_store(path: str | os.PathLike, X: Any, y: Any = None, *,
                chunk_rows: int = DEFAULT_CHUNK_ROWS, overwrite: bool = False,
                attrs: dict | None = None) -> str:
    """Write X (and y) -- NumPy or dask -- as a dataset store; returns the path.

    Checked first, as a fit would check them: a store every later command
    refuses (y of other rows, a 1-D X, text) was written without a word."""
    import dask.array as da

    check_positive("chunk_rows", chunk_rows, integer=True)
    if any(hasattr(a, "tocsr") for a in (X, y)):  # scipy.sparse
        raise TypeError("write_store takes dense rows: convert a sparse matrix with .toarray() "
                        "(in chunks of rows if it is large)")
    # lists and pandas objects as arrays; NumPy, dask and zarr arrays as they are
    X, y = (a.to_numpy() if hasattr(a, "iloc") else a for a in (X, y))
    X, y = (a if a is None or isinstance(a, da.Array)
            or (hasattr(a, "__array__") and hasattr(a, "dtype") and not hasattr(a, "columns"))
            else np.asarray(a) for a in (X, y))
    if getattr(X, "ndim", 0) != 2 or 0 in X.shape:
        raise ValueError(f"X must be 2-D (rows, columns) with at least one of each, got shape "
                         f"{getattr(X, 'shape', None)}")
    check_numeric_dtype(np.dtype(X.dtype), "X")
    if y is not None:
        if y.ndim not in (1, 2) or y.shape[0] != X.shape[0]:
            raise ValueError(f"y has shape {y.shape} but X has {X.shape[0]} rows; y must hold "
                             "one row (or value) per row of X")
        if np.dtype(y.dtype).kind in "USO":
            raise TypeError("y holds text; a store keeps numbers: encode the labels first "
                            "(e.g. numpy.unique(y, return_inverse=True))")
        check_numeric_dtype(np.dtype(y.dtype), "y")
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


def _write_rows(*blocks: np.ndarray, targets: list, block_info: dict | None = None
                ) -> np.ndarray:
    """Write one chunk of rows of every array into its target (write_arrays)."""
    a, b = block_info[0]["array-location"][0]
    for block, target in zip(blocks, targets):
        target[a:b] = block.reshape((b - a,) + tuple(target.shape[1:]))
    return np.ones((1, 1), np.int64)


def require_shared(client: Any, group: Any, path: str | os.PathLike) -> None:
    """Refuse to let workers write a local store they do not see.  zarr writes
    a chunk under whatever the path means on the worker: without a shared
    file system (or with another disk mounted there) the chunks land on the
    worker, the client renames a store of metadata only, and every value
    reads back as 0 -- a prediction, an ingest or make-store that says it
    wrote its output.  The temporary store's metadata, written here, must be
    visible on every worker."""
    store = group.store
    memory = memory_root(store)
    if memory is not None:  # memory://: one namespace per process
        client.run(check_memory_visible, None, memory)
        return
    if type(store).__name__ not in ("LocalStore", "DirectoryStore"):  # zarr 3 / zarr 2
        return  # an object store: one namespace for every process
    root = str(getattr(store, "root", None) or store.path)
    # the group's metadata as this zarr wrote it (zarr 3: zarr.json, zarr 2: .zgroup)
    marker = next((os.path.join(root, m) for m in ("zarr.json", ".zgroup")
                   if os.path.exists(os.path.join(root, m))), None)
    if marker is None:
        return
    # (no worker at all: the writes wait for one, and connect's check applies)
    seen = client.run(os.path.exists, marker)
    blind = sorted(w for w, ok in seen.items() if not ok)
    if blind:
        raise FileNotFoundError(
            f"the output {os.fspath(path)!r} is not visible on the workers at {', '.join(blind)}; "
            "every worker must write under the same path (a shared file system), "
            "or write to a URL such as s3://")


def write_arrays(client: Any, path: str | os.PathLike, arrays: dict[str, Any], chunk_rows: int,
                 *, overwrite: bool = False, attrs: dict | None = None,
                 progress: Any = None) -> str:
    """Write dask arrays of rows (None: left out) as the arrays of a store at
    ``path``, chunked by ``chunk_rows`` rows, on the workers of ``client``: each
    chunk is assembled and written by one worker, through :func:`run_writes`
    (a failure stops every task before the temporary store is removed).
    ``progress(n_chunks, unit="chunks")``, a progress bar's factory (its
    ``update()`` is called as each chunk of rows is written, then
    ``close()``): a prediction of 6M rows said nothing for a minute.  Returns
    the path."""
    import dask.array as da

    label = f"writing {os.fspath(path)!r}"
    with atomic_store(path, overwrite) as group:
        require_shared(client, group, path)
        sources, targets = [], []
        for name, a in arrays.items():
            if a is not None:
                targets.append(create_array(group, name, tuple(int(s) for s in a.shape), a.dtype,
                                            chunk_rows))
                # the arrays' row chunks align, so no two tasks write one zarr chunk
                sources.append(a.rechunk(targets[-1].chunks))
        if progress is None:
            run_writes(client, da.store(sources, targets, lock=False, compute=False), label=label)
        else:  # one graph, one small result a chunk of rows, so each one's end is seen
            # (a collection a chunk built 5000 graphs: twice the client time)
            done = da.map_blocks(_write_rows, *[s if s.ndim == 2 else s[:, None] for s in sources],
                                 targets=targets, dtype=np.int64, chunks=(1, 1),
                                 meta=np.empty((0, 0), np.int64))
            futures = client.futures_of(client.persist(done))
            bar = progress(len(futures), unit="chunks")
            try:
                run_writes(client, futures, each=lambda _: bar.update(), label=label)
            finally:
                bar.close()
        group.attrs.update(attrs or {})
    return os.fspath(path)


#: Seconds between looks at the cluster while a write's tasks run
_CHECK_SECONDS = 5.0
#: Seconds between polls of a write's finished tasks
_POLL_SECONDS = 0.05
_log = logging.getLogger("dkernel.data")
#: Seconds a failed write waits for its tasks already running on workers
#: (they cannot be interrupted) before the temporary store is removed anyway.
#: An ingest task writes about 64 MB of chunks, a prediction or make-store
#: task one chunk: seconds even on a loaded machine; one that outlives this
#: is hung, and a warning says so.
SETTLE_TIMEOUT = 120.0
#: Seconds no task may be seen running before a failed write is settled: a
#: task the scheduler sent just before the cancel reaches its worker within
#: milliseconds (batched streams flush every few ms), and starts there.
_SETTLE_QUIET = 0.5
# Worker task states from which a task may still write: running (also when
# cancelled or resumed while running, see WorkerState.executing) or about to run.
_MAY_RUN = ("ready", "constrained", "waiting")


def run_writes(client: Any, work: Any, each: Any = None, label: str = "writing the store") -> Any:
    """Run tasks that write a temporary store on the cluster; their results.

    ``work``: futures already submitted (``client.map`` / ``client.submit``),
    or dask collections (``da.store(..., compute=False)``: one, or a tuple),
    computed here.
    ``each(future)`` is called as each task finishes (progress).  On any
    failure -- a task's error, an interrupt -- every outstanding task is
    cancelled and the ones already running are waited for (at most
    :data:`SETTLE_TIMEOUT` s) before the error is raised, so the caller's
    :func:`atomic_store` removes a temporary store nothing writes into any
    more.  Raising at the first error, as ``client.gather`` does, left the
    other tasks writing chunks into it after it was removed.  A cluster that
    has had no worker for ``$DKERNEL_WORKER_TIMEOUT`` s stops the write
    (``label`` opens that message): a prediction or an ingest whose workers
    were all lost waited for ever.
    """
    from distributed import Future, as_completed

    many = isinstance(work, (list, tuple))
    if many and all(isinstance(f, Future) for f in work):
        futures = list(work)
    else:
        futures = client.compute(list(work) if many else [work])
    lost = NoWorkersWatch(label, _log)
    try:
        # on this client's loop: as_completed would ask for the default client
        finished = as_completed(futures, loop=client.loop)
        look_at = time.monotonic() + _CHECK_SECONDS
        got: dict = {}
        while not finished.is_empty():
            batch = finished.next_batch(block=False)
            for f in batch:
                got[f.key] = f.result()  # the first failure raises
                if each is not None:
                    each(f)
            if not batch:  # (polled: as_completed's own wait cannot time out and look)
                if time.monotonic() >= look_at:
                    workers = workers_or_none(client)
                    if workers is not None:
                        lost.check(workers, finished.count())
                    look_at = time.monotonic() + _CHECK_SECONDS
                time.sleep(_POLL_SECONDS)
        # (kept as each finished: gathering them again would wait for ever, unwatched,
        # if the worker holding one were lost after its task finished)
        results = [got[f.key] for f in futures]
    except BaseException:
        _settle(client, futures)
        raise
    return results if many else results[0]


def _settle(client: Any, futures: list) -> None:
    """Cancel ``futures`` and wait until no worker runs or is about to run any
    task they depend on (best effort: the caller's error is the one to report)."""
    try:
        # the keys as the scheduler runs them (graph optimisation renames
        # keys), asked before the cancel makes it forget them
        keys = client.run_on_scheduler(_task_keys, [f.key for f in futures])
        client.cancel(futures)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        quiet_since = None
        while True:
            running = sum(client.run(_running, keys, on_error="ignore").values())
            now = time.monotonic()
            if running:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= _SETTLE_QUIET:
                return
            if now > deadline:
                warnings.warn(f"{running} write task(s) still running {SETTLE_TIMEOUT:.0f} s "
                              "after a failure; removing the temporary store anyway",
                              RuntimeWarning, stacklevel=user_stacklevel())
                return
            time.sleep(0.05)
    except Exception:  # a lost scheduler must not hide the error being raised
        return


def _task_keys(keys: list, dask_scheduler: Any = None) -> set:
    """On the scheduler: ``keys`` and every task they depend on."""
    found, todo = set(), [dask_scheduler.tasks[k] for k in keys if k in dask_scheduler.tasks]
    while todo:
        ts = todo.pop()
        if ts.key not in found:
            found.add(ts.key)
            todo.extend(ts.dependencies)
    return found


def _running(keys: set, dask_worker: Any = None) -> int:
    """On a worker: how many of ``keys`` it runs or may still start."""
    state = dask_worker.state
    tasks = [state.tasks[k] for k in keys.intersection(state.tasks)]
    return sum(ts in state.executing or ts in state.long_running or ts.state in _MAY_RUN
               for ts in tasks)
