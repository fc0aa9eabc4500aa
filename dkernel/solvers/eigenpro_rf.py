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
lambda' = lambda_{q+1}, and m*, eta follow the kernel form (docs/design.md §2.4).

Ridge penalty (``alpha`` > 0): min_theta (1/n) |Z theta - y|^2 + alpha |theta|^2,
the kernel form's (1/n) |K a - y|^2 + alpha a^T K a with |theta|^2 for the
RKHS norm a^T K a (Rudi et al. eq. 8; the same alpha on every route).  The
step takes g + alpha theta, and P, beta and m*, eta are those of H + alpha I
(every eigenvalue raised by alpha), as DSG's preconditioned steps do.
Workers keep Z(X_c) of their chunks in the engine's bounded cache.

Iterate averaging.  With n > D rows the model cannot interpolate: the residual
at the optimum is noise, and constant-step SGD at the critical batch m* then
hovers in a ball whose loss grows like eta / m (Jain et al. 2018, "Parallelizing
SGD for least squares regression", Thm. 1).  Averaging the iterates removes that
floor at no cost to the step (ibid., and Bach & Moulines 2013): the model is the
running average of theta_t with weight 1 / min(t, H) on step t, H the steps of
an epoch (:func:`average_horizon`), a uniform average over the first epoch and
an exponential one over about an epoch after it.  On the 200k x 32 store of
issue 28 (n_features=2048, bandwidth=2, q=1536, m*=3393) it raised test R^2
from 0.051 to 0.131 after 10 epochs (0.067 to 0.131 with seed 1), where DSG
reaches 0.123.  With n <= D (interpolation) or one step an epoch, no averaging.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dkernel.backend import asarray_like, namespace
from dkernel.engine import cache
from dkernel.engine.program import Chunk, StepProgram
from dkernel.features import FeatureMap
from dkernel.solvers.eigenpro import critical_batch, given_q, step_size, trusted_pairs
from dkernel.solvers.feature_cache import mode_of
from dkernel.solvers.fused import pool_gradient
from dkernel.solvers.local_steps import (
    MIN_ROUNDS,
    local_round,
    round_constants,
    round_payload,
    round_update,
)
from dkernel.solvers.targets import TargetEncoding


def feature_block(params: dict, X: Any) -> Any:
    """z(X_c), the tall block for :mod:`dkernel.linalg`; given the engine's
    :class:`Chunk`, kept in the worker cache for the eigensolver's later passes
    (its 4 passes regenerated the sample's features each time: 0.5 s a pass of
    the 9 s preconditioner of DSGClassifier(n_features=8192) on Fashion-MNIST)."""
    features, n_blocks = params["features"], params["n_blocks"]
    if not isinstance(X, Chunk):
        return features.transform(X, n_blocks)
    chunk = X
    nbytes = chunk.X.shape[0] * n_blocks * features.block_size * np.dtype(features.dtype).itemsize
    Z = cache.lookup_or_fill((chunk.key, "z", features, n_blocks),
                             lambda: features.transform(chunk.X, n_blocks), nbytes,
                             owner=chunk.run)
    return features.transform(chunk.X, n_blocks) if Z is None else Z


def _forget_sample(name: str) -> int:
    """Drop the blocks :func:`feature_block` kept for the sample ``name`` (client.run)."""
    return cache.discard_matching(lambda key: isinstance(key, tuple) and len(key) == 4
                                  and key[1] == "z" and key[0][0] == name)


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

    def shifted(self, shift: float) -> FeaturePreconditioner:
        """The preconditioner of H + ``shift`` I (a ridge term's curvature): the
        same eigenvectors, every eigenvalue raised by ``shift``."""
        return FeaturePreconditioner(self.values + float(shift), self.vectors, self.q, self.tau)

    def apply(self, g: np.ndarray) -> np.ndarray:
        """P g = g - E (1 - tau lambda_{q+1} / lambda_i) E^T g."""
        E = self.vectors
        shrink = 1.0 - self.tau * self.tail / self.values[: self.q]
        return g - E @ (shrink[:, None] * (E.T @ g))


def feature_preconditioner(engine: Any, sample: np.ndarray, features: FeatureMap, n_blocks: int,
                           max_pairs: int, max_batch: int, tau: float, random_state: int,
                           q: int | None = None, label: str = "preconditioner",
                           center: bool = False, dtype: str = "float32",
                           resolved_only: bool = False,
                           ) -> tuple[FeaturePreconditioner, float, Any]:
    """EigenPro-RF's preconditioner from a row subsample (Table 1, line 1).

    The top eigenpairs of z^T z / s over the ``s`` sampled rows (features
    generated on the workers; products and the eigensolve in ``dtype``, float32
    by default: the eigenvalues agree with float64 to ~1e-7 of lambda_1,
    tests/test_scale.py), so the cost depends on s and D, never on n; with
    ``center`` the covariance of z (KernelCCA's views).  q (unless given) is the
    largest with critical batch <= ``max_batch``; with ``resolved_only``, among
    the pairs whose eigenvalues the eigensolver and the sample both resolve
    (:func:`dkernel.solvers.eigenpro.trusted_pairs`, :func:`resolved_pairs`).
    Returns (P, beta = max |z|^2 on the sample, the eigensystem).
    """
    from dkernel.data.dataset import open_dataset
    from dkernel.linalg import eigensystem

    D = n_blocks * features.block_size
    s = sample.shape[0]
    if min(D, s) < 2:  # q >= 1 flattens lambda_1 down to lambda_2
        raise ValueError(f"the preconditioner needs 2 eigenpairs or more, and {D} feature(s) "
                         f"of {s} sample row(s) give {min(D, s)}: raise n_features (or the "
                         "sample's rows: subsample_size, init_rows), or pass preconditioner=None "
                         "where the estimator has one")
    # a given q computes as many pairs as "auto" (or q + 1 if more): a fit's resolved
    # q given back then computes the same eigensystem (fewer moved predictions 2e-3)
    n_pairs = min(D, s, max(int(max_pairs), int(q) + 1 if q is not None else 0))
    # the number of chunks follows the work (one per ~_GRAM_FLOP of s x D x D, at
    # least _GRAM_ROWS rows), never the cluster: the sums, hence the model, must
    # not depend on it; each chunk's D x D (or D x r) partial is paged in, shipped
    # and added, so few is cheap
    parts = int(np.clip(min(round(2.0 * s * D * D / _GRAM_FLOP), s // _GRAM_ROWS), 2, 16))
    rows = open_dataset(np.asarray(sample, dtype=features.dtype),
                        chunk_rows=max(1, math.ceil(s / parts)))
    try:
        eig = eigensystem(engine, rows, feature_block,
                          {"features": features, "n_blocks": n_blocks}, n_pairs, D,
                          operator="gram", center=center, random_state=int(random_state),
                          label=label, dtype=dtype, chunked=True)
    finally:  # the sample's blocks are of no use to the fit: free the budget for its own
        # (best effort: a worker retiring meanwhile failed the fit after 30 s)
        with contextlib.suppress(OSError, TimeoutError):
            engine.client.run(_forget_sample, rows.X.name, on_error="ignore")
    beta = float(eig.row_norm_max)
    values = eig.values
    if resolved_only:
        values = values[: min(trusted_pairs(eig), resolved_pairs(values, beta, s))]
    q = given_q(q, eig.values, n_pairs) if q is not None else choose_q_rf(values, beta, max_batch)
    return FeaturePreconditioner(eig.values[: q + 1], eig.vectors[:, :q], q, tau), beta, eig


def resolved_pairs(values: np.ndarray, beta: float, s: int) -> int:
    """How many leading eigenvalues of z^T z / s a sample of ``s`` rows resolves.

    A direction v's eigenvalue is the mean of (v^T z)^2 over the rows, whose
    variance is at most E (v^T z)^4 <= beta lambda: the sample's lambda has a
    standard error of at most sqrt(beta lambda / s), relative sqrt(beta / (s
    lambda)).  A pair counts as resolved while that is below 1, lambda >= beta / s.
    On issue 28's 200k x 32 case (s = 12288, beta = 1.06) every one of the 1537
    pairs passes (lambda_1537 = 3.1e-4 against 8.7e-5); of the quality matrix's
    cells with n_features=2048 only n=20k changes, q 231 -> 190 (R^2 0.695 ->
    0.697)."""
    return max(2, int(np.sum(np.asarray(values) >= beta / max(int(s), 1))))


#: GEMM work per chunk of the preconditioner's Gram: ~0.2 s on one core here,
#: so a 4000 x 2048 sample is 4 chunks and a 4000 x 16384 one the cap of 16.
_GRAM_FLOP = 8e9
#: Fewest sample rows a chunk of the preconditioner's passes gets: a chunk's
#: partial (D x r float64, 35 MB at D = 8192) cost about 45 ms to ship and add
#: whatever its rows.  DSGClassifier(n_features=8192) on Fashion-MNIST (4000
#: rows): 16 chunks 7.4 s, 8 chunks 5.6 s, 4 chunks 5.1 s for the preconditioner.
_GRAM_ROWS = 1000


def choose_q_rf(values: np.ndarray, beta: float, max_batch: int) -> int:
    q = 1
    for cand in range(1, len(values)):
        if values[cand] <= 0 or critical_batch(beta, values[cand]) > max_batch:
            break
        q = cand
    return q


def eigenpro_rf_partial(payload: dict, chunk: Chunk) -> dict:
    """Z_b^T (Z_b theta - y_b) on this task's rows, Z = Phi / sqrt(D), in one fused
    pass over row tiles (:mod:`dkernel.solvers.fused`, shared with DSG): the
    pool's blocks come from the worker cache or are generated per tile."""
    features: FeatureMap = payload["features"]
    n_blocks = payload["n_blocks"]
    encoding: TargetEncoding = payload["encoding"]
    dt = np.dtype(features.dtype)
    s = dt.type(1.0 / math.sqrt(n_blocks * features.block_size))
    # Z theta = Phi (theta s)
    theta = asarray_like(payload["theta"], chunk.X).astype(dt, copy=False) * s
    Y = encoding.encode(chunk.y_rows, dt)
    xp = namespace(Y)

    def derivative(f: Any, tile: slice) -> tuple[float, Any]:
        r = f - Y[tile]
        return float(xp.sum(r * r)), r

    grad, loss = pool_gradient(features, chunk, n_blocks, theta, derivative,
                               mode_of(payload))
    return {"grad": grad * float(s), "loss": loss, "count": int(Y.shape[0])}


def _round_gradient(payload: dict, chunk: Chunk, coef: Any) -> dict:
    """Z^T (Z theta - y) at ``coef`` (a local step: solvers/local_steps.py)."""
    return eigenpro_rf_partial({**payload, "theta": coef}, chunk)


def average_horizon(n_rows: int, n_features: int, batch: int) -> int:
    """Steps the iterate average spans (module docstring), 0 for none: an epoch's
    steps where the model cannot interpolate (n > D) and an epoch has several."""
    steps = math.ceil(int(n_rows) / max(1, int(batch)))
    return steps if int(n_rows) > int(n_features) and steps > 1 else 0


def default_batch(lanes: int, n_features: int, n_rows: int) -> int:
    """Rows of a step when the user gives none: ``lanes`` x the rows whose D
    features make ``_LANE_FEATURES`` feature evaluations (clipped to [1024,
    65536] rows a lane): about 0.3 s of one core's arithmetic at d = 32, so a
    step's compute dwarfs its fixed cost (docs/design.md §5).  The fused row-tile pass
    (:mod:`dkernel.solvers.fused`) holds a few MB whatever the rows.

    Data small against the cluster: past two lanes' rows the batch grows with
    the lanes only while an epoch keeps MIN_ROUNDS steps.  Without that bound,
    64 lanes made the batch of the quality matrix's 200k-row cells every row,
    five steps a fit: DSGRegressor's R^2 fell from 0.728 (2 lanes) to 0.423
    and DSGClassifier's accuracy from 0.743 to 0.716 (docs/quality.md, "At
    many lanes").  One or two lanes, and data of MIN_ROUNDS x lanes x a lane's
    rows or more, keep the batch they had."""
    per_lane = min(65536, max(1024, _LANE_FEATURES // int(n_features)))
    batch = min(int(lanes) * per_lane, max(2 * per_lane, math.ceil(int(n_rows) / MIN_ROUNDS)))
    return max(1, min(int(n_rows), batch))


#: One lane's features per step: 65536 rows at D = 2048 (32768 at D = 4096).
#: On 2M x 32 (benchmarks/throughput.py, 2 workers, DSG) 65536 rows a lane
#: ran at 226k rows/s against 187k for 32768, with the same test R^2
#: (0.171 / 0.173); the fixed cost is 15-18 ms a step plus chunk loading.
_LANE_FEATURES = 1 << 27


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
    #: keep feature blocks in the worker cache (worth it when epochs revisit them)
    cache_blocks: str = "float32"
    #: the ridge penalty alpha of (1/n)|Z theta - y|^2 + alpha |theta|^2; ``preconditioner``
    #: and ``beta`` are then those of H + alpha I (module docstring)
    ridge: float = 0.0
    #: steps of the iterate average (0: none): the model is an exponential average of
    #: the iterates with weight 1 / min(t, average_horizon) on step t's (module docstring)
    average_horizon: int = 0
    #: preconditioned steps a lane takes between two averages (solvers/local_steps.py)
    local_steps: int = 1
    #: rows of one lane's local step (``local_steps`` > 1)
    step_rows: int = 0

    @staticmethod
    def partial(payload: dict, chunk: Chunk) -> dict:
        if "round_coef" in payload:
            return local_round(payload, chunk, _round_gradient)
        return eigenpro_rf_partial(payload, chunk)

    wants_chunk = True
    bundles_chunks = True  # a small chunk's lane reads several (data.plan.chunk_bundles)
    supports_backoff = True

    @property
    def rounds(self) -> bool:
        """Rounds of local steps instead of synchronous steps."""
        return self.local_steps > 1

    def constants(self) -> dict[str, Any] | None:
        return round_constants(self.preconditioner) if self.rounds else None

    def init_state(self) -> dict[str, Any]:
        D = self.n_blocks * self.features.block_size
        theta = np.zeros((D, self.encoding.n_outputs))
        state: dict[str, Any] = {"theta": theta}
        if self.rounds:
            state["t"] = 0.0  # local steps so far
        if self.average_horizon:
            state.update({"theta_avg": theta.copy(), "avg_steps": 0})
        return state

    def payload(self, state: dict[str, Any], step: int) -> dict:
        base = {"features": self.features, "n_blocks": self.n_blocks, "encoding": self.encoding,
                "cache": self.cache_blocks}
        if self.rounds:
            P = self.preconditioner
            eta = self.eta_override or step_size(self.step_rows, self.beta, P.new_top)
            return {**base, **round_payload(
                state["theta"], state["t"], gamma0=eta * state.get("step_scale", 1.0),
                step_decay=0.0, ridge=self.ridge, grad_scale=1.0, step_rows=self.step_rows,
                beta=self.beta, new_top=P.new_top, short_steps=self.eta_override is None)}
        return {**base, "theta": state["theta"].astype(self.features.dtype)}

    def update(self, state: dict[str, Any], total: dict[str, Any], step: int) -> dict[str, Any]:
        if self.rounds:
            state = round_update(state, total, "theta")
            theta = state["theta"]
        else:
            theta = self._step(state, total)
        if not self.average_horizon:
            return {**state, "theta": theta}
        t = int(state["avg_steps"]) + 1
        avg = state["theta_avg"]
        avg += (theta - avg) / min(t, self.average_horizon)
        return {**state, "theta": theta, "theta_avg": avg, "avg_steps": t}

    def _step(self, state: dict[str, Any], total: dict[str, Any]) -> np.ndarray:
        """Table 1, line 7: theta - eta P g on the step's summed gradient."""
        m = int(total["count"])
        eta = self.eta_override or step_size(m, self.beta, self.preconditioner.new_top)
        eta *= state.get("step_scale", 1.0)
        theta = state["theta"]
        g = total["grad"] / m
        if self.ridge > 0:
            g = g + self.ridge * theta
        theta -= eta * self.preconditioner.apply(g)
        return theta

    def should_stop(self, state: dict[str, Any], epoch: int) -> bool:
        return self.stop

    def divergence_hint(self) -> str:
        return (f"set a smaller step_size or damping, or a larger bandwidth "
                f"(now {self.features.bandwidth:.3g})")

    def fingerprint(self) -> dict[str, Any]:
        return {"solver": "eigenpro-rf", "features": self.features.to_dict(),
                "n_blocks": self.n_blocks, "q": self.preconditioner.q,
                "tau": self.preconditioner.tau, "n_outputs": self.encoding.n_outputs,
                **({"ridge": self.ridge} if self.ridge > 0 else {}),
                **({"average_horizon": self.average_horizon} if self.average_horizon else {}),
                **({"local_steps": self.local_steps, "step_rows": int(self.step_rows)}
                   if self.rounds else {}),
                # a resume with another step_size was accepted, and recorded it
                **({"step_size": float(self.eta_override)} if self.eta_override else {})}
