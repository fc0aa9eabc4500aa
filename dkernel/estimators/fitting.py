"""The fit skeleton every estimator shares: check the parameters, validate the
input, resolve the seed, open the data, connect, sample rows, pick the
bandwidth, build the Engine, run the steps under the epoch monitor and keep
the history and the step back-offs.  An estimator's ``fit`` is then what is
its own: the program it builds and the state it keeps."""

from __future__ import annotations

import functools
import math
import textwrap
import threading
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np

from dkernel._stack import user_stacklevel
from dkernel.data.dataset import Dataset, open_dataset
from dkernel.engine import Engine, connect
from dkernel.engine import cache as worker_cache
from dkernel.engine.checkpoint import CACHE, saved_setting
from dkernel.engine.chunks import worker_rows
from dkernel.engine.cluster import require_workers
from dkernel.engine.progress import phase
from dkernel.estimators.base import resolve_random_state, validate_fit_input
from dkernel.estimators.history import EpochMonitor, split_validation
from dkernel.estimators.sampling import _BANDWIDTH_SAMPLE, resolve_bandwidth, sample_rows
from dkernel.features import POOL_ROWS, FeatureMap, pool_error
from dkernel.kernels import median_heuristic

#: A bandwidth under this fraction of the median heuristic puts the kernel of
#: nearly every pair of rows at 0: the exact kernel's model is the mean off
#: the training rows, and a random-feature model of it noise (0.01x: held-out
#: R^2 -1.35 for EigenPro-RF, -0.52 for DSG, where kernel ridge gets -0.007).
_NARROW = 0.05

#: Above this relative spectral error of the pool's Gram against the exact
#: kernel (:func:`~dkernel.features.pool_error`, on the fit's sample), at a
#: bandwidth under the median heuristic, the fit warns.  Measured on the
#: quality matrix's data: its random-feature cells at 0.25x the median
#: heuristic, every one short of the exact kernel's model, 0.17-0.49 at their
#: default pools; every cell that passes, 0.041 at most.  Not a sharp line
#: below it: with 16384 features at 0.25x (0.10) DSGRegressor, DSGClassifier and
#: KernelCCA pass and KernelPCA, KernelSVD and DSGOneClassSVM still miss, and at 0.35x
#: (0.105) DSGRegressor and KernelPCA pass, DSGClassifier misses; a lower bar
#: would warn about passing fits.
_POOL_ERROR = 0.13
#: the n_features the warning suggests is the pool that brings the measured
#: error down to this, by its 1/sqrt(D) Monte-Carlo scaling: at 0.25x, 0.10
#: (16384 features) passed DSG and 0.07 (32768) KernelPCA too; StreamingKernelPCA,
#: KernelSVD and DSGOneClassSVM missed even there (a wider bandwidth or the
#: kernel form then)
_POOL_TARGET = 0.07


def feature_error_doc(note: str = "") -> str:
    """The Attributes entry of ``feature_error_``, which every estimator on a
    random-feature pool records (:meth:`FitContext.feature_map`)."""
    note = f"; {note}" if note else ""
    return textwrap.indent(textwrap.fill(
        "How far the Gram matrix of the random-feature pool is from the exact kernel's on "
        f"up to {POOL_ROWS} rows of the fit's sample: the spectral norm of their "
        f"difference over the kernel's (``dkernel.features.pool_error``{note}).  At a "
        f"bandwidth under the median heuristic, more than {_POOL_ERROR} is warned about "
        "with the n_features that would suffice.", 70), " " * 8).join(
            ["    feature_error_ : float\n", "\n"])


#: id(estimator) -> [the thread fitting it, its depth of nested fit calls]
_FITTING: dict[int, list] = {}
_FITTING_LOCK = threading.Lock()


def one_fit_at_a_time(fit: Callable) -> Callable:
    """Refuse a second ``fit`` of an estimator that another thread is fitting.
    Both fits set the same attributes: two threads that fitted one
    DSGRegressor at once left it holding one fit's coefficients and the
    other's ``random_state_`` and ``n_features_in_``, with no error.  A fit
    calling ``fit`` again on its own thread (a subclass's) is let through."""
    @functools.wraps(fit)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        me = threading.current_thread()
        with _FITTING_LOCK:
            holder = _FITTING.setdefault(id(self), [me, 0])
            if holder[0] is not me:
                raise RuntimeError(
                    f"this {type(self).__name__} is already being fitted by thread "
                    f"{holder[0].name!r}; two fits of one estimator at once would mix their "
                    "models: fit a copy in each thread (sklearn.base.clone(estimator))")
            holder[1] += 1
        try:
            return fit(self, *args, **kwargs)
        finally:
            with _FITTING_LOCK:
                holder[1] -= 1
                if not holder[1]:
                    del _FITTING[id(self)]
    return wrapper


