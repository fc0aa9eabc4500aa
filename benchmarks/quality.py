"""Quality matrix: every estimator at its default settings against an exact or
trusted reference on the same data, over a grid of regimes.

Each cell is (estimator, regime).  A regime varies one thing at a time from a
base (n = 2000 rows, 10 inputs, bandwidth = the median heuristic, a smooth
target, low noise): n from 300 to 200,000, inputs from 2 to 784, bandwidths
from a quarter to four times the median heuristic, clustered targets, high
noise and, for component models, small and large eigengaps.  The function
learned does not depend on n or on d (beyond keeping its first min(d, 6)
latent directions), and a smaller n's rows are the first rows of a larger
n's (:func:`make_data`).  The estimator runs at its defaults: only
``bandwidth`` is set, and only where the regime scales it away from "auto"
(the median heuristic).

References (computed here, in float64, on the same rows):
- regression and classification: kernel ridge with the same kernel and
  bandwidth (the median heuristic on 1000 rows, scaled by the regime), its
  ridge chosen on a 20% hold-out of the training rows from
  1e-8 .. 1 (an exact solve when n <= 3000, else Nystrom with 3000 centers);
  classifiers regress one-hot labels, as EigenPro does, and predict the argmax.
- kernel PCA (KernelPCA, StreamingKernelPCA): the top eigenvectors of the
  exact centred kernel matrix (scipy's ``eigsh`` on it, :func:`exact_kpca`).
- kernel SVD: the top eigenvectors of Kx Ky (both centred), the values of
  the left singular functions of the cross-covariance operator on the rows.
- kernel CCA: exact regularised kernel CCA with the same ridge (C + alpha I
  in the RKHS, C the covariance operator), scored by the sum of held-out
  canonical correlations.
- one-class SVM: scikit-learn's OneClassSVM (same nu, kernel), scored by the
  AUC between held-out inliers and uniform outliers.
- density ratio: N(mu, S) over N(0, S), whose log-ratio is linear and known,
  scored by the Pearson correlation of the estimated log r with it on fresh rows.
- sphere: Bai & Shi's S^2 problem (their degree-10 target, uniform noise),
  against kernel ridge as above on the same points.

Tolerances, fixed before any run (``TOLERANCE``):
- R^2 and held-out CCA sums: dkernel >= reference - 0.05 (absolute; CCA: 5%
  of the reference sum);
- accuracy: dkernel >= reference - 0.02;
- AUC: dkernel >= reference - 0.03;  density-ratio correlation >= 0.9;
- components where the reference resolves the subspace (relative eigengap
  (lambda_k - lambda_{k+1}) / lambda_k >= 0.1): sin^2 of the largest
  principal angle <= 0.05.  Where it does not (a small eigengap, the subspace
  is not defined to within the sampling error), the captured variance
  tr(Q^T Kc Q) / sum_{i<=k} lambda_i >= 0.95 (Q an orthonormal basis of the
  centred scores; for kernel SVD the same on Ky^{1/2} Kx Ky^{1/2} and
  Ky^{1/2} times the scores, :func:`subspace_scores`): any near-optimal
  subspace passes.  Every cell is checked one way or the other; the summary
  counts a cell with no verdict as unchecked, never as a pass.

    python benchmarks/quality.py                          # the whole matrix
    python benchmarks/quality.py --quick                  # the slice the tests run
    python benchmarks/quality.py --only KernelPCA --only base --markdown quality-table.md

``--markdown`` writes the table alone; it refuses a file that is not such a
table (docs/quality.md quotes the matrix inside its prose, which is written
by hand).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from scipy.linalg import eigh, solve, subspace_angles
from scipy.sparse.linalg import LinearOperator, eigs, eigsh

TOLERANCE = {"r2": 0.05, "accuracy": 0.02, "auc": 0.03, "ratio_corr": 0.9,
             "sin2": 0.05, "variance": 0.95, "cca": 0.05, "gap": 0.1}

EXACT_ROWS = 3000  # kernel ridge is solved exactly up to here, with Nystrom beyond


@dataclass(frozen=True)
class Regime:
    name: str
    n: int = 2000
    d: int = 10
    bw: float = 1.0  # multiple of the median heuristic; 1.0 is the default "auto"
    target: str = "smooth"  # or "clustered"
    noise: str = "low"  # or "high"
    k: int = 2  # components (component models only)
    quick: bool = False  # part of the slice the test suite runs


_BASE = Regime("base")
SUPERVISED = [
    replace(_BASE, quick=True),
    replace(_BASE, name="n=300", n=300, quick=True),
    replace(_BASE, name="n=20k", n=20000),
    replace(_BASE, name="n=200k", n=200000, quick=False),
    replace(_BASE, name="d=2", d=2, quick=False),
    replace(_BASE, name="d=784", d=784, quick=False),
    replace(_BASE, name="bw=0.25x", bw=0.25, quick=False),
    replace(_BASE, name="bw=4x", bw=4.0, quick=False),
    replace(_BASE, name="clustered", target="clustered", quick=False),
    replace(_BASE, name="high noise", noise="high", quick=False),
    # few and noisy rows, as in scikit-learn's diabetes data (stop 47: EigenPro's
    # defaults fitted its noise, test R^2 0.08 against kernel ridge's 0.23)
    replace(_BASE, name="n=300, high noise", n=300, noise="high"),
]
COMPONENTS = [
    replace(_BASE, name="base", k=2, quick=True),
    replace(_BASE, name="blobs 3-d, large gap", n=3000, d=3, target="clustered", k=2, quick=True),
    replace(_BASE, name="blobs 3-d, small gap", n=3000, d=3, target="clustered", k=1),
    replace(_BASE, name="n=300", n=300, k=2, quick=True),
    replace(_BASE, name="n=12k", n=12000, k=2),
    replace(_BASE, name="d=2", d=2, k=2),
    replace(_BASE, name="d=784", d=784, k=2),
    replace(_BASE, name="bw=0.25x", bw=0.25, k=2),
    replace(_BASE, name="bw=4x", bw=4.0, k=2),
]
TWO_VIEW = [
    replace(_BASE, name="base", k=2, quick=True),
    replace(_BASE, name="n=300", n=300, k=2),
    replace(_BASE, name="n=5000", n=5000, k=2),
    replace(_BASE, name="bw=0.25x", bw=0.25, k=2),
    replace(_BASE, name="bw=4x", bw=4.0, k=2),
]
NOVELTY = [
    replace(_BASE, name="base", quick=True),
    replace(_BASE, name="n=300", n=300),
    replace(_BASE, name="n=20k", n=20000),
    replace(_BASE, name="clustered", target="clustered"),
    replace(_BASE, name="bw=0.25x", bw=0.25),
    replace(_BASE, name="bw=4x", bw=4.0),
]
DENSITY = [r for r in NOVELTY if r.target == "smooth"]  # its Gaussians have no clusters
SPHERE = [
    replace(_BASE, name="S^2, n=2000", d=3, quick=True),
    replace(_BASE, name="S^2, n=20k", n=20000, d=3),
    replace(_BASE, name="S^2, high noise", d=3, noise="high"),
]

#: cells the ``--quick`` slice runs besides its regimes' ``quick`` ones: a narrow and a
#: wide bandwidth for the cheapest supervised estimator and for kernel PCA (the slice
#: had none, and most known misses are narrow-bandwidth cells)
QUICK_CELLS = {("DSGRegressor", "bw=0.25x"), ("DSGRegressor", "bw=4x"),
               ("KernelPCA", "bw=0.25x"), ("KernelPCA", "bw=4x")}

ESTIMATORS = {
    "DSGRegressor": SUPERVISED, "DSGClassifier": SUPERVISED,
    "EigenProRegressor": SUPERVISED, "EigenProClassifier": SUPERVISED,
    "KernelPCA": COMPONENTS, "StreamingKernelPCA": COMPONENTS,
    "KernelSVD": TWO_VIEW, "KernelCCA": TWO_VIEW,
    "DSGOneClassSVM": NOVELTY, "DSGDensityRatio": DENSITY,
    "SphereRegressor": SPHERE,
}


# ---------------------------------------------------------------- data
#: latent dimensions drawn for every regime; one with d < 6 inputs keeps the first d
_R = 6
#: the quantities drawn, each from a stream of its own (:func:`_stream`)
_STREAMS = ("target", "embedding", "latent", "cluster", "embedding noise", "y noise",
            "label flip", "flipped label", "second view", "numerator", "denominator",
            "evaluation")


def _stream(seed: int, what: str, *key: int) -> np.random.Generator:
    """The stream of one quantity (``what``, one of ``_STREAMS``), keyed by ``key``
    (the split, d) but never by n: the n rows of a draw are the first n of any
    larger one, so the n= regimes differ from the base in their row count alone."""
    return np.random.default_rng([seed, _STREAMS.index(what), *key])


def _target(seed: int, r: int, target: str) -> dict[str, np.ndarray]:
    """The function learned, the same for every n and d: directions u, v and three
    cluster centres at radius 4, drawn in _R dimensions and cut to the first r."""
    rng = _stream(seed, "target")
    centres, u, v = rng.standard_normal((3, _R)), rng.standard_normal(_R), rng.standard_normal(_R)
    centres = centres[:, :r] * (4.0 / np.linalg.norm(centres[:, :r], axis=1, keepdims=True))
    return {"u": u[:r], "v": v[:r], "centres": centres, "clustered": target == "clustered"}


def _latent(seed: int, split: int, n: int, r: int, t: dict) -> tuple[np.ndarray, np.ndarray]:
    """n latent points in r dims and their cluster of three (-1 for smooth data)."""
    Z = _stream(seed, "latent", split).standard_normal((n, _R))[:, :r]
    if t["clustered"]:
        label = _stream(seed, "cluster", split).integers(0, 3, n)
        return t["centres"][label] + Z, label
    scale = 1.0 / np.sqrt(1.0 + np.arange(r))  # a decaying spectrum, not an isotropic ball
    return Z * scale, np.full(n, -1)


def _f(Z: np.ndarray, cluster: np.ndarray, t: dict) -> np.ndarray:
    f = np.sin(Z @ t["u"]) + 0.5 * np.cos(Z @ t["v"])
    return f * 0.3 + np.array([-1.0, 0.5, 1.5])[cluster] if t["clustered"] else f


def _embed(seed: int, split: int, Z: np.ndarray, d: int) -> np.ndarray:
    """Z in d inputs: identity when d <= r, else a random orthonormal map plus small
    noise (total variance 0.09), so wide inputs keep a low intrinsic dimension as
    images do and the median heuristic stays meaningful."""
    n, r = Z.shape
    if d <= r:
        return Z[:, :d]
    R = np.linalg.qr(_stream(seed, "embedding", d).standard_normal((d, r)))[0].T
    return Z @ R + _stream(seed, "embedding noise", split, d).standard_normal((n, d)) * (
        0.3 / np.sqrt(d))


def make_data(regime: Regime, seed: int = 0) -> dict[str, np.ndarray]:
    """Train and test rows (test: n / 4, at least 500) with a regression target f,
    three-class labels and a second view Y of the same latent points.

    The target (:func:`_target`), the noise's scale and the class boundaries
    depend on the seed, the target kind and r = min(d, 6) only; the train and
    test rows come from streams of their own, so a smaller n's rows are the first
    rows of a larger n's (train and test alike), and d changes the embedding."""
    r = min(regime.d, _R)
    t = _target(seed, r, regime.target)
    # the noise's scale and the class boundaries, from 10,000 rows of a split of their own
    Zs, cs = _latent(seed, 2, 10_000, r, t)
    fs = _f(Zs, cs, t)
    f_sd, edges = fs.std(), np.quantile(fs, [1 / 3, 2 / 3])
    out = {}
    for split, suffix, n in ((0, "", regime.n), (1, "_test", max(500, regime.n // 4))):
        Z, cluster = _latent(seed, split, n, r, t)
        f = _f(Z, cluster, t)
        labels = cluster.copy() if t["clustered"] else np.searchsorted(edges, f)
        sd = 0.1 if regime.noise == "low" else 1.0
        y = f + sd * f_sd * _stream(seed, "y noise", split).standard_normal(n)
        p_flip = 0.02 if regime.noise == "low" else 0.2
        flip = _stream(seed, "label flip", split).random(n) < p_flip
        labels = np.where(flip, _stream(seed, "flipped label", split).integers(0, 3, n), labels)
        noise = _stream(seed, "second view", split).standard_normal((n, _R))[:, :r]
        Y = np.tanh(Z[:, ::-1]) + 0.3 * noise  # second view
        for key, a in {"X": _embed(seed, split, Z, regime.d), "y": y, "labels": labels,
                       "Y": Y}.items():
            out[key + suffix] = a
    return out


# ---------------------------------------------------------------- references
def _kernel(A: np.ndarray, B: np.ndarray, bandwidth: float) -> np.ndarray:
    from dkernel.kernels.exact import kernel_matrix

    A, B = np.asarray(A, np.float64), np.asarray(B, np.float64)
    return kernel_matrix(A, B, "gaussian", bandwidth)


def _centre(K: np.ndarray) -> np.ndarray:
    return K - K.mean(0) - K.mean(1)[:, None] + K.mean()


def median_bandwidth(X: np.ndarray, seed: int = 0) -> float:
    from dkernel.kernels.bandwidth import median_heuristic

    rng = np.random.default_rng(seed)
    rows = rng.choice(X.shape[0], min(1000, X.shape[0]), replace=False)
    return median_heuristic(X[rows], "gaussian")


def kernel_ridge(X: np.ndarray, Y: np.ndarray, Xt: np.ndarray, bandwidth: float,
                 seed: int = 0) -> np.ndarray:
    """Predictions on Xt of kernel ridge (exact up to EXACT_ROWS rows, Nystrom beyond),
    its ridge chosen on a 20% hold-out of the training rows."""
    rng = np.random.default_rng(seed)
    n = X.shape[0]
    C = X if n <= EXACT_ROWS else X[rng.choice(n, EXACT_ROWS, replace=False)]
    Kcc = _kernel(C, C, bandwidth)
    Y = Y.reshape(n, -1).astype(np.float64)
    mu = Y.mean(0)
    hold = rng.random(n) < 0.2

    def sums(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        G, b = np.zeros_like(Kcc), np.zeros((C.shape[0], Y.shape[1]))
        for i in range(0, rows.size, 8192):
            idx = rows[i:i + 8192]
            K = _kernel(X[idx], C, bandwidth)
            G += K.T @ K
            b += K.T @ (Y[idx] - mu)
        return G, b

    def fit(G: np.ndarray, b: np.ndarray, lam: float, m: int) -> np.ndarray:
        A = G + lam * m * Kcc
        A[np.diag_indices_from(A)] += 1e-10 * np.trace(A) / A.shape[0]
        return solve(A, b, assume_a="pos")

    fit_rows, val_rows = np.flatnonzero(~hold), np.flatnonzero(hold)
    G, b = sums(fit_rows)
    Kv = _kernel(X[val_rows], C, bandwidth)
    errors = {}
    for lam in 10.0 ** np.arange(-8, 1):
        a = fit(G, b, lam, fit_rows.size)
        errors[lam] = float(np.mean((Kv @ a + mu - Y[val_rows]) ** 2))
    best = min(errors, key=errors.get)
    Gv, bv = sums(val_rows)
    a = fit(G + Gv, b + bv, best, n)
    out = np.concatenate([_kernel(Xt[i:i + 8192], C, bandwidth) @ a
                          for i in range(0, Xt.shape[0], 8192)]) + mu
    return out


def r2(y: np.ndarray, p: np.ndarray) -> float:
    y, p = np.asarray(y, np.float64).ravel(), np.asarray(p, np.float64).ravel()
    return float(1 - np.sum((y - p) ** 2) / np.sum((y - y.mean()) ** 2))


def exact_kpca(X: np.ndarray, bandwidth: float, k: int) -> tuple[np.ndarray, ...]:
    """Centred kernel matrix, its top k + 1 eigenvalues (descending) and top k vectors."""
    Kc = _centre(_kernel(X, X, bandwidth))
    v0 = np.random.default_rng(1).standard_normal(Kc.shape[0])  # not 1: Kc 1 = 0
    w, V = eigsh(Kc, k=k + 1, which="LA", tol=1e-10, v0=v0)
    order = np.argsort(w)[::-1]
    return Kc, w[order], V[:, order][:, :k]


def subspace_scores(Kc: np.ndarray, lam: np.ndarray, V: np.ndarray, Z: np.ndarray,
                    metric: np.ndarray | None = None) -> dict:
    """sin^2 of the largest principal angle between span(V) and the centred
    scores Z, the relative eigengap, and the variance those scores capture as a
    fraction of the best k: tr((Z^T M Z)^{-1} Z^T M Kc M Z) / sum_{i<=k} lambda_i.

    With M = I (``metric`` None, kernel PCA) that is tr(Q^T Kc Q) / sum lambda_i,
    Q an orthonormal basis of the scores.  Kernel SVD passes M = Ky and Kc = Kx:
    the ratio is then tr(Q^T B Q) / sum lambda_i for B = Ky^{1/2} Kx Ky^{1/2} and Q
    an orthonormal basis of Ky^{1/2} Z, where B has the eigenvalues of Kx Ky and
    the eigenvectors Ky^{1/2} V.  Either way it is at most 1 (Ky Fan) and 1 at
    span(V)."""
    Z = np.asarray(Z, np.float64)
    Z = Z - Z.mean(0)
    k = V.shape[1]
    sin2 = float(np.max(np.sin(subspace_angles(V, Z)) ** 2))
    MZ = Z if metric is None else metric @ Z
    captured = float(np.trace(solve(Z.T @ MZ, MZ.T @ Kc @ MZ, assume_a="pos")) / np.sum(lam[:k]))
    gap = float((lam[k - 1] - lam[k]) / lam[k - 1])
    return {"sin2": sin2, "variance": captured, "gap": gap}


def exact_ksvd(X: np.ndarray, Y: np.ndarray, bx: float, by: float, k: int):
    """Both centred kernel matrices Kx, Ky, the top k + 1 eigenvalues of Kx Ky
    (descending) and its top k eigenvectors: the values of the left singular
    functions of C_xy on the rows (real, as Kx Ky is similar to the PSD
    Kx^{1/2} Ky Kx^{1/2})."""
    Kx, Ky = _centre(_kernel(X, X, bx)), _centre(_kernel(Y, Y, by))
    n = Kx.shape[0]
    op = LinearOperator((n, n), matvec=lambda v: Kx @ (Ky @ v), dtype=np.float64)
    s, U = eigs(op, k=k + 1, which="LR", tol=1e-10, v0=np.random.default_rng(1).standard_normal(n))
    order = np.argsort(s.real)[::-1]
    return Kx, Ky, s.real[order], U.real[:, order][:, :k]


def exact_kcca(X, Y, Xt, Yt, bx: float, by: float, alpha: float, k: int) -> float:
    """Sum of the top-k held-out canonical correlations of regularised kernel CCA:
    maximise cov(u, v) subject to var(u) + alpha |u|^2 = 1 (and the same for v),
    solved in each view's empirical feature coordinates (eigendecomposition of
    its centred kernel)."""
    n = X.shape[0]
    coords = []
    for A, At, b in ((X, Xt, bx), (Y, Yt, by)):
        K = _kernel(A, A, b)
        Kt = _kernel(At, A, b)
        H = np.eye(n) - 1.0 / n
        Kt_c = (Kt - Kt.mean(1)[:, None] - K.mean(0) + K.mean())
        w, E = eigh(H @ K @ H)
        keep = w > 1e-9 * w[-1]
        w, E = w[keep], E[:, keep]
        F = E * np.sqrt(w)  # training features: F F^T = Kc
        Ft = Kt_c @ E / np.sqrt(w)
        coords.append((F, Ft))
    (Fx, Fxt), (Fy, Fyt) = coords
    Cxx = Fx.T @ Fx / n + alpha * np.eye(Fx.shape[1])
    Cyy = Fy.T @ Fy / n + alpha * np.eye(Fy.shape[1])
    Cxy = Fx.T @ Fy / n

    def inv_sqrt(C):
        w, E = eigh(C)
        return (E / np.sqrt(w)) @ E.T

    Wx, Wy = inv_sqrt(Cxx), inv_sqrt(Cyy)
    U, _, Vt = np.linalg.svd(Wx @ Cxy @ Wy)
    a, b = Wx @ U[:, :k], Wy @ Vt[:k].T
    u, v = Fxt @ a, Fyt @ b
    u, v = u - u.mean(0), v - v.mean(0)
    return float(np.sum((u * v).sum(0) / np.sqrt((u * u).sum(0) * (v * v).sum(0))))


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    s = np.concatenate([pos, neg])
    return float(roc_auc_score(np.r_[np.ones(pos.size), np.zeros(neg.size)], s))


# ---------------------------------------------------------------- cells
def _bandwidth(regime: Regime, X: np.ndarray) -> tuple[Any, float]:
    """(what the estimator is given, what the reference uses)."""
    med = median_bandwidth(X)
    return ("auto", med) if regime.bw == 1.0 else (regime.bw * med, regime.bw * med)


#: EigenPro's "auto" centers: every row up to this many, then the Nystrom/FALKON route
_MAX_AUTO_CENTERS = 100_000
#: the cells ``--lanes`` applies to: the regressors and classifiers on ``_BASE``'s data
_WIDE = ("DSGRegressor", "DSGClassifier", "EigenProRegressor", "EigenProClassifier")


def _at_width(a: np.ndarray, width: int | None) -> Any:
    """``a`` in ``width`` row chunks, so that ``lanes=width`` resolves to that
    many lanes (a lane takes whole chunks): the step and its batch are those
    of a ``width``-worker cluster, run on this box's workers."""
    if width is None:
        return a
    import dask.array as da

    return da.from_array(a, chunks=(-(-a.shape[0] // width),) + (-1,) * (a.ndim - 1))


def run_cell(name: str, regime: Regime, client: Any, seed: int = 0,
             params: dict | None = None, width: int | None = None) -> dict:
    """One cell: ``name`` at its defaults (plus ``params``, to show the setting
    that passes a cell the defaults miss) on ``regime``'s data.  With ``width``
    the supervised cells run at ``lanes=width`` (:func:`_at_width`)."""
    import dkernel

    data = make_data(regime, seed)
    X, Xt = data["X"].astype(np.float32), data["X_test"].astype(np.float32)
    given, bw = _bandwidth(regime, data["X"])
    row: dict[str, Any] = {"estimator": name, "regime": regime.name}
    t0 = time.perf_counter()
    if name not in _WIDE:  # (their rows are not cut into chunks: lanes=W would not hold)
        width = None
    if name.startswith("EigenPro") and regime.n > _MAX_AUTO_CENTERS:
        width = None  # the Nystrom/FALKON route: every CG pass reads all rows, with no lanes
    if width is not None:
        params = {**(params or {}), "lanes": width}
    est_cls = functools.partial(getattr(dkernel, name), **(params or {}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if name in ("DSGRegressor", "EigenProRegressor", "SphereRegressor"):
            y, yt = data["y"], data["y_test"]
            if name == "SphereRegressor":
                # Bai & Shi's S^2 experiment: the degree-10 target of the last two
                # coordinates, uniform noise of +-0.2 (high noise: +-1)
                from dkernel.datasets.spheres import make_sphere_polynomial

                n_test = max(500, regime.n // 4)
                Xs, ys, _ = make_sphere_polynomial(
                    regime.n + n_test, d=3, noise=0.2 if regime.noise == "low" else 1.0,
                    random_state=seed)
                X, Xt = Xs[:regime.n].astype(np.float32), Xs[regime.n:].astype(np.float32)
                y, yt = ys[:regime.n], ys[regime.n:]
                model = est_cls(client=client).fit(X, y)
                bw = median_bandwidth(X)
            else:
                model = est_cls(bandwidth=given, client=client).fit(_at_width(X, width),
                                                                    _at_width(y, width))
            ref = _cached((regime, seed, "r2"), lambda: r2(yt, kernel_ridge(X, y, Xt, bw, seed)))
            got = r2(yt, np.asarray(model.predict(Xt)))
            row.update(metric="R^2", reference=ref, score=got,
                       passed=got >= ref - TOLERANCE["r2"])
        elif name in ("DSGClassifier", "EigenProClassifier"):
            y, yt = data["labels"], data["labels_test"]
            model = est_cls(bandwidth=given, client=client).fit(_at_width(X, width),
                                                                _at_width(y, width))
            ref = _cached((regime, seed, "accuracy"), lambda: float(np.mean(
                np.argmax(kernel_ridge(X, np.eye(3)[y], Xt, bw, seed), 1) == yt)))
            got = float(np.mean(np.asarray(model.predict(Xt)) == yt))
            row.update(metric="accuracy", reference=ref, score=got,
                       passed=got >= ref - TOLERANCE["accuracy"])
        elif name in ("KernelPCA", "StreamingKernelPCA"):
            model = est_cls(n_components=regime.k, bandwidth=given, client=client).fit(X)
            bw = getattr(model, "bandwidth_", bw)
            Kc, lam, V = exact_kpca(data["X"], bw, regime.k)
            s = subspace_scores(Kc, lam, V, np.asarray(model.transform(X)))
            row.update(_component_verdict(s))
        elif name == "KernelSVD":
            Y = data["Y"].astype(np.float32)
            model = est_cls(n_components=regime.k, bandwidth=given, client=client).fit(X, Y)
            Kx, Ky, lam, U = exact_ksvd(data["X"], data["Y"], model.bandwidth_,
                                        model.bandwidth_y_, regime.k)
            s = subspace_scores(Kx, lam, U, np.asarray(model.transform(X)), metric=Ky)
            row.update(_component_verdict(s))
        elif name == "KernelCCA":
            Y, Yt = data["Y"].astype(np.float32), data["Y_test"].astype(np.float32)
            model = est_cls(n_components=regime.k, bandwidth=given, client=client).fit(X, Y)
            ref = exact_kcca(data["X"], data["Y"], data["X_test"], data["Y_test"],
                             model.bandwidth_, model.bandwidth_y_, model.alpha, regime.k)
            got = model.score(Xt, Yt)
            row.update(metric="held-out CCA sum", reference=ref, score=got,
                       passed=got >= ref * (1 - TOLERANCE["cca"]))
        elif name == "DSGOneClassSVM":
            from sklearn.svm import OneClassSVM

            lo, hi = X.min(0), X.max(0)
            span = hi - lo
            out = np.random.default_rng(seed).uniform(lo - 0.25 * span, hi + 0.25 * span,
                                                      (Xt.shape[0], X.shape[1])).astype(np.float32)
            model = est_cls(bandwidth=given, client=client).fit(X)
            bw = getattr(model, "bandwidth_", bw)
            sk = OneClassSVM(nu=model.nu, gamma=1 / (2 * bw * bw)).fit(X)
            ref = auc(sk.score_samples(Xt), sk.score_samples(out))
            got = auc(np.asarray(model.score_samples(Xt)), np.asarray(model.score_samples(out)))
            row.update(metric="AUC", reference=ref, score=got,
                       passed=got >= ref - TOLERANCE["auc"])
        elif name == "DSGDensityRatio":
            # Gaussians N(mu, S) over N(0, S): log r(x) = mu^T S^-1 x - mu^T S^-1 mu / 2
            # (each set from a stream of its own, so n rows are the first n of a larger n's)
            scale = 1.0 / np.sqrt(1.0 + np.arange(regime.d))
            mu = np.zeros(regime.d)
            mu[0] = scale[0]
            draw = lambda what: _stream(seed, what, regime.d).standard_normal  # noqa: E731
            den = draw("denominator")((regime.n, regime.d)) * scale
            num = draw("numerator")((regime.n, regime.d)) * scale + mu
            at = draw("evaluation")((2000, regime.d)) * scale
            given, bw = _bandwidth(regime, den)
            model = est_cls(bandwidth=given, client=client).fit(num.astype(np.float32),
                                                               den.astype(np.float32))
            truth = at @ (mu / scale**2)
            got_lr = np.asarray(model.score_samples(at.astype(np.float32)), np.float64)
            corr = float(np.corrcoef(got_lr, truth)[0, 1])
            row.update(metric="log r correlation", reference=1.0, score=corr,
                       passed=corr >= TOLERANCE["ratio_corr"])
        else:
            raise ValueError(f"no cell for {name}")
    row["seconds"] = time.perf_counter() - t0
    row["warnings"] = sorted({type(w.message).__name__ for w in caught
                              if not issubclass(w.category, DeprecationWarning)})
    row["resolved"] = _resolved(model)
    return row


_REFERENCES: dict = {}


def _cached(key: tuple, compute: Any) -> Any:
    """A supervised reference once per regime: both DSG and EigenPro are compared
    with kernel ridge at the median-heuristic bandwidth of the same rows."""
    if key not in _REFERENCES:
        _REFERENCES[key] = compute()
    return _REFERENCES[key]


def _component_verdict(s: dict) -> dict:
    if s["gap"] >= TOLERANCE["gap"]:
        return {"metric": "sin^2", "reference": 0.0, "score": s["sin2"], "gap": s["gap"],
                "passed": s["sin2"] <= TOLERANCE["sin2"]}
    return {"metric": "variance captured", "reference": 1.0, "score": s["variance"],
            "gap": s["gap"], "sin2": s["sin2"], "passed": s["variance"] >= TOLERANCE["variance"]}


_RESOLVED = ("steps_", "batch_size_", "lanes_", "local_steps_", "form_", "solver_", "q_",
             "step_size_", "n_features_", "n_centers_", "step_backoffs_")


def _resolved(model: Any) -> dict:
    out = {}
    for a in _RESOLVED:
        v = getattr(model, a, None)
        if v is None or callable(v):
            continue
        if isinstance(v, (np.integer, np.floating)):
            v = v.item()
        if isinstance(v, list):  # step_backoffs_: how many; step_size_: one per output
            v = " ".join(f"{x:.4g}" for x in v) if a == "step_size_" else len(v)
        if isinstance(v, (int, float, str)):
            out[a.rstrip("_")] = v
    return out


def cells(only: list[str], quick: bool) -> list[tuple[str, Regime]]:
    out = []
    for name, regimes in ESTIMATORS.items():
        for regime in regimes:
            if quick and not (regime.quick or (name, regime.name) in QUICK_CELLS):
                continue
            names = [o for o in only if o in ESTIMATORS]
            regimes = [o for o in only if o not in ESTIMATORS]
            if (names and name not in names) or (regimes and regime.name not in regimes):
                continue
            out.append((name, regime))
    return out


_TABLE_HEADER = "| estimator | regime | metric | reference | dkernel | pass | s | resolved |"


def markdown(rows: list[dict]) -> str:
    lines = [_TABLE_HEADER, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['estimator']} | {r['regime']} | error | | | **FAIL** | "
                         f"| {r['error']} |")
            continue
        verdict = {True: "pass", False: "**FAIL**", None: "unchecked"}[r["passed"]]
        res = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in r["resolved"].items())
        lines.append(f"| {r['estimator']} | {r['regime']} | {r['metric']} | {r['reference']:.3f} "
                     f"| {r['score']:.3f} | {verdict} | {r['seconds']:.1f} | {res} |")
    return "\n".join(lines) + "\n"


def _is_our_table(path: str) -> bool:
    """Whether ``path`` may be written: it does not exist, or it is a table
    :func:`markdown` wrote (its first line is the header)."""
    try:
        with open(path) as f:
            return f.readline().rstrip("\n") == _TABLE_HEADER
    except FileNotFoundError:
        return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--quick", action="store_true", help="only the slice the test suite runs")
    p.add_argument("--only", action="append", default=[],
                   help="an estimator or regime name (repeatable): cells of any named "
                        "estimator in any named regime")
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--markdown", help="write the table as Markdown here (a new file, or one "
                                      "this script wrote: anything else is refused)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lanes", type=int, metavar="W",
                   help="run the DSG and EigenPro regression and classification cells at "
                        "lanes=W, their rows in W chunks: the steps of a W-worker cluster on "
                        "this box (other cells run as without it)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="an estimator parameter away from its default (repeatable), to find "
                        "the setting that passes a failed cell")
    args = p.parse_args(argv)
    params = {}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value

    if args.markdown and not _is_our_table(args.markdown):
        # checked before the run, so a long run does not end in a refusal
        p.error(f"--markdown {args.markdown}: that file exists and is not a table this "
                f"script wrote (its first line is not {_TABLE_HEADER!r}); it is not "
                "overwritten: give a new path, e.g. --markdown quality-table.md")

    from distributed import Client, LocalCluster

    todo = cells(args.only, args.quick)
    if not todo:
        p.error(f"no cell matches --only {args.only}")
    rows = []
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        for name, regime in todo:
            try:
                row = run_cell(name, regime, client, params=params, width=args.lanes)
            except Exception as e:  # a cell that cannot run is a failed cell, not a stop
                row = {"estimator": name, "regime": regime.name, "passed": False,
                       "error": f"{type(e).__name__}: {e}"}
            row["setting"] = {**asdict(regime), **params,
                              **({"lanes": args.lanes} if args.lanes and name in _WIDE
                                 else {})}
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
            verdict = {True: "pass", False: "FAIL", None: "unchecked"}[row["passed"]]
            print(f"{name} / {regime.name}: {row.get('score')} vs {row.get('reference')} "
                  f"{verdict} {row.get('error', '')}", file=sys.stderr, flush=True)
    table = markdown(rows)
    print(table)
    if args.json:
        replaced = os.path.exists(args.json)  # (a run's rows over another's: said)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
        print(f"rows: {args.json}" + (" (replaced the file that was there)" if replaced else ""),
              file=sys.stderr)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    count = {v: sum(r["passed"] is v for r in rows) for v in (True, False, None)}
    # an unchecked cell is not a pass: it is counted on its own
    print(f"{count[True]} pass, {count[False]} fail, {count[None]} unchecked "
          f"(of {len(rows)} cells)", file=sys.stderr)
    return 1 if count[False] else 0


if __name__ == "__main__":
    sys.exit(main())
