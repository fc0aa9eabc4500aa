"""DSGRegressor / DSGClassifier: doubly stochastic gradient kernel machines."""

from __future__ import annotations

import inspect
import math
from typing import Any

import dask.array as da
import numpy as np

from dkernel.data.dataset import open_dataset
from dkernel.data.validate import check_positive
from dkernel.engine import Engine, connect
from dkernel.estimators.base import (
    BaseEstimator,
    apply_rows,
    check_common_params,
    check_predict_input,
    discover_classes,
    resolve_bandwidth,
    sample_rows,
)
from dkernel.features import FeatureMap
from dkernel.kernels import top_eigenvalue
from dkernel.losses import CLASSIFICATION_LOSSES, REGRESSION_LOSSES, LossSpec, loss_spec
from dkernel.solvers import gp
from dkernel.solvers.dsg import DSGProgram, decision
from dkernel.solvers.targets import TargetEncoding

#: c_loss in the automatic step gamma_0 = c_loss / lambda_1 (lambda_1: top eigenvalue of
#: the kernel operator on a sample).  1/curvature for smooth losses (squared 1,
#: logistic 4); larger for softmax and hinge, whose effective curvature on the
#: batch mean is far below the bound (measured: Fashion-MNIST softmax best at
#: gamma_0 = 50 with lambda_1 = 0.137; synthetic hinge best near 20 with lambda_1 = 0.24).
_STEP_SCALE = {"squared": 1.0, "huber": 1.0, "epsilon_insensitive": 1.0, "quantile": 1.0,
               "squared_hinge": 1.0, "logistic": 4.0, "hinge": 5.0, "softmax": 6.0}

_DOC_PARAMS = """
    kernel : {"gaussian", "laplacian", "cauchy"}, default="gaussian"
    bandwidth : float or "auto", default="auto"
        Kernel scale; "auto" is the median heuristic on a sample of rows.
    n_features : int, default=4096
        Size D of the feature pool: after D / block_size steps, existing seeds
        are revisited (block-coordinate SGD on a fixed pool).
    block_size : int, default=256
        Features B drawn per step (one seed).
    alpha : float, default=1e-6
        Regularisation strength nu: every step shrinks old blocks by (1 - gamma nu).
    batch_size : int, default=512
        Rows per step, spread over ``lanes`` chunks.
    n_epochs : int, default=5
    step_size : float or "auto", default="auto"
        gamma_0; "auto" is c_loss / lambda_1 with lambda_1 the top eigenvalue of
        the kernel operator on a 1000-row sample (stored as ``step_size_``).
    step_decay : float, default=1e-3
        gamma_t = step_size / (1 + step_decay * t).
    lanes : int, default=4
        Chunks sharing one step (parallel width; the model depends on it, not
        on the number of workers).
    random_state : int, default=0
        Global seed of features and shuffling.
    client : distributed.Client, optional
        Cluster to run on; None means the current client or a new LocalCluster.
    verbose : bool, default=False
        Progress line on stderr.
    checkpoint : str, optional
        Checkpoint file written every ``checkpoint_every`` steps; with
        ``resume=True`` a fit continues from it and ends with the same model.
"""


