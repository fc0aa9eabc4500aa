r"""Doubly stochastic kernel PCA, kernel SVD and kernel CCA (Xie, Liang & Song 2015).

Every view s (X, and Y for the two-view methods) holds k functions over a
pool of P seeded feature blocks of width B (D = P B features):

.. math::  H_s(x) = \phi(x)^\top A_s, \qquad A_s \in \mathbb{R}^{D \times k}.

Step t (mini-batch form of Xie App. A, one feature block i = t mod P; after
P steps existing seeds are revisited, as Xie 4.2 does):

KPCA (Alg. 1-2, eq. 10)
    h_b = H(x_b);  M = mean_b h_b h_b^T
    A   <- A (I - \eta_t M)                 (GHA variant: UT[M], Xie eq. 16)
    A_i <- A_i + (\eta_t / B) mean_b \phi_i(x_b) h_b^T
KSVD (Alg. 3)
    u_b = U(x_b), v_b = V(y_b);  W = mean_b (u_b v_b^T + v_b u_b^T)
    A <- A (I - \eta_t W),  A_i += (\eta_t/B) mean_b \phi_i(x_b) v_b^T
    B <- B (I - \eta_t W),  B_i += (\eta_t/B) mean_b \psi_i(y_b) u_b^T
KCCA (Alg. 4, eqs. 24-26; regularised covariances C_XX + \kappa I)
    A_i += (\eta_t/B) mean_b \phi_i(x_b) (v_b - W u_b)^T,  A <- A - \eta_t \kappa A W
    B_i += (\eta_t/B) mean_b \psi_i(y_b) (u_b - W v_b)^T,  B <- B - \eta_t \kappa B W

with \eta_t = \theta_0 / (1 + \theta_1 t).  The 1/B averages the block (the
kernel estimate of one block is (1/B) \phi_i(x) \phi_i(\cdot)); over a cycle
of the pool the iteration is Oja's rule for the operator E[z z^T], z = \phi/\sqrt D,
and its fixed point is orthonormal in the pool's RKHS metric
<\phi^T a, \phi^T b> = D a^T b.

Start.  Xie's printed algorithm starts at zero, which is a fixed point; we
start from a random subspace in the first ceil(k/B) blocks, orthonormal in
that metric.

Centring (ours; on by default as in scikit-learn).  Workers return
uncentred sums (\sum \phi_i H^T, \sum H H^T, \sum H, \sum \phi); the
coordinator keeps a streaming mean \mu of the features and centres the sums
exactly: \phi -> \phi - \mu, H -> H - \mu^T A.

Components are ordered afterwards by a k x k Rayleigh-Ritz step on one pass
of moments (:func:`rotate_pca`, :func:`rotate_pair`).

Power steps for KPCA and KSVD (ours; ``PowerProgram``).  A block step moves
one block of B features on a few hundred rows, so its fixed cost dominates
on a cluster (2.2% of the compute ceiling, docs/scaling.md).  On a wide
batch (tens of thousands of rows a lane) the batch covariance C_b of the
features z = \phi / \sqrt D is nearly the population's, and the step that
uses it best is a power step on the whole pool -- the noisy power method
(Hardt & Price 2014) on C, written in the coefficients A (\tilde A = \sqrt D A):

    A <- C_b A = mean_b (\phi(x_b) - \mu) (h_b - \bar h)^T / D,
    A <- A R^{-1},  R^T R = D A^T A           (orthonormal in the pool metric)

KSVD's step is the same on the cross-covariance (two-sided subspace
iteration; Golub & Van Loan 8.6 for the SVD of C_xy), both views from the
old pair:

    A <- C_xy B = mean_b (\phi(x_b) - \mu_x) (v_b - \bar v)^T / D,
    B <- C_yx A = mean_b (\psi(y_b) - \mu_y) (u_b - \bar u)^T / D,

each view then orthonormal in its pool metric, so two steps apply C_xy C_yx
to span(A): the singular subspaces at \sigma_{k+1} / \sigma_k a step.

A step on m rows shorter than a full one (a chunk's last rows, a small
last chunk) is a power step on the blend w C_b + (1 - w) C_prev with
w = m / batch_size, C_prev A = A M_bar the earlier steps' Rayleigh matrix
in the pool metric (KSVD: C_prev B = A M_bar, C_prev^T A = B M_bar^T with
M_bar = mean u v^T), carried into each step's new bases: the last step of a
fit sets the subspace, and a 2-row one would otherwise replace it with noise.

It converges at \lambda_{k+1} / \lambda_k a step where Oja's rule at
\eta = 1 / \lambda_1 (the block steps over a pool cycle) converges at
(1 + \eta \lambda_{k+1}) / (1 + \eta \lambda_k), and it has no step size.
The workers' sums are the block steps' (the same centring), computed in one
fused forward/backward pass over row tiles (:mod:`dkernel.solvers.fused`),
both views' tiles side by side for KSVD (and for KCCA's preconditioned
whole-pool steps below, which need the same sums).

Exact steps for KPCA and KSVD (ours; :func:`exact_coefficients`).  On data
of up to ~16k rows (``steps="auto"``) the fixed point of both iterations is
computed over all rows: the top k eigenvectors e_i of C = mean (z - \mu)(z -
\mu)^T (KPCA) or the top k singular pairs (u_i, v_i) of C_xy = mean (z_x -
\mu_x)(z_y - \mu_y)^T (KSVD), z = \phi / \sqrt D, by subspace iteration
with oversampling, every product one pass over the rows; the coefficients
are A = E / \sqrt D (so H(x) = z(x)^T e_i and D A^T A = I).  It has no step
size and no sampling noise: a power step on a batch of m rows converges to
the top subspace of that batch's covariance, whose distance from C's is of
order sqrt(lambda_1 / m) / (lambda_k - lambda_{k+1}), and on a few thousand
rows m is a few hundred (n / 8).

Preconditioned KCCA (ours; EigenPro's idea, Ma & Belkin 2017, applied to
Alg. 4).  Alg. 4 moves along the i-th eigenfunction of C_XX at a rate
~ \eta \lambda_i with \eta < ~1 / \lambda_1, so canonical functions in the
low-variance directions of a slowly decaying spectrum need thousands of
steps.  With ``preconditioners`` every step updates the whole pool (all P
blocks; over a cycle of the pool Alg. 4 applies the same step at 1/P of the
size per step) through P_s = I - E_s (I - \lambda_{q+1} \Lambda_s^{-1}) E_s^T,
the top-q eigenpairs of the view's feature covariance
(:class:`dkernel.solvers.eigenpro_rf.FeaturePreconditioner`, tau = 1):

    A <- A + \eta P_x [ mean_b \phi(x_b) (v_b - W u_b)^T / D - \kappa A W ]
    B <- B + \eta P_y [ mean_b \psi(y_b) (u_b - W v_b)^T / D - \kappa B W ]

P_s flattens the top of the spectrum to \lambda_{q+1}, so \eta can grow by
\lambda_1 / \lambda_{q+1}; the fixed point (the regularised CCA of the pool)
does not change.  That \eta is sized for the batch that set q: a step on
fewer rows m (a chunk's last rows) takes \eta m / batch_size, as EigenPro's
step is linear in m below the critical batch (on Fashion-MNIST halves the
96-row step that ended one epoch cost 0.8-3.6 of the held-out correlation
sum at the full \eta, recovered only over the next epoch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.linalg import cholesky, solve_triangular

from dkernel.backend import asarray_like, namespace, to_numpy
from dkernel.engine.program import Chunk, StepProgram
from dkernel.features import FeatureMap
from dkernel.solvers.eigenpro_rf import FeaturePreconditioner
from dkernel.solvers.feature_cache import block_rows, mode_of
from dkernel.solvers.fused import feature_tiles, tile_rows
from dkernel.solvers.subspace import (  # noqa: F401  (the estimators' names, here since 0.1)
    EXACT_ITERATIONS,
    EXACT_OVERSAMPLES,
    centred_moments,
    exact_coefficients,
    moments_partial,
    moments_payload,
    pool_gram,
    regularized_cca,
    rotate_pair,
    rotate_pca,
    view_chunk,
)

METHODS = ("kpca", "ksvd", "kcca")


def init_blocks(n_components: int, block_size: int) -> int:
    """Blocks that carry the starting subspace: enough columns for k functions."""
    return max(1, math.ceil(n_components / block_size))


def initial_coef(features: FeatureMap, n_blocks: int, n_components: int, seed: Any) -> np.ndarray:
    """A random k-dimensional subspace in the first blocks, orthonormal in the
    pool metric D a^T b (Xie et al. need a non-zero start: zero is a fixed point)."""
    B = features.block_size
    D = n_blocks * B
    n0 = init_blocks(n_components, B)
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((n0 * B, n_components)))
    A = np.zeros((D, n_components))
    A[: n0 * B] = Q / math.sqrt(D)
    return A


#: ``block`` value of a step that updates every block of the pool.
ALL_BLOCKS = -1


def components_partial(payload: dict, chunk: Chunk) -> dict:
    """Worker side of one step: the values H of every view on the rows and the
    uncentred sums the coordinator needs (see module docstring).  A
    whole-pool step (KernelCCA's preconditioned ones) takes the fused pass of
    :func:`power_partial`, the same sums in a few MB of tiles: built here,
    its rows x D features per view would cap the rows of a step."""
    if payload["views"][0]["block"] == ALL_BLOCKS:
        return power_partial(payload, chunk)
    values, phis, sums = [], [], []
    for s, view in enumerate(payload["views"]):
        features: FeatureMap = view["features"]
        vchunk = view_chunk(chunk, s)
        rows = vchunk.X_rows
        xp = namespace(rows)
        coef = asarray_like(view["coef"], rows)
        B = features.block_size
        H = xp.zeros((rows.shape[0], coef.shape[1]), dtype=np.dtype(features.dtype))
        phi_sum, updated = [], None
        for j in range(view["n_eval"]):
            phi = block_rows(features, vchunk, j, mode_of(payload))
            if j * B < coef.shape[0]:
                H += phi @ coef[j * B : (j + 1) * B]
            phi_sum.append(phi.sum(axis=0))
            if view["block"] == j:
                updated = phi
        values.append(H)
        sums.append(xp.concatenate(phi_sum))
        phis.append(updated)
    Hc = values[0] if len(values) == 1 else namespace(values[0]).concatenate(values, axis=1)
    out = {
        "H": Hc.sum(axis=0).astype(np.float64),
        "HH": (Hc.T @ Hc).astype(np.float64),
        "count": int(Hc.shape[0]),
    }
    for s in range(len(values)):
        out[f"phi_sum{s}"] = sums[s].astype(np.float64)
        out[f"phiH{s}"] = to_numpy(phis[s].T @ Hc).astype(np.float64)
    return out


def power_partial(payload: dict, chunk: Chunk) -> dict:
    """Worker side of a power step (KPCA, KSVD): ``components_partial``'s sums
    over the whole pool of every view (H, H^T H, Phi_s^T H, Phi_s^T 1, with H
    all views' scores), in one fused pass over row tiles: a tile's features
    of each view are generated (or taken from the worker cache) once, for the
    forward products and then the backward ones, so a task holds a few MB
    whatever its rows."""
    views = payload["views"]
    chunks = [view_chunk(chunk, s) for s in range(len(views))]
    dt = np.dtype(views[0]["features"].dtype)
    coefs = [asarray_like(v["coef"], c.X).astype(dt, copy=False) for v, c in zip(views, chunks)]
    xp = namespace(coefs[0])
    k = sum(c.shape[1] for c in coefs)
    mode = mode_of(payload)
    rows = tile_rows(sum(c.shape[0] for c in coefs), dt.itemsize, blockwise=mode != "off")
    streams = [feature_tiles(v["features"], c, v["n_eval"], rows, mode, slot=s)
               for s, (v, c) in enumerate(zip(views, chunks))]
    H_sum, HH = np.zeros(k), np.zeros((k, k))
    G = [np.zeros((c.shape[0], k + 1)) for c in coefs]
    for tiles in zip(*streams, strict=True):
        # every stream tiles the same rows the same way (same row count and tile size)
        H = xp.concatenate([sum(f * (Z @ coef[cols]) for cols, Z, f in pieces)
                            for (_, pieces), coef in zip(tiles, coefs)], axis=1)
        H_sum += to_numpy(H.sum(axis=0)).astype(np.float64)
        HH += to_numpy(H.T @ H).astype(np.float64)
        L = xp.concatenate([H, xp.ones((H.shape[0], 1), dtype=dt)], axis=1)
        for g, (_, pieces) in zip(G, tiles):
            for cols, Z, f in pieces:
                g[cols] += f * to_numpy(Z.T @ L)
    m = chunk.X.shape[0] if chunk.rows is None else len(chunk.rows)
    out = {"H": H_sum, "HH": HH, "count": int(m)}
    for s, g in enumerate(G):
        out[f"phi_sum{s}"] = g[:, k].copy()
        # D x k per view and task: float32 halves the traffic; these are gradient
        # terms, not the moments that fix the metric
        out[f"phiH{s}"] = g[:, :k].astype(np.float32)
    return out


@dataclass
class ComponentProgram(StepProgram):
    """Engine program for Xie et al. Alg. 1 (kpca), 3 (ksvd) and 4 (kcca)."""

    method: str
    features: tuple[FeatureMap, ...]
    n_blocks: int
    n_components: int
    step_size: float
    step_decay: float
    alpha: float = 0.0
    center: bool = True
    gha: bool = False
    record_at: tuple[int, ...] = ()
    label: str = "components"
    seed: int = 0
    #: Starting coefficients per view (rows of the first blocks); None: a random
    #: orthonormal subspace (:func:`initial_coef`).
    init: tuple[np.ndarray, ...] | None = field(default=None, repr=False)
    #: One per view (kcca only): whole-pool preconditioned steps (module docstring).
    preconditioners: tuple[FeaturePreconditioner, ...] | None = field(default=None, repr=False)
    #: Rows of a full step; with preconditioners a shorter one (a chunk's last
    #: rows) takes eta m / batch_size (module docstring).
    batch_size: int = 0
    #: where feature blocks live between epochs (:data:`feature_cache.MODES`)
    cache_blocks: str = "float32"
    _record: dict = field(default_factory=dict, repr=False)
    #: Row-weighted sum of the batches' centred score moments M since the
    #: last :meth:`epoch_objective` (the per-epoch history of the estimators).
    _epoch: dict = field(default_factory=dict, repr=False)

    partial = staticmethod(components_partial)
    wants_chunk = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if len(self.features) != (1 if self.method == "kpca" else 2):
            raise ValueError(
                f"{self.method} needs {1 if self.method == 'kpca' else 2} feature maps"
            )
        if len({f.block_size for f in self.features}) != 1:
            raise ValueError("both views must use the same block_size")
        if self.preconditioners is not None and (
            self.method != "kcca" or len(self.preconditioners) != len(self.features)
        ):
            raise ValueError("preconditioners apply to kcca, one per view")
        self._record = {int(r): i for i, r in enumerate(sorted(set(self.record_at)))}
        self._n_start = init_blocks(self.n_components, self.B)
        if self.init is not None:
            rows = max(a.shape[0] for a in self.init)
            self._n_start = max(self._n_start, min(self.n_blocks, math.ceil(rows / self.B)))

    @property
    def B(self) -> int:
        return self.features[0].block_size

    def init_state(self) -> dict[str, Any]:
        D, k = self.n_blocks * self.B, self.n_components
        state: dict[str, Any] = {}
        for s, f in enumerate(self.features):
            if self.init is None:
                state[f"coef{s}"] = initial_coef(f, self.n_blocks, k, [int(self.seed), 0x1A17, s])
            else:
                state[f"coef{s}"] = np.zeros((D, k))
                state[f"coef{s}"][: self.init[s].shape[0]] = self.init[s]
            state[f"mu{s}"] = np.zeros(D)
            state[f"seen{s}"] = np.zeros(self.n_blocks)
        if self._record:
            state["recorded"] = np.zeros((len(self._record), D, k))
        return state

    #: Whole-pool power steps (KPCA, KSVD: :class:`PowerProgram`).
    power = False

    def _active(self, step: int) -> tuple[int, int, int]:
        """(block i of this step, blocks with coefficients, blocks to evaluate)."""
        if self.preconditioners is not None or self.power:
            return ALL_BLOCKS, self.n_blocks, self.n_blocks
        i = step % self.n_blocks
        n_act = max(self._n_start, min(step, self.n_blocks))
        return i, n_act, max(n_act, i + 1)

    def payload(self, state: dict[str, Any], step: int) -> dict:
        i, n_act, n_eval = self._active(step)
        views = [
            {
                "features": f,
                "block": i,
                "n_eval": n_eval,
                "coef": state[f"coef{s}"][: n_act * self.B].astype(f.dtype),
            }
            for s, f in enumerate(self.features)
        ]
        return {"views": views, "cache": self.cache_blocks}

    def update(self, state: dict[str, Any], total: dict[str, Any], step: int) -> dict[str, Any]:
        i, n_act, n_eval = self._active(step)
        B, k, m = self.B, self.n_components, float(total["count"])
        blk = slice(0, n_eval * B) if i == ALL_BLOCKS else slice(i * B, (i + 1) * B)
        S_H, S_HH = total["H"], total["HH"]
        c_H = np.zeros_like(S_H)  # mean of H (zero when not centring)
        mu_i = []
        for s in range(len(self.features)):
            mu, seen = state[f"mu{s}"], state[f"seen{s}"]
            if self.center:  # streaming mean of the features, this batch included
                seen[:n_eval] += m
                w = np.repeat(m / seen[:n_eval], B)
                mu[: n_eval * B] += w * (total[f"phi_sum{s}"] / m - mu[: n_eval * B])
                c_H[s * k : (s + 1) * k] = mu[: n_act * B] @ state[f"coef{s}"][: n_act * B]
            mu_i.append(mu[blk])
        # centred second moments, exactly from the uncentred sums
        M = (S_HH - np.outer(S_H, c_H) - np.outer(c_H, S_H)) / m + np.outer(c_H, c_H)
        G = [
            (total[f"phiH{s}"] - np.outer(mu_i[s], S_H) - np.outer(total[f"phi_sum{s}"][blk], c_H))
            / m
            + np.outer(mu_i[s], c_H)
            for s in range(len(self.features))
        ]
        self._epoch["M"] = self._epoch.get("M", 0.0) + m * M
        self._epoch["rows"] = self._epoch.get("rows", 0.0) + m
        eta = self.step_size / (1.0 + self.step_decay * step)
        A = state["coef0"]
        if self.power:  # module docstring
            self._power_step(state, G, M, m, step)
        elif self.method == "kpca":  # Xie eq. (10) / App. A; GHA: eq. (16)
            A -= eta * (A @ (np.triu(M) if self.gha else M))
            A[blk] += (eta / B) * G[0]
        else:
            Bc = state["coef1"]
            W = M[:k, k:] + M[:k, k:].T  # mean (u v^T + v u^T)
            if self.method == "ksvd":  # Xie Alg. 3
                A -= eta * (A @ W)
                Bc -= eta * (Bc @ W)
                A[blk] += (eta / B) * G[0][:, k:]
                Bc[blk] += (eta / B) * G[1][:, :k]
            elif self.preconditioners is not None:  # whole pool, preconditioned (docstring)
                D = A.shape[0]
                Px, Py = self.preconditioners
                if m < self.batch_size:
                    eta *= m / self.batch_size
                A += eta * Px.apply((G[0][:, k:] - G[0][:, :k] @ W) / D - self.alpha * (A @ W))
                Bc += eta * Py.apply((G[1][:, :k] - G[1][:, k:] @ W) / D - self.alpha * (Bc @ W))
            else:  # kcca, Xie Alg. 4 with regulariser kappa = alpha
                if self.alpha:
                    A -= (eta * self.alpha) * (A @ W)
                    Bc -= (eta * self.alpha) * (Bc @ W)
                A[blk] += (eta / B) * (G[0][:, k:] - G[0][:, :k] @ W)
                Bc[blk] += (eta / B) * (G[1][:, :k] - G[1][:, k:] @ W)
        if not all(np.all(np.isfinite(state[f"coef{s}"])) for s in range(len(self.features))):
            if self.power:
                raise FloatingPointError(
                    f"{self.method} power step {step} gave non-finite coefficients on {int(m)} "
                    "rows; check the data for huge values or use a larger bandwidth")
            raise FloatingPointError(
                f"{self.method} diverged at step {step} (step size eta={eta:.3g}); "
                "use a smaller step_size"
            )
        if step + 1 in self._record:
            state["recorded"][self._record[step + 1]] = A
        return state

    def _power_step(self, state: dict[str, Any], G: list, M: np.ndarray, m: float,
                    step: int) -> None:
        """KPCA A <- C_b A; KSVD A <- C_xy B, B <- C_yx A (both from the old
        pair); each view then orthonormal in the pool metric.  C_b X is the
        step's G over D; a short step blends in the earlier steps' operator on
        span(A) (and span(B)) through its Rayleigh matrix (module docstring)."""
        k = self.n_components
        coefs = [state[f"coef{s}"] for s in range(len(self.features))]
        D = coefs[0].shape[0]
        if self.method == "kpca":
            new, ray = [G[0] / D], M  # ray = D A^T C A, the scores' covariance
        else:
            new, ray = [G[0][:, k:] / D, G[1][:, :k] / D], M[:k, k:]  # D A^T C_xy B
        full = self.batch_size
        if full and m < full:
            # a short step (a chunk's last rows, a small last chunk): power on the
            # row-weighted blend with the previous steps' operator -- a 2-row
            # step must not set the subspace
            w = m / full
            prev = state["power_M"] if np.any(state["power_M"]) else ray
            earlier = [coefs[0] @ prev] if len(coefs) == 1 else [coefs[0] @ prev, coefs[1] @ prev.T]
            new = [(1.0 - w) * e + w * n for e, n in zip(earlier, new)]
            state["power_M"] = (1.0 - w) * prev + w * ray
        else:
            state["power_M"] = ray
        olds = [A.copy() for A in coefs]
        for A, A_new in zip(coefs, new):
            try:
                R = cholesky(D * (A_new.T @ A_new))
            except np.linalg.LinAlgError:
                raise FloatingPointError(
                    f"{self.method} power step {step} lost rank on {int(m)} rows: the batch's "
                    f"covariance has fewer than n_components={k} directions in the pool; use "
                    "fewer components or a larger batch_size") from None
            A[:] = solve_triangular(R, A_new.T, trans="T").T
        # the Rayleigh matrix in the new bases, which the next short step multiplies:
        # new = old T on a converged span, T = D old^T new.  Left in the old ones, a
        # KSVD blend (M_xy not symmetric, the bases still turning inside the span when
        # singular values are close) could cancel a direction and fill it with noise
        T = [D * (o.T @ A) for o, A in zip(olds, coefs)]
        state["power_M"] = T[0].T @ state["power_M"] @ T[-1]

    def slow_hint(self) -> str:
        if self.method in ("kpca", "ksvd") and not self.power:
            return ("power steps (steps='auto' with step_size, step_decay"
                    + (", ordering" if self.method == "kpca" else "") + " at their defaults)")
        return super().slow_hint()

    def metrics(self, total: dict[str, Any]) -> dict[str, float]:
        m = float(total["count"])
        return {"trace": float(np.trace(total["HH"]) / m)}

    def epoch_objective(self) -> dict[str, float | None]:
        """The objective on the mini-batches since the last call (then reset),
        from their centred score moments M, each batch scored before its step:
        kpca ``variance`` = trace M, the variance the k scores capture (what
        Oja's rule maximises); ksvd ``covariance`` = the sum of the singular
        values of the cross moment M_xy; kcca ``correlation`` = the sum of the
        canonical correlations between the two k-dimensional score spaces."""
        acc, self._epoch = self._epoch, {}
        if not acc.get("rows"):
            return {}
        M, k = acc["M"] / acc["rows"], self.n_components
        if self.method == "kpca":
            return {"variance": float(np.trace(M))}
        if self.method == "ksvd":
            return {"covariance": float(np.linalg.svd(M[:k, k:], compute_uv=False).sum())}
        try:
            return {"correlation": float(rotate_pair(M[:k, :k], M[k:, k:], M[:k, k:])[2].sum())}
        except np.linalg.LinAlgError:  # a score space collapsed: no correlation to report
            return {"correlation": None}

    def fingerprint(self) -> dict[str, Any]:
        return {
            "solver": self.method,
            "features": [f.to_dict() for f in self.features],
            "n_blocks": self.n_blocks,
            "n_components": self.n_components,
            "step_size": self.step_size,
            "step_decay": self.step_decay,
            "alpha": self.alpha,
            "center": self.center,
            "gha": self.gha,
            # 2: power_M carried into each step's bases (3946ecb); a checkpoint of
            # the earlier power steps holds it in stale bases, or not at all
            "power": 2 if self.power else False,
            "record_at": sorted(self._record),
            "seed": int(self.seed),
            "init": None if self.init is None else [_digest(np.sum(a * a)) for a in self.init],
            "preconditioners": None
            if self.preconditioners is None
            else [[p.q, p.tau, _digest(np.sum(p.values))] for p in self.preconditioners],
        }


@dataclass
class PowerProgram(ComponentProgram):
    """KPCA and KSVD by whole-pool power steps (module docstring), for wide batches."""

    partial = staticmethod(power_partial)
    power = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.method not in ("kpca", "ksvd") or self.preconditioners is not None or self.gha:
            raise ValueError("power steps are for kpca and ksvd, without preconditioners or GHA")

    def init_state(self) -> dict[str, Any]:
        # the Rayleigh matrix of the steps so far (a short step's blend)
        k = self.n_components
        return {**super().init_state(), "power_M": np.zeros((k, k))}


def _digest(x: float) -> float:
    """A float for a checkpoint fingerprint, to 8 digits: a resumed fit recomputes
    its start and preconditioner, and BLAS may round the last bits differently
    (memory alignment, thread count) without the fit being another one."""
    return float(f"{float(x):.8g}")
