r"""EigenPro, kernel form (Ma & Belkin 2017, Table 2; docs/design.md §2.4).

Model  f(x) = \sum_j a_j k(x, c_j)  over centers c_j that are all the training
rows (fewer centers than rows: :mod:`dkernel.solvers.falkon`, where every row
still enters the fit).  Preconditioner from a subsample S (s rows of the
centers): top q+1 eigenpairs (lambda_i, v_i) of K(S, S) / s
(:func:`subsample_preconditioner`; q among the pairs whose eigenvalues are
accurate, :func:`trusted_pairs`) and

    D = E diag(d) E^T,   E = V / sqrt(s),   d_i = (1 - (lambda_{q+1} / lambda_i)^alpha) / lambda_i

(alpha the damping, 0.95).  One step on a mini-batch b of m rows:

    g     = K(X_b, C) a - y_b                       (workers: rows they hold)
    a[b] -= (eta / m) g                              (Table 2, line 9)
    a[S] += (eta / m) E D E^T K(S, X_b) g            (correction on S only)

With beta = max_x k(x, x), the preconditioned top eigenvalue is
lambda' = lambda_1 / (lambda_1 / lambda_{q+1})^alpha, the critical batch
m* = beta / lambda' + 1 and eta = m / beta if m < m*, else
0.99 * 2m / (beta + (m - 1) lambda').  All outputs share one preconditioner.

Ridge penalty (``alpha`` > 0).  The objective is the Nystrom route's
(:mod:`dkernel.solvers.falkon`, Rudi et al. eq. 8) with every row a center,

    min_a (1/n) |K a - y|^2 + alpha a^T K a,     a = (K + n alpha I)^{-1} y

(scikit-learn's ``KernelRidge(alpha=n alpha)``).  Half its functional
gradient on a mini-batch is G = (1/m) sum_b g_i k(x_i, .) + alpha f, so the
step above takes the ridge term too, and the correction is made from G on S,
K(S, X_b) g + m alpha f(S), not from the data term alone (a correction of the
data term only would move the fixed point off the ridge solution):

    a     <- (1 - eta alpha) a
    a[b]  -= (eta / m) g
    a[S]  += (eta / m) E D E^T (K(S, X_b) g + m alpha f(S))

f(S) = K(S, C) a is carried in the state and updated with each step (its
change from the correction is K(S, S) E D E^T u = V diag(lambda d) V^T u, no
kernel products).  alpha raises every eigenvalue of the operator by alpha, so
the step rule takes beta + alpha and lambda' + alpha.

Kernel rows K(X_c, C) of the chunks a worker holds (filled before epoch 1 by
:func:`dkernel.solvers.kernel_rows.symmetric_fill`, each chunk pair once) are kept in the engine's
bounded worker cache (:mod:`dkernel.engine.cache`) when the estimator found
that they fit the workers' budget -- in float32, or as 16-bit fixed point when
only that fits (:mod:`dkernel.solvers.kernel_rows`) -- so that after the first
epoch an epoch is matrix-vector work; otherwise each step recomputes the rows
it needs (streaming, O(chunk + model) memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from dask.base import tokenize

from dkernel.backend import asarray_like, namespace
from dkernel.data.dataset import open_dataset
from dkernel.engine import cache
from dkernel.engine.program import Chunk, StepProgram
from dkernel.linalg import DENSE_MAX, Eigensystem, eigensystem
from dkernel.solvers.kernel_rows import (
    TILE_ROWS,
    buffer,
    cached_rows,
    centers_payload,
    kernel_into,
    kernel_rows_key,
    rows_products,
    stored_bytes,
    subsample_columns,
    tile_products,
)
from dkernel.solvers.targets import TargetEncoding


# --- step size and batch (docs/design.md §2.4) ----------------------------------------------
def new_top_eigenvalue(lam1: float, lam_tail: float, alpha: float) -> float:
    """lambda' = lambda_1 / (lambda_1 / lambda_{q+1})^alpha."""
    return lam1 / (lam1 / lam_tail) ** alpha


def critical_batch(beta: float, lam_new: float) -> float:
    """m* = beta / lambda' + 1."""
    return beta / lam_new + 1.0


def step_size(m: int, beta: float, lam_new: float) -> float:
    """eta = m / beta if m < m*, else 0.99 * 2m / (beta + (m - 1) lambda')."""
    if m < critical_batch(beta, lam_new):
        return m / beta
    return 0.99 * 2 * m / (beta + (m - 1) * lam_new)


