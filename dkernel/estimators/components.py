"""KernelPCA, KernelSVD, KernelCCA: doubly stochastic component analysis (Xie et al. 2015)."""

from __future__ import annotations

import math
import time
from typing import Any

import dask.array as da
import numpy as np
from scipy.linalg import eigh
from sklearn.base import ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_array

from dkernel.data.dataset import open_dataset
from dkernel.engine import Engine, connect
from dkernel.estimators.base import (
    BaseEstimator,
    apply_rows,
    check_not_sparse,
    check_predict_input,
    is_in_memory,
    resolve_bandwidth,
    resolve_random_state,
    sample_rows,
    score_targets,
    validate_fit_input,
    validate_predict_input,
)
from dkernel.estimators.history import EpochMonitor, history_meta, set_history
from dkernel.estimators.spec import documented, params_of
from dkernel.features import FeatureMap
from dkernel.kernels.exact import kernel_matrix
from dkernel.solvers.components import (
    ComponentProgram,
    PowerProgram,
    centred_moments,
    exact_coefficients,
    moments_partial,
    moments_payload,
    pool_gram,
    regularized_cca,
    rotate_pair,
    rotate_pca,
)
from dkernel.solvers.dsg import decision
from dkernel.solvers.eigenpro_rf import (
    FeaturePreconditioner,
    default_batch,
    feature_preconditioner,
)

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


def _auto_step(method: str, samples: list, features: list, center: bool) -> float:
    lam = 0.0
    for S, f in zip(samples, features):
        K = kernel_matrix(S, S, f.kernel, f.bandwidth)
        if center:
            K = K - K.mean(axis=0) - K.mean(axis=1)[:, None] + K.mean()
        n = K.shape[0]
        lam = max(lam, float(eigh(K / n, eigvals_only=True, subset_by_index=[n - 1, n - 1])[0]))
    return _STEP_SCALE[method] / lam


def _scores(features: FeatureMap, coef: np.ndarray, mean: np.ndarray, X: Any) -> Any:
    coef32 = coef.astype(features.dtype)
    mean32 = mean.astype(features.dtype)
    return apply_rows(
        lambda Xb: _score_block(Xb, features, coef32, mean32),
        X,
        coef.shape[1],
        np.dtype(features.dtype),
    )


