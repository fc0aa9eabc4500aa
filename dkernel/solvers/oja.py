r"""Streaming kernel PCA: Oja's rule on seeded random features (Deng, Song, Wang, Zhang).

Per point (one pass, O(D k) state, constant step \eta):

.. math::  v_i = v_{i-1} + \eta \langle z(x_i), v_{i-1}\rangle z(x_i)

The step follows their theorem's regime (Thm. 5.1/5.2): \eta n \lambda_1 of order
\log D, i.e. \eta = c \log D / (n \lambda_1) from the stream length n and an
estimate of \lambda_1 (:func:`theorem_step`), within \eta <= 0.1 / max|z|^2; then
the stream noise falls with n, where a constant \eta leaves an O(\eta) floor.
Then normalise (the direction is unchanged; the norm would overflow).  For
k > 1 the columns of V follow the same linear map and are re-orthonormalised
(V <- qr(V)): the map commutes with right-multiplication by R^{-1}, so the
span equals that of the unnormalised product \prod_i (I + \eta z_i z_i^T) V_0
(Oja's subspace rule; no deflation needed).

Blocked exact update (docs/design.md §2.5).  For a block of b consecutive rows Z_b,
with G = Z_b Z_b^T and P = Z_b V:

.. math::  (I - \eta\,\mathrm{tril}(G, -1))\, C = \eta P, \qquad V \leftarrow V + Z_b^\top C,

which equals the per-point loop (c_j = \eta z_j^T v_{j-1} and
v_{j-1} = v + \sum_{i<j} c_i z_i).  G and Z do not depend on V, so
:func:`oja_prepare` builds them for every chunk in parallel on the workers
(``Engine.scan``) and :func:`oja_fold` threads only V through the chunks.

Centring (ours; Deng et al. analyse the uncentred covariance).  Row i is
centred by the running mean of rows 1..i, \tilde z_i = z_i - (S + c_i) / N_i,
with S the sum of every row before the chunk, c_i the chunk's inclusive
prefix sum and N_i the number of rows up to i.  Writing
y_i = z_i - c_i / N_i (state-free, built by :func:`oja_prepare`) and r_i = 1/N_i,
\tilde Z_b = Y_b - r S^T, so

.. math::  \tilde G = Y_b Y_b^\top - u r^\top - r u^\top + |S|^2 r r^\top, \quad u = Y_b S,
           \qquad \tilde P = Y_b V - r (S^\top V),

and the update V += \tilde Z_b^\top C = Y_b^\top C - S (r^\top C): the fold adds
O(b D) work per block and the blocked update stays exactly the per-point
loop on centred rows.  Only the O(D) sum S joins V in the threaded state.

Ordering.  Over the second half of the stream the fold accumulates
M = \sum (Z V)^T (Z V) in the current basis (rotated by the orthogonal polar
factor of V_old^T V_new at each re-orthonormalisation); its eigenvectors order the final components
(a k x k Rayleigh-Ritz step, no extra pass).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.linalg import eigh, solve_triangular

from dkernel.engine.scan import piece_rows
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
    """State-free chunk work on a worker: the rows Y (Z, or Z less its in-chunk
    running-mean part when centring), the diagonal Gram blocks Y_b Y_b^T, and
    for centring r_i = 1/N_i and the chunk's column sum."""
    Z = features_of(payload, X)  # a fresh array: centred in place, block by block
    b = payload["block_rows"]
    out: dict[str, Any] = {"start": int(start), "Z": Z}
    if payload.get("center", False):
        r = 1.0 / np.arange(start + 1, start + Z.shape[0] + 1, dtype=np.float64)
        offset = np.zeros(Z.shape[1])  # float64 sum of the chunk's earlier blocks
        for a in range(0, Z.shape[0], b):
            prefix = np.cumsum(Z[a : a + b], axis=0, dtype=np.float64)
            prefix += offset
            offset = prefix[-1].copy()
            prefix *= r[a : a + b, None]
            Z[a : a + b] -= prefix.astype(Z.dtype)  # y_i = z_i - c_i / N_i
        out["r"], out["sum"] = r, offset
    out["G"] = [(Z[a : a + b] @ Z[a : a + b].T).astype(np.float64) for a in range(0, Z.shape[0], b)]
    return out


def scan_rows(payload: dict) -> int:
    """Rows a scan piece may hold (:func:`dkernel.engine.scan.piece_rows`): what
    :func:`oja_prepare` returns is 4 D + 8 ``block_rows`` bytes a row (Z in
    float32, the float64 Gram blocks), 12 kB at 2048 features."""
    D = int(payload["n_blocks"]) * int(payload["features"].block_size)
    return piece_rows(4 * D + 8 * int(payload["block_rows"]) + 8, int(payload["block_rows"]))


