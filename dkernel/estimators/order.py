"""Rows stored in an order: sorted by the target, or drifting along a column.

A step-based fit draws each step's rows from a few chunks, and a one-pass fit
(Oja's rule, spherical SGD) reads them in storage order; both assume rows in
random order, and chunks that each hold one part of the distribution bias them
without a word.  Measured (stop 43's numerics hunt): DSGClassifier with
``preconditioner=None`` on rows sorted by class scored 0.789 against 0.957
shuffled; SphereRegressor on rows sorted by y, R^2 -0.001 against 0.996;
StreamingKernelPCA on rows sorted by a column, components at cosines 0.35-0.59
from the exact ones.

The tell is the share of a column's variance that lies between its chunks'
means: about (k - 1) / (n - 1) for k chunks of n rows in random order, near 1
sorted.  It costs a pass over y (small beside X) or over in-memory X; a
store's X is judged from the rows already sampled for the bandwidth.
"""

from __future__ import annotations

import warnings
from typing import Any

import dask
import numpy as np

from dkernel._stack import user_stacklevel
from dkernel.data.dataset import Dataset
from dkernel.engine import FitQualityWarning
from dkernel.engine.stall import result
from dkernel.estimators.sampling import _SAMPLE_DOMAIN, sample_index

#: A column whose chunk means hold more of its variance than this is ordered
#: (and more than ten times what random order gives).
ORDERED_SHARE = 0.25


def _chunk_moments(block: np.ndarray) -> np.ndarray:
    """(1, 3, p): the block's row count, column means and sums of squared
    deviations from them (the parallel variance's terms: no cancellation far
    from the origin)."""
    b = np.asarray(block, dtype=np.float64).reshape(block.shape[0], -1)
    mean = b.mean(axis=0) if len(b) else np.zeros(b.shape[1])
    return np.stack([np.full(b.shape[1], float(len(b))), mean,
                     ((b - mean) ** 2).sum(axis=0)])[None]


def between_share(moments: np.ndarray) -> np.ndarray:
    """Per column, the share of its variance between the chunks' means, from
    the chunks' (count, mean, squared deviations) (``_chunk_moments``); NaN for
    a constant column."""
    n, mean, m2 = moments[:, 0], moments[:, 1], moments[:, 2]
    grand = (n * mean).sum(axis=0) / n.sum(axis=0)
    between = (n * (mean - grand) ** 2).sum(axis=0)
    total = between + m2.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, between / total, np.nan)


def warn_if_ordered(data: Dataset, client: Any, which: str, consequence: str,
                    sample: np.ndarray | None = None, seed: int = 0) -> bool:
    """Warn (and return True) when the rows of ``data`` look ordered by y
    (``which="y"``; a pass over y) or by a column of X (``which="X"``).  For
    X not in memory, a pass over it would cost as much as the fit: the
    chunks' means are taken from ``sample``, the rows :func:`sample_rows`
    read with ``seed`` (a few rows in each of up to 64 chunks, enough to tell
    sorted from shuffled).  ``consequence``: what the order does to this fit."""
    index = 1 if which == "y" else 0
    if data.host is not None and data.host[index] is not None:
        values = np.asarray(data.host[index])
        if values.dtype.kind not in "biuf":  # (labels: their codes)
            values = np.unique(values, return_inverse=True)[1]
        offsets = data.row_offsets()
        moments = np.concatenate([_chunk_moments(values[a:b])
                                  for a, b in zip(offsets[:-1], offsets[1:])])
    elif which == "y" and data.y is not None:
        y = data.y if data.y.ndim == 2 else data.y[:, None]
        parts = [dask.delayed(_chunk_moments)(b) for b in y.rechunk({1: -1}).to_delayed()[:, 0]]
        moments = result(client, client.compute(dask.delayed(np.concatenate)(parts)),
                         "y's order")
    elif which == "X" and sample is not None and len(sample) > 1:
        idx = sample_index(data, seed, len(sample), _SAMPLE_DOMAIN)
        owner = np.searchsorted(data.row_offsets(), idx, side="right") - 1
        cuts = np.flatnonzero(np.diff(owner)) + 1  # (idx is sorted: a chunk's rows are a run)
        moments = np.concatenate([_chunk_moments(part) for part in np.split(sample, cuts)])
    else:
        return False
    k, n = moments.shape[0], int(moments[:, 0, 0].sum())
    if k < 2 or n < 3:
        return False
    share = between_share(moments)
    random_order = (k - 1) / (n - 1)
    ordered = np.flatnonzero(share > max(ORDERED_SHARE, 10 * random_order))
    if ordered.size:
        j = int(ordered[np.argmax(share[ordered])])
        name = "y" if which == "y" and share.size == 1 else \
            f"column {j} of {'y' if which == 'y' else 'X'}"
        warnings.warn(
            f"the rows are stored in an order of {name}: the means of its {k} chunks hold "
            f"{share[j]:.0%} of its variance (rows in random order: about "
            f"{random_order:.1%}); {consequence}; shuffle the rows before fitting (in "
            "memory X[p], y[p] for p = numpy.random.permutation(n); a store, written from "
            "shuffled rows)", FitQualityWarning, stacklevel=user_stacklevel())
    return bool(ordered.size)
