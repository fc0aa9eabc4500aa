"""``dkernel predict`` / ``transform`` / ``evaluate``: apply a saved model to a store."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from dkernel.cli.common import add_cluster_args, cluster_options


def register(sub: argparse._SubParsersAction) -> None:
    for name, helptext in (("predict", "write predictions of MODEL on STORE to a zarr store"),
                           ("transform", "write the projections of MODEL on STORE to a zarr store")):
        p = sub.add_parser(name, help=helptext, description=helptext)
        p.add_argument("model")
        p.add_argument("store")
        p.add_argument("--out", required=True, help="output zarr store")
        p.add_argument("--overwrite", action="store_true")
        add_cluster_args(p)
        p.set_defaults(func=run_apply, method=name)
    p = sub.add_parser("evaluate", help="print metrics of MODEL on a labelled STORE")
    p.add_argument("model")
    p.add_argument("store")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_cluster_args(p)
    p.set_defaults(func=run_evaluate)


def run_apply(args: argparse.Namespace) -> int:
    import dask.array as da

    from dkernel.data import open_dataset
    from dkernel.data.store import atomic_store, create_array
    from dkernel.engine import connect
    from dkernel.io import load_model

    model = load_model(args.model)
    if not hasattr(model, args.method):
        raise ValueError(f"{type(model).__name__} has no {args.method}; use "
                         f"'dkernel {'transform' if args.method == 'predict' else 'predict'}'")
    data = open_dataset(args.store)
    with connect(**cluster_options(args)):
        if args.method == "transform" and hasattr(model, "y_components_") and data.y is not None:
            # two-view models (KernelCCA / KernelSVD): the store's y is the second view
            outs = dict(zip(("Z", "Z_y"), model.transform(data.X, data.y)))
        else:
            out = getattr(model, args.method)(data.X)
            if isinstance(out, tuple):
                raise ValueError(f"{type(model).__name__}.{args.method} needs both views; "
                                 "use the Python API")
            outs = {"y_pred" if args.method == "predict" else "Z": out}
        with atomic_store(args.out, overwrite=args.overwrite) as group:
            for name, out in outs.items():
                arr = create_array(group, name, tuple(int(s) for s in out.shape), out.dtype,
                                   int(data.X.chunks[0][0]))
                da.store(out.rechunk(arr.chunks), arr, lock=False)
    for name, out in outs.items():
        print(f"wrote {name} {tuple(out.shape)} to {args.out}")
    return 0


def metrics(model: Any, X: Any, y: Any) -> dict[str, float]:
    import dask.array as da

    if hasattr(model, "canonical_correlations"):  # KernelCCA / KernelSVD: y is the second view
        corr = model.canonical_correlations(X, y)
        return {"sum_correlations": float(np.sum(corr)),
                "correlations": [float(c) for c in corr]}
    if hasattr(model, "explained_variance_"):  # KernelPCA / StreamingKernelPCA
        Z = model.transform(X).astype(np.float64)
        var = da.compute(Z.var(axis=0))[0]
        return {"explained_variance": [float(v) for v in var], "total_variance": float(var.sum())}
    if hasattr(model, "classes_"):
        pred = model.predict(X)
        acc = (pred == y.reshape(-1)).mean()
        return {"accuracy": float(da.compute(acc)[0])}
    pred = model.predict(X)
    yv = y.astype(np.float64)
    yv = yv.reshape(pred.shape)
    mse = ((pred - yv) ** 2).mean()
    var = ((yv - yv.mean(axis=0)) ** 2).mean()
    mse, var = da.compute(mse, var)
    return {"mse": float(mse), "r2": float(1 - mse / var)}


def run_evaluate(args: argparse.Namespace) -> int:
    from dkernel.data import open_dataset
    from dkernel.engine import connect
    from dkernel.io import load_model

    model = load_model(args.model)
    data = open_dataset(args.store, require_y=not hasattr(model, "explained_variance_"))
    with connect(**cluster_options(args)):
        result = metrics(model, data.X, data.y)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            shown = " ".join(f"{x:.4g}" for x in v) if isinstance(v, list) else f"{v:.6g}"
            print(f"{k}: {shown}")
    return 0
