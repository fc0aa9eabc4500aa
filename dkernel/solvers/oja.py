r"""Streaming kernel PCA: Oja's rule on seeded random features (Deng, Song, Wang, Zhang).

Per point (one pass, O(D k) state, constant step \eta <= 0.1 / max|z|^2):

.. math::  v_i = v_{i-1} + \eta \langle z(x_i), v_{i-1}\rangle z(x_i)

then normalise (the direction is unchanged; the norm would overflow).  For
k > 1 the columns of V follow the same linear map and are re-orthonormalised
(V <- qr(V)): the map commutes with right-multiplication by R^{-1}, so the
span equals that of the unnormalised product \prod_i (I + \eta z_i z_i^T) V_0
(Oja's subspace rule; no deflation needed).

Blocked exact update (DESIGN 2.5).  For a block of b consecutive rows Z_b,
with G = Z_b Z_b^T and P = Z_b V:

.. math::  (I - \eta\,\mathrm{tril}(G, -1))\, C = \eta P, \qquad V \leftarrow V + Z_b^\top C,

which equals the per-point loop (c_j = \eta z_j^T v_{j-1} and
v_{j-1} = v + \sum_{i<j} c_i z_i).  G and Z do not depend on V, so
:func:`oja_prepare` builds them for every chunk in parallel on the workers
(``Engine.scan``) and :func:`oja_fold` threads only V through the chunks.

Ordering.  Over the second half of the stream the fold accumulates
M = \sum (Z V)^T (Z V) in the current basis (rotated by the orthogonal polar
factor of V_old^T V_new at each re-orthonormalisation); its eigenvectors order the final components
(a k x k Rayleigh-Ritz step, no extra pass).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.linalg import eigh, solve_triangular

from dkernel.features import FeatureMap


def initial_subspace(n_features: int, n_components: int, seed: Any) -> np.ndarray:
    """V_0 ~ N(0, I), orthonormalised (Deng et al. start from a Gaussian vector)."""
    V = np.random.default_rng(seed).standard_normal((n_features, n_components))
    return np.linalg.qr(V)[0]


def features_of(payload: dict, X: Any) -> np.ndarray:
    """z(X), the fixed scaled feature map with z(x).z(x') ~ k(x, x')."""
    features: FeatureMap = payload["features"]
    return features.transform(X.astype(features.dtype, copy=False), payload["n_blocks"])


def oja_prepare(payload: dict, X: Any, y: Any, start: int = 0) -> dict[str, Any]:
    """State-free chunk work on a worker: Z and the diagonal Gram blocks Z_b Z_b^T."""
    Z = features_of(payload, X)
    b = payload["block_rows"]
    G = [(Z[a : a + b] @ Z[a : a + b].T).astype(np.float64) for a in range(0, Z.shape[0], b)]
    return {"Z": Z, "G": G, "start": int(start)}


def _block_update(
    V: np.ndarray, Zb: np.ndarray, Gb: np.ndarray, eta: float
) -> tuple[np.ndarray, np.ndarray]:
    """(V + Z_b^T C, P) with C from the unit lower-triangular solve."""
    P = (Zb @ V.astype(Zb.dtype, copy=False)).astype(np.float64)
    L = -eta * np.tril(Gb, -1)
    C = solve_triangular(L, eta * P, lower=True, unit_diagonal=True, check_finite=False)
    return V + (Zb.T @ C.astype(Zb.dtype, copy=False)).astype(np.float64), P


def oja_fold(state: dict, prep: dict, payload: dict) -> dict[str, Any]:
    """Thread V through one chunk, block after block (exact), normalising each block."""
    if state["n"] != prep["start"]:
        raise RuntimeError(
            f"oja scan out of order: state has {state['n']} rows, chunk starts at {prep['start']}"
        )
    V, M, n, n_M = state["V"].copy(), state["M"].copy(), int(state["n"]), int(state["n_M"])
    Z, b, eta = prep["Z"], payload["block_rows"], payload["eta"]
    burn_in = payload["n_total"] // 2
    for j, a in enumerate(range(0, Z.shape[0], b)):
        Zb = Z[a : a + b]
        V_new, P = _block_update(V, Zb, prep["G"][j], eta)
        Q, R = np.linalg.qr(V_new)
        Q *= np.sign(np.diag(R))  # keep column signs continuous
        if n + Zb.shape[0] > burn_in:
            M += P.T @ P
            n_M += Zb.shape[0]
        # old basis -> new basis by the orthogonal polar factor of V^T Q: the spans
        # drift a little each block and V^T Q itself would shrink M every time
        Ut, _, Wt = np.linalg.svd(V.T @ Q)
        T = Ut @ Wt
        M = T.T @ M @ T
        V = Q
        n += Zb.shape[0]
    return {"V": V, "M": M, "n": n, "n_M": n_M}


def init_state(n_features: int, n_components: int, seed: Any) -> dict[str, Any]:
    return {
        "V": initial_subspace(n_features, n_components, seed),
        "M": np.zeros((n_components, n_components)),
        "n": 0,
        "n_M": 0,
    }


def ordered(state: dict) -> tuple[np.ndarray, np.ndarray]:
    """Components ordered by the Rayleigh quotients of the stream: (V E, lambda)."""
    V, M, n_M = state["V"], state["M"], max(int(state["n_M"]), 1)
    lam, E = eigh(M / n_M)
    order = np.argsort(lam)[::-1]
    return V @ E[:, order], lam[order]


def per_point_loop(
    Z: np.ndarray, V0: np.ndarray, eta: float, normalize_every: int = 256
) -> np.ndarray:
    """Oja's rule one point at a time (the reference for the blocked update)."""
    V = np.array(V0, dtype=np.float64)
    for i in range(Z.shape[0]):
        z = Z[i].astype(np.float64)
        V += eta * np.outer(z, z @ V)
        if (i + 1) % normalize_every == 0:
            V /= np.linalg.norm(V, axis=0)
    return V


def default_step(features: FeatureMap) -> float:
    """eta = 0.1 / max|z|^2 with |z|^2 = (2/D) sum cos^2 <= 2 (DESIGN 2.5)."""
    return 0.1 / 2.0


def fingerprint(payload: dict) -> dict:
    return {
        "solver": "oja",
        "features": payload["features"].to_dict(),
        "n_blocks": payload["n_blocks"],
        "eta": payload["eta"],
        "block_rows": payload["block_rows"],
        "n_total": payload["n_total"],
        "version": 1,
    }
