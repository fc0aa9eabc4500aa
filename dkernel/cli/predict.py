"""``dkernel predict`` / ``transform`` / ``evaluate``: apply a saved model to a store."""

from __future__ import annotations

import argparse
import functools
import os
import warnings
from typing import Any

import numpy as np

from dkernel.cli import common

_MODEL_HELP = "model file written by 'dkernel fit' (.npz)"


def register(sub: argparse._SubParsersAction) -> None:
    for name, summary, array in (
            ("predict", "write the predictions of a model on a dataset store to a zarr store",
             "y_pred"),
            ("transform", "write a component model's projections of a dataset store to a zarr "
             "store", "Z, and Z_y for two-view models")):
        p = common.add_command(sub, name, summary, f"{summary[0].upper()}{summary[1:]} (array "
                               f"{array}, chunked like the input rows; written atomically).")
        p.add_argument("model", help=_MODEL_HELP)
        p.add_argument("store", help="dataset store with X (two-view models: y is the second view)")
        p.add_argument("--out", required=True, help="output zarr store")
        common.cluster_job(p, run_apply, method=name)
    p = common.add_command(
        sub, "evaluate", "print the metrics of a model on a labelled dataset store",
        "Print the metrics of a model on a dataset store: accuracy (classifiers), mse and r2 "
        "(regressors), the canonical correlations (two-view models: y is the second view) or "
        "the explained variance (KernelPCA, StreamingKernelPCA).")
    p.add_argument("model", help=_MODEL_HELP)
    p.add_argument("store", help="dataset store with X and y")
    common.cluster_job(p, run_evaluate, overwrite=False)


def _check_not_a_dataset(out: str, store: str) -> None:
    """Refuse an output that is a dataset store: ``--overwrite`` replaced the
    store being read (or another dataset) with the predictions, X and y gone."""
    local = out.removeprefix("file://")
    if "://" in local or not os.path.exists(local):
        return
    if os.path.realpath(local) == os.path.realpath(store.removeprefix("file://")):
        raise ValueError(f"--out {out!r} is the store the command reads: its X and y would be "
                         "replaced by the output; choose another path")
    if os.path.isdir(os.path.join(local, "X")):
        raise FileExistsError(f"--out {out!r} holds a dataset (an array X), not an earlier "
                              "output: --overwrite replaces only those; choose another path")


def run_apply(args: argparse.Namespace) -> int:
    from dkernel.data import open_dataset
    from dkernel.data.store import write_arrays
    from dkernel.engine.progress import Progress
    from dkernel.io import load_model

    common.check_output(args.out, args.overwrite, store=True)
    _check_not_a_dataset(args.out, args.store)
    model = load_model(args.model)
    if not hasattr(model, args.method):
        other = "transform" if args.method == "predict" else "predict"
        if not hasattr(model, other):  # DSGDensityRatio: each pointed at the other
            raise ValueError(f"{type(model).__name__} has neither predict nor transform; "
                             f"use its Python API ({_python_only(model)})")
        raise ValueError(f"{type(model).__name__} has no {args.method}; use 'dkernel {other}'")
    data = open_dataset(args.store)
    with common.connect_cluster(args) as client:
        if args.method == "transform" and hasattr(model, "y_components_") and data.y is not None:
            # two-view models (KernelCCA / KernelSVD): the store's y is the second view
            outs = dict(zip(("Z", "Z_y"), model.transform(data.X, data.y)))
        else:
            out = getattr(model, args.method)(data.X)
            if isinstance(out, tuple):
                raise ValueError(f"{type(model).__name__}.{args.method} needs both views; use "
                                 "the Python API")
            outs = {"y_pred" if args.method == "predict" else "Z": out}
        write_arrays(client, args.out, outs, int(data.X.chunks[0][0]), overwrite=args.overwrite,
                     attrs={"dkernel": args.method, "model": str(args.model),
                            "estimator": type(model).__name__},
                     progress=None if args.quiet else functools.partial(
                         Progress, label=args.method, enabled=True))
    for name, out in outs.items():
        common.status(args, f"wrote {name} {tuple(out.shape)} to {args.out}")
    if args.json:
        common.emit(args, {"out": args.out,
                           "arrays": {k: [int(s) for s in v.shape] for k, v in outs.items()}})
    return 0


