"""EigenPro's random-feature form (EigenPro-RF, Ma & Belkin's Table 1): a
bounded model of D seeded features for data of any size."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from dkernel.estimators.eigenpro.route import Route, record_sgd
from dkernel.estimators.fitting import FitContext
from dkernel.features import FeatureMap
from dkernel.solvers.eigenpro import critical_batch
from dkernel.solvers.eigenpro_rf import (
    FeatureEigenProProgram,
    average_horizon,
    default_batch,
    feature_preconditioner,
)
from dkernel.solvers.local_steps import local_steps
from dkernel.solvers.targets import TargetEncoding

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


class FeatureRoute(Route):
    """``n_features=D``: theta <- theta - eta P g over D seeded features, P from
    the top eigenvectors of the feature covariance on a subsample."""

    form = "features"

    def check(self) -> None:
        if self.est._given("n_centers") is not None:
            raise ValueError("give n_centers (kernel form) or n_features (random-feature form), "
                             "not both")

    def subsample(self) -> int:
        """s, the preconditioner's rows (the pool is rounded up to whole blocks)."""
        est = self.est
        B = min(int(est.block_size), int(est.n_features))
        D = -(-int(est.n_features) // B) * B
        return min(self.n_rows, int(est._given("subsample_size") or rf_subsample(D)))

    def fit(self, fit: FitContext, bandwidth: float, encoding: TargetEncoding,
            sample: np.ndarray | None, read_seconds: float) -> None:
        """``sample``: the preconditioner's rows when the estimator read them
        already (in ``read_seconds``, counted in ``preconditioner_seconds_``)."""
        est, engine, data = self.est, fit.engine, fit.data
        features, n_blocks = fit.feature_map(bandwidth)
        D = n_blocks * features.block_size
        tau = float(est._given("damping") or 0.25)  # paper 4.1: tau = 1/4 for RF
        est.lanes_ = engine.pin_lanes(data)
        max_batch = int(est._given("max_batch") or default_batch(est.lanes_, D, data.n_rows))
        k = est.local_steps_ = local_steps(est._given("local_steps"), est.lanes_, data.n_rows,
                                           max_batch)
        if k > 1:  # a local step sees one lane's share of a step (solvers/local_steps.py)
            max_batch = math.ceil(max_batch / est.lanes_)
        # Table 1: the preconditioner comes from a subsample, so its cost does not grow with n
        s = min(data.n_rows, self.subsample())
        t0 = time.perf_counter()
        if sample is None:  # rows held out for early stopping are not sampled
            sample = fit.sample(s)
        pairs = _RF_PAIRS if D <= _RF_DENSE_MAX else _RF_PAIRS_RANDOMIZED
        pre, beta, eig = feature_preconditioner(
            engine, sample, features, n_blocks, min(D, pairs), max_batch, tau,
            est.random_state_, q=est._given("q"), label="eigenpro-rf preconditioner",
            resolved_only=True)
        est.preconditioner_seconds_ = time.perf_counter() - t0 + read_seconds
        ridge = float(est._given("alpha") or 0.0)
        # P, beta, m* and eta of H + alpha I, the curvature of the penalised objective
        # (solvers.eigenpro_rf's docstring)
        shifted = pre.shifted(ridge)
        m_star = critical_batch(beta + ridge, shifted.new_top)
        given = est._given_batch(data.n_rows)
        if k > 1:  # ``batch``: rows of one lane's local step; a round, k of them a lane
            batch = (math.ceil(int(given) / est.lanes_) if given
                     else max(1, min(int(m_star), max_batch, data.n_rows)))
            step = batch * est.lanes_ * k
        else:
            batch = int(given or max(1, min(int(m_star), max_batch, data.n_rows)))
            step = batch
        program = FeatureEigenProProgram(features, n_blocks, shifted, encoding, beta + ridge,
                                         cache_blocks=fit.feature_cache(D), ridge=ridge,
                                         average_horizon=average_horizon(data.n_rows, D, step),
                                         local_steps=k, step_rows=batch if k > 1 else 0)
        if est._given("step_size") is not None:
            program.eta_override = float(est.step_size)
        spec = FeatureRoute.predict_spec
        est.features_ = features
        state = fit.run_steps(program, step, evaluate=self.evaluator(
            fit, encoding, lambda st: spec(est, st.get("theta_avg", st["theta"]))))
        # the iterate average where there is one (solvers/eigenpro_rf.py)
        est.form_, est.coef_ = "features", state.get("theta_avg", state["theta"])
        est.alpha_ = ridge
        record_sgd(est, bandwidth, encoding, data.n_inputs, pre.values, pre.q, batch, m_star,
                   beta, pre.new_top, eig.method, est.feature_cache_, s, ridge, tau)
        if k > 1:  # the rows of a synchronous step's worth; step_size_ is a local step's
            est.batch_size_ = batch * est.lanes_

    @staticmethod
    def predict_spec(est: Any, coef: np.ndarray) -> dict:
        return {"kind": "features", "features": est.features_,
                "n_blocks": coef.shape[0] // est.features_.block_size, "coef": coef}

    @staticmethod
    def save(est: Any, arrays: dict, meta: dict) -> None:
        meta["features"] = est.features_.to_dict()

    @staticmethod
    def load(est: Any, arrays: dict, meta: dict) -> None:
        est.features_ = FeatureMap.from_dict(meta["features"])