def _block_update(
    V: np.ndarray, Zb: np.ndarray, Gb: np.ndarray, eta: float,
    r: np.ndarray | None = None, S: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(V + Z~_b^T C, P~) with C from the unit lower-triangular solve; with
    ``r`` and ``S`` the rows are Z~_b = Z_b - r S^T (centring, module docstring)."""
    P = (Zb @ V.astype(Zb.dtype, copy=False)).astype(np.float64)
    if r is not None:
        u = (Zb @ S.astype(Zb.dtype)).astype(np.float64)
        Gb = Gb - np.outer(u, r) - np.outer(r, u) + (S @ S) * np.outer(r, r)
        P -= np.outer(r, S @ V)
    L = -eta * np.tril(Gb, -1)
    C = solve_triangular(L, eta * P, lower=True, unit_diagonal=True, check_finite=False)
    V = V + (Zb.T @ C.astype(Zb.dtype, copy=False)).astype(np.float64)
    if r is not None:
        V -= np.outer(S, r @ C)
    return V, P


def oja_fold(state: dict, prep: dict, payload: dict) -> dict[str, Any]:
    """Thread V (and the running sum S) through one chunk, block after block
    (exact), normalising each block."""
    if state["n"] != prep["start"]:
        raise RuntimeError(
            f"oja scan out of order: state has {state['n']} rows, chunk starts at {prep['start']}"
        )
    V, M, n, n_M = state["V"].copy(), state["M"].copy(), int(state["n"]), int(state["n_M"])
    S = state.get("S")
    Z, b, eta = prep["Z"], payload["block_rows"], payload["eta"]
    burn_in = payload["n_total"] // 2
    for j, a in enumerate(range(0, Z.shape[0], b)):
        Zb = Z[a : a + b]
        r = prep["r"][a : a + b] if "r" in prep else None
        V_new, P = _block_update(V, Zb, prep["G"][j], eta, r, S)
        if not np.all(np.isfinite(V_new)):
            raise FloatingPointError(
                f"oja diverged in the block at row {n} (step size eta={eta:.3g}): the "
                f"update overflowed; use a smaller step_size")
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
    out = {"V": V, "M": M, "n": n, "n_M": n_M}
    if S is not None:
        out["S"] = S + prep["sum"]
    return out


def init_state(n_features: int, n_components: int, seed: Any,
               center: bool = False) -> dict[str, Any]:
    state = {
        "V": initial_subspace(n_features, n_components, seed),
        "M": np.zeros((n_components, n_components)),
        "n": 0,
        "n_M": 0,
    }
    if center:
        state["S"] = np.zeros(n_features)  # running sum of z over the rows folded so far
    return state


def ordered(state: dict) -> tuple[np.ndarray, np.ndarray]:
    """Components ordered by the Rayleigh quotients of the stream: (V E, lambda)."""
    V, M, n_M = state["V"], state["M"], max(int(state["n_M"]), 1)
    lam, E = eigh(M / n_M)
    order = np.argsort(lam)[::-1]
    return V @ E[:, order], lam[order]


def per_point_loop(
    Z: np.ndarray, V0: np.ndarray, eta: float, normalize_every: int = 256, center: bool = False
) -> np.ndarray:
    """Oja's rule one point at a time (the reference for the blocked update);
    with ``center`` each row less the running mean of the rows up to it."""
    V = np.array(V0, dtype=np.float64)
    S = np.zeros(Z.shape[1])
    for i in range(Z.shape[0]):
        z = Z[i].astype(np.float64)
        if center:
            S += z
            z = z - S / (i + 1)
        V += eta * np.outer(z, z @ V)
        if (i + 1) % normalize_every == 0:
            V /= np.linalg.norm(V, axis=0)
    return V


#: c in eta = c log D / (n lambda): the growth eta n lambda of the top direction over the
#: pass, in units of log D (Deng et al. Thm. 5.1 needs beta = eta sum <v*, z_i>^2 >= C log d).
#: Against v*, a direction of eigenvalue lambda_j keeps exp(-2 eta n (lambda_1 - lambda_j))
#: of its start: D^(1 - 2c) for the whole bulk (lambda_j ~ 0) and D^(-2c(1 - lambda_2/lambda_1))
#: for a close second, while the stream noise of Oja's rule grows with eta.  Measured
#: (3000 rows, 2 components, D = 1024, lambda_3/lambda_2 ~ 0.7, sin^2 to exact centred
#: PCA of the features): c = 1: 0.10, c = 2: 0.012, c = 4: 0.028.
_GROWTH = 2.0


def theorem_step(n_rows: int, n_features: int, lam: float, max_sq_norm: float) -> float:
    """Deng et al.'s regime: eta = c log D / (n lambda) (``_GROWTH``), so eta n lambda
    = c log D whatever n, capped at their condition eta <= 0.1 / max |z|^2 (Property 3)."""
    if not max_sq_norm > 0:
        raise ValueError(
            "every sampled row has the same features (the data are constant in feature "
            "space): check the data and the bandwidth, or give step_size explicitly")
    cap = 0.1 / max_sq_norm
    if not lam > 0:  # k beyond the sample's rank: the cap is the largest stable step
        return float(cap)
    return float(min(_GROWTH * np.log(n_features) / (max(int(n_rows), 1) * lam), cap))


def sample_spectrum(Z: np.ndarray, n_components: int, center: bool) -> tuple[float, float]:
    """(lambda_k, max |z|^2) of the (centred) feature covariance on a sample of rows,
    from the sample's small Gram matrix (same nonzero eigenvalues as Z^T Z / m)."""
    Z = np.asarray(Z, dtype=np.float64)
    if center:
        Z = Z - Z.mean(axis=0)
    lam = np.linalg.eigvalsh(Z @ Z.T / len(Z))[::-1]
    return float(lam[min(n_components, len(lam)) - 1]), float((Z * Z).sum(axis=1).max())


def fingerprint(payload: dict) -> dict:
    return {
        "solver": "oja",
        "features": payload["features"].to_dict(),
        "n_blocks": payload["n_blocks"],
        "eta": payload["eta"],
        "block_rows": payload["block_rows"],
        "n_total": payload["n_total"],
        "center": bool(payload.get("center", False)),
        "version": 2,
    }
