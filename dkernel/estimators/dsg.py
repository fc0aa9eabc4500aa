"""DSGRegressor / DSGClassifier: doubly stochastic gradient kernel machines."""

from __future__ import annotations

import inspect
import math
import numbers
import sys
import time
from typing import Any

import dask.array as da
import numpy as np
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.utils.metaestimators import available_if

from dkernel.data.dataset import Dataset
from dkernel.engine import Engine
from dkernel.estimators.base import BaseEstimator, apply_rows, warn_many_classes
from dkernel.estimators.fitting import FitContext, feature_error_doc, one_fit_at_a_time
from dkernel.estimators.history import (
    history_meta,
    set_history,
    validation_score,
)
from dkernel.estimators.model_file import checked_coef
from dkernel.estimators.order import warn_if_ordered
from dkernel.estimators.sampling import bandwidth_rows, sample_rows
from dkernel.estimators.spec import documented
from dkernel.estimators.supervised import ClassifierOutputs, RegressorOutputs
from dkernel.features import FeatureMap, step_eigenvalue
from dkernel.losses import (
    BOUNDED_GRADIENT,
    CLASSIFICATION_LOSSES,
    LOSS_PARAMS,
    REGRESSION_LOSSES,
    LossSpec,
    loss_spec,
)
from dkernel.solvers import gp
from dkernel.solvers.dsg import DSGProgram, decision, ridge_step
from dkernel.solvers.eigenpro import step_size
from dkernel.solvers.eigenpro_rf import default_batch, feature_preconditioner
from dkernel.solvers.local_steps import local_steps
from dkernel.solvers.targets import TargetEncoding

#: c_loss in the automatic step gamma_0 = c_loss / lambda_1 (lambda_1: top eigenvalue of
#: the kernel operator on a sample, or of the features' Gram: features.step_eigenvalue).
#: 1/curvature for smooth losses (squared 1,
#: logistic 4); larger for softmax and hinge, whose effective curvature on the
#: batch mean is far below the bound (measured: Fashion-MNIST softmax best at
#: gamma_0 = 50 with lambda_1 = 0.137; synthetic hinge best near 20 with lambda_1 = 0.24).
_STEP_SCALE = {"squared": 1.0, "huber": 1.0, "epsilon_insensitive": 1.0, "quantile": 1.0,
               "squared_hinge": 1.0, "logistic": 4.0, "hinge": 5.0, "softmax": 6.0}
#: 1 / max l'' of each smooth loss (softmax: diag(p) - p p^T <= 1/2), and c_loss for
#: the piecewise-linear ones, which have no curvature: the ridge term's shift of the
#: preconditioned operator (_preconditioned_program).
_CURVATURE = {**_STEP_SCALE, "softmax": 2.0}

#: Rows the preconditioner is computed on and the most eigenpairs it keeps:
#: its cost depends on these and D, never on n.
_PRECONDITIONER_ROWS = 4000
_PRECONDITIONER_PAIRS = 513

_DOC_ATTRIBUTES = f"""    lanes_, batch_size_, step_size_, q_ : int or float
        The resolved settings (saved with the model).  ``step_size_`` is a
        list of one per output where the automatic step differs between them
        (DSGRegressor's bounded-gradient losses on columns of different spread).
    step_backoffs_ : list of dict
        Steps the divergence guard undid and halved (empty when none).
{feature_error_doc()}    history_ : list of dict
        Per epoch: ``epoch``, ``loss`` (mean loss of the mini-batches, before
        each step), ``steps``, ``rows``, ``seconds`` and, with early stopping,
        ``validation_score``.
    validation_scores_ : list of float
        The validation scores (early stopping only; empty otherwise).
    best_epoch_ : int or None
        Epoch whose coefficients were kept (early stopping), else None.
"""


def _coef(program: DSGProgram, state: dict) -> np.ndarray:
    """The model's coefficients: the averaged iterate with ``average=True``."""
    return program.averaged(state) if program.average else state["coef"] * state["scale"]