def choose_q(values: np.ndarray, alpha: float, beta: float, max_batch: int) -> int:
    """Largest q whose critical batch stays <= ``max_batch`` (at least 1).

    Flattening more directions raises the step but also m*; past ``max_batch``
    rows a step no longer gains (EigenPro 2 bounds q the same way)."""
    q = 1
    for cand in range(1, len(values)):
        if values[cand] <= 0:  # numerically zero tail: no further direction is meaningful
            break
        lam_new = new_top_eigenvalue(values[0], values[cand], alpha)
        if critical_batch(beta, lam_new) > max_batch:
            break
        q = cand
    return q


def given_q(q: int, values: np.ndarray, limit: int) -> int:
    """A ``q`` the user gave, at most ``limit - 1`` (the pairs computed and
    trusted; the model's ``q_`` records what ran).  lambda_{q+1} must be
    positive: past the sample's rank it is rounding noise, and a negative one
    crashed the step size (a complex power) or divided by zero."""
    used = min(int(q), int(limit) - 1)
    # "positive" beyond the float32 eigensolver's rounding (~ pairs x eps x lambda_1):
    # its sign there moves with the BLAS threads (README, "Running on a cluster")
    floor = float(values[0]) * len(values) * 2.0**-23
    if used >= 1 and values[used] > floor:
        return used
    usable = int(np.sum(np.asarray(values[:limit]) > floor)) - 1
    fix = f"pass q <= {usable} or leave q='auto'" if usable >= 1 else "leave q='auto'"
    raise ValueError(f"q={q}: the preconditioner's eigenvalue lambda_{used + 1} is "
                     f"{float(values[used]):.3g}, not above rounding (the sample resolves no "
                     f"direction past its rank); {fix}")


#: Pairs the automatic kernel-form preconditioner asks for when q is not given
#: (EigenPro 2 computes 1000 eigenpairs of its subsample as well).
AUTO_PAIRS = 1001


