"""Points on the sphere S^{d-1} with polynomial regression targets (docs/design.md §3)."""

from __future__ import annotations

import numpy as np


def uniform_sphere(n: int, d: int = 3, random_state: int = 0) -> np.ndarray:
    """n points uniform on S^{d-1} (normalised Gaussians), float64."""
    if d < 2:
        raise ValueError(f"the sphere S^(d-1) needs d >= 2, got d={d}")
    X = np.random.default_rng(random_state).standard_normal((n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def sphere_polynomial_target(X: np.ndarray, degree: int = 10) -> np.ndarray:
    r"""The polynomial target of Bai & Shi's S^2 experiment (section 5.2), for any d:

    .. math:: f^*(x) = 1 + \sum_{j=1}^{J} (j+1)^{-3/2} \sum_{k=0}^{j} h_k(x_{d-1}, x_d),
              \qquad h_k(a, b) = \sum_{i=0}^{k} a^{k-i} b^i,

    J = ``degree`` (10 in the paper), on the last two coordinates (x_2, x_3 on S^2).
    """
    a, b = X[:, -2].astype(np.float64), X[:, -1].astype(np.float64)
    h = [np.ones_like(a)]  # h_k(a, b) = a h_{k-1} + b^k
    bk = np.ones_like(b)
    for _ in range(degree):
        bk = bk * b
        h.append(a * h[-1] + bk)
    cum = np.cumsum(h, axis=0)  # cum[j] = sum_{k<=j} h_k
    f = np.ones_like(a)
    for j in range(1, degree + 1):
        f += (j + 1) ** -1.5 * cum[j]
    return f


def make_sphere_polynomial(n: int, d: int = 3, degree: int = 10, noise: float = 0.2,
                           random_state: int = 0, dtype: str = "float64"
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X uniform on S^{d-1}, y = f*(X) + U[-noise, noise]; returns (X, y, f*(X)).

    The noiseless f*(X) is returned so that test error can be measured as the
    excess risk |bar f - f*|^2, as in the paper's learning curves.
    """
    rng = np.random.default_rng([int(random_state), 0x5F3E])
    X = uniform_sphere(n, d, random_state=int(rng.integers(2**31)))
    f = sphere_polynomial_target(X, degree)
    y = f + rng.uniform(-noise, noise, size=n)
    return X.astype(dtype), y.astype(dtype), f.astype(dtype)