class _DSGBase(BaseEstimator):
    _default_loss = ""

    def __init__(self, *, kernel: str = "gaussian", bandwidth: float | str = "auto",
                 n_features: int = 4096, block_size: int = 256, loss: str | None = None,
                 alpha: float = 1e-6, batch_size: int | str = "auto", n_epochs: int = 5,
                 step_size: float | str = "auto", step_decay: float = 1e-3,
                 preconditioner: str | None = "eigenpro", lanes: int | str = "auto",
                 random_state: int = 0, client: Any = None, verbose: bool = False,
                 checkpoint: str | None = None, checkpoint_every: int = 0, resume: bool = False,
                 early_stopping: bool = False, validation_fraction: float = 0.1,
                 n_iter_no_change: int = 2, average: bool = False,
                 feature_cache: str = "auto", local_steps: int | str = "auto") -> None:
        self._store_params(locals())

    def _check_params(self) -> None:
        super()._check_params()
        largest = (0.0 if isinstance(self.step_size, str)  # ("auto")
                   else max(map(float, np.atleast_1d(self.step_size))))
        if largest * float(self.alpha) >= 2:
            # (Dai's schedule step_size = 1 / alpha, step_decay = 1 is fine: the first
            # step shrinks the zero model by 1 - 1 = 0, later ones by less)
            raise ValueError(
                f"step_size * alpha = {largest * float(self.alpha):.3g} >= 2: "
                f"the ridge term alone makes the first steps diverge (each scales the model "
                f"by 1 - step_size * alpha <= -1); set step_size below 2 / alpha = "
                f"{2 / float(self.alpha):.3g}, or leave it 'auto'")
        if self.local_steps != "auto" and int(self.local_steps) > 1 \
                and self.preconditioner != "eigenpro":
            raise ValueError(
                f"local_steps={self.local_steps} takes preconditioned steps on the workers; "
                f"set preconditioner='eigenpro' or local_steps=1")
        allowed = CLASSIFICATION_LOSSES if self._task == "classification" else REGRESSION_LOSSES
        if self._loss not in allowed:
            raise ValueError(f"loss={self.loss!r} is not a {self._task} loss; choose one of "
                             f"{', '.join(allowed)}")
        self._loss_spec()  # checks epsilon / quantile
        defaults = inspect.signature(type(self).__init__).parameters
        for name in ("epsilon", "quantile"):
            # scikit-learn ignores them silently; a quantile=0.9 fit under the
            # squared loss returned the mean, bit for bit (the CLI refuses too)
            if name in defaults and name not in LOSS_PARAMS.get(self._loss, {}) \
                    and getattr(self, name) != defaults[name].default:
                takers = " or ".join(repr(k) for k, v in LOSS_PARAMS.items() if name in v)
                raise ValueError(f"{name}={getattr(self, name)!r} applies to loss={takers}, and "
                                 f"the loss is {self._loss!r}; set loss to {takers} or drop {name}")

    def _auto_step(self, step: Any) -> float | list[float]:
        """The automatic gamma_0 = ridge_step(``step(c)``) with c = c_loss
        (_STEP_SCALE), times y's spread for a loss of bounded gradient: one
        per output where the outputs' spreads differ (DSGRegressor._encoding)."""
        spreads = getattr(self, "_target_spread", (1.0,))
        steps = [ridge_step(step(_STEP_SCALE[self._loss] * max(1.0, s)), float(self.alpha))
                 for s in spreads]
        return steps[0] if len(set(steps)) == 1 else steps

    def _given_step(self, n_outputs: int) -> float | list[float]:
        """``step_size`` as given: one number, or one per output (a fitted
        ``step_size_`` passed back, which is a list where the outputs differ)."""
        if isinstance(self.step_size, numbers.Real):
            return float(self.step_size)
        steps = [float(v) for v in self.step_size]
        if len(steps) != n_outputs:
            raise ValueError(f"step_size has {len(steps)} values but the fit has {n_outputs} "
                             "output(s); pass one number, or one step per output")
        return steps[0] if len(set(steps)) == 1 else steps

    def _loss_spec(self) -> LossSpec:
        """The loss with its parameters (the regressor's ``epsilon``, ``quantile``)."""
        return loss_spec(self._loss, epsilon=getattr(self, "epsilon", None),
                         quantile=getattr(self, "quantile", None))

    @property
    def _loss(self) -> str:
        return self._default_loss if self.loss is None else self.loss

    @property
    def _fitted_loss(self) -> str:
        """The loss the fit ran, which predictions read (``loss_``; a model
        file's parameter): set_params(loss=...) after a fit changed
        predict_proba, or removed it."""
        return getattr(self, "loss_", None) or self._loss

    @one_fit_at_a_time
    def fit(self, X: Any, y: Any = None) -> _DSGBase:
        """Fit on X (array, DataFrame or store path) and y (or the store's ``y``)."""
        with FitContext(self, X, y, target=self._task) as fit:
            full = fit.data
            # one read serves the bandwidth and the preconditioner (a store's
            # sample touches up to 64 chunks; reading them twice cost ~1 s a fit)
            shared = self.preconditioner == "eigenpro" and not self.early_stopping
            rows, encoding = fit.sample_while(lambda: self._encoding(full, fit.client),
                                              _PRECONDITIONER_ROWS if shared else 1000)
            sample = bandwidth_rows(rows, full, fit.seed) if shared else rows
            bandwidth = fit.bandwidth(sample)
            if fit.labels is not None:  # the workers saw codes 0..c-1; the user sees labels
                self.classes_ = fit.labels
            if self._task == "classification":
                warn_many_classes(self.classes_, full.n_rows)
            ordered = warn_if_ordered(full, fit.client, "y", "each step draws its rows from a "
                                      "few chunks, so steps see parts of the distribution in turn")
            features, n_blocks = fit.feature_map(bandwidth)
            fit.hold_out()
            self.lanes_ = fit.engine.pin_lanes(fit.data)
            if self.preconditioner == "eigenpro":
                program = self._preconditioned_program(fit.engine, fit.data, features, n_blocks,
                                                       encoding, rows if shared else None)
            else:
                self.batch_size_ = self._given_batch(fit.data.n_rows) or min(512, fit.data.n_rows)
                self.q_, self.local_steps_ = 0, 1
                if self.step_size == "auto":
                    # gamma_0 = c_loss / lambda_1: stable (gamma * curvature * lambda_1 < 2) with
                    # c_loss calibrated per loss on Fashion-MNIST and synthetic problems.
                    lam = step_eigenvalue(features, n_blocks, sample)
                    self.step_size_ = self._auto_step(lambda c: c / lam)
                else:
                    self.step_size_ = self._given_step(encoding.n_outputs)
                program = DSGProgram(features, self._loss_spec(), encoding, n_blocks,
                                     float(self.alpha), _program_step(self.step_size_),
                                     float(self.step_decay), average=bool(self.average))
            program.cache_blocks = fit.feature_cache(n_blocks * features.block_size)
            program.ordered_by = "y" if ordered else None  # (the guard's advice leads with it)
            if self.verbose:
                print(f"dsg: {n_blocks * features.block_size} features, "
                      f"batch_size={self.batch_size_}, lanes={self.lanes_}, "
                      f"local_steps={self.local_steps_}, "
                      f"feature_cache={self.feature_cache_}", file=sys.stderr, flush=True)
            # a round of local steps is one engine step over local_steps batches
            state = fit.run_steps(program, self.batch_size_ * self.local_steps_,
                                  evaluate=self._evaluator(fit, program, features, encoding))
            self._set_fitted(features, encoding, _coef(program, state))
            self._after_fit(full, fit.engine)
        return self

    def _after_fit(self, data: Dataset, engine: Engine) -> None:
        """More passes over the fit's own data, on its cluster (none here)."""

    def _preconditioned_program(self, engine: Engine, data: Any, features: FeatureMap,
                                n_blocks: int, encoding: TargetEncoding,
                                sample: np.ndarray | None) -> DSGProgram:
        """Whole-pool steps through EigenPro's preconditioner (solvers/dsg.py)."""
        D = n_blocks * features.block_size
        self.batch_size_ = (self._given_batch(data.n_rows)
                            or default_batch(self.lanes_, D, data.n_rows))
        self.local_steps_ = local_steps(self._given("local_steps"), self.lanes_, data.n_rows,
                                        self.batch_size_)
        # the rows one step's gradient sees: the batch, or a lane's share of it in rounds
        step_rows = (math.ceil(self.batch_size_ / self.lanes_) if self.local_steps_ > 1
                     else self.batch_size_)
        t0 = time.perf_counter()
        if sample is None:
            sample = sample_rows(data, self.random_state_, engine.client, size=_PRECONDITIONER_ROWS)
        pre, beta, _ = feature_preconditioner(
            engine, sample, features, n_blocks, _PRECONDITIONER_PAIRS, step_rows, 1.0,
            self.random_state_, label="dsg preconditioner")
        self.preconditioner_seconds_ = time.perf_counter() - t0
        self.q_ = pre.q
        self.eigenvalues_ = pre.values
        if self.step_size == "auto":
            eta = step_size(step_rows, beta, pre.new_top)
            self.step_size_ = self._auto_step(lambda c: c * eta / 2)
        else:
            self.step_size_ = self._given_step(encoding.n_outputs)
        # The steps descend mean l + alpha/2 |a|^2, whose curvature is at most
        # (H + c alpha) / c, c = 1 / max l'' (_CURVATURE): P flattens that operator,
        # not H alone.  From H alone, a step sized for alpha met the top directions at
        # the loss's full curvature, where a large alpha keeps f (softmax, alpha = 1e-2:
        # the loss rose epoch after epoch).  alpha << lambda_{q+1} changes nothing.
        shift = _CURVATURE[self._loss] * float(self.alpha)
        return DSGProgram(features, self._loss_spec(), encoding, n_blocks, float(self.alpha),
                          _program_step(self.step_size_), float(self.step_decay),
                          preconditioner=pre.shifted(shift), beta=beta + shift,
                          batch_size=step_rows, average=bool(self.average),
                          local_steps=self.local_steps_,
                          step_rows=step_rows if self.local_steps_ > 1 else 0)

    def _evaluator(self, fit: FitContext, program: DSGProgram, features: FeatureMap,
                   encoding: TargetEncoding) -> Any:
        """With early stopping, the score of the held-out rows after an epoch."""
        if fit.val is None:
            return None

        def evaluate(state: dict) -> float:
            spec = {"features": features, "coef": _coef(program, state).astype(features.dtype)}
            return validation_score(fit.engine, fit.val, self._task, _decision_spec, spec,
                                    encoding.classes, encoding.offset)
        return evaluate

    def _set_fitted(self, features: FeatureMap, encoding: TargetEncoding, coef: np.ndarray) -> None:
        self._keep_pool(features, coef.shape[0])
        self.encoding_ = encoding
        self.loss_ = self._loss
        self.coef_ = coef

    def _decision(self, X: Any) -> Any:
        """Raw scores f(X) of validated X, shape (n,) for one output else (n, c);
        lazy for dask input."""
        features, coef = self.features_, self.coef_.astype(self.features_.dtype)
        c = coef.shape[1]
        f = apply_rows(lambda Xb: _decision_block(Xb, features, coef), X, c,
                       np.dtype(features.dtype))
        return f[:, 0] if c == 1 else f

    # model files --------------------------------------------------------------
    def _get_model_state(self) -> tuple[dict, dict]:
        self._check_fitted("coef_")
        return (self._encoding_arrays(),
                {"features": self.features_.to_dict(), "encoding": self.encoding_.kind,
                 **{k: _json(getattr(self, k)) for k in _RESOLVED if hasattr(self, k)},
                 **history_meta(self)})

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        # (the coefficients first: a block size they refute is not regenerated)
        coef = checked_coef(arrays["coef"], meta["features"]["block_size"], 2)
        self._set_fitted(FeatureMap.from_dict(meta["features"]),
                         self._load_encoding(arrays, meta), coef)
        for k in _RESOLVED:
            if k in meta:
                setattr(self, k, meta[k])
        set_history(self, meta)


