"""What KernelPCA, KernelSVD and KernelCCA share (Xie, Liang & Song 2015):
the feature pool, the kind of steps (block, power or exact) and their widths,
the moments pass that orders the components, and the two-view plumbing of
KernelSVD and KernelCCA."""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import dask.array as da
import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_array

from dkernel._stack import user_stacklevel
from dkernel.data.dataset import open_dataset
from dkernel.engine import Engine
from dkernel.engine.stall import compute
from dkernel.estimators.base import (
    BaseEstimator,
    apply_rows,
    check_not_sparse,
    check_predict_input,
    is_in_memory,
    refuse_eager_output,
    validate_predict_input,
)
from dkernel.estimators.fitting import FitContext, feature_error_doc, one_fit_at_a_time
from dkernel.estimators.history import history_meta, set_history
from dkernel.estimators.params import AUTO
from dkernel.estimators.scoring import check_same_rows, score_targets
from dkernel.estimators.spec import params_of
from dkernel.features import FeatureMap, step_eigenvalue
from dkernel.linalg import column_signs
from dkernel.solvers.components import (
    ComponentProgram,
    PowerProgram,
    centred_moments,
    exact_coefficients,
    moments_partial,
    moments_payload,
    rotate_pair,
)
from dkernel.solvers.dsg import decision
from dkernel.solvers.eigenpro_rf import FeaturePreconditioner, default_batch

#: ``feature_error_`` of KernelSVD and KernelCCA, which check both views' pools
_DOC_TWO_VIEW_ERROR = feature_error_doc("the larger of the two views'")

_DOC_POWER_ATTRIBUTES = """    steps_ : str
        "block", "power" or "exact", as ``steps`` resolved.
    lanes_, batch_size_ : int or None
        The resolved ``lanes`` and ``batch_size`` (the model depends on them);
        None for exact steps.
    step_size_, step_decay_ : float or None
        The block steps' theta_0 and theta_1; None for power and exact steps.
"""

#: theta_0 = c / lambda_1 with lambda_1 the top eigenvalue of the (centred) kernel
#: operator on a sample: Oja's iteration contracts for eta lambda_1 below ~2.
#: KCCA is tighter: at its fixed point W = 2 diag(rho), so the C_XX G W term
#: contracts at eta lambda_1 2 rho_1 and eta must stay below ~1 / lambda_1.
#: Measured: a synthetic two-view problem diverged at 1.9 / lambda_1; Fashion-MNIST
#: halves (k = 50, started near the solution by init="subsample") diverged at
#: 0.99 / lambda_1 within 12 steps.  KPCA / KSVD are stable at 1 / lambda_1.
#: With KernelCCA's preconditioner the same bound holds for the flattened
#: spectrum, so theta_0 = 0.5 / lambda_{q+1} (max over the two views).
_STEP_SCALE = {"kpca": 1.0, "ksvd": 1.0, "kcca": 0.5}

#: theta_1 by kind of step.  Block steps: Xie et al.'s 1e-3.  Whole-pool
#: (preconditioned) steps reach the solution's neighbourhood in one or two
#: epochs and then only average out mini-batch noise, whose size is eta's:
#: Fashion-MNIST halves (k = 50, 16384 features, batch 1024, 59 steps an
#: epoch; held-out sum after every epoch, before short steps were cut)
#: reached 44.79 after 2 epochs and 45.08 after 10 with 1e-3, 45.15 after 2
#: and 45.30 after 10 with 1e-2.
_STEP_DECAY = {"block": 1e-3, "whole_pool": 1e-2}

#: steps="auto" takes exact steps below this many rows: there a power step's
#: batch (n / 8) is under 2048 rows, and power steps on 300 rows (38 a step)
#: missed exact kernel PCA by sin^2 0.13 and on 2000 2-d rows by 0.074
#: (benchmarks/quality.py), while on 12,000 rows they met it (0.007).  Exact
#: steps cost a dozen passes, each regenerating the features: through the CLI
#: (4 components, D = 4096, 32 inputs, idle 2-core VM) 7.6 s against power
#: steps' 5.5 s on 16,000 rows and 14.6 s against 8.1 s on 60,000.
_EXACT_ROWS = 16384


