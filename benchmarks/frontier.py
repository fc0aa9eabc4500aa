"""The frontier through the CLI: what a user runs, against a scikit-learn peer, same run.

Each dkernel entry is ``dkernel fit`` then ``dkernel evaluate`` as README
shows them, run as subprocesses and timed on the wall clock: imports, the
LocalCluster's start, reading the zarr store, the fit, the model file and
the evaluation.  DSG is also timed through the Python API (fit + score on a
LocalCluster started beforehand), the path the issue's target names.  The
peers run in memory on the same arrays, after dkernel, on the kernel width
dkernel resolved: DSG's "auto" bandwidth is the ``bandwidth_`` of the
Python-API DSG fit (the CLI fit's model file is not read; same data and seed),
EigenPro's the 5 it is given.  The peers' clocks start after their arrays
are loaded from the same stores (dkernel's times include its reads); that
load is timed too and printed beside each ratio, with the ratio it gives
when added to the peer's time.

    python benchmarks/frontier.py                    # DSG and its peer (~2 min)
    python benchmarks/frontier.py --eigenpro         # + EigenPro vs Nystroem(10000) (~12 min)

Prints one line per entry and the ratios, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time

from _fashion import fashion_stores, load_arrays


def cli(*args: str) -> tuple[dict, float]:
    """Run ``dkernel ARGS --json`` and return (its JSON result, wall seconds)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "dkernel", *args, "--json", "--quiet"],
                         capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:  # dkernel's own message, which capture_output would hide
        sys.stderr.write(f"dkernel {' '.join(args)} exited with {out.returncode}:\n{out.stderr}")
        out.check_returncode()
    return json.loads(out.stdout.strip().splitlines()[-1]), seconds


def fit_and_evaluate(train: str, test: str, model: str, workers: int, *flags: str) -> dict:
    fitted, fit_s = cli("fit", train, "--out", model, "--overwrite", "--workers", str(workers),
                        *flags)
    scores, eval_s = cli("evaluate", model, test, "--workers", str(workers))
    return {"accuracy": scores["accuracy"], "seconds": fit_s + eval_s, "fit_seconds": fit_s,
            "evaluate_seconds": eval_s, "fit_inner_seconds": fitted["seconds"],
            "feature_cache": fitted.get("feature_cache")}


def python_dsg(train: str, test: str, n_features: int, workers: int) -> dict:
    from distributed import Client, LocalCluster

    from dkernel import DSGClassifier
    from dkernel.data import open_dataset

    _, yte = load_arrays(test)
    with LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        t0 = time.perf_counter()
        model = DSGClassifier(n_features=n_features, client=client).fit(train)
        acc = model.score(open_dataset(test).X, yte)
        return {"accuracy": float(acc), "seconds": time.perf_counter() - t0,
                "bandwidth": float(model.bandwidth_), "feature_cache": model.feature_cache_,
                "preconditioner_seconds": model.preconditioner_seconds_,
                "epoch_seconds": [round(e["seconds"], 2) for e in model.history_]}


def rbf_sgd(train: str, test: str, bandwidth: float, n_features: int, workers: int) -> dict:
    from sklearn.kernel_approximation import RBFSampler
    from sklearn.linear_model import SGDClassifier
    from sklearn.pipeline import make_pipeline

    t0 = time.perf_counter()
    (Xtr, ytr), (Xte, yte) = load_arrays(train), load_arrays(test)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    pipe = make_pipeline(RBFSampler(gamma=1.0 / (2 * bandwidth**2), n_components=n_features,
                                    random_state=0),
                         SGDClassifier(n_jobs=workers, random_state=0)).fit(Xtr, ytr)
    return {"accuracy": float(pipe.score(Xte, yte)), "seconds": time.perf_counter() - t0,
            "load_seconds": load}