#: Settings resolved at fit time ("auto" values included) that determine the
#: model: saved with it, so the fit can be reproduced on any cluster.
_RESOLVED = ("step_size_", "lanes_", "batch_size_", "q_", "step_backoffs_", "feature_cache_",
             "local_steps_")


def _json(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _program_step(step: float | list[float]) -> float | tuple[float, ...]:
    """``step_size_`` as DSGProgram takes it: a float, or a tuple of one per output."""
    return tuple(step) if isinstance(step, list) else step


def _extended_signature(base: Any, init: Any) -> inspect.Signature:
    """Signature of ``base`` with the keyword-only parameters of ``init`` added."""
    params = [p for p in inspect.signature(base).parameters.values() if p.kind != p.VAR_KEYWORD]
    extra = [p for p in inspect.signature(init).parameters.values()
             if p.kind == p.KEYWORD_ONLY]
    return inspect.Signature(params + extra)


def _decision_block(Xb: Any, features: FeatureMap, coef: np.ndarray) -> Any:
    return decision(features, coef, Xb.astype(features.dtype, copy=False))


def _decision_spec(Xb: Any, spec: dict) -> Any:
    return _decision_block(Xb, spec["features"], spec["coef"])


@documented
class DSGRegressor(RegressorOutputs, RegressorMixin, _DSGBase):
    __doc__ = f"""Kernel regression by doubly stochastic functional gradients (Dai et al. 2014).

    With ``loss="squared"`` this is kernel ridge regression; "huber",
    "epsilon_insensitive" and "quantile" are also available.  Their gradient
    is bounded, so their automatic step follows y's spread, each output's its
    own: every column of a 2-D y fits as it would alone.

    Attributes
    ----------
    coef_ : ndarray (n_features_, n_outputs)
    bandwidth_ : float
    n_features_in_ : int
    gp_amplitude_ : float or ndarray (n_outputs,)
        With ``posterior_variance=True``: s^2, the maximum-likelihood amplitude of the
        prior f ~ GP(0, s^2 k) in y's units squared, one per output for a 2-D y
        (:meth:`predict`).
{_DOC_ATTRIBUTES}
    Examples
    --------
    >>> import numpy as np
    >>> from dkernel import DSGRegressor
    >>> X = np.random.default_rng(0).uniform(-1, 1, (500, 2))
    >>> y = np.sin(3 * X[:, 0])
    >>> from distributed import Client
    >>> with Client(n_workers=1, processes=False, dashboard_address=None) as client:
    ...     model = DSGRegressor(bandwidth=0.5, n_features=512, n_epochs=3, client=client).fit(X, y)
    >>> model.score(X, y) > 0.9
    True
    """
    _default_loss = "squared"

    def __init__(self, *, epsilon: float = 0.1, quantile: float = 0.5,
                 posterior_variance: bool = False, **params: Any) -> None:
        super().__init__(**params)
        self._store_params(locals())

    # get_params / clone / repr read the signature: the shared parameters of
    # _DSGBase plus the regressor's own (one list of defaults, in _DSGBase)
    __init__.__signature__ = _extended_signature(_DSGBase.__init__, __init__)  # type: ignore[attr-defined]

    def _check_params(self) -> None:
        super()._check_params()
        if self.posterior_variance:
            if self._loss != "squared":
                raise ValueError(
                    f"posterior_variance=True is the Gaussian-process posterior, whose mean is "
                    f"the squared loss's fit; loss={self.loss!r} has no such model")
            gp.check_pool_size(int(self.n_features))

    def _after_fit(self, data: Dataset, engine: Engine) -> None:
        for name in ("gp_factor_", "gp_amplitude_"):
            if hasattr(self, name):
                delattr(self, name)
        if self.posterior_variance:
            # Dai et al. App. D on the fitted pool: C = Z^T Z / n over every row, summed
            # on the workers from the blocks the fit cached (module dkernel.solvers.gp);
            # the fit's engine reads them as their owner.  The same pass sums what the
            # prior's amplitude needs from the target the mean was fitted on
            payload = {"features": self.features_, "n_blocks": self._n_blocks(),
                       "cache": self.feature_cache_, "encoding": self.encoding_}
            if data.n_rows < self.coef_.shape[0]:  # fewer rows than features: Phi itself
                total = engine.map_reduce(data, gp.rows_partial, payload, label="gp-variance",
                                          wants_chunk=True)
                factor, s2 = gp.posterior_from_rows(np.concatenate(total["rows"]),
                                                    np.concatenate(total["y"]), float(self.alpha))
            else:
                total = engine.map_reduce(data, gp.covariance_partial, payload,
                                          label="gp-variance", wants_chunk=True)
                factor, s2 = gp.posterior(total["gram"], int(total["count"]), float(self.alpha),
                                          total["Phity"], total["yty"])
            self.gp_factor_ = factor
            self.gp_amplitude_ = _amplitude_attribute(s2)

    def _n_blocks(self) -> int:
        return self.coef_.shape[0] // self.features_.block_size

    def _encoding(self, data: Dataset, client: Any) -> TargetEncoding:
        """mean(y), the offset f starts from; and, for a loss whose gradient is
        bounded (huber, epsilon-insensitive, quantile), y's standard deviation
        per column (``_target_spread``), which multiplies the column's
        automatic step where above 1: such a loss moves f by at most a step
        a step, whatever the scale of y (on y x 1e3 every quantile level fitted
        the mean in 5 epochs; 0.155, 0.552 and 0.803 of y below the 0.05, 0.5
        and 0.95 fits with it).  Starting the pinball loss at y's quantile
        instead was worse at 0.05.

        Each column takes its own step (DSGProgram's tuple ``step_size``), so it
        fits as it would alone: one step for all took y = [1e3 sin x0, sin x1]'s
        second column to R^2 -400 at the largest spread, and at the smallest
        the second column of [f, 1e3 f] to R^2 0.001 (0.315 alone)."""
        enc, std = self._moments(data, client, spread=self._loss in BOUNDED_GRADIENT)
        self._target_spread = (1.0,) if std is None else tuple(map(float, np.atleast_1d(std)))
        return enc

    def predict(self, X: Any, return_std: bool = False) -> Any:
        """f(X) + mean(y) in float64 (f itself is computed in float32); lazy
        dask array for dask input.

        With ``return_std=True`` (a model fitted with ``posterior_variance=True``)
        also the posterior standard deviation of the latent f at X, in y's
        units: shape (n,), or (n, n_outputs) for a 2-D y fitted with more than
        one column (scikit-learn's ``GaussianProcessRegressor`` shapes).  The
        prior is f ~ GP(0, s^2 k) with noise variance sigma^2 = n_samples *
        alpha * s^2 (Dai et al. section 4, App. D; :mod:`dkernel.solvers.gp`),
        and ``gp_amplitude_`` is s^2, its maximum-likelihood value from y at
        that noise-to-signal ratio (Rasmussen & Williams 2006, eq. 2.30): the
        std is s times that of scikit-learn's
        ``GaussianProcessRegressor(kernel=RBF(bandwidth), alpha=n_samples * alpha)``.
        Model files saved before the amplitude was estimated load with
        ``gp_amplitude_ = 1.0``, the unit prior they were fitted with.
        """
        X = self._validated(X)
        mean = self._mean(X)
        if not return_std:
            return mean
        if not hasattr(self, "gp_factor_"):
            raise AttributeError("return_std=True needs the posterior variance: fit with "
                                 "DSGRegressor(posterior_variance=True, loss='squared')")
        features, n_blocks, factor = self.features_, self._n_blocks(), self.gp_factor_
        var = apply_rows(lambda Xb: gp.posterior_variance(features, n_blocks, factor, Xb), X, None,
                         np.dtype(np.float64))
        std = da.sqrt(var) if isinstance(var, da.Array) else np.sqrt(var)
        s = np.sqrt(getattr(self, "gp_amplitude_", 1.0))
        return mean, (std * s if s.ndim == 0 else std[:, None] * s)

    def _get_model_state(self) -> tuple[dict, dict]:
        arrays, meta = super()._get_model_state()
        if hasattr(self, "gp_factor_"):
            arrays["gp_factor"] = self.gp_factor_
            arrays["gp_amplitude"] = np.atleast_1d(np.asarray(self.gp_amplitude_, np.float64))
        return arrays, meta

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        super()._set_model_state(arrays, meta)
        if "gp_factor" in arrays:  # (files of the float32 order-n path: not orthogonal)
            self.gp_factor_ = gp.orthonormal(arrays["gp_factor"])
            # (files written before the amplitude was estimated: the unit prior they had)
            self.gp_amplitude_ = _amplitude_attribute(arrays.get("gp_amplitude", np.ones(1)))


def _amplitude_attribute(s2: np.ndarray) -> float | np.ndarray:
    """``gp_amplitude_``: a float for one output, else one per output (the std's columns)."""
    s2 = np.atleast_1d(np.asarray(s2, dtype=np.float64))
    return float(s2[0]) if s2.size == 1 else s2


@documented
class DSGClassifier(ClassifierOutputs, ClassifierMixin, _DSGBase):
    __doc__ = f"""Kernel classification by doubly stochastic functional gradients.

    ``loss="softmax"`` (default) is multinomial logistic regression; "hinge"
    (SVM), "squared_hinge" and "logistic" train one-vs-rest scores on shared
    features (one +-1 column for two classes).

    Attributes
    ----------
    classes_ : ndarray
    coef_ : ndarray (n_features_, n_outputs)
    bandwidth_ : float
{_DOC_ATTRIBUTES}    """
    _default_loss = "softmax"

    def _encoding_kind(self, classes: np.ndarray) -> str:
        if self._loss == "softmax":
            return "onehot"
        return "binary" if classes.size == 2 else "ovr"

    @available_if(lambda self: self._fitted_loss in ("softmax", "logistic"))
    def predict_proba(self, X: Any) -> Any:
        """Class probabilities (softmax / logistic losses only: absent for the others)."""
        f = self._decision(self._validated(X))
        softmax = self._fitted_loss == "softmax"
        if isinstance(f, da.Array):  # row by row, block by block (a dask max over 0 rows fails)
            if f.ndim == 2:
                f = f.rechunk({1: -1})
            c = len(self.classes_)
            return f.map_blocks(_probabilities, softmax, dtype=np.float32 if f.dtype == np.float32
                                else np.float64, chunks=(f.chunks[0], (c,)),
                                new_axis=1 if f.ndim == 1 else None)
        return _probabilities(f, softmax)


def _probabilities(f: np.ndarray, softmax: bool) -> np.ndarray:
    """Class probabilities from decision values: the softmax of each row, or the
    logistic of each (binary: one column, its complement first; one-vs-rest:
    renormalised)."""
    if softmax:
        z = np.exp(f - f.max(axis=1, keepdims=True)) if len(f) else np.exp(f)
        return z / z.sum(axis=1, keepdims=True)
    p = 1 / (1 + np.exp(-f))
    if f.ndim == 1:
        return np.stack([1 - p, p], axis=1)
    return p / p.sum(axis=1, keepdims=True)