def _score_block(Xb: Any, features: FeatureMap, coef: np.ndarray, mean: np.ndarray) -> Any:
    return decision(features, coef, Xb.astype(features.dtype, copy=False)) - mean


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
        """Settings only iterative (power or block) steps use, given."""
        return self._changed(("n_epochs", "batch_size", "lanes", "checkpoint",
                              "checkpoint_every", "resume"))

    def _resolve_exact(self, steps: str, n_rows: int) -> str:
        """An automatic "power" becomes "exact" below ``_EXACT_ROWS`` rows when no
        iterative setting was given: a power step converges to the top
        subspace of its own batch's covariance, and on few rows the batch is
        a few hundred rows (solvers/components.py, "Exact steps")."""
        if (self.steps == "auto" and steps == "power" and not self._iterative_given()
                and n_rows < _EXACT_ROWS):
            return "exact"
        return steps

    def _exact(self, data: Any, client: Any, features: tuple, n_blocks: int,
               engine: Engine) -> tuple[dict, dict]:
        """Exact steps: the coefficients in one pass, then the moments pass."""
        t0 = time.perf_counter()
        self.step_size_ = self.step_decay_ = None
        self.lanes_ = self.batch_size_ = None
        coefs = exact_coefficients(engine, data, features, n_blocks, int(self.n_components),
                                   bool(self.center), self.random_state_,
                                   label=f"{self._method} exact")
        total = engine.map_reduce(data, moments_partial, moments_payload(features, coefs, False),
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
        self.lanes_ = engine.pin_lanes(data, lanes)
        # power steps: at least 16 rows a component; fewer make the batch
        # covariance lose rank or leave noise in the last components
        floor = min(data.n_rows, 16 * int(self.n_components))
        if self.batch_size != "auto":
            self.batch_size_ = int(self.batch_size)
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

    def _power_program(self, features: tuple, n_blocks: int, data: Any,
                       **common: Any) -> PowerProgram:
        """Power steps over ``features`` (one view: KPCA, two: KSVD)."""
        self.step_size_ = self.step_decay_ = None
        # a full step's rows: a lane takes at most its chunk (data/plan.py)
        full = min(self.batch_size_, self.lanes_ * max(data.row_chunks))
        return PowerProgram(self._method, features, n_blocks, int(self.n_components), 0.0, 0.0,
                            cache_blocks=int(self.n_epochs) > 1, batch_size=int(full),
                            label=self._method, **common)

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

    def _pool(self) -> tuple[int, int]:
        B = min(int(self.block_size), int(self.n_features))
        return B, math.ceil(int(self.n_features) / B)

    def _run(self, data: Any, client: Any, program: ComponentProgram,
             engine: Engine | None = None) -> tuple[dict, dict]:
        engine = engine or Engine(client, self._engine_options())
        # these solvers have no loss (the engine's per-epoch sum is an empty 0);
        # their history carries the objective they maximise instead
        monitor = EpochMonitor(engine, program,
                               extra=lambda state: {"loss": None, **program.epoch_objective()})
        state = engine.run_steps(
            data,
            program,
            n_epochs=int(self.n_epochs),
            batch_size=int(getattr(self, "batch_size_", self.batch_size)),
            random_state=self.random_state_,
            on_epoch=monitor,
        )
        self.history_ = monitor.history()
        coefs = tuple(state[f"coef{s}"] for s in range(len(program.features)))
        total = engine.map_reduce(
            data, moments_partial,
            moments_payload(program.features, coefs, getattr(program, "cache_blocks", True)),
            label="moments",
            wants_chunk=True,
        )
        return state, total


@documented
class KernelPCA(ClassNamePrefixFeaturesOutMixin, _ComponentsBase):
    _method = "kpca"
    _block_only = _ComponentsBase._block_only + ("ordering",)

    __doc__ = f"""Kernel PCA by doubly stochastic gradients (Xie, Liang & Song 2015, Alg. 1-2).

    Finds the top ``n_components`` eigenfunctions of the (centred) kernel
    covariance operator, ordered by a final k x k rotation (or individually by
    the GHA update, ``ordering="gha"``).

    Attributes
    ----------
    components_ : ndarray (n_features_, n_components)
        Coefficients over the pool of the eigenfunctions u_i(x) = phi(x)^T
        components_[:, i] (centred by ``mean_``).  The functions are what the
        fit pins down: their scores are uncorrelated, with the eigenvalues as
        variances, and they match a dense solve on the data.  The coefficient
        vectors are not RKHS-orthonormal: every step also adds SGD noise along
        pool directions the data barely excite, which changes the functions on
        the data by little but inflates the RKHS norms (D |components_[:, i]|^2
        was 7.4 and 3.3, not 1, for two components of 2048 features).
    explained_variance_ : ndarray (n_components,)
        Variance of each score, the eigenvalue estimates of the covariance operator.
{_DOC_POWER_ATTRIBUTES}    mean_ : ndarray (n_components,)
        Mean of the raw scores (subtracted by ``transform``; zero if not centred).
    history_ : list of dict
        Per epoch: ``epoch``, ``steps``, ``rows``, ``seconds`` and ``variance``,
        the variance the k scores capture on the epoch's mini-batches.

    Examples
    --------
    >>> import numpy as np
    >>> from distributed import Client
    >>> from dkernel import KernelPCA
    >>> X = np.random.default_rng(0).standard_normal((2000, 2))
    >>> with Client(n_workers=1, processes=False, dashboard_address=None) as client:
    ...     Z = KernelPCA(3, bandwidth=1.0, n_features=512, client=client).fit_transform(X)
    >>> Z.shape
    (2000, 3)
    """

    def __init__(
        self,
        n_components: int = 8,
        *,
        kernel: str = "gaussian",
        bandwidth: float | str = "auto",
        n_features: int = 4096,
        block_size: int = 256,
        batch_size: int | str = "auto",
        n_epochs: int = 5,
        step_size: float | str = "auto",
        step_decay: float | str = "auto",
        center: bool = True,
        ordering: str = "rotate",
        steps: str = "auto",
        lanes: int | str = "auto",
        random_state: int = 0,
        client: Any = None,
        verbose: bool = False,
        checkpoint: str | None = None,
        checkpoint_every: int = 0,
        resume: bool = False,
    ) -> None:
        self._store_params(locals())

    def fit(self, X: Any, y: Any = None) -> KernelPCA:
        """Fit on X (array, DataFrame or store path); y is ignored."""
        self._check_params()
        steps = self._resolve_steps()
        X, _, _ = validate_fit_input(self, X, target="none")
        self.random_state_ = resolve_random_state(self.random_state)
        data = open_dataset(X)
        data.y = None
        B, n_blocks = self._pool()
        self.steps_ = steps = self._resolve_exact(steps, data.n_rows)
        power = steps == "power"
        with connect(self.client) as client:
            sample = sample_rows(data, self.random_state_, client)
            bandwidth = resolve_bandwidth(self.bandwidth, self.kernel, sample)
            features = FeatureMap(self.kernel, bandwidth, data.n_inputs, B, self.random_state_)
            engine = Engine(client, self._engine_options())
            if steps != "exact":
                self._resolve_width(engine, data, n_blocks * B, power)
            common = dict(center=bool(self.center), seed=self.random_state_)
            if steps == "exact":
                program = None
            elif power:
                program = self._power_program((features,), n_blocks, data, **common)
            else:
                self.step_size_ = (
                    _auto_step("kpca", [sample], [features], bool(self.center))
                    if self.step_size == "auto"
                    else float(self.step_size)
                )
                self.step_decay_ = self._step_decay(whole_pool=False)
                program = ComponentProgram("kpca", (features,), n_blocks, int(self.n_components),
                                           self.step_size_, self.step_decay_,
                                           gha=self.ordering == "gha", label="kpca", **common)
            if program is None:
                state, total = self._exact(data, client, (features,), n_blocks, engine)
            else:
                state, total = self._run(data, client, program, engine)
        mean, M = centred_moments(total, bool(self.center))
        E, lam = rotate_pca(M)
        self._set_fitted(features, state["coef0"] @ E, mean @ E, lam)
        return self

    def _set_fitted(
        self, features: FeatureMap, coef: np.ndarray, mean: np.ndarray, lam: np.ndarray
    ) -> None:
        self.features_ = features
        self.components_ = coef
        self.mean_ = mean
        self.explained_variance_ = lam
        self.bandwidth_ = features.bandwidth
        self.n_features_in_ = features.n_inputs
        self.n_features_ = coef.shape[0]

    def transform(self, X: Any) -> Any:
        """Scores (n, n_components): projections on the eigenfunctions; lazy for dask input."""
        self._check_fitted("components_")
        X = validate_predict_input(self, X)
        return _scores(self.features_, self.components_, self.mean_, X)

    def fit_transform(self, X: Any, y: Any = None) -> Any:
        """Fit, then the scores of X (a store path: of its ``X``)."""
        return self.fit(X).transform(X if not isinstance(X, str) else open_dataset(X).X)

    @property
    def _n_features_out(self) -> int:
        return self.components_.shape[1]

    def _get_model_state(self) -> tuple[dict, dict]:
        self._check_fitted("components_")
        return (
            {
                "components": self.components_,
                "mean": self.mean_,
                "explained_variance": self.explained_variance_,
            },
            {"features": self.features_.to_dict(), "step_size_": self.step_size_,
             "step_decay_": getattr(self, "step_decay_", None),
             **self._width_meta(), **history_meta(self)},
        )

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        self._set_fitted(
            FeatureMap.from_dict(meta["features"]),
            arrays["components"],
            arrays["mean"],
            arrays["explained_variance"],
        )
        self.step_size_ = meta["step_size_"]
        if "step_decay_" in meta:  # models saved before step_decay="auto" lack it
            self.step_decay_ = meta["step_decay_"]
        self._set_width_meta(meta)
        set_history(self, meta)


class _TwoViewBase(_ComponentsBase):
    _method = ""

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True  # the second view Y
        return tags

    def fit(self, X: Any, y: Any = None) -> _TwoViewBase:
        """Fit on views X and y (same rows; y, the second view Y, may differ in
        width; named y as in scikit-learn's CCA).  X may be a store path whose
        array ``y`` holds the second view."""
        self._check_params()
        steps = self._resolve_steps() if self._method == "ksvd" else None
        if y is None and not isinstance(X, str) and not hasattr(X, "__fspath__"):
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None: it "
                "needs a second view, fit(X, Y) with the same rows, or a store path whose "
                "array 'y' holds the second view"
            )
        X, y, _ = validate_fit_input(self, X, y, target="view")
        self.random_state_ = resolve_random_state(self.random_state)
        data = open_dataset(X, y, require_y=True)
        if steps is not None:
            self.steps_ = steps = self._resolve_exact(steps, data.n_rows)
        power = steps == "power"
        if data.y.ndim == 1:
            data.y = data.y.reshape(-1, 1)
            if data.host is not None:
                data.host = (data.host[0], data.host[1].reshape(-1, 1))
        with connect(self.client) as client:
            sx = sample_rows(data, self.random_state_, client)
            # in-memory y is sampled here, not through a graph that embeds all of it
            view_y = open_dataset(data.y if data.host is None else data.host[1])
            sy = sample_rows(view_y, self.random_state_, client)
            bw_x = resolve_bandwidth(self.bandwidth, self.kernel, sx)
            kernel_y = self.kernel if self.kernel_y is None else self.kernel_y
            bw_y = resolve_bandwidth(
                self.bandwidth if self.bandwidth_y is None else self.bandwidth_y, kernel_y, sy
            )
            B, n_blocks = self._pool()
            # separate seed streams: the views' features are independent draws
            fx = FeatureMap(self.kernel, bw_x, data.n_inputs, B, self.random_state_, stream=0)
            fy = FeatureMap(
                kernel_y, bw_y, int(data.y.shape[1]), B, self.random_state_, stream=1
            )
            init, pre = self._start(data, client, (fx, fy), n_blocks)
            self.preconditioners_ = pre
            engine = Engine(client, self._engine_options())
            if self._method == "ksvd" and steps != "exact":  # a row costs both views' features
                self._resolve_width(engine, data, 2 * n_blocks * B, power)
            if steps == "exact":
                program = None
            elif power:
                program = self._power_program((fx, fy), n_blocks, data,
                                              center=bool(self.center), seed=self.random_state_)
            else:
                if self.step_size != "auto":
                    self.step_size_ = float(self.step_size)
                elif pre is not None:  # lambda_{q+1} is the top of the preconditioned spectrum
                    self.step_size_ = _STEP_SCALE[self._method] / max(p.new_top for p in pre)
                else:
                    self.step_size_ = _auto_step(self._method, [sx, sy], [fx, fy],
                                                 bool(self.center))
                self.step_decay_ = self._step_decay(whole_pool=pre is not None)
                program = ComponentProgram(
                    self._method,
                    (fx, fy),
                    n_blocks,
                    int(self.n_components),
                    self.step_size_,
                    self.step_decay_,
                    alpha=float(getattr(self, "alpha", 0.0)),
                    batch_size=int(getattr(self, "batch_size_", self.batch_size)),
                    center=bool(self.center),
                    seed=self.random_state_,
                    label=self._method,
                    init=init,
                    preconditioners=pre,
                )
            if program is None:
                state, total = self._exact(data, client, (fx, fy), n_blocks, engine)
            else:
                state, total = self._run(data, client, program, engine)
        k = int(self.n_components)
        mean, M = centred_moments(total, bool(self.center))
        A, Bc = state["coef0"], state["coef1"]
        Sx, Sy = self._metrics(M, A, Bc)
        Rx, Ry, sv = rotate_pair(Sx, Sy, M[:k, k:])
        self._set_fitted((fx, fy), (A @ Rx, Bc @ Ry), (mean[:k] @ Rx, mean[k:] @ Ry), sv)
        return self

    def _metrics(
        self, M: np.ndarray, A: np.ndarray, Bc: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _start(
        self, data: Any, client: Any, features: tuple, n_blocks: int
    ) -> tuple[tuple[np.ndarray, ...] | None, tuple[FeaturePreconditioner, ...] | None]:
        """Starting coefficients of both views (None: a random subspace) and the
        views' preconditioners (None: the paper's block steps)."""
        return None, None

    def _set_fitted(self, features: tuple, coefs: tuple, means: tuple, sv: np.ndarray) -> None:
        self.features_ = features
        self.x_components_, self.y_components_ = coefs
        self.x_mean_, self.y_mean_ = means
        self._set_values(sv)
        self.n_features_in_ = features[0].n_inputs
        self.n_features_y_ = features[1].n_inputs
        self.bandwidth_ = features[0].bandwidth
        self.bandwidth_y_ = features[1].bandwidth

    def _set_values(self, sv: np.ndarray) -> None:
        raise NotImplementedError

    def _values(self) -> np.ndarray:
        raise NotImplementedError

    def transform(self, X: Any, y: Any = None) -> Any:
        """(x_scores, y_scores) of views X and y; x_scores alone when y is None.  Lazy
        for dask input."""
        self._check_fitted("x_components_")
        X = validate_predict_input(self, X)
        xs = _scores(self.features_[0], self.x_components_, self.x_mean_, X)
        if y is None:
            return xs
        check_not_sparse(y, "Y")
        if is_in_memory(y):
            y = check_array(y, ensure_2d=False, dtype=[np.float32, np.float64], input_name="Y")
        if getattr(y, "ndim", 2) == 1:
            y = y.reshape(-1, 1)
        y = check_predict_input(y, self.n_features_y_, "Y")
        return xs, _scores(self.features_[1], self.y_components_, self.y_mean_, y)

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
            parts = da.compute(*parts)
        sxy, sxx, syy = (np.asarray(p) for p in parts)
        return sxy / np.sqrt(sxx * syy)

    def score(self, X: Any, y: Any = None) -> float:
        """Sum of the canonical correlations of the pairs of scores on views (X, y)."""
        return float(np.sum(self.canonical_correlations(X, y)))

    def _get_model_state(self) -> tuple[dict, dict]:
        self._check_fitted("x_components_")
        return (
            {
                "x_components": self.x_components_,
                "y_components": self.y_components_,
                "x_mean": self.x_mean_,
                "y_mean": self.y_mean_,
                "values": self._values(),
            },
            {"features": [f.to_dict() for f in self.features_], "step_size_": self.step_size_,
             "step_decay_": getattr(self, "step_decay_", None),
             **(self._width_meta() if self._method == "ksvd" else {}), **history_meta(self)},
        )

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        self._set_fitted(
            tuple(FeatureMap.from_dict(f) for f in meta["features"]),
            (arrays["x_components"], arrays["y_components"]),
            (arrays["x_mean"], arrays["y_mean"]),
            arrays["values"],
        )
        self.step_size_ = meta["step_size_"]
        if "step_decay_" in meta:  # models saved before step_decay="auto" lack it
            self.step_decay_ = meta["step_decay_"]
        if self._method == "ksvd":  # KernelCCA has one kind of step
            self._set_width_meta(meta)
        set_history(self, meta)


@documented
class KernelSVD(_TwoViewBase):

    __doc__ = f"""Kernel SVD of the cross-covariance operator E[k(x,.) (x) l(y,.)] by
    doubly stochastic gradients (Xie et al. 2015, Alg. 3), or by power steps
    on the whole pool (two-sided subspace iteration; ``steps``).

    Attributes
    ----------
    x_components_, y_components_ : ndarray (n_features_, n_components)
        Coefficients over each view's pool of the left / right singular
        functions.  As functions on the data they match a dense SVD of the same
        features; the coefficient vectors also carry SGD noise along directions
        the data barely excite, so they are not RKHS-orthonormal (see
        :class:`KernelPCA`'s ``components_``).
    singular_values_ : ndarray (n_components,)
{_DOC_POWER_ATTRIBUTES}    history_ : list of dict
        Per epoch: ``epoch``, ``steps``, ``rows``, ``seconds`` and ``covariance``,
        the sum of the singular values of the scores' cross-covariance on the
        epoch's mini-batches (block steps keep [U; V] jointly orthonormal,
        power steps each view: the block steps' figure is about half).
    """
    _method = "ksvd"

    def __init__(
        self,
        n_components: int = 4,
        *,
        kernel: str = "gaussian",
        bandwidth: float | str = "auto",
        kernel_y: str | None = None,
        bandwidth_y: float | str | None = None,
        n_features: int = 4096,
        block_size: int = 256,
        batch_size: int | str = "auto",
        n_epochs: int = 5,
        step_size: float | str = "auto",
        step_decay: float | str = "auto",
        center: bool = True,
        steps: str = "auto",
        lanes: int | str = "auto",
        random_state: int = 0,
        client: Any = None,
        verbose: bool = False,
        checkpoint: str | None = None,
        checkpoint_every: int = 0,
        resume: bool = False,
    ) -> None:
        self._store_params(locals())

    def _metrics(
        self, M: np.ndarray, A: np.ndarray, Bc: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        # Xie's KSVD is Oja's rule for [[0, C_yx], [C_xy, 0]]: at its fixed point the
        # stacked [U; V] is orthonormal, so each view has U^T U = V^T V = I / 2 (the
        # pool Gram is not used as the metric: see rotate_pca); a power step leaves
        # each view orthonormal on its own
        k = A.shape[1]
        scale = 1.0 if getattr(self, "steps_", "block") == "power" else 0.5
        return scale * np.eye(k), scale * np.eye(k)

    def _set_values(self, sv: np.ndarray) -> None:
        self.singular_values_ = sv

    def _values(self) -> np.ndarray:
        return self.singular_values_


#: Pool features used by KernelCCA's "subsample" start: the dense solve costs
#: O(init_rows D0^2 + D0^3), ~5 s for 8000 rows and D0 = 2048 on two cores.
_INIT_FEATURES = 2048
#: Eigenpairs computed for KernelCCA's preconditioner: q stops where the critical
#: batch reaches batch_size (q = 16 at 256 rows, 55 at 1024 on Fashion-MNIST halves).
_PRECONDITIONER_PAIRS = 128


@documented
class KernelCCA(_TwoViewBase):
    __doc__ = """Kernel CCA by doubly stochastic gradients (Xie et al. 2015, Alg. 4).

    As in scikit-learn's CCA, ``fit(X, Y)``; ``transform(X, Y)`` returns the
    pair (x_scores, y_scores).  ``canonical_correlations(X, Y)`` measures the
    correlation of each pair on held-out data; ``score`` is their sum.

    Attributes
    ----------
    x_components_, y_components_ : ndarray (n_features_, n_components)
    correlations_ : ndarray (n_components,)
        Regularised canonical correlations on the training data.
    history_ : list of dict
        Per epoch: ``epoch``, ``steps``, ``rows``, ``seconds`` and
        ``correlation``, the sum of the canonical correlations of the scores
        on the epoch's mini-batches.
    preconditioners_ : tuple of FeaturePreconditioner or None
        Per view (fit only, not saved): the top q+1 eigenvalues, q eigenvectors
        and q of the preconditioner; None without ``preconditioner``.
    """
    _method = "kcca"

    def __init__(
        self,
        n_components: int = 4,
        *,
        kernel: str = "gaussian",
        bandwidth: float | str = "auto",
        kernel_y: str | None = None,
        bandwidth_y: float | str | None = None,
        alpha: float = 1e-3,
        init: str = "subsample",
        init_rows: int = 8000,
        preconditioner: str | None = "eigenpro",
        n_features: int = 4096,
        block_size: int = 256,
        batch_size: int = 512,
        n_epochs: int = 5,
        step_size: float | str = "auto",
        step_decay: float | str = "auto",
        center: bool = True,
        lanes: int = 4,
        random_state: int = 0,
        client: Any = None,
        verbose: bool = False,
        checkpoint: str | None = None,
        checkpoint_every: int = 0,
        resume: bool = False,
    ) -> None:
        self._store_params(locals())

    def _metrics(
        self, M: np.ndarray, A: np.ndarray, Bc: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        k = A.shape[1]
        a = float(self.alpha)
        return M[:k, :k] + a * pool_gram(A), M[k:, k:] + a * pool_gram(Bc)

    def _start(
        self, data: Any, client: Any, features: tuple, n_blocks: int
    ) -> tuple[tuple[np.ndarray, ...] | None, tuple[FeaturePreconditioner, ...] | None]:
        """The start and the preconditioners, both from one sample of ``init_rows`` rows."""
        if self.init != "subsample" and self.preconditioner is None:
            return None, None
        rng = np.random.default_rng([self.random_state_, 0x1417])
        idx = np.sort(rng.choice(data.n_rows, size=min(data.n_rows, int(self.init_rows)),
                                 replace=False))
        if data.host is not None:
            Xs, Ys = data.host[0][idx], data.host[1][idx]
        else:
            Xs, Ys = client.compute([data.X[idx], data.y[idx]], sync=True)
        Xs, Ys = np.asarray(Xs, dtype=features[0].dtype), np.asarray(Ys, dtype=features[1].dtype)
        init = self._initial(Xs, Ys, features, n_blocks) if self.init == "subsample" else None
        pre = None
        if self.preconditioner is not None:
            pre = tuple(self._preconditioner(client, S, f, n_blocks)
                        for S, f in zip((Xs, Ys), features))
        return init, pre

    def _preconditioner(
        self, client: Any, S: np.ndarray, features: FeatureMap, n_blocks: int
    ) -> FeaturePreconditioner:
        """EigenPro-RF's preconditioner (tau = 1) from the top eigenpairs of the
        (centred) pool covariance on the sampled rows; q is the largest with
        critical batch beta / lambda_q + 1 <= batch_size (Ma & Belkin: larger q
        buys nothing beyond the batch)."""
        pre, _, _ = feature_preconditioner(
            Engine(client, self._engine_options()), S, features, n_blocks, _PRECONDITIONER_PAIRS,
            int(self.batch_size), 1.0, self.random_state_, center=bool(self.center),
            dtype="float64", label=f"kcca preconditioner (view {features.stream})")
        return pre

    def _initial(
        self, Xs: np.ndarray, Ys: np.ndarray, features: tuple, n_blocks: int
    ) -> tuple[np.ndarray, ...] | None:
        """Exact regularised CCA on ``init_rows`` sampled rows and the pool's first
        blocks (up to ``_INIT_FEATURES`` features), as pool coefficients.

        Xie's iteration moves along the i-th eigenfunction of C_XX at a speed
        ~ eta lambda_i (eta <= ~1 / lambda_1), so the canonical functions that
        live in low-variance directions take thousands of steps from a random
        start; a small exact solve puts them close and the stochastic steps
        then refine over all the data and the whole pool.
        """
        fx, fy = features
        B = fx.block_size
        nb0 = max(1, min(n_blocks, _INIT_FEATURES // B))
        if int(self.n_components) > nb0 * B:
            return None
        Fx = fx.transform(Xs, nb0)
        Fy = fy.transform(Ys, nb0)
        k = int(self.n_components)
        _, _, Wx, Wy = regularized_cca(Fx, Fy, float(self.alpha) or 1e-6, k)
        # z = phi / sqrt(D0) on the first nb0 blocks: scores z W = phi (W / sqrt(D0))
        scale = 1.0 / np.sqrt(nb0 * B)
        return Wx * scale, Wy * scale

    def _set_values(self, sv: np.ndarray) -> None:
        self.correlations_ = sv

    def _values(self) -> np.ndarray:
        return self.correlations_
