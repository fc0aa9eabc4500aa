r"""The component models' work in the pool's subspace that takes no steps
(:mod:`dkernel.solvers.components` holds the steps).

Exact steps for KPCA and KSVD (:func:`exact_coefficients`): on data of up to
~16k rows the fixed point of the stochastic iterations is computed over all
rows by subspace iteration with oversampling (Halko, Martinsson & Tropp 2011),
every product one pass over the rows.  After a fit, one pass of moments
(:func:`moments_partial`) and a k x k rotation (:func:`rotate_pca`,
:func:`rotate_pair`) order the components; :func:`regularized_cca` is the
exact CCA of explicit feature matrices, for references and small pools.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.linalg import cholesky, eigh, qr, solve_triangular, svd

from dkernel.backend import asarray_like, namespace, to_numpy
from dkernel.engine.program import Chunk
from dkernel.features import FeatureMap
from dkernel.solvers.dsg import chunk_decision
from dkernel.solvers.feature_cache import mode_of
from dkernel.solvers.fused import pool_gradient, tile_rows


def view_chunk(chunk: Chunk, view: int) -> Chunk:
    """View ``view`` of a two-view chunk: X for 0, y (the second view) for 1."""
    if view == 0:
        return chunk
    Y = chunk.y if chunk.y.ndim == 2 else chunk.y.reshape(-1, 1)
    return Chunk(Y, None, chunk.rows, (chunk.key, "y"), chunk.run)


#: Oversampling and iterations of the exact steps' subspace iteration (Halko,
#: Martinsson & Tropp 2011, Alg. 4.4 and 5.3): the top k converge at
#: (lambda_{k+p+1} / lambda_k)^iterations, and a kernel spectrum has fallen far
#: by k + 20.
EXACT_OVERSAMPLES = 20
EXACT_ITERATIONS = 10


def _cross_apply(payload: dict, chunk: Chunk) -> dict:
    """Z_x^T (Z_y V), Z_y^T (Z_x U), both views' column sums and the row count on one
    chunk (z = phi / sqrt(D), products in the features' dtype, sums in float64).
    The rows go through in tiles of a few MB of both views' features
    (:func:`dkernel.solvers.fused.tile_rows`), not a rows x D slab per view."""
    views = payload["views"]
    Xs = []
    for s in range(len(views)):
        vchunk = view_chunk(chunk, s)
        Xs.append(vchunk.X if vchunk.rows is None else vchunk.X[vchunk.rows])
    m = Xs[0].shape[0]
    rows = tile_rows(sum(v["n_blocks"] * v["features"].block_size for v in views))
    out: dict[str, Any] = {}
    for a in range(0, m, rows):
        Zx, Zy = (v["features"].transform(X[a:a + rows].astype(v["features"].dtype, copy=False),
                                          v["n_blocks"]) for v, X in zip(views, Xs))
        if not out:
            U = asarray_like(payload["U"], Zx).astype(Zx.dtype, copy=False)
            V = asarray_like(payload["V"], Zy).astype(Zy.dtype, copy=False)
            out = {"XV": Zx.T @ (Zy @ V), "YU": Zy.T @ (Zx @ U),
                   "Sx": Zx.sum(axis=0), "Sy": Zy.sum(axis=0)}
        else:
            out["XV"] += Zx.T @ (Zy @ V)
            out["YU"] += Zy.T @ (Zx @ U)
            out["Sx"] += Zx.sum(axis=0)
            out["Sy"] += Zy.sum(axis=0)
    return {**{k: to_numpy(v).astype(np.float64) for k, v in out.items()}, "count": int(m)}


def exact_coefficients(engine: Any, data: Any, features: tuple[FeatureMap, ...], n_blocks: int,
                       k: int, center: bool, seed: int, label: str) -> tuple[np.ndarray, ...]:
    """Coefficients of every view at the solution on the pool over all rows
    (module docstring, "Exact steps"): KPCA with one view, KSVD with two.

    KPCA: the top k eigenvectors of C by :func:`dkernel.linalg.randomized_eigensystem`.
    KSVD: two-sided subspace iteration U <- orth(C_xy V), V <- orth(C_yx U)
    (both from the old pair, one pass each), then Rayleigh-Ritz on U^T C_xy V.
    Every product is one pass over the rows; only r x r and D x r problems
    (r = k + EXACT_OVERSAMPLES) are solved here."""
    from dkernel.linalg import randomized_eigensystem
    from dkernel.solvers.eigenpro_rf import feature_block

    D = n_blocks * features[0].block_size
    r = min(D, int(k) + EXACT_OVERSAMPLES)
    if len(features) == 1:
        eig = randomized_eigensystem(engine, data, feature_block,
                                     {"features": features[0], "n_blocks": n_blocks}, int(k), D,
                                     operator="gram", center=center,
                                     n_oversamples=r - int(k), n_iter=EXACT_ITERATIONS,
                                     random_state=int(seed), label=label)
        return (eig.vectors[:, :k] / math.sqrt(D),)
    views = [{"features": f, "n_blocks": n_blocks} for f in features]
    rng = np.random.default_rng([int(seed), 0xE5AC])
    U = np.linalg.qr(rng.standard_normal((D, r)))[0]
    V = np.linalg.qr(rng.standard_normal((D, r)))[0]

    def products(U: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(C_xy V, C_yx U), centred about the views' means when ``center``."""
        total = engine.map_reduce(data, _cross_apply,
                                  {"views": views, "U": U.astype(np.float32),
                                   "V": V.astype(np.float32)}, label=label, wants_chunk=True)
        n = float(total["count"])
        XV, YU = total["XV"] / n, total["YU"] / n
        if center:
            mx, my = total["Sx"] / n, total["Sy"] / n
            XV -= np.outer(mx, my @ V)
            YU -= np.outer(my, mx @ U)
        return XV, YU

    for _ in range(EXACT_ITERATIONS):
        XV, YU = products(U, V)
        U, V = np.linalg.qr(XV)[0], np.linalg.qr(YU)[0]
    XV, _ = products(U, V)
    P, _, Qt = svd(U.T @ XV)  # Rayleigh-Ritz: U^T C_xy V = P diag(sigma) Q^T
    return (U @ P[:, :k]) / math.sqrt(D), (V @ Qt[:k].T) / math.sqrt(D)


# -- after the fit: one pass of moments, then a k x k rotation ------------------


def moments_partial(payload: dict, chunk: Chunk) -> dict:
    """sum H, sum H H^T and the row count for the final coefficients (all views);
    feature blocks the fit left in the worker cache are reused.  With
    ``payload["cache"]`` "off" (a one-epoch power fit cached nothing) the features
    go through the fused row-tile pass instead, which fills no cache: filling
    it with every block of every chunk paged in fresh memory, 11.8 s of a
    one-epoch fit on 1M x 32 against 0.8 s."""
    values = []
    for s, view in enumerate(payload["views"]):
        vchunk = view_chunk(chunk, s)
        coef = asarray_like(view["coef"], vchunk.X)
        if mode_of(payload) != "off":
            values.append(chunk_decision(view["features"], vchunk, coef, mode_of(payload)))
            continue
        tiles: list[Any] = []

        def keep(f: Any, tile: slice, tiles: list = tiles) -> tuple[float, Any]:
            tiles.append(f.copy())  # k columns a row; the pass's backward product is k wide too
            return 0.0, f

        pool_gradient(view["features"], vchunk, coef.shape[0] // view["features"].block_size,
                      coef, keep, mode="off")
        values.append(namespace(coef).concatenate(tiles, axis=0))
    H = values[0] if len(values) == 1 else namespace(values[0]).concatenate(values, axis=1)
    return {
        "H": H.sum(axis=0).astype(np.float64),
        "HH": (H.T @ H).astype(np.float64),
        "count": int(H.shape[0]),
    }


def moments_payload(features: tuple[FeatureMap, ...], coefs: tuple[np.ndarray, ...],
                    cache: str = "float32") -> dict:
    return {"views": [{"features": f, "coef": c.astype(f.dtype)} for f, c in zip(features, coefs)],
            "cache": cache}


def centred_moments(total: dict, center: bool) -> tuple[np.ndarray, np.ndarray]:
    """(mean of H, second moment of H about that mean) from a moments pass."""
    if not (np.all(np.isfinite(total["H"])) and np.all(np.isfinite(total["HH"]))):
        # the steps' own check passes coefficients that are finite but so large
        # that the scores' float32 products overflow in this pass
        raise FloatingPointError(
            "the scores' moments over the data are not finite: the fitted coefficients "
            "grew too large (the steps diverged); use a smaller step_size")
    n = float(total["count"])
    mean = total["H"] / n if center else np.zeros_like(total["H"])
    return mean, total["HH"] / n - np.outer(mean, mean)


def pool_gram(coef: np.ndarray) -> np.ndarray:
    """RKHS Gram matrix of the functions phi^T coef in the pool metric D a^T b."""
    return coef.shape[0] * (coef.T @ coef)


def rotate_pca(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order the components: eigendecomposition M = E diag(lambda) E^T of the
    k x k second moment of the scores (Xie et al.: the Oja iteration keeps H
    orthonormal, so H E are the eigenfunctions and lambda their eigenvalues).

    The pool Gram D A^T A is not used as the metric: it also counts the
    mini-batch noise that every step adds to A along directions the data
    barely excite (its size grows with the step), which would bias lambda low.
    """
    lam, E = eigh(M)
    order = np.argsort(lam)[::-1]
    return E[:, order], lam[order]


def rotate_pair(
    Sxx: np.ndarray, Syy: np.ndarray, Sxy: np.ndarray, k: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Whiten each view with its metric (Sxx, Syy), then an SVD of the whitened
    cross moment orders the pairs: returns the top-k rotations (Rx, Ry) and the
    singular values (canonical correlations for KCCA); k defaults to all."""
    Lx = cholesky(Sxx, lower=True)
    Ly = cholesky(Syy, lower=True)
    C = solve_triangular(Ly, solve_triangular(Lx, Sxy, lower=True).T, lower=True).T
    P, sv, Qt = svd(C, full_matrices=False)
    k = min(Sxy.shape) if k is None else k
    Rx = solve_triangular(Lx.T, P[:, :k], lower=False)
    Ry = solve_triangular(Ly.T, Qt.T[:, :k], lower=False)
    return Rx, Ry, sv[:k]


def regularized_cca(
    Fx: np.ndarray, Fy: np.ndarray, kappa: float, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exact CCA of two explicit feature matrices with covariances C + kappa I:
    whiten each view, SVD of the whitened cross covariance.  Returns the means
    and the projections (mx, my, Wx, Wy); scores are (F - m) W.  For a
    subsample or a small pool only: O(n D m + m^3) with m = min(n, D), or
    m = D where D / 2 < n < D (``ROW_SPACE_FRACTION``).

    A view of n rows and D >= 2 n features is solved in the span of its rows,
    as the dual form of kernel CCA is (Hardoon, Szedmak & Shawe-Taylor 2004).
    With F^T = Q R (Q: D x n, orthonormal), a direction w = Q a + w_perp,
    w_perp orthogonal to every row and so to every centred row, has
    w^T (C_xx + kappa I) w = a^T (Q^T C_xx Q + kappa I) a + kappa |w_perp|^2
    and w^T C_xy = a^T Q^T C_xy: w_perp spends the constraint and buys no
    correlation.  So the pairs are those of the n coordinates F Q = R^T,
    mapped back by Q, and the whitening and SVD are n x n, where they were
    D x D whatever n.
    """
    mx, my = Fx.mean(0, dtype=np.float64), Fy.mean(0, dtype=np.float64)
    (Qx, Gx), (Qy, Gy) = _row_basis(Fx, k), _row_basis(Fy, k)
    gx = mx if Qx is None else Gx.mean(0)
    gy = my if Qy is None else Gy.mean(0)
    n = Fx.shape[0]
    Cxx = (Gx.T @ Gx).astype(np.float64) / n - np.outer(gx, gx)
    Cyy = (Gy.T @ Gy).astype(np.float64) / n - np.outer(gy, gy)
    Cxy = (Gx.T @ Gy).astype(np.float64) / n - np.outer(gx, gy)
    Rx, Ry, _ = rotate_pair(Cxx + kappa * np.eye(len(Cxx)), Cyy + kappa * np.eye(len(Cyy)), Cxy, k)
    return mx, my, Rx if Qx is None else Qx @ Rx, Ry if Qy is None else Qy @ Ry


#: Rows per feature up to which :func:`regularized_cca` works in the rows' span.
#: D = 2048, CPU seconds with one BLAS thread: the D x D solve 5.0-5.6 whatever
#: n; the rows' span 0.001 at n = 20, 0.08 at 300, 1.0 at 1000, 6.0 at 2000.
#: With BLAS threads on two loaded cores the QRs scale worse (n = 2000: 52
#: against 21), so the span is taken only where it pays on both.
ROW_SPACE_FRACTION = 0.5


def _row_basis(F: np.ndarray, k: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(Q, F Q) for F^T = Q R when F has at least k rows and at most
    ``ROW_SPACE_FRACTION`` as many rows as columns (:func:`regularized_cca`),
    else (None, F).  In float64: the whitening that follows squares R's
    condition number, and the D x D path's covariances are float64 too."""
    n, D = F.shape
    if not k <= n <= ROW_SPACE_FRACTION * D:
        return None, F
    Q, R = qr(F.T.astype(np.float64), mode="economic", check_finite=False)
    return Q, R.T
