"""EigenPro's kernel form with fewer centers than rows: p sampled centers and
every row in the Nystrom objective, solved by FALKON's preconditioned
conjugate gradients (Rudi, Carratino & Rosasco 2017, Alg. 1)."""

from __future__ import annotations

import math
import sys
import time
import warnings
from typing import Any

import dask
import numpy as np

from dkernel._stack import user_stacklevel
from dkernel.engine.guard import FitQualityWarning
from dkernel.engine.progress import phase
from dkernel.estimators.eigenpro.kernel_form import KernelRoute
from dkernel.estimators.eigenpro.route import cache_mode, predict_block, rows_as_float32
from dkernel.estimators.fitting import FitContext
from dkernel.estimators.history import subset_rows, validation_score
from dkernel.solvers.falkon import (
    FalkonPreconditioner,
    center_kernel,
    falkon_partial,
    falkon_solve,
    unconverged,
)
from dkernel.solvers.kernel_rows import centers_payload
from dkernel.solvers.targets import TargetEncoding

#: alpha="auto" in the all-rows solve: lambda of (1/n)|K_nM a - y|^2 + lambda a^T K_MM a.
_DEFAULT_RIDGE = 1e-6
#: Settings of the SGD iteration (Table 2) that the all-rows CG solve has no use for.
_SGD_ONLY = ("q", "subsample_size", "damping", "batch_size", "step_size", "max_batch", "lanes")


