r"""Zonal kernels on the sphere S^{d-1} (Bai & Shi, eqs. 2.1-2.2; docs/design.md §2.6).

The reproducing kernel of the spherical harmonics of degree k (with respect
to the *normalised* surface measure) is

.. math::  Z_k(x, y) = \frac{k + \lambda}{\lambda} C_k^\lambda(\langle x, y\rangle)
           = \dim\mathcal H_k \; P_k(\langle x, y\rangle),
           \qquad \lambda = \frac{d - 2}{2},

with :math:`P_k = C_k^\lambda / C_k^\lambda(1)` the Gegenbauer polynomial
normalised to ``P_k(1) = 1`` (so ``|P_k| <= 1`` on [-1, 1]); for d = 2 it is
the Chebyshev polynomial (``Z_k = 2 cos(k angle)``), for d = 3 Legendre's.
The kernel of the paper and its truncation at level L are

.. math::  K = \sum_k \mu_k Z_k, \qquad K^L = \sum_{k \le L} \mu_k Z_k,
           \qquad \mu_k = (\dim \Pi_k)^{-2s},

with :math:`\Pi_k` the spherical polynomials of degree <= k.

Why the normalised recurrence: the explicit sum of C_k^lambda has terms of
size ~2^k and alternating signs, so it loses every digit past degree ~40, and
C_k^lambda(1) = (2 lambda)_k / k! itself overflows float64 for large d and k.
The three-term recurrence for P_k,

.. math::  P_{k+1}(t) = \frac{2(k + \lambda) t P_k(t) - k P_{k-1}(t)}{k + 2\lambda},
           \qquad P_0 = 1, \; P_1 = t,

only combines numbers of size <= 1 (it is the forward recurrence of the
minimal-growth solution on [-1, 1]) and is accurate to a few ulps times k.
The weights mu_k dim H_k are formed in log space from exact integer
dimension counts, so they stay finite for any d (dim Pi_k overflows float64
only in the exponent, not in ``math.log`` of a Python int).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from dkernel.backend import namespace

__all__ = [
    "ZonalFeatures",
    "dim_harmonics",
    "dim_polynomials",
    "gegenbauer",
    "gegenbauer_monomial_coefficients",
    "gegenbauer_normalized",
    "zonal_kernel",
    "zonal_profile",
    "zonal_weights",
]


def _check_d(d: int) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 2:
        raise ValueError(f"the sphere S^(d-1) needs an ambient dimension d >= 2, got d={d!r}")
    return int(d)


def dim_harmonics(k: int, d: int) -> int:
    """dim H_k on S^{d-1}: C(k+d-1, d-1) - C(k+d-3, d-1), an exact integer."""
    d = _check_d(d)
    if k < 0:
        return 0
    if d == 2:
        return 1 if k == 0 else 2
    if d == 3:
        return 2 * k + 1
    return math.comb(k + d - 1, d - 1) - (math.comb(k + d - 3, d - 1) if k >= 2 else 0)


def dim_polynomials(L: int, d: int) -> int:
    """dim Pi_L on S^{d-1} = sum_{k <= L} dim H_k = C(L+d-1, d-1) + C(L+d-2, d-1)."""
    d = _check_d(d)
    if L < 0:
        return 0
    return math.comb(L + d - 1, d - 1) + (math.comb(L + d - 2, d - 1) if L >= 1 else 0)


def _lam(d: int) -> float:
    return (_check_d(d) - 2) / 2.0


def gegenbauer_normalized(L: int, d: int, t: Any) -> Any:
    """P_0(t), ..., P_L(t) stacked on a new first axis (shape ``(L+1,) + t.shape``).

    ``P_k = C_k^lambda / C_k^lambda(1)``, lambda = (d-2)/2, by the normalised
    three-term recurrence (module docstring); t is clipped to [-1, 1] first
    (inner products of unit vectors exceed 1 by rounding).
    """
    xp = namespace(t)
    t = xp.clip(xp.asarray(t, dtype=np.float64), -1.0, 1.0)
    out = xp.empty((L + 1,) + t.shape, dtype=np.float64)
    for k, P in enumerate(_recurrence(L, d, t)):
        out[k] = P
    return out


def _recurrence(L: int, d: int, t: Any):
    """Yield P_0(t) ... P_L(t) without keeping them all (O(size of t) memory)."""
    lam = _lam(d)
    xp = namespace(t)
    prev, cur = None, xp.ones_like(t)
    yield cur
    if L == 0:
        return
    prev, cur = cur, t.copy()
    yield cur
    for k in range(1, L):
        if d == 2:  # Chebyshev: T_{k+1} = 2 t T_k - T_{k-1}
            nxt = 2.0 * t * cur - prev
        elif d == 3:  # Legendre: (k+1) P_{k+1} = (2k+1) t P_k - k P_{k-1}
            nxt = ((2 * k + 1) * t * cur - k * prev) / (k + 1)
        else:
            nxt = (2.0 * (k + lam) * t * cur - k * prev) / (k + 2.0 * lam)
        prev, cur = cur, nxt
        yield cur


def gegenbauer(k: int, lam: float, t: Any) -> Any:
    """The classical (unnormalised) Gegenbauer polynomial C_k^lam(t), lam > 0 or lam = 0.

    Evaluated as C_k^lam(1) * P_k(t) with C_k^lam(1) = (2 lam)_k / k! formed in log
    space, so it is accurate wherever the value is representable (for lam = 0 this
    is the limit convention C_k^0 = (2/k) T_k of scipy, C_0^0 = 1).
    """
    if lam < 0:
        raise ValueError(f"gegenbauer needs lam >= 0, got {lam!r}")
    P = _normalized_single(k, lam, t)
    if lam == 0:
        return P if k == 0 else (2.0 / k) * P
    log_c1 = math.lgamma(2 * lam + k) - math.lgamma(2 * lam) - math.lgamma(k + 1)
    return math.exp(log_c1) * P


def _normalized_single(k: int, lam: float, t: Any) -> Any:
    xp = namespace(t)
    t = xp.clip(xp.asarray(t, dtype=np.float64), -1.0, 1.0)
    prev, cur = xp.ones_like(t), t.copy()
    if k == 0:
        return prev
    for j in range(1, k):
        if lam == 0:
            prev, cur = cur, 2.0 * t * cur - prev
        else:
            prev, cur = cur, (2.0 * (j + lam) * t * cur - j * prev) / (j + 2.0 * lam)
    return cur


def zonal_weights(L: int, d: int, s: float) -> np.ndarray:
    """w_k = mu_k dim H_k = exp(log dim H_k - 2 s log dim Pi_k), k = 0..L (float64).

    ``K^L(x, y) = sum_k w_k P_k(<x, y>)``; ``K^L(x, x) = sum_k w_k``.
    """
    d = _check_d(d)
    return np.array([math.exp(math.log(dim_harmonics(k, d))
                              - 2.0 * s * math.log(dim_polynomials(k, d)))
                     for k in range(L + 1)], dtype=np.float64)


def zonal_profile(t: Any, d: int, s: float, levels: Any) -> Any:
    """K^{L}(t) = sum_{k <= L} w_k P_k(t) with a level per column of ``t``.

    ``t`` is a (m, p) array of inner products and ``levels`` an int array of
    length p (one truncation level per column, e.g. per training point), or
    an int applying to every column.
    """
    xp = namespace(t)
    t = xp.asarray(t, dtype=np.float64)
    lv = np.broadcast_to(np.asarray(levels, dtype=np.int64), t.shape[-1:])
    L = int(lv.max()) if lv.size else 0
    w = zonal_weights(L, d, s)
    out = xp.zeros_like(t)
    for k, P in enumerate(_recurrence(L, d, xp.clip(t, -1.0, 1.0))):
        wk = xp.asarray(np.where(lv >= k, w[k], 0.0))
        out += P * wk
    return out


def zonal_kernel(X: Any, Z: Any, *, d: int | None = None, s: float = 1.0, degree: Any = 0) -> Any:
    """K^L(X, Z) for rows of X and Z on the unit sphere (float64).

    ``degree`` is the truncation level L: an int, or one level per row of Z.
    """
    xp = namespace(X)
    X = on_sphere(xp.asarray(X, dtype=np.float64), "X")
    Z = on_sphere(xp.asarray(Z, dtype=np.float64), "Z")
    d = X.shape[1] if d is None else d
    return zonal_profile(X @ Z.T, d, s, degree)


def on_sphere(X: Any, name: str = "X", tol: float = 1e-4) -> Any:
    """``X`` if its rows have unit length (to ``tol``), else a ValueError: the
    zonal kernel and its features are defined on the sphere, and off it each
    form extended it differently (at |x| = 2 the kernel clipped x.z, the
    harmonic features gave 47 and the monomial ones 23 for k(x, x) = 1.3)."""
    xp = namespace(X)
    if X.shape[0]:
        norms = xp.sqrt((X * X).sum(axis=1))
        low, high = float(norms.min()), float(norms.max())
        if not (abs(low - 1) <= tol and abs(high - 1) <= tol):
            raise ValueError(f"rows of {name} must lie on the unit sphere (|x| = 1), got "
                             f"lengths {low:.4g} to {high:.4g}: divide each row by its norm, "
                             "or fit a SphereRegressor, which maps its inputs to the sphere")
    return X


def gegenbauer_monomial_coefficients(L: int, d: int) -> np.ndarray:
    """Exact monomial coefficients p[k, j] of P_k(t) = sum_j p[k, j] t^j, k, j <= L.

    Computed with rational arithmetic (lambda = (d-2)/2 is rational), then
    rounded once to float64.  Used by the polynomial (monomial feature) form of
    T-kernel SGD; the expansion itself is only well conditioned for low L
    (|p[k, j]| grows like ~2^k), which is why that form is restricted to low L.
    """
    d = _check_d(d)
    lam = Fraction(d - 2, 2)
    rows: list[list[Fraction]] = [[Fraction(1)]]
    if L >= 1:
        rows.append([Fraction(0), Fraction(1)])
    for k in range(1, L):
        a = 2 * (k + lam) / (k + 2 * lam) if d != 2 else Fraction(2)
        b = Fraction(k) / (k + 2 * lam) if d != 2 else Fraction(1)
        nxt = [Fraction(0)] * (k + 2)
        for j, c in enumerate(rows[k]):
            nxt[j + 1] += a * c
        for j, c in enumerate(rows[k - 1]):
            nxt[j] -= b * c
        rows.append(nxt)
    out = np.zeros((L + 1, L + 1), dtype=np.float64)
    for k, r in enumerate(rows[: L + 1]):
        out[k, : len(r)] = [float(c) for c in r]
    return out


# --------------------------------------------------------------------------
# Finite-dimensional (feature) form: K^L(x, y) = sum_f W[L, f] u_f(x) u_f(y)
# --------------------------------------------------------------------------

class ZonalFeatures:
    r"""A basis u(x) of the spherical polynomials of degree <= ``degree`` with
    a diagonal weight table W such that, for every L <= degree,

    .. math::  K^L(x, y) = \sum_f W[L, f] \, u_f(x) u_f(y).

    kind="harmonic" (d = 2, 3): real spherical harmonics normalised by
        :math:`\sum_m Y_{km}(x)^2 = \dim H_k`, so ``W[L, f] = mu_k [k <= L]``;
        d = 2 uses sqrt(2) cos / sin(k angle), d = 3 the 4pi-normalised
        associated Legendre recurrence.  Stable for any degree.  F = dim Pi_L.
    kind="monomial" (any d; the paper's Algorithm 2): scaled monomials
        :math:`u_\alpha = \sqrt{|\alpha|!/\alpha!}\, x^\alpha`, |alpha| <= degree,
        so that :math:`\langle x, y\rangle^j = \sum_{|\alpha|=j} u_\alpha(x) u_\alpha(y)`
        and ``W[L, alpha] = sum_{k<=L} w_k p[k, |alpha|]`` with the exact
        monomial coefficients p of P_k.  W has mixed signs and its size grows
        like 2^L, so this form is for low degree.  F = C(degree + d, d).
    """

    def __init__(self, d: int, degree: int, s: float, kind: str = "auto") -> None:
        self.d, self.degree, self.s = _check_d(d), int(degree), float(s)
        if kind == "auto":
            kind = "harmonic" if self.d <= 3 else "monomial"
        if kind not in ("harmonic", "monomial"):
            raise ValueError(f"kind must be 'harmonic', 'monomial' or 'auto', got {kind!r}")
        if kind == "harmonic" and self.d > 3:
            raise ValueError(f"harmonic features are implemented for d = 2, 3 only, got d={self.d}")
        self.kind = kind
        if kind == "harmonic":
            self.feature_degree = np.repeat(np.arange(self.degree + 1),
                                            [dim_harmonics(k, self.d)
                                             for k in range(self.degree + 1)])
        else:
            self._build_monomials()

    @staticmethod
    def n_features_for(d: int, degree: int, kind: str) -> int:
        """Feature count F without building anything (exact integer)."""
        if kind == "harmonic":
            return dim_polynomials(degree, d)
        return math.comb(degree + d, d)

    @property
    def n_features(self) -> int:
        return int(self.feature_degree.size)

    def to_dict(self) -> dict:
        return {"d": self.d, "degree": self.degree, "s": self.s, "kind": self.kind}

    def __getstate__(self) -> dict:
        return self.to_dict()

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    # -- monomial bookkeeping --------------------------------------------------
    def _build_monomials(self) -> None:
        d, L = self.d, self.degree
        parents, last = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        scale, degs = [np.ones(1)], [0]
        prev_last = np.array([0], dtype=np.int64)  # degree 0: "last variable" 0 allows any next
        prev_counts = [np.zeros(d, dtype=np.int64)]
        offset_prev, offset = 0, 1
        for j in range(1, L + 1):
            par, lv, sc, counts = [], [], [], []
            for q in range(prev_last.size):
                for i in range(int(prev_last[q]), d):
                    par.append(offset_prev + q)
                    lv.append(i)
                    c = prev_counts[q].copy()
                    c[i] += 1
                    counts.append(c)
                    sc.append(math.sqrt(math.factorial(j)
                                        / math.prod(math.factorial(int(v)) for v in c)))
            parents.append(np.array(par, dtype=np.int64))
            last.append(np.array(lv, dtype=np.int64))
            scale.append(np.array(sc))
            degs += [j] * len(par)
            prev_last, prev_counts = np.array(lv, dtype=np.int64), counts
            offset_prev, offset = offset, offset + len(par)
        self._parents, self._last = parents, last
        self._scale = np.concatenate(scale)
        self.feature_degree = np.array(degs, dtype=np.int64)

    # -- evaluation --------------------------------------------------------------
    def transform(self, X: Any) -> Any:
        """u(X), shape (m, F), float64; rows of X are points on the sphere."""
        xp = namespace(X)
        X = xp.asarray(X, dtype=np.float64)
        if X.shape[1] != self.d:
            raise ValueError(f"points have {X.shape[1]} coordinates, the features expect "
                             f"d={self.d}")
        on_sphere(X)
        if self.kind == "monomial":
            return self._monomials(X)
        return self._harmonics_2(X) if self.d == 2 else self._harmonics_3(X)

    def _monomials(self, X: Any) -> Any:
        xp = namespace(X)
        U = xp.empty((X.shape[0], self.n_features), dtype=np.float64)
        U[:, 0] = 1.0
        start_prev, start = 0, 1
        for j in range(1, self.degree + 1):
            par, lv = self._parents[j], self._last[j]
            U[:, start : start + par.size] = U[:, par] * X[:, lv]
            start_prev, start = start, start + par.size
        del start_prev
        return U * xp.asarray(self._scale)

    def _harmonics_2(self, X: Any) -> Any:
        xp = namespace(X)
        z = X[:, 0] + 1j * X[:, 1]
        U = xp.empty((X.shape[0], self.n_features), dtype=np.float64)
        U[:, 0] = 1.0
        zk = xp.ones_like(z)
        for k in range(1, self.degree + 1):
            zk = zk * z
            U[:, 2 * k - 1] = math.sqrt(2.0) * zk.real
            U[:, 2 * k] = math.sqrt(2.0) * zk.imag
        return U

    def _harmonics_3(self, X: Any) -> Any:
        # Ybar_lm = Q_lm(t) * Re/Im (x + i y)^m with Q_lm = Pbar_lm(t) / sin^m, the
        # 4pi-normalised associated Legendre functions divided by sin^m (no
        # division by sin at the poles); mean square of every Ybar_lm is 1.
        xp = namespace(X)
        t = X[:, 2]
        z = X[:, 0] + 1j * X[:, 1]
        L = self.degree
        U = xp.empty((X.shape[0], self.n_features), dtype=np.float64)
        zm = [xp.ones_like(z)]
        for _ in range(L):
            zm.append(zm[-1] * z)
        Q: dict[tuple[int, int], Any] = {}
        qmm = xp.ones_like(t)
        for m in range(L + 1):
            if m == 1:
                qmm = math.sqrt(3.0) * xp.ones_like(t)
            elif m >= 2:
                qmm = math.sqrt((2 * m + 1) / (2 * m)) * qmm
            Q[m, m] = qmm
            if m + 1 <= L:
                Q[m + 1, m] = math.sqrt(2 * m + 3) * t * qmm
            for ell in range(m + 2, L + 1):
                a = math.sqrt((2 * ell - 1) * (2 * ell + 1) / ((ell - m) * (ell + m)))
                b = math.sqrt((2 * ell + 1) * (ell + m - 1) * (ell - m - 1)
                              / ((ell - m) * (ell + m) * (2 * ell - 3)))
                Q[ell, m] = a * t * Q[ell - 1, m] - b * Q[ell - 2, m]
        col = 0
        for ell in range(L + 1):
            U[:, col] = Q[ell, 0]
            col += 1
            for m in range(1, ell + 1):
                # the (2 - delta_m0) of the real basis is already inside Pbar_lm
                U[:, col] = Q[ell, m] * zm[m].real
                U[:, col + 1] = Q[ell, m] * zm[m].imag
                col += 2
        return U

    def level_weights(self) -> np.ndarray:
        """W, shape (degree + 1, F): row L is the diagonal of K^L in this basis."""
        w = zonal_weights(self.degree, self.d, self.s)
        Ls = np.arange(self.degree + 1)[:, None]
        if self.kind == "harmonic":
            mu = w / np.array([dim_harmonics(k, self.d) for k in range(self.degree + 1)])
            return np.where(self.feature_degree[None, :] <= Ls,
                            mu[self.feature_degree][None, :], 0.0)
        p = gegenbauer_monomial_coefficients(self.degree, self.d)  # p[k, j]
        b = np.cumsum(w[:, None] * p, axis=0)  # b[L, j] = sum_{k<=L} w_k p[k, j]
        return b[:, self.feature_degree]