def check_labels(model: Any, y: Any) -> None:
    """A classifier is evaluated on its labels: refuse targets outside ``classes_``
    (e.g. a continuous target) instead of reporting an accuracy of 0."""
    import dask.array as da

    classes = np.asarray(model.classes_)
    yv = y.reshape(-1)
    if classes.dtype.kind in "iufb" and yv.dtype.kind not in "iufb":
        raise ValueError(f"y holds {yv.dtype} values but {type(model).__name__} predicts numeric "
                         f"classes {classes.tolist()[:10]}; evaluate it on a store with its labels")
    outside = ~da.isin(yv, classes) if isinstance(yv, da.Array) else ~np.isin(yv, classes)
    # (the first one by its position: yv[outside] brought every bad value to the
    # client, 43 bytes a row of a continuous target, 559 MB for 8M rows)
    count, at = (int(v) for v in da.compute(outside.sum(), outside.argmax()))
    if count:
        first = np.asarray(da.compute(yv[at])[0]).item()
        raise ValueError(f"y holds {count} value(s) that are not among {type(model).__name__}'s "
                         f"classes {classes.tolist()[:10]} (e.g. {first!r}); evaluate a classifier "
                         "on a store with its labels (a continuous target needs a regressor: fit "
                         "--task regression)")


def _python_only(model: Any) -> str:
    methods = ("predict_ratio", "score_samples", "decision_function")
    return ", ".join(m for m in methods if hasattr(model, m))


def check_scorable(model: Any) -> None:
    """Refuse a model that 'dkernel evaluate' has no metric for."""
    from sklearn.base import is_outlier_detector

    name = type(model).__name__
    if is_outlier_detector(model):  # its +1 / -1 were scored as a regression on y
        raise ValueError(f"{name} is an outlier detector, with no metric on a store's y: write "
                         "its labels (+1 inlier, -1 outlier) with 'dkernel predict'")
    if not hasattr(model, "predict") and not hasattr(model, "transform"):
        raise ValueError(f"{name} has no metric in 'dkernel evaluate'; use its Python API "
                         f"({_python_only(model)})")


def metrics(model: Any, X: Any, y: Any, progress: bool = False) -> dict[str, Any]:
    """The model's metrics on dask X and y, predicting each row once; ``progress``
    (on the current client): a line counting the chunks as they finish."""
    from sklearn.exceptions import UndefinedMetricWarning

    from dkernel.engine.progress import chunkwise
    from dkernel.estimators.scoring import (
        chunk_moments,
        pooled_moments,
        r2_from_sums,
        r2_sums_by_chunk,
    )

    check_scorable(model)
    if hasattr(model, "canonical_correlations"):  # KernelCCA / KernelSVD: y is the second view
        with warnings.catch_warnings():  # refused below, in one line
            warnings.simplefilter("ignore", UndefinedMetricWarning)
            corr = model.canonical_correlations(X, y)
        flat = np.flatnonzero(~np.isfinite(corr)).tolist()
        if flat:  # (NaN is not even valid JSON)
            raise ValueError(f"the canonical correlations are undefined on this store: the "
                             f"scores of component(s) {flat} are constant on its rows (a "
                             "constant view, or fewer than 2 rows)")
        return {"sum_correlations": float(np.sum(corr)), "correlations": [float(c) for c in corr]}
    if hasattr(model, "explained_variance_"):  # KernelPCA / StreamingKernelPCA
        Z = model.transform(X)
        parts = chunkwise(chunk_moments, [Z], 1 + 2 * int(Z.shape[1]), "evaluate", progress)
        rows, _, m2 = pooled_moments(parts)
        var = m2 / rows
        return {"explained_variance": [float(v) for v in var], "total_variance": float(var.sum())}
    if hasattr(model, "classes_"):
        if y.ndim != 1 and y.shape[1:] != (1,):
            raise ValueError(f"the store's y has shape {y.shape}; a classifier is scored on one "
                             "column of labels")
        check_labels(model, y)
        parts = chunkwise(lambda p, t: [np.sum(p[:, 0] == t[:, 0]), len(p)],
                          [model.predict(X), y.reshape(-1)], 2, "evaluate", progress)
        right, rows = parts.sum(axis=0)
        return {"accuracy": float(right / rows)}
    pred = model.predict(X)
    # the model's own score (R^2 averaged over outputs, as scikit-learn's), which
    # refuses a y holding NaN: a NaN would not even be valid JSON.  The MSE comes
    # from the same sums: a second reduction would predict every row again.
    offset = getattr(getattr(model, "encoding_", None), "offset", None)  # the training mean
    ss_res, ss_tot, rows = r2_sums_by_chunk(y, pred, progress, 0.0 if not offset else offset)
    if rows < 2:  # score() gives NaN with a warning; NaN is not valid JSON
        raise ValueError(f"R^2 is not defined on fewer than two rows, and the store has {rows}")
    return {"mse": float(ss_res.sum() / max(int(np.prod(pred.shape)), 1)),
            "r2": r2_from_sums(ss_res, ss_tot)}


def run_evaluate(args: argparse.Namespace) -> int:
    from dkernel.data import open_dataset
    from dkernel.io import load_model

    model = load_model(args.model)
    check_scorable(model)  # before the store: a ratio model's store has no y
    data = open_dataset(args.store, require_y=not hasattr(model, "explained_variance_"))
    with common.connect_cluster(args):
        result = metrics(model, data.X, data.y, progress=not args.quiet)
    common.emit(args, result)
    return 0
