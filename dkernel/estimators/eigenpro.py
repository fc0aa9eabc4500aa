"""EigenProRegressor / EigenProClassifier: preconditioned kernel least squares
(Ma & Belkin 2017); kernel form (Table 2) or random-feature form (Table 1)."""

from __future__ import annotations

import math
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dask
import dask.array as da
import numpy as np
from sklearn.base import ClassifierMixin, RegressorMixin

from dkernel.data.dataset import Dataset, open_dataset
from dkernel.engine import Engine, connect
from dkernel.engine import cache as worker_cache
from dkernel.estimators.base import (
    BaseEstimator,
    accuracy_any,
    bandwidth_rows,
    binary_margin,
    discover_classes,
    graph_value,
    labels_for_file,
    r2_score_any,
    resolve_bandwidth,
    resolve_random_state,
    sample_rows,
    score_targets,
    validate_fit_input,
    validate_predict_input,
)
from dkernel.estimators.history import (
    EpochMonitor,
    history_meta,
    set_history,
    split_validation,
    validation_score,
)
from dkernel.estimators.history import subset_rows as _subset
from dkernel.estimators.spec import documented
from dkernel.features import FeatureMap
from dkernel.kernels import kernel_diagonal_max
from dkernel.solvers.eigenpro import (
    KernelEigenProProgram,
    critical_batch,
    predict_kernel,
    step_size,
    subsample_preconditioner,
)
from dkernel.solvers.eigenpro_rf import (
    FeatureEigenProProgram,
    default_batch,
    feature_preconditioner,
)
from dkernel.solvers.falkon import FalkonPreconditioner, center_kernel, falkon_partial, falkon_solve
from dkernel.solvers.kernel_rows import (
    FillLost,
    kernel_rows_key,
    symmetric_fill,
)
from dkernel.solvers.targets import TargetEncoding

#: n_centers=None: up to this many rows, every row is a center (interpolating
#: kernel form, Table 2); above it the model has _AUTO_NYSTROM_CENTERS centers
#: and every row enters the Nystrom objective (FALKON).
_MAX_AUTO_CENTERS = 100_000
#: subsample_size=None below 100k rows: the most rows whose eigenpairs are still
#: exact (dense eigh; dkernel.linalg's dense_max), so q may use every pair.  On
#: Fashion-MNIST it gave q = 667, m* = 4093 and 0.904 test accuracy after 3
#: epochs, where EigenPro 2's s = 2000 (q = 361, m* = 1997) needed 7.
_KERNEL_SUBSAMPLE = 4096
#: Least rows of the random-feature preconditioner's subsample (Ma & Belkin use
#: M = 4800 for the kernel form); see :func:`rf_subsample`.
_RF_SUBSAMPLE = 8000
#: Sampled rows per feature when q may reach deep into the spectrum (the
#: dense eigensolve, D <= 4096): see :func:`rf_subsample`.
_RF_ROWS_PER_FEATURE = 6
#: Most eigenpairs of the random-feature preconditioner.  EigenPro 2 (Ma &
#: Belkin 2019) picks q so that the critical batch m* matches the step the
#: hardware takes; here that step is the cluster's (``default_batch``: 65536
#: rows on 2 workers at D = 2048, reached at q ~ 1535).  On 2M x 32 (2
#: workers, one epoch) q = 1535 gave test R^2 0.178 at 151k rows/s against
#: 0.138 at 97k rows/s for q = 512 (m* = 7375).  The client's dense eigensolve
#: costs O(D^2 q), ~2.5 s for 1537 pairs of D = 2048 in float32 here; the
#: randomized one (D > 4096) costs a pass over the sample per 1557 columns,
#: so it keeps 513.
_RF_PAIRS = 1537
_RF_PAIRS_RANDOMIZED = 513
#: Largest D whose preconditioner takes the dense eigensolve (_RF_PAIRS pairs).
_RF_DENSE_MAX = 4096
#: The all-rows solve factorises K(C, C) on the coordinator: O(p^3) flops and
#: p^2 float64.  20 000 centers cost ~5e12 flops and 3.2 GB once (minutes on
#: the 2-core development VMs, seconds on a server), about the sqrt(n) log n
#: that Rudi et al. (Thm. 3) need for the optimal rate at n ~ 10^7.
_AUTO_NYSTROM_CENTERS = 20_000
#: alpha=None in the all-rows solve: lambda of (1/n)|K_nM a - y|^2 + lambda a^T K_MM a.
_DEFAULT_RIDGE = 1e-6
#: Settings of the SGD iteration (Table 2) that the all-rows CG solve has no use for.
_SGD_ONLY = ("q", "subsample_size", "damping", "batch_size", "step_size", "max_batch")


