"""Seeded random Fourier features (Rahimi & Recht; Dai et al. 2014, Table 1).

A feature block is a pure function of ``(kernel, bandwidth, n_inputs,
block_size, dtype, random_state, stream, block_id)``: any worker regenerates
its weights bit-identically from those numbers, so the coordinator ships
seeds and coefficients, never a d x D weight matrix (docs/design.md §1).
The features cos(X W + b) are the same bits on workers that share a BLAS
kernel; another CPU type sums X W in another order, and they agree to float32
rounding (max 5.4e-6 over four OpenBLAS kernels in the tests).

    phi_w(x) = sqrt(2) cos(w . x + b),   b ~ U[0, 2 pi)

with the frequencies w drawn from the kernel's spectral density:
``gaussian`` w ~ N(0, s^-2 I); ``laplacian`` w_j ~ Cauchy(0, 1/s);
``cauchy`` w_j ~ Laplace(0, 1/s).  E_w[phi_w(x) phi_w(z)] = k(x, z).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from dkernel.backend import asarray_like, namespace, one_blas_thread
from dkernel.kernels.bandwidth import gram_top_eigenvalue, top_eigenvalue
from dkernel.kernels.exact import check_kernel, kernel_matrix

#: The features' lambda_1 is estimated on at most this many of them (the
#: sample's Gram over 65536 features: ~1 s on the client for 1000 rows).  It
#: approaches the exact kernel's as D grows, so a prefix of a larger pool
#: overestimates it a little: a slightly smaller, still stable, step.
_EIGEN_FEATURES = 65536
#: (below it a feature's frequency s^-1 times the data overflows float32: NaN features)
_MIN_BANDWIDTH = 1e-18


@lru_cache(maxsize=512)
def _weights(
    kernel: str,
    bandwidth: float,
    n_inputs: int,
    block_size: int,
    dtype: str,
    random_state: int,
    stream: int,
    block_id: int,
) -> tuple[np.ndarray, np.ndarray]:
    # Philox keyed by a SeedSequence of the block's coordinates: independent
    # streams per block, identical on every machine and NumPy version >= 1.17.
    seq = np.random.SeedSequence([int(random_state), int(stream), int(block_id)])
    rng = np.random.Generator(np.random.Philox(seq))
    shape = (n_inputs, block_size)
    if kernel == "gaussian":
        W = rng.standard_normal(shape) / bandwidth
    elif kernel == "laplacian":
        W = rng.standard_cauchy(shape) / bandwidth
    else:  # cauchy
        W = rng.laplace(0.0, 1.0 / bandwidth, shape)
    b = rng.uniform(0.0, 2 * math.pi, block_size)
    W, b = W.astype(dtype), b.astype(dtype)
    W.flags.writeable = False
    b.flags.writeable = False
    return W, b


@lru_cache(maxsize=8)
def _stacked(features: FeatureMap, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    W = np.concatenate([features.weights(j)[0] for j in range(n_blocks)], axis=1)
    b = np.concatenate([features.weights(j)[1] for j in range(n_blocks)])
    W.flags.writeable = False
    b.flags.writeable = False
    return W, b


@dataclass(frozen=True)
class FeatureMap:
    """Recipe for seeded feature blocks; cheap to pickle and hash.

    Parameters
    ----------
    kernel : {"gaussian", "laplacian", "cauchy"}
    bandwidth : float
        Kernel scale ``s`` (> 0).
    n_inputs : int
        Input dimension d.
    block_size : int
        Width B of one block.
    random_state : int
        Global seed.
    stream : int
        Independent seed stream (e.g. one per view in kernel CCA).
    dtype : str
        Feature dtype; float32 by default (float64 trig is ~25x slower, docs/design.md §4).
    """

    kernel: str
    bandwidth: float
    n_inputs: int
    block_size: int
    random_state: int = 0
    stream: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check_kernel(self.kernel)
        if not (isinstance(self.bandwidth, (int, float)) and self.bandwidth >= _MIN_BANDWIDTH
                and math.isfinite(self.bandwidth)):
            raise ValueError(f"bandwidth must be a finite number >= {_MIN_BANDWIDTH:g}, got "
                             f"{self.bandwidth!r}")
        if int(self.block_size) < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if int(self.n_inputs) < 1:
            raise ValueError(f"n_inputs must be >= 1, got {self.n_inputs}")

    def weights(self, block_id: int) -> tuple[np.ndarray, np.ndarray]:
        """(W, b) of one block, shapes (d, B) and (B,), read-only NumPy arrays."""
        return _weights(self.kernel, float(self.bandwidth), int(self.n_inputs),
                        int(self.block_size), self.dtype, int(self.random_state),
                        int(self.stream), int(block_id))

    def stacked(self, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
        """(W, b) of blocks 0..n_blocks-1 side by side, shapes (d, D) and (D,), so a
        tile of rows takes all its features in one product (cached per worker)."""
        return _stacked(self, int(n_blocks))

    def block(self, X: Any, block_id: int) -> Any:
        """phi_{w_i}(X) = sqrt(2) cos(X W_i + b_i), shape (n, B), unscaled."""
        return self.blocks(X, [block_id])

    def blocks(self, X: Any, block_ids: Sequence[int], out: Any = None) -> Any:
        """Concatenated unscaled blocks, shape (n, len(block_ids) * B); written
        into ``out`` when given (a reused buffer: fresh pages are slow, docs/design.md §4)."""
        xp = namespace(X)
        dt = np.dtype(self.dtype)
        X = X.astype(dt, copy=False)
        B = int(self.block_size)
        if out is None:
            out = xp.empty((X.shape[0], len(block_ids) * B), dtype=dt)
        for j, bid in enumerate(block_ids):
            W, b = self.weights(bid)
            Z = out[:, j * B : (j + 1) * B]
            xp.matmul(X, asarray_like(W, X), out=Z)
        # One fused pass over the whole slab: add phase, cos, scale (no upcast).
        phase = xp.concatenate([asarray_like(self.weights(bid)[1], X) for bid in block_ids])
        out += phase
        xp.cos(out, out=out)
        out *= dt.type(math.sqrt(2.0))
        return out

    def transform(self, X: Any, n_blocks: int) -> Any:
        """Fixed feature map z(X) with z(x).z(y) ~ k(x, y): blocks 0..n_blocks-1 / sqrt(D)."""
        Z = self.blocks(X, range(n_blocks))
        Z *= np.dtype(self.dtype).type(1.0 / math.sqrt(n_blocks * self.block_size))
        return Z

    def top_eigenvalue(self, sample: Any, n_blocks: int, center: bool = False) -> float:
        """lambda_1 of z(S) z(S)^T / |S| on a sample S (centred columns when
        ``center``): the operator a model on blocks 0..n_blocks-1 takes its steps
        with, accumulated a few blocks at a time (no |S| x D array)."""
        S = np.asarray(sample, dtype=np.float64)
        B = int(self.block_size)
        n_blocks = max(1, min(int(n_blocks), _EIGEN_FEATURES // B))
        G = np.zeros((S.shape[0], S.shape[0]))
        step = max(1, 4096 // B)
        for first in range(0, n_blocks, step):
            Z = self.blocks(S, range(first, min(first + step, n_blocks))).astype(np.float64)
            if center:
                Z -= Z.mean(axis=0)
            G += Z @ Z.T
        return gram_top_eigenvalue(G / (n_blocks * B))

    def weights_digest(self) -> str:
        """SHA-256 of block 0's (W, b): what a saved model checks on load.

        The blocks are regenerated from seeds, never stored, so a NumPy whose
        normal/Cauchy/Laplace sampler draws differently (NumPy does not promise
        these streams across versions, only the bit generator's) would rebuild
        other features and give wrong predictions without a word."""
        W, b = self.weights(0)
        return hashlib.sha256(W.tobytes() + b.tobytes()).hexdigest()

    def to_dict(self) -> dict:
        """The map's settings plus ``weights_sha256`` (:meth:`weights_digest`)."""
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__},
                "weights_sha256": self.weights_digest()}

    @classmethod
    def from_dict(cls, d: dict) -> FeatureMap:
        """Rebuild a saved map; refuses one whose weights this NumPy regenerates
        differently (files written before the digest was stored are not checked)."""
        d = dict(d)
        saved = d.pop("weights_sha256", None)
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"its feature map has settings this dkernel does not know "
                             f"({', '.join(unknown)}): written by a newer dkernel?")
        sizes = [d.get(k) for k in ("n_inputs", "block_size")]
        if not all(isinstance(v, int) and v >= 1 for v in sizes):
            raise ValueError(f"its feature map's n_inputs and block_size are {sizes}, not "
                             "positive integers")
        need = 8 * sizes[0] * sizes[1]  # (float64 weights of one block, to check the digest)
        if need > _memory_bytes():  # (a 7 kB file claiming 200000^2 met numpy's MemoryError)
            raise ValueError(f"its feature map claims {sizes[0]} inputs x {sizes[1]} features "
                             f"a block, {need / 2**30:.0f} GB of weights, more than this "
                             "machine's memory: a damaged file, or one for a larger machine")
        fm = cls(**d)
        if saved is not None and saved != fm.weights_digest():
            raise ValueError(
                f"this model's random features (seed {fm.random_state}, stream {fm.stream}) are "
                f"regenerated differently by NumPy {np.__version__}, so its predictions would be "
                "wrong; load it with the NumPy version that saved it (`dkernel info MODEL` shows "
                "it) or refit")
        return fm


