r"""KL density-ratio estimation by doubly stochastic gradients (Dai et al. 2014,
section 4, eq. (8) with the KL divergence; Nguyen, Wainwright & Jordan 2010).

With numerator density p and denominator density q,

    min_f  E_{x~q}[exp f(x)] - E_{x~p}[f(x)] + \nu/2 |f|^2

has the minimiser f = log(p/q) as \nu -> 0 (pointwise, q e^f = p).  Dai et al.
draw a Bernoulli(1/2) label per step; here every mini-batch mixes rows of both
samples (label 1: numerator, 0: denominator) and weighs them by the sample
sizes, so that the mean per-row loss

    l(f, 1) = -(n / n_p) f,      l(f, 0) = (n / n_q) exp(f)

is exactly the objective's empirical risk whatever the mix of a batch (with
n_p = n_q this is Dai's factor 2).  Step: :mod:`.pool`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dkernel.engine.program import Chunk
from dkernel.solvers.pool import PoolProgram, pool_round

#: exp(f) is evaluated at min(f, this): a wild early step must not overflow to inf
#: (e^50 ~ 5e21 still points the gradient the right way).
_EXP_CAP = 50.0


def _kl(payload: dict, f: np.ndarray, y: Any,
        offset: float) -> tuple[float, np.ndarray, float, dict]:
    """The weighted KL risk of the rows (label 1: numerator) and its derivative."""
    numerator = np.asarray(y).reshape(-1) > 0.5
    w_p, w_q = payload["weight_numerator"], payload["weight_denominator"]
    e = np.exp(np.minimum(f, _EXP_CAP))
    value = np.where(numerator, -w_p * f, w_q * e)
    dl = np.where(numerator, -w_p, w_q * e)
    return float(value.sum()), dl, 0.0, {}


def ratio_partial(payload: dict, chunk: Chunk) -> dict:
    """Worker side: one lane's round of local steps (:func:`pool_round`)."""
    return pool_round(payload, chunk, _kl)


@dataclass
class DensityRatioProgram(PoolProgram):
    """Engine program for the KL density ratio; weights n / n_p and n / n_q."""

    weight_numerator: float = 1.0
    weight_denominator: float = 1.0
    label: str = "density-ratio"
    partial = staticmethod(ratio_partial)

    def task_payload(self) -> dict[str, Any]:
        return {"weight_numerator": self.weight_numerator,
                "weight_denominator": self.weight_denominator}
