r"""EigenPro with random features, EigenPro-RF (Ma & Belkin 2017, Table 1).

Model f(x) = z(x)^T theta with the scaled seeded feature map z (D features,
z(x).z(y) ~ k(x, y)).  Preconditioner from the top q+1 eigenpairs
(lambda_i, e_i) of the feature covariance H = Z^T Z / n (a distributed Gram
or randomized eigensystem, :mod:`dkernel.linalg`):

    P = I - E (I - tau lambda_{q+1} Lambda^{-1}) E^T            (Table 1, line 2)

One step on a mini-batch of m rows (Table 1, lines 6-7):

    g      = Z_b^T (Z_b theta - y_b) / m                (workers: partial sums)
    theta <- theta - eta P g

beta = max_x |z(x)|^2; for tau <= 1 the preconditioned top eigenvalue is
lambda' = lambda_{q+1}, and m*, eta follow the kernel form (DESIGN 2.4).
Workers keep Z(X_c) of their chunks in the engine's bounded cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dkernel.backend import asarray_like, namespace, to_numpy
from dkernel.engine import cache
from dkernel.engine.program import Chunk, StepProgram
from dkernel.features import FeatureMap
from dkernel.solvers.eigenpro import critical_batch, step_size
from dkernel.solvers.targets import TargetEncoding


def feature_block(params: dict, X: Any) -> Any:
    """z(X_c), the tall block for :mod:`dkernel.linalg`."""
    return params["features"].transform(X, params["n_blocks"])


@dataclass
class FeaturePreconditioner:
    values: np.ndarray  # top q+1 eigenvalues of Z^T Z / n, descending
    vectors: np.ndarray  # (D, q)
    q: int
    tau: float

    @property
    def tail(self) -> float:
        return float(self.values[self.q])

    @property
    def new_top(self) -> float:
        """Top eigenvalue of P H: max(tau, 1) lambda_{q+1} for exact eigenvectors."""
        return max(self.tau, 1.0) * self.tail

    def apply(self, g: np.ndarray) -> np.ndarray:
        """P g = g - E (1 - tau lambda_{q+1} / lambda_i) E^T g."""
        E = self.vectors
        shrink = 1.0 - self.tau * self.tail / self.values[: self.q]
        return g - E @ (shrink[:, None] * (E.T @ g))


def choose_q_rf(values: np.ndarray, beta: float, max_batch: int) -> int:
    q = 1
    for cand in range(1, len(values)):
        if values[cand] <= 0 or critical_batch(beta, values[cand]) > max_batch:
            break
        q = cand
    return q


def eigenpro_rf_partial(payload: dict, chunk: Chunk) -> dict:
    """Z_b^T (Z_b theta - y_b) on this task's rows."""
    features: FeatureMap = payload["features"]
    n_blocks = payload["n_blocks"]
    encoding: TargetEncoding = payload["encoding"]
    nbytes = chunk.X.shape[0] * n_blocks * features.block_size * np.dtype(features.dtype).itemsize
    full = cache.lookup_or_fill((chunk.key, features, n_blocks, "eigenpro-rf"),
                                lambda: features.transform(chunk.X, n_blocks), nbytes,
                                owner=chunk.run)
    if full is None:
        Z = features.transform(chunk.X_rows, n_blocks)
    else:
        Z = full if chunk.rows is None else full[chunk.rows]
    xp = namespace(Z)
    theta = asarray_like(payload["theta"], Z)
    r = Z @ theta - encoding.encode(chunk.y_rows, Z.dtype)
    return {"grad": to_numpy(Z.T @ r).astype(np.float64), "loss": float(xp.sum(r * r)),
            "count": Z.shape[0]}


@dataclass
class FeatureEigenProProgram(StepProgram):
    features: FeatureMap
    n_blocks: int
    preconditioner: FeaturePreconditioner
    encoding: TargetEncoding
    beta: float
    label: str = "eigenpro-rf"
    #: eta given by the user instead of the automatic one.
    eta_override: float | None = None
    #: set by early stopping; read by the engine after each epoch.
    stop: bool = False

    partial = staticmethod(eigenpro_rf_partial)
    wants_chunk = True

    def init_state(self) -> dict[str, Any]:
        D = self.n_blocks * self.features.block_size
        return {"theta": np.zeros((D, self.encoding.n_outputs))}

    def payload(self, state: dict[str, Any], step: int) -> dict:
        return {"features": self.features, "n_blocks": self.n_blocks, "encoding": self.encoding,
                "theta": state["theta"].astype(self.features.dtype)}

    def update(self, state: dict[str, Any], total: dict[str, Any], step: int) -> dict[str, Any]:
        m = int(total["count"])
        eta = self.eta_override or step_size(m, self.beta, self.preconditioner.new_top)
        theta = state["theta"]
        theta -= eta * self.preconditioner.apply(total["grad"] / m)  # Table 1, line 7
        return {"theta": theta}

    def should_stop(self, state: dict[str, Any], epoch: int) -> bool:
        return self.stop

    def fingerprint(self) -> dict[str, Any]:
        return {"solver": "eigenpro-rf", "features": self.features.to_dict(), "n_blocks": self.n_blocks,
                "q": self.preconditioner.q, "tau": self.preconditioner.tau,
                "n_outputs": self.encoding.n_outputs}
