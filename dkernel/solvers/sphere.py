r"""Truncated kernel SGD on spheres (Bai & Shi, Algorithm 1; docs/design.md §2.6).

Per point n = 1, 2, ... (one pass over the data in order):

.. math::
    L_n &= \min\{L : \dim \Pi_L \ge n^\theta - 1\}   \quad\text{(eq. 2.11; +1 at a time)}\\
    \eta_n &= \eta_0 n^{-t}                           \quad (t = 0: \text{constant step})\\
    f_{n+1} &= f_n - \eta_n (f_n(x_n) - y_n) K^{L_n}(x_n, \cdot)\\
    \bar f_N &= \frac{1}{N+1}\sum_{k=0}^{N} f_k        \quad\text{(Polyak average, } f_0 = 0)

with the zonal kernel :math:`K^L = \sum_{k\le L} \mu_k Z_k` of
:mod:`dkernel.kernels.zonal`.  ``theta=None`` gives plain kernel SGD with the
kernel K^{max_degree} at every step (the contrast of the paper's figures).

Blocked exact update (docs/design.md §2.5/2.6).  For a block of m consecutive points
with residual coefficients :math:`r_i = \eta_i (f_i(x_i) - y_i)`,

.. math::
    f_j(x_j) = f(x_j) - \sum_{i<j} M_{ji} r_i,\qquad M_{ji} = K^{L_i}(x_i, x_j),

so :math:`(I + \mathrm{diag}(\eta)\,\mathrm{tril}(M, -1))\, r = \eta \odot (p - y)`
with p the block's values under the state before the block, a unit lower
triangular solve.  M and the block's basis values do not depend on the
state, so ``prepare`` builds them for every chunk in parallel on the
workers; ``fold`` threads only the model through the chunks in order.

Two equivalent representations of f (chosen by :func:`choose_form`):

features  f = c^T u(x) over a basis of Pi_{L_max} (:class:`ZonalFeatures`,
          spherical harmonics for d = 2, 3, scaled monomials otherwise);
          state O(F) with F = dim of the basis; update c -= V^T r with
          V_i = W[L_i] * u(x_i).  The paper's "equivalent T-kernel SGD".
kernel    f = sum_i a_i K^{L_i}(x_i, .) over the points seen (Algorithm 1
          literally); the state grows with n, each block costs O(n m (d + L)).
          Cheaper only when F exceeds what n points span.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
from scipy.linalg import solve_triangular

from dkernel.engine.scan import piece_rows
from dkernel.kernels.zonal import ZonalFeatures, dim_polynomials, zonal_profile, zonal_weights

#: Highest degree for which the monomial feature form is used: its weights
#: grow like ~2^L with mixed signs, so beyond this the cancellation costs more
#: than 1e-10 of the kernel values and the kernel form is used instead.
MONOMIAL_MAX_DEGREE = 12
#: Feature counts above this are never materialised (rows x F per chunk).
MAX_FEATURES = 1 << 17
#: Rows of the cross-kernel tile in the kernel form's evaluation.
_TILE = 2048


# -- schedules ----------------------------------------------------------------

def truncation_levels(n: Any, d: int, theta: float | None,
                      max_degree: int | None = None) -> np.ndarray:
    """L_n for 1-based step indices n (eq. 2.11), capped at ``max_degree``.

    ``theta=None``: L_n = max_degree for every n (untruncated-schedule kernel SGD).
    """
    n = np.asarray(n, dtype=np.int64)
    if theta is None:
        if max_degree is None:
            raise ValueError("theta=None (plain kernel SGD) needs max_degree, the fixed level L")
        return np.full(n.shape, int(max_degree), dtype=np.int64)
    target = np.power(n.astype(np.float64), float(theta)) - 1.0
    top = float(target.max()) if target.size else 0.0
    dims = [1.0]
    while dims[-1] < top and (max_degree is None or len(dims) - 1 < max_degree):
        dims.append(float(dim_polynomials(len(dims), d)))
    L = np.searchsorted(np.asarray(dims), target, side="left")
    return np.minimum(L, len(dims) - 1).astype(np.int64)


def step_sizes(n: Any, eta0: float, t: float) -> np.ndarray:
    """eta_n = eta0 * n^-t for 1-based n."""
    n = np.asarray(n, dtype=np.float64)
    return eta0 * np.power(n, -float(t)) if t else np.full(n.shape, float(eta0))


def choose_form(d: int, n_total: int, max_level: int) -> str:
    """'features' when the basis is small enough, accurate, and cheaper than the
    kernel form (O(F) vs O(n (d + L)) work per point), else 'kernel'."""
    kind = "harmonic" if d <= 3 else "monomial"
    if kind == "monomial" and max_level > MONOMIAL_MAX_DEGREE:
        return "kernel"
    F = ZonalFeatures.n_features_for(d, max_level, kind)
    if F > MAX_FEATURES:
        return "kernel"
    # average cost per point: features ~ 4F flops (u, p, V, update), kernel ~
    # (n/2)(2d + 3L) for the cross kernel against the points seen so far.
    return "features" if 4 * F <= 0.5 * n_total * (2 * d + 3 * max_level + 2) else "kernel"


# -- inputs -------------------------------------------------------------------

def to_sphere(X: Any, input_map: str, scale: float) -> np.ndarray:
    """Rows of X mapped onto the unit sphere (float64).

    normalize      x / |x|                          (S^{p-1}, p = X.shape[1])
    stereographic  inverse stereographic projection of x / scale onto S^p:
                   (2 z, |z|^2 - 1) / (|z|^2 + 1),  z = x / scale; one-to-one.
    """
    X = np.asarray(X, dtype=np.float64)
    if input_map == "normalize":
        r = np.linalg.norm(X, axis=1, keepdims=True)
        if np.any(r == 0):
            raise ValueError(
                f"{int(np.sum(r == 0))} row(s) of X are zero and cannot be normalised onto the "
                "sphere; drop them or use input_map='stereographic'")
        return X / r
    if input_map == "stereographic":
        z = X / scale
        q = np.sum(z * z, axis=1, keepdims=True)
        return np.concatenate([2.0 * z, q - 1.0], axis=1) / (q + 1.0)
    raise ValueError(f"input_map must be 'normalize' or 'stereographic', got {input_map!r}")


def sphere_dim(n_inputs: int, input_map: str) -> int:
    """Ambient dimension d of the sphere the inputs land on."""
    return n_inputs + 1 if input_map == "stereographic" else n_inputs


# -- the per-point loop (Algorithm 1 literally; the reference for tests) ------

def per_point_loop(S: np.ndarray, Y: np.ndarray, *, s: float, theta: float | None, eta0: float,
                   t: float = 0.0, max_degree: int | None = None) -> dict[str, np.ndarray]:
    """Algorithm 1 one point at a time on points S (already on the sphere).

    Returns coefficients ``alpha`` (f_N = sum_i alpha_i K^{L_i}(x_i, .)), the
    levels, and ``alpha_avg`` for the Polyak average.  O(N^2); for tests.
    """
    N, d = S.shape
    Y = Y.reshape(N, -1).astype(np.float64)
    n = np.arange(1, N + 1)
    L = truncation_levels(n, d, theta, max_degree)
    eta = step_sizes(n, eta0, t)
    alpha = np.zeros_like(Y)
    for j in range(N):
        f = zonal_profile(S[j : j + 1] @ S[:j].T, d, s, L[:j]) @ alpha[:j] if j else 0.0 * Y[:1]
        alpha[j] = -eta[j] * (f[0] - Y[j])
    return {"alpha": alpha, "level": L, "alpha_avg": alpha * ((N + 1 - n) / (N + 1))[:, None]}


# -- blocked update through Engine.scan ----------------------------------------

def make_payload(*, d: int, s: float, theta: float | None, eta0: float, t: float,
                 max_degree: int | None, n_total: int, n_outputs: int, form: str,
                 input_map: str, scale: float, block_size: int,
                 record_at: tuple[int, ...] = (), n_rows: int | None = None) -> dict[str, Any]:
    """Everything prepare/fold need (small: the basis is rebuilt from 4 numbers).
    ``n_rows`` is the length of one pass (default: ``n_total``, one pass)."""
    max_level = int(truncation_levels([max(n_total, 1)], d, theta, max_degree)[0])
    if form == "auto":
        form = choose_form(d, n_total, max_level)
    payload = {"d": d, "s": float(s), "theta": theta, "eta0": float(eta0), "t": float(t),
               "max_degree": max_degree, "max_level": max_level, "n_total": int(n_total),
               "n_outputs": int(n_outputs), "form": form, "input_map": input_map,
               "scale": float(scale), "block_size": int(block_size),
               "record_at": tuple(sorted(int(r) for r in record_at if 0 < r <= n_total)),
               "n_rows": int(n_total if n_rows is None else n_rows)}
    if form == "features":
        payload["features"] = ZonalFeatures(d, max_level, s)
    elif form != "kernel":
        raise ValueError(f"form must be 'auto', 'features' or 'kernel', got {form!r}")
    return payload


def n_passes(payload: dict) -> int:
    return max(1, -(-payload["n_total"] // max(payload["n_rows"], 1)))


def init_state(payload: dict) -> dict[str, Any]:
    c, R = payload["n_outputs"], len(payload["record_at"])
    # per pass: sum of the squared progressive residuals (f_{n-1}(x_n) - y_n)^2,
    # averaged over outputs, and the wall-clock time the pass's last row was folded
    P = n_passes(payload)
    history = {"loss_sum": np.zeros(P), "pass_end": np.full(P, np.nan)}
    if payload["form"] == "features":
        F = payload["features"].n_features
        return {"coef": np.zeros((F, c)), "coef_sum": np.zeros((F, c)), "n": 0,
                "recorded": np.zeros((R, F, c)), **history}
    N = payload["n_total"]
    return {"support": np.zeros((N, payload["d"])), "alpha": np.zeros((N, c)),
            "level": np.zeros(N, dtype=np.int64), "n": 0, **history}


def scan_rows(payload: dict) -> int:
    """Rows a scan piece may hold (:func:`dkernel.engine.scan.piece_rows`): what
    :func:`sphere_prepare` returns is float64, a row's point, target, level and
    step, its row of the diagonal block and (features form) its basis values."""
    F = payload["features"].n_features if payload["form"] == "features" else 0
    B = int(payload["block_size"])
    return piece_rows(8 * (payload["d"] + payload["n_outputs"] + 2 + B + F), B)


def sphere_prepare(payload: dict, X: Any, y: Any, start: int = 0) -> dict[str, Any]:
    """State-independent chunk work: points on the sphere, L_n, eta_n, the
    diagonal blocks M of the chunk, and the basis values u(x) (features form)."""
    S = to_sphere(X, payload["input_map"], payload["scale"])
    m, d = S.shape
    n = start + np.arange(1, m + 1)
    L = truncation_levels(n, d, payload["theta"], payload["max_degree"])
    eta = step_sizes(n, payload["eta0"], payload["t"])
    Y = np.asarray(y, dtype=np.float64).reshape(m, -1)
    B = payload["block_size"]
    M = [zonal_profile(S[a : a + B] @ S[a : a + B].T, d, payload["s"], L[a : a + B])
         for a in range(0, m, B)]
    out = {"start": int(start), "level": L, "eta": eta, "Y": Y, "M": M}
    if payload["form"] == "features":
        out["U"] = payload["features"].transform(S)
    else:
        out["S"] = S
    return out


def _segments(start: int, m: int, B: int, record_at: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(block, lo, hi) local row ranges: blocks of B rows, cut at record points."""
    cuts = sorted({*range(0, m, B), m, *(r - start for r in record_at if start < r < start + m)})
    return [(a // B, a, b) for a, b in itertools.pairwise(cuts)]


def _solve_block(Mb: np.ndarray, eta: np.ndarray, resid: np.ndarray) -> np.ndarray:
    """r from (I + diag(eta) tril(M, -1)) r = eta * (p - y)."""
    A = eta[:, None] * np.tril(Mb, -1)
    return solve_triangular(A, eta[:, None] * resid, lower=True, unit_diagonal=True,
                            check_finite=False)


def sphere_fold(state: dict, prep: dict, payload: dict) -> dict[str, Any]:
    """Thread the model through one chunk, block by block (exact)."""
    start, B = prep["start"], payload["block_size"]
    if state["n"] != start:
        raise RuntimeError(f"sphere scan out of order: state has {state['n']} rows, "
                           f"chunk starts at {start}")
    record = {r: i for i, r in enumerate(payload["record_at"])}
    m = prep["Y"].shape[0]
    features = payload["form"] == "features"
    if features:
        W = payload["features"].level_weights()
        coef, coef_sum = state["coef"].copy(), state["coef_sum"].copy()
        recorded = state["recorded"].copy()
    else:
        support, alpha = state["support"].copy(), state["alpha"].copy()
        level = state["level"].copy()
    loss_sum, pass_end = state["loss_sum"].copy(), state["pass_end"].copy()
    n_rows = payload["n_rows"]
    n = start
    for blk, lo, hi in _segments(start, m, B, payload["record_at"]):
        a = blk * B
        Mb = prep["M"][blk][lo - a : hi - a, lo - a : hi - a]
        eta, L, Y = prep["eta"][lo:hi], prep["level"][lo:hi], prep["Y"][lo:hi]
        if features:
            U = prep["U"][lo:hi]
            r = _solve_block(Mb, eta, U @ coef - Y)
            V = U * W[L]
            w = (hi - lo - np.arange(hi - lo))[:, None]  # iterates each update lives in
            coef_sum += (hi - lo) * coef - V.T @ (w * r)
            coef -= V.T @ r
        else:
            S = prep["S"][lo:hi]
            p = _kernel_eval(S, support[:n], alpha[:n], level[:n], payload["d"], payload["s"])
            r = _solve_block(Mb, eta, p - Y)
            support[n : n + hi - lo], alpha[n : n + hi - lo], level[n : n + hi - lo] = S, -r, L
        # r_i = eta_i (f_{i-1}(x_i) - y_i): the progressive (test-then-train) residual
        np.add.at(loss_sum, np.minimum((n + np.arange(hi - lo)) // n_rows, len(loss_sum) - 1),
                  ((r / eta[:, None]) ** 2).mean(axis=1))
        n += hi - lo
        if features and n in record:
            recorded[record[n]] = coef_sum / (n + 1)
    if n % n_rows == 0 and n > start:  # a pass ended with this chunk
        pass_end[min(n // n_rows, len(pass_end)) - 1] = time.time()
    history = {"loss_sum": loss_sum, "pass_end": pass_end}
    if features:
        return {"coef": coef, "coef_sum": coef_sum, "n": n, "recorded": recorded, **history}
    return {"support": support, "alpha": alpha, "level": level, "n": n, **history}


def _kernel_eval(S: np.ndarray, support: np.ndarray, alpha: np.ndarray, level: np.ndarray,
                 d: int, s: float) -> np.ndarray:
    """sum_i alpha_i K^{L_i}(x_i, S) in row tiles of the support."""
    out = np.zeros((S.shape[0], alpha.shape[1]))
    for a in range(0, support.shape[0], _TILE):
        tile = slice(a, a + _TILE)
        out += zonal_profile(S @ support[tile].T, d, s, level[tile]) @ alpha[tile]
    return out


def averaged_kernel_coefficients(alpha: np.ndarray, N: int) -> np.ndarray:
    """Polyak average in the kernel form: point i (1-based) is in f_i+1 .. f_N,
    so bar f_N = sum_i alpha_i (N + 1 - i) / (N + 1) K^{L_i}(x_i, .)."""
    i = np.arange(1, N + 1)
    return alpha[:N] * ((N + 1 - i) / (N + 1))[:, None]


def kernel_diagonal(d: int, s: float, L: int) -> float:
    """K^L(x, x) = sum_{k <= L} mu_k dim H_k (the step-size bound's constant)."""
    return float(zonal_weights(L, d, s).sum())


def check_step(eta0: float, d: int, s: float, L: int) -> None:
    """eta K^L(x, x) < 2 is needed for each single-point step to contract (docs/design.md §2.6)."""
    kxx = kernel_diagonal(d, s, L)
    if eta0 * kxx >= 2.0:
        raise ValueError(
            f"eta0={eta0} is too large: eta0 * K^L(x, x) = {eta0 * kxx:.3g} >= 2 for L={L}, so "
            f"single steps overshoot; use eta0 < {2.0 / kxx:.3g} (or a larger s)")


def fingerprint(payload: dict) -> dict:
    keys = ("d", "s", "theta", "eta0", "t", "max_degree", "max_level", "n_total", "n_outputs",
            "form", "input_map", "scale", "block_size", "record_at")
    return {"solver": "sphere",
            **{k: (list(payload[k]) if k == "record_at" else payload[k]) for k in keys},
            "version": 2}
