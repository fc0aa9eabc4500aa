"""Seeded samples of rows: the rows the bandwidth's median heuristic, the
preconditioners and the automatic steps are computed on, read with one small
task per chunk, the same rows for a seed whichever route reads them."""

from __future__ import annotations

from typing import Any

import dask
import numpy as np

from dkernel.data.dataset import Dataset, StoreArrays, read_store_rows
from dkernel.engine.stall import gather
from dkernel.kernels import median_heuristic

#: Rows sampled for bandwidth="auto": the median of ~500k pairwise distances is
#: stable to a few percent and costs milliseconds.
_BANDWIDTH_SAMPLE = 1000

#: A sample is drawn from at most this many chunks (picked at random), so its
#: cost does not grow with the store: 12k rows from a 10 TB store read 64
#: chunks, not all of them.
_SAMPLE_CHUNKS = 64
_SAMPLE_DOMAIN = 0xBA4D  # (the seed stream of sampled rows)


def sample_index(data: Dataset, random_state: int, size: int, domain: int) -> np.ndarray:
    """Sorted indices of ``min(size, n)`` distinct rows: uniform over the rows
    when the data has at most ``_SAMPLE_CHUNKS`` chunks (or is in memory),
    else uniform over the rows of ``_SAMPLE_CHUNKS`` chunks drawn at random.

    A sample larger than ``_BANDWIDTH_SAMPLE`` rows holds the rows a sample of
    that size draws, and the rest are drawn among the others
    (:func:`bandwidth_rows` finds them): the median heuristic then sees the
    same rows whichever sample a route reads.  An independent subsample of a
    larger sample gave ``bandwidth="auto"`` another value (3.056 against 3.174
    on 4000 x 4 rows) where the preconditioner's read served it, so turning on
    early stopping or switching EigenPro's route changed the kernel."""
    n = data.n_rows
    rng = np.random.default_rng([int(random_state), int(domain)])
    if data.host is not None or data.n_chunks <= _SAMPLE_CHUNKS:
        pool: Any = n
        rows = n
    else:
        offsets = data.row_offsets()
        chunks = np.sort(rng.choice(data.n_chunks, size=_SAMPLE_CHUNKS, replace=False))
        pool = np.concatenate([np.arange(offsets[c], offsets[c + 1]) for c in chunks])
        rows = len(pool)
    size = min(rows, size)
    first = rng.choice(pool, size=min(size, _BANDWIDTH_SAMPLE), replace=False)
    if size > len(first):
        # (a uniform draw of `size` in random order, less the rows already
        # drawn: the first of the others are uniform among them)
        more = np.random.default_rng([int(random_state), int(domain), 1]).choice(
            pool, size=size, replace=False)
        first = np.concatenate([first, more[~np.isin(more, first)][: size - len(first)]])
    return np.sort(first)


def sample_rows(data: Dataset, random_state: int, client: Any,
                size: int = _BANDWIDTH_SAMPLE) -> np.ndarray:
    """A seeded random sample of rows of X, gathered by the cluster (one small read)."""
    idx = sample_index(data, random_state, size, _SAMPLE_DOMAIN)
    sample = np.asarray(gather_rows(data, idx, client)[0], dtype=np.float64)
    check_finite_rows("X", sample, idx)
    return sample


def gather_rows(data: Dataset, idx: np.ndarray, client: Any, with_y: bool = False
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows ``idx`` (sorted) of X, and of y ``with_y``, in their own dtypes: one
    task per chunk that reads it and keeps its rows (dask's fancy indexing
    adds a shuffle of several tasks per chunk)."""
    if data.host is not None:
        Xh, yh = data.host
        return Xh[idx], (yh[idx] if with_y and yh is not None else None)
    y = data.y if with_y else None
    offsets = data.row_offsets()
    owner = np.searchsorted(offsets, idx, side="right") - 1
    chunks = np.unique(owner)
    if data.store is not None and (y is None or data.store.y is not None):
        # (a store of X only, or y left out, is read the same way)
        store = StoreArrays(data.store.X, data.store.y if y is not None else None,
                            data.store.root, data.store.url)
        parts = [client.submit(read_store_rows, store, int(offsets[c]), int(offsets[c + 1]),
                               idx[owner == c] - offsets[c], pure=False) for c in chunks]
    else:
        blocks = dask.optimize(*[(data.X.blocks[int(c)], None if y is None else y.blocks[int(c)])
                                 for c in chunks])
        parts = client.compute([dask.delayed(_take_rows)(b, idx[owner == c] - offsets[c])
                                for b, c in zip(blocks, chunks)])
    parts = gather(client, parts, "the sample")
    Xs = np.concatenate([np.asarray(p[0]) for p in parts])
    return Xs, (np.concatenate([np.asarray(p[1]) for p in parts]) if y is not None else None)


def check_finite_rows(name: str, sample: np.ndarray, idx: np.ndarray) -> None:
    """Refuse a sample with NaN or infinity, naming the first bad row."""
    bad = ~np.isfinite(sample.reshape(len(sample), -1)).all(axis=1)
    if bad.any():
        raise ValueError(
            f"{name} contains NaN or infinity in {int(bad.sum())} sampled row(s) "
            f"(first bad row: {int(idx[bad][0])}); drop or impute those rows before fitting")


def bandwidth_rows(rows: np.ndarray, data: Dataset, random_state: int) -> np.ndarray:
    """The rows of a ``_BANDWIDTH_SAMPLE``-row sample within ``rows``, a larger
    sample of ``data`` (:func:`sample_rows`, which holds them: one read serves
    the preconditioner and the median heuristic; reading the store's sampled
    chunks twice cost 0.4-0.6 s a fit on 2M x 32)."""
    if len(rows) <= _BANDWIDTH_SAMPLE:
        return rows
    large = sample_index(data, random_state, len(rows), _SAMPLE_DOMAIN)
    small = sample_index(data, random_state, _BANDWIDTH_SAMPLE, _SAMPLE_DOMAIN)
    return rows[np.searchsorted(large, small)]


def _take_rows(blocks: tuple[Any, Any], rows: np.ndarray) -> tuple[np.ndarray, Any]:
    X, y = blocks
    return np.asarray(X[rows]), (None if y is None else np.asarray(y[rows]))


def resolve_bandwidth(bandwidth: Any, kernel: str, sample: np.ndarray) -> float:
    """A numeric bandwidth as given, or the median heuristic on ``sample``."""
    if not (isinstance(bandwidth, str) and bandwidth == "auto"):
        return float(bandwidth)
    return median_heuristic(sample, kernel)