def rf_subsample(n_features: int) -> int:
    """Default rows of the random-feature preconditioner's subsample for D features.

    EigenPro-RF's step is set by lambda' = lambda_{q+1}, read off the sample's
    spectrum; with the dense eigensolve (D <= 4096) q goes as deep as 1536 of
    2048 pairs, where sample eigenvalues fall below the population's
    (Marchenko-Pastur: the lower part of the spectrum spreads down as D / s
    grows).  On 2M x 32 at D = 2048 the preconditioned covariance of 24k
    fresh rows had its top eigenvalue 2.6x the sample's lambda' with s = 8000
    (D / s = 0.26; the default fit backed off once or ended no better than
    its start, seeds 0-2) and 1.9x with s = 6 D (48k fresh rows); s = 12000
    and 16000 fitted without back-off at the same test R^2.  At D = 4096
    (q = 1536) 8000 rows gave 2.2x, 6 D 1.5x.  So s = max(8000, 6 D) there;
    the randomized eigensolve (D > 4096) keeps q <= 512, in the upper part
    of the spectrum, where the sample errs high, and 8000 rows.
    """
    if int(n_features) > _RF_DENSE_MAX:
        return _RF_SUBSAMPLE
    return max(_RF_SUBSAMPLE, _RF_ROWS_PER_FEATURE * int(n_features))