class FitContext:
    """One fit: ``with FitContext(est, X, y, target=...) as fit:``.

    Before the ``with`` body (and before any cluster) the estimator's
    parameters are checked (``est._check_params()``), ``X`` and ``y`` go
    through :func:`~dkernel.estimators.base.validate_fit_input`,
    ``random_state_`` is resolved and the data opened (``fit.data``;
    ``fit.labels`` the class labels of in-memory targets).  Inside it,
    ``fit.client`` and ``fit.engine`` are live.

    Parameters
    ----------
    est : BaseEstimator
    X, y : array, DataFrame, dask array or store path
    target : {"classification", "regression", "view", "none"}
        What y is (see :func:`~dkernel.estimators.base.validate_fit_input`).
    dtype : list of dtypes, optional
        dtypes in-memory X may keep (default: float32 and float64).
    """

    def __init__(self, est: Any, X: Any, y: Any = None, *, target: str,
                 dtype: list | None = None, name: str = "X") -> None:
        est._check_params()
        # a refit starts unfitted: attributes of the last fit's route (EigenPro's
        # centers_ after a refit on features) no longer describe the model
        _unfit(est)
        X, y, self.labels = validate_fit_input(est, X, y, target=target, dtype=dtype)
        self.X = X  # as validated (a second sample is checked against it: DSGDensityRatio)
        if "random_state" in est.get_params(deep=False):
            est.random_state_ = resolve_random_state(est.random_state)
        self.est = est
        self.seed: int = getattr(est, "random_state_", 0)
        if target == "none":
            self.data = open_dataset(X, name=name)
            self.data.y = None
        else:
            self.data = open_dataset(X, y, require_y=True)
        self.val: Dataset | None = None
        self._stack = ExitStack()
        self._precision_checked = False  # (warn_if_float32_loses: once a fit)
        #: a bandwidth -> (its sample, kernel, the median heuristic when "auto" chose
        #: it): feature_map compares it with the sample's median heuristic and checks
        #: the pool on the sample (only feature routes pay for that)
        self._given: dict[float, tuple[np.ndarray, str, float | None]] = {}

    def __enter__(self) -> FitContext:
        # (verbose: a line after each 10 s in which no progress line was printed)
        self._stack.enter_context(phase(f"{type(self.est).__name__} fit",
                                        bool(getattr(self.est, "verbose", False))))
        self.client = self._stack.enter_context(connect(self.est.client))
        self.engine = Engine(self.client, self.est._engine_options())
        return self

    def __exit__(self, *exc: Any) -> bool | None:
        if exc[0] is not None:  # a failed fit leaves no half of a model (classes_ without
            _unfit(self.est)  # coef_ passed for fitted: pickling then dropped its client)
        engine = getattr(self, "engine", None)
        try:
            if engine is not None:  # its cached blocks stay, evictable (cache.retire)
                engine.retire()
        except BaseException:  # (a Ctrl-C during it still closes the cluster connect() started)
            self._stack.__exit__(*exc)
            raise
        return self._stack.__exit__(*exc)

    # sampling and the kernel ---------------------------------------------------------
    def sample(self, size: int = _BANDWIDTH_SAMPLE, data: Dataset | None = None) -> np.ndarray:
        """A seeded sample of ``size`` rows of X (one small read on the cluster)."""
        rows = sample_rows(data or self.data, self.seed, self.client, size=size)
        if self.engine.options.dtype == "float32" and not self._precision_checked:
            self._precision_checked = True
            warn_if_float32_loses(rows)
        return rows

    def sample_while(self, work: Callable[[], Any], size: int = _BANDWIDTH_SAMPLE
                     ) -> tuple[np.ndarray | None, Any]:
        """(sample, ``work()``): a pass over y (its mean or classes) runs on the
        cluster while the sample is read (none for ``size=0``); both are fixed
        costs of every fit."""
        # a daemon thread, not an executor: an executor's exit (and the
        # interpreter's) joins its thread, so Ctrl-C or SIGTERM during a pass
        # that waited on a cluster without workers could not end the process
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = work()
            except BaseException as err:  # handed to the caller's thread
                box["error"] = err

        thread = threading.Thread(target=run, name="dkernel-pass-over-y", daemon=True)
        thread.start()
        rows = self.sample(size) if size else None
        thread.join()
        if "error" in box:
            raise box["error"]
        return rows, box["value"]

    def bandwidth(self, sample: np.ndarray | None, bandwidth: Any = None,
                  kernel: str | None = None) -> float:
        """The estimator's ``bandwidth`` (or the one given) as a number: the
        median heuristic on ``sample`` for "auto"."""
        est = self.est
        given, kernel = est.bandwidth if bandwidth is None else bandwidth, kernel or est.kernel
        value = resolve_bandwidth(given, kernel, sample)
        if sample is not None and len(sample) > 1:  # (feature_map checks the pool on it)
            self._given[value] = (sample, kernel, value if isinstance(given, str) else None)
        return value

    def feature_map(self, bandwidth: float, n_inputs: int | None = None, *, kernel: str = "",
                    stream: int = 0, block_size: int | None = None) -> tuple[FeatureMap, int]:
        """(seeded feature map, number of blocks) of ``n_features`` features in
        blocks of ``block_size`` (at most n_features; the pool is rounded up to
        whole blocks).

        On the sample the bandwidth was chosen or checked on, the pool's Gram
        is compared with the exact kernel's (:func:`~dkernel.features.pool_error`,
        recorded as ``feature_error_``, the largest of a fit's views); under
        the median heuristic, an error above ``_POOL_ERROR`` is warned about
        with the n_features that would bring it to ``_POOL_TARGET``."""
        est = self.est
        sample, given_kernel, median = self._given.pop(float(bandwidth), (None, "", None))
        try:  # ("auto" kept the median it is)
            if median is None and sample is not None:
                median = median_heuristic(sample, given_kernel)
        except ValueError:  # (identical rows: no scale to compare with)
            median = None
        B = min(int(block_size or est.block_size), int(est.n_features))
        features = FeatureMap(kernel or est.kernel, bandwidth,
                              self.data.n_inputs if n_inputs is None else n_inputs, B,
                              self.seed, stream=stream)
        n_blocks = math.ceil(int(est.n_features) / B)
        error = None if sample is None else pool_error(features, n_blocks, sample, self.seed)
        if error is not None:
            est.feature_error_ = max(error, getattr(est, "feature_error_", None) or 0.0)
        if median is not None and bandwidth < _NARROW * median:
            ratio = bandwidth / median
            warnings.warn(
                f"bandwidth={bandwidth:.4g} is {ratio:.2g}x the median heuristic of the rows "
                f"({median:.4g}): random features alias at that width and predict noise off "
                "the training rows (held-out R^2 -0.5 where the exact kernel predicts the "
                "mean); widen the bandwidth, or use the kernel form (EigenPro without "
                "n_features)", UserWarning, stacklevel=user_stacklevel())
        elif median is not None and bandwidth < median and error is not None and \
                error > _POOL_ERROR:
            D = n_blocks * B
            need = math.ceil(D * (error / _POOL_TARGET) ** 2 / B) * B
            warnings.warn(
                f"bandwidth={bandwidth:.4g} is {bandwidth / median:.2g}x the median "
                f"heuristic of the rows ({median:.4g}): the {D} random features' Gram misses "
                f"the exact kernel's by {error:.2f} of its norm on the sampled rows "
                f"(feature_error_), and each model in docs/quality.md whose pool missed it by "
                f"more than {_POOL_ERROR} fell short of the exact kernel's; use n_features >= "
                f"{need} (measured to bring it to "
                f"{_POOL_TARGET}), a wider bandwidth, or the kernel form (EigenPro without "
                "n_features)", UserWarning, stacklevel=user_stacklevel())
        return features, n_blocks

    # steps -------------------------------------------------------------------------
    def hold_out(self) -> None:
        """With ``early_stopping``: hold out ``validation_fraction`` of the rows
        (``self.val``) and train on the rest (``self.data``)."""
        if getattr(self.est, "early_stopping", False):
            self.data, self.val = split_validation(self.data, self.est.validation_fraction,
                                                   self.seed)

    def feature_cache(self, n_features: int, n_epochs: int | None = None) -> str:
        """Resolve ``feature_cache`` for a pool of ``n_features`` features a row
        (all views), record it as ``feature_cache_`` and return the mode.

        "auto": "off" for one epoch (every block is read once); else float32
        when every worker's share of the blocks, plus its rows of X (kept on
        the worker for the fit, :meth:`run_steps`), fits its headroom
        (:func:`dkernel.engine.cache.headroom`), else fixed16 if that fits, else
        "off" -- a store larger than the cluster streams as it always did.
        "float32" / "fixed16" as given keep the blocks that fit and regenerate
        the rest.  ``self.keep_chunks`` says whether everything fits."""
        est = self.est
        epochs = int(est.n_epochs if n_epochs is None else n_epochs)
        choice = getattr(est, "feature_cache", "auto")
        # (empty while every worker restarts, ``--lifetime``: "auto" then reached the
        # workers unresolved, a KeyError there)
        nthreads = self.client.nthreads() or _after_workers(self.client)
        self.keep_chunks = False
        mode = "off" if choice == "auto" and epochs <= 1 else choice
        resumed = self.resumed_setting(CACHE) if choice == "auto" else None
        if resumed is not None:  # a resume goes on as it began: the model depends on it
            mode = str(resumed)
        if mode != "off" and nthreads:
            rows = max(worker_rows(nthreads, self.data.row_chunks).values())
            room = min(worker_cache.budgets(self.client).values())
            x_bytes = rows * self.data.n_inputs * 4
            fits = {m: rows * int(n_features) * b + x_bytes <= room
                    for m, b in (("float32", 4), ("fixed16", 2))}
            if mode == "auto":
                mode = next((m for m in ("float32", "fixed16") if fits[m]), "off")
            self.keep_chunks = mode != "off" and fits[mode] and epochs > 1
        mode = "off" if mode == "auto" else mode
        est.feature_cache_ = mode
        return mode

    def resumed_setting(self, key: str) -> Any:
        """``key`` of the checkpoint this fit resumes from (its fingerprint);
        None when it starts afresh."""
        options = self.engine.options
        return saved_setting(options.checkpoint, key) if options.resume else None

    def run_steps(self, program: Any, batch_size: int, *,
                  evaluate: Callable[[dict], float] | None = None,
                  extra: Callable[[dict], dict] | None = None, **kwargs: Any) -> dict:
        """``n_epochs`` of synchronous steps under the epoch monitor; the
        estimator keeps ``history_``, ``step_backoffs_`` and, with validation,
        ``validation_scores_`` and ``best_epoch_``.  Returns the kept state (the
        best epoch's with validation)."""
        est = self.est
        monitor = EpochMonitor(self.engine, program, evaluate,
                               int(getattr(est, "n_iter_no_change", 2)), extra)
        kwargs.setdefault("keep_chunks", getattr(self, "keep_chunks", False))
        state = self.engine.run_steps(self.data, program, n_epochs=int(est.n_epochs),
                                      batch_size=int(batch_size), random_state=self.seed,
                                      on_epoch=monitor, **kwargs)
        est.step_backoffs_ = list(self.engine.backoffs)
        est.history_ = monitor.history()
        est.validation_scores_ = [e["validation_score"] for e in est.history_
                                  if "validation_score" in e]
        est.best_epoch_ = monitor.best_epoch
        return monitor.final_state(state)