class NystromRoute(KernelRoute):
    """p < n centers: uniformly sampled rows as centers, every row in the
    objective; one epoch is one CG iteration, one pass over every row."""

    def __init__(self, est: Any, n_rows: int, p: int) -> None:
        super().__init__(est, n_rows)
        self.p = int(p)

    def check(self) -> None:
        est, p, n = self.est, self.p, self.n_rows
        given = [name for name in _SGD_ONLY if est._given(name) is not None]
        if given:  # refused, as alpha is on the other route: a setting is used or refused
            raise ValueError(
                f"{', '.join(given)} set the SGD iteration used when every row is a center; with "
                f"n_centers={p} < {n} rows the fit is a conjugate-gradient solve over all rows, "
                f"which has no use for them: drop them, or set n_centers={n} (every row a "
                "center) for the SGD iteration")
        falkon_fits_client(p, "" if est._given("n_centers") is not None else
                           f"n_centers='auto' takes {p} centers above 100k rows; ")
        if est.checkpoint is not None and (est.checkpoint_every or est.resume):
            raise ValueError(f"checkpoints are written by the SGD iteration (every row a center); "
                             f"the all-rows solve (n_centers={p} < {n} rows) runs "
                             f"n_epochs={est.n_epochs} passes without them: drop "
                             "checkpoint_every/resume or set n_centers >= n")

    def fit(self, fit: FitContext, bandwidth: float, encoding: TargetEncoding,
            sample: np.ndarray | None, read_seconds: float) -> None:
        est, engine, data, p, n = self.est, fit.engine, fit.data, self.p, fit.data.n_rows
        lam = float(est._given("alpha") or _DEFAULT_RIDGE)
        rng = np.random.default_rng([est.random_state_, 0xE16])
        idx = np.sort(rng.choice(n, size=p, replace=False))
        with phase(f"eigenpro: FALKON preconditioner of {p} centers (their kernel and its "
                   "Cholesky factors, on the client)", engine.options.progress):
            centers = rows_as_float32(subset_rows(data, idx), fit.client)
            t0 = time.perf_counter()
            pre = FalkonPreconditioner.from_kernel(center_kernel(centers, est.kernel, bandwidth),
                                                   lam)
            t_pre = time.perf_counter() - t0
        mode = cache_mode(fit, p)
        constants = {**centers_payload(centers),
                     "kernel": est.kernel, "bandwidth": float(bandwidth), "encoding": encoding,
                     "cache": mode,
                     "centers_token": dask.base.tokenize(data.X.name, est.kernel, bandwidth, idx)}

        shifted = {k: constants[k] for k in ("centers", "centers_sq", "centers_shift")}

        def one_pass(v: np.ndarray, targets: bool) -> dict:
            return engine.map_reduce(data, falkon_partial, {**constants, "v": v.astype(np.float32),
                                                            "targets": targets},
                                     label="eigenpro all-rows pass", wants_chunk=True)

        est.validation_scores_ = []
        best: dict[str, Any] = {}
        t_iter = [time.perf_counter()]
        seconds: list[float] = []

        def on_iter(a: np.ndarray, k: int) -> bool:
            now = time.perf_counter()
            seconds.append(now - t_iter[0])
            t_iter[0] = now
            if fit.val is None:
                return False
            spec = {"kind": "kernel", "centers": shifted, "kernel": est.kernel,
                    "bandwidth": bandwidth, "coef": a}
            score = validation_score(engine, fit.val, est._task, predict_block, spec,
                                     encoding.classes, encoding.offset)
            est.validation_scores_.append(score)
            if not best or score > best["score"]:
                best.update(score=score, coef=a.copy(), epoch=k)
            return k - best["epoch"] >= int(est.n_iter_no_change)

        result = falkon_solve(one_pass, pre, n, encoding.n_outputs, int(est.n_epochs), on_iter)
        short = None if best else unconverged(result, int(est.n_epochs))
        if short is not None:  # early stopping chose its iterate on held-out rows
            warnings.warn(f"eigenpro (n_centers={p} of {n} rows): {short}", FitQualityWarning,
                          stacklevel=user_stacklevel())
        est.form_, est.solver_, est.centers_ = "kernel", "falkon", centers
        est.kernel_ = est.kernel
        est.coef_ = best["coef"] if best else result.coef
        est.best_epoch_ = best["epoch"] + 1 if best else None
        est.n_centers_, est.n_rows_used_, est.alpha_ = p, n, lam
        est.history_ = [{**h, "seconds": s} for h, s in zip(result.history, seconds)]
        est.step_backoffs_ = []
        est.preconditioner_seconds_ = t_pre
        est.bandwidth_ = float(bandwidth)
        est.encoding_ = encoding
        est.n_features_in_ = int(data.n_inputs)
        est.kernel_cache_ = mode
        est.n_passes_ = result.n_passes
        for name in ("eigenvalues_", "q_", "batch_size_", "critical_batch_", "beta_", "step_size_",
                     "eigensolver_", "subsample_size_", "damping_", "lanes_"):
            setattr(est, name, None)
        if est.verbose:
            last = result.history[-1] if result.history else {}
            nan = float("nan")
            print(f"eigenpro (all rows): n={n} centers={p} alpha={lam:.3g} preconditioner "
                  f"{t_pre:.1f}s passes={result.n_passes} cache={mode} cg residual="
                  f"{last.get('residual', nan):.3g} train mse={last.get('loss', nan):.4g}",
                  file=sys.stderr, flush=True)


def falkon_fits_client(p: int, why: str = "") -> None:
    """Refuse, before any work, p centers whose preconditioner this process
    cannot hold: about 20 p^2 bytes at its peak (:func:`FalkonPreconditioner.from_kernel`),
    8 GB for the 20 000 centers "auto" takes above 100k rows.  Free memory is
    the machine's, or what a container's memory limit leaves (Dask's reading)."""
    import psutil
    from distributed.system import MEMORY_LIMIT

    need = 20 * p * p
    free = min(psutil.virtual_memory().available,
               MEMORY_LIMIT - psutil.Process().memory_info().rss)
    if need > free:
        fits = int(math.sqrt(free / 20)) // 1000 * 1000
        raise MemoryError(
            f"{why}n_centers={p}: FALKON's preconditioner is factorised here, on the client, and "
            f"needs about {need / 2**30:.1f} GiB at its peak, where {free / 2**30:.1f} GiB are "
            f"free; pass n_centers={max(fits, 1000)} or fewer (its memory grows as n_centers^2), "
            "or fit from a machine with more memory")
