"""Fashion-MNIST: DSGClassifier vs scikit-learn RBFSampler + SGDClassifier.

Both use the same kernel (Gaussian, same bandwidth) and the same number of
random features; both are timed in this run, end to end (fit + test
prediction; DSG reads the training data from its zarr store on a 2-worker
LocalCluster).  Prints both accuracies, both wall times and their ratios.
scikit-learn's clock starts after its arrays are loaded from the same
stores; that load is timed too and printed beside the time ratio, with the
ratio it gives when added to scikit-learn's time.

    python benchmarks/fashion_dsg.py                 # defaults below
    python benchmarks/fashion_dsg.py --features 4096 --epochs 4
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from _fashion import fashion_stores, load_arrays


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--data", default="/tmp/dkernel-fashion", help="folder for the zarr stores")
    p.add_argument("--features", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--bandwidth", type=float, default=5.0)
    p.add_argument("--step-size", default="auto", type=lambda v: v if v == "auto" else float(v))
    p.add_argument("--step-decay", type=float, default=0.002)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--skip-sklearn", action="store_true")
    args = p.parse_args()

    from distributed import Client, LocalCluster

    from dkernel import DSGClassifier
    from dkernel.data import open_dataset

    train, test = fashion_stores(args.data)
    t0 = time.perf_counter()
    Xte, yte = load_arrays(test)  # DSG scores the test store's X itself, in its time
    load_test = time.perf_counter() - t0
    results = {}
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        t0 = time.perf_counter()
        model = DSGClassifier(bandwidth=args.bandwidth, n_features=args.features,
                              block_size=args.block_size, n_epochs=args.epochs,
                              batch_size=args.batch_size, step_size=args.step_size,
                              step_decay=args.step_decay, client=client, verbose=True)
        model.fit(train)
        acc = model.score(open_dataset(test).X, yte)
        results["dsg"] = {"accuracy": acc, "seconds": time.perf_counter() - t0}
        print(f"DSGClassifier: accuracy {acc:.4f} in {results['dsg']['seconds']:.1f}s", flush=True)

    if not args.skip_sklearn:
        from sklearn.kernel_approximation import RBFSampler
        from sklearn.linear_model import SGDClassifier
        from sklearn.pipeline import make_pipeline

        t0 = time.perf_counter()
        Xtr, ytr = load_arrays(train)
        load = load_test + time.perf_counter() - t0
        t0 = time.perf_counter()
        pipe = make_pipeline(
            RBFSampler(gamma=1.0 / (2 * args.bandwidth**2), n_components=args.features,
                       random_state=0),
            SGDClassifier(n_jobs=args.workers, random_state=0))
        pipe.fit(Xtr, ytr)
        acc = float(pipe.score(Xte, yte))
        results["sklearn"] = {"accuracy": acc, "seconds": time.perf_counter() - t0,
                              "load_seconds": load}
        seconds = results["sklearn"]["seconds"]
        print(f"RBFSampler+SGDClassifier: accuracy {acc:.4f} in {seconds:.1f}s "
              f"(and {load:.1f}s loading its arrays before that)")
        results["ratio"] = {
            "accuracy_dsg_over_sklearn": results["dsg"]["accuracy"] / acc,
            "time_dsg_over_sklearn": results["dsg"]["seconds"] / seconds,
            "time_dsg_over_sklearn_with_its_load": results["dsg"]["seconds"] / (seconds + load)}
        print(f"ratio DSG/sklearn: accuracy {results['ratio']['accuracy_dsg_over_sklearn']:.3f}, "
              f"time {results['ratio']['time_dsg_over_sklearn']:.2f} (scikit-learn's fit and "
              f"prediction; {results['ratio']['time_dsg_over_sklearn_with_its_load']:.2f} with "
              f"its {load:.1f}s array load added)")
    results["settings"] = vars(args)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
