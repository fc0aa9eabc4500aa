"""Small synthetic problems for tests, examples and out-of-core checks."""

from __future__ import annotations

import os

import numpy as np

from dkernel.data.store import write_store


def make_dai_ridge(n: int, d: int = 2, noise: float = 0.1, random_state: int = 0,
                   dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    """Dai et al. 2014 synthetic ridge problem (section 7):
    x ~ N(0, I_d), y = cos(0.5 pi |x|) exp(-0.1 pi |x|) + noise * e."""
    rng = np.random.default_rng(random_state)
    X = rng.standard_normal((n, d))
    r = np.linalg.norm(X, axis=1)
    y = np.cos(0.5 * np.pi * r) * np.exp(-0.1 * np.pi * r) + noise * rng.standard_normal(n)
    return X.astype(dtype), y.astype(dtype)


def make_blobs_classification(n: int, d: int = 10, n_classes: int = 3, random_state: int = 0,
                              dtype: str = "float32", concept: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Non-linear classes: the argmax of smooth random scores (a sine of a random
    projection plus a quadratic term), so a linear model cannot fit them.

    ``random_state`` draws the points; ``concept`` draws the labelling rule, so
    train and test sets made with different ``random_state`` share one rule.
    """
    A = np.random.default_rng([concept, 0xC0]).standard_normal((n_classes, d)) / np.sqrt(d)
    X = np.random.default_rng(random_state).standard_normal((n, d))
    score = np.sin(2 * X @ A.T) + 0.5 * (X[:, : n_classes] ** 2 - 1)
    y = score.argmax(axis=1)
    return X.astype(dtype), y.astype(np.int64)


def make_store(path: str | os.PathLike, n: int, d: int = 10, *, chunk_rows: int = 4096,
               kind: str = "classification", random_state: int = 0, overwrite: bool = False) -> str:
    """Write a synthetic dataset store of any size chunk by chunk (memory: one chunk)."""
    import dask.array as da

    def block(i: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
        if kind == "classification":
            return make_blobs_classification(rows, d, random_state=random_state * 100003 + i)
        return make_dai_ridge(rows, d, random_state=random_state * 100003 + i)

    sizes = [min(chunk_rows, n - s) for s in range(0, n, chunk_rows)]
    import dask

    parts = [dask.delayed(block, nout=2)(i, r) for i, r in enumerate(sizes)]
    ydt = np.int64 if kind == "classification" else np.float32
    X = da.concatenate([da.from_delayed(p[0], (r, d), np.float32) for p, r in zip(parts, sizes)])
    y = da.concatenate([da.from_delayed(p[1], (r,), ydt) for p, r in zip(parts, sizes)])
    return write_store(path, X, y, chunk_rows=chunk_rows, overwrite=overwrite)
