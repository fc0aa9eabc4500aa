"""EigenPro's kernel form with every row a center: the preconditioned SGD of
Ma & Belkin's Table 2, with the kernel rows K(X_c, C) kept on the workers."""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any

import dask
import numpy as np

from dkernel._stack import user_stacklevel
from dkernel.engine.cluster import workers_info
from dkernel.engine.progress import phase
from dkernel.estimators.eigenpro.route import (
    Route,
    cache_mode,
    record_sgd,
    rows_as_float32,
)
from dkernel.estimators.fitting import FitContext
from dkernel.kernels import kernel_diagonal_max
from dkernel.solvers.eigenpro import (
    KernelEigenProProgram,
    critical_batch,
    subsample_preconditioner,
)
from dkernel.solvers.kernel_rows import (
    TILE_ROWS,
    FillLost,
    centers_payload,
    kernel_rows_key,
    symmetric_fill,
)
from dkernel.solvers.targets import TargetEncoding

#: subsample_size="auto" below 100k rows: the most rows whose eigenpairs are still
#: exact (dense eigh; dkernel.linalg's dense_max), so q may use every pair.  On
#: Fashion-MNIST it gave q = 667, m* = 4093 and 0.904 test accuracy after 3
#: epochs, where EigenPro 2's s = 2000 (q = 361, m* = 1997) needed 7.
_KERNEL_SUBSAMPLE = 4096


