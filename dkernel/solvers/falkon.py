r"""Nystrom kernel ridge regression on every training row, solved by FALKON
(Rudi, Carratino & Rosasco 2017, "FALKON: An Optimal Large Scale Kernel
Method", Alg. 1): the kernel form of EigenPro when n exceeds the centers.

Model  f(x) = \sum_{j<p} a_j k(x, c_j)  over p centers c_j sampled uniformly
from the rows; every one of the n rows enters the objective

    min_a  (1/n) |K_nM a - y|^2 + lambda a^T K_MM a                     (Rudi eq. 8)

whose normal equations are  H a = b,  H = K_nM^T K_nM / n + lambda K_MM,
b = K_nM^T y / n.  FALKON solves them by conjugate gradient on the
preconditioned system  B^T H B beta = B^T b,  a = B beta,  with B = T^-1 A^-1:

    T = chol(K_MM + eps p I)              (upper: T^T T = K_MM + eps p I)
    A = chol(T T^T / p + lambda I)        (upper: A^T A = T T^T / p + lambda I)
    B^T H B u = A^-T [ T^-T (K_nM^T K_nM (B u)) / n  +  lambda A^-1 u ]

(Alg. 1's ``BHB``; the lambda term uses K_MM = T^T T, so it needs no pass over
the data).  B B^T approximates H^-1 with the Nystrom estimate
K_nM^T K_nM ~ (n / p) K_MM^2, so CG converges in O(log n) iterations (Rudi
Thm. 3, at lambda ~ 1 / sqrt(n) and p ~ sqrt(n) log n) where plain gradient
descent on H would need cond(H) ~ 1 / lambda^2.  Away from those settings it
can need many more: 100 centers of 2000 rows at lambda = 1e-6 left a relative
residual of 0.20 after 10 iterations (test R^2 0.56 against the exact
solution's 0.89), which is why :func:`unconverged` is checked after a solve.

Every CG iteration is one pass over all rows: one
:meth:`dkernel.engine.Engine.map_reduce` whose per-chunk partial computes
K_c^T (K_c v) (a p x c sum), with K_c = K(X_c, C) kept in the worker cache
(:mod:`dkernel.engine.cache`, the same blocks and modes as the SGD form in
:mod:`dkernel.solvers.eigenpro`) when they fit, else recomputed tile by tile.
The p x p factorisations run once on the coordinator: O(p^3) flops and p^2
floats of memory, which bounds p (2 * 10^4 centers: ~5e12 flops, 3.2 GB).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg
from scipy.linalg import blas

from dkernel.backend import namespace, one_blas_thread
from dkernel.engine.program import Chunk
from dkernel.solvers.kernel_rows import (
    buffer,
    cached_rows,
    centers_payload,
    kernel_into,
    range_products,
)
from dkernel.solvers.targets import TargetEncoding

#: Jitter eps of T = chol(K_MM + eps p I).  The kernel rows are float32, so
#: K_MM carries entry errors ~6e-8 and its smallest eigenvalues are noise of
#: size up to p * 6e-8; eps = 1e-7 keeps the factorisation positive definite
#: with a perturbation far below the lambda p of any useful ridge.
_EPS = 1e-7
#: Rows per tile of a chunk's kernel rows: a (tile x p) float32 slab of a few MB.
_TILE_ROWS = 256


def _cholesky_upper(K: np.ndarray) -> np.ndarray:
    """Upper Cholesky factor of K (overwritten), LAPACK's potrf on one BLAS thread.

    OpenBLAS's threaded potrf (its parallel SYRK update; OpenBLAS issues 1413,
    2821) crashes the process with a segmentation fault at some orders: the
    OpenBLAS 0.3.30 that SciPy's wheel bundles did at p = 16385 and at p = 20000
    (the default n_centers beyond 100 000 rows), on 2 threads, within seconds;
    one thread factored p = 20000 in 130 s on the loaded 2-core VM.  NumPy's
    bundled OpenBLAS (0.3.31) crashed the same way at p = 20000.  The p^3 / 3
    flops are paid once per fit, against passes over n x p kernel rows.
    """
    with one_blas_thread():  # (a limit shared with fits on other threads: backend.py)
        return scipy.linalg.cholesky(K, lower=False, overwrite_a=True, check_finite=False)


# --- the preconditioner (Rudi et al. Alg. 1, lines 2-3) ----------------------------
@dataclass
class FalkonPreconditioner:
    """B = T^-1 A^-1 with T, A the upper Cholesky factors above (float64)."""

    T: np.ndarray
    A: np.ndarray
    lam: float

    @classmethod
    def from_kernel(cls, K_MM: np.ndarray, lam: float, eps: float = _EPS) -> FalkonPreconditioner:
        p = K_MM.shape[0]
        K = np.array(K_MM, dtype=np.float64, order="F")
        K[np.diag_indices(p)] += eps * p
        try:
            T = _cholesky_upper(K)
        except np.linalg.LinAlgError as err:
            raise ValueError(f"K(C, C) of the {p} centers is not positive definite even with "
                             f"jitter {eps * p:.3g} (duplicate centers, or a kernel that is not "
                             "positive definite?); use fewer n_centers or another kernel") from err
        # T T^T with the triangular BLAS (half the flops of a general product)
        TT = blas.dtrmm(1.0, T, np.asfortranarray(T.T), side=0, lower=0, trans_a=0, overwrite_b=1)
        TT /= p
        TT[np.diag_indices(p)] += lam
        A = _cholesky_upper(TT)
        return cls(T, A, float(lam))

    def apply(self, u: np.ndarray) -> np.ndarray:
        """B u = T^-1 (A^-1 u)."""
        v = scipy.linalg.solve_triangular(self.A, u, lower=False, check_finite=False)
        return scipy.linalg.solve_triangular(self.T, v, lower=False, check_finite=False)

    def apply_t(self, u: np.ndarray) -> np.ndarray:
        """B^T u = A^-T (T^-T u)."""
        v = scipy.linalg.solve_triangular(self.T, u, lower=False, trans="T", check_finite=False)
        return scipy.linalg.solve_triangular(self.A, v, lower=False, trans="T", check_finite=False)

    def ridge_term(self, u: np.ndarray) -> np.ndarray:
        """B^T (lambda K_MM) B u = lambda A^-T A^-1 u (K_MM = T^T T)."""
        v = scipy.linalg.solve_triangular(self.A, u, lower=False, check_finite=False)
        return self.lam * scipy.linalg.solve_triangular(self.A, v, lower=False, trans="T",
                                                        check_finite=False)


def center_kernel(C: np.ndarray, kernel: str, bandwidth: float) -> np.ndarray:
    """K(C, C) in float32, the same arithmetic as the kernel rows of the passes."""
    c = centers_payload(C)
    out = np.empty((C.shape[0], C.shape[0]), dtype=np.float32)
    return kernel_into(c["centers"], c["centers"], c["centers_sq"], kernel, bandwidth, out)


# --- worker side of a pass -----------------------------------------------------------
def falkon_partial(payload: dict, chunk: Chunk) -> dict:
    """w = K_c^T (K_c v - Y_c) (targets only when ``payload["targets"]``) and
    |K_c v - Y_c|^2, over the whole chunk, K_c = K(X_c, C)."""
    C, C_sq = payload["centers"], payload["centers_sq"]
    kernel, bw, mode = payload["kernel"], payload["bandwidth"], payload["cache"]
    xp = namespace(chunk.X)
    v = xp.asarray(payload["v"], dtype=np.float32)
    n_c, p = chunk.X.shape[0], C.shape[0]
    Y = None
    if payload["targets"]:
        enc: TargetEncoding = payload["encoding"]
        Y = enc.encode(chunk.y, np.float32)
    stored = cached_rows(payload, chunk)
    w = xp.zeros((p, v.shape[1]), dtype=np.float32)
    sq = xp.zeros(v.shape[1], dtype=np.float64)
    r = buffer("falkon-r", (_TILE_ROWS, v.shape[1]), np.float32, chunk.X)
    for i in range(0, n_c, _TILE_ROWS):
        j = min(n_c, i + _TILE_ROWS)
        rt = r[: j - i]
        Yt = None if Y is None else Y[i:j]
        if stored is not None:
            _, wt = range_products(stored, mode, i, j, v, Yt, rt)
        else:
            K = buffer("falkon-tile", (j - i, p), np.float32, chunk.X)
            kernel_into(chunk.X[i:j], C, C_sq, kernel, bw, K, payload.get("centers_shift"))
            xp.matmul(K, v, out=rt)
            if Yt is not None:
                rt -= Yt
            wt = K.T @ rt
        sq += (rt.astype(np.float64) ** 2).sum(axis=0)
        w += wt
    return {"w": _np(w).astype(np.float64), "sq": _np(sq), "count": n_c}


def _np(a: Any) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.get()


# --- coordinator: conjugate gradient (Rudi et al. Alg. 1, ``conjgrad``) -------------
@dataclass
class FalkonResult:
    coef: np.ndarray  # a (p, c)
    history: list[dict]  # per iteration: residual of the CG system and the training MSE
    n_passes: int
    start_loss: float = float("nan")  # the training MSE of a = 0 (summed over outputs)


#: Relative CG residual above which a solve counts as stopped short: 0.013
#: gave test R^2 0.886 against the exact solution's 0.889, 0.059 gave 0.824
#: (100 centers of 2000 rows); the default 20,000 centers of 200,000 rows
#: reach 8.5e-4 in their 10 iterations.
CONVERGED = 0.02
#: ... unless the training loss is already below this share of the starting
#: model's: a noise-free target at residual 0.035 had it at 0.1% (training
#: R^2 0.998), where more iterations have nothing left to gain.
LEFT_TO_GAIN = 0.02


def unconverged(result: FalkonResult, n_iter: int) -> str | None:
    """One line saying that a solve stopped short (:data:`CONVERGED`,
    :data:`LEFT_TO_GAIN`) and what to change; None when it did not.  (Its
    last iterations' rate is no guide to how many more it needs: CG sped up
    5-25x past it here.)"""
    last = result.history[-1] if result.history else None
    if (last is None or last["residual"] <= CONVERGED
            or last["loss"] <= LEFT_TO_GAIN * result.start_loss):
        return None
    return (f"the conjugate-gradient solve stopped after n_epochs={n_iter} iterations at "
            f"relative residual {last['residual']:.3g}, above the {CONVERGED} of a "
            "converged solve; raise n_epochs (one pass over the rows each) or alpha")


def falkon_solve(pass_fn: Callable[[np.ndarray, bool], dict], pre: FalkonPreconditioner, n: int,
                 n_outputs: int, n_iter: int,
                 on_iter: Callable[[np.ndarray, int], bool] | None = None) -> FalkonResult:
    """``n_iter`` CG iterations on B^T H B beta = B^T b, one column per output.

    ``pass_fn(v, targets)`` returns the summed partials of :func:`falkon_partial`
    for coefficients v (one pass over every row).  The training MSE of every
    iterate is tracked without extra passes:
    |K a - y|^2 = a^T (K^T K a) - 2 a^T K^T y + |y|^2, with K^T K a summed from
    the products CG already computed.  ``on_iter(a, k)`` returning True stops early.
    """
    first = pass_fn(np.zeros((pre.T.shape[0], n_outputs)), True)
    KTy = -first["w"]  # K_nM^T y (the pass ran with v = 0)
    y_sq = first["sq"]
    c = n_outputs
    r = pre.apply_t(KTy / n)  # B^T b
    beta = np.zeros_like(r)
    a = np.zeros_like(r)
    KTKa = np.zeros_like(r)  # K^T K a, for the training loss
    d = r.copy()
    rs = (r * r).sum(axis=0)
    rs0 = np.where(rs > 0, rs, 1.0)
    history: list[dict] = []
    passes = 1
    for k in range(int(n_iter)):
        Bd = pre.apply(d)
        KTKBd = pass_fn(Bd, False)["w"]
        passes += 1
        Hd = pre.apply_t(KTKBd / n) + pre.ridge_term(d)
        dHd = (d * Hd).sum(axis=0)
        # a column that has converged (rs == 0) takes no step
        step = np.divide(rs, dHd, out=np.zeros(c), where=dHd > 0)
        beta += step * d
        r -= step * Hd
        a += step * Bd
        KTKa += step * KTKBd
        rs_new = (r * r).sum(axis=0)
        d = r + np.divide(rs_new, rs, out=np.zeros(c), where=rs > 0) * d
        rs = rs_new
        mse = (np.einsum("ij,ij->j", a, KTKa) - 2 * np.einsum("ij,ij->j", a, KTy) + y_sq) / n
        history.append({"iteration": k + 1, "residual": float(np.sqrt(rs / rs0).max()),
                        "loss": float(np.maximum(mse, 0).sum())})
        if not np.all(np.isfinite(a)):
            raise FloatingPointError(
                f"the conjugate gradient iterate became non-finite at iteration {k + 1}; "
                "raise alpha (the ridge penalty) or lower n_centers")
        if on_iter is not None and on_iter(a, k):
            break
    return FalkonResult(a, history, passes, float(np.sum(y_sq)) / n)
