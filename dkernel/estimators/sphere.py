"""SphereRegressor: truncated kernel SGD on spheres (Bai & Shi, Algorithm 1)."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Iterator
from typing import Any

import dask.array as da
import numpy as np
from sklearn.base import RegressorMixin

from dkernel._stack import user_stacklevel
from dkernel.engine import EngineOptions, FitQualityWarning
from dkernel.engine.stall import result
from dkernel.estimators.base import (
    BaseEstimator,
    apply_rows,
    validate_predict_input,
)
from dkernel.estimators.fitting import FitContext, one_fit_at_a_time
from dkernel.estimators.history import clean_entry, history_meta, set_history
from dkernel.estimators.order import warn_if_ordered
from dkernel.estimators.scoring import regression_score
from dkernel.estimators.spec import documented
from dkernel.kernels.zonal import ZonalFeatures
from dkernel.solvers.sphere import (
    _kernel_eval,
    averaged_kernel_coefficients,
    check_step,
    fingerprint,
    init_state,
    make_payload,
    scan_rows,
    sphere_dim,
    sphere_fold,
    sphere_prepare,
    to_sphere,
)


@documented
class SphereRegressor(RegressorMixin, BaseEstimator):
    r"""Least-squares regression on the sphere by truncated kernel SGD (T-kernel SGD).

    One pass over the rows in order (an online algorithm); point n updates
    ``f <- f - eta_n (f(x_n) - y_n) K^{L_n}(x_n, .)`` with the zonal kernel
    truncated at level L_n (the smallest L with dim Pi_L >= n^theta - 1) and
    the prediction is the Polyak average of the iterates.  Columns of a 2-D
    y are fitted one-vs-rest (independent outputs sharing the kernel work).
    See :mod:`dkernel.solvers.sphere` for the update and its blocked form.
    The parameters are named as in Bai & Shi.

    Attributes
    ----------
    form_ : str
    max_level_ : int
        L_N at the last step.
    coef_ : ndarray (F, c)
        Averaged coefficients on ``features_`` (features form).
    support_, dual_coef_, level_ : ndarray
        Points, averaged coefficients and levels (kernel form).
    recorded_n_ : ndarray
        Steps recorded for :meth:`staged_predict`.
    history_ : list of dict
        Per pass: ``epoch``, ``rows``, ``seconds`` and ``loss``, the mean
        squared progressive residual (f_{n-1}(x_n) - y_n)^2 over the pass:
        each point is predicted before it updates the model, so this is a
        held-out error of the online estimator (not of the Polyak average).

    Examples
    --------
    >>> import numpy as np
    >>> from distributed import Client
    >>> from dkernel import SphereRegressor
    >>> from dkernel.datasets import make_sphere_polynomial
    >>> X, y, _ = make_sphere_polynomial(4000, d=3, degree=3, random_state=0)
    >>> with Client(n_workers=1, processes=False, dashboard_address=None) as client:
    ...     model = SphereRegressor(theta=0.5, client=client).fit(X, y)
    >>> model.score(X, y) > 0.9
    True
    """

    def __init__(self, *, s: float = 1.0, theta: float | None = 1 / 3, eta0: float = 0.5,
                 t: float = 0.0, max_degree: int | None = None, input_map: str = "normalize",
                 scale: float = 1.0, form: str = "auto", block_size: int = 256, n_epochs: int = 1,
                 record_at: Any = None, client: Any = None, verbose: bool = False,
                 checkpoint: str | None = None, checkpoint_every: int = 0,
                 resume: bool = False) -> None:
        self._store_params(locals())

    def _check_params(self) -> None:
        super()._check_params()
        if self.theta is None and self.max_degree is None:
            raise ValueError("theta=None (plain kernel SGD) needs max_degree, the fixed "
                             "truncation level")
        # a setting is used or refused: normalize divides by |x| and has no scale
        if self.input_map == "normalize" and float(self.scale) != 1.0:
            raise ValueError(f"scale={self.scale} scales the stereographic map; "
                             "input_map='normalize' has none: drop scale or set "
                             "input_map='stereographic'")

    @one_fit_at_a_time
    def fit(self, X: Any, y: Any = None) -> SphereRegressor:
        """Fit on X (array or store path) and y (or the store's ``y``), rows in order."""
        fit = FitContext(self, X, y, target="regression", dtype=[np.float64, np.float32])
        data = fit.data
        d = sphere_dim(data.n_inputs, self.input_map)
        if d < 2:
            raise ValueError("X has 1 feature(s): normalising it onto S^0 loses everything; "
                             "use input_map='stereographic' to map the line onto the circle")
        n_outputs = 1 if data.y.ndim == 1 else int(data.y.shape[1])
        N = data.n_rows * int(self.n_epochs)
        late = [int(r) for r in (self.record_at or ()) if not 0 < int(r) <= N]
        if late:
            raise ValueError(f"record_at holds {late[0]}, outside the fit's steps 1..{N} "
                             f"({data.n_rows} rows x {self.n_epochs} epoch(s)); drop it or "
                             "fit more epochs")
        payload = make_payload(d=d, s=self.s, theta=self.theta, eta0=self.eta0, t=self.t,
                               max_degree=self.max_degree, n_total=N, n_outputs=n_outputs,
                               form=self.form, input_map=self.input_map, scale=self.scale,
                               block_size=self.block_size, record_at=tuple(self.record_at or ()),
                               n_rows=data.n_rows)
        check_step(float(self.eta0), d, float(self.s), payload["max_level"])
        with fit:
            warn_if_ordered(data, fit.client, "y", "SphereRegressor reads the rows in order, "
                            "once a pass, and its online steps assume them in random order")
            t0 = time.time()  # the folds stamp each pass's end with the same (wall) clock
            state = fit.engine.scan(
                data, sphere_prepare, sphere_fold, init_state(payload), payload,
                n_epochs=int(self.n_epochs), fingerprint=fingerprint(payload), label="sphere",
                pass_start=True, max_rows=scan_rows(payload))
            y = data.host[1] if data.host is not None else data.y
            moments = (y.mean(axis=0), y.var(axis=0))
            if data.host is None:
                moments = result(fit.client, fit.client.compute(da.stack(moments)),
                                 "y's mean")
        self._set_fitted(payload, state, data.n_inputs, N)
        self.history_ = _pass_history(state, data.n_rows, t0)
        _warn_if_no_better_than_the_mean(self.history_[-1]["loss"], *moments)
        return self

    def _engine_options(self) -> EngineOptions:
        # float64 chunks: the recurrences and triangular solves are checked to
        # 1e-10 against the per-point loop, which float32 inputs cannot give.
        return dataclasses.replace(super()._engine_options(), dtype="float64")

    def _set_fitted(self, payload: dict, state: dict, n_inputs: int, N: int) -> None:
        self.form_ = payload["form"]
        # what predictions read: set_params after the fit must not change them
        self.input_map_, self.scale_, self.s_ = self.input_map, float(self.scale), float(self.s)
        self.d_ = payload["d"]
        self.max_level_ = payload["max_level"]
        self.n_features_in_ = n_inputs
        self.n_outputs_ = payload["n_outputs"]
        self.n_steps_ = N
        self.recorded_n_ = np.asarray(payload["record_at"], dtype=np.int64)
        if self.form_ == "features":
            self.features_ = payload["features"]
            self.coef_ = state["coef_sum"] / (N + 1)
            self.recorded_coef_ = state["recorded"]
        else:
            self.support_ = state["support"]
            self.alpha_ = state["alpha"]
            self.level_ = state["level"]
            self.dual_coef_ = averaged_kernel_coefficients(self.alpha_, N)

    # prediction ------------------------------------------------------------------
    def _predict_with(self, X: Any, coef: np.ndarray | None, N: int | None) -> Any:
        self._check_fitted("form_")
        X = validate_predict_input(self, X)
        c = self.n_outputs_
        # model files keep the settings as parameters; a fit records them
        input_map = getattr(self, "input_map_", self.input_map)
        scale = getattr(self, "scale_", float(self.scale))
        if self.form_ == "features":
            feats = self.features_

            def fn(Xb: Any) -> Any:
                return feats.transform(to_sphere(Xb, input_map, scale)) @ coef
        else:
            alpha = self.dual_coef_ if N is None else averaged_kernel_coefficients(self.alpha_, N)
            n = alpha.shape[0]
            sup, lev, d = self.support_[:n], self.level_[:n], self.d_
            s = getattr(self, "s_", float(self.s))

            def fn(Xb: Any) -> Any:
                return _kernel_eval(to_sphere(Xb, input_map, scale), sup, alpha, lev, d, s)
        f = apply_rows(fn, X, c, np.dtype(np.float64))
        return f[:, 0] if c == 1 else f

    def predict(self, X: Any) -> Any:
        """The averaged estimator bar f_N at the rows of X; lazy for dask input."""
        return self._predict_with(X, getattr(self, "coef_", None), None)

    def staged_predict(self, X: Any) -> Iterator[Any]:
        """Predictions of bar f_n for each n in ``recorded_n_`` (learning curves)."""
        self._check_fitted("form_")
        for i, n in enumerate(self.recorded_n_):
            if self.form_ == "features":
                yield self._predict_with(X, self.recorded_coef_[i], None)
            else:
                yield self._predict_with(X, None, int(n))

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """R^2 of the prediction (y may be omitted for a store holding ``y``;
        ``sample_weight``, in memory only, weighs the rows as scikit-learn's)."""
        return regression_score(self, X, y, sample_weight)

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # 2-D y: one output per column
        return tags

    # model files -----------------------------------------------------------------
    def _get_model_state(self) -> tuple[dict, dict]:
        self._check_fitted("form_")
        meta = {"form": self.form_, "d": self.d_, "max_level": self.max_level_,
                "n_features_in": self.n_features_in_, "n_outputs": self.n_outputs_,
                "n_steps": self.n_steps_, **history_meta(self)}
        arrays: dict[str, np.ndarray] = {"recorded_n": self.recorded_n_}
        if self.form_ == "features":
            arrays.update(coef=self.coef_, recorded_coef=self.recorded_coef_)
            meta["features"] = self.features_.to_dict()
        else:
            arrays.update(support=self.support_, alpha=self.alpha_, level=self.level_)
        return arrays, meta

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        self.form_, self.d_, self.max_level_ = meta["form"], meta["d"], meta["max_level"]
        self.n_features_in_, self.n_outputs_ = meta["n_features_in"], meta["n_outputs"]
        self.n_steps_ = meta["n_steps"]
        self.recorded_n_ = arrays["recorded_n"]
        set_history(self, meta)
        if self.form_ == "features":
            self.features_ = ZonalFeatures(**meta["features"])
            self.coef_, self.recorded_coef_ = arrays["coef"], arrays["recorded_coef"]
        else:
            self.support_, self.alpha_ = arrays["support"], arrays["alpha"]
            self.level_ = arrays["level"]
            self.dual_coef_ = averaged_kernel_coefficients(self.alpha_, self.n_steps_)


def _warn_if_no_better_than_the_mean(loss: float | None, mean: Any, var: Any) -> None:
    """FitQualityWarning when the last pass's test-then-train squared error is
    no better than predicting y's mean.  The iterate starts at f = 0 and takes
    a constant part of y as slowly as any other: y + 1000 on 1000 rows of
    S^2 ended at held-out R^2 -5.4 where y scored 0.97, silently, before
    this check.  (The moments cost one more pass, over y alone.)"""
    mean = np.atleast_1d(np.asarray(mean, dtype=np.float64))
    var = float(np.mean(np.atleast_1d(np.asarray(var, dtype=np.float64))))
    # (an error that overflowed is None in the history: no better either)
    if loss is None or not loss < var:
        hint = ("y's mean is large against its spread, and the iterate learns a constant as "
                "slowly as the rest: fit y - mean(y) and add the mean back to the predictions"
                if float(np.mean(mean**2)) > var else
                "raise eta0 or n_epochs, or check input_map and scale")
        error = float("inf") if loss is None else loss
        warnings.warn(f"SphereRegressor: the last pass's test-then-train squared error "
                      f"{error:.4g} is no better than predicting the mean of y (variance "
                      f"{var:.4g}); {hint}", FitQualityWarning, stacklevel=user_stacklevel())


def _pass_history(state: dict, n_rows: int, t0: float) -> list[dict]:
    """history_ from the scan's per-pass sums (:func:`dkernel.solvers.sphere.init_state`)."""
    out, prev = [], t0
    for e, (loss, end) in enumerate(zip(state["loss_sum"], state["pass_end"])):
        # a resumed fit has no end time for passes folded before the restart
        seconds = float(end - prev) if np.isfinite(end) and np.isfinite(prev) else None
        out.append(clean_entry({"epoch": e + 1, "rows": int(n_rows), "seconds": seconds,
                                "loss": float(loss) / n_rows}))
        prev = end
    return out