class KernelRoute(Route):
    """Every row a center (``n_centers`` >= n): f(x) = sum_j a_j k(x, x_j)
    fitted by preconditioned SGD (Table 2); ``alpha`` "auto" is 0 (the
    iteration interpolates, ``n_epochs`` regularises)."""

    form = "kernel"

    def fit(self, fit: FitContext, bandwidth: float, encoding: TargetEncoding,
            sample: np.ndarray | None, read_seconds: float) -> None:
        est, engine, client, data = self.est, fit.engine, fit.client, fit.data
        n = p = data.n_rows
        check_worker_room(client, p, data.n_inputs, encoding.n_outputs)
        rng = np.random.default_rng([est.random_state_, 0xE16])
        ridge = float(est._given("alpha") or 0.0)
        mode = cache_mode(fit, p)
        # the fill reads every chunk on its home anyway: the centers come from those reads
        chunks, homes = engine.resident_chunks(data) if mode != "off" else (None, None)
        centers = rows_as_float32(data, client, chunks)
        s = min(p, est._given("subsample_size") or
                (_KERNEL_SUBSAMPLE if n < 100_000 else 12_000))
        sub_idx = np.sort(rng.choice(p, size=s, replace=False))
        damping = float(est._given("damping") or 0.95)
        beta = kernel_diagonal_max(est.kernel)
        max_batch = int(est._given("max_batch") or min(s, p))
        # a fixed number of chunks (not one per worker): sums must not depend on the cluster
        with phase(f"eigenpro: preconditioner of {s} subsample rows (its eigensolve runs on "
                   "the client)", engine.options.progress):
            pre, eig = subsample_preconditioner(engine, centers[sub_idx], est.kernel, bandwidth,
                                                q=est._given("q"), damping=damping, beta=beta,
                                                max_batch=max_batch, n_chunks=16,
                                                random_state=est.random_state_)
        # alpha raises the operator's eigenvalues by alpha (solvers.eigenpro's docstring)
        m_star = critical_batch(beta + ridge, pre.new_top + ridge)
        batch = est._given_batch(data.n_rows) or max(1, min(int(m_star), max_batch, p))
        token = dask.base.tokenize(data.X.name, est.kernel, bandwidth, p)
        # the lanes before the fill: a worker lost in it is back (its nanny) some time
        # later, and lanes="auto" counted 1 where the fit began on 2 (another model)
        est.lanes_ = engine.pin_lanes(data)  # recorded: the model depends on it
        resident = self._fill(fit, chunks, homes, token, mode, bandwidth)
        del chunks
        program = KernelEigenProProgram(centers, sub_idx, pre, est.kernel, bandwidth, encoding,
                                        beta, data.row_offsets(), mode, token, ridge=ridge)
        if est._given("step_size") is not None:
            program.eta_override = float(est.step_size)
        shifted = centers_payload(centers)  # once, not per block of every evaluation
        state = fit.run_steps(program, batch, resident=resident, evaluate=self.evaluator(
            fit, encoding, lambda st: {"kind": "kernel", "centers": shifted, "kernel": est.kernel,
                                       "bandwidth": bandwidth, "coef": st["coef"]}))
        est.kernel_ = est.kernel
        est.form_, est.solver_, est.centers_, est.coef_ = "kernel", "eigenpro", centers, \
            state["coef"]
        est.n_centers_ = est.n_rows_used_ = n
        est.alpha_ = ridge
        record_sgd(est, bandwidth, encoding, data.n_inputs, pre.values, pre.q, batch, m_star,
                   beta, pre.new_top, eig.method, mode, s, ridge, damping)

    def _fill(self, fit: FitContext, chunks: dict | None, homes: Any, token: str, mode: str,
              bandwidth: float) -> dict | None:
        """K(X, X) is symmetric: each chunk pair's block once, before epoch 1; the
        chunks (the steps then need only y) or None (filled per chunk instead)."""
        if chunks is None:
            return None
        data, t_fill = fit.data, time.perf_counter()
        keys = [kernel_rows_key((data.X.name, c), token, mode) for c in range(data.n_chunks)]
        try:
            symmetric_fill(fit.client, chunks, homes, list(data.row_chunks), keys,
                           # one fill's own private keys: two fits of the same rows at
                           # once took each other's half-filled blocks ("FillLost")
                           self.est.kernel, bandwidth, mode,
                           owner=fit.engine.new_run(f"fill-{token}-"),
                           progress=fit.engine.options.progress)
        except FillLost as exc:  # the steps fill per chunk instead (they survive worker loss)
            warnings.warn(f"{exc}; the kernel rows are filled per chunk during epoch 1",
                          RuntimeWarning, stacklevel=user_stacklevel())
            return None
        if self.est.verbose:
            print(f"eigenpro: kernel rows of {data.n_chunks} chunks ({mode}) in "
                  f"{time.perf_counter() - t_fill:.1f}s", file=sys.stderr, flush=True)
        return chunks

    @staticmethod
    def predict_spec(est: Any, coef: np.ndarray) -> dict:
        # the kernel the fit ran (model files keep it as the parameter)
        return {"kind": "kernel", "centers": centers_payload(est.centers_),
                "kernel": getattr(est, "kernel_", est.kernel), "bandwidth": est.bandwidth_,
                "coef": coef}

    @staticmethod
    def save(est: Any, arrays: dict, meta: dict) -> None:
        arrays["centers"] = est.centers_
        meta.update(solver=est.solver_, n_centers=est.n_centers_, n_rows_used=est.n_rows_used_)

    @staticmethod
    def load(est: Any, arrays: dict, meta: dict) -> None:
        est.centers_ = arrays["centers"]
        # model files written before the all-rows solve: the SGD form on every center
        est.solver_ = meta.get("solver", "eigenpro")
        est.n_centers_ = meta.get("n_centers", int(est.centers_.shape[0]))
        est.n_rows_used_ = meta.get("n_rows_used", est.n_centers_)


def check_worker_room(client: Any, p: int, d: int, c: int) -> None:
    """Refuse, before any work, p centers whose per-worker arrays cannot fit:
    every worker holds the centers, the coefficients (twice: p x c) and a
    ``TILE_ROWS`` x p tile of the kernel, 4 p (d + 2 c + TILE_ROWS) bytes.  2M
    centers of 8 inputs on 600 MB workers had them restarted until the fit died
    ("FuturesCancelledError ... already forgotten")."""
    limits = [w.get("memory_limit") for w in workers_info(client).values()]
    limits = [int(m) for m in limits if m]
    need = 4 * p * (d + 2 * c + TILE_ROWS)
    if limits and need > 0.5 * min(limits):
        raise ValueError(
            f"n_centers={p}: the kernel form (every row a center) keeps the centers, their "
            f"coefficients and a {TILE_ROWS}-row tile of the kernel on every worker, about "
            f"{need / 2**30:.2f} GiB, more than half the smallest worker's memory limit "
            f"({min(limits) / 2**30:.2f} GiB); pass a smaller n_centers (the Nystrom solve over "
            "all rows, FALKON), or give the workers more memory")
