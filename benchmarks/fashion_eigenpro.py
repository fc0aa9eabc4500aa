"""Fashion-MNIST: EigenProClassifier (defaults) vs scikit-learn Nystroem(2000) + RidgeClassifier.

EigenPro runs as ``dkernel fit --solver eigenpro --task classification
--kernel gaussian --bandwidth 5`` would (every other setting at its default)
on a 2-worker LocalCluster, reading the training data from its zarr store;
its time covers fit (preconditioner included) and prediction of the 10k test
rows.  The scikit-learn pipeline (same kernel, gamma = 1 / (2 * 5^2)) is
timed in the same run on the same arrays.  Prints both accuracies, both wall
times and their ratios.

    python benchmarks/fashion_eigenpro.py
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from _fashion import fashion_stores, load_arrays


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="/tmp/dkernel-fashion", help="folder for the zarr stores")
    p.add_argument("--bandwidth", type=float, default=5.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--skip-sklearn", action="store_true")
    args = p.parse_args()

    from distributed import Client, LocalCluster

    from dkernel import EigenProClassifier

    train, test = fashion_stores(args.data)
    Xte, yte = load_arrays(test)
    results = {}
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        t0 = time.perf_counter()
        model = EigenProClassifier(kernel="gaussian", bandwidth=args.bandwidth, client=client, verbose=True)
        model.fit(train)
        t_fit = time.perf_counter() - t0
        acc = model.score(Xte, yte)
        seconds = time.perf_counter() - t0
        results["eigenpro"] = {"accuracy": acc, "seconds": seconds, "fit_seconds": t_fit,
                               "q": model.q_, "batch_size": model.batch_size_, "eta": model.step_size_,
                               "critical_batch": model.critical_batch_, "kernel_cache": model.kernel_cache_,
                               "lambda_1": float(model.eigenvalues_[0]),
                               "lambda_q+1": float(model.eigenvalues_[model.q_])}
        print(f"EigenProClassifier: accuracy {acc:.4f} in {seconds:.1f}s (fit {t_fit:.1f}s)", flush=True)

    if not args.skip_sklearn:
        from sklearn.kernel_approximation import Nystroem
        from sklearn.linear_model import RidgeClassifier
        from sklearn.pipeline import make_pipeline

        Xtr, ytr = load_arrays(train)
        t0 = time.perf_counter()
        pipe = make_pipeline(Nystroem(gamma=1.0 / (2 * args.bandwidth**2), n_components=2000, random_state=0),
                             RidgeClassifier())
        pipe.fit(Xtr, ytr)
        acc = float(pipe.score(Xte, yte))
        results["sklearn"] = {"accuracy": acc, "seconds": time.perf_counter() - t0}
        print(f"Nystroem(2000)+RidgeClassifier: accuracy {acc:.4f} in {results['sklearn']['seconds']:.1f}s")
        results["ratio"] = {
            "accuracy_eigenpro_over_sklearn": results["eigenpro"]["accuracy"] / acc,
            "time_eigenpro_over_sklearn": results["eigenpro"]["seconds"] / results["sklearn"]["seconds"]}
        print(f"ratio EigenPro/sklearn: accuracy {results['ratio']['accuracy_eigenpro_over_sklearn']:.3f}, "
              f"time {results['ratio']['time_eigenpro_over_sklearn']:.2f}")
    results["settings"] = vars(args)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