def nystroem_ridge(train: str, test: str, bandwidth: float, n_components: int) -> dict:
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import RidgeClassifier
    from sklearn.pipeline import make_pipeline

    t0 = time.perf_counter()
    (Xtr, ytr), (Xte, yte) = load_arrays(train), load_arrays(test)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    pipe = make_pipeline(Nystroem(gamma=1.0 / (2 * bandwidth**2), n_components=n_components,
                                  random_state=0), RidgeClassifier()).fit(Xtr, ytr)
    return {"accuracy": float(pipe.score(Xte, yte)), "seconds": time.perf_counter() - t0,
            "load_seconds": load}


def over_peer(r: dict, peer: dict) -> dict:
    """An entry against its peer: time (the peer's fit and score), the same with
    the peer's array load added, and accuracy in points."""
    return {"time": r["seconds"] / peer["seconds"],
            "time_with_peer_load": r["seconds"] / (peer["seconds"] + peer["load_seconds"]),
            "peer_load_seconds": peer["load_seconds"],
            "accuracy_points": 100 * (r["accuracy"] - peer["accuracy"])}


def ratio_line(name: str, peer_name: str, v: dict) -> str:
    return (f"{name} / {peer_name}: time {v['time']:.2f}x (the peer's fit and score; its "
            f"arrays loaded in {v['peer_load_seconds']:.1f} s before its clock, "
            f"{v['time_with_peer_load']:.2f}x with that load), accuracy "
            f"{v['accuracy_points']:+.2f} points")


def _cores() -> int:
    """The cores this process may use (Dask's count: CPU set and quota), as dkernel's
    own LocalCluster counts them."""
    from dask.system import cpu_count

    return cpu_count()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--data", default="/tmp/dkernel-fashion", help="folder for the zarr stores")
    p.add_argument("--n-features", type=int, default=8192)
    p.add_argument("--workers", type=int, default=_cores(),
                   help="worker processes: the Python-API fit's LocalCluster, the CLI "
                        "entries' (dkernel fit/evaluate --workers) and the SGD peer's n_jobs "
                        "(default: one per core)")
    p.add_argument("--eigenpro", action="store_true",
                   help="also dkernel fit --solver eigenpro --bandwidth 5 vs Nystroem+Ridge")
    p.add_argument("--nystroem-components", type=int, default=10000)
    args = p.parse_args()

    train, test = fashion_stores(args.data)
    out: dict = {"settings": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        out["dsg_cli"] = fit_and_evaluate(train, test, os.path.join(tmp, "dsg.npz"),
                                          args.workers, "--solver", "dsg", "--n-features",
                                          str(args.n_features))
        out["dsg_python"] = python_dsg(train, test, args.n_features, args.workers)
        bandwidth = out["dsg_python"]["bandwidth"]
        out["rbf_sgd"] = rbf_sgd(train, test, bandwidth, args.n_features, args.workers)
        if args.eigenpro:
            out["eigenpro_cli"] = fit_and_evaluate(train, test, os.path.join(tmp, "ep.npz"),
                                                   args.workers, "--solver", "eigenpro",
                                                   "--bandwidth", "5")
            out["nystroem_ridge"] = nystroem_ridge(train, test, 5.0, args.nystroem_components)
    for name in ("dsg_cli", "dsg_python", "rbf_sgd", "eigenpro_cli", "nystroem_ridge"):
        if name in out:
            r = out[name]
            load = (f" (and {r['load_seconds']:.1f} s loading its arrays before that)"
                    if "load_seconds" in r else "")
            print(f"{name}: accuracy {r['accuracy']:.4f} in {r['seconds']:.1f} s{load}",
                  flush=True)
    for name in ("dsg_cli", "dsg_python"):
        out[f"{name}_over_rbf_sgd"] = over_peer(out[name], out["rbf_sgd"])
        print(ratio_line(name, f"RBFSampler({args.n_features})+SGD",
                         out[f"{name}_over_rbf_sgd"]))
    if args.eigenpro:
        out["eigenpro_cli_over_nystroem"] = over_peer(out["eigenpro_cli"], out["nystroem_ridge"])
        print(ratio_line("eigenpro_cli", f"Nystroem({args.nystroem_components})+Ridge",
                         out["eigenpro_cli_over_nystroem"]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
