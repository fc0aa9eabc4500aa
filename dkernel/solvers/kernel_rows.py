r"""Kernel rows K(X_c, C) of a chunk, computed once and kept on its worker.

EigenPro's kernel form and the FALKON solve read the same rows every epoch.
Storage modes (``CACHE_MODES``):

- ``float32``: the (n, p) rows as computed;
- ``fixed16``: k in [0, 1] (every kernel here) as round(65535 k), absolute
  error <= 2^-17 -- half the memory of float32;
- ``bfloat16``: the top 16 bits of each float32, relative error <= 2^-9.
  On Fashion-MNIST its rounding raised EigenPro's training loss after
  epoch 7 (0.080 -> 0.093) where fixed16 kept falling like float32 (0.033);
- ``off``: nothing kept, each step recomputes the rows it needs.

Rows are stored row-major and a mini-batch's rows are decoded into a
reusable float32 tile by a row loop (a copy at memory speed, no allocation).
A column-blocked layout, gathered with ``np.take`` block by block so the
decode stays in the CPU cache, was measured and dropped: 2.7 s against 1.9 s
an epoch (30k Fashion-MNIST rows, two workers).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from dkernel.backend import namespace
from dkernel.kernels import kernel_matrix

CACHE_MODES = ("float32", "fixed16", "bfloat16", "off")
FIXED16_SCALE = 65535.0
#: Rows per kernel tile when rows are computed: a (tile x p) float32 slab of a
#: few tens of MB.
TILE_ROWS = 128


def cache_scale(mode: str) -> float:
    """Factor that turns decoded stored values into k (fixed16 stores 65535 k)."""
    return 1.0 / FIXED16_SCALE if mode == "fixed16" else 1.0


def stored_bytes(n: int, p: int, mode: str) -> int:
    return n * p * (4 if mode == "float32" else 2)


# --- per-thread buffers ---------------------------------------------------------------
_local = threading.local()


def buffer(name: str, shape: tuple[int, ...], dtype: Any, like: Any) -> Any:
    """A per-thread reusable buffer of at least ``shape`` (first axis may shrink):
    fresh pages are expensive (DESIGN 4)."""
    xp = namespace(like)
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    key = (name, xp.__name__, shape[1:], np.dtype(dtype).str)
    buf = bufs.get(key)
    if buf is None or buf.shape[0] < shape[0]:
        buf = bufs[key] = xp.empty(shape, dtype=dtype)
    return buf[: shape[0]]


# --- computing rows --------------------------------------------------------------------
def kernel_into(X: Any, C: Any, C_sq: Any, kernel: str, bandwidth: float, out: Any) -> Any:
    """out = k(X, C) without temporaries of out's size (gaussian fused in place)."""
    xp = namespace(X)
    if kernel != "gaussian":
        out[...] = kernel_matrix(X, C, kernel, bandwidth)
        return out
    f32 = out.dtype.type
    xp.matmul(X, C.T, out=out)  # exp((x.c - |x|^2/2 - |c|^2/2) / s^2)
    out -= f32(0.5) * C_sq[None, :]
    out -= (f32(0.5) * (X * X).sum(axis=1))[:, None]
    out *= f32(1.0 / (bandwidth * bandwidth))
    xp.minimum(out, f32(0.0), out=out)
    xp.exp(out, out=out)
    return out


def _encode(T: Any, mode: str, out: Any) -> None:
    """Store float32 kernel values T (in [0, 1]) as 16-bit ``mode`` into ``out``."""
    xp = namespace(T)
    if mode == "fixed16":
        T *= np.float32(FIXED16_SCALE)
        xp.add(T, np.float32(0.5), out=out, casting="unsafe")  # the cast truncates: +0.5 rounds
    else:  # bfloat16: round half up on the top 16 bits (values >= 0)
        u = T.view(np.uint32)
        u += np.uint32(0x8000)
        u >>= np.uint32(16)
        out[...] = u


def _decode_rows(stored: Any, rows: Any, mode: str, out: Any) -> Any:
    """out[i] = float32 of stored row rows[i] (fixed16 stays 65535 k: see cache_scale)."""
    xp = namespace(out)
    if mode == "bfloat16":
        w = out.view(np.uint32)
        if xp is np:
            for i, r in enumerate(rows):
                w[i] = stored[r]
        else:
            w[...] = stored[rows]
        w <<= np.uint32(16)
    elif xp is np:  # float32 or fixed16 (the cast happens in the copy)
        for i, r in enumerate(rows):
            out[i] = stored[r]
    else:
        out[...] = stored[rows]
    return out


def fill(X: Any, C: Any, C_sq: Any, kernel: str, bandwidth: float, mode: str) -> Any:
    """K(X, C) for a whole chunk, tile by tile, as an (n, p) float32 or uint16 array."""
    xp = namespace(X)
    n, p = X.shape[0], C.shape[0]
    out = xp.empty((n, p), dtype=np.float32 if mode == "float32" else np.uint16)
    for i in range(0, n, TILE_ROWS):
        j = min(n, i + TILE_ROWS)
        if mode == "float32":
            kernel_into(X[i:j], C, C_sq, kernel, bandwidth, out[i:j])
            continue
        T = buffer("tile", (j - i, p), np.float32, X)
        kernel_into(X[i:j], C, C_sq, kernel, bandwidth, T)
        _encode(T, mode, out[i:j])
    return out


# --- reading rows ----------------------------------------------------------------------
def rows_products(stored: Any, mode: str, rows: Any, a: Any, sub: Any) -> tuple[Any, Any]:
    """(K[rows] @ a, K[rows][:, sub]) from stored rows, in float32."""
    xp = namespace(a)
    m, c, p = len(rows), a.shape[1], stored.shape[1]
    scale = cache_scale(mode)
    if scale != 1.0:  # fixed16 decodes to 65535 k: scale a and K(S, X_b) instead of every tile
        a = a * np.float32(scale)
    g = xp.empty((m, c), dtype=np.float32)
    ks = xp.empty((m, len(sub)), dtype=np.float32)
    for i in range(0, m, TILE_ROWS):
        r = rows[i : i + TILE_ROWS]
        T = _decode_rows(stored, r, mode, buffer("tile", (len(r), p), np.float32, a))
        xp.matmul(T, a, out=g[i : i + len(r)])
        ks[i : i + len(r)] = T[:, sub]
    if scale != 1.0:
        ks *= np.float32(scale)
    return g, ks


def range_products(stored: Any, mode: str, i: int, j: int, v: Any, Y: Any | None,
                   r: Any) -> tuple[Any, Any]:
    """For rows i:j: r = K v - Y (into ``r``) and K^T r, in float32 (FALKON's pass)."""
    xp = namespace(v)
    if mode == "float32":
        K = stored[i:j]
    else:
        K = buffer("range-tile", (j - i, stored.shape[1]), np.float32, v)
        if mode == "fixed16":
            K[...] = stored[i:j]
            K *= np.float32(1.0 / FIXED16_SCALE)
        else:
            w = K.view(np.uint32)
            w[...] = stored[i:j]
            w <<= np.uint32(16)
    xp.matmul(K, v, out=r)
    if Y is not None:
        r -= Y
    return r, K.T @ r