def _auto_step(method: str, samples: list, features: list, n_blocks: int,
               center: bool) -> float:
    lam = max(step_eigenvalue(f, n_blocks, S, center) for S, f in zip(samples, features))
    return _STEP_SCALE[method] / lam


def _scores(features: FeatureMap, coef: np.ndarray, mean: np.ndarray, X: Any) -> Any:
    coef32, mean32 = coef.astype(features.dtype), mean.astype(features.dtype)
    return apply_rows(lambda Xb: _score_block(Xb, features, coef32, mean32), X, coef.shape[1],
                      np.dtype(features.dtype))


def _score_block(Xb: Any, features: FeatureMap, coef: np.ndarray, mean: np.ndarray) -> Any:
    return decision(features, coef, Xb.astype(features.dtype, copy=False)) - mean


def check_rows(n_components: int, n_rows: int, center: bool) -> None:
    """Refuse more components than the rows carry: past n - 1 (centred) the
    components are noise directions of eigenvalue ~1e-10 (or exact zeros),
    returned as if real."""
    most = n_rows - bool(center)
    if n_components > most:
        raise ValueError(
            f"n_components={n_components} exceeds the {most} component(s) {n_rows} "
            f"{'centred ' if center else ''}rows hold; use at most {most} or fit more rows")

