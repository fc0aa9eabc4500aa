"""Exact shift-invariant kernels, evaluated tile by tile in the input's dtype.

=========  =======================================  ==============================
kernel     k(x, z)                                  spectral density (docs/design.md §2.1)
=========  =======================================  ==============================
gaussian   exp(-|x - z|_2^2 / (2 s^2))              w ~ N(0, s^-2 I)
laplacian  exp(-|x - z|_1 / s)                      w_j ~ Cauchy(0, 1/s)
cauchy     prod_j (1 + (x_j - z_j)^2 / s^2)^-1      w_j ~ Laplace(0, 1/s)
=========  =======================================  ==============================
"""

from __future__ import annotations

from typing import Any

from dkernel.backend import namespace

KERNELS = ("gaussian", "laplacian", "cauchy")

# Pairwise L1 / product kernels need an (n, p, d) intermediate; this bounds it.
_TILE_ELEMENTS = 1 << 22


def check_kernel(kernel: str, name: str = "kernel") -> str:
    if kernel not in KERNELS:
        raise ValueError(
            f"{name}={kernel!r} is not supported; choose one of {', '.join(KERNELS)}"
        )
    return kernel


def _sq_dist(X: Any, Z: Any) -> Any:
    """|x - z|^2 by the expansion, about Z's mean: far from the origin the
    expansion's terms would cancel (solvers.kernel_rows.centers_payload)."""
    xp = namespace(X)
    if Z.shape[0] and X.dtype.itemsize < 8:
        # float64 keeps ~1e-10 of a 1e3 offset's 1e6 terms, and its results stay
        # bit for bit those of earlier versions (a resumed fit's step size comes
        # from k(S, S)); float32 needs the shift
        m = Z.mean(axis=0)
        X, Z = (X - m,) * 2 if Z is X else (X - m, Z - m)
    xx = (X * X).sum(axis=1)[:, None]
    zz = (Z * Z).sum(axis=1)[None, :]
    d2 = xx + zz - 2 * (X @ Z.T)
    return xp.maximum(d2, 0, out=d2)


def kernel_matrix(X: Any, Z: Any, kernel: str, bandwidth: float) -> Any:
    """k(X, Z) as an (n, p) array in the dtype of ``X``."""
    check_kernel(kernel)
    xp = namespace(X)
    Z = Z.astype(X.dtype, copy=False)
    s = X.dtype.type(bandwidth)
    if kernel == "gaussian":
        K = _sq_dist(X, Z)
        K *= X.dtype.type(-0.5) / (s * s)
        return xp.exp(K, out=K)
    n, p = X.shape[0], Z.shape[0]
    out = xp.empty((n, p), dtype=X.dtype)
    rows = max(1, _TILE_ELEMENTS // max(1, p * X.shape[1]))
    for i in range(0, n, rows):
        diff = X[i : i + rows, None, :] - Z[None, :, :]
        if kernel == "laplacian":
            out[i : i + rows] = xp.exp(-xp.abs(diff).sum(axis=2) / s)
        else:  # cauchy: product over coordinates, via a sum of logs for stability
            out[i : i + rows] = xp.exp(-xp.log1p((diff / s) ** 2).sum(axis=2))
    return out


def kernel_diagonal_max(kernel: str) -> float:
    """beta = max_x k(x, x); 1 for every normalised shift-invariant kernel here."""
    check_kernel(kernel)
    return 1.0
