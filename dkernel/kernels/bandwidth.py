"""Bandwidth heuristics computed on a small sample of rows."""

from __future__ import annotations

import numpy as np


def median_heuristic(sample: np.ndarray, kernel: str) -> float:
    """Bandwidth that puts the kernel's exponent at 1 for the median pair of ``sample``.

    gaussian / cauchy: s = median |x - z|_2 / sqrt(2) (so |x - z|^2 / (2 s^2) = 1);
    laplacian: s = median |x - z|_1.  Only non-zero distances count, so
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
        d = np.abs(S[:, None, :] - S[None, :, :]).sum(axis=2)[iu]
    else:
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
