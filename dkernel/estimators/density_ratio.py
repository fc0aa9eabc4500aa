"""DSGDensityRatio: KL density-ratio estimation by doubly stochastic gradients
(Dai et al. 2014, section 4; Nguyen, Wainwright & Jordan 2010)."""

from __future__ import annotations

import os
from typing import Any

import dask.array as da
import numpy as np

from dkernel.data.dataset import Dataset, open_dataset
from dkernel.data.validate import check_finite_chunk
from dkernel.estimators.base import validate_predict_input
from dkernel.estimators.fitting import FitContext, feature_error_doc, one_fit_at_a_time
from dkernel.estimators.pool import PoolEstimator
from dkernel.estimators.spec import documented
from dkernel.features import FeatureMap, step_eigenvalue
from dkernel.solvers.density_ratio import DensityRatioProgram


@documented
class DSGDensityRatio(PoolEstimator):
    __doc__ = f"""Density ratio r(x) = p(x) / q(x) of two samples, by doubly stochastic
    functional gradients on the KL objective (Dai et al. 2014, section 4):

        min_f  E_q[exp f] - E_p[f] + alpha/2 |f|^2,   f -> log(p / q).

    ``fit(X_numerator, X_denominator)`` takes a sample of p and one of q (arrays,
    dask arrays or store paths; any sizes).  Why this interface: scikit-learn
    has no density-ratio estimator, and a ratio needs two unlabelled samples
    rather than (X, y); the two samples are named by their role so they cannot
    be swapped silently.  ``score_samples`` returns log r(x), as scikit-learn's
    density estimators (``KernelDensity``, ``GaussianMixture``) return log
    densities, and ``predict_ratio`` returns r(x) itself (importance weights for
    covariate shift, two-sample tests, outlier scores).

    Attributes
    ----------
    coef_ : ndarray (n_features_,)
        Weights w of log r = z^T w (the averaged iterate).
    n_numerator_, n_denominator_ : int
        Sizes of the two samples.
    lanes_, batch_size_, local_steps_ : int
        The resolved widths (the model depends on them; saved with it).
{feature_error_doc()}    """

    def __init__(self, *, alpha: float = 1e-3, kernel: str = "gaussian",
                 bandwidth: float | str = "auto", n_features: int = 2048, block_size: int = 256,
                 batch_size: int | str = "auto", n_epochs: int = 5, step_size: float | str = "auto",
                 step_decay: float | str = "auto", lanes: int | str = "auto",
                 local_steps: int | str = "auto", random_state: int = 0, client: Any = None,
                 verbose: bool = False, checkpoint: str | None = None, checkpoint_every: int = 0,
                 resume: bool = False,
                 feature_cache: str = "auto") -> None:
        self._store_params(locals())

    @one_fit_at_a_time
    def fit(self, X_numerator: Any, X_denominator: Any) -> DSGDensityRatio:
        """Fit log p/q from a sample of p (numerator) and a sample of q (denominator).

        Not a step of a scikit-learn ``Pipeline``: a Pipeline transforms its
        ``X`` only and hands ``X_denominator`` on as ``y``, untouched (with a
        ``StandardScaler`` before it, two samples of one distribution gave a
        mean log-ratio of 3.45 instead of 0).  Transform both samples alike first.
        """
        fit = FitContext(self, X_numerator, target="none", name="X_numerator")
        if hasattr(self, "n_features_in_"):  # in-memory numerator: the same columns, by name too
            path = isinstance(X_denominator, (str, os.PathLike))
            width = () if path else np.shape(X_denominator)[1:2]
            if width and width[0] != self.n_features_in_:
                raise ValueError(f"X_numerator has {self.n_features_in_} columns but X_denominator "
                                 f"has {width[0]}; both samples must have the same features")
            X_denominator = validate_predict_input(self, X_denominator, "X_denominator",
                                                   finite=False)
        fit.data, n_p, n_q = _two_samples(fit.X, X_denominator, self.random_state_)
        n = n_p + n_q
        alpha = float(self.alpha)

        def program(features: FeatureMap, n_blocks: int, sample: np.ndarray) -> DensityRatioProgram:
            # gamma_0 = 1 / curvature: the exp term weighs (n / n_q) e^f with f = 0 at the
            # start, times the top eigenvalue of the kernel operator (as DSG's auto step;
            # the features' where larger)
            lam = step_eigenvalue(features, n_blocks, sample)
            step, decay = self._steps(alpha, n_q / (n * lam))
            return DensityRatioProgram(features, n_blocks, alpha, step, decay,
                                       weight_numerator=n / n_p, weight_denominator=n / n_q)

        with fit:
            self._fit_pool(fit, program)
        self.n_numerator_, self.n_denominator_ = n_p, n_q
        return self

    def score_samples(self, X: Any) -> Any:
        """log r(X) = log p(X) / q(X); lazy for dask input."""
        return self._score(X)

    def predict_ratio(self, X: Any) -> Any:
        """r(X) = p(X) / q(X) (positive); lazy for dask input."""
        f = self._score(X)
        return da.exp(f) if isinstance(f, da.Array) else np.exp(f)

    def _extra_meta(self) -> dict[str, Any]:
        return {"n_numerator_": self.n_numerator_, "n_denominator_": self.n_denominator_}

    def _set_extra_meta(self, meta: dict) -> None:
        self.n_numerator_ = int(meta["n_numerator_"])
        self.n_denominator_ = int(meta["n_denominator_"])