class _EigenProBase(BaseEstimator):
    _task = ""

    def __init__(self, *, kernel: str = "gaussian", bandwidth: float | str = "auto",
                 n_centers: int | str = "auto", n_features: int | str = "auto",
                 alpha: float | str = "auto", q: int | str = "auto",
                 subsample_size: int | str = "auto", damping: float | str = "auto",
                 batch_size: int | str = "auto", step_size: float | str = "auto",
                 max_batch: int | str = "auto", n_epochs: int = 10, block_size: int = 1024,
                 kernel_cache: str = "auto", early_stopping: bool = False,
                 validation_fraction: float = 0.1, n_iter_no_change: int = 2,
                 lanes: int | str = "auto",
                 random_state: int = 0, client: Any = None, verbose: bool = False,
                 checkpoint: str | None = None, checkpoint_every: int = 0,
                 resume: bool = False) -> None:
        self._store_params(locals())

    # checks -------------------------------------------------------------------
    def _check_params(self) -> None:
        super()._check_params()
        if self._given("n_centers") is not None and self._given("n_features") is not None:
            raise ValueError("give n_centers (kernel form) or n_features (random-feature form), "
                             "not both")
        step, alpha = self._given("step_size"), self._given("alpha")
        if step is not None and alpha is not None and float(step) * float(alpha) >= 2:
            raise ValueError(
                f"step_size * alpha = {float(step) * float(alpha):.3g} >= 2: the ridge term "
                f"alone makes the steps diverge (each scales the model by 1 - step_size * "
                f"alpha <= -1); set step_size below 2 / alpha = {2 / float(alpha):.3g}, or "
                "leave it 'auto'")

    @property
    def _form(self) -> str:
        return "features" if self._given("n_features") is not None else "kernel"

    def _encoding(self, data: Dataset, client: Any) -> TargetEncoding:
        raise NotImplementedError

    # fit ---------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None) -> _EigenProBase:
        """Fit on X (array, DataFrame or store path) and y (or the store's ``y``)."""
        self._check_params()
        # scikit-learn contract: validation, label codes, the integer seed ------------
        X, y, labels = validate_fit_input(self, X, y, target=self._task)
        self.random_state_ = resolve_random_state(self.random_state)
        # -------------------------------------------------------------------------
        data = open_dataset(X, y, require_y=True)
        with connect(self.client) as client:
            bandwidth = self.bandwidth
            # one read serves the random-feature preconditioner and the bandwidth
            # (its rows are all training rows unless some are held out)
            shared = self._form == "features" and not self.early_stopping
            rows, t_read = None, 0.0
            # the pass over y (its mean or classes) runs while the sample is read
            with ThreadPoolExecutor(1) as pool:
                pending = pool.submit(self._encoding, data, client)
                if shared:
                    t_read = time.perf_counter()
                    rows = sample_rows(data, self.random_state_, client,
                                       size=self._rf_subsample(data))
                    t_read = time.perf_counter() - t_read
                if isinstance(bandwidth, str):
                    bandwidth = resolve_bandwidth(
                        bandwidth, self.kernel,
                        bandwidth_rows(rows, self.random_state_) if shared
                        else sample_rows(data, self.random_state_, client))
                encoding = pending.result()
            if labels is not None:  # the workers saw codes 0..c-1; the user sees labels
                self.classes_ = labels
            rng = np.random.default_rng([self.random_state_, 0xE16])
            val = None
            if self.early_stopping:
                data, val = split_validation(data, self.validation_fraction, self.random_state_)
            engine = Engine(client, self._engine_options())
            if self._form == "kernel":
                self._fit_kernel(engine, client, data, val, bandwidth, encoding, rng)
            else:
                self._fit_features(engine, data, val, bandwidth, encoding, rows, t_read)
        return self

    def _fit_kernel(self, engine: Engine, client: Any, data: Dataset, val: Dataset | None,
                    bandwidth: float, encoding: TargetEncoding, rng: np.random.Generator) -> None:
        """Every row a center (Table 2) when p >= n, else every row in the Nystrom
        objective over p sampled centers (FALKON); either way all n rows are used."""
        n = data.n_rows
        if self._given("n_centers") is not None:
            p = min(int(self._given("n_centers")), n)
        else:
            p = n if n <= _MAX_AUTO_CENTERS else _AUTO_NYSTROM_CENTERS
        if p < n:
            self._fit_nystrom(engine, client, data, val, bandwidth, encoding, rng, p)
            return
        ridge = 0.0 if self._given("alpha") is None else float(self._given("alpha"))
        mode = self._cache_mode(client, data, p)
        # the fill reads every chunk on its home anyway: the centers come from those reads
        chunks, homes = engine.resident_chunks(data) if mode != "off" else (None, None)
        centers = _rows_as_float32(data, client, chunks)
        s = min(p, self._given("subsample_size") or (_KERNEL_SUBSAMPLE if n < 100_000 else 12_000))
        sub_idx = np.sort(rng.choice(p, size=s, replace=False))
        damping = 0.95 if self._given("damping") is None else float(self._given("damping"))
        beta = kernel_diagonal_max(self.kernel)
        max_batch = int(self._given("max_batch") or min(s, p))
        # a fixed number of chunks (not one per worker): sums must not depend on the cluster
        pre, eig = subsample_preconditioner(engine, centers[sub_idx], self.kernel, bandwidth,
                                            q=self._given("q"), damping=damping, beta=beta,
                                            max_batch=max_batch, n_chunks=16,
                                            random_state=self.random_state_)
        q = pre.q
        # alpha raises the operator's eigenvalues by alpha (solvers.eigenpro's docstring)
        m_star = critical_batch(beta + ridge, pre.new_top + ridge)
        batch = int(self._given("batch_size") or max(1, min(int(m_star), max_batch, p)))
        token = dask.base.tokenize(data.X.name, self.kernel, bandwidth, p)
        resident = None
        if chunks is not None:  # K(X, X) is symmetric: each chunk pair's block once, before epoch 1
            t_fill = time.perf_counter()
            keys = [kernel_rows_key((data.X.name, c), token, mode) for c in range(data.n_chunks)]
            try:
                symmetric_fill(client, chunks, homes, list(data.row_chunks), keys, self.kernel,
                               bandwidth, mode, owner=f"fill-{token}",
                               progress=engine.options.progress)
                resident = chunks  # the steps need only y now: no read of X every epoch
            except FillLost as exc:  # the steps fill per chunk instead (they survive worker loss)
                warnings.warn(f"{exc}; the kernel rows are filled per chunk during epoch 1",
                              RuntimeWarning, stacklevel=3)
            del chunks
            if self.verbose:
                print(f"eigenpro: kernel rows of {data.n_chunks} chunks ({mode}) in "
                      f"{time.perf_counter() - t_fill:.1f}s", flush=True)
        program = KernelEigenProProgram(centers, sub_idx, pre, self.kernel, bandwidth, encoding,
                                        beta, data.row_offsets(), mode, token, ridge=ridge)
        if self._given("step_size") is not None:
            program.eta_override = float(self._given("step_size"))
        evaluate = None
        if val is not None:
            def evaluate(state: dict) -> float:
                spec = {"kind": "kernel", "centers": centers, "kernel": self.kernel,
                        "bandwidth": bandwidth, "coef": state["coef"]}
                return validation_score(engine, val, self._task, _predict_block, spec,
                                        encoding.classes, encoding.offset)
        state = self._run(engine, data, program, batch, evaluate, "coef", resident)
        del resident
        self.form_ = "kernel"
        self.solver_ = "eigenpro"
        self.centers_ = centers
        self.coef_ = state["coef"]
        self.n_centers_ = p
        self.n_rows_used_ = n
        self.alpha_ = ridge
        self._set_common(bandwidth, encoding, data.n_inputs, pre.values, q, batch, m_star, beta,
                         pre.new_top, eig.method, mode, s, ridge)

    def _fit_nystrom(self, engine: Engine, client: Any, data: Dataset, val: Dataset | None,
                     bandwidth: float, encoding: TargetEncoding, rng: np.random.Generator,
                     p: int) -> None:
        """p uniformly sampled centers, every row in the objective, FALKON's
        preconditioned CG (:mod:`dkernel.solvers.falkon`); one epoch = one CG
        iteration = one pass over every row."""
        n = data.n_rows
        given = [name for name in _SGD_ONLY if self._given(name) is not None]
        if given:  # refused, as alpha is on the other route: a setting is used or refused
            raise ValueError(
                f"{', '.join(given)} set the SGD iteration used when every row is a center; with "
                f"n_centers={p} < {n} rows the fit is a conjugate-gradient solve over all rows, "
                f"which has no use for them: drop them, or set n_centers={n} (every row a "
                "center) for the SGD iteration")
        if self.checkpoint is not None and (self.checkpoint_every or self.resume):
            raise ValueError(f"checkpoints are written by the SGD iteration (every row a center); "
                             f"the all-rows solve (n_centers={p} < {n} rows) runs "
                             f"n_epochs={self.n_epochs} passes without them: drop "
                             "checkpoint_every/resume or set n_centers >= n")
        lam = _DEFAULT_RIDGE if self._given("alpha") is None else float(self._given("alpha"))
        idx = np.sort(rng.choice(n, size=p, replace=False))
        centers = _rows_as_float32(_subset(data, idx), client)
        t0 = time.perf_counter()
        K_MM = center_kernel(centers, self.kernel, bandwidth)
        pre = FalkonPreconditioner.from_kernel(K_MM, lam)
        del K_MM
        t_pre = time.perf_counter() - t0
        mode = self._cache_mode(client, data, p)
        constants = {"centers": centers,
                     "centers_sq": (centers * centers).sum(axis=1).astype(np.float32),
                     "kernel": self.kernel, "bandwidth": float(bandwidth), "encoding": encoding,
                     "cache": mode,
                     "centers_token": dask.base.tokenize(data.X.name, self.kernel, bandwidth, idx)}

        def one_pass(v: np.ndarray, targets: bool) -> dict:
            return engine.map_reduce(data, falkon_partial, {**constants, "v": v.astype(np.float32),
                                                            "targets": targets},
                                     label="eigenpro all-rows pass", wants_chunk=True)

        self.validation_scores_ = []
        best: dict[str, Any] = {}
        t_iter = [time.perf_counter()]
        seconds: list[float] = []

        def on_iter(a: np.ndarray, k: int) -> bool:
            now = time.perf_counter()
            seconds.append(now - t_iter[0])
            t_iter[0] = now
            if val is None:
                return False
            spec = {"kind": "kernel", "centers": centers, "kernel": self.kernel,
                    "bandwidth": bandwidth, "coef": a}
            score = validation_score(engine, val, self._task, _predict_block, spec,
                                     encoding.classes, encoding.offset)
            self.validation_scores_.append(score)
            if not best or score > best["score"]:
                best.update(score=score, coef=a.copy(), epoch=k)
            return k - best["epoch"] >= int(self.n_iter_no_change)

        result = falkon_solve(one_pass, pre, n, encoding.n_outputs, int(self.n_epochs), on_iter)
        self.form_ = "kernel"
        self.solver_ = "falkon"
        self.centers_ = centers
        self.coef_ = best["coef"] if best else result.coef
        if best:
            self.best_epoch_ = best["epoch"] + 1
        self.n_centers_ = p
        self.n_rows_used_ = n
        self.alpha_ = lam
        self.history_ = [{**h, "seconds": s} for h, s in zip(result.history, seconds)]
        self.preconditioner_seconds_ = t_pre
        self.bandwidth_ = float(bandwidth)
        self.encoding_ = encoding
        self.n_features_in_ = int(data.n_inputs)
        self.kernel_cache_ = mode
        self.n_passes_ = result.n_passes
        for name in ("eigenvalues_", "q_", "batch_size_", "critical_batch_", "beta_", "step_size_",
                     "eigensolver_", "subsample_size_"):
            setattr(self, name, None)
        if self.verbose:
            last = result.history[-1] if result.history else {}
            nan = float("nan")
            print(f"eigenpro (all rows): n={n} centers={p} alpha={lam:.3g} preconditioner "
                  f"{t_pre:.1f}s passes={result.n_passes} cache={mode} cg residual="
                  f"{last.get('residual', nan):.3g} train mse={last.get('loss', nan):.4g}",
                  flush=True)

    def _rf_subsample(self, data: Dataset) -> int:
        B = min(int(self.block_size), int(self._given("n_features")))
        D = math.ceil(int(self._given("n_features")) / B) * B  # as _fit_features builds the map
        return min(data.n_rows, int(self._given("subsample_size") or rf_subsample(D)))

    def _fit_features(self, engine: Engine, data: Dataset, val: Dataset | None, bandwidth: float,
                      encoding: TargetEncoding, sample: np.ndarray | None,
                      read_seconds: float) -> None:
        """EigenPro-RF (Table 1).  ``sample``: the preconditioner's rows when the
        caller read them already (in ``read_seconds``, counted in
        ``preconditioner_seconds_``), else None."""
        B = min(int(self.block_size), int(self._given("n_features")))
        n_blocks = math.ceil(int(self._given("n_features")) / B)
        D = n_blocks * B
        features = FeatureMap(self.kernel, bandwidth, data.n_inputs, B, self.random_state_)
        # paper 4.1: tau = 1/4 for RF
        tau = 0.25 if self._given("damping") is None else float(self._given("damping"))
        self.lanes_ = engine.pin_lanes(data)
        max_batch = int(self._given("max_batch") or default_batch(self.lanes_, D, data.n_rows))
        # Table 1: the preconditioner comes from a subsample, so its cost does not grow with n
        s = self._rf_subsample(data)
        t0 = time.perf_counter()
        if sample is None:  # rows held out for early stopping are not sampled
            sample = sample_rows(data, self.random_state_, engine.client, size=s)
        pre, beta, eig = feature_preconditioner(
            engine, sample, features, n_blocks,
            min(D, _RF_PAIRS if D <= _RF_DENSE_MAX else _RF_PAIRS_RANDOMIZED),
            max_batch, tau, self.random_state_,
            q=self._given("q"), label="eigenpro-rf preconditioner")
        self.preconditioner_seconds_ = time.perf_counter() - t0 + read_seconds
        q = pre.q
        ridge = 0.0 if self._given("alpha") is None else float(self._given("alpha"))
        # P, beta, m* and eta of H + alpha I, the curvature of the penalised objective
        # (solvers.eigenpro_rf's docstring)
        shifted = pre.shifted(ridge)
        m_star = critical_batch(beta + ridge, shifted.new_top)
        batch = int(self._given("batch_size") or max(1, min(int(m_star), max_batch, data.n_rows)))
        program = FeatureEigenProProgram(features, n_blocks, shifted, encoding, beta + ridge,
                                         cache_blocks=int(self.n_epochs) > 1, ridge=ridge)
        if self._given("step_size") is not None:
            program.eta_override = float(self._given("step_size"))
        evaluate = None
        if val is not None:
            def evaluate(state: dict) -> float:
                spec = {"kind": "features", "features": features, "n_blocks": n_blocks,
                        "coef": state["theta"]}
                return validation_score(engine, val, self._task, _predict_block, spec,
                                        encoding.classes, encoding.offset)
        state = self._run(engine, data, program, batch, evaluate, "theta")
        self.form_ = "features"
        self.features_ = features
        self.coef_ = state["theta"]
        self.alpha_ = ridge
        self._set_common(bandwidth, encoding, data.n_inputs, pre.values, q, batch, m_star, beta,
                         pre.new_top, eig.method, "worker-cache", s, ridge)

    def _run(self, engine: Engine, data: Dataset, program: Any, batch: int, evaluate: Any,
             key: str, resident: dict | None = None) -> dict:
        monitor = EpochMonitor(engine, program, evaluate, int(self.n_iter_no_change))
        self.lanes_ = engine.pin_lanes(data)  # recorded: the model depends on it
        state = engine.run_steps(data, program, n_epochs=int(self.n_epochs), batch_size=batch,
                                 random_state=self.random_state_, on_epoch=monitor,
                                 resident=resident)
        self.step_backoffs_ = list(engine.backoffs)
        self.history_ = monitor.history()
        self.validation_scores_ = [e["validation_score"] for e in self.history_
                                   if "validation_score" in e]
        self.best_epoch_ = monitor.best_epoch
        return monitor.final_state(state)

    def _cache_mode(self, client: Any, data: Dataset, p: int) -> str:
        """float32 kernel rows if every worker's share fits its cache budget, else
        fixed16 if that fits, else streaming recomputation."""
        if self.kernel_cache != "auto":
            return self.kernel_cache
        # as tasks, not client.run: the worker's memory limit is only visible inside a task
        workers = sorted(client.scheduler_info(n_workers=-1).get("workers", {}))
        if not workers:
            return "off"
        budgets = dict(zip(workers, client.gather([
            client.submit(worker_cache.budget, workers=[w], allow_other_workers=False, pure=False)
            for w in workers])))
        share = np.zeros(len(workers))
        for c, rows in enumerate(data.row_chunks):  # the engine homes chunk c on worker c % n
            share[c % len(workers)] += rows
        need = float(share.max()) * p
        room = min(budgets.values())
        if need * 4 <= room:
            return "float32"
        if need * 2 <= room:
            return "fixed16"
        return "off"

    def _set_common(self, bandwidth: float, encoding: TargetEncoding, n_inputs: int,
                    eigenvalues: np.ndarray, q: int, batch: int, m_star: float, beta: float,
                    lam_new: float, method: str, cache_mode: str, s: int | None,
                    ridge: float = 0.0) -> None:
        self.bandwidth_ = float(bandwidth)
        self.encoding_ = encoding
        self.n_features_in_ = int(n_inputs)
        self.eigenvalues_ = np.asarray(eigenvalues, dtype=np.float64)
        self.q_ = int(q)
        self.batch_size_ = int(batch)
        self.critical_batch_ = float(m_star)
        self.beta_ = float(beta)
        eta = (self._given("step_size") if self._given("step_size") is not None
               else step_size(batch, beta + ridge, lam_new + ridge))
        self.step_size_ = float(eta)
        self.eigensolver_ = method
        self.kernel_cache_ = cache_mode
        self.subsample_size_ = s
        if self.verbose:
            print(f"eigenpro: q={self.q_} lambda_1={self.eigenvalues_[0]:.4g} "
                  f"lambda_q+1={self.eigenvalues_[self.q_]:.4g} m*={m_star:.0f} batch={batch} "
                  f"eta={eta:.4g} cache={cache_mode} eigensolver={method}", flush=True)

    # predict -----------------------------------------------------------------------
    def _validated(self, X: Any) -> Any:
        self._check_fitted("coef_")
        return validate_predict_input(self, X)

    def _decision(self, X: Any) -> Any:
        """Raw scores f(X) of validated X, shape (n,) for one output else (n, c);
        lazy for dask input."""
        c = self.coef_.shape[1]
        spec = self._predict_spec()
        if isinstance(X, da.Array):
            if len(X.chunks[1]) > 1:
                X = X.rechunk({1: -1})
            spec_d = graph_value(spec)
            parts = [da.from_delayed(dask.delayed(_predict_block)(b, spec_d), shape=(rows, c),
                                     dtype=np.float32)
                     for b, rows in zip(X.to_delayed().ravel(), X.chunks[0])]
            f = da.concatenate(parts, axis=0)
        else:
            f = _predict_block(np.asarray(X), spec)
        return f[:, 0] if c == 1 else f

    def _predict_spec(self) -> dict:
        if self.form_ == "kernel":
            return {"kind": "kernel", "centers": self.centers_, "kernel": self.kernel,
                    "bandwidth": self.bandwidth_, "coef": self.coef_}
        B = self.features_.block_size
        return {"kind": "features", "features": self.features_,
                "n_blocks": self.coef_.shape[0] // B, "coef": self.coef_}

    # model files ---------------------------------------------------------------------
    def _get_model_state(self) -> tuple[dict, dict]:
        self._check_fitted("coef_")
        e = self.encoding_
        arrays = {"coef": self.coef_, "classes": np.asarray(e.classes),
                  "offset": np.asarray(e.offset, dtype=np.float64)}
        if hasattr(self, "classes_"):
            arrays["labels"] = labels_for_file(self.classes_)
        if self.eigenvalues_ is not None:  # None: the all-rows CG solve has no eigensystem
            arrays["eigenvalues"] = self.eigenvalues_
        meta = {"form": self.form_, "encoding": e.kind, "bandwidth": self.bandwidth_,
                "n_features_in": self.n_features_in_, "q": self.q_, "batch_size": self.batch_size_,
                "critical_batch": self.critical_batch_, "step_size": self.step_size_,
                "beta": self.beta_,
                "eigensolver": self.eigensolver_, "kernel_cache": self.kernel_cache_,
                "subsample_size": self.subsample_size_,
                "lanes": getattr(self, "lanes_", None),
                "step_backoffs": getattr(self, "step_backoffs_", []),
                "alpha": getattr(self, "alpha_", None), **history_meta(self)}
        if self.form_ == "kernel":
            arrays["centers"] = self.centers_
            meta.update(solver=self.solver_, n_centers=self.n_centers_,
                        n_rows_used=self.n_rows_used_)
        else:
            meta["features"] = self.features_.to_dict()
        return arrays, meta

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        enc = TargetEncoding(meta["encoding"], tuple(arrays["classes"].tolist()),
                             tuple(arrays["offset"].tolist()))
        self.form_ = meta["form"]
        self.coef_ = arrays["coef"]
        if self.form_ == "kernel":
            self.centers_ = arrays["centers"]
            # model files written before the all-rows solve: the SGD form on every center
            self.solver_ = meta.get("solver", "eigenpro")
            self.n_centers_ = meta.get("n_centers", int(self.centers_.shape[0]))
            self.n_rows_used_ = meta.get("n_rows_used", self.n_centers_)
        else:
            self.features_ = FeatureMap.from_dict(meta["features"])
        self.encoding_ = enc
        self.alpha_ = meta.get("alpha")  # None in files of the SGD routes before alpha
        self.bandwidth_ = meta["bandwidth"]
        self.n_features_in_ = meta["n_features_in"]
        self.eigenvalues_ = arrays.get("eigenvalues")
        self.q_, self.batch_size_ = meta["q"], meta["batch_size"]
        self.critical_batch_, self.step_size_ = meta["critical_batch"], meta["step_size"]
        self.beta_ = meta["beta"]
        self.eigensolver_, self.kernel_cache_ = meta["eigensolver"], meta["kernel_cache"]
        self.subsample_size_ = meta["subsample_size"]
        self.lanes_ = meta.get("lanes")
        self.step_backoffs_ = meta.get("step_backoffs", [])
        set_history(self, meta)
        if enc.kind != "regression":  # files before label codes have no "labels"
            self.classes_ = arrays.get("labels", arrays["classes"])


def _predict_block(X: Any, spec: dict) -> Any:
    X = X.astype(np.float32, copy=False)
    if spec["kind"] == "kernel":
        return predict_kernel(X, spec["centers"], spec["coef"], spec["kernel"], spec["bandwidth"])
    Z = spec["features"].transform(X, spec["n_blocks"])
    return Z @ spec["coef"].astype(np.float32)


def _rows_as_float32(data: Dataset, client: Any, chunks: dict | None = None) -> np.ndarray:
    """Every row of X on the client; from ``chunks`` (futures of each chunk's
    (X, y) read by :meth:`Engine.resident_chunks`) when given, not the store again."""
    if data.host is not None:
        return np.ascontiguousarray(data.host[0], dtype=np.float32)
    if chunks is not None:
        parts = client.gather([chunks[c] for c in range(data.n_chunks)])
        return np.concatenate([np.asarray(X, dtype=np.float32) for X, _ in parts])
    return np.ascontiguousarray(client.compute(data.X.astype(np.float32)).result())


@documented
class EigenProRegressor(RegressorMixin, _EigenProBase):
    """Kernel least-squares regression by EigenPro iteration (Ma & Belkin 2017).

    Kernel form (default): f(x) = sum_j a_j k(x, c_j), fitted on every training
    row.  When every row is a center (``n_centers`` None and n <= 100 000, or
    ``n_centers >= n``) the fit is the preconditioned SGD of Table 2.  With
    fewer centers than rows, the p centers are sampled from the rows and all n
    rows enter the Nystrom objective

        min_a (1/n) |K_nM a - y|^2 + alpha a^T K_MM a,

    solved by FALKON (Rudi, Carratino & Rosasco 2017, Alg. 1): conjugate
    gradient preconditioned by two Cholesky factors of K(C, C), one pass over
    every row per iteration (:mod:`dkernel.solvers.falkon`).  Random-feature
    form (``n_features=D``): EigenPro-RF, Table 1, a bounded model for data of
    any size.  The preconditioners are computed once; q, the batch size and
    the step size are chosen from the eigenvalues unless given.

    Attributes
    ----------
    coef_ : ndarray (p, c) or (D, c)
    centers_ : ndarray (p, d), kernel form
    solver_ : {"eigenpro", "falkon"}, kernel form
        Every row a center (Table 2 SGD), or fewer centers than rows (CG).
    n_centers_, n_rows_used_ : int, kernel form
        Centers p and training rows that entered the fit (always all n).
    alpha_ : float
        The ridge penalty the fit used (0.0 for alpha=None on the SGD routes).
    eigenvalues_ : ndarray (q + 1,) or None
        Top eigenvalues of K(S, S) / s (or of the feature covariance); None
        for the all-rows solve, which has no eigensystem.
    q_, batch_size_, step_size_, critical_batch_ : chosen SGD settings
        None for the all-rows solve.
    history_ : list of dict
        SGD: per epoch ``epoch``, ``loss`` (mean squared residual of the
        mini-batches), ``steps``, ``rows``, ``seconds`` and, with early
        stopping, ``validation_score``.  All-rows solve: per CG iteration the
        relative residual, training loss and seconds.
    validation_scores_ : list of float
        The validation scores (early stopping only; empty otherwise).
    best_epoch_ : int or None
        Epoch whose model was kept (early stopping), else None.
    """

    _task = "regression"

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # 2-D y: one output per column
        return tags

    def _encoding(self, data: Dataset, client: Any) -> TargetEncoding:
        mean = (data.host[1].mean(axis=0) if data.host is not None
                else client.compute(data.y.astype(np.float64).mean(axis=0)).result())
        return TargetEncoding("regression",
                              offset=tuple(np.atleast_1d(mean).astype(float).tolist()))

    def predict(self, X: Any) -> Any:
        """f(X) + mean(y) in float64 (f is float32, like the feature path: the mean
        of y = 1e7 + O(1) would lose the O(1) part in float32); lazy dask array
        for dask input."""
        X = self._validated(X)
        f = self._decision(X).astype(np.float64)
        off = np.asarray(self.encoding_.offset, dtype=np.float64)
        return f + (off[0] if f.ndim == 1 else off)

    def score(self, X: Any, y: Any = None) -> float:
        """R^2 of the prediction (y may be omitted for a store holding ``y``)."""
        X, y = score_targets(X, y)
        return r2_score_any(y, self.predict(X))


@documented
class EigenProClassifier(ClassifierMixin, _EigenProBase):
    """Kernel classification by EigenPro iteration on one-hot targets (square
    loss, as in the paper); predicts the arg-max class.  The routes, their
    parameters and attributes are :class:`EigenProRegressor`'s.

    Examples
    --------
    >>> import numpy as np
    >>> from distributed import Client
    >>> from dkernel import EigenProClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(400, 2)); y = (X[:, 0] * X[:, 1] > 0).astype(int)
    >>> with Client(n_workers=1, processes=False, dashboard_address=None) as client:
    ...     clf = EigenProClassifier(bandwidth=1.0, n_epochs=5, client=client).fit(X, y)
    >>> clf.score(X, y) > 0.9
    True
    """

    _task = "classification"

    def _encoding(self, data: Dataset, client: Any) -> TargetEncoding:
        classes = discover_classes(data, client)
        self.classes_ = classes
        return TargetEncoding("onehot", classes=tuple(classes.tolist()))

    def decision_function(self, X: Any) -> Any:
        """Scores, shape (n,) for two classes (positive means ``classes_[1]``), else
        (n, n_classes); lazy for dask input."""
        return binary_margin(self._decision(self._validated(X)))

    def predict(self, X: Any) -> Any:
        """Predicted labels; lazy dask array for dask input."""
        f = self._decision(self._validated(X))
        classes = np.asarray(self.classes_)
        idx = f.argmax(axis=1)
        if isinstance(idx, da.Array):
            return idx.map_blocks(lambda i: classes[i], dtype=classes.dtype)
        return classes[idx]

    def score(self, X: Any, y: Any = None) -> float:
        """Mean accuracy (y may be omitted for a store holding ``y``)."""
        X, y = score_targets(X, y)
        return accuracy_any(y, self.predict(X), self.classes_)
