"""EigenProRegressor / EigenProClassifier: preconditioned kernel least squares
(Ma & Belkin 2017).  The public estimators choose one of three routes, each
its own class with its own checks: every row a center (Table 2 SGD,
:mod:`.kernel_form`), fewer centers than rows (FALKON's CG, :mod:`.nystrom`)
or random features (EigenPro-RF, Table 1, :mod:`.features`)."""

from __future__ import annotations

import math
import time
from typing import Any

import dask
import dask.array as da
import numpy as np
from sklearn.base import ClassifierMixin, RegressorMixin

from dkernel.estimators.base import BaseEstimator, balanced_rows, graph_value, warn_many_classes
from dkernel.estimators.eigenpro.features import (
    _RF_PAIRS,
    _RF_ROWS_PER_FEATURE,
    FeatureRoute,
    rf_subsample,
)
from dkernel.estimators.eigenpro.kernel_form import KernelRoute
from dkernel.estimators.eigenpro.nystrom import _DEFAULT_RIDGE, NystromRoute
from dkernel.estimators.eigenpro.route import Route, checked_predict_block, predict_block
from dkernel.estimators.fitting import FitContext, feature_error_doc, one_fit_at_a_time
from dkernel.estimators.history import history_meta, set_history
from dkernel.estimators.sampling import bandwidth_rows
from dkernel.estimators.spec import documented, params_of
from dkernel.estimators.supervised import ClassifierOutputs, RegressorOutputs

__all__ = ["EigenProClassifier", "EigenProRegressor", "rf_subsample", "_DEFAULT_RIDGE",
           "_RF_PAIRS", "_RF_ROWS_PER_FEATURE"]

#: n_centers="auto": up to this many rows, every row is a center (interpolating
#: kernel form, Table 2); above it the model has _AUTO_NYSTROM_CENTERS centers
#: and every row enters the Nystrom objective (FALKON).
_MAX_AUTO_CENTERS = 100_000
#: The all-rows solve factorises K(C, C) on the coordinator: O(p^3) flops and
#: 20 bytes per pair of centers at its peak (K in float32, its float64 copy and
#: Cholesky factor, T T^T).  20 000 centers cost ~5e12 flops and 8 GB once
#: (minutes on the 2-core development VMs, seconds on a server; refused where
#: the client's memory cannot hold it, NystromRoute.check), about the sqrt(n) log n
#: that Rudi et al. (Thm. 3) need for the optimal rate at n ~ 10^7.
_AUTO_NYSTROM_CENTERS = 20_000


