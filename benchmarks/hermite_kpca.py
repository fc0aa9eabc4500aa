"""Convergence rate of doubly stochastic KPCA (Xie et al. 2015, section 7.1, Figure 1).

x ~ N(0, 1), Gaussian kernel with the true bandwidth 1: the top-3 eigenfunctions
of the uncentred covariance operator are Hermite functions (dkernel.datasets.hermite).
Every step draws a fresh data mini-batch (one pass, n = steps * batch) and a
fresh feature block (pool = steps * block, no revisits), as in the paper.  The
potential is sin^2 of the largest principal angle between the learned
functions and the true ones, measured on 5000 held-out points at 25
geometrically spaced steps from t = 4; the script fits
log sin^2 = a + slope log t over the recorded t >= 2 sqrt(4 T), past the
transient (t from 128 of the default T = 1024 steps; ``fit_from_t``).

    python benchmarks/hermite_kpca.py [--steps 1024]
"""

from __future__ import annotations

import argparse
import json
import logging
import time

import dask.array as da
import numpy as np
from distributed import Client, LocalCluster
from scipy.linalg import subspace_angles

from dkernel.data import open_dataset
from dkernel.datasets import hermite_eigenfunctions, make_hermite
from dkernel.engine import Engine, EngineOptions
from dkernel.features import FeatureMap
from dkernel.solvers.components import ComponentProgram
from dkernel.solvers.dsg import decision


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--steps", type=int, default=1024)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--theta0", type=float, default=1.0)
    p.add_argument("--theta1", type=float, default=0.01)
    p.add_argument("--k", type=int, default=3)
    args = p.parse_args()
    T, m, B, k = args.steps, args.batch, args.block, args.k
    X = make_hermite(T * m, 1, sigma=1.0, random_state=0)
    Xt = make_hermite(5000, 1, sigma=1.0, random_state=1)
    truth = hermite_eigenfunctions(Xt, k, sigma=1.0, bandwidth=1.0)
    record = sorted({int(round(v)) for v in np.geomspace(4, T, 25)})
    features = FeatureMap("gaussian", 1.0, 1, B, 0)
    program = ComponentProgram(
        "kpca",
        (features,),
        T,
        k,
        args.theta0,
        args.theta1,
        center=False,
        record_at=tuple(record),
        label="kpca-hermite",
    )
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.ERROR
        ) as cluster,
        Client(cluster) as client,
    ):
        data = open_dataset(da.from_array(X, chunks=(4096, 1)))
        t0 = time.perf_counter()
        state = Engine(client, EngineOptions(lanes=4)).run_steps(
            data, program, n_epochs=1, batch_size=m, random_state=0
        )
        seconds = time.perf_counter() - t0
    sin2 = []
    for r, t in enumerate(record):
        A = state["recorded"][r][: t * B].astype(np.float32)
        Z = decision(features, A, Xt.astype(np.float32)).astype(np.float64)
        sin2.append(float(np.sin(subspace_angles(Z, truth)).max() ** 2))
    t = np.asarray(record, dtype=float)
    fit = t >= np.sqrt(t[-1] * t[0]) * 2  # the later part of the run, past the transient
    slope, intercept = np.polyfit(np.log(t[fit]), np.log(np.asarray(sin2)[fit]), 1)
    for ti, s in zip(record, sin2):
        print(f"t={ti:5d}  sin^2={s:.3e}")
    print(
        json.dumps(
            {
                "steps": T,
                "batch": m,
                "block": B,
                "k": k,
                "theta0": args.theta0,
                "theta1": args.theta1,
                "fit_from_t": int(t[fit][0]),
                "slope": round(float(slope), 3),
                "final_sin2": sin2[-1],
                "seconds": round(seconds, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
