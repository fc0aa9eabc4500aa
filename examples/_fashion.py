"""Shared by the examples: the small-mode switch and Fashion-MNIST.

``DKERNEL_EXAMPLE_SMALL=1`` shrinks every example to small synthetic data
(how the test suite runs them).  Fashion-MNIST is read by dkernel's own
ingest (``dkernel ingest fashion-mnist``), from the idx files that
``apt-get install dataset-fashion-mnist`` puts in /usr/share/datasets/fashion-mnist;
in small mode from a synthetic stand-in written in the same idx format, so
the same reader runs.  Without the files, and not in small mode, ingest stops
with an error that says how to install them.
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np

SMALL = os.environ.get("DKERNEL_EXAMPLE_SMALL", "") not in ("", "0")

#: where the examples keep their stores (ingested once, then reused)
DATA = os.environ.get("DKERNEL_EXAMPLE_DATA",
                      "dkernel-example-data" + ("-small" if SMALL else ""))

#: image columns of the left and right half of a 28 x 28 image
LEFT = np.flatnonzero(np.arange(784) % 28 < 14)
RIGHT = np.flatnonzero(np.arange(784) % 28 >= 14)


def size(full, small):
    """``small`` under DKERNEL_EXAMPLE_SMALL=1, else ``full``."""
    return small if SMALL else full


def check(ok: bool, message: str) -> None:
    """Stop the example (non-zero exit) when a result is off."""
    if not ok:
        raise RuntimeError(message)


def fashion_mnist() -> tuple[str, str]:
    """Paths of ``train.zarr`` and ``test.zarr`` (X: pixels / 255, y: class 0-9)."""
    from dkernel.data.ingest import ingest_fashion_mnist

    folder = os.path.join(DATA, "fashion-mnist")
    train, test = os.path.join(folder, "train.zarr"), os.path.join(folder, "test.zarr")
    if not (os.path.exists(train) and os.path.exists(test)):
        source = _write_stand_in(os.path.join(DATA, "idx")) if SMALL else None
        ingest_fashion_mnist(folder, source, overwrite=True)
    return train, test


def arrays(store: str) -> tuple[np.ndarray, np.ndarray]:
    """A store's X and y as NumPy arrays (for scikit-learn and for pictures)."""
    from dkernel.data import open_dataset

    data = open_dataset(store)
    return data.X.compute(), data.y.compute()


def _write_stand_in(folder: str, n_train: int = 1500, n_test: int = 500) -> str:
    """Ten classes of 28 x 28 uint8 images: a smooth random prototype per class
    at a random brightness, plus pixel noise, so both halves of an image carry
    its class and its brightness."""
    rng = np.random.default_rng(0)
    grid = np.linspace(-1, 1, 28)
    prototypes = []
    for _ in range(10):
        cx, cy, w = rng.uniform(-0.5, 0.5), rng.uniform(-0.5, 0.5), rng.uniform(0.3, 0.7)
        bump = np.exp(-((grid[:, None] - cy) ** 2 + (grid[None, :] - cx) ** 2) / w ** 2)
        prototypes.append(bump * rng.uniform(120, 255))
    os.makedirs(folder, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        y = rng.integers(0, 10, n).astype(np.uint8)
        brightness = rng.uniform(0.4, 1.2, (n, 1, 1))  # shared by both halves of an image
        X = brightness * np.stack([prototypes[c] for c in y]) + rng.normal(0, 60, (n, 28, 28))
        _write_idx(os.path.join(folder, f"{split}-images-idx3-ubyte.gz"),
                   np.clip(X, 0, 255).astype(np.uint8))
        _write_idx(os.path.join(folder, f"{split}-labels-idx1-ubyte.gz"), y)
    return folder


def _write_idx(path: str, a: np.ndarray) -> None:
    """LeCun's idx format: two zero bytes, 0x08 (uint8), ndim, big-endian dims, data."""
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, a.ndim))
        f.write(struct.pack(f">{a.ndim}I", *a.shape))
        f.write(a.tobytes())