class _EigenProBase(BaseEstimator):
    def __init__(self, *, kernel: str = "gaussian", bandwidth: float | str = "auto",
                 n_centers: int | str = "auto", n_features: int | str = "auto",
                 alpha: float | str = "auto", q: int | str = "auto",
                 subsample_size: int | str = "auto", damping: float | str = "auto",
                 batch_size: int | str = "auto", step_size: float | str = "auto",
                 max_batch: int | str = "auto", n_epochs: int = 10, block_size: int = 1024,
                 kernel_cache: str = "auto", early_stopping: bool = False,
                 validation_fraction: float = 0.1, n_iter_no_change: int = 2,
                 lanes: int | str = "auto", random_state: int = 0, client: Any = None,
                 verbose: bool = False, checkpoint: str | None = None, checkpoint_every: int = 0,
                 resume: bool = False,
                 feature_cache: str = "auto", local_steps: int | str = "auto") -> None:
        self._store_params(locals())

    def _check_params(self) -> None:
        super()._check_params()
        step, alpha = self._given("step_size"), self._given("alpha")
        if step is not None and alpha is not None and float(step) * float(alpha) >= 2:
            raise ValueError(
                f"step_size * alpha = {float(step) * float(alpha):.3g} >= 2: the ridge term "
                f"alone makes the steps diverge (each scales the model by 1 - step_size * "
                f"alpha <= -1); set step_size below 2 / alpha = {2 / float(alpha):.3g}, or "
                "leave it 'auto'")
        # each form keeps its own blocks: a setting is used or refused
        if self._given("n_features") is not None and self.kernel_cache != "auto":
            raise ValueError(f"kernel_cache={self.kernel_cache!r} keeps the kernel form's rows; "
                             "with n_features set the fit uses random features: set "
                             "feature_cache instead")
        if self._given("n_features") is None and self.feature_cache != "auto":
            raise ValueError(f"feature_cache={self.feature_cache!r} applies to the random-feature "
                             "form (n_features set); the kernel form keeps kernel rows: set "
                             "kernel_cache instead")
        block_default = next(p.default for p in params_of(type(self)) if p.name == "block_size")
        if self._given("n_features") is None and self.block_size != block_default:
            raise ValueError(f"block_size={self.block_size} sets the random-feature form's blocks "
                             "(n_features set); the kernel form has none: drop block_size or "
                             "set n_features")
        if None not in (self._given("q"), self._given("batch_size"), self._given("max_batch")) \
                and (self._given("n_features") is None or self._given("local_steps") is not None):
            # (with features and local_steps "auto", max_batch also sets the rounds)
            raise ValueError(f"max_batch={self.max_batch} caps the automatic q and batch_size; "
                             "with both given it has no use: drop max_batch, or one of them")
        if self._given("n_features") is None and self._given("local_steps") not in (None, 1):
            raise ValueError(f"local_steps={self.local_steps} applies to the random-feature form "
                             "(n_features set), whose steps are taken on the workers; the "
                             "kernel form's are not: drop local_steps or set n_features")
        self._route(None).check()

    def _route(self, n_rows: int | None) -> Route:
        """The route the settings and the row count choose (rows unknown: None,
        where only the choice between the forms is known): random features
        with ``n_features``; else every row a center when p >= n, p being
        ``n_centers`` or, "auto", all rows up to _MAX_AUTO_CENTERS and
        _AUTO_NYSTROM_CENTERS above; else the Nystrom solve."""
        if self._given("n_features") is not None:
            return FeatureRoute(self, n_rows or 0)
        if n_rows is None:
            return KernelRoute(self, 0)
        if self._given("n_centers") is not None:
            p = min(int(self.n_centers), n_rows)
        else:
            p = n_rows if n_rows <= _MAX_AUTO_CENTERS else _AUTO_NYSTROM_CENTERS
        return KernelRoute(self, n_rows) if p >= n_rows else NystromRoute(self, n_rows, p)

    @one_fit_at_a_time
    def fit(self, X: Any, y: Any = None) -> _EigenProBase:
        """Fit on X (array, DataFrame or store path) and y (or the store's ``y``)."""
        fit = FitContext(self, X, y, target=self._task)
        route = self._route(fit.data.n_rows)
        route.check()  # before the cluster starts (a refusal came after 25 s of work)
        with fit:
            # one read serves the random-feature preconditioner and the bandwidth
            # (its rows are all training rows unless some are held out)
            shared = isinstance(route, FeatureRoute) and not self.early_stopping
            t_read = time.perf_counter()
            # (a sample for a numeric bandwidth too where features are used: the
            # warning about a bandwidth too narrow for them compares with it)
            narrow_check = self.bandwidth == "auto" or isinstance(route, FeatureRoute)
            # and for wider input than the float32 the fit computes in: rows 1e8 from
            # the origin came out chance-level without a word (warn_if_float32_loses)
            wide = np.dtype(fit.data.X.dtype).itemsize > 4
            size = route.subsample() if shared else 1000 if narrow_check or wide else 0
            rows, encoding = fit.sample_while(lambda: self._encoding(fit.data, fit.client), size)
            t_read = time.perf_counter() - t_read if shared else 0.0
            bandwidth = fit.bandwidth(None if rows is None else
                                      bandwidth_rows(rows, fit.data, fit.seed))
            if fit.labels is not None:  # the workers saw codes 0..c-1; the user sees labels
                self.classes_ = fit.labels
            if self._task == "classification":
                warn_many_classes(self.classes_, fit.data.n_rows)
            fit.hold_out()
            route.fit(fit, bandwidth, encoding, rows if shared else None, t_read)
        return self

    def _decision(self, X: Any) -> Any:
        """Raw scores f(X) of validated X, shape (n,) for one output else (n, c);
        lazy for dask input."""
        c = self.coef_.shape[1]
        route = FeatureRoute if self.form_ == "features" else KernelRoute
        spec = route.predict_spec(self, self.coef_)
        if isinstance(X, da.Array):
            if len(X.chunks[1]) > 1:
                X = X.rechunk({1: -1})
            given, X = X.chunks[0], balanced_rows(X)
            spec_d = graph_value(spec)
            starts = np.cumsum((0,) + X.chunks[0][:-1])  # NaN past a block of unknown rows
            parts = [da.from_delayed(dask.delayed(checked_predict_block)(
                         b, spec_d, None if math.isnan(start) else int(start)),
                         shape=(rows, c), dtype=np.float32)
                     for b, rows, start in zip(X.to_delayed().ravel(), X.chunks[0], starts)]
            f = da.concatenate(parts, axis=0)
            if f.chunks[0] != given:  # the input's chunks
                f = f.rechunk({0: given})
        else:
            f = predict_block(np.asarray(X), spec)
        return f[:, 0] if c == 1 else f

    # model files ---------------------------------------------------------------------
    #: estimator attribute -> model file key of the settings every route records
    _SAVED = {"bandwidth_": "bandwidth", "n_features_in_": "n_features_in", "q_": "q",
              "batch_size_": "batch_size", "critical_batch_": "critical_batch",
              "step_size_": "step_size", "beta_": "beta", "eigensolver_": "eigensolver",
              "kernel_cache_": "kernel_cache", "subsample_size_": "subsample_size"}

    def _get_model_state(self) -> tuple[dict, dict]:
        self._check_fitted("coef_")
        arrays = self._encoding_arrays()
        if self.eigenvalues_ is not None:  # None: the all-rows CG solve has no eigensystem
            arrays["eigenvalues"] = self.eigenvalues_
        meta = {"form": self.form_, "encoding": self.encoding_.kind,
                **{key: getattr(self, attr) for attr, key in self._SAVED.items()},
                "lanes": getattr(self, "lanes_", None),
                "step_backoffs": getattr(self, "step_backoffs_", []),
                "alpha": getattr(self, "alpha_", None),
                "feature_cache": getattr(self, "feature_cache_", None),
                "local_steps": getattr(self, "local_steps_", None),
                "damping": getattr(self, "damping_", None), **history_meta(self)}
        (FeatureRoute if self.form_ == "features" else KernelRoute).save(self, arrays, meta)
        return arrays, meta

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        self.encoding_ = self._load_encoding(arrays, meta)
        self.form_, self.coef_ = meta["form"], arrays["coef"]
        (FeatureRoute if self.form_ == "features" else KernelRoute).load(self, arrays, meta)
        for attr, key in self._SAVED.items():
            setattr(self, attr, meta[key])
        self.alpha_ = meta.get("alpha")  # None in files of the SGD routes before alpha
        self.eigenvalues_ = arrays.get("eigenvalues")
        self.lanes_ = meta.get("lanes")
        self.damping_ = meta.get("damping")  # None in files before it was recorded
        self.step_backoffs_ = meta.get("step_backoffs", [])
        if meta.get("feature_cache") is not None:  # the random-feature form, since feature_cache
            self.feature_cache_ = meta["feature_cache"]
        if meta.get("local_steps") is not None:  # the random-feature form, since local_steps
            self.local_steps_ = meta["local_steps"]
        set_history(self, meta)


