r"""Doubly stochastic functional gradients (Dai et al. 2014, Alg. 1-2).

Model:  f(x) = s \sum_j \phi_{w_j}(x)^T a_j   over a pool of feature blocks
(seeds j = 0..P-1), with one global scale factor ``s``.

Iteration t (Dai et al. Alg. 1, with mini-batches and blocks of width B):

    data mini-batch {(x_b, y_b)} (spread over the engine's lanes)
    block  i = t mod P       -- a new seed while t < P, afterwards an existing
                                seed is revisited (block-coordinate SGD on a
                                fixed pool, as Xie et al. 4.2 do)
    \xi     = mean_b l'(f(x_b), y_b) \phi_{w_i}(x_b)          (workers, summed)
    s      <- (1 - \gamma_t \nu) s                            (old blocks shrink)
    a_i    <- a_i - (\gamma_t / B) \xi / s                     (1/B: block average)
    \gamma_t = \theta_0 / (1 + \theta_1 t)

The outputs (columns of a) never mix: every loss but softmax is elementwise,
so each column descends its own loss.  \theta_0 may therefore be one per
output (``step_size`` a tuple; DSGRegressor's bounded-gradient losses, whose
step follows each column's spread), with one scale s per output for the
ridge shrink; each column then takes the steps it would take alone.

Evaluating f on the batch uses every active block, so a step costs
O(m P B d); the pool cap ``n_features = P B`` bounds it.  Workers keep the
blocks Phi_j(X_c) of the chunks they hold in the engine's bounded cache
(:mod:`dkernel.engine.cache`), so once the pool is built and cached an
epoch costs O(n P B c) instead of O(n P B d); when the cache is full the
rows' blocks are regenerated from their seeds.

Preconditioned whole-pool steps (``preconditioner`` set; ours, EigenPro's
idea -- Ma & Belkin 2017, Table 1 -- applied to Dai's functional step, as
KernelCCA does).  f is evaluated over the whole pool on every step anyway,
and the gradient of every block costs about as much as f, so each step
updates all D features (an RKHS step with the D-feature kernel instead of
a B-feature one):

    a <- a - \gamma_t P ( mean_b \phi(x_b) l'(f(x_b), y_b) / D  +  \nu a )
    P  = I - E (I - \tau \lambda_{q+1} \Lambda^{-1}) E^T     (Table 1, line 2)

from the top-q eigenpairs of the scaled pool covariance E[z z^T],
z = \phi / sqrt(D), on a subsample.  P flattens the top of the spectrum to
\lambda_{q+1}, so the critical batch m* = \beta / \lambda_{q+1} + 1 grows from
a handful of rows to thousands and a wide step (many rows on every worker,
which amortises the step's fixed cost) is no longer wasted:
\gamma_t = c_loss \eta(m) / 2 / (1 + \theta_1 t), \eta(m) EigenPro's step for
a batch of m rows (linear in m below m*), c_loss the loss's inverse curvature.

Rounds of local steps (``local_steps`` k > 1): each lane takes k of these
steps on its own rows between two averages of the lanes' coefficients
(:mod:`dkernel.solvers.local_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dkernel.backend import asarray_like, namespace
from dkernel.engine.program import Chunk, StepProgram
from dkernel.features import FeatureMap
from dkernel.losses import BOUNDED_GRADIENT, get_loss
from dkernel.solvers.eigenpro import step_size as eigenpro_step
from dkernel.solvers.eigenpro_rf import FeaturePreconditioner
from dkernel.solvers.feature_cache import block_rows, mode_of
from dkernel.solvers.fused import pool_gradient
from dkernel.solvers.local_steps import local_round, round_constants, round_payload, round_update
from dkernel.solvers.targets import TargetEncoding

# Feature tiles of this many columns keep the (rows x tile) slab in cache-ish
# memory instead of materialising rows x D at once (docs/design.md §4: fresh pages are slow).
_TILE_COLUMNS = 2048


def decision(features: FeatureMap, coef: Any, X: Any) -> Any:
    """f(X) = Phi(X) coef over ``coef.shape[0] // B`` blocks, tile by tile."""
    xp = namespace(X)
    B = features.block_size
    n_blocks = coef.shape[0] // B
    f = xp.zeros((X.shape[0], coef.shape[1]), dtype=np.dtype(features.dtype))
    per_tile = max(1, _TILE_COLUMNS // B)
    for start in range(0, n_blocks, per_tile):
        ids = list(range(start, min(n_blocks, start + per_tile)))
        f += features.blocks(X, ids) @ coef[start * B : (start + len(ids)) * B]
    return f


def chunk_decision(features: FeatureMap, chunk: Chunk, coef: Any, mode: str = "float32") -> Any:
    """f = Phi(X_c[rows]) coef over ``coef.shape[0] // B`` blocks, from the worker
    cache where the blocks are held in ``mode`` (:func:`feature_cache.block_rows`)."""
    B = features.block_size
    n = chunk.X.shape[0] if chunk.rows is None else len(chunk.rows)
    f = namespace(chunk.X).zeros((n, coef.shape[1]), dtype=np.dtype(features.dtype))
    for j in range(coef.shape[0] // B):
        f += block_rows(features, chunk, j, mode) @ coef[j * B : (j + 1) * B]
    return f


def dsg_partial(payload: dict, chunk: Chunk) -> dict:
    """Worker side of one step: f on the rows, loss derivative, block gradient
    (``payload["block"]`` an int) or every block's gradient (None)."""
    features: FeatureMap = payload["features"]
    encoding: TargetEncoding = payload["encoding"]
    dt = np.dtype(features.dtype)
    X = chunk.X_rows
    xp = namespace(X)
    coef = asarray_like(payload["coef"], X)
    block = payload["block"]
    Y = encoding.encode(chunk.y_rows, dt)
    mode = mode_of(payload)
    if block is None:
        return _pool_partial(features, chunk, coef, Y, payload["loss"], mode)
    f = chunk_decision(features, chunk, coef, mode)  # f(x_b) over every active block
    value, dl = get_loss(payload["loss"])(f, Y)
    phi = block_rows(features, chunk, block, mode)
    return {"grad": (phi.T @ dl).astype(np.float64), "loss": float(xp.sum(value)),
            "count": X.shape[0]}


def _round_gradient(payload: dict, chunk: Chunk, coef: Any) -> dict:
    """Every block's gradient at ``coef`` (a local step: solvers/local_steps.py)."""
    return dsg_partial({**payload, "coef": coef, "block": None}, chunk)


def _pool_partial(features: FeatureMap, chunk: Chunk, coef: Any, Y: Any, loss: str,
                  mode: str) -> dict:
    """Every block's gradient in one fused pass over row tiles (:mod:`dkernel.solvers.fused`)."""
    loss_fn = get_loss(loss)
    xp = namespace(Y)

    def derivative(f: Any, tile: slice) -> tuple[float, Any]:
        value, dl = loss_fn(f, Y[tile])
        return float(xp.sum(value)), dl

    grad, total = pool_gradient(features, chunk, coef.shape[0] // features.block_size, coef,
                                derivative, mode)
    return {"grad": grad, "loss": total, "count": int(Y.shape[0])}


def ridge_step(step: float, alpha: float) -> float:
    """gamma_0 with the ridge term's curvature added to the data term's:
    1 / (1 / ``step`` + alpha).

    Both updates (module docstring) multiply the model by 1 - gamma nu on top
    of the data term's change: the scale s of Alg. 1, and every direction P
    leaves alone in the preconditioned step.  A step set by the data's
    curvature alone is ~1 / lambda' (1e3-1e5 with the preconditioner), so
    nu = 1e-3 made 1 - gamma nu << -1: the model flipped sign and grew each
    step (a binary DSGClassifier at 0.30 accuracy, without a warning).
    Curvatures add, so the sum keeps gamma nu < 1 and changes nothing while
    nu << 1 / step.
    """
    return 1.0 / (1.0 / float(step) + float(alpha))


@dataclass
class DSGProgram(StepProgram):
    """Engine program for Dai et al. Alg. 1; state = pool coefficients + scale.

    With ``preconditioner`` every step updates the whole pool (module
    docstring); ``step_size`` is then gamma_0 for a step of ``batch_size``
    rows, and a shorter step (a chunk's last rows) takes the EigenPro step of
    its own size, eta(m) / eta(batch_size) of it.  ``state["step_scale"]``
    (set by the engine's divergence guard) multiplies every step.  A tuple
    ``step_size`` holds one gamma_0 per output (module docstring): ``scale``
    is then one per output too.
    """

    features: FeatureMap
    loss: str | dict  # a losses.LossSpec: the name, or name + parameters (loss_spec)
    encoding: TargetEncoding
    n_blocks: int
    alpha: float
    step_size: float | tuple[float, ...]
    step_decay: float
    label: str = "dsg"
    preconditioner: FeaturePreconditioner | None = None
    #: beta = max |z(x)|^2 over the preconditioner's sample (pool mode)
    beta: float = 1.0
    batch_size: int = 1
    #: where feature blocks live between epochs (:data:`feature_cache.MODES`)
    cache_blocks: str = "float32"
    #: also keep the average of the iterates, f_avg = (1/t) sum_i f_i (Dai et al.
    #: Fig. 4(2) plots it): see :meth:`averaged`
    average: bool = False
    #: preconditioned steps a lane takes between two averages (module docstring)
    local_steps: int = 1
    #: rows of one lane's local step (``local_steps`` > 1)
    step_rows: int = 0

    wants_chunk = True
    bundles_chunks = True  # a small chunk's lane reads several (data.plan.chunk_bundles)
    supports_backoff = True

    @staticmethod
    def partial(payload: dict, chunk: Chunk) -> dict:
        if "round_coef" in payload:
            return local_round(payload, chunk, _round_gradient)
        return dsg_partial(payload, chunk)

    @property
    def rounds(self) -> bool:
        """Rounds of local steps (module docstring) instead of synchronous steps."""
        return self.preconditioner is not None and self.local_steps > 1

    @property
    def gamma0(self) -> float | np.ndarray:
        """gamma_0: a float, or an array of one per output (broadcasts over coef's columns)."""
        if isinstance(self.step_size, (tuple, list)):
            return np.asarray(self.step_size, dtype=np.float64)
        return self.step_size

    def constants(self) -> dict[str, Any] | None:
        if not self.rounds:
            return None
        return round_constants(self.preconditioner)

    def init_state(self) -> dict[str, Any]:
        D = self.n_blocks * self.features.block_size
        state = {"coef": np.zeros((D, self.encoding.n_outputs)), "scale": 1.0}
        if self.rounds:
            state["t"] = 0.0  # local steps so far: the schedule's step count
        if self.average:
            # f_i = s_i C_i (scale s_i, stored coef C_i = sum_{k<=i} delta_k), so
            # sum_{i<=t} f_i = P_t C_t - sum_k delta_k P_{k-1} with P_i = sum_{k<=i} s_k:
            # the average costs O(changed coefficients) a step, like the update
            # (P C and the sum of delta P cancel to the real sum, so the scale is
            # folded into C, and the sum so far banked, whenever it falls below
            # _AVERAGE_FOLD: C then never exceeds ~1000x the model's size)
            state.update({"avg_P": 0.0, "avg_A": np.zeros_like(state["coef"]), "avg_n": 0,
                          "avg_bank": np.zeros_like(state["coef"])})
        return state

    def averaged(self, state: dict[str, Any]) -> np.ndarray:
        """(1/t) sum_{i<=t} f_i as one coefficient vector (``average=True``)."""
        n = max(int(state["avg_n"]), 1)
        return (state["avg_bank"] + state["avg_P"] * state["coef"] - state["avg_A"]) / n

    def _accumulate(self, state: dict, delta: np.ndarray, rows: slice, scale: float) -> dict:
        """Record step t's change ``delta`` of coef[rows], then s_t = ``scale``."""
        A = state["avg_A"]
        A[rows] += delta * state["avg_P"]
        return {"avg_P": state["avg_P"] + scale, "avg_A": A, "avg_n": int(state["avg_n"]) + 1}

    def payload(self, state: dict[str, Any], step: int) -> dict:
        B = self.features.block_size
        if self.rounds:
            D = state["coef"].shape[0]
            return {"features": self.features, "encoding": self.encoding, "loss": self.loss,
                    "cache": self.cache_blocks,
                    **round_payload(state["coef"], state["t"],
                                    gamma0=state.get("step_scale", 1.0) * self.gamma0,
                                    step_decay=self.step_decay, ridge=self.alpha, grad_scale=D,
                                    step_rows=self.step_rows, beta=self.beta,
                                    new_top=self.preconditioner.new_top, short_steps=True)}
        if self.preconditioner is not None:
            coef = (state["coef"] * state["scale"]).astype(self.features.dtype)
            return {"features": self.features, "encoding": self.encoding, "loss": self.loss,
                    "coef": coef, "block": None, "cache": self.cache_blocks}
        active = min(step, self.n_blocks)  # blocks that already carry weight
        coef = (state["coef"][: active * B] * state["scale"]).astype(self.features.dtype)
        return {"features": self.features, "encoding": self.encoding, "loss": self.loss,
                "coef": coef, "block": step % self.n_blocks, "cache": self.cache_blocks}

    def update(self, state: dict[str, Any], total: dict[str, Any], step: int) -> dict[str, Any]:
        B = self.features.block_size
        m = int(total["count"])
        gamma = state.get("step_scale", 1.0) * self.gamma0 / (1.0 + self.step_decay * step)
        coef = state["coef"]
        if self.rounds:  # the lanes' coefficients, weighted by their rows
            new = round_update(state, total, "coef")
            avg = (self._accumulate(state, new["coef"] - coef, slice(None), 1.0)
                   if self.average else {})
            return {**new, "scale": 1.0, **avg}
        if self.preconditioner is not None:
            P = self.preconditioner
            gamma *= (eigenpro_step(m, self.beta, P.new_top)
                      / eigenpro_step(self.batch_size, self.beta, P.new_top))
            D = coef.shape[0]
            coef *= state["scale"]  # 1 in this mode
            delta = -gamma * P.apply(total["grad"] / (m * D) + self.alpha * coef)
            coef += delta
            avg = self._accumulate(state, delta, slice(None), 1.0) if self.average else {}
            return {**state, "coef": coef, "scale": 1.0, **avg}
        # Dai et al. Alg. 1: old blocks *= (1 - gamma_t nu); one factor per output
        # where gamma is (the scale is then one per output)
        shrink = 1.0 - gamma * self.alpha
        zero = shrink == 0.0
        if np.any(zero):
            # gamma_t nu = 1 (Dai's step_size = 1 / alpha at t = 0): every older block is
            # zeroed, and the scale would be 0 in the division below (inf, then NaN)
            if self.average:  # bank the sum so far, as when the scale is folded in
                state = {**state, "avg_bank": state["avg_bank"] + state["avg_P"] * coef
                         - state["avg_A"], "avg_P": 0.0, "avg_A": np.zeros_like(coef)}
            if np.ndim(zero):  # those outputs only
                coef[:, zero] = 0.0
                state = {**state, "scale": np.where(zero, 1.0, state["scale"])}
                shrink = np.where(zero, 1.0, shrink)
            else:
                coef[:] = 0.0
                state, shrink = {**state, "scale": 1.0}, 1.0
        scale = state["scale"] * shrink
        i = step % self.n_blocks
        rows = slice(i * B, (i + 1) * B)
        delta = -(gamma / B) * (total["grad"] / m) / scale
        coef[rows] += delta
        avg = self._accumulate(state, delta, rows, scale) if self.average else {}
        if np.min(scale) < (_AVERAGE_FOLD if self.average else 1e-30):
            # fold the scale in before it underflows; O(D) and rare
            if self.average:  # bank the sum so far; P and A restart with s = 1
                avg["avg_bank"] = state["avg_bank"] + avg["avg_P"] * coef - avg["avg_A"]
                avg["avg_P"], avg["avg_A"] = 0.0, np.zeros_like(coef)
            coef *= scale
            scale = 1.0
        return {**state, "coef": coef, "scale": scale, **avg}

    def divergence_hint(self) -> str:
        return (f"set a smaller step_size (now {self._steps()}) or a larger bandwidth "
                f"(now {self.features.bandwidth:.3g})")

    def stall_hint(self) -> str:
        """A loss of bounded gradient moves f by a bounded amount a step, so a
        fit that stays at its start took too short a step for y's units, or the
        ridge term won: it shrinks the model by gamma_0 alpha a step, and the
        automatic step caps gamma_0 below 1 / alpha (ridge_step).  Measured on
        y = 1e5 f (loss="quantile", 256 features, 2 epochs): gamma_0 alpha =
        0.99 and training R^2 0.006; with alpha = 1e-12, 0.605.  A smaller
        step, the divergence advice, only slows such a fit further."""
        name = self.loss["name"] if isinstance(self.loss, dict) else self.loss
        if name not in BOUNDED_GRADIENT:
            return self.divergence_hint()
        shrink = float(np.max(self.gamma0)) * self.alpha
        if shrink >= 0.5:  # the ridge's curvature alpha above the data step's 1 / gamma
            return (f"each step shrinks the model by step_size * alpha = {shrink:.3g} while "
                    f"loss={name!r}, whose gradient is bounded, moves it a bounded amount: "
                    f"on targets of this scale the ridge term wins; set a smaller alpha "
                    f"(now {self.alpha:.3g}) or divide y by its scale")
        return (f"loss={name!r} has a bounded gradient, so a step moves f a bounded amount "
                f"whatever y's units: leave step_size 'auto' (it follows each output's "
                f"spread) or set a larger one for targets of larger scale (now {self._steps()})")

    def _steps(self) -> str:
        return ", ".join(f"{g:.3g}" for g in np.atleast_1d(self.step_size))

    def fingerprint(self) -> dict[str, Any]:
        P = self.preconditioner
        return {"solver": "dsg", "features": self.features.to_dict(), "loss": self.loss,
                "encoding": [self.encoding.kind, list(map(_plain, self.encoding.classes)),
                             list(map(float, self.encoding.offset))],
                "n_blocks": self.n_blocks, "alpha": self.alpha, "step_size": self.step_size,
                "step_decay": self.step_decay, "average": self.average,
                **({"local_steps": self.local_steps, "step_rows": int(self.step_rows)}
                   if self.rounds else {}),
                "preconditioner": (None if P is None
                                   else [P.q, P.tau, float(f"{np.sum(P.values):.8g}")])}


#: With ``average``, the scale is folded into the coefficients once it falls
#: below this (an O(D) step; every ~7 / (gamma nu) steps).
_AVERAGE_FOLD = 1e-3


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v
