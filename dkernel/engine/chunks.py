"""Where a fit's chunks come from: futures of (X_chunk, y_chunk) on the workers.

Store chunks are read by one task each, on the chunk's home worker (the same
every epoch, so blocks cached from it are found again), and checked for
NaN / inf the first time; in-memory input is scattered once per fit.
"""

from __future__ import annotations

import uuid
from typing import Any

import dask
from distributed import Client, Future

from dkernel.backend import aligned, namespace
from dkernel.data.dataset import Dataset, StoreArrays, read_store_rows
from dkernel.data.validate import check_finite_chunk
from dkernel.engine.stall import scatter


def _load_chunk(X: Any, y: Any, row_offset: int, dtype: str, validate: bool) -> tuple[Any, Any]:
    if validate:
        check_finite_chunk(X, "X", row_offset)
        if y is not None:
            check_finite_chunk(y, "y", row_offset)
    return X.astype(dtype, copy=False), y


def _read_chunk(store: StoreArrays, start: int, stop: int, dtype: str,
                validate: bool) -> tuple[Any, Any]:
    X, y = read_store_rows(store, start, stop)
    return _load_chunk(X, y, start, dtype, validate)


def _aligned_chunk(chunk: tuple[Any, Any]) -> tuple[Any, Any]:
    return aligned(chunk[0]), aligned(chunk[1])


def thread_slots(nthreads: dict[str, int]) -> list[str]:
    """Worker addresses, each once per thread, dealt round by round
    (``{a: 1, b: 3}`` -> a b b b; ``{a: 2, b: 2}`` -> a b a b): chunk c's home
    is slot ``c % len(slots)``, so a step's lanes fill every thread, and
    single-threaded workers take chunks in turn."""
    workers = sorted(nthreads)
    return [w for t in range(max(nthreads.values(), default=0))
            for w in workers if nthreads[w] > t]


def worker_rows(nthreads: dict[str, int], row_chunks: tuple[int, ...]) -> dict[str, int]:
    """Rows homed on each worker (chunk c on ``thread_slots(nthreads)[c % slots]``)."""
    slots = thread_slots(nthreads)
    rows = dict.fromkeys(nthreads, 0)
    for c, n in enumerate(row_chunks):
        rows[slots[c % len(slots)]] += int(n)
    return rows


class _ChunkSource:
    """Futures of (X_chunk, y_chunk) on the workers."""

    def key(self, name: str, c: int) -> tuple:
        """The worker-cache key of chunk c's rows (blocks derived from them)."""
        return (name, c)

    def __init__(self, client: Client, data: Dataset, dtype: str,
                 scattered: dict | None = None) -> None:
        self.client, self.data, self.dtype = client, data, dtype
        #: in-memory chunks already on the workers, by (dataset, dtype): shared by
        #: the passes of one engine (the preconditioner's sample is read 4 times)
        self._scattered = {} if scattered is None else scattered
        self.offsets = data.row_offsets()
        self._resident: dict[int, Future] | None = None
        self._validated: set[int] = set()
        self._workers: list[str] | None = None
        #: chunks already read by the caller (``run_steps(resident=...)``): used
        #: instead of reading the store again every epoch
        self.adopted: dict[int, Future] = {}

    def _scatter_all(self) -> None:
        memo = (self.data.X.name, self.dtype)
        if memo in self._scattered:
            self._resident = self._scattered[memo]
            return
        Xh, yh = self.data.host
        parts = [(Xh[a:b].astype(self.dtype, copy=False), None if yh is None else yh[a:b])
                 for a, b in zip(self.offsets[:-1], self.offsets[1:])]
        futs = scatter(self.client, parts, hash=False)
        # copied once where they landed: a scattered array can arrive off its alignment
        futs = self.client.map(_aligned_chunk, futs, pure=False)
        self._resident = self._scattered[memo] = dict(enumerate(futs))

    def refresh(self) -> None:
        """Forget futures and worker placement after a worker was lost; scattered
        in-memory chunks are sent again on the next ``get``."""
        self._resident = None
        self._scattered.pop((self.data.X.name, self.dtype), None)
        self._workers = None

    def home(self, c: int) -> list[str] | None:
        """Chunk c is read on the same worker every epoch (when it is alive),
        so blocks cached from it on that worker are found again; a worker is
        home to as many lane classes as it has threads (:func:`thread_slots`)."""
        if self._workers is None:
            # nthreads: the addresses alone (34 bytes a worker), where the
            # scheduler's identity carries ~650 bytes of metrics per worker
            self._workers = thread_slots(self.client.nthreads())
        return [self._workers[c % len(self._workers)]] if self._workers else None

    def placement(self, c: int) -> dict[str, Any]:
        """Submit keywords that prefer chunk c's home worker; none when the
        scheduler reports no worker at that moment (distributed refuses
        ``allow_other_workers`` without ``workers``)."""
        home = self.home(c)
        return {"workers": home, "allow_other_workers": True} if home else {}

    def get(self, chunks: tuple[int, ...]) -> dict[int, Future]:
        # Homes from the workers alive now (one scheduler query per group): a
        # task restricted to a worker that is already gone waits in
        # "no-worker" for ever should every worker have been replaced -- the
        # scheduler does not apply allow_other_workers to such tasks when new
        # workers join (distributed 2026.8).
        self._workers = None
        if self.adopted and all(c in self.adopted for c in chunks):
            return {c: self.adopted[c] for c in chunks}
        if self.data.host is not None:
            if self._resident is None:
                self._scatter_all()
            return {c: self._resident[c] for c in chunks}
        out = {}
        store = self.data.store
        if store is not None:
            # one task per chunk, built without a dask graph (read_store_rows)
            for c in chunks:
                validate = c not in self._validated
                self._validated.add(c)
                a, b = int(self.offsets[c]), int(self.offsets[c + 1])
                out[c] = self.client.submit(_read_chunk, store, a, b, self.dtype, validate,
                                            key=f"read-{self.data.X.name}-{c}-{uuid.uuid4().hex[:8]}",
                                            pure=False, **self.placement(c))
            return out
        for c in chunks:
            xb = self.data.X.blocks[c]
            yb = None if self.data.y is None else self.data.y.blocks[c]
            # fuse each chunk's read, checks and slicing into one task per array
            # (the scheduler's work per chunk competes with the steps for cores)
            xb, yb = dask.optimize(xb, yb)
            # NaN/inf are checked on the worker the first time each chunk is read.
            validate = c not in self._validated
            self._validated.add(c)
            out[c] = self.client.compute(
                dask.delayed(_load_chunk, pure=False)(xb, yb, int(self.offsets[c]), self.dtype,
                                                      validate),
                **self.placement(c))
        return out


