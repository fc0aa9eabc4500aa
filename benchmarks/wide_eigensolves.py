"""Eigensolves of a feature covariance with fewer rows than features, both ways,
in the same run: the order-n solve that dkernel takes (the rows' n x n Gram)
against the order-N solve of the D x D covariance it replaced.

Two cases, each as a fit uses it:

- the preconditioner of KernelCCA / DSG / EigenPro-RF: top k pairs of the
  centred covariance of N = 4096 features on n sampled rows, summed on the
  workers (``linalg.dense_eigensystem``, with and without ``n_inputs``);
- DSGRegressor's GP posterior factor (``solvers.gp``), from Phi on the client.

Prints seconds, the ratio, and how far the two answers are apart.

    python benchmarks/wide_eigensolves.py [--rows 2000] [--features 4096] [--pairs 128]
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
from distributed import Client, LocalCluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--features", type=int, default=4096)
    ap.add_argument("--pairs", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    from dkernel.data import open_dataset
    from dkernel.engine import Engine
    from dkernel.features import FeatureMap
    from dkernel.linalg import dense_eigensystem
    from dkernel.solvers import gp
    from dkernel.solvers.eigenpro_rf import feature_block

    n, D = args.rows, args.features
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 10)).astype(np.float32)
    fm = FeatureMap("gaussian", 3.0, 10, 1024, random_state=1)
    params = {"features": fm, "n_blocks": D // 1024}
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        engine = Engine(client)
        data = open_dataset(X, chunk_rows=max(1, n // 4))
        print(f"{n} rows, {D} features, top {args.pairs} pairs of the centred covariance "
              "(float64), 2 workers")

        def solve(n_inputs):
            return dense_eigensystem(engine, data, feature_block, params, args.pairs,
                                     center=True, n_inputs=n_inputs)

        t_a, t_b = _best(lambda: solve(D), args.repeats), _best(lambda: solve(None), args.repeats)
        a, b = solve(D), solve(None)
        print(f"  order n (dkernel) {t_a:6.2f} s\n  order N (before)  {t_b:6.2f} s "
              f"(best of {args.repeats}, the pass over the rows included)")
        lead = int(np.sum(b.values > 1e-6 * b.values[0]))
        cos = np.abs(np.sum(a.vectors[:, :10] * b.vectors[:, :10], axis=0))
        print(f"  ratio {t_a / t_b:.2f}x; eigenvalues agree to "
              f"{np.max(np.abs(a.values[:lead] - b.values[:lead])) / b.values[0]:.1e} of "
              f"lambda_1; top-10 vectors |cos| >= {cos.min():.6f}")

    Phi = fm.transform(X, D // 1024)
    alpha = 1e-4
    t_rows = _best(lambda: gp.posterior_factor_from_rows(Phi, alpha), args.repeats)
    t_cov = _best(lambda: gp.posterior_factor((Phi.T @ Phi).astype(np.float64), n, alpha),
                  args.repeats)
    P64 = Phi.astype(np.float64)
    exact = gp.posterior_factor(P64.T @ P64, n, alpha)
    ref = exact @ exact.T
    f_rows = gp.posterior_factor_from_rows(Phi, alpha)
    f_cov = gp.posterior_factor((Phi.T @ Phi).astype(np.float64), n, alpha)
    print(f"GP posterior factor, alpha {alpha}, on the client:")
    print(f"  order n (dkernel) {t_rows:6.2f} s, error {np.abs(f_rows @ f_rows.T - ref).max():.1e}")
    print(f"  order N (before)  {t_cov:6.2f} s, error {np.abs(f_cov @ f_cov.T - ref).max():.1e}")
    print(f"  ratio {t_rows / t_cov:.2f}x (error: max |F F^T - exact| against float64 products)")


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


if __name__ == "__main__":
    main()