def _two_samples(X_p: Any, X_q: Any, random_state: int) -> tuple[Dataset, int, int]:
    """(dataset, n_p, n_q): one dataset of both samples with y = 1 (numerator) / 0 (denominator).

    Every chunk must mix both samples in proportion: a step draws its rows from a
    few chunks, and with one-sample chunks whole groups of steps would see one
    sample only -- unbiased over an epoch, but the averaged iterate leans to the
    last group's sample (measured: log ratio 0.6 too low at the mode).
    In-memory samples are shuffled together (seeded); out-of-core samples are
    split into the same number K of even row ranges and combined chunk i is
    (p's range i, q's range i), whose rows the engine shuffles."""
    p, q = open_dataset(X_p, name="X_numerator"), open_dataset(X_q, name="X_denominator")
    if p.n_inputs != q.n_inputs:
        raise ValueError(f"X_numerator has {p.n_inputs} columns but X_denominator has "
                         f"{q.n_inputs}; both samples must have the same features")
    # each sample checked under its own name and row numbers (the combined rows'
    # numbers are neither's): in memory now, lazy ones block by block as read
    Xp, Xq = (_finite(d, name) for d, name in ((p, "X_numerator"), (q, "X_denominator")))
    if p.host is not None and q.host is not None:
        X = np.concatenate([p.host[0], q.host[0]])
        y = np.concatenate([np.ones(p.n_rows, np.float32), np.zeros(q.n_rows, np.float32)])
        order = np.random.default_rng([random_state, 0xD3]).permutation(len(X))
        data = open_dataset(X[order], y[order])
    else:
        K = min(max(p.n_chunks, q.n_chunks), p.n_rows, q.n_rows)
        Xp = Xp.rechunk({0: _even(p.n_rows, K)})
        Xq = Xq.rechunk({0: _even(q.n_rows, K)})
        sizes = tuple(a + b for a, b in zip(Xp.chunks[0], Xq.chunks[0]))
        X = da.concatenate([b for i in range(K) for b in (Xp.blocks[i], Xq.blocks[i])])
        y = da.concatenate([b for i in range(K) for b in (
            da.ones(Xp.chunks[0][i], dtype=np.float32),
            da.zeros(Xq.chunks[0][i], dtype=np.float32))])
        data = open_dataset(X.rechunk({0: sizes}), y.rechunk({0: sizes}))
    return data, p.n_rows, q.n_rows


def _finite(data: Dataset, name: str) -> Any:
    if data.host is not None:
        check_finite_chunk(data.host[0], name, 0)
        return data.X
    return data.X.map_blocks(_finite_block, name, dtype=data.X.dtype, meta=data.X._meta)


def _finite_block(block: Any, name: str, block_info: dict | None = None) -> Any:
    check_finite_chunk(block, name, block_info[0]["array-location"][0][0] if block_info else None)
    return block


def _even(n: int, k: int) -> tuple[int, ...]:
    """n rows in k ranges whose sizes differ by at most one."""
    return tuple(n // k + (1 if i < n % k else 0) for i in range(k))
