"""EigenPro-RF where the model cannot interpolate (n >> D): issue 28's case.

Fits ``EigenProRegressor(n_features=2048, bandwidth=2.0)`` and
``DSGRegressor`` with the same settings on a 200k x 32 synthetic regression
store (Dai et al.'s ridge target) and prints each model's test R^2 on 20k
fresh rows, with EigenPro's resolved q, batch and iterate-average horizon.
Constant steps at the critical batch (a few thousand rows) hover in a noise
ball here; the averaged iterate (solvers/eigenpro_rf.py) is what removes it.

    python benchmarks/rf_noise_floor.py                 # 10 epochs (the default), seed 0
    python benchmarks/rf_noise_floor.py --epochs 1 --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

from distributed import Client, LocalCluster
from throughput import store_chunking, store_mismatch

from dkernel import DSGRegressor, EigenProRegressor
from dkernel.datasets.synthetic import make_dai_ridge, make_store
from dkernel.solvers.eigenpro_rf import average_horizon


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--store", default=None,
                   help="reuse / keep the store here (without it, a temporary store is written "
                        "and removed at the end)")
    args = p.parse_args()
    if args.store and os.path.exists(args.store):
        # reused by its path: it must be the store --rows would write
        wrong = store_mismatch(args.store, args.rows, 32, 65536)
        if wrong:
            p.error(wrong)
    temporary = None if args.store else tempfile.mkdtemp()
    try:
        store = args.store or os.path.join(temporary, f"train-{args.rows}x32.zarr")
        if not os.path.exists(store):
            make_store(store, args.rows, 32, chunk_rows=65536, kind="regression")
        print(json.dumps({"store": store, **store_chunking(store)}), flush=True)
        fit_both(args, store)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def fit_both(args, store: str) -> None:
    X_test, y_test = make_dai_ridge(20_000, 32, random_state=987654)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        for cls in (EigenProRegressor, DSGRegressor):
            t0 = time.perf_counter()
            model = cls(n_features=2048, bandwidth=2.0, n_epochs=args.epochs, client=client,
                        random_state=args.seed).fit(store)
            row = {"estimator": cls.__name__, "seed": args.seed, "epochs": args.epochs,
                   "r2": round(float(model.score(X_test, y_test)), 4), "q": model.q_,
                   "batch_size": model.batch_size_, "step_backoffs": len(model.step_backoffs_),
                   "seconds": round(time.perf_counter() - t0, 1)}
            if cls is EigenProRegressor:
                row["average_horizon"] = average_horizon(args.rows, model.coef_.shape[0],
                                                         model.batch_size_)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
