r"""Functional gradient steps over a fixed pool of random features, every block per step.

The model is f(x) = z(x)^T w with z the pool's scaled feature map (z.z ~ k,
:meth:`FeatureMap.transform`), i.e. f in the span of the pool's features.
Dai et al.'s step on the regularised risk E[l(f(x), .)] + nu/2 |f|^2,

    w <- (1 - \gamma_t \nu) w - \gamma_t mean_b l'(f(x_b)) z(x_b),
    \gamma_t = \theta_0 / (1 + \theta_1 t),

is taken with the features of every block of the pool at once (the step
Dai's Alg. 1 takes in expectation over the pool's seeds): the forward pass
f(x_b) already reads every block, so their gradient costs the same again,
where one block per step would move 1/P of the coordinates.  The blocks of a
chunk come from the worker cache (:func:`dkernel.solvers.dsg.block_rows`).

The output is the polynomial-decay average of the iterates (Shamir & Zhang
2013, with eta = 3): for non-smooth losses (the novelty hinge) the last
iterate keeps O(gamma) noise, the average converges at the O(1/t) rate.

Tasks (:mod:`dkernel.solvers.novelty`, :mod:`dkernel.solvers.density_ratio`)
supply the per-row derivative l' on the worker and, for novelty detection,
an offset updated beside w.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dkernel.backend import asarray_like
from dkernel.engine.program import Chunk, StepProgram
from dkernel.features import FeatureMap
from dkernel.solvers.dsg import block_rows, chunk_decision, decision

#: eta of the polynomial-decay average: weight (eta + 1) / (t + eta) on iterate t.
_AVERAGE_ETA = 3.0


def forward(payload: dict, chunk: Chunk) -> np.ndarray:
    """f(x_b) for the step's rows, float64, shape (m,)."""
    features: FeatureMap = payload["features"]
    coef = asarray_like(payload["coef"], chunk.X)
    return np.asarray(chunk_decision(features, chunk, coef)[:, 0], dtype=np.float64)


def pool_gradient(payload: dict, chunk: Chunk, dl: np.ndarray) -> np.ndarray:
    """sum_b l'_b phi(x_b) over every block of the pool (unscaled phi), shape (D,)."""
    features: FeatureMap = payload["features"]
    B = features.block_size
    dl = dl.astype(np.dtype(features.dtype))
    grad = np.empty(payload["n_blocks"] * B)
    for j in range(payload["n_blocks"]):
        grad[j * B : (j + 1) * B] = block_rows(features, chunk, j).T @ dl
    return grad


def pool_decision(features: FeatureMap, n_blocks: int, w: np.ndarray, X: Any) -> Any:
    """f(X) = z(X)^T w, shape (n,)."""
    coef = (w / math.sqrt(n_blocks * features.block_size)).astype(features.dtype)[:, None]
    return decision(features, coef, X.astype(features.dtype, copy=False))[:, 0]


@dataclass
class PoolProgram(StepProgram):
    """State: iterate ``w`` (and ``offset``) with their running averages."""

    features: FeatureMap
    n_blocks: int
    alpha: float
    step_size: float
    step_decay: float

    wants_chunk = True

    @property
    def n_features(self) -> int:
        return self.n_blocks * self.features.block_size

    def init_state(self) -> dict[str, Any]:
        D = self.n_features
        return {"w": np.zeros(D), "w_avg": np.zeros(D), "offset": 0.0, "offset_avg": 0.0}

    def payload(self, state: dict[str, Any], step: int) -> dict:
        # z = phi / sqrt(D): shipping w / sqrt(D) lets the workers use the cached
        # unscaled blocks phi
        coef = (state["w"] / math.sqrt(self.n_features)).astype(self.features.dtype)[:, None]
        return {"features": self.features, "n_blocks": self.n_blocks, "coef": coef,
                "offset": float(state["offset"]), **self.task_payload()}

    def task_payload(self) -> dict[str, Any]:
        return {}

    def offset_gradient(self, total: dict[str, Any]) -> float:
        """d/d offset of the mean risk; 0 for tasks without an offset."""
        return 0.0

    def gamma(self, step: int) -> float:
        return self.step_size / (1.0 + self.step_decay * step)

    def update(self, state: dict[str, Any], total: dict[str, Any], step: int) -> dict[str, Any]:
        g = self.gamma(step)
        m = max(int(total["count"]), 1)
        grad = total["grad"] / (m * math.sqrt(self.n_features))  # mean l' z
        w = (1.0 - g * self.alpha) * state["w"] - g * grad
        offset = float(state["offset"]) - g * self.offset_gradient(total)
        c = (_AVERAGE_ETA + 1.0) / (step + 1.0 + _AVERAGE_ETA)  # 1 at step 0
        return {"w": w, "w_avg": (1 - c) * state["w_avg"] + c * w, "offset": offset,
                "offset_avg": (1 - c) * float(state["offset_avg"]) + c * offset}

    def fingerprint(self) -> dict[str, Any]:
        return {"solver": type(self).__name__, "features": self.features.to_dict(),
                "n_blocks": self.n_blocks, "alpha": self.alpha, "step_size": self.step_size,
                "step_decay": self.step_decay, **self.task_payload()}
