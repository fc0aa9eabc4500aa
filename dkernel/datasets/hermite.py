r"""Gaussian data whose kernel eigenfunctions are known (Xie et al. 2015, section 7.1).

For x ~ N(0, sigma^2) and the Gaussian kernel exp(-(x - x')^2 / (2 l^2)) the
eigenfunctions of the (uncentred) covariance operator
T f = E_x[k(x, .) f(x)] are Hermite functions (Zhu et al. 1998; Rasmussen &
Williams 2006, section 4.3.1).  With a = 1/(4 sigma^2), b = 1/(2 l^2),
c = sqrt(a^2 + 2ab), A = a + b + c:

.. math::
    \lambda_j = \sqrt{2a/A}\,(b/A)^j, \qquad
    \phi_j(x) = \frac{e^{-(c-a)x^2} H_j(\sqrt{2c}\,x)}{\sqrt{\sqrt{a/c}\;2^j j!}},

orthonormal in L2(N(0, sigma^2)) (H_j the physicists' Hermite polynomials).
In d dimensions (isotropic) eigenfunctions are products over coordinates and
eigenvalues multiply, so equal-degree products tie.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.polynomial.hermite import hermval


def _constants(sigma: float, bandwidth: float) -> tuple[float, float, float, float]:
    a = 1.0 / (4.0 * sigma**2)
    b = 1.0 / (2.0 * bandwidth**2)
    c = math.sqrt(a * a + 2.0 * a * b)
    return a, b, c, a + b + c


def make_hermite(
    n: int, d: int = 1, sigma: float = 1.0, random_state: int = 0, dtype: str = "float32"
) -> np.ndarray:
    """n points x ~ N(0, sigma^2 I_d)."""
    return (sigma * np.random.default_rng(random_state).standard_normal((n, d))).astype(dtype)


def _indices(k: int, d: int, sigma: float, bandwidth: float) -> list[tuple[int, ...]]:
    """Multi-indices of the k largest eigenvalues (ties broken by index order): the
    eigenvalue falls with the total degree sum(j) alone, whatever sigma and bandwidth."""
    # degree <= k - 1 covers the top k in any dimension
    idx = sorted(itertools.product(range(k), repeat=d), key=lambda j: (sum(j), j))
    return idx[:k]


def hermite_eigenvalues(
    k: int, d: int = 1, sigma: float = 1.0, bandwidth: float = 1.0
) -> np.ndarray:
    """The k largest eigenvalues of the covariance operator, descending."""
    a, b, c, A = _constants(sigma, bandwidth)
    return np.array(
        [math.sqrt(2 * a / A) ** d * (b / A) ** sum(j) for j in _indices(k, d, sigma, bandwidth)]
    )


def hermite_eigenfunctions(
    X: np.ndarray, k: int, sigma: float = 1.0, bandwidth: float = 1.0
) -> np.ndarray:
    """Values (n, k) of the top-k eigenfunctions at X (n, d), orthonormal in L2(p)."""
    X = np.asarray(X, dtype=np.float64)
    d = X.shape[1]
    a, b, c, A = _constants(sigma, bandwidth)
    idx = _indices(k, d, sigma, bandwidth)
    top = max(max(j) for j in idx) + 1
    one_d = []  # one_d[j][:, col] = phi_j(X[:, col])
    for j in range(top):
        coeff = np.zeros(j + 1)
        coeff[j] = 1.0
        norm = math.sqrt(math.sqrt(a / c) * 2.0**j * math.factorial(j))
        one_d.append(np.exp(-(c - a) * X**2) * hermval(math.sqrt(2 * c) * X, coeff) / norm)
    out = np.ones((X.shape[0], k))
    for col, j in enumerate(idx):
        for dim, jj in enumerate(j):
            out[:, col] *= one_d[jj][:, dim]
    return out
