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
an epoch (30k Fashion-MNIST rows, two workers).  EigenPro's correction also
needs K(X_b, S) for its subsample S: those s columns are kept apart as well
(:func:`subsample_columns`, s / p more memory), because gathering them from
every decoded tile cost a worker as much as the product with the
coefficients.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from dkernel.backend import asarray_like, namespace
from dkernel.kernels import kernel_matrix

CACHE_MODES = ("float32", "fixed16", "bfloat16", "off")
FIXED16_SCALE = 65535.0
#: Rows per kernel tile when rows are computed: a (tile x p) float32 slab of a
#: few tens of MB.
TILE_ROWS = 128
#: Bytes of one decoded float32 tile when stored rows are read back: the tile
#: should stay in cache between the decode and the product that reads it
#: (1 MB L2 per core, 32 MB L3 here), and tall enough that the product with
#: the coefficients (p x c, 2.4 MB on Fashion-MNIST) reads them from cache few
#: times.  2046 random fixed16 rows of 15000 against 60000 centers, one
#: thread, the median step of two processes at once (rows_products, subsample
#: columns apart): 0.143-0.155 s in 16-row tiles, 0.127-0.135 s in 26 (6 MB),
#: 0.112-0.124 s in 48, 0.117-0.123 s in 64, 0.123-0.125 s in 96 and
#: 0.126-0.155 s in 128-row tiles (30 MB, through memory).  At 52 rows
#: (12 MB) instead of 26, EigenProClassifier(bandwidth=5)'s later epochs on
#: Fashion-MNIST took 3.16 / 2.87 s against 3.67 / 3.15 s (medians of epochs
#: 2-6, two runs each, alternating), the lanes' compute 8-9% less.
READ_TILE_BYTES = 12 << 20


