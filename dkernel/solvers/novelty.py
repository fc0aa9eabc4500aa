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
from dkernel.solvers.pool import PoolProgram, pool_round


def _hinge(payload: dict, f: np.ndarray, y: Any,
           tau: float) -> tuple[float, np.ndarray, float, dict]:
    """The hinge max(0, tau - f), its derivative -[f < tau] and d/d tau of the
    mean risk, mean [f < tau] - nu."""
    below = (f < tau).astype(np.float64)
    return (float(np.maximum(tau - f, 0.0).sum()), -below,
            float(below.mean()) - payload["alpha"], {"below": float(below.sum())})


def novelty_partial(payload: dict, chunk: Chunk) -> dict:
    """Worker side: one lane's round of local steps (:func:`pool_round`)."""
    return pool_round(payload, chunk, _hinge)


@dataclass
class OneClassProgram(PoolProgram):
    """Engine program for Dai et al.'s novelty detection; ``alpha`` is nu."""

    label: str = "one-class"
    partial = staticmethod(novelty_partial)
