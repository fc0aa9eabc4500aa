"""Streaming kernel PCA's error floor against the stream length (Deng, Song, Wang, Zhang).

A synthetic stream x ~ N(0, 1) (dkernel.datasets.make_hermite), Gaussian kernel of
bandwidth 1, D random features.  For each n the script fits StreamingKernelPCA
(one component, one pass) and reports 1 - <x*, u>^2, with x* the top eigenvector
of the stream's own feature covariance Sigma = (1/n) sum z_i z_i^T (centred for
the default ``center=True``), as in Deng et al.'s Theorem 1.1.

Three settings per n:
- ``theorem``: the default step, eta = 2 log D / (n lambda_1) (Deng et al.'s regime);
- ``paper``: the same with ``center=False`` (the paper's uncentred covariance);
- ``constant``: the former default, a constant eta = 0.05 whatever n.
With the theorem's step the error falls with n; with a constant step it stays at
an O(eta) floor.

    python benchmarks/oja_error_floor.py [--n 10000 100000 1000000] [--features 256]

Every fit passes ``n_passes=1``: since commit f9275e9 ``n_passes="auto"`` streams
at least 16384 rows (2 passes at n = 1e4), which is not the one-pass stream the
theorem is about.

Measured at commit 12737fd (2 workers on a shared 2-core VM, before
``n_passes`` existed, so one pass; docs/guide/components.md has the table):
theorem 8.5e-4 / 9.0e-6 / 4.3e-6, paper 1.9e-3 / 1.7e-6 / 2.6e-6, constant
1.5e-2 / 7.2e-3 / 8.3e-4 at n = 1e4 / 1e5 / 1e6; about 5 minutes in all.  At 1e6 the
theorem's step meets its bias: eta n lambda_1 = 2 log D is fixed, so the start's
weight on the second eigenvector decays to D^(-4 (1 - lambda_2 / lambda_1)) ~ 1e-6
whatever n (for this stream lambda_2 / lambda_1 ~ 0.38).
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import dask.array as da
import numpy as np
from distributed import Client, LocalCluster

from dkernel import StreamingKernelPCA
from dkernel.datasets import make_hermite


def top_eigenvector(model: StreamingKernelPCA, X: np.ndarray, center: bool) -> np.ndarray:
    """x*: top eigenvector of the stream's feature covariance, accumulated in float64
    over slices (n x D never held at once)."""
    D = model.n_features_
    S, s, n = np.zeros((D, D)), np.zeros(D), len(X)
    for a in range(0, n, 50_000):
        Z = model.feature_map(X[a : a + 50_000]).astype(np.float64)
        S += Z.T @ Z
        s += Z.sum(axis=0)
    cov = S / n - (np.outer(s, s) / n**2 if center else 0.0)
    return np.linalg.eigh(cov)[1][:, -1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--chunk", type=int, default=20_000)
    p.add_argument("--block-rows", dest="block_rows", type=int, default=128)
    args = p.parse_args()
    settings = {"theorem": dict(center=True), "paper": dict(center=False),
                "constant": dict(center=True, step_size=0.05)}
    rows = []
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                     silence_logs=logging.ERROR) as cluster,
        Client(cluster) as client,
    ):
        for n in args.n:
            X = make_hermite(n, 1, sigma=1.0, random_state=0)
            Xd = da.from_array(X, chunks=(min(args.chunk, n), 1))
            for name, kw in settings.items():
                t0 = time.perf_counter()
                model = StreamingKernelPCA(1, bandwidth=1.0, n_features=args.features,
                                           block_rows=args.block_rows, n_passes=1,
                                           client=client, **kw).fit(Xd)
                seconds = time.perf_counter() - t0
                x_star = top_eigenvector(model, X, kw["center"])
                err = 1 - float(x_star @ model.components_[:, 0]) ** 2
                rows.append({"n": n, "setting": name, "eta": model.eta_, "error": err,
                             "n_passes": model.n_passes_, "seconds": round(seconds, 1)})
                print(f"n={n:>8d}  {name:9s} eta={model.eta_:.2e}  1-<x*,u>^2={err:.2e}  "
                      f"{seconds:.1f} s", flush=True)
    print(json.dumps({"features": args.features, "rows": rows}))


if __name__ == "__main__":
    main()