class _DSGBase(BaseEstimator):
    _task = ""
    _default_loss = ""

    def __init__(self, *, kernel: str = "gaussian", bandwidth: float | str = "auto",
                 n_features: int = 4096, block_size: int = 256, loss: str | None = None,
                 alpha: float = 1e-6, batch_size: int = 512, n_epochs: int = 5,
                 step_size: float | str = "auto", step_decay: float = 1e-3, lanes: int = 4,
                 random_state: int = 0, client: Any = None, verbose: bool = False,
                 checkpoint: str | None = None, checkpoint_every: int = 0,
                 resume: bool = False) -> None:
        self.kernel = kernel
        self.bandwidth = bandwidth
        self.n_features = n_features
        self.block_size = block_size
        self.loss = loss
        self.alpha = alpha
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.step_size = step_size
        self.step_decay = step_decay
        self.lanes = lanes
        self.random_state = random_state
        self.client = client
        self.verbose = verbose
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.resume = resume

    def _check_params(self) -> None:
        check_common_params(self)
        check_positive("block_size", self.block_size, integer=True)
        if self.step_size != "auto":
            check_positive("step_size", self.step_size)
        check_positive("step_decay", self.step_decay, allow_zero=True)
        check_positive("lanes", self.lanes, integer=True)
        allowed = CLASSIFICATION_LOSSES if self._task == "classification" else REGRESSION_LOSSES
        if self._loss not in allowed:
            raise ValueError(f"loss={self.loss!r} is not a {self._task} loss; choose one of {', '.join(allowed)}")
        self._loss_spec()  # checks epsilon / quantile

    def _loss_spec(self) -> LossSpec:
        """The loss with its parameters (the regressor's ``epsilon``, ``quantile``)."""
        return loss_spec(self._loss, epsilon=getattr(self, "epsilon", None),
                         quantile=getattr(self, "quantile", None))

    @property
    def _loss(self) -> str:
        return self._default_loss if self.loss is None else self.loss

    def _encoding(self, data: Any, client: Any) -> TargetEncoding:
        raise NotImplementedError

    def fit(self, X: Any, y: Any = None) -> _DSGBase:
        """Fit on X (array or store path) and y (or the store's ``y``)."""
        self._check_params()
        data = open_dataset(X, y, require_y=True)
        with connect(self.client) as client:
            sample = sample_rows(data, self.random_state, client)
            bandwidth = resolve_bandwidth(self.bandwidth, self.kernel, sample)
            encoding = self._encoding(data, client)
            if self.step_size == "auto":
                # gamma_0 = c_loss / lambda_1: stable (gamma * curvature * lambda_1 < 2) with
                # c_loss calibrated per loss on Fashion-MNIST and synthetic problems.
                self.step_size_ = _STEP_SCALE[self._loss] / top_eigenvalue(sample, self.kernel, bandwidth)
            else:
                self.step_size_ = float(self.step_size)
            B = min(int(self.block_size), int(self.n_features))
            n_blocks = math.ceil(int(self.n_features) / B)
            features = FeatureMap(self.kernel, bandwidth, data.n_inputs, B, int(self.random_state))
            program = DSGProgram(features, self._loss_spec(), encoding, n_blocks, float(self.alpha),
                                 self.step_size_, float(self.step_decay))
            state = Engine(client, self._engine_options()).run_steps(
                data, program, n_epochs=int(self.n_epochs), batch_size=int(self.batch_size),
                random_state=int(self.random_state))
        self._set_fitted(features, encoding, state["coef"] * state["scale"])
        return self

    def _set_fitted(self, features: FeatureMap, encoding: TargetEncoding, coef: np.ndarray) -> None:
        self.features_ = features
        self.encoding_ = encoding
        self.coef_ = coef
        self.bandwidth_ = features.bandwidth
        self.n_features_in_ = features.n_inputs
        self.n_features_ = coef.shape[0]

    def decision_function(self, X: Any) -> Any:
        """Raw scores f(X), shape (n,) for one output else (n, c); lazy for dask input."""
        self._check_fitted("coef_")
        X = check_predict_input(X, self.n_features_in_)
        features, coef = self.features_, self.coef_.astype(self.features_.dtype)
        c = coef.shape[1]
        f = apply_rows(lambda Xb: _decision_block(Xb, features, coef), X, c, np.dtype(features.dtype))
        return f[:, 0] if c == 1 else f

    # model files --------------------------------------------------------------
    def _get_model_state(self) -> tuple[dict, dict]:
        self._check_fitted("coef_")
        e = self.encoding_
        return ({"coef": self.coef_, "classes": np.asarray(e.classes),
                 "offset": np.asarray(e.offset, dtype=np.float64)},
                {"features": self.features_.to_dict(), "encoding": e.kind,
                 "step_size_": self.step_size_})

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        enc = TargetEncoding(meta["encoding"], tuple(arrays["classes"].tolist()),
                             tuple(arrays["offset"].tolist()))
        self._set_fitted(FeatureMap(**meta["features"]), enc, arrays["coef"])
        self.step_size_ = meta["step_size_"]
        if enc.kind != "regression":
            self.classes_ = arrays["classes"]


def _extended_signature(base: Any, init: Any) -> inspect.Signature:
    """Signature of ``base`` with the keyword-only parameters of ``init`` added."""
    params = [p for p in inspect.signature(base).parameters.values() if p.kind != p.VAR_KEYWORD]
    extra = [p for p in inspect.signature(init).parameters.values()
             if p.kind == p.KEYWORD_ONLY]
    return inspect.Signature(params + extra)


