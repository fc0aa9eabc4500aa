r"""Gaussian-process posterior variance on a random-feature pool (Dai et al. 2014,
section 4 and App. D).

With y = f(x) + e, f ~ GP(0, k), e ~ N(0, sigma^2), the posterior variance at
x* is k(x*, x*) - k*^T (K + sigma^2 I)^{-1} k*.  Dai et al. write it through the
operator A = C (C + sigma^2/n I)^{-1}, C = (1/n) sum_i k(x_i, .) (x) k(x_i, .),
the minimiser of App. D's objective
(1/2n) sum_i |k(x_i, .) - A k(x_i, .)|^2 + sigma^2/(2n) |A|_HS^2,
and our regulariser alpha is sigma^2 / n (docs/design.md §2.2: the mean is ridge
regression with nu = sigma^2 / n).

On a fixed pool of D features z (z.z ~ k) the operator is a D x D matrix, so
we take App. D's optimum in closed form instead of Dai's O(t^2)-memory
stochastic iteration: one pass sums C = Z^T Z / n on the workers (from the
blocks the fit cached), then an eigendecomposition C = U diag(lambda) U^T gives

    var(x) = z^T z - z^T A z = \sum_i (u_i^T z)^2 \alpha / (\lambda_i + \alpha)
           = z^T z - \sum_i (u_i^T z)^2 \lambda_i / (\lambda_i + \alpha),

the exact posterior variance of the GP whose kernel is the pool's z.z
(k(x*, x*) is taken as z^T z, its feature value: the variance stays >= 0 and
its error is relative where the data are dense).  Only the eigenpairs with
lambda_i / (lambda_i + alpha) >= ``_KEEP`` are stored (the rest change the
variance by less than ``_KEEP * z^T z``).

That prior has amplitude 1 (k(x, x) = 1) whatever the units of y.  The
model's prior is f ~ GP(0, s^2 k) with noise sigma^2 = n alpha s^2: the mean
is the same ridge fit for every s^2 (the ratio sigma^2 / s^2 = n alpha fixes
it) and the variance above is multiplied by s^2.  Setting the derivative of
the log marginal likelihood (Rasmussen & Williams 2006, eq. 2.30, with
K_y = s^2 (K + n alpha I)) in s^2 to zero gives its maximiser in closed form,

    s^2 = y^T (K + n alpha I)^{-1} y / n,            K = Z Z^T, Z = Phi / sqrt(D),

for y the target the mean was fitted on (y less its mean; one s^2 per
output).  By Woodbury it is a feature-space sum the covariance pass adds at
the cost of Phi^T y:

    y^T (K + n alpha I)^{-1} y = (y^T y - (Z^T y)^T (Z^T Z + n alpha I)^{-1} Z^T y) / (n alpha),

with Z^T Z = n C = U diag(n lambda) U^T from the same eigendecomposition;
with fewer rows than features it is sum_j (w_j^T y)^2 / (n (mu_j + alpha))
over the eigenpairs (mu_j, w_j) of the order-n K / n.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dkernel.engine.program import Chunk
from dkernel.features import FeatureMap
from dkernel.linalg import wide_gram_eigensystem
from dkernel.solvers.feature_cache import block_rows, mode_of

#: Smallest weight lambda / (lambda + alpha) of a stored eigenpair.
_KEEP = 1e-5


def covariance_partial(payload: dict, chunk: Chunk) -> dict:
    """Phi^T Phi over the chunk (unscaled features, every block of the pool), and
    for the amplitude Phi^T y and y^T y of the fit's target (module docstring)."""
    Phi = _pool_rows(payload, chunk)
    y = _target(payload, chunk)
    # (float64 a block of columns at a time: Phi.T @ y upcast all of the chunk's
    # float32 features, twice their memory at once)
    B = payload["features"].block_size
    Phity = np.concatenate([Phi[:, j:j + B].T.astype(np.float64) @ y
                            for j in range(0, Phi.shape[1], B)])
    return {"gram": (Phi.T @ Phi).astype(np.float64), "Phity": Phity,
            "yty": (y * y).sum(axis=0), "count": Phi.shape[0]}


