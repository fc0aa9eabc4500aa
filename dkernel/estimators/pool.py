"""What the whole-pool functional-gradient estimators share (DSGOneClassSVM,
DSGDensityRatio): parameters, the fit plumbing and the fitted score f = z^T w."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dkernel.estimators.base import (
    BaseEstimator,
    apply_rows,
    validate_predict_input,
)
from dkernel.estimators.fitting import FitContext
from dkernel.estimators.history import history_meta, set_history
from dkernel.estimators.model_file import checked_coef
from dkernel.features import FeatureMap
from dkernel.solvers.eigenpro_rf import default_batch
from dkernel.solvers.pool import PoolProgram, pool_decision


class PoolEstimator(BaseEstimator):
    """Fit plumbing for a :class:`PoolProgram`; subclasses build the program."""

    def _fit_pool(self, fit: FitContext, make_program: Any) -> dict[str, Any]:
        """Resolve bandwidth, pool and widths, run ``make_program(features, n_blocks, sample)``."""
        sample = fit.sample()
        features, n_blocks = fit.feature_map(fit.bandwidth(sample))
        program: PoolProgram = make_program(features, n_blocks, sample)
        data = fit.data
        self.lanes_ = fit.engine.pin_lanes(data)
        self.batch_size_ = self._given_batch(data.n_rows) or max(512, 256 * self.lanes_)
        share = math.ceil(self.batch_size_ / self.lanes_)  # one lane's rows a local step
        if self.local_steps == "auto":
            # a lane's round: DSG's rows a lane (2^27 feature evaluations), at most
            # an eighth of its rows an epoch
            rows = min(default_batch(1, n_blocks * features.block_size, data.n_rows),
                       math.ceil(data.n_rows / (8 * self.lanes_)))
            self.local_steps_ = max(1, rows // share)
        else:
            self.local_steps_ = int(self.local_steps)
        program.step_rows = share
        program.cache_blocks = fit.feature_cache(n_blocks * features.block_size)
        state = fit.run_steps(program, self.lanes_ * self.local_steps_ * share)
        self._keep_pool(features, n_blocks * features.block_size)
        self.n_blocks_, self.coef_ = n_blocks, state["w_avg"]
        self.step_size_, self.step_decay_ = program.step_size, program.step_decay
        return state

    def _steps(self, strong_convexity: float, auto_step: float) -> tuple[float, float]:
        """(step_size, step_decay) with "auto" resolved (see ``step_decay``)."""
        step = auto_step if self.step_size == "auto" else float(self.step_size)
        decay = strong_convexity * step if self.step_decay == "auto" else float(self.step_decay)
        return step, decay

    def _score(self, X: Any) -> Any:
        """f(X) = z(X)^T coef_, shape (n,); lazy for dask input."""
        self._check_fitted("coef_")
        X = validate_predict_input(self, X)
        features, n_blocks, w = self.features_, self.n_blocks_, self.coef_
        return apply_rows(lambda Xb: pool_decision(features, n_blocks, w, Xb), X, None,
                          np.dtype(features.dtype))

    def _get_model_state(self) -> tuple[dict, dict]:
        self._check_fitted("coef_")
        return ({"coef": self.coef_},
                {"features": self.features_.to_dict(), "n_blocks": self.n_blocks_,
                 "step_size_": self.step_size_, "step_decay_": self.step_decay_,
                 "lanes_": self.lanes_, "batch_size_": self.batch_size_,
                 "local_steps_": self.local_steps_, "feature_cache_": self.feature_cache_,
                 "step_backoffs_": getattr(self, "step_backoffs_", []), **history_meta(self),
                 **self._extra_meta()})

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        # (the coefficients first: a block size they refute is not regenerated)
        self.coef_ = checked_coef(arrays["coef"], meta["features"]["block_size"], 1)
        self._keep_pool(FeatureMap.from_dict(meta["features"]), self.coef_.shape[0])
        self.n_blocks_ = int(meta["n_blocks"])
        self.step_size_ = meta["step_size_"]
        self.step_decay_ = meta["step_decay_"]
        # files written before rounds of local steps: 4 lanes, one step a round
        self.lanes_ = meta.get("lanes_", 4)
        self.batch_size_ = meta.get("batch_size_", self.batch_size)
        self.local_steps_ = meta.get("local_steps_", 1)
        if "feature_cache_" in meta:
            self.feature_cache_ = meta["feature_cache_"]
        self.step_backoffs_ = meta.get("step_backoffs_", [])  # none in older files
        set_history(self, meta)
        self._set_extra_meta(meta)

    def _extra_meta(self) -> dict[str, Any]:
        return {}

    def _set_extra_meta(self, meta: dict) -> None:
        pass