def _unfit(est: Any) -> None:
    """Remove the fitted attributes (scikit-learn's: a name ending in _)."""
    params = est.get_params(deep=False)
    for attr in [a for a in vars(est) if a.endswith("_") and not a.startswith("_")
                 and a not in params]:
        delattr(est, attr)


def warn_if_float32_loses(sample: np.ndarray) -> None:
    """Warn when a column of X sits so far from 0 against its spread that the
    fit's float32 rounds its values by more than 1% of it: the features and
    kernel rows are computed in float32, and 3 columns at 1e8 + N(0, 1) gave
    DSGRegressor a test R^2 of -0.03 without a word.  Centring fixes it."""
    if sample.shape[0] < 2:
        return
    center, spread = np.abs(sample.mean(axis=0)), sample.std(axis=0)
    top = np.abs(sample).max(axis=0)
    gap = top * 2.0**-23  # float32's spacing at the column's values
    # a spread within float64's rounding of the values is a constant column (one
    # StandardScaler made constant in the sample, std 1e-17): float32 loses nothing
    # of it, and the advice to subtract the means came after the user had
    varies = spread > top * 2.0**-40
    lost = np.flatnonzero(varies & (gap > 0.01 * spread))
    if lost.size:
        j = int(lost[np.argmax(gap[lost] / spread[lost])])
        warnings.warn(
            f"column {j} of X sits at {center[j]:.3g} with a spread of {spread[j]:.3g}: the fit "
            f"computes in float32, whose values there are {gap[j]:.2g} apart, and "
            f"{lost.size} column(s) lose more than 1% of their spread so; subtract the column "
            "means (e.g. scikit-learn's StandardScaler) before fitting", UserWarning,
            stacklevel=user_stacklevel())


def _after_workers(client: Any) -> dict:
    """The cluster's threads once it has a worker again (:func:`require_workers`)."""
    require_workers(client)
    return client.nthreads()
