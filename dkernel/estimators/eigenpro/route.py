"""What EigenPro's three routes share: the :class:`Route` interface, the SGD
settings the two iteration routes record, the kernel-row cache choice and the
prediction of a block of rows."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from dkernel.data.dataset import Dataset
from dkernel.data.validate import check_finite_chunk
from dkernel.engine import cache as worker_cache
from dkernel.engine.checkpoint import CACHE
from dkernel.engine.chunks import worker_rows
from dkernel.engine.stall import gather, result
from dkernel.estimators.fitting import FitContext
from dkernel.estimators.history import validation_score
from dkernel.solvers.eigenpro import predict_kernel, step_size
from dkernel.solvers.targets import TargetEncoding


class Route:
    """One of EigenPro's algorithms behind the public estimators.

    A route checks the settings it takes (:meth:`check`, once the row count is
    known), fits (:meth:`fit`, writing the fitted attributes on the
    estimator), and names what predicts (:meth:`predict_spec`).  ``form`` is
    the estimator's ``form_`` and the model file's "form".
    """

    form = ""

    def __init__(self, est: Any, n_rows: int) -> None:
        self.est, self.n_rows = est, int(n_rows)

    def check(self) -> None:
        """Refuse settings this route has no use for (a setting is used or refused)."""

    def fit(self, fit: FitContext, bandwidth: float, encoding: TargetEncoding,
            sample: np.ndarray | None, read_seconds: float) -> None:
        raise NotImplementedError

    @staticmethod
    def predict_spec(est: Any, coef: np.ndarray) -> dict:
        raise NotImplementedError

    def evaluator(self, fit: FitContext, encoding: TargetEncoding, spec: Any) -> Any:
        """With early stopping, the held-out score of ``spec(state)``'s model."""
        if fit.val is None:
            return None

        def evaluate(state: dict) -> float:
            return validation_score(fit.engine, fit.val, self.est._task, predict_block,
                                    spec(state), encoding.classes, encoding.offset)
        return evaluate


def checked_predict_block(X: Any, spec: dict, start: int | None) -> Any:
    """:func:`predict_block` of a lazy input's block that starts at row ``start``,
    refused with that row's number if it holds NaN or infinity (as
    :func:`dkernel.estimators.base.apply_rows` does): the kernel of a NaN row
    is NaN, and a classifier's argmax turned it into class 0 without a word."""
    check_finite_chunk(X, "X", start, "predicting")
    return predict_block(X, spec)


def predict_block(X: Any, spec: dict) -> Any:
    X = X.astype(np.float32, copy=False)
    if spec["kind"] == "kernel":
        return predict_kernel(X, spec["centers"], spec["coef"], spec["kernel"], spec["bandwidth"])
    Z = spec["features"].transform(X, spec["n_blocks"])
    return Z @ spec["coef"].astype(np.float32)


def record_sgd(est: Any, bandwidth: float, encoding: TargetEncoding, n_inputs: int,
               eigenvalues: np.ndarray, q: int, batch: int, m_star: float, beta: float,
               lam_new: float, method: str, cache_mode: str, s: int | None,
               ridge: float, damping: float) -> None:
    """The settings an SGD route chose (saved with the model; the verbose line)."""
    est.bandwidth_ = float(bandwidth)
    est.encoding_ = encoding
    est.n_features_in_ = int(n_inputs)
    est.eigenvalues_ = np.asarray(eigenvalues, dtype=np.float64)
    est.q_ = int(q)
    est.batch_size_ = int(batch)
    est.critical_batch_ = float(m_star)
    est.beta_ = float(beta)
    given = est._given("step_size")
    est.step_size_ = float(given if given is not None
                           else step_size(batch, beta + ridge, lam_new + ridge))
    est.eigensolver_ = method
    est.kernel_cache_ = cache_mode
    est.subsample_size_ = s
    est.damping_ = float(damping)
    if est.verbose:
        print(f"eigenpro: q={est.q_} lambda_1={est.eigenvalues_[0]:.4g} "
              f"lambda_q+1={est.eigenvalues_[est.q_]:.4g} m*={m_star:.0f} batch={batch} "
              f"eta={est.step_size_:.4g} damping={damping:g} cache={cache_mode} "
              f"eigensolver={method}",
              file=sys.stderr, flush=True)


def cache_mode(fit: FitContext, p: int) -> str:
    """float32 kernel rows if every worker's share fits its cache budget, else
    fixed16 if that fits, else streaming recomputation; a resume's "auto"
    goes on with the mode its checkpoint records (the model depends on it)."""
    est, client, data = fit.est, fit.client, fit.data
    if est.kernel_cache != "auto":
        return est.kernel_cache
    resumed = fit.resumed_setting(CACHE)
    if resumed is not None:
        return str(resumed)
    nthreads = client.nthreads()
    if not nthreads:
        return "off"
    need = max(worker_rows(nthreads, data.row_chunks).values()) * p
    room = min(worker_cache.budgets(client).values())
    if need * 4 <= room:
        return "float32"
    if need * 2 <= room:
        return "fixed16"
    return "off"


def rows_as_float32(data: Dataset, client: Any, chunks: dict | None = None) -> np.ndarray:
    """Every row of X on the client; from ``chunks`` (futures of each chunk's
    (X, y) read by :meth:`Engine.resident_chunks`) when given, not the store again."""
    if data.host is not None:
        return np.ascontiguousarray(data.host[0], dtype=np.float32)
    if chunks is not None:
        parts = gather(client, [chunks[c] for c in range(data.n_chunks)], "the centers' rows")
        return np.concatenate([np.asarray(X, dtype=np.float32) for X, _ in parts])
    return np.ascontiguousarray(result(client, client.compute(data.X.astype(np.float32)),
                                       "the centers' rows"))
