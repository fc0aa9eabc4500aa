"""Write one small model file per estimator (and per EigenPro route) with the
outputs it gives on fixed probe rows, so later versions can check that model
files written before a change still load and answer the same.

Run from the repository root, once per file-format era you want to keep:
``python tests/data/make_legacy_models.py tests/data/legacy_models/<tag>``.
The files are a few hundred kB in all; tests/test_legacy_models.py reads them.
"""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
from distributed import Client, LocalCluster

import dkernel
from dkernel import estimators as E


def _data(rng: np.random.Generator, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    X = rng.standard_normal((n, d)).astype(np.float32)
    y = (np.sin(X[:, 0]) + 0.5 * X[:, 1]).astype(np.float32)
    return X, y


def cases(rng: np.random.Generator):
    X, y = _data(rng, 600, 5)
    labels = (y > np.median(y)).astype(np.int64) + (y > 1).astype(np.int64)
    Xs = X / np.linalg.norm(X, axis=1, keepdims=True)
    Y2 = (X[:, :3] @ rng.standard_normal((3, 4)) + 0.1 * rng.standard_normal((600, 4)))
    small = dict(n_epochs=2, random_state=0)
    yield "DSGRegressor", E.DSGRegressor(n_features=256, **small), (X, y), ["predict"]
    yield "DSGClassifier", E.DSGClassifier(n_features=256, **small), (X, labels), \
        ["predict", "decision_function"]
    yield "DSGOneClassSVM", E.DSGOneClassSVM(n_features=256, **small), (X,), \
        ["score_samples"]
    yield "DSGDensityRatio", E.DSGDensityRatio(n_features=256, **small), \
        (X[:300], X[300:] + 0.3), ["predict_ratio"]
    yield "EigenProRegressor-kernel", E.EigenProRegressor(n_epochs=2, random_state=0), \
        (X, y), ["predict"]
    yield "EigenProRegressor-features", E.EigenProRegressor(n_features=256, **small), \
        (X, y), ["predict"]
    yield "EigenProClassifier-nystrom", E.EigenProClassifier(n_centers=200, **small), \
        (X, labels), ["predict", "decision_function"]
    yield "KernelPCA", E.KernelPCA(n_components=2, n_features=256, **small), (X,), \
        ["transform"]
    yield "KernelSVD", E.KernelSVD(n_components=2, n_features=256, **small), \
        (X, Y2.astype(np.float32)), ["transform"]
    yield "KernelCCA", E.KernelCCA(n_components=2, n_features=256, **small), \
        (X, Y2.astype(np.float32)), ["transform"]
    yield "StreamingKernelPCA", E.StreamingKernelPCA(n_components=2, n_features=256,
                                                     random_state=0), (X,), ["transform"]
    yield "SphereRegressor", E.SphereRegressor(), (Xs, y), ["predict"]


def _out(model, method: str, probe) -> np.ndarray:
    out = getattr(model, method)(*probe)
    if isinstance(out, tuple):
        out = np.concatenate([np.asarray(getattr(o, "compute", lambda o=o: o)()) for o in out],
                             axis=1)
    return np.asarray(getattr(out, "compute", lambda: out)())


def main(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                           silence_logs=logging.ERROR)
    with cluster, Client(cluster):
        for name, model, args, methods in cases(np.random.default_rng(0)):
            model.fit(*args)
            probe_rows = args[0][:40]
            probe = (probe_rows, args[1][:40]) if name in ("KernelSVD", "KernelCCA") \
                else (probe_rows,)
            model.save(os.path.join(folder, f"{name}.npz"))
            outputs = {m: _out(model, m, probe) for m in methods}
            np.savez(os.path.join(folder, f"{name}.expected.npz"),
                     **{f"probe_{i}": p for i, p in enumerate(probe)}, **outputs)
            print(name, {m: o.shape for m, o in outputs.items()}, flush=True)
    with open(os.path.join(folder, "VERSION"), "w") as fh:
        fh.write(dkernel.__version__ + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