def rows_partial(payload: dict, chunk: Chunk) -> dict:
    """The chunk's Phi itself (unscaled, every block of the pool) and its rows'
    target, for fewer rows than features (:func:`posterior_from_rows`)."""
    return {"rows": [_pool_rows(payload, chunk)], "y": [_target(payload, chunk)],
            "count": len(chunk.X_rows)}


def _pool_rows(payload: dict, chunk: Chunk) -> np.ndarray:
    features: FeatureMap = payload["features"]
    mode = mode_of(payload)
    return np.concatenate([block_rows(features, chunk, j, mode)
                           for j in range(payload["n_blocks"])], axis=1)


def _target(payload: dict, chunk: Chunk) -> np.ndarray:
    """(rows, outputs) float64: y less the fit's offset, the target the mean was fitted on."""
    return np.asarray(payload["encoding"].encode(chunk.y_rows, np.float64))


def posterior(gram: np.ndarray, n: int, alpha: float, Phity: np.ndarray,
              yty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(F, s^2): F = U_r diag(sqrt(lambda / (lambda + alpha))) from C = Phi^T Phi / (n D),
    so that z^T A z = |F^T z|^2, and the amplitude s^2 per output from
    ``Phity`` = Phi^T y (D, outputs) and ``yty`` = y^T y (module docstring)."""
    D = gram.shape[0]
    # a full eigh: scipy's subset solver (evr) measured 6x slower here at D = 2048
    lam, U = np.linalg.eigh(gram / (n * D))
    lam = np.clip(lam, 0.0, None)
    # beta = U^T Z^T y / sqrt(n), so that
    # (Z^T y)^T (Z^T Z + n alpha I)^{-1} Z^T y = sum_i beta_i^2 / (lambda_i + alpha)
    beta = U.T @ np.asarray(Phity, np.float64).reshape(D, -1) / np.sqrt(D * n)
    explained = (beta**2 / (lam + alpha)[:, None]).sum(axis=0)
    quad = (np.asarray(yty, np.float64) - explained) / (n * alpha)
    return _factor(lam, U, alpha), _amplitude(quad, n)


def posterior_factor(gram: np.ndarray, n: int, alpha: float) -> np.ndarray:
    """F of :func:`posterior` alone."""
    return posterior(gram, n, alpha, np.zeros((gram.shape[0], 0)), np.zeros(0))[0]


def posterior_from_rows(Phi: np.ndarray, y: np.ndarray, alpha: float
                        ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`posterior` for fewer rows than features (n < D), from the rows Phi
    and their target y (n, outputs): C's nonzero eigenpairs from the n x n
    Phi Phi^T / (n D) (:func:`dkernel.linalg.wide_gram_eigensystem`);
    an order-n eigh instead of order D (2000 rows of a 4096-feature pool: 6 s
    less here).  The n x n products are float64: the directions are T^T w, and
    from a float32 Gram they came out far from orthogonal where lambda is
    small (the variance at alpha = 1e-6 then read 1.7x the exact one).  The
    amplitude reads the order-n eigenvectors w themselves, orthonormal where
    T^T w / |T^T w| are not (module docstring)."""
    n, D = Phi.shape
    T = np.array(Phi, dtype=np.float64)  # (one copy, scaled in place)
    T /= np.sqrt(D)
    pairs = wide_gram_eigensystem(T, n, False, "float64")
    W, mu = pairs.gram_vectors, pairs.values  # every one of the n pairs: K / n = W diag(mu) W^T
    quad = ((W.T @ np.asarray(y, np.float64).reshape(n, -1)) ** 2
            / (n * (mu + alpha))[:, None]).sum(axis=0)
    return orthonormal(_factor(pairs.values, pairs.vectors, alpha)), _amplitude(quad, n)


def posterior_factor_from_rows(Phi: np.ndarray, alpha: float) -> np.ndarray:
    """F of :func:`posterior_from_rows` alone."""
    return posterior_from_rows(Phi, np.zeros((Phi.shape[0], 0)), alpha)[0]


def _amplitude(quad: np.ndarray, n: int) -> np.ndarray:
    """s^2 = y^T (K + n alpha I)^{-1} y / n per output.  The covariance path's form
    is a difference, y^T y less the part the features explain; where they explain
    nearly all of y at a tiny alpha rounding could take it to 0 or below (not
    seen: 1e-5 of the exact value at alpha 1e-8), and the floor keeps the std a
    number, not NaN."""
    return np.maximum(quad / n, np.finfo(np.float64).tiny)


def orthonormal(factor: np.ndarray) -> np.ndarray:
    """The same operator F F^T with orthogonal columns, which
    :func:`posterior_variance`'s sum of parts needs: the order-n path's
    directions T^T w are orthogonal only as far as the Gram's eigenvectors
    are (model files of its float32 Gram: max |U^T U - I| 0.96, and the sum
    gave std 35 where the prior is 1).  F = Q R, R R^T = S L S^T: F F^T =
    (Q S) L (Q S)^T.  A random probe finds F's columns orthogonal at O(D k)."""
    if factor.shape[1] == 0:
        return factor
    U = factor / np.sqrt((factor * factor).sum(axis=0))
    r = np.random.default_rng(0).standard_normal(U.shape[1])
    if abs(float(np.sum((U @ r) ** 2)) - float(r @ r)) <= 1e-9 * float(r @ r):
        return factor
    Q, R = np.linalg.qr(factor)
    lam, S = np.linalg.eigh(R @ R.T)
    keep = lam > 0
    return (Q @ S[:, keep]) * np.sqrt(np.minimum(lam[keep], 1.0))


def _factor(lam: np.ndarray, U: np.ndarray, alpha: float) -> np.ndarray:
    weight = np.clip(lam, 0.0, None) / (np.clip(lam, 0.0, None) + alpha)
    keep = weight >= _KEEP
    return U[:, keep] * np.sqrt(weight[keep])


def posterior_variance(features: FeatureMap, n_blocks: int, factor: np.ndarray,
                       X: Any) -> np.ndarray:
    """var(x) for the rows of X, shape (n,), as the sum of its parts:
    sum_i (u_i^T z)^2 (1 - w_i) over the stored directions (F's columns u_i
    sqrt(w_i), w_i = lambda_i / (lambda_i + alpha)) plus |z - U U^T z|^2, the
    part of z outside them (weight 0).  Not z^T z - |F^T z|^2: near the
    training rows that difference of two near-equal numbers cancelled (alpha
    1e-8: std 0 where the exact float64 posterior gives 4e-4).  F's columns
    must be orthogonal (:func:`orthonormal`)."""
    Z = features.transform(X.astype(features.dtype, copy=False), n_blocks).astype(np.float64)
    w = (factor * factor).sum(axis=0)
    U = factor / np.sqrt(w)
    P = Z @ U
    Z -= P @ U.T
    return np.maximum((P * P) @ (1.0 - w) + (Z * Z).sum(axis=1), 0.0)


def check_pool_size(n_features: int) -> None:
    """The variance needs a D x D matrix per chunk and an eigendecomposition."""
    if n_features > _MAX_FEATURES:
        raise ValueError(
            f"posterior_variance=True needs a {n_features} x {n_features} covariance "
            f"({n_features**2 * 8 / 2**30:.1f} GiB per chunk result) and its eigendecomposition; "
            f"use n_features <= {_MAX_FEATURES} for the variance")


#: 8192^2 float64 is 512 MiB per partial result and ~1 min of eigh on 2 cores.
_MAX_FEATURES = 8192
