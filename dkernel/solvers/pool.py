r"""Functional gradient steps over a fixed pool of random features, every block
per step, in rounds of local steps.

The model is f(x) = z(x)^T w with z the pool's scaled feature map (z.z ~ k,
:meth:`FeatureMap.transform`), i.e. f in the span of the pool's features.
Dai et al.'s step on the regularised risk E[l(f(x), .)] + nu/2 |f|^2,

    w <- (1 - \gamma_t \nu) w - \gamma_t mean_b l'(f(x_b)) z(x_b),
    \gamma_t = \theta_0 / (1 + \theta_1 t),

is taken with the features of every block of the pool at once (the step
Dai's Alg. 1 takes in expectation over the pool's seeds): the forward pass
f(x_b) already reads every block, so their gradient costs the same again,
where one block per step would move 1/P of the coordinates.

**Rounds of local steps** (local SGD: Stich 2019, "Local SGD converges fast
and communicates little"; Lin et al. 2020, "Don't use large mini-batches,
use local SGD").  These hinge- and exp-type steps want many small steps
(their 1 / (nu t) schedule does not grow with the batch as EigenPro's does),
but a step of a few hundred rows is a few ms of compute against a round
trip of 10-20 ms (docs/design.md §5).  So one engine step is a round: each of the L
lanes starts from the same (w, offset), takes ``local_steps`` steps on its
own rows, ``ceil(batch_size / L)`` rows a step (the i-th at \gamma_{t+i}),
and the coordinator averages the lanes' iterates weighted by their rows.
With one local step a round this is exactly the synchronous step on the
batch of all lanes (the update is linear in the per-lane means); more local
steps amortise the round trip over ~2^27 feature evaluations a lane.  The
schedule's t counts steps, so t moves by the lanes' mean number of local
steps each round.

The output is the polynomial-decay average of the iterates (Shamir & Zhang
2013, with eta = 3), kept by each lane over its local steps and averaged
with them: for non-smooth losses (the novelty hinge) the last iterate keeps
O(gamma) noise, the average converges at the O(1/t) rate.

Tasks (:mod:`dkernel.solvers.novelty`, :mod:`dkernel.solvers.density_ratio`)
supply the per-row derivative l' on the worker and, for novelty detection,
an offset updated beside w.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dkernel.backend import asarray_like, to_numpy
from dkernel.engine.program import Chunk, StepProgram
from dkernel.features import FeatureMap
from dkernel.solvers.dsg import decision
from dkernel.solvers.feature_cache import mode_of
from dkernel.solvers.fused import feature_tiles

#: eta of the polynomial-decay average: weight (eta + 1) / (t + eta) on iterate t.
_AVERAGE_ETA = 3.0

#: derivative(payload, f, y, offset) on one local step's rows (f float64, shape
#: (m,)) -> (summed loss, l'(f) shape (m,), d/d offset of the mean risk, extra
#: sums to report, e.g. {"below": ...}).
LocalDerivative = Callable[[dict, np.ndarray, Any, float], tuple[float, np.ndarray, float, dict]]


def pool_round(payload: dict, chunk: Chunk, derivative: LocalDerivative) -> dict:
    """One lane's round: local steps on its rows from the round's (w, offset),
    ``payload["step_rows"]`` rows a step.  Returns the final iterates and
    averages multiplied by the lane's rows (the engine sums the lanes; the
    coordinator divides by the total), the summed loss and the local steps."""
    features: FeatureMap = payload["features"]
    n_blocks = payload["n_blocks"]
    D = n_blocks * features.block_size
    dt = np.dtype(features.dtype)
    s = 1.0 / math.sqrt(D)  # z = phi / sqrt(D)
    alpha, step_size, step_decay = payload["alpha"], payload["step_size"], payload["step_decay"]
    w = np.array(payload["w"], dtype=np.float64)
    w_avg = np.array(payload["w_avg"], dtype=np.float64)
    offset, offset_avg = float(payload["offset"]), float(payload["offset_avg"])
    t = float(payload["t"])
    y = chunk.y_rows
    loss, count, steps, extra = 0.0, 0, 0, {}
    for tile, pieces in feature_tiles(features, chunk, n_blocks, payload["step_rows"],
                                      mode_of(payload)):
        m = tile.stop - tile.start
        coef = asarray_like((w * s).astype(dt), chunk.X)
        f = 0.0
        for cols, Z, factor in pieces:
            f = f + to_numpy(Z @ coef[cols]).astype(np.float64) * factor
        y_tile = None if y is None else to_numpy(y[tile])  # the derivatives are NumPy
        value, dl, offset_grad, sums = derivative(payload, f, y_tile, offset)
        dl_dev = asarray_like(np.asarray(dl, dtype=dt), chunk.X)
        grad = np.empty(D)
        for cols, Z, factor in pieces:
            grad[cols] = to_numpy(Z.T @ dl_dev) * factor
        gamma = step_size / (1.0 + step_decay * t)
        w *= 1.0 - gamma * alpha
        w -= (gamma * s / m) * grad  # gamma mean_b l' z
        offset -= gamma * offset_grad
        c = (_AVERAGE_ETA + 1.0) / (t + 1.0 + _AVERAGE_ETA)  # 1 at t = 0
        w_avg += c * (w - w_avg)
        offset_avg += c * (offset - offset_avg)
        t += 1.0
        loss += float(value)
        count += m
        steps += 1
        for k, v in sums.items():
            extra[k] = extra.get(k, 0.0) + float(v)
    return {"w": count * w, "w_avg": count * w_avg, "offset": count * offset,
            "offset_avg": count * offset_avg, "loss": loss, "count": count,
            "local_steps": steps, "lanes": 1, **extra}


def pool_decision(features: FeatureMap, n_blocks: int, w: np.ndarray, X: Any) -> Any:
    """f(X) = z(X)^T w, shape (n,)."""
    coef = (w / math.sqrt(n_blocks * features.block_size)).astype(features.dtype)[:, None]
    return decision(features, coef, X.astype(features.dtype, copy=False))[:, 0]


@dataclass
class PoolProgram(StepProgram):
    """State: iterate ``w`` and ``offset``, their running averages and the
    schedule's step count ``t``.  ``step_rows``: rows of one lane's local step."""

    features: FeatureMap
    n_blocks: int
    alpha: float
    step_size: float
    step_decay: float
    step_rows: int = 512
    #: keep feature blocks in the worker cache (worth it when epochs revisit them)
    cache_blocks: str = "float32"

    wants_chunk = True

    @property
    def n_features(self) -> int:
        return self.n_blocks * self.features.block_size

    def slow_hint(self) -> str:
        return ("more local steps a round (a larger local_steps: fewer rounds an epoch) or "
                "chunks on faster storage")

    def init_state(self) -> dict[str, Any]:
        D = self.n_features
        return {"w": np.zeros(D), "w_avg": np.zeros(D), "offset": 0.0, "offset_avg": 0.0,
                "t": 0.0}

    def payload(self, state: dict[str, Any], step: int) -> dict:
        return {"features": self.features, "n_blocks": self.n_blocks, "w": state["w"],
                "w_avg": state["w_avg"], "offset": float(state["offset"]),
                "offset_avg": float(state["offset_avg"]), "t": float(state["t"]),
                "alpha": self.alpha, "step_size": self.step_size, "step_decay": self.step_decay,
                "step_rows": int(self.step_rows), "cache": self.cache_blocks,
                **self.task_payload()}

    def task_payload(self) -> dict[str, Any]:
        return {}

    def update(self, state: dict[str, Any], total: dict[str, Any], step: int) -> dict[str, Any]:
        """The lanes' iterates and averages, weighted by their rows."""
        m = max(int(total["count"]), 1)
        return {"w": total["w"] / m, "w_avg": total["w_avg"] / m,
                "offset": float(total["offset"]) / m, "offset_avg": float(total["offset_avg"]) / m,
                "t": float(state["t"]) + float(total["local_steps"]) / max(int(total["lanes"]), 1)}

    def fingerprint(self) -> dict[str, Any]:
        return {"solver": type(self).__name__, "features": self.features.to_dict(),
                "n_blocks": self.n_blocks, "alpha": self.alpha, "step_size": self.step_size,
                "step_decay": self.step_decay, "step_rows": int(self.step_rows),
                **self.task_payload()}
