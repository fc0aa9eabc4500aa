"""Fashion-MNIST left/right image halves: kernel CCA (the analogue of Xie et al. 2015, Table 3).

View X is the left 14 columns of each image, view Y the right 14 (392 pixels
each).  Reported: the sum of the top-k canonical correlations on the 10k test
images and the wall time (fit + test scores) of

- linear CCA (dense, ridge ``--linear-ridge``),
- CCA on a fixed set of random Fourier features (each of ``--rff-features`` per view,
  the same Gaussian kernel and bandwidth; exact regularised CCA on the
  feature covariances with the same kappa as DSG),
- DSG-KCCA (dkernel.KernelCCA) on a 2-worker LocalCluster reading a two-view
  zarr store (X = left, y = right), for each pool size in ``--dsg-features``
  and each ``--solver``: "dsg" is Xie's Alg. 4 (one feature block per step,
  ``--batch-size``, ``--epochs``), "eigenpro" the preconditioned whole-pool
  steps (``preconditioner="eigenpro"``, ``--eigenpro-batch-size``,
  ``--eigenpro-epochs``).

A pool of D features has the same fixed point as RFF CCA with D features
(the same kappa), so at equal D the iteration can only tie the dense solve;
what it buys is O(n D k) time per epoch and O(D k) memory instead of
O(n D^2 + D^3) and O(D^2), i.e. more features in the same time.  Pass the
same sizes to ``--rff-features`` and ``--dsg-features`` for the equal-D rows.

``--augment N`` appends N copies of the training images shifted by up to 2
pixels (the way MNIST8M extends MNIST with deformed copies): the regime of
Xie's Table 3, where the data outgrow a dense solve while the iteration needs
about as many steps as before.  RFF CCA accumulates its covariances over
row blocks, so its memory is O(D^2) whatever the number of rows.

All methods share one bandwidth per view (median heuristic).  Correlations and
times are also printed as ratios against the RFF CCA of the last
``--rff-features`` size (8192, the largest, by default), measured in the same
run.

    python benchmarks/fashion_kcca.py
    python benchmarks/fashion_kcca.py --subset 15000 --components 20   # quick look
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

import numpy as np
from _fashion import fashion_stores, load_arrays


def halves(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    img = X.reshape(-1, 28, 28)
    return (
        np.ascontiguousarray(img[:, :, :14].reshape(-1, 392)),
        np.ascontiguousarray(img[:, :, 14:].reshape(-1, 392)),
    )


def test_corr(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    xs = xs - xs.mean(0)
    ys = ys - ys.mean(0)
    return (xs * ys).sum(0) / np.sqrt((xs * xs).sum(0) * (ys * ys).sum(0))


def shifted_copies(X: np.ndarray, copies: int, seed: int = 0) -> np.ndarray:
    """X followed by ``copies`` versions of it, each image moved by a random
    (dy, dx) in [-2, 2]^2 other than (0, 0), zero-filled at the border."""
    rng = np.random.default_rng(seed)
    img = X.reshape(-1, 28, 28)
    shifts = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3) if (dy, dx) != (0, 0)]
    out = [X]
    for _ in range(copies):
        pick = rng.integers(len(shifts), size=len(img))
        moved = np.zeros_like(img)
        for j, (dy, dx) in enumerate(shifts):
            sel = np.flatnonzero(pick == j)
            src = img[sel]
            moved[sel, max(dy, 0): 28 + min(dy, 0), max(dx, 0): 28 + min(dx, 0)] = \
                src[:, max(-dy, 0): 28 - max(dy, 0), max(-dx, 0): 28 - max(dx, 0)]
        out.append(moved.reshape(len(img), -1))
    return np.concatenate(out)


def rff_cca(fx, fy, nb: int, L: np.ndarray, R: np.ndarray, kappa: float, k: int,
            rows: int = 10_000):
    """Exact regularised CCA on the fixed features, covariances accumulated over
    row blocks (float64 sums of float32 block products)."""
    from dkernel.solvers.components import rotate_pair

    D = nb * fx.block_size
    S = {name: np.zeros((D, D)) for name in ("xx", "yy", "xy")}
    sx, sy = np.zeros(D), np.zeros(D)
    for a in range(0, len(L), rows):
        Fx, Fy = fx.transform(L[a: a + rows], nb), fy.transform(R[a: a + rows], nb)
        S["xx"] += Fx.T @ Fx
        S["yy"] += Fy.T @ Fy
        S["xy"] += Fx.T @ Fy
        sx += Fx.sum(0, dtype=np.float64)
        sy += Fy.sum(0, dtype=np.float64)
    n = len(L)
    mx, my = sx / n, sy / n
    Cxx = S["xx"] / n - np.outer(mx, mx) + kappa * np.eye(D)
    Cyy = S["yy"] / n - np.outer(my, my) + kappa * np.eye(D)
    Cxy = S["xy"] / n - np.outer(mx, my)
    Wx, Wy, _ = rotate_pair(Cxx, Cyy, Cxy, k)
    return mx, my, Wx, Wy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--data", default="/tmp/dkernel-fashion", help="folder for the zarr stores")
    p.add_argument("--components", type=int, default=50)
    p.add_argument("--subset", type=int, default=0, help="use only the first N training images")
    p.add_argument("--augment", type=int, default=0,
                   help="append N shifted copies of the training images (MNIST8M-style)")
    p.add_argument("--rff-features", type=int, nargs="+", default=[2048, 4096, 8192],
                   help="RFF CCA sizes; the last is the peer for the ratios")
    p.add_argument("--dsg-features", type=int, nargs="+", default=[8192, 16384])
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--alpha", type=float, default=1e-4, help="kappa for DSG-KCCA and RFF-CCA")
    p.add_argument("--linear-ridge", type=float, default=1e-4)
    p.add_argument("--step-size", default="auto", type=lambda v: v if v == "auto" else float(v))
    p.add_argument("--step-decay", default="auto",
                   type=lambda v: v if v == "auto" else float(v))
    p.add_argument("--init", nargs="+", default=["subsample"], choices=("subsample", "random"),
                   help="KernelCCA start(s) to run for each pool size")
    p.add_argument("--solver", nargs="+", default=["eigenpro"], choices=("dsg", "eigenpro"),
                   help="dsg: Xie Alg. 4 block steps; eigenpro: preconditioned whole-pool steps")
    p.add_argument("--eigenpro-batch-size", type=int, default=1024)
    p.add_argument("--eigenpro-epochs", type=int, nargs="+", default=[2],
                   help="epochs of the eigenpro solver (each value is a run)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0,
                   help="random_state of every method's features (and KernelCCA's plan)")
    p.add_argument("--lanes", type=int, default=2,
                   help="chunks that share one DSG step (one per worker)")
    args = p.parse_args()
    # RFF CCA fits whole blocks: a size that is not one was fitted smaller than
    # its label said (D // B blocks)
    odd = [D for D in args.rff_features if D % min(args.block_size, D)]
    if odd:
        p.error(f"--rff-features {odd} are not multiples of --block-size {args.block_size}")

    from distributed import Client, LocalCluster

    from dkernel import KernelCCA
    from dkernel.data import write_store
    from dkernel.features import FeatureMap
    from dkernel.kernels import median_heuristic
    from dkernel.solvers.components import regularized_cca

    train, test = fashion_stores(args.data)
    Xtr, _ = load_arrays(train)
    Xte, _ = load_arrays(test)
    if args.subset:
        Xtr = Xtr[: args.subset]
    if args.augment:
        Xtr = shifted_copies(Xtr, args.augment)
    Ltr, Rtr = halves(Xtr)
    Lte, Rte = halves(Xte)
    tag = f"-aug{args.augment}" if args.augment else ""
    views = os.path.join(args.data, f"halves-{len(Ltr)}{tag}.zarr")
    if not os.path.exists(views):
        write_store(views, Ltr, Rtr, chunk_rows=4096)
    rng = np.random.default_rng(0)
    idx = rng.choice(len(Ltr), 1000, replace=False)
    bw_x = median_heuristic(Ltr[idx].astype(np.float64), "gaussian")
    bw_y = median_heuristic(Rtr[idx].astype(np.float64), "gaussian")
    k = args.components
    results: dict = {"settings": vars(args), "bandwidth": [bw_x, bw_y]}

    t0 = time.perf_counter()
    mx, my, Wx, Wy = regularized_cca(Ltr, Rtr, args.linear_ridge, k)
    corr = test_corr((Lte - mx) @ Wx, (Rte - my) @ Wy)
    results["linear_cca"] = {"sum_corr": float(corr.sum()), "seconds": time.perf_counter() - t0}
    print(
        f"linear CCA: sum of top-{k} test correlations {corr.sum():.2f} "
        f"in {results['linear_cca']['seconds']:.1f}s",
        flush=True,
    )

    for D in args.rff_features:
        B = min(args.block_size, D)
        t0 = time.perf_counter()
        fx = FeatureMap("gaussian", bw_x, 392, B, args.seed, stream=0)
        fy = FeatureMap("gaussian", bw_y, 392, B, args.seed, stream=1)
        nb = D // B
        mx, my, Wx, Wy = rff_cca(fx, fy, nb, Ltr, Rtr, args.alpha, k)
        corr = test_corr((fx.transform(Lte, nb) - mx) @ Wx, (fy.transform(Rte, nb) - my) @ Wy)
        results[f"rff_cca_{D}"] = {
            "features": D,
            "sum_corr": float(corr.sum()),
            "seconds": time.perf_counter() - t0,
        }
        print(
            f"RFF CCA ({D} features/view): sum {corr.sum():.2f} "
            f"in {results[f'rff_cca_{D}']['seconds']:.1f}s",
            flush=True,
        )
    peer = results[f"rff_cca_{args.rff_features[-1]}"]

    with (
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        runs = [(nf, init, solver, ep) for nf in args.dsg_features for init in args.init
                for solver in args.solver
                for ep in (args.eigenpro_epochs if solver == "eigenpro" else [args.epochs])]
        for nf, init, solver, epochs in runs:
            eigenpro = solver == "eigenpro"
            t0 = time.perf_counter()
            model = KernelCCA(
                k,
                bandwidth=bw_x,
                bandwidth_y=bw_y,
                n_features=nf,
                block_size=min(args.block_size, nf),
                batch_size=args.eigenpro_batch_size if eigenpro else args.batch_size,
                n_epochs=epochs,
                alpha=args.alpha,
                init=init,
                preconditioner="eigenpro" if eigenpro else None,
                lanes=args.lanes,
                random_state=args.seed,
                step_size=args.step_size,
                step_decay=args.step_decay,
                client=client,
                verbose=True,
            ).fit(views)
            corr = model.canonical_correlations(Lte, Rte)
            secs = time.perf_counter() - t0
            results[f"dsg_kcca_{nf}_{init}_{solver}_{epochs}"] = {
                "features": nf,
                "init": init,
                "solver": solver,
                "epochs": epochs,
                "sum_corr": float(corr.sum()),
                "seconds": secs,
                "step_size_": model.step_size_,
                "step_decay_": model.step_decay_,
                "q": None if model.preconditioners_ is None
                else [pre.q for pre in model.preconditioners_],
                "time_over_rff": secs / peer["seconds"],
                "sum_corr_over_rff": float(corr.sum()) / peer["sum_corr"],
            }
            print(
                f"DSG-KCCA ({nf} features/view, {solver}, {epochs} epochs, init={init}): "
                f"sum {corr.sum():.2f} "
                f"in {secs:.1f}s "
                f"({corr.sum() / peer['sum_corr']:.3f}x the correlation and "
                f"{secs / peer['seconds']:.2f}x the time of RFF CCA, {peer['features']} features)",
                flush=True,
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
