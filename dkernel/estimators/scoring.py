"""Scoring: R^2 and accuracy over in-memory or lazy targets, with the row,
output-count and label-kind checks scikit-learn's metrics make."""

from __future__ import annotations

import math
import os
from typing import Any

import dask.array as da
import numpy as np
from sklearn.utils.multiclass import type_of_target

from dkernel._stack import user_stacklevel
from dkernel.data.dataset import open_dataset
from dkernel.engine.stall import compute


def score_targets(X: Any, y: Any) -> tuple[Any, Any]:
    """(X, y) for score: y may be omitted when X is a store path holding ``y``."""
    if y is not None:
        return X, y
    if isinstance(X, (str, os.PathLike)):
        data = open_dataset(X)
        if data.y is None:
            raise ValueError(f"score needs targets: pass y, or use a store with an array 'y' "
                             f"({os.fspath(X)})")
        return data.X, data.y
    raise ValueError("score needs targets y (or a store path whose array 'y' holds them)")


def check_same_rows(a: Any, b: Any, a_name: str = "y", b_name: str = "X") -> None:
    """Refuse ``a`` and ``b`` of different known row counts, naming both (numpy's
    own message was "operands could not be broadcast together")."""
    def rows(v: Any) -> float:
        shape = getattr(v, "shape", None)
        if shape is None:
            return len(v)
        return shape[0] if len(shape) else 1  # (a dask array of unknown chunks: NaN)
    n_a, n_b = rows(a), rows(b)
    if not (math.isnan(n_a) or math.isnan(n_b)) and n_a != n_b:
        raise ValueError(f"{a_name} has {n_a} rows but {b_name} has {n_b}; "
                         f"pass the {a_name} of {b_name}'s rows")


def _as_targets(y: Any, p: Any) -> Any:
    """y as an array shaped like the prediction p (dask stays lazy)."""
    if not isinstance(y, da.Array):
        y = np.asarray(y)
    check_same_rows(y, p)
    if y.ndim == 2 and y.shape[1] == 1 and p.ndim == 1:
        y = y[:, 0]
    if y.ndim not in (1, 2):
        raise ValueError(f"y has shape {y.shape}; score takes 1-D targets, or 2-D with one "
                         "column per output")
    outputs = [1 if a.ndim == 1 else a.shape[1] for a in (y, p)]
    if outputs[0] != outputs[1]:
        raise ValueError(f"y has {outputs[0]} column(s) but the model predicts {outputs[1]} "
                         "output(s); score it on targets of the outputs it was fitted on")
    return y


def r2_sums(y: Any, p: Any) -> tuple[np.ndarray, np.ndarray]:
    """(SS_res, SS_tot) of each output, in one pass for lazy inputs (reduced on
    the cluster); a non-finite sum stops with the input it came from named."""
    y = _as_targets(y, p).astype(np.float64)
    ss_res = ((y - p) ** 2).sum(axis=0)
    ss_tot = ((y - y.mean(axis=0)) ** 2).sum(axis=0)
    if isinstance(ss_res, da.Array):
        ss_res, ss_tot = compute(ss_res, ss_tot)
    return _finite_sums(np.atleast_1d(ss_res), np.atleast_1d(ss_tot))


def r2_sums_by_chunk(y: Any, p: Any, progress: bool,
                     shift: Any = 0.0) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`r2_sums` of lazy y and p a row chunk at a time
    (:func:`~dkernel.engine.progress.chunkwise`, a progress line when
    ``progress``), and the row count: each chunk's rows, SS_res, and y's mean
    and sum of squared deviations, pooled as Chan, Golub & LeVeque (1979) do,
    so y is read once.  ``shift``, a value near y's mean (the model's training
    mean), is taken off y first: each chunk's mean carries rounding in
    proportion to y's offset (1e12 + x: SS_tot 2e-6 off without it)."""
    from dkernel.engine.progress import chunkwise

    y = _as_targets(y, p)
    k = 1 if p.ndim == 1 else int(p.shape[1])

    shift = np.asarray(shift, dtype=np.float64).reshape(-1)

    def partial(yb: np.ndarray, pb: np.ndarray) -> np.ndarray:
        yb = yb.astype(np.float64)
        residual = pb.astype(np.float64) - yb  # before y is shifted
        return np.concatenate([(residual ** 2).sum(axis=0), chunk_moments(yb - shift)])

    parts = chunkwise(partial, [y, p], 1 + 3 * k, "evaluate", progress)
    rows, _, ss_tot = pooled_moments(parts[:, k:])
    return (*_finite_sums(parts[:, :k].sum(axis=0), ss_tot), rows)


def chunk_moments(z: np.ndarray) -> np.ndarray:
    """A chunk's rows, column means and sums of squared deviations, in one
    vector (zeros for no rows: an empty chunk's NaN mean spoiled the pool)."""
    z = z.astype(np.float64)
    if not len(z):
        return np.zeros(1 + 2 * z.shape[1])
    mean = z.mean(axis=0)
    return np.concatenate([[len(z)], mean, ((z - mean) ** 2).sum(axis=0)])


