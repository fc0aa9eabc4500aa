"""Small synthetic problems for tests, examples and out-of-core checks."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dkernel.files import expands_user


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
                              dtype: str = "float32", concept: int = 0,
                              ) -> tuple[np.ndarray, np.ndarray]:
    """Non-linear classes: the argmax of smooth random scores (a sine of a random
    projection plus a quadratic term), so a linear model cannot fit them.

    ``random_state`` draws the points; ``concept`` draws the labelling rule, so
    train and test sets made with different ``random_state`` share one rule.
    """
    A = np.random.default_rng([concept, 0xC0]).standard_normal((n_classes, d)) / np.sqrt(d)
    X = np.random.default_rng(random_state).standard_normal((n, d))
    # class j's quadratic term is on input j (inputs reused when d < n_classes)
    score = np.sin(2 * X @ A.T) + 0.5 * (X[:, np.arange(n_classes) % d] ** 2 - 1)
    y = score.argmax(axis=1)
    return X.astype(dtype), y.astype(np.int64)


def _write_chunk(target: str, i: int, start: int, rows: int, d: int, kind: str,
                 random_state: int) -> int:
    """Generate chunk ``i`` and write it into the store at ``target`` (on a worker)."""
    import zarr

    make = make_blobs_classification if kind == "classification" else make_dai_ridge
    X, y = make(rows, d, random_state=random_state * 100003 + i)
    # every chunk, as create_array promised (zarr leaves out chunks of fill values;
    # its config.set would be process-wide, across a worker's threads)
    for name, values in (("X", X), ("y", y)):
        array = zarr.open_array(target, path=name, mode="r+")
        array.with_config({"write_empty_chunks": True})[start : start + rows] = values
    return X.nbytes + y.nbytes


@expands_user("path")
def make_store(path: str | os.PathLike, n: int, d: int = 10, *, chunk_rows: int = 4096,
               kind: str = "classification", random_state: int = 0, overwrite: bool = False,
               client: Any = None, progress: bool = False) -> str:
    """Write a synthetic dataset store of any size: one task per chunk, run on
    the cluster's workers in parallel (each holds one chunk at a time), into
    a temporary store renamed into place when every chunk is written.

    ``kind``: "classification" (:func:`make_blobs_classification`) or
    "regression" (:func:`make_dai_ridge`).  Chunk i depends only on
    (random_state, i, its rows), so the data do not depend on the cluster.
    ``client``: the cluster that writes it; None writes it in this process,
    chunk by chunk (small stores, tests).
    """
    from dkernel.data.store import (
        atomic_store,
        create_array,
        require_shared,
        run_writes,
        store_location,
    )
    from dkernel.engine.progress import Progress

    if kind not in ("classification", "regression"):
        raise ValueError(f"kind={kind!r}; choose 'classification' or 'regression'")
    if n < 1 or d < 1 or chunk_rows < 1:
        raise ValueError(f"rows, inputs and chunk rows must be >= 1, got {n}, {d}, {chunk_rows}")
    ydt = np.int64 if kind == "classification" else np.float32
    starts = list(range(0, n, chunk_rows))
    with atomic_store(path, overwrite) as group:
        create_array(group, "X", (n, d), np.float32, chunk_rows)
        create_array(group, "y", (n,), ydt, chunk_rows)
        target = store_location(group, path)
        args = [(target, i, s0, min(chunk_rows, n - s0), d, kind, int(random_state))
                for i, s0 in enumerate(starts)]
        bar = Progress(len(args), "make-store", progress, unit="chunks")
        if client is None:
            for a in args:
                _write_chunk(*a)
                bar.update(1)
        else:
            require_shared(client, group, path)
            # a failed chunk fails the whole store (nothing is renamed)
            run_writes(client, [client.submit(_write_chunk, *a, pure=False) for a in args],
                       each=lambda _: bar.update(1), label=f"writing {os.fspath(path)!r}")
        bar.close()
    return os.fspath(path)