def read_tile_rows(p: int) -> int:
    """Stored rows decoded and multiplied at a time, for ``p`` centers."""
    return max(12, min(TILE_ROWS, READ_TILE_BYTES // (4 * max(1, int(p)))))


#: Bytes of one float32 tile when rows are computed (at least ``TILE_ROWS``
#: rows): a taller left operand of X C^T packs C (p x d) fewer times.  One
#: 8192 x 8192 Fashion-MNIST block of the symmetric fill (d = 784) with fixed16
#: encoding, two processes at once: 1.5-1.9 s in 128-row tiles, 1.33-1.43 s in
#: 256, 1.27-1.38 s in 512 (a 16 MB tile).
FILL_TILE_BYTES = 16 << 20


def cache_scale(mode: str) -> float:
    """Factor that turns decoded stored values into k (fixed16 stores 65535 k)."""
    return 1.0 / FIXED16_SCALE if mode == "fixed16" else 1.0


def kernel_rows_key(chunk_key: Any, centers_token: str, mode: str) -> tuple:
    """Worker-cache key of a chunk's kernel rows against one set of centers."""
    return (chunk_key, centers_token, mode)


def stored_bytes(n: int, p: int, mode: str) -> int:
    return n * p * (4 if mode == "float32" else 2)


# --- per-thread buffers ---------------------------------------------------------------
_local = threading.local()


def buffer(name: str, shape: tuple[int, ...], dtype: Any, like: Any) -> Any:
    """A per-thread reusable buffer of at least ``shape`` (first axis may shrink):
    fresh pages are expensive (docs/design.md §4)."""
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
def centers_payload(C: Any) -> dict[str, Any]:
    """The centers as :func:`kernel_into` reads them: about their mean ``m``,
    with |c - m|^2.  Every kernel here is shift-invariant, and the gaussian's
    x.c - |x|^2/2 - |c|^2/2 cancels in float32 when the rows sit far from the
    origin (3 columns shifted by 1000: test R^2 0.997 -> 0.839, by 3000 ->
    -0.24); about the centers' mean the terms are the data's spread."""
    C = np.asarray(C, dtype=np.float32)
    m = C.mean(axis=0, dtype=np.float64).astype(np.float32) if len(C) else np.zeros(C.shape[1:],
                                                                                   np.float32)
    Cs = C - m
    return {"centers": Cs, "centers_sq": (Cs * Cs).sum(axis=1), "centers_shift": m}


def kernel_into(X: Any, C: Any, C_sq: Any, kernel: str, bandwidth: float, out: Any,
                shift: Any = None) -> Any:
    """out = k(X, C) without temporaries of out's size (gaussian fused in place);
    ``shift``: the m of C = C_0 - m (:func:`centers_payload`), taken off X too."""
    xp = namespace(X)
    if shift is not None:
        Xs = buffer("shifted", X.shape, np.float32, X)
        xp.subtract(X, xp.asarray(shift), out=Xs)
        X = Xs
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


def fill(X: Any, C: Any, C_sq: Any, kernel: str, bandwidth: float, mode: str,
         shift: Any = None, symmetric: bool = False) -> Any:
    """K(X, C) for a whole chunk, tile by tile, as an (n, p) float32 or uint16 array.

    ``symmetric``: C holds X's own rows (about ``shift``), so K is symmetric; a
    tile of rows i:j computes the columns from i on and copies the others from
    the rows above it, transposed -- about half the arithmetic of a diagonal
    block of :func:`symmetric_fill` (an 8192-row Fashion-MNIST block in fixed16:
    1.05 s against 1.67 s, one process, other work beside it)."""
    xp = namespace(X)
    n, p = X.shape[0], C.shape[0]
    out = xp.empty((n, p), dtype=np.float32 if mode == "float32" else np.uint16)
    step = max(TILE_ROWS, FILL_TILE_BYTES // (4 * max(1, p)))
    for i in range(0, n, step):
        j = min(n, i + step)
        lo = i if symmetric else 0
        if mode == "float32":
            kernel_into(X[i:j], C[lo:], C_sq[lo:], kernel, bandwidth, out[i:j, lo:], shift)
        else:
            # one flat buffer for every tile width (the buffers are kept per shape)
            T = buffer("fill-tile", ((j - i) * p,), np.float32, X)[: (j - i) * (p - lo)]
            T = T.reshape(j - i, p - lo)
            kernel_into(X[i:j], C[lo:], C_sq[lo:], kernel, bandwidth, T, shift)
            _encode(T, mode, out[i:j, lo:])
        if lo:
            _write_transposed(out[i:j], out[:lo, i:j], 0)
    return out



def cached_rows(payload: dict, chunk: Any) -> Any:
    """The chunk's stored kernel rows against the payload's centers, from the
    worker cache (filled on first use); None with ``cache="off"`` or when the
    worker's cache budget declines them (the caller then computes per tile)."""
    from dkernel.engine import cache

    mode = payload["cache"]
    if mode == "off":
        return None
    C, C_sq = payload["centers"], payload["centers_sq"]
    return cache.lookup_or_fill(
        kernel_rows_key(chunk.key, payload["centers_token"], mode),
        lambda: fill(chunk.X, C, C_sq, payload["kernel"], payload["bandwidth"], mode,
                     payload.get("centers_shift")),
        stored_bytes(chunk.X.shape[0], C.shape[0], mode), owner=chunk.run)


# --- reading rows ----------------------------------------------------------------------
def tile_products(T: Any, a: Any, y: Any, sub: Any, r: Any, kg: Any,
                  T_sub: Any | None = None) -> None:
    """For one tile T = K(X_t, C): r = T a - y (into ``r``) and kg += T[:, sub]^T r
    (``sub`` on T's backend).

    ``T_sub``, the tile's subsample columns when they are stored apart
    (:func:`subsample_columns`), saves the column gather: on a worker it cost as
    much as the product T a (0.07-0.10 s against 0.09-0.11 s for 2047 rows x
    60000 centers)."""
    xp = namespace(T)
    xp.matmul(T, a, out=r)
    r -= y
    if T_sub is None:
        T_sub = buffer("sub-tile", (T.shape[0], len(sub)), np.float32, T)
        xp.take(T, sub, axis=1, out=T_sub)
    kg += (T_sub.T @ r).astype(kg.dtype)


def subsample_columns(stored: Any, sub: Any) -> Any:
    """The stored rows' subsample columns K(X_c, S), contiguous, in the stored encoding."""
    return namespace(stored).take(stored, asarray_like(sub, stored), axis=1)


def rows_products(stored: Any, mode: str, rows: Any, a: Any, y: Any, sub: Any,
                  stored_sub: Any | None = None) -> tuple[Any, Any]:
    """(K[rows] a - y, K[rows][:, sub]^T (K[rows] a - y)) from stored rows: float32
    residuals, the second (s x c) summed in float64.  ``stored_sub``: the stored
    subsample columns (:func:`subsample_columns`), else they are gathered per tile."""
    xp = namespace(a)
    m, c, p = len(rows), a.shape[1], stored.shape[1]
    scale = cache_scale(mode)
    if scale != 1.0:  # fixed16 decodes to 65535 k: scale a and the kg sum instead of every tile
        a = a * np.float32(scale)
    g = xp.empty((m, c), dtype=np.float32)
    kg = xp.zeros((len(sub), c), dtype=np.float64)
    step = read_tile_rows(p)
    for i in range(0, m, step):
        r = rows[i : i + step]
        T = _decode_rows(stored, r, mode, buffer("read-tile", (len(r), p), np.float32, a))
        T_sub = None if stored_sub is None else _decode_rows(
            stored_sub, r, mode, buffer("sub-tile", (len(r), len(sub)), np.float32, a))
        tile_products(T, a, y[i : i + len(r)], sub, g[i : i + len(r)], kg, T_sub)
    if scale != 1.0:
        kg *= scale
    return g, kg


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


# --- every row a center: each chunk pair once -------------------------------------------
def _allocate(key: Any, n: int, p: int, mode: str, owner: Any) -> bool:
    from dkernel.engine import cache

    dtype = np.float32 if mode == "float32" else np.uint16
    return cache.lookup_or_fill(key, lambda: np.empty((n, p), dtype=dtype),
                                stored_bytes(n, p, mode), owner=owner) is not None


def _publish(pairs: list) -> bool:
    from dkernel.engine import cache

    return all(cache.rename(private, key) for private, key in pairs)


def _discard(keys: list) -> None:
    from dkernel.engine import cache

    for key in keys:
        cache.discard(key)


class FillLost(RuntimeError):
    """A pre-pass task ran where its chunk's rows are not (a worker was lost)."""


def _rows_here(key: Any) -> Any:
    from dkernel.engine import cache

    rows = cache.peek(key)
    if rows is None:
        raise FillLost(f"the kernel rows {key!r} are not on this worker: a worker was lost "
                       "or replaced during the fill, or its cache dropped them")
    return rows


def _write_transposed(dst: Any, B: Any, off: int, tile: int = 256) -> None:
    """dst[:, off:off + n_a] = B.T in cache-sized tiles (a plain B.T copy of an
    8192 x 8192 uint16 block took 0.51 s, tiled 0.22 s)."""
    for i in range(0, B.shape[0], tile):
        for j in range(0, B.shape[1], tile):
            blk = B[i : i + tile, j : j + tile]
            dst[j : j + blk.shape[1], off + i : off + i + blk.shape[0]] = blk.T


def _pair_block(chunk_a: Any, chunk_b: Any, spec: dict) -> Any:
    """K(X_a, X_b) stored in ``mode``; written into the rows of a and/or (transposed)
    of b held by this worker; returned when the other side lives elsewhere."""
    from dkernel.backend import aligned

    Xa, Xb = aligned(chunk_a[0]), aligned(chunk_b[0])  # one of them may have been sent here
    # about X_b's mean (centers_payload), in this thread's buffer: no fresh pages a block
    m = Xb.mean(axis=0, dtype=np.float64).astype(np.float32)
    Cs = buffer("pair-centers", Xb.shape, np.float32, Xb)
    namespace(Xb).subtract(Xb, m, out=Cs)
    B = fill(Xa, Cs, (Cs * Cs).sum(axis=1), spec["kernel"], spec["bandwidth"], spec["mode"], m,
             symmetric=spec.get("diagonal", False))
    if spec["write_a"]:
        _rows_here(spec["key_a"])[:, spec["off_b"] : spec["off_b"] + B.shape[1]] = B
    if spec["write_b"]:
        _write_transposed(_rows_here(spec["key_b"]), B, spec["off_a"])
    return B if spec["send"] else None


def _put_block(B: Any, key: Any, off: int, transpose: bool) -> None:
    dst = _rows_here(key)
    if transpose:
        _write_transposed(dst, B, off)
    else:
        dst[:, off : off + B.shape[1]] = B


def _pinned(worker: Any) -> dict:
    """Submit keywords that keep a task on ``worker`` (none when it is unknown)."""
    return {"workers": [worker], "allow_other_workers": False} if worker else {}


def _results_at_homes(client: Any, futures: list, needed: set, alive: Callable[[], set]
                      ) -> list:
    """The results of ``futures``, tasks pinned to the workers ``needed``; FillLost
    as soon as one of those is no longer in the cluster.  A pinned task of a
    worker that left waits in "no-worker" for ever, and the fill's allocations
    and publications were plain gathers: a worker retired while the client solved
    the preconditioner (what Adaptive does to a worker left idle) hung the fit
    with no message."""
    from dkernel.engine.stall import PauseWatch, wait_on

    pending, watch = set(futures), PauseWatch(client, "the kernel-row fill")
    while True:
        if not needed <= alive():
            client.cancel(list(pending))  # (they would wait in "no-worker")
            raise FillLost("a worker left the cluster during the kernel-row fill")
        if not pending:
            break
        try:
            _, pending = wait_on(client, pending, timeout=5, return_when="FIRST_COMPLETED")
        except TimeoutError:  # nothing finished in 5 s: paused workers are named
            watch.check(len(pending), [f.key for f in pending])
    # (each finished; a result lost with its worker since is asked for a bounded time)
    results = []
    for fut in futures:
        try:
            results.append(fut.result(timeout=_RESULT_SECONDS))
        except TimeoutError:
            raise FillLost("a worker left the cluster during the kernel-row fill") from None
    return results


#: Seconds to fetch a finished fill task's small result before its worker counts as lost.
_RESULT_SECONDS = 60.0


def symmetric_fill(client: Any, chunks: dict, homes: list, row_chunks: list, keys: list,
                   kernel: str, bandwidth: float, mode: str, owner: Any,
                   progress: bool = False) -> bool:
    """Store K(X_c, X) for every chunk c when the centers are all the rows, in
    chunk order, computing each chunk pair's block once: K(X_b, X_a) =
    K(X_a, X_b)^T.  That halves the kernel arithmetic of the lazy fill.

    The block of a pair (a <= b) is always X_a against X_b, whichever worker
    computes it, so the stored rows are the same on any cluster.  It runs on
    the home of a or b, whichever has less work so far.  When the two homes
    differ, the block (n_a x n_b, 16-bit) is sent to the other one, where its
    write ranks above the next pair, so few blocks wait in memory.  Fashion-MNIST,
    60k rows, two workers: 39-42 s, against ~60 s for the lazy per-chunk fill;
    waves of pairs (two per worker at a time) took 50 s.
    Returns False, with nothing left behind, when a worker's cache budget
    cannot hold its chunks' rows; on any error the half-written rows are
    dropped before it is raised.
    """
    from dkernel.engine.cluster import workers_info
    from dkernel.engine.progress import Progress
    from dkernel.engine.stall import PauseWatch, wait_on

    n = len(row_chunks)
    p = int(sum(row_chunks))
    # filled under private keys, published when complete: a fill whose client dies
    # half-way leaves rows no later lookup of the real keys can find
    final, keys = keys, [("filling", owner, k) for k in keys]
    offs = np.concatenate([[0], np.cumsum(row_chunks)]).astype(int)
    # pinned (work stealing would move a loosely placed task away from its rows); a
    # pinned task whose worker dies would wait for ever, so the loop below checks
    # that every home is still there and raises FillLost if not (the caller falls back)
    place = [_pinned(h) for h in homes]

    def alive() -> set:
        return set(workers_info(client))

    publishing = False

    def drop(timeout: float = 120, priority: int = 0) -> None:
        # the real keys only once this fill publishes: before that, rows under them
        # are another fit's (of the same rows and kernel), complete and in use
        mine = (keys, final) if publishing else (keys,)
        wait_on(client, [client.submit(_discard, [k[c] for c in range(n) if homes[c] == h
                                                  for k in mine],
                                       pure=False, priority=priority, **_pinned(h))
                         for h in {h for h in homes if h} & alive()], timeout=timeout)

    needed = {h for h in homes if h}
    try:
        ok = _results_at_homes(client, [
            client.submit(_allocate, keys[c], int(row_chunks[c]), p, mode, owner, pure=False,
                          **place[c]) for c in range(n)], needed, alive)
    except BaseException:
        with contextlib.suppress(Exception):  # (the first error is the news)
            drop(timeout=5)
        raise
    if not all(ok):
        drop()
        return False
    load: dict = {h: 0.0 for h in homes}
    pairs = [(a, b) for a in range(n) for b in range(a, n)]
    bar = Progress(len(pairs), "kernel rows (chunk pairs)", progress, unit="pairs")
    puts: list = []
    try:
        for a, b in pairs:
            ha, hb = homes[a], homes[b]
            w = ha if load[ha] <= load[hb] else hb
            # (a diagonal block computes half its values: fill(symmetric=True))
            load[w] += float(row_chunks[a]) * float(row_chunks[b]) * (0.5 if a == b else 1.0)
            spec = {"mode": mode, "kernel": kernel, "bandwidth": float(bandwidth),
                    "key_a": keys[a], "key_b": keys[b], "off_a": int(offs[a]),
                    "off_b": int(offs[b]), "write_a": ha == w,
                    "write_b": hb == w and a != b, "send": ha != hb, "diagonal": a == b}
            kw = _pinned(w)
            B = client.submit(_pair_block, chunks[a], chunks[b], spec, pure=False, **kw)
            if ha == hb:
                puts.append(B)
                continue
            # a sent block is written (and freed) before its target computes another pair
            other, key, off, transpose = (b, keys[b], offs[a], True) if w == ha else \
                (a, keys[a], offs[b], False)
            puts.append(client.submit(_put_block, B, key, int(off), transpose, pure=False,
                                      priority=1, **place[other]))
            del B
        pending = set(puts)
        watch = PauseWatch(client, "the kernel-row fill")
        while pending:
            try:
                done, pending = wait_on(client, pending, timeout=5,
                                        return_when="FIRST_COMPLETED")
            except TimeoutError:  # nothing finished in 5 s: are the homes still there?
                done = set()
                watch.check(len(pending), [f.key for f in pending])
            for fut in done:
                if fut.status in ("error", "cancelled"):
                    fut.result()  # raises the task's error
                # (not result() on a finished put: its worker may die before we ask, and
                # result() then waits for ever for a task pinned to the dead worker -- a
                # busy-machine suite run hung here; the check below raises FillLost)
                bar.update(1)
            if pending and not needed <= alive():
                raise FillLost("a worker left the cluster during the kernel-row fill")
        by_home: dict = {}
        for c in range(n):
            by_home.setdefault(homes[c], []).append((keys[c], final[c]))
        publishing = True
        published = _results_at_homes(client, [client.submit(_publish, todo, pure=False,
                                                             **_pinned(h))
                                               for h, todo in by_home.items()],
                                      needed, alive)
        if not all(published):
            raise FillLost("the kernel rows of a chunk were evicted or lost before the "
                           "fill finished")
    except BaseException as exc:
        # pairs not started never run, and the discards go ahead of any pair still
        # queued (behind them a Ctrl-C waited 28-92 s); an interrupt (Ctrl-C,
        # SIGTERM) waits for them 5 s at most: the run's blocks are evictable once
        # it retires, and the half-written rows are under private keys
        interrupted = not isinstance(exc, Exception)
        try:
            client.cancel(puts)
            drop(timeout=5 if interrupted else 120, priority=100)
        except Exception:  # (a scheduler gone, or the wait past): the first error is the news
            pass
        raise
    finally:
        bar.close()
    return True
