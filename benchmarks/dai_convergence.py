"""Dai et al. 2014, Figure 4(2): the O(1/t) convergence of doubly stochastic
kernel ridge regression on the paper's 2-D synthetic problem.

    y = cos(0.5 pi |x|) exp(-0.1 pi |x|) + 0.1 e,   x ~ U[-5, 5]^2,  e ~ N(0, 1)

Gaussian kernel with bandwidth 0.1 x the median pairwise distance, nu = 1e-6,
and Alg. 1 as printed (``preconditioner=None``): every step draws a fresh
block of B features, so after t steps f has t B features, and
gamma_t = theta / (1 + t) with theta = 1 / lambda_1 (DSG's automatic step).  The paper used batch and block 2^10 on 2^20
points; the defaults here are 2^8 (each step evaluates all earlier blocks, so
a run costs O(t^2 B m)).

For each t the script fits on the first t x batch rows (one pass, so step t
sees fresh rows) and measures |f_t - f*|^2 on held-out points, with f* the
noiseless target (nu is negligible), for the averaged iterate
(1/t) sum_i f_i -- what the paper's figure plots (``average=True``) -- and
for the last one.  It prints the errors and the slopes of log error against
log t; the paper's is -1.

    python benchmarks/dai_convergence.py                              # ~2 min
    python benchmarks/dai_convergence.py --batch 1024 --block 1024     # the paper's sizes, ~10 min

Measured on the 2-core VM, t = 16..256: slopes -0.53 (averaged) / -0.48
(last) at 2^8, and -0.81 / -0.73 at the paper's 2^10.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import numpy as np


def target(X: np.ndarray) -> np.ndarray:
    r = np.linalg.norm(X, axis=1)
    return np.cos(0.5 * np.pi * r) * np.exp(-0.1 * np.pi * r)


def data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-5, 5, (n, 2))
    return X.astype(np.float32), (target(X) + 0.1 * rng.standard_normal(n)).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--theta", default="auto", type=lambda v: v if v == "auto" else float(v),
                   help="gamma_t = theta / (1 + t); auto: 1 / lambda_1 of the kernel on a sample")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()

    from distributed import Client, LocalCluster

    from dkernel import DSGRegressor
    from dkernel.kernels import median_heuristic

    n = max(args.steps) * args.batch
    X, y = data(n, 0)
    Xt = np.random.default_rng(1).uniform(-5, 5, (20000, 2)).astype(np.float32)
    ft = target(Xt.astype(np.float64))
    bandwidth = 0.1 * median_heuristic(X[:1000].astype(np.float64), "gaussian")
    rows = {"average": [], "last": []}
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        for t in args.steps:
            for kind in ("average", "last"):
                t0 = time.perf_counter()
                m = DSGRegressor(bandwidth=bandwidth, n_features=t * args.block,
                                 block_size=args.block, alpha=1e-6, batch_size=args.batch,
                                 n_epochs=1, lanes=1, step_size=args.theta, step_decay=1.0,
                                 preconditioner=None, average=kind == "average",
                                 client=client).fit(X[: t * args.batch], y[: t * args.batch])
                err = float(np.mean((m.predict(Xt).astype(np.float64) - ft) ** 2))
                rows[kind].append({"t": t, "error": err, "seconds": time.perf_counter() - t0})
                print(f"t = {t:5d}, {kind:7s} iterate: |f_t - f*|^2 = {err:.3e} "
                      f"({rows[kind][-1]['seconds']:.1f} s)", flush=True)
    slopes = {}
    for kind, rs in rows.items():
        ts = np.log([r["t"] for r in rs])
        es = np.log([r["error"] for r in rs])
        slopes[kind] = float(np.polyfit(ts, es, 1)[0])
        print(f"{kind} iterate: fitted slope of log error against log t: {slopes[kind]:.2f} "
              "(O(1/t): -1)")
    print(json.dumps({"settings": vars(args), "bandwidth": bandwidth, "rows": rows,
                      "slopes": slopes}))


if __name__ == "__main__":
    main()