class _ComponentsBase(TransformerMixin, BaseEstimator):
    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float32"]  # float32 scores (docs/design.md §4)
        return tags

    def _check_params(self) -> None:
        super()._check_params()
        if self.n_components > self.n_features:
            raise ValueError(
                f"n_components={self.n_components} exceeds n_features={self.n_features}; "
                "use more random features than components")
        if hasattr(self, "steps"):
            self._resolve_steps()

    def _check_rows(self, n_rows: int) -> None:
        check_rows(self.n_components, n_rows, self.center)

    #: Settings only block steps have (power steps have no step size).
    _block_only: tuple[str, ...] = ("step_size", "step_decay")

    def _changed(self, names: tuple[str, ...]) -> list[tuple[str, Any]]:
        """(name, value) of the settings among ``names`` not at their declared default."""
        default = {p.name: p.default for p in params_of(type(self))}
        return [(n, getattr(self, n)) for n in names if getattr(self, n) != default[n]]

    def _resolve_steps(self) -> str:
        """``steps`` resolved before the data is seen: "power", "block" or
        "exact" (the estimators' docstrings); :meth:`_resolve_exact` may turn
        an automatic "power" into "exact" once the rows are counted."""
        given = self._changed(self._block_only)
        if self.steps in ("power", "exact") and given:
            name, value = given[0]
            raise ValueError(f"{name}={value!r} applies to block steps; {self.steps} steps "
                             f"(steps={self.steps!r}) have none: leave {name} at its default "
                             "or use steps='block'")
        if self.steps == "exact":
            given = self._iterative_given()
            if given:
                name, value = given[0]
                raise ValueError(f"{name}={value!r} applies to iterative steps; steps='exact' "
                                 "is one pass with nothing to tune or checkpoint: leave "
                                 f"{name} at its default or use steps='auto'")
            return "exact"
        return "power" if self.steps == "power" or (self.steps == "auto" and not given) \
            else "block"

    def _iterative_given(self) -> list[tuple[str, Any]]:
        """Settings only iterative (power or block) steps use, given.  A
        feature_cache that keeps features is one (exact steps keep none);
        "off" is not: a memory setting must not switch the algorithm."""
        given = self._changed(("n_epochs", "batch_size", "lanes", "checkpoint",
                               "checkpoint_every", "resume"))
        if self.feature_cache not in (AUTO, "off"):
            given.append(("feature_cache", self.feature_cache))
        return given

    def _resolve_exact(self, steps: str, n_rows: int) -> str:
        """An automatic "power" becomes "exact" below ``_EXACT_ROWS`` rows when no
        iterative setting was given: a power step converges to the top
        subspace of its own batch's covariance, and on few rows the batch is
        a few hundred rows (solvers/components.py, "Exact steps")."""
        if (self.steps == "auto" and steps == "power" and not self._iterative_given()
                and n_rows < _EXACT_ROWS):
            return "exact"
        return steps

    def _fit_steps(self, fit: FitContext, features: tuple, n_blocks: int, steps: str | None,
                   block_program: Any) -> tuple[dict, dict]:
        """(state, moments) of exact steps, power steps or the block steps of
        ``block_program()``; ``steps`` None: KernelCCA's block steps, whose
        widths are its parameters."""
        if steps == "exact":
            return self._exact(fit, features, n_blocks)
        if steps is not None:  # a row costs every view's features
            D = len(features) * n_blocks * features[0].block_size
            self._resolve_width(fit.engine, fit.data, D, steps == "power")
        if steps == "power":
            self.step_size_ = self.step_decay_ = None
            # a full step's rows: a lane takes at most its chunk (data/plan.py)
            full = min(self.batch_size_, self.lanes_ * max(fit.data.row_chunks))
            program = PowerProgram(self._method, features, n_blocks, int(self.n_components), 0.0,
                                   0.0, batch_size=int(full),
                                   label=self._method, center=bool(self.center), seed=fit.seed)
        else:
            program = block_program()
            if steps is None:  # KernelCCA's lanes, recorded as the others' (lanes_ was missing)
                self.lanes_ = fit.engine.pin_lanes(fit.data, self.lanes,
                                                   quiet=not self._changed(("lanes",)))
        program.cache_blocks = fit.feature_cache(len(features) * n_blocks
                                                 * features[0].block_size)
        # these solvers have no loss (the engine's per-epoch sum is an empty 0);
        # their history carries the objective they maximise instead
        state = fit.run_steps(program, getattr(self, "batch_size_", None) or self.batch_size,
                              extra=lambda state: {"loss": None, **program.epoch_objective()})
        coefs = tuple(state[f"coef{s}"] for s in range(len(features)))
        total = fit.engine.map_reduce(
            fit.data, moments_partial,
            moments_payload(features, coefs, program.cache_blocks),
            label="moments", wants_chunk=True)
        return state, total

    def _exact(self, fit: FitContext, features: tuple, n_blocks: int) -> tuple[dict, dict]:
        """Exact steps: the coefficients in one pass, then the moments pass."""
        t0, data = time.perf_counter(), fit.data
        self.step_size_ = self.step_decay_ = None
        self.lanes_ = self.batch_size_ = None
        self.feature_cache_ = "off"
        coefs = exact_coefficients(fit.engine, data, features, n_blocks, int(self.n_components),
                                   bool(self.center), fit.seed, label=f"{self._method} exact")
        total = fit.engine.map_reduce(data, moments_partial,
                                      moments_payload(features, coefs, "off"),
                                      label="moments", wants_chunk=True)
        # the objective the iterative steps report (ComponentProgram.epoch_objective),
        # here on every row: the learning curve has its one point
        _, M = centred_moments(total, bool(self.center))
        k = int(self.n_components)
        objective = ({"variance": float(np.trace(M))} if len(features) == 1 else
                     {"covariance": float(np.linalg.svd(M[:k, k:], compute_uv=False).sum())})
        self.history_ = [{"epoch": 1, "loss": None, "steps": 1, "rows": int(data.n_rows),
                          "seconds": time.perf_counter() - t0, **objective}]
        return {f"coef{s}": c for s, c in enumerate(coefs)}, total

    def _resolve_width(self, engine: Engine, data: Any, D: int, power: bool) -> None:
        """lanes_ and batch_size_.  "auto" for block steps is Xie et al.'s
        setting as before (4 lanes, 512 rows); for power steps one lane per
        worker thread and a lane's rows as DSG's (2^27 evaluations of the
        ``D`` features a row costs, ``default_batch``), at most an eighth of
        the rows so that an epoch makes at least 8 power steps (but 16 rows a
        component)."""
        lanes = 4 if self.lanes == "auto" and not power else self.lanes
        self.lanes_ = engine.pin_lanes(data, lanes, quiet=self.lanes == "auto")
        # power steps: at least 16 rows a component; fewer make the batch
        # covariance lose rank or leave noise in the last components
        floor = min(data.n_rows, 16 * int(self.n_components))
        if self.batch_size != "auto":
            self.batch_size_ = self._given_batch(data.n_rows)
            if power and self.batch_size_ < floor:
                raise ValueError(
                    f"batch_size={self.batch_size_} is below 16 rows a component for power "
                    f"steps (n_components={self.n_components}): use batch_size >= {floor} "
                    "or 'auto'")
        elif power:
            self.batch_size_ = max(floor, min(default_batch(self.lanes_, D, data.n_rows),
                                              math.ceil(data.n_rows / 8)))
        else:
            self.batch_size_ = 512


    def _width_meta(self) -> dict:
        """What a power-capable fit depended on beyond its parameters (absent
        from older models, which took block steps)."""
        return {"steps": getattr(self, "steps_", "block"), "lanes_": getattr(self, "lanes_", None),
                "batch_size_": getattr(self, "batch_size_", None)}

    def _set_width_meta(self, meta: dict) -> None:
        if "steps" in meta:
            self.steps_ = meta["steps"]
            self.lanes_, self.batch_size_ = meta["lanes_"], meta["batch_size_"]
        else:  # saved before power steps were the default: block steps, and a refit takes them
            self.steps = self.steps_ = "block"

    def _step_decay(self, whole_pool: bool) -> float:
        """theta_1: the given one, or _STEP_DECAY of the kind of step."""
        if self.step_decay != "auto":
            return float(self.step_decay)
        return _STEP_DECAY["whole_pool" if whole_pool else "block"]


    def _block_step_size(self, method: str, samples: list, features: list, n_blocks: int,
                         pre: tuple | None = None) -> None:
        """step_size_ and step_decay_ of block steps (whole-pool ones with ``pre``)."""
        if self.step_size != "auto":
            self.step_size_ = float(self.step_size)
        elif pre is not None:
            # lambda_{q+1} is the top of the preconditioned spectrum; the ridge
            # term alpha U W is not flattened by it, and a step past 0.5 / alpha
            # diverged (alpha >= 0.03 at the defaults): the larger of the two
            # bounds the step, so eta (lambda_{q+1} + alpha) <= 1
            top = max(p.new_top for p in pre)
            self.step_size_ = _STEP_SCALE[method] / max(top, float(getattr(self, "alpha", 0.0)))
        else:
            self.step_size_ = _auto_step(method, samples, features, n_blocks, bool(self.center))
        self.step_decay_ = self._step_decay(whole_pool=pre is not None)

    def _saved_steps(self) -> dict:
        return {"step_size_": self.step_size_, "step_decay_": getattr(self, "step_decay_", None),
                "feature_cache_": getattr(self, "feature_cache_", None), **history_meta(self)}

    def _load_steps(self, meta: dict) -> None:
        self.step_size_ = meta["step_size_"]
        if "step_decay_" in meta:  # models saved before step_decay="auto" lack it
            self.step_decay_ = meta["step_decay_"]
        if meta.get("feature_cache_") is not None:  # recorded since feature_cache
            self.feature_cache_ = meta["feature_cache_"]
        set_history(self, meta)