def _decision_block(Xb: Any, features: FeatureMap, coef: np.ndarray) -> Any:
    return decision(features, coef, Xb.astype(features.dtype, copy=False))


class DSGRegressor(_DSGBase):
    __doc__ = f"""Kernel regression by doubly stochastic functional gradients (Dai et al. 2014).

    With ``loss="squared"`` this is kernel ridge regression; "huber",
    "epsilon_insensitive" and "quantile" are also available.

    Parameters
    ----------
    loss : str, default=None (meaning "squared")
    epsilon : float, default=0.1
        Threshold of the "huber" loss (quadratic within epsilon of the target,
        linear beyond) and half-width of the "epsilon_insensitive" tube, as in
        scikit-learn's ``SGDRegressor``.  Ignored by the other losses.
    quantile : float, default=0.5
        Level tau in (0, 1) of the "quantile" (pinball) loss, as in
        scikit-learn's ``QuantileRegressor``: the fit estimates the tau-quantile
        of y given x.  Ignored by the other losses.
    posterior_variance : bool, default=False
        Also fit the Gaussian-process posterior variance (Dai et al. App. D),
        for ``predict(X, return_std=True)``: one more pass and a
        n_features x n_features eigendecomposition (n_features <= 8192).
        Squared loss only (the GP mean).
{_DOC_PARAMS}
    Attributes
    ----------
    coef_ : ndarray (n_features_, n_outputs)
    bandwidth_ : float
    n_features_in_ : int

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
    _task = "regression"
    _default_loss = "squared"

    def __init__(self, *, epsilon: float = 0.1, quantile: float = 0.5,
                 posterior_variance: bool = False, **params: Any) -> None:
        super().__init__(**params)
        self.epsilon = epsilon
        self.quantile = quantile
        self.posterior_variance = posterior_variance

    # get_params / clone / repr read the signature: the shared parameters of
    # _DSGBase plus the regressor's own (one list of defaults, in _DSGBase)
    __init__.__signature__ = _extended_signature(_DSGBase.__init__, __init__)  # type: ignore[attr-defined]

    def _encoding(self, data: Any, client: Any) -> TargetEncoding:
        y = data.y
        mean = (data.host[1].mean(axis=0) if data.host is not None
                else client.compute(y.astype(np.float64).mean(axis=0)).result())
        return TargetEncoding("regression", offset=tuple(np.atleast_1d(mean).astype(float).tolist()))

    def fit(self, X: Any, y: Any = None) -> DSGRegressor:
        """Fit on X (array or store path) and y (or the store's ``y``); with
        ``posterior_variance=True`` one more pass for the GP posterior variance."""
        if self.posterior_variance:  # before the long part
            if self._loss != "squared":
                raise ValueError(
                    f"posterior_variance=True is the Gaussian-process posterior, whose mean is "
                    f"the squared loss's fit; loss={self.loss!r} has no such model")
            gp.check_pool_size(int(self.n_features))
        super().fit(X, y)
        if hasattr(self, "gp_factor_"):
            del self.gp_factor_
        if self.posterior_variance:
            # Dai et al. App. D on the fitted pool: C = Z^T Z / n, summed on the workers
            # from the blocks the fit cached (module dkernel.solvers.gp)
            data = open_dataset(X, y, require_y=True)
            payload = {"features": self.features_, "n_blocks": self._n_blocks()}
            with connect(self.client) as client:
                total = Engine(client, self._engine_options()).map_reduce(
                    data, gp.covariance_partial, payload, label="gp-variance", wants_chunk=True)
            self.gp_factor_ = gp.posterior_factor(total["gram"], int(total["count"]),
                                                  float(self.alpha))
        return self

    def _n_blocks(self) -> int:
        return self.coef_.shape[0] // self.features_.block_size

    def predict(self, X: Any, return_std: bool = False) -> Any:
        """f(X) + mean(y); lazy dask array for dask input.

        With ``return_std=True`` (a model fitted with ``posterior_variance=True``)
        also the posterior standard deviation of the latent f ~ GP(0, k) at X,
        shape (n,), with noise variance sigma^2 = n_samples * alpha (Dai et al.
        section 4, App. D; :mod:`dkernel.solvers.gp`).  It is in units of the
        kernel's prior variance k(x, x) = 1 (scikit-learn's
        ``GaussianProcessRegressor(kernel=RBF(bandwidth), alpha=sigma^2)``
        returns the same), not of y.
        """
        f = self.decision_function(X)
        off = np.asarray(self.encoding_.offset, dtype=np.float32)
        mean = f + (off[0] if f.ndim == 1 else off)
        if not return_std:
            return mean
        if not hasattr(self, "gp_factor_"):
            raise AttributeError("return_std=True needs the posterior variance: fit with "
                                 "DSGRegressor(posterior_variance=True, loss='squared')")
        X = check_predict_input(X, self.n_features_in_)
        features, n_blocks, factor = self.features_, self._n_blocks(), self.gp_factor_
        var = apply_rows(lambda Xb: gp.posterior_variance(features, n_blocks, factor, Xb), X, None,
                         np.dtype(np.float64))
        return mean, (da.sqrt(var) if isinstance(var, da.Array) else np.sqrt(var))

    def _get_model_state(self) -> tuple[dict, dict]:
        arrays, meta = super()._get_model_state()
        if hasattr(self, "gp_factor_"):
            arrays["gp_factor"] = self.gp_factor_
        return arrays, meta

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        super()._set_model_state(arrays, meta)
        if "gp_factor" in arrays:
            self.gp_factor_ = arrays["gp_factor"]

    def score(self, X: Any, y: Any) -> float:
        """R^2 of the prediction."""
        p = self.predict(X)
        y = y.astype(np.float64) if hasattr(y, "astype") else np.asarray(y, dtype=np.float64)
        ss_res = ((y - p) ** 2).sum()
        ss_tot = ((y - y.mean(axis=0)) ** 2).sum()
        if isinstance(ss_res, da.Array):
            ss_res, ss_tot = da.compute(ss_res, ss_tot)
        return float(1 - ss_res / ss_tot)


class DSGClassifier(_DSGBase):
    __doc__ = f"""Kernel classification by doubly stochastic functional gradients.

    ``loss="softmax"`` (default) is multinomial logistic regression; "hinge"
    (SVM), "squared_hinge" and "logistic" train one-vs-rest scores on shared
    features (one +-1 column for two classes).

    Parameters
    ----------
    loss : str, default=None (meaning "softmax")
{_DOC_PARAMS}
    Attributes
    ----------
    classes_ : ndarray
    coef_ : ndarray (n_features_, n_outputs)
    bandwidth_ : float
    """
    _task = "classification"
    _default_loss = "softmax"

    def _encoding(self, data: Any, client: Any) -> TargetEncoding:
        classes = discover_classes(data, client)
        self.classes_ = classes
        if self._loss == "softmax":
            kind = "onehot"
        else:
            kind = "binary" if classes.size == 2 else "ovr"
        return TargetEncoding(kind, classes=tuple(classes.tolist()))

    def predict(self, X: Any) -> Any:
        """Predicted labels; lazy dask array for dask input."""
        f = self.decision_function(X)
        classes = np.asarray(self.classes_)
        if f.ndim == 1:
            idx = (f > 0).astype(np.int64)
        else:
            idx = f.argmax(axis=1)
        if isinstance(idx, da.Array):
            return idx.map_blocks(lambda i: classes[i], dtype=classes.dtype)
        return classes[idx]

    def predict_proba(self, X: Any) -> Any:
        """Class probabilities (softmax / logistic losses only)."""
        if self._loss not in ("softmax", "logistic"):
            raise AttributeError(f"predict_proba needs loss='softmax' or 'logistic', not {self._loss!r}")
        f = self.decision_function(X)
        xp = da if isinstance(f, da.Array) else np
        if self._loss == "softmax":
            z = xp.exp(f - f.max(axis=1, keepdims=True))
            return z / z.sum(axis=1, keepdims=True)
        p = 1 / (1 + xp.exp(-f))
        if f.ndim == 1:
            return xp.stack([1 - p, p], axis=1)
        return p / p.sum(axis=1, keepdims=True)

    def score(self, X: Any, y: Any) -> float:
        """Mean accuracy."""
        p = self.predict(X)
        y = y.reshape(-1)
        acc = (p == y).mean()
        return float(acc.compute() if isinstance(acc, da.Array) else acc)