def _concat_chunks(*parts: tuple[Any, Any]) -> tuple[Any, Any]:
    xp = namespace(parts[0][0])
    X = xp.concatenate([p[0] for p in parts])
    y = None if parts[0][1] is None else xp.concatenate([p[1] for p in parts])
    return aligned(X), aligned(y)


class _BundleSource:
    """A :class:`_ChunkSource` whose chunks are bundles of small store chunks
    (:func:`dkernel.data.plan.chunk_bundles`), each read on its home and joined
    there once per epoch (a copy of the bundle's rows, a few ms against the
    step's arithmetic).  A bundle's cache key names its member chunks, so two
    fits that bundle differently never share a cached block."""

    def __init__(self, source: _ChunkSource, bundles: list[tuple[int, ...]]) -> None:
        self.source, self.bundles = source, bundles
        self.adopted: dict[int, Future] = {}

    def key(self, name: str, b: int) -> tuple:
        return (name, ("bundle", *self.bundles[b]))

    def refresh(self) -> None:
        self.source.refresh()

    def home(self, b: int) -> list[str] | None:
        return self.source.home(self.bundles[b][0])

    def placement(self, b: int) -> dict[str, Any]:
        return self.source.placement(self.bundles[b][0])

    def get(self, bundles: tuple[int, ...]) -> dict[int, Future]:
        parts = self.source.get(tuple(c for b in bundles for c in self.bundles[b]))
        return {b: self.source.client.submit(_concat_chunks, *[parts[c] for c in self.bundles[b]],
                                             pure=False, **self.placement(b))
                for b in bundles}


class _KeptSource:
    """A source whose chunks, once read, stay on their homes for the rest of the
    run (``run_steps(keep_chunks=True)``): when the fit's feature blocks fit in
    the workers' cache the X they come from does too, and an epoch then reads
    nothing from the store (DSGClassifier(n_features=8192) on Fashion-MNIST,
    8192-row chunks of 26 MB: the lanes were busy 56-65% of a cached epoch
    with the chunks read again, 84-85% with them kept).
    Like any read, a kept chunk lost with its worker is recomputed by Dask."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.kept: dict[int, Future] = {}

    def __getattr__(self, name: str) -> Any:  # key, home, placement, adopted
        return getattr(self.source, name)

    def refresh(self) -> None:
        self.kept.clear()
        self.source.refresh()

    def get(self, chunks: tuple[int, ...]) -> dict[int, Future]:
        missing = tuple(c for c in chunks if c not in self.kept)
        if missing:
            self.kept.update(self.source.get(missing))
        return {c: self.kept[c] for c in chunks}