def pooled_moments(parts: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """(rows, mean, sum of squared deviations) of the rows of every chunk, from
    their :func:`chunk_moments` stacked (Chan, Golub & LeVeque 1979), so the
    data is read once."""
    k = (parts.shape[1] - 1) // 2
    n, means, m2 = parts[:, :1], parts[:, 1:1 + k], parts[:, 1 + k:]
    with np.errstate(invalid="ignore", over="ignore"):
        mean = (n * means).sum(axis=0) / max(float(n.sum()), 1.0)
        return int(n.sum()), mean, m2.sum(axis=0) + (n * (means - mean) ** 2).sum(axis=0)


def _finite_sums(ss_res: np.ndarray, ss_tot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not np.isfinite(ss_tot).all():
        raise ValueError("y contains NaN or infinity (or its values overflow float64); drop "
                         "those rows before scoring")
    if not np.isfinite(ss_res).all():
        raise ValueError("the predictions contain NaN or infinity (or overflow float64 against "
                         "y): the model is not usable; refit it (its step_backoffs_ and "
                         "history_ show whether the fit diverged)")
    return ss_res, ss_tot


def r2_score_any(y: Any, p: Any) -> float:
    """R^2 = 1 - SS_res / SS_tot of each output, averaged over the outputs as
    scikit-learn's ``r2_score`` (``RegressorMixin.score``) does, a constant
    output scoring 1 when predicted exactly and 0 otherwise; lazy inputs are
    reduced on the cluster.  Fewer than two rows: NaN with scikit-learn's
    ``UndefinedMetricWarning`` (an empty input scored 1.0)."""
    n = _as_targets(y, p).shape[0]
    if isinstance(n, (int, np.integer)) and n < 2:  # (a lazy y of unknown length: nan)
        import warnings

        from sklearn.exceptions import UndefinedMetricWarning

        warnings.warn(f"R^2 score is not well-defined with less than two samples ({n} here)",
                      UndefinedMetricWarning, stacklevel=user_stacklevel())
        return float("nan")
    return r2_from_sums(*r2_sums(y, p))


def r2_from_sums(ss_res: np.ndarray, ss_tot: np.ndarray) -> float:
    """R^2 averaged over outputs from :func:`r2_sums`."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = np.where(ss_tot > 0, 1 - ss_res / ss_tot, np.where(ss_res == 0, 1.0, 0.0))
    return float(np.mean(r2))


def accuracy_any(y: Any, p: Any, classes: Any = None) -> float:
    """Mean accuracy; lazy inputs are reduced on the cluster.  With the model's
    ``classes``, targets that cannot be its labels are refused as scikit-learn's
    metrics refuse them (continuous values, or strings against numeric classes
    and the reverse) instead of scoring 0."""
    y = _as_targets(y, p).reshape(-1)
    if classes is not None:
        _check_score_labels(y, np.asarray(classes))
    acc = (p == y).mean()
    if not isinstance(acc, da.Array):
        return float(acc)
    if classes is None or y.dtype.kind != "f":
        return float(compute(acc)[0])
    # a lazy y is checked in the same pass: NaN, infinity or a fraction outside
    # the classes only ever counted as a wrong prediction (NaN rows scored 0.37)
    odd = (~da.isin(y, np.asarray(classes)) & ((y != da.floor(y)) | ~da.isfinite(y))).sum()
    acc, odd = compute(acc, odd)
    if odd:
        raise ValueError(
            f"y holds {int(odd)} value(s) that are no label (NaN, infinity, or fractions outside "
            f"the classes {np.asarray(classes).tolist()[:10]}); drop those rows, or score "
            "a continuous target with a regressor")
    return float(acc)


def _check_score_labels(y: Any, classes: np.ndarray) -> None:
    numeric = classes.dtype.kind in "iufb"
    if numeric != (y.dtype.kind in "iufb"):
        raise ValueError(
            f"y holds {y.dtype} values but the classifier's classes are {classes.tolist()[:10]}; "
            "score it on targets of the same kind as its labels")
    if isinstance(y, da.Array) or type_of_target(y) not in ("continuous", "continuous-multioutput"):
        return
    outside = ~np.isin(y, classes)
    if outside.any():
        raise ValueError(
            f"y is continuous ({int(outside.sum())} value(s) such as {y[outside][0]!r} are not "
            f"among the classes {classes.tolist()[:10]}); a classifier is scored on its labels "
            "(a continuous target needs a regressor)")


def weighted_score(kind: str, y: Any, p: Any, sample_weight: Any, classes: Any = None) -> float:
    """scikit-learn's ``score(X, y, sample_weight)``: R^2 (``kind="r2"``) or
    accuracy with one weight per row, for input in memory."""
    if any(isinstance(a, da.Array) for a in (y, p, sample_weight)):
        raise ValueError("sample_weight with lazy (dask or store) input is not supported: score "
                         "in-memory arrays, or leave sample_weight out")
    from sklearn.metrics import accuracy_score, r2_score

    y = _as_targets(y, p)
    w = np.asarray(sample_weight, dtype=np.float64)
    if w.shape != (y.shape[0],):
        raise ValueError(f"sample_weight has shape {w.shape}; score takes one weight per row "
                         f"({y.shape[0]})")
    if kind == "r2":
        return float(r2_score(y, p, sample_weight=w))
    if classes is not None:
        _check_score_labels(y.reshape(-1), np.asarray(classes))
    return float(accuracy_score(y, p, sample_weight=w))


def regression_score(est: Any, X: Any, y: Any, sample_weight: Any) -> float:
    """A regressor's ``score``: R^2 of ``est.predict(X)`` (y may be omitted for
    a store holding ``y``; ``sample_weight`` in memory only)."""
    X, y = score_targets(X, y)
    if sample_weight is not None:
        return weighted_score("r2", y, est.predict(X), sample_weight)
    return r2_score_any(y, est.predict(X))