def _memory_bytes() -> float:
    """This machine's physical memory (infinite where it cannot be read)."""
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def step_eigenvalue(features: FeatureMap, n_blocks: int, sample: Any,
                    center: bool = False) -> float:
    """lambda_1 that an automatic step of a model on these features divides by:
    the larger of the exact kernel operator's on ``sample`` and the features'
    own (:meth:`FeatureMap.top_eigenvalue`).

    The two agree within the features' Monte-Carlo error at usual bandwidths.
    At a narrow one the features' Gram is the kernel's near-identity plus
    their noise, and its top eigenvalue is several times the kernel's (1000
    rows, 512 features: 2.7x at a tenth of the median heuristic, 4.1x at a
    twentieth): a step from the exact kernel alone diverged within a few steps
    (DSGDensityRatio, KernelPCA's block steps)."""
    exact = top_eigenvalue(sample, features.kernel, features.bandwidth, center)
    return max(exact, features.top_eigenvalue(sample, n_blocks, center))


#: :func:`pool_error` compares on at most this many rows of a sample, with at
#: most this many of the pool's features (the rest are accounted for by the
#: 1/sqrt(D) of a Monte-Carlo error: on the quality matrix's data at 0.25x the
#: median heuristic 2048 features measured 1.50x the error of 4096, and 1000
#: rows gave 0.31, 0.22 and 0.11 at 2048, 4096 and 16384 features, all measured)
POOL_ROWS = 256
_POOL_FEATURES = 4096


