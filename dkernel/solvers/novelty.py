r"""Novelty detection by doubly stochastic gradients (Dai et al. 2014, section 4).

Objective over f and the offset \tau (Schoelkopf et al.'s one-class SVM, scaled
by nu: the same minimiser as scikit-learn's ``OneClassSVM``):

    min_{\tau, f}  E_x[max(0, \tau - f(x))] + \nu/2 |f|^2 - \nu \tau

Step (Dai et al.'s update, on a mini-batch and the whole pool, :mod:`.pool`):

    w    <- (1 - \gamma \nu) w + \gamma mean_b [f(x_b) < \tau] z(x_b)
    \tau <- \tau - \gamma (mean_b [f(x_b) < \tau] - \nu)

i.e. per point \tau + \gamma \nu when f(x) >= \tau and \tau - \gamma (1 - \nu) when
f(x) < \tau.  At the optimum a fraction nu of the points lies below \tau.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dkernel.engine.program import Chunk
from dkernel.solvers.pool import PoolProgram, forward, pool_gradient


def novelty_partial(payload: dict, chunk: Chunk) -> dict:
    """Worker side: f on the rows, the hinge max(0, tau - f) and its gradient."""
    f = forward(payload, chunk)
    tau = payload["offset"]
    below = (f < tau).astype(np.float64)
    # d/df max(0, tau - f) = -[f < tau]
    return {"grad": pool_gradient(payload, chunk, -below), "below": float(below.sum()),
            "loss": float(np.maximum(tau - f, 0).sum()), "count": f.shape[0]}


@dataclass
class OneClassProgram(PoolProgram):
    """Engine program for Dai et al.'s novelty detection; ``alpha`` is nu."""

    label: str = "one-class"
    partial = staticmethod(novelty_partial)

    def offset_gradient(self, total: dict[str, Any]) -> float:
        # d/d tau [mean max(0, tau - f) - nu tau] = mean [f < tau] - nu
        return total["below"] / max(int(total["count"]), 1) - self.alpha