class _TwoViewBase(ClassNamePrefixFeaturesOutMixin, _ComponentsBase):
    _method = ""
    #: where the fit keeps the k values of the rotated pairs (saved as "values")
    _values_attr = ""

    @property
    def _n_features_out(self) -> int:
        """The X view's scores (``transform(X)``), as scikit-learn's CCA names them."""
        return self.x_components_.shape[1]

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True  # the second view Y
        return tags

    @one_fit_at_a_time
    def fit(self, X: Any, y: Any = None) -> _TwoViewBase:
        """Fit on views X and y (same rows; y, the second view Y, may differ in
        width; named y as in scikit-learn's CCA).  X may be a store path whose
        array ``y`` holds the second view."""
        if y is None and not isinstance(X, str) and not hasattr(X, "__fspath__"):
            self._check_params()
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None: it "
                "needs a second view, fit(X, Y) with the same rows, or a store path whose "
                "array 'y' holds the second view")
        fit = FitContext(self, X, y, target="view")
        self._check_rows(fit.data.n_rows)  # before the cluster starts
        if y is None and fit.data.y is not None and fit.data.y.ndim == 1 and \
                fit.data.y.dtype.kind in "iub":  # (a 1-D float y may be a one-column view)
            raise ValueError(
                f"{type(self).__name__} takes the second view from the store's array 'y', but "
                f"{X}'s y is 1-D integers: a label column, not a view; write the view as a 2-D "
                "y (n x d_y) or pass it, fit(X, Y)")
        with fit:
            data = fit.data
            steps = None
            if hasattr(self, "steps"):  # KernelCCA has one kind of step
                self.steps_ = steps = self._resolve_exact(self._resolve_steps(), data.n_rows)
            if data.y.ndim == 1:
                data.y = data.y.reshape(-1, 1)
                if data.host is not None:
                    data.host = (data.host[0], data.host[1].reshape(-1, 1))
            sx = fit.sample()
            # in-memory y is sampled here, not through a graph that embeds all of it
            sy = fit.sample(data=open_dataset(data.y if data.host is None else data.host[1]))
            kernel_y = self.kernel if self.kernel_y is None else self.kernel_y
            bw_y = self.bandwidth if self.bandwidth_y is None else self.bandwidth_y
            # separate seed streams: the views' features are independent draws
            fx, n_blocks = fit.feature_map(fit.bandwidth(sx), stream=0)
            fy, _ = fit.feature_map(fit.bandwidth(sy, bw_y, kernel_y), int(data.y.shape[1]),
                                    kernel=kernel_y, stream=1)
            init, pre = self._start(fit, (fx, fy), n_blocks)
            self.preconditioners_ = pre

            def block_program() -> ComponentProgram:
                self._block_step_size(self._method, [sx, sy], [fx, fy], n_blocks, pre)
                return ComponentProgram(
                    self._method, (fx, fy), n_blocks, int(self.n_components), self.step_size_,
                    self.step_decay_, alpha=float(getattr(self, "alpha", 0.0)),
                    batch_size=int(getattr(self, "batch_size_", None) or self.batch_size),
                    center=bool(self.center), seed=fit.seed, label=self._method, init=init,
                    preconditioners=pre)
            state, total = self._fit_steps(fit, (fx, fy), n_blocks, steps, block_program)
        k = int(self.n_components)
        mean, M = centred_moments(total, bool(self.center))
        A, Bc = state["coef0"], state["coef1"]
        Sx, Sy = self._metrics(M, A, Bc)
        Rx, Ry, sv = rotate_pair(Sx, Sy, M[:k, k:])
        # a sign that does not hang on rounding; both views' columns together, so
        # each pair's correlation keeps its sign
        signs = column_signs(A @ Rx)
        Rx, Ry = Rx * signs, Ry * signs
        self._set_fitted((fx, fy), (A @ Rx, Bc @ Ry), (mean[:k] @ Rx, mean[k:] @ Ry), sv)
        return self

    def _metrics(
        self, M: np.ndarray, A: np.ndarray, Bc: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _start(
        self, fit: FitContext, features: tuple, n_blocks: int
    ) -> tuple[tuple[np.ndarray, ...] | None, tuple[FeaturePreconditioner, ...] | None]:
        """Starting coefficients of both views (None: a random subspace) and the
        views' preconditioners (None: the paper's block steps)."""
        return None, None

    def _set_fitted(self, features: tuple, coefs: tuple, means: tuple, sv: np.ndarray) -> None:
        self.features_ = features
        self.x_components_, self.y_components_ = coefs
        self.x_mean_, self.y_mean_ = means
        setattr(self, self._values_attr, sv)
        self.n_features_in_ = features[0].n_inputs
        self.n_features_y_ = features[1].n_inputs
        self.bandwidth_ = features[0].bandwidth
        self.bandwidth_y_ = features[1].bandwidth

    def transform(self, X: Any, y: Any = None) -> Any:
        """(x_scores, y_scores) of views X and y; x_scores alone when y is None.  Lazy
        for dask input."""
        self._check_fitted("x_components_")
        X = validate_predict_input(self, X)
        refuse_eager_output(self, X)
        xs = _scores(self.features_[0], self.x_components_, self.x_mean_, X)
        if y is None:
            return xs
        check_not_sparse(y, "Y")
        if is_in_memory(y):
            y = check_array(y, ensure_2d=False, dtype=[np.float32, np.float64], input_name="Y")
        if getattr(y, "ndim", 2) == 1:
            y = y.reshape(-1, 1)
        y = check_predict_input(y, self.n_features_y_, "Y")
        check_same_rows(y, X, "Y")
        return xs, _scores(self.features_[1], self.y_components_, self.y_mean_, y)

    @one_fit_at_a_time  # (another thread's fit between the fit and the transform)
    def fit_transform(self, X: Any, y: Any = None) -> Any:
        """Fit, then ``transform`` both views: (x_scores, y_scores), as
        scikit-learn's CCA returns them (TransformerMixin's returned x_scores
        alone, dropping the second view's); y may be omitted for a store whose
        array ``y`` holds the second view."""
        refuse_eager_output(self, X)  # (before the fit, not after it)
        self.fit(X, y)
        return self.transform(*score_targets(X, y))

    def canonical_correlations(self, X: Any, y: Any = None) -> np.ndarray:
        """Correlation of each pair of scores on (held-out) data, shape (n_components,);
        y may be omitted for a store whose array ``y`` holds the second view."""
        X, y = score_targets(X, y)
        xs, ys = self.transform(X, y)
        xp = da if isinstance(xs, da.Array) or isinstance(ys, da.Array) else np
        xs, ys = xs.astype(np.float64), ys.astype(np.float64)
        xc, yc = xs - xs.mean(axis=0), ys - ys.mean(axis=0)
        parts = ((xc * yc).sum(axis=0), (xc * xc).sum(axis=0), (yc * yc).sum(axis=0))
        if xp is da:
            parts = compute(*parts)
        sxy, sxx, syy = (np.asarray(p) for p in parts)
        with np.errstate(invalid="ignore", divide="ignore"):
            corr = sxy / np.sqrt(sxx * syy)
        flat = np.flatnonzero(~((sxx > 0) & (syy > 0)))
        if flat.size:  # (numpy's "invalid value encountered in divide" said nothing useful)
            from sklearn.exceptions import UndefinedMetricWarning

            warnings.warn(f"the correlation of component(s) {flat.tolist()} is undefined (NaN): "
                          "their x or y scores are constant on these rows (a constant view, or "
                          "fewer than 2 rows)", UndefinedMetricWarning,
                          stacklevel=user_stacklevel())
        return corr

    def score(self, X: Any, y: Any = None) -> float:
        """Sum of the canonical correlations of the pairs of scores on views (X, y)."""
        return float(np.sum(self.canonical_correlations(X, y)))

    def _get_model_state(self) -> tuple[dict, dict]:
        self._check_fitted("x_components_")
        return ({"x_components": self.x_components_, "y_components": self.y_components_,
                 "x_mean": self.x_mean_, "y_mean": self.y_mean_,
                 "values": getattr(self, self._values_attr)},
                {"features": [f.to_dict() for f in self.features_], **self._saved_steps(),
                 **(self._width_meta() if hasattr(self, "steps") else {})})

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        self._set_fitted(tuple(FeatureMap.from_dict(f) for f in meta["features"]),
                         (arrays["x_components"], arrays["y_components"]),
                         (arrays["x_mean"], arrays["y_mean"]), arrays["values"])
        if hasattr(self, "steps"):  # KernelCCA has one kind of step
            self._set_width_meta(meta)
        self._load_steps(meta)
