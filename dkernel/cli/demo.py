"""``dkernel demo``: the main job end to end on the embedded default.

Creates train/test zarr stores of a synthetic non-linear classification
problem, starts a LocalCluster, fits a DSG classifier, evaluates it, saves
the model and prints the equivalent individual commands.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from dkernel.cli.common import add_cluster_args, cluster_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job end to end on a LocalCluster (synthetic data)",
                       description=__doc__.splitlines()[0])
    p.add_argument("--out", default="dkernel-demo", help="folder for the stores and the model")
    p.add_argument("--rows", type=int, default=20000, help="training rows")
    p.add_argument("--features", type=int, default=2048, help="n_features")
    p.add_argument("--epochs", type=int, default=5, help="n_epochs")
    p.add_argument("--seed", type=int, default=0, help="random_state")
    add_cluster_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dkernel import DSGClassifier
    from dkernel.cli.predict import metrics
    from dkernel.data import open_dataset
    from dkernel.datasets import make_store
    from dkernel.engine import connect

    os.makedirs(args.out, exist_ok=True)
    train, test = os.path.join(args.out, "train.zarr"), os.path.join(args.out, "test.zarr")
    model_path = os.path.join(args.out, "model.npz")
    t0 = time.perf_counter()
    make_store(train, args.rows, 10, chunk_rows=max(1, args.rows // 8), random_state=args.seed,
               overwrite=True)
    make_store(test, max(1000, args.rows // 4), 10, chunk_rows=max(1, args.rows // 8),
               random_state=args.seed + 1, overwrite=True)
    print(f"[1/4] wrote {train} and {test} ({time.perf_counter() - t0:.1f}s)")
    with connect(**cluster_options(args)) as client:
        print(f"[2/4] cluster: {len(client.scheduler_info(n_workers=-1)['workers'])} workers at "
              f"{client.scheduler.address}")
        t1 = time.perf_counter()
        model = DSGClassifier(n_features=args.features, n_epochs=args.epochs, random_state=args.seed,
                              bandwidth=2.0, client=client, verbose=True)
        model.fit(train)
        print(f"[3/4] fitted DSGClassifier (bandwidth {model.bandwidth_:.3g}) in "
              f"{time.perf_counter() - t1:.1f}s")
        model.set_params(client=None)
        model.save(model_path)
        data = open_dataset(test, require_y=True)
        result = metrics(model, data.X, data.y)
    print(f"[4/4] saved {model_path}; test metrics: {json.dumps(result)}")
    print("The same with individual commands:\n"
          f"  dkernel fit {train} --solver dsg --task classification --bandwidth 2 "
          f"--features {args.features} --epochs {args.epochs} "
          f"--out {model_path}\n"
          f"  dkernel evaluate {model_path} {test} --json")
    return 0