@documented
class EigenProRegressor(RegressorOutputs, RegressorMixin, _EigenProBase):
    __doc__ = f"""Kernel least-squares regression by EigenPro iteration (Ma & Belkin 2017).

    Kernel form (default): f(x) = sum_j a_j k(x, c_j), fitted on every training
    row.  When every row is a center (``n_centers`` "auto" and n <= 100 000, or
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
        The ridge penalty the fit used (0.0 for alpha="auto" on the SGD routes).
    eigenvalues_ : ndarray (q + 1,) or None
        Top eigenvalues of K(S, S) / s (or of the feature covariance); None
        for the all-rows solve, which has no eigensystem.
    q_, batch_size_, step_size_, critical_batch_, damping_ : chosen SGD settings
        None for the all-rows solve (damping_: also in model files saved
        before it was recorded).
{feature_error_doc('the random-feature route only')}    history_ : list of dict
        SGD: per epoch ``epoch``, ``loss`` (mean squared residual of the
        mini-batches), ``steps``, ``rows``, ``seconds`` and, with early
        stopping, ``validation_score``.  All-rows solve: per CG iteration the
        relative residual, training loss and seconds.
    validation_scores_ : list of float
        The validation scores (early stopping only; empty otherwise).
    best_epoch_ : int or None
        Epoch whose model was kept (early stopping), else None.
    """


@documented
class EigenProClassifier(ClassifierOutputs, ClassifierMixin, _EigenProBase):
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
