"""Fashion-MNIST stores for benchmarks: ingested once with dkernel's own ingest."""

from __future__ import annotations

import os

import numpy as np


def fashion_stores(folder: str) -> tuple[str, str]:
    """(train.zarr, test.zarr) under ``folder``, ingesting from the idx files if needed."""
    from dkernel.data.ingest import ingest_fashion_mnist

    train, test = os.path.join(folder, "train.zarr"), os.path.join(folder, "test.zarr")
    if not (os.path.exists(train) and os.path.exists(test)):
        ingest_fashion_mnist(folder)
    return train, test


def load_arrays(store: str) -> tuple[np.ndarray, np.ndarray]:
    import zarr

    g = zarr.open_group(store, mode="r")
    return g["X"][:], g["y"][:]
