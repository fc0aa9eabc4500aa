"""dkernel demo: the main job end to end on the embedded default.

Creates train/test zarr stores of a synthetic non-linear classification
problem, starts a LocalCluster, fits a DSG classifier, evaluates it, saves
the model and prints the equivalent individual commands.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import time

from dkernel.cli import common


def register(sub: argparse._SubParsersAction) -> None:
    p = common.add_command(
        sub, "demo", "run the main job end to end on a LocalCluster (synthetic data)",
        "Write synthetic train/test dataset stores, start a LocalCluster, fit a DSG "
        "classifier, evaluate and save it, and print the equivalent commands.")
    p.add_argument("--out", default="dkernel-demo", help="folder for the stores and the model")
    p.add_argument("--rows", type=int, default=20000, help="training rows")
    p.add_argument("--features", type=int, default=2048, help="n_features, random features")
    p.add_argument("--epochs", type=int, default=5, help="n_epochs")
    p.add_argument("--seed", type=int, default=0, help="random_state")
    common.cluster_job(p, run)


def run(args: argparse.Namespace) -> int:
    from dkernel import DSGClassifier
    from dkernel.cli.predict import metrics
    from dkernel.data import open_dataset
    from dkernel.datasets import make_store

    # checked before anything is written (--epochs 0 was refused once both stores
    # were, naming n_epochs; --rows 0 left an empty folder)
    for flag, value, least in (("--rows", args.rows, 16), ("--features", args.features, 1),
                               ("--epochs", args.epochs, 1)):
        if value < least:
            raise ValueError(f"{flag} must be at least {least}, got {value}")
    train, test = os.path.join(args.out, "train.zarr"), os.path.join(args.out, "test.zarr")
    model_path = os.path.join(args.out, "model.npz")
    for path in (train, test, model_path):
        common.check_output(path, args.overwrite, store=path != model_path,
                            model=path == model_path)
    os.makedirs(args.out, exist_ok=True)
    def say(message: str) -> None:  # progress: stderr, dropped by --quiet
        common.status(args, message)

    with common.connect_cluster(args) as client:
        say(f"[1/4] cluster: {len(client.nthreads())} workers at "
            f"{client.scheduler.address}")
        t0 = time.perf_counter()
        make_store(train, args.rows, 10, chunk_rows=max(1, args.rows // 8), random_state=args.seed,
                   overwrite=True, client=client)
        make_store(test, max(1000, args.rows // 4), 10, chunk_rows=max(1, args.rows // 8),
                   random_state=args.seed + 1, overwrite=True, client=client)
        say(f"[2/4] the workers wrote {train} and {test} ({time.perf_counter() - t0:.1f}s)")
        t1 = time.perf_counter()
        model = DSGClassifier(n_features=args.features, n_epochs=args.epochs,
                              random_state=args.seed, bandwidth=2.0, client=client,
                              verbose=not args.quiet)
        model.fit(train)
        say(f"[3/4] fitted DSGClassifier (bandwidth {model.bandwidth_:.3g}) in "
              f"{time.perf_counter() - t1:.1f}s")
        model.set_params(client=None)
        model.save(model_path)
        data = open_dataset(test, require_y=True)
        result = metrics(model, data.X, data.y)
    if args.json:
        common.emit(args, {"model": model_path, "train": train, "test": test,
                           "seconds": time.perf_counter() - t0, **result})
        return 0
    # the result, on stdout (as emit prints it): the model and the commands that remake it
    print(f"[4/4] saved {model_path}; test metrics: {json.dumps(result)}")
    # runnable as printed: on the same cluster (its flags), over the model just saved
    cluster = "".join(f" {flag} {shlex.quote(str(value))}" for flag, value in (
        ("--scheduler", args.scheduler), ("--workers", args.workers),
        ("--tls-ca-file", args.tls_ca_file), ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key)) if value is not None)
    q = shlex.quote
    print("The same with individual commands:\n"
          f"  dkernel fit {q(train)} --solver dsg --task classification --bandwidth 2 "
          f"--features {args.features} --epochs {args.epochs} --seed {args.seed} "
          f"--out {q(model_path)} --overwrite{cluster}\n"
          f"  dkernel evaluate {q(model_path)} {q(test)} --json{cluster}")
    return 0
