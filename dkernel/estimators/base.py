"""What every dkernel estimator shares: the scikit-learn parameter contract,
engine options, bandwidth resolution, label discovery and lazy prediction."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np

from dkernel.data.dataset import Dataset, open_dataset
from dkernel.data.validate import check_positive
from dkernel.engine import EngineOptions
from dkernel.kernels import median_heuristic
from dkernel.kernels.exact import check_kernel

# Rows sampled for bandwidth="auto": the median of ~500k pairwise distances is
# stable to a few percent and costs milliseconds.
_BANDWIDTH_SAMPLE = 1000


class NotFittedError(ValueError, AttributeError):
    """Raised when predict/transform is called before fit."""


class BaseEstimator:
    """scikit-learn contract: ``__init__`` stores parameters verbatim, learned
    state ends in ``_``, ``fit`` returns self; get_params/set_params/clone work."""

    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p for p in sig.parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._param_names()}

    def set_params(self, **params: Any) -> BaseEstimator:
        valid = self._param_names()
        for k, v in params.items():
            if k not in valid:
                raise ValueError(f"{type(self).__name__} has no parameter {k!r}; valid: {', '.join(valid)}")
            setattr(self, k, v)
        return self

    def __repr__(self) -> str:
        defaults = {k: p.default for k, p in inspect.signature(type(self).__init__).parameters.items()}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items()
                   if k in defaults and not _same(v, defaults[k])]
        return f"{type(self).__name__}({', '.join(changed)})"

    def _check_fitted(self, attr: str) -> None:
        if not hasattr(self, attr):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")

    def _engine_options(self) -> EngineOptions:
        return EngineOptions(
            lanes=getattr(self, "lanes", 4), checkpoint=getattr(self, "checkpoint", None),
            checkpoint_every=getattr(self, "checkpoint_every", 0),
            resume=getattr(self, "resume", False), progress=bool(getattr(self, "verbose", False)))

    def save(self, path: str) -> None:
        """Save the fitted model (``.npz`` + JSON metadata, no pickle)."""
        from dkernel.io import save_model

        save_model(self, path)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return a is b


def check_common_params(est: Any) -> None:
    """Hyper-parameter checks shared by the estimators, before any work."""
    check_kernel(est.kernel)
    if not (isinstance(est.bandwidth, str) and est.bandwidth == "auto"):
        check_positive("bandwidth", est.bandwidth)
    for name in ("n_features", "batch_size", "n_epochs"):
        if hasattr(est, name) and not (name == "batch_size" and est.batch_size == "auto"):
            check_positive(name, getattr(est, name), integer=True)
    if hasattr(est, "alpha"):
        check_positive("alpha", est.alpha, allow_zero=True)
    if not isinstance(est.random_state, (int, np.integer)) or isinstance(est.random_state, bool) \
            or est.random_state < 0:
        raise ValueError(f"random_state must be a non-negative integer seed, got {est.random_state!r}")


#: A sample is drawn from at most this many chunks (picked at random), so its
#: cost does not grow with the store: 12k rows from a 10 TB store read 64
#: chunks, not all of them.
_SAMPLE_CHUNKS = 64


def sample_index(data: Dataset, random_state: int, size: int, domain: int) -> np.ndarray:
    """Sorted indices of ``min(size, n)`` distinct rows: uniform over the rows
    when the data has at most ``_SAMPLE_CHUNKS`` chunks (or is in memory),
    else uniform over the rows of ``_SAMPLE_CHUNKS`` chunks drawn at random."""
    n = data.n_rows
    rng = np.random.default_rng([int(random_state), int(domain)])
    if data.host is not None or data.n_chunks <= _SAMPLE_CHUNKS:
        return np.sort(rng.choice(n, size=min(n, size), replace=False))
    offsets = data.row_offsets()
    chunks = np.sort(rng.choice(data.n_chunks, size=_SAMPLE_CHUNKS, replace=False))
    pool = np.concatenate([np.arange(offsets[c], offsets[c + 1]) for c in chunks])
    return np.sort(rng.choice(pool, size=min(len(pool), size), replace=False))


def sample_rows(data: Dataset, random_state: int, client: Any, size: int = _BANDWIDTH_SAMPLE) -> np.ndarray:
    """A seeded random sample of rows of X, gathered by the cluster (one small read)."""
    idx = sample_index(data, random_state, size, 0xBA4D)
    if data.host is not None:
        sample = np.asarray(data.host[0][idx], dtype=np.float64)
    else:
        sample = np.asarray(client.compute(data.X[idx]).result(), dtype=np.float64)
    bad = ~np.isfinite(sample).all(axis=1)
    if bad.any():
        raise ValueError(
            f"X contains NaN or infinity in {int(bad.sum())} sampled row(s) "
            f"(first bad row: {int(idx[bad][0])}); drop or impute those rows before fitting")
    return sample


def resolve_bandwidth(bandwidth: Any, kernel: str, sample: np.ndarray) -> float:
    """A numeric bandwidth as given, or the median heuristic on ``sample``."""
    if not (isinstance(bandwidth, str) and bandwidth == "auto"):
        return float(bandwidth)
    return median_heuristic(sample, kernel)


def discover_classes(data: Dataset, client: Any) -> np.ndarray:
    """Sorted label set of y (y is small next to X, so this is one cheap pass)."""
    if data.y is None:
        raise ValueError("classification needs targets y")
    if data.y.ndim == 2 and data.y.shape[1] != 1:
        raise ValueError(f"classification targets must be one label per row, got y of shape {data.y.shape}")
    if data.host is not None:
        classes = np.unique(data.host[1])
    else:
        classes = client.compute(da.unique(data.y.reshape(-1))).result()
    if classes.dtype.kind == "f" and not np.all(np.mod(classes, 1) == 0):
        bad = classes[np.mod(classes, 1) != 0][0]
        raise ValueError(
            f"classification labels must be whole numbers, found {bad!r} among {classes.size} "
            "distinct values; use a regressor (--task regression) for continuous targets"
        )
    if classes.size < 2:
        raise ValueError(
            f"y has a single class ({classes[0]!r}); classification needs at least two classes"
        )
    return classes


def check_predict_input(X: Any, n_inputs: int, name: str = "X") -> Any:
    """Open X for prediction: a NumPy or dask array with the fitted width."""
    if isinstance(X, (str,)) or hasattr(X, "__fspath__"):
        X = open_dataset(X).X
    if isinstance(X, (list, tuple)):
        X = np.asarray(X)
    if getattr(X, "ndim", None) != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape {getattr(X, 'shape', None)}")
    if X.shape[1] != n_inputs:
        raise ValueError(
            f"{name} has {X.shape[1]} features but the model was fitted on {n_inputs}; "
            "predict on data with the same columns as the training data"
        )
    if isinstance(X, np.ndarray):
        open_dataset(X)  # dtype / emptiness / NaN checks
    return X


def apply_rows(fn: Callable[[Any], Any], X: Any, n_out: int | None, dtype: Any,
               tile_rows: int = 4096) -> Any:
    """Apply a row-wise function: lazily (map_blocks) on dask input, tile by tile on NumPy."""
    if isinstance(X, da.Array):
        if len(X.chunks[1]) > 1:
            X = X.rechunk({1: -1})
        if n_out is None:
            return X.map_blocks(fn, drop_axis=1, dtype=dtype)
        return X.map_blocks(fn, chunks=(X.chunks[0], (n_out,)), dtype=dtype)
    parts = [fn(X[i : i + tile_rows]) for i in range(0, X.shape[0], tile_rows)]
    return np.concatenate(parts, axis=0)
