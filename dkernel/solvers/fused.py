r"""One pass over a feature pool, forward and backward, in cache-sized row tiles.

Every whole-pool step (DSG with its preconditioner, EigenPro-RF) needs, on
the rows b of a task,

    f_b   = \Phi(x_b) c                 (forward: all D features of each row)
    g     = \sum_b \Phi(x_b)^T l'(f_b)   (backward: the same features again)

Building \Phi for all of a task's rows first and then reading it twice
needs a rows x D slab (256 MB at 32768 rows and D = 2048) that must be
paged in (docs/design.md §4) and caps the rows of a step.  Here the rows go through
in tiles of about ``_TILE_BYTES`` of features: a tile's features are
generated (or gathered from the worker cache), used for f, l' and the
tile's share of g while they are still in L2/L3, then overwritten by the
next tile.  The arithmetic is the same (single-threaded on the 2-core VMs,
D = 2048, d = 32: about 4.8 us a row, X W 2.5 us and cos 1.6 us of it, in
either form); what changes is that a task holds a few MB whatever its rows,
so the width of a step is set by its compute, not by a buffer.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dkernel.backend import asarray_like, namespace, to_numpy
from dkernel.engine.program import Chunk
from dkernel.features import FeatureMap
from dkernel.solvers.feature_cache import decode_rows, stored_block

#: Features of one row tile: a few MB stay in this machine's L2/L3 (2 MB L2
#: per core, 32 MB L3 shared); 4 MB (512 rows at D = 2048) measured fastest.
_TILE_BYTES = 4 << 20
_MIN_TILE_ROWS = 64
_MIN_BLOCK_TILE = 1024

_scratch = threading.local()

#: derivative(f_tile, tile) -> (sum of the loss over the tile, l'(f_tile)),
#: ``tile`` a slice of the task's rows (index the task's targets with it).
Derivative = Callable[[Any, slice], tuple[float, Any]]


def tile_rows(n_features: int, itemsize: int = 4, blockwise: bool = False) -> int:
    """Rows per tile for a pool of ``n_features`` features; ``blockwise``
    (products block by block, as from the worker cache): at least
    ``_MIN_BLOCK_TILE`` rows, which keeps the Python calls per row small."""
    rows = max(_MIN_TILE_ROWS, _TILE_BYTES // (itemsize * int(n_features)))
    return max(_MIN_BLOCK_TILE, rows) if blockwise else rows


def _buffer(xp: Any, shape: tuple[int, ...], dtype: np.dtype, slot: int = 0) -> Any:
    """A per-thread scratch buffer reused across tasks (fresh pages are slow,
    docs/design.md §4); passes that hold several tile streams at once (one per view)
    take one ``slot`` each."""
    size = int(np.prod(shape))
    name = f"buf{int(slot)}"
    buf = getattr(_scratch, name, None)
    if xp is not np or buf is None or buf.size < size or buf.dtype != dtype:
        buf = xp.empty(size, dtype=dtype)
        if xp is np:
            setattr(_scratch, name, buf)
    return buf[:size].reshape(shape)


def pool_gradient(features: FeatureMap, chunk: Chunk, n_blocks: int, coef: Any,
                  derivative: Derivative, mode: str = "float32") -> tuple[np.ndarray, float]:
    """``(g, loss)``: g = sum_b Phi(x_b)^T l'(Phi(x_b) coef) over the task's rows
    (float64, shape of ``coef``), loss the sum of ``derivative``'s values.

    Phi is the unscaled pool (blocks 0..n_blocks-1).  With ``mode="off"``
    (a single epoch: its blocks are never read again, and filling the
    worker cache would only page in memory) each tile's D features come
    from one product with the stacked weights.  Otherwise a block comes from
    the worker cache (:mod:`dkernel.solvers.feature_cache`) when the cache
    holds (or takes) the chunk's block, and is generated block by block for
    the tile's rows where it does not.
    """
    coef = coef.astype(np.dtype(features.dtype), copy=False)
    if mode == "off":
        return _generated(features, chunk, n_blocks, coef, derivative)
    return _cached(features, chunk, n_blocks, coef, derivative, mode)


def _generated(features: FeatureMap, chunk: Chunk, n_blocks: int, coef: Any,
               derivative: Derivative) -> tuple[np.ndarray, float]:
    dt = np.dtype(features.dtype)
    D = n_blocks * features.block_size
    c = coef * dt.type(math.sqrt(2.0))  # phi = sqrt(2) cos(.): the factor moves onto coef and g
    grad = np.zeros((D, coef.shape[1]), dtype=np.float64)
    loss = 0.0
    for tile, [(_, Zt, _)] in feature_tiles(features, chunk, n_blocks, tile_rows(D, dt.itemsize),
                                            mode="off"):
        value, dl = derivative(Zt @ c, tile)
        loss += float(value)
        grad += to_numpy(Zt.T @ dl.astype(dt, copy=False))
    grad *= math.sqrt(2.0)
    return grad, loss


def _cached(features: FeatureMap, chunk: Chunk, n_blocks: int, coef: Any,
            derivative: Derivative, mode: str) -> tuple[np.ndarray, float]:
    dt = np.dtype(features.dtype)
    xp = namespace(chunk.X)
    D = n_blocks * features.block_size
    grad = np.zeros((D, coef.shape[1]), dtype=np.float64)
    loss = 0.0
    for tile, pieces in feature_tiles(features, chunk, n_blocks,
                                      tile_rows(D, dt.itemsize, blockwise=True), mode):
        f = xp.zeros((tile.stop - tile.start, coef.shape[1]), dtype=dt)
        for cols, Zj, _ in pieces:
            f += Zj @ coef[cols]
        value, dl = derivative(f, tile)
        loss += float(value)
        dl = dl.astype(dt, copy=False)
        for cols, Zj, _ in pieces:
            grad[cols] += to_numpy(Zj.T @ dl)
    return grad, loss


#: One tile's features as pieces: (columns of the pool, unscaled matrix rows x
#: columns, factor), phi[:, columns] = factor * matrix.
Pieces = list[tuple[slice, Any, float]]


def feature_tiles(features: FeatureMap, chunk: Chunk, n_blocks: int, rows: int,
                  mode: str = "float32", slot: int = 0) -> Iterator[tuple[slice, Pieces]]:
    """The task's rows in tiles of ``rows``, each with its D unscaled features,
    for passes whose coefficients change between tiles (the local steps of
    :mod:`dkernel.solvers.pool`); :func:`pool_gradient` is the same pass with
    one coefficient vector.  Yields ``(tile, pieces)``: ``tile`` a slice of the
    task's rows, ``pieces`` as :data:`Pieces`, valid until the next tile
    (the buffers are reused; streams consumed side by side, such as the two
    views of :func:`dkernel.solvers.components.power_partial`, each need
    their own ``slot``).  With ``mode="off"`` one product with the stacked
    weights per tile; otherwise blocks from (or into) the worker cache in
    ``mode``, generated for the tile's rows where the cache does not hold them."""
    dt = np.dtype(features.dtype)
    xp = namespace(chunk.X)
    idx_all = chunk.rows
    m = chunk.X.shape[0] if idx_all is None else len(idx_all)
    T = max(1, min(m, int(rows)))
    B = features.block_size
    D = n_blocks * B
    if mode == "off":
        W, b = (asarray_like(a, chunk.X) for a in features.stacked(n_blocks))
        Z = _buffer(xp, (T, D), dt, slot)
        for a in range(0, m, T):
            tile = slice(a, min(m, a + T))
            Zt = Z[: tile.stop - a]
            X_t = chunk.X[tile] if idx_all is None else chunk.X[idx_all[tile]]
            xp.matmul(X_t.astype(dt, copy=False), W, out=Zt)
            Zt += b
            xp.cos(Zt, out=Zt)
            yield tile, [(slice(0, D), Zt, math.sqrt(2.0))]  # phi = sqrt(2) cos(.)
        return
    full = [stored_block(features, chunk, j, mode) for j in range(n_blocks)]
    Z = _buffer(xp, (n_blocks, T, B), dt, slot)
    for a in range(0, m, T):
        tile = slice(a, min(m, a + T))
        t = tile.stop - a
        idx = None if idx_all is None else idx_all[tile]
        X_t = None
        for j in range(n_blocks):
            Zj = Z[j, :t]
            if full[j] is None:
                if X_t is None:
                    X_t = chunk.X[tile] if idx is None else chunk.X[idx]
                features.blocks(X_t, [j], out=Zj)
            else:
                decode_rows(full[j], tile if idx is None else idx, Zj, mode)
        yield tile, [(slice(j * B, (j + 1) * B), Z[j, :t], 1.0) for j in range(n_blocks)]