def trusted_pairs(eig: Eigensystem) -> int:
    """How many leading pairs of ``eig`` have accurate eigenvalues.

    Dense pairs are exact.  Randomized Ritz values are lower bounds whose error
    grows towards the end of the sketch: the error of lambda_j shrinks like
    (lambda_{k+p+1} / lambda_j)^(2 n_iter + 1), which is close to 1 for j near k
    on a flat kernel spectrum.  Measured against dense ``eigh`` with 20
    oversamples and 2 power steps: Fashion-MNIST subsamples (bandwidth 5) are
    off by 12-16% at j = k - 1 (k = 201, 401 of s = 2000; 19% at k = 1001 of
    s = 5000) and by <= 0.5% over the first third; synthetic Gaussian-kernel
    spectra by <= 0.2% there.  lambda_{q+1} sets the step: an underestimate by
    eps makes eta too large by about eps, and the 0.99 margin of the step rule
    absorbs 1% -- so q is chosen among the first third only.
    """
    k = len(eig.values)
    return k if eig.method == "dense" else max(2, (k - 1) // 3 + 1)


def subsample_preconditioner(engine: Any, S: np.ndarray, kernel: str, bandwidth: float, *,
                             q: int | None, damping: float, beta: float, max_batch: int,
                             n_chunks: int = 4, n_pairs: int | None = None, method: str = "auto",
                             random_state: int = 0) -> tuple[KernelPreconditioner, Eigensystem]:
    """The Table 2 preconditioner from the top eigenpairs of K(S, S) / s.

    The eigenpairs come from :func:`dkernel.linalg.eigensystem` on the workers
    (rows of K(S, S) regenerated per chunk of S; dense below 4096 rows, else
    randomized).  ``q=None`` picks the largest q whose critical batch is at
    most ``max_batch`` among the pairs whose eigenvalues are accurate
    (:func:`trusted_pairs`); a given q asks for enough pairs that
    lambda_{q+1} is among them, and at least as many as "auto" does, so that
    a fit's resolved q given back computes the same eigensystem (fewer pairs
    moved the eigenvalues: predictions 7e-4 apart).  ``n_pairs`` overrides
    how many are computed.
    """
    s = S.shape[0]
    if s < 2:  # q >= 1 flattens lambda_1 down to lambda_2
        raise ValueError(f"the preconditioner's subsample has {s} row; it needs 2 or more: "
                         "raise subsample_size")
    if n_pairs is None:
        # any q that "auto" could choose (q + 1 within the pairs it trusts: all of a
        # dense solve's, the first third of a randomized one's) gets auto's pairs
        dense = method == "dense" or (method == "auto" and s <= DENSE_MAX)
        trusted_auto = min(s, AUTO_PAIRS) if dense else (AUTO_PAIRS - 1) // 3 + 1
        n_pairs = AUTO_PAIRS if q is None or int(q) + 1 <= trusted_auto else 3 * (int(q) + 1)
    n_pairs = min(s, int(n_pairs))
    data = open_dataset(S, np.arange(s), chunk_rows=math.ceil(s / max(1, int(n_chunks))))
    params = {"Z": S, "kernel": kernel, "bandwidth": bandwidth}
    # the solve in float32: the rows are float32 already, and 1001 pairs of s = 4096
    # took 4.4 s instead of 9.7 s; eigenvalues to ~1e-7 of lambda_1, far inside
    # the 1% margin of the step rule at lambda_{q+1} ~ 1e-3 lambda_1
    eig = eigensystem(engine, data, kernel_block, params, n_pairs, s, operator="rows",
                      method=method, random_state=int(random_state),
                      label="eigenpro preconditioner", dtype="float32")
    trusted = min(trusted_pairs(eig), n_pairs)
    if q is None:
        q = choose_q(eig.values[:trusted], damping, beta, max_batch)
    else:
        q = given_q(q, eig.values, trusted)
    pre = KernelPreconditioner(eig.values[: q + 1], eig.vectors[:, :q], q, damping)
    return pre, eig


@dataclass
class KernelPreconditioner:
    """E D E^T on the subsample coordinates (see module docstring)."""

    values: np.ndarray  # top q+1 eigenvalues of K(S, S) / s, descending
    vectors: np.ndarray  # (s, q) unit eigenvectors
    q: int
    alpha: float

    @property
    def tail(self) -> float:
        return float(self.values[self.q])

    @property
    def diag(self) -> np.ndarray:
        lam = self.values[: self.q]
        return (1.0 - (self.tail / lam) ** self.alpha) / lam

    @property
    def new_top(self) -> float:
        return new_top_eigenvalue(float(self.values[0]), self.tail, self.alpha)

    def correction(self, kg: np.ndarray) -> np.ndarray:
        """E D E^T kg with E = V / sqrt(s); kg = K(S, X_b) g, shape (s, c)."""
        s = self.vectors.shape[0]
        V = self.vectors
        return V @ ((self.diag / s)[:, None] * (V.T @ kg))

    def kernel_correction(self, kg: np.ndarray) -> np.ndarray:
        """K(S, S) E D E^T kg = V diag(lambda d) V^T kg (K(S, S) V = s V Lambda):
        the change of f(S) that the correction makes."""
        V = self.vectors
        return V @ ((self.values[: self.q] * self.diag)[:, None] * (V.T @ kg))


# --- worker side of a step ---------------------------------------------------------
def eigenpro_kernel_partial(payload: dict, chunk: Chunk) -> dict:
    """g = K(X_b, C) a - y_b on this task's rows, and K(S, X_b) g (summed tile by tile)."""
    C, C_sq = payload["centers"], payload["centers_sq"]
    kernel, bw, mode = payload["kernel"], payload["bandwidth"], payload["cache"]
    encoding: TargetEncoding = payload["encoding"]
    xp = namespace(chunk.X)
    a = xp.asarray(payload["coef"])
    sub = asarray_like(payload["sub_idx"], chunk.X)  # once, not per tile
    n_c, p = chunk.X.shape[0], C.shape[0]
    rows = np.arange(n_c) if chunk.rows is None else np.asarray(chunk.rows)
    stored = cached_rows(payload, chunk)
    m = rows.shape[0]
    y = encoding.encode(chunk.y_rows, np.float32)
    if stored is not None:
        # the subsample columns apart, so a step reads them without a gather (+ s / p memory)
        key = kernel_rows_key(chunk.key, payload["centers_token"], mode)
        stored_sub = cache.lookup_or_fill(key + ("sub", payload["sub_token"]),
                                          lambda: subsample_columns(stored, sub),
                                          stored_bytes(n_c, len(sub), mode), owner=chunk.run)
        g, kg = rows_products(stored, mode, rows, a, y, sub, stored_sub)
    else:
        g = xp.empty((m, a.shape[1]), dtype=np.float32)
        kg = xp.zeros((sub.shape[0], a.shape[1]), dtype=np.float64)
        for i in range(0, m, TILE_ROWS):
            r = rows[i : i + TILE_ROWS]
            T = buffer("tile", (r.shape[0], p), np.float32, chunk.X)
            kernel_into(chunk.X[r], C, C_sq, kernel, bw, T, payload.get("centers_shift"))
            tile_products(T, a, y[i : i + r.shape[0]], sub, g[i : i + r.shape[0]], kg)
    offset = int(payload["offsets"][chunk.key[1]])
    return {"ids": [rows + offset], "g": [_np(g)], "kg": _np(kg),
            "loss": float(xp.sum(g * g)), "count": m}


def _np(a: Any) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.get()


# --- the program ---------------------------------------------------------------------
@dataclass
class KernelEigenProProgram(StepProgram):
    """Engine program for Table 2; state = coefficients a (p x c, float64)."""

    centers: np.ndarray  # (p, d) float32, the training rows in order
    sub_idx: np.ndarray  # (s,) indices of S in the centers
    preconditioner: KernelPreconditioner
    kernel: str
    bandwidth: float
    encoding: TargetEncoding
    beta: float
    offsets: np.ndarray
    cache_mode: str
    centers_token: str
    label: str = "eigenpro"
    #: eta given by the user instead of the automatic one.
    eta_override: float | None = None
    #: set by early stopping; read by the engine after each epoch.
    stop: bool = False
    #: the ridge penalty alpha of (1/n)|K a - y|^2 + alpha a^T K a (module docstring)
    ridge: float = 0.0

    partial = staticmethod(eigenpro_kernel_partial)
    wants_chunk = True
    supports_backoff = True

    def init_state(self) -> dict[str, Any]:
        c = self.encoding.n_outputs
        state = {"coef": np.zeros((self.centers.shape[0], c))}
        if self.ridge > 0:
            state["f_sub"] = np.zeros((len(self.sub_idx), c))  # f(S) = K(S, C) a
        return state

    def constants(self) -> dict[str, Any]:
        return {**centers_payload(self.centers),
                "sub_idx": self.sub_idx, "offsets": self.offsets, "kernel": self.kernel,
                "bandwidth": float(self.bandwidth), "encoding": self.encoding,
                "cache": self.cache_mode, "centers_token": self.centers_token,
                "sub_token": tokenize(self.sub_idx)}

    def payload(self, state: dict[str, Any], step: int) -> dict:
        return {"coef": state["coef"].astype(np.float32)}

    def update(self, state: dict[str, Any], total: dict[str, Any], step: int) -> dict[str, Any]:
        m = int(total["count"])
        nu = self.ridge
        eta = self.eta_override or step_size(m, self.beta + nu, self.preconditioner.new_top + nu)
        lr = state.get("step_scale", 1.0) * eta / m  # halved by the engine's divergence guard
        a = state["coef"]
        kg = total["kg"]
        if nu > 0:  # the ridge term alpha f of the gradient (module docstring)
            f_sub = state["f_sub"]
            G_S = kg + (m * nu) * f_sub
            a *= 1.0 - lr * m * nu
            f_sub *= 1.0 - lr * m * nu
            f_sub += lr * (self.preconditioner.kernel_correction(G_S) - kg)
            kg = G_S
        for ids, g in zip(total["ids"], total["g"]):
            a[ids] -= lr * g  # Table 2, line 9: the batch coordinates
        a[self.sub_idx] += lr * self.preconditioner.correction(kg)  # the EigenPro correction
        return {**state, "coef": a}

    def should_stop(self, state: dict[str, Any], epoch: int) -> bool:
        return self.stop

    def fingerprint(self) -> dict[str, Any]:
        return {"solver": "eigenpro", "kernel": self.kernel, "bandwidth": float(self.bandwidth),
                "centers": self.centers_token, "q": self.preconditioner.q,
                "alpha": self.preconditioner.alpha, "n_outputs": self.encoding.n_outputs,
                # (only when set: checkpoints of unpenalised fits keep their fingerprint)
                **({"ridge": self.ridge} if self.ridge > 0 else {})}


def kernel_block(params: dict, X: Any) -> Any:
    """Kernel columns K(X_c, Z) against a subsample: the tall block for :mod:`dkernel.linalg`."""
    Z = centers_payload(params["Z"])
    out = namespace(X).empty((X.shape[0], Z["centers"].shape[0]), dtype=np.float32)
    X = X.astype(np.float32, copy=False)
    return kernel_into(X, Z["centers"], Z["centers_sq"], params["kernel"], params["bandwidth"],
                       out, Z["centers_shift"])


def predict_kernel(X: Any, centers: np.ndarray | dict, coef: np.ndarray, kernel: str,
                   bandwidth: float,
                   tile_rows: int = 512) -> Any:
    """f(X) = K(X, C) a, tile by tile through one reused buffer; ``centers``: C,
    or :func:`centers_payload` of C, computed once for many calls."""
    xp = namespace(X)
    X = X.astype(np.float32, copy=False)
    c = centers if isinstance(centers, dict) else centers_payload(_np(centers))
    C, C_sq, shift = (xp.asarray(c[k]) for k in ("centers", "centers_sq", "centers_shift"))
    a = xp.asarray(coef, dtype=np.float32)
    f = xp.empty((X.shape[0], a.shape[1]), dtype=np.float32)
    T = xp.empty((min(tile_rows, X.shape[0]), C.shape[0]), dtype=np.float32)
    for i in range(0, X.shape[0], tile_rows):
        j = min(X.shape[0], i + tile_rows)
        kernel_into(X[i:j], C, C_sq, kernel, bandwidth, T[: j - i], shift)
        xp.matmul(T[: j - i], a, out=f[i:j])
    return f
