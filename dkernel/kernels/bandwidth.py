"""Scale heuristics computed on a small sample of rows: the bandwidth, and the
top eigenvalue of the kernel operator that bounds stable step sizes."""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import pdist


def median_heuristic(sample: np.ndarray, kernel: str) -> float:
    """Bandwidth that puts the kernel's exponent at 1 for the median pair of ``sample``.

    gaussian: s = median |x - z|_2 / sqrt(2) (so |x - z|^2 / (2 s^2) = 1);
    laplacian: s = median |x - z|_1.  cauchy, which has no exponent, takes the
    gaussian's s: at the median pair it is 1/3 in one dimension and falls
    towards e^-2 in many (0.19 at d = 10, 0.14 at d = 100).  Only non-zero distances count, so
    duplicated rows (common in image data) do not drive the bandwidth to zero.
    """
    S = np.asarray(sample, dtype=np.float64)
    if S.shape[0] < 2:
        raise ValueError(
            f"bandwidth='auto' needs at least 2 rows to compare, got {S.shape[0]}; "
            "pass a numeric bandwidth instead"
        )
    iu = np.triu_indices(S.shape[0], k=1)
    if kernel == "laplacian":
        # condensed, in C: the n x n x d differences were 6 GB for 1000 rows of 784
        d = pdist(S, "cityblock")
    else:
        S = S - S.mean(axis=0)  # |x|^2 + |z|^2 - 2 x.z cancels far from the origin
        sq = (S * S).sum(1)
        d = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2 * S @ S.T, 0))[iu]
    d = d[d > 0]
    if d.size == 0:
        raise ValueError(
            "bandwidth='auto' failed: all sampled rows of X are identical; "
            "pass a numeric bandwidth"
        )
    med = float(np.median(d))
    return med if kernel == "laplacian" else med / np.sqrt(2.0)


def top_eigenvalue(sample: np.ndarray, kernel: str, bandwidth: float,
                   center: bool = False) -> float:
    """lambda_1 of the empirical kernel operator K(S, S) / |S| (centred: of
    H K H / |S|, H = I - 11^T / |S|, the operator kernel PCA diagonalises).

    Gradient steps on a kernel model are stable for step * curvature *
    lambda_1 < 2 (Ma & Belkin 2017, section 3), so this sets the scale of a
    default step size.  A 1000-row sample estimates it to a few percent.
    """
    from dkernel.kernels.exact import kernel_matrix

    S = np.asarray(sample, dtype=np.float64)
    return gram_top_eigenvalue(kernel_matrix(S, S, kernel, bandwidth), center)


def gram_top_eigenvalue(G: np.ndarray, center: bool = False) -> float:
    """lambda_1 of the Gram matrix ``G`` of a sample over its size (centred
    first when ``center``)."""
    from scipy.linalg import eigh

    G = np.asarray(G, dtype=np.float64)
    if center:
        G = G - G.mean(axis=0) - G.mean(axis=1)[:, None] + G.mean()
    n = G.shape[0]
    return float(eigh(G / n, eigvals_only=True, subset_by_index=[n - 1, n - 1])[0])
