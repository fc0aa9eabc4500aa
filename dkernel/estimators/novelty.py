"""DSGOneClassSVM: novelty detection by doubly stochastic gradients (Dai et al. 2014, section 4)."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from sklearn.base import OutlierMixin

from dkernel.estimators.fitting import FitContext, feature_error_doc, one_fit_at_a_time
from dkernel.estimators.pool import PoolEstimator
from dkernel.estimators.spec import documented
from dkernel.solvers.novelty import OneClassProgram
from dkernel.solvers.pool import pool_decision

_log = logging.getLogger(__name__)


def calibrated_offset(f: np.ndarray, offset: float, nu: float) -> tuple[float, bool]:
    """(offset, replaced): the SGD ``offset`` unless the share of the sampled
    training scores ``f`` below it is further from nu than 4 binomial standard
    errors (and a quarter of nu's distance to 0 or 1, at most half of it); then
    the nu-quantile of ``f``, the offset that the nu-property (Schoelkopf et
    al. 2001, Prop. 4) gives this f.  The cap: at nu = 0.9 a quarter of nu
    let every training row be an outlier pass, and on 20 rows at nu = 0.1 four
    standard errors let none be."""
    f = np.asarray(f, dtype=np.float64)
    below = float(np.mean(f < offset))
    room = min(nu, 1.0 - nu)
    tolerance = min(max(4.0 * math.sqrt(nu * (1.0 - nu) / f.size), 0.25 * room), 0.5 * room)
    if abs(below - nu) < tolerance:
        return float(offset), False
    return float(np.quantile(f, nu)), True


@documented
class DSGOneClassSVM(OutlierMixin, PoolEstimator):
    __doc__ = f"""Unsupervised outlier (novelty) detection: the one-class SVM by doubly
    stochastic functional gradients (Dai et al. 2014, section 4).

    Solves min over f and the offset tau of
    E[max(0, tau - f(x))] + nu/2 |f|^2 - nu tau, the one-class SVM of Schoelkopf
    et al. scaled by nu -- the problem scikit-learn's ``OneClassSVM(nu=...)``
    solves, on D random features of the kernel.  About a fraction nu of the
    training rows end below the offset.  Interface as scikit-learn's:
    ``score_samples`` is f, ``decision_function`` is f - ``offset_``,
    ``predict`` is +1 (inlier) or -1 (outlier).  f is on Schoelkopf's scale
    (|f| <= max k(x, x)); scikit-learn's ``OneClassSVM`` reports it multiplied
    by nu * n_samples.

    Attributes
    ----------
    coef_ : ndarray (n_features_,)
        Weights w of f = z^T w (the averaged iterate).
    offset_ : float
        tau: ``decision_function = score_samples - offset_``; the averaged
        SGD offset, or the sample's nu-quantile of f where
        ``offset_calibrated_``.
    offset_calibrated_ : bool
        True when the SGD offset disagreed with the nu-property on the fit's
        sample of training rows (the share of them below it further from nu
        than sampling explains) and ``offset_`` is that sample's nu-quantile
        of f instead.  Few steps leave the offset behind: it rises by
        gamma * nu a step, so at nu = 0.05 the 20 steps of a 2000-row fit at
        the defaults left 0 of the rows below it where 5% belong.
    sgd_offset_ : float
        The averaged SGD offset, whether or not ``offset_`` is calibrated.
    step_size_, step_decay_ : float
    lanes_, batch_size_, local_steps_ : int
        The resolved widths (the model depends on them; saved with it).
    bandwidth_ : float
{feature_error_doc()}    history_ : list of dict
        Per-epoch mean hinge loss, steps, rows and seconds.

    Examples
    --------
    >>> import numpy as np
    >>> from distributed import Client
    >>> from dkernel import DSGOneClassSVM
    >>> X = np.random.default_rng(0).standard_normal((1000, 2))
    >>> with Client(n_workers=1, processes=False, dashboard_address=None) as client:
    ...     model = DSGOneClassSVM(nu=0.1, bandwidth=1.0, n_features=256, batch_size=64,
    ...                            n_epochs=10, client=client).fit(X)
    >>> model.predict(np.array([[0.0, 0.0], [6.0, 6.0]])).tolist()
    [1, -1]
    """

    def __init__(self, *, nu: float = 0.5, kernel: str = "gaussian",
                 bandwidth: float | str = "auto", n_features: int = 2048, block_size: int = 256,
                 batch_size: int | str = "auto", n_epochs: int = 5, step_size: float | str = "auto",
                 step_decay: float | str = "auto", lanes: int | str = "auto",
                 local_steps: int | str = "auto", random_state: int = 0, client: Any = None,
                 verbose: bool = False, checkpoint: str | None = None, checkpoint_every: int = 0,
                 resume: bool = False,
                 feature_cache: str = "auto") -> None:
        self._store_params(locals())

    @one_fit_at_a_time
    def fit(self, X: Any, y: Any = None) -> DSGOneClassSVM:
        """Fit on X (array or store path); y is ignored."""
        with FitContext(self, X, target="none") as fit:
            nu = float(self.nu)
            # f and tau live on the scale of k(x, x) = 1: a first step of 1 moves them by O(1)
            step, decay = self._steps(nu, 1.0)
            rows: list = []

            def program(features: Any, n_blocks: int, sample: np.ndarray) -> OneClassProgram:
                rows.append(sample)
                return OneClassProgram(features, n_blocks, nu, step, decay)

            state = self._fit_pool(fit, program)
        f = pool_decision(self.features_, self.n_blocks_, self.coef_, rows[0])
        self.sgd_offset_ = float(state["offset_avg"])
        self.offset_, self.offset_calibrated_ = calibrated_offset(f, self.sgd_offset_, nu)
        if self.offset_calibrated_:
            _log.info("DSGOneClassSVM: %.3f of the %d sampled training rows were below the "
                      "SGD offset %.4g, not about nu = %g; offset set to their nu-quantile "
                      "of f, %.4g (offset_calibrated_)", float(np.mean(f < self.sgd_offset_)),
                      f.size, self.sgd_offset_, nu, self.offset_)
        return self

    def score_samples(self, X: Any) -> Any:
        """Raw scores f(X) (higher: more normal); lazy for dask input."""
        return self._score(X)

    def decision_function(self, X: Any) -> Any:
        """f(X) - offset_: negative for outliers."""
        return self._score(X) - np.float32(self.offset_)

    def predict(self, X: Any) -> Any:
        """+1 for inliers, -1 for outliers."""
        d = self.decision_function(X)
        return (d >= 0).astype(np.int64) * 2 - 1

    def _extra_meta(self) -> dict[str, Any]:
        return {"offset_": self.offset_, "offset_calibrated_": self.offset_calibrated_,
                "sgd_offset_": self.sgd_offset_}

    def _set_extra_meta(self, meta: dict) -> None:
        self.offset_ = float(meta["offset_"])
        # files written before the calibration hold the SGD offset only
        self.offset_calibrated_ = bool(meta.get("offset_calibrated_", False))
        self.sgd_offset_ = float(meta.get("sgd_offset_", self.offset_))