def pool_error(features: FeatureMap, n_blocks: int, sample: Any, random_state: int = 0
               ) -> float | None:
    """How far the Gram matrix of the pool's D features (blocks
    0..n_blocks-1) is from the exact kernel's on a sample of rows:
    ||Z Z^T - K||_2 / ||K||_2 on at most ``POOL_ROWS`` of them (seeded), with
    at most ``_POOL_FEATURES`` features, scaled by sqrt(features used / D).

    A Monte-Carlo error: it falls as 1/sqrt(D) and grows as the bandwidth
    narrows (the kernel's norm falls, the features' noise does not).  On the
    quality matrix's 10-input data, 4096 features: 0.02-0.03 at the median
    heuristic, 0.17-0.21 at a quarter of it, where every random-feature model
    missed the exact kernel's.  None for fewer than 32 rows (no estimate)."""
    S = np.asarray(sample, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] < 32:
        return None
    if S.shape[0] > POOL_ROWS:
        rows = np.random.default_rng(random_state).choice(S.shape[0], POOL_ROWS,
                                                          replace=False)
        S = S[np.sort(rows)]
    B = int(features.block_size)
    used = max(1, min(int(n_blocks), _POOL_FEATURES // B))
    # (one BLAS thread: on the loaded 2-core VM threaded BLAS took 0.7-5.7 s for
    # this, one thread 0.15-0.4 s)
    with one_blas_thread():
        Z = features.blocks(S.astype(np.dtype(features.dtype)), range(used)).astype(np.float64)
        Z *= 1.0 / math.sqrt(used * B)
        K = kernel_matrix(S, S, features.kernel, float(features.bandwidth))
        top = float(np.linalg.eigvalsh(K)[-1])
        E = Z @ Z.T - K
        err = float(np.abs(np.linalg.eigvalsh(E)[[0, -1]]).max())
    if not top > 0:
        return None
    return err / top * math.sqrt(used / int(n_blocks))
