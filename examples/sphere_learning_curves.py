"""
Regression on the sphere: learning curves of truncated kernel SGD
=================================================================

:class:`dkernel.SphereRegressor` on S^2 (Bai & Shi, section 5.2).

Reproduces the paper's S^2 experiment: x uniform on S^2, a degree-10
polynomial target, noise uniform on [-0.2, 0.2], s = 1, theta = 1/3,
eta0 = 0.5, constant step (t = 0), n = 1e5, and the Polyak-averaged test error
``|bar f_n - f*|^2`` on fresh points.  For contrast, plain kernel SGD (the kernel
K truncated only at degree 30, where its tail is ~1e-3 of K(x, x)) with the
decaying step eta0 n^-1/2, and with a constant step.

    python examples/sphere_learning_curves.py [--n 100000] [--out sphere_learning_curves.png]

The plot needs matplotlib (``pip install dkernel[plot]``); without it the
numbers are still printed.  ``DKERNEL_EXAMPLE_SMALL=1`` makes the defaults
``--n 2000 --n-test 500``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def slope(n: np.ndarray, mse: np.ndarray, lo: float, hi: float) -> float:
    """Least-squares slope of log(mse) against log(n) for lo <= n <= hi."""
    keep = (n >= lo) & (n <= hi)
    return float(np.polyfit(np.log(n[keep]), np.log(mse[keep]), 1)[0])


def main() -> None:
    from dkernel import SphereRegressor
    from dkernel.datasets import make_sphere_polynomial
    from dkernel.engine import connect

    small = os.environ.get("DKERNEL_EXAMPLE_SMALL", "") not in ("", "0")
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000 if small else 100_000,
                    help="training points (one pass)")
    ap.add_argument("--n-test", type=int, default=500 if small else 10_000)
    ap.add_argument("--out", default="sphere_learning_curves.png", help="PNG file to write")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    X, y, _ = make_sphere_polynomial(args.n, d=3, degree=10, noise=0.2, random_state=0)
    Xt, _, ft = make_sphere_polynomial(args.n_test, d=3, degree=10, noise=0.2, random_state=1)
    record = np.array(sorted({int(10 ** (i / 8)) for i in range(8, 8 * int(np.log10(args.n)) + 1)}
                             | {args.n}))
    runs = {
        "T-kernel SGD (theta=1/3, constant step)": {"theta": 1 / 3, "t": 0.0},
        "kernel SGD (step 0.5 n^-1/2)": {"theta": None, "max_degree": 30, "t": 0.5},
        "kernel SGD (constant step)": {"theta": None, "max_degree": 30, "t": 0.0},
    }
    curves = {}
    # the scheduler in $DASK_SCHEDULER_ADDRESS, or a new LocalCluster of --workers workers
    with connect(n_workers=args.workers) as client:
        for name, kw in runs.items():
            t0 = time.perf_counter()
            model = SphereRegressor(s=1.0, eta0=0.5, record_at=record.tolist(), client=client,
                                    **kw).fit(X, y)
            seconds = time.perf_counter() - t0
            mse = np.array([np.mean((p - ft) ** 2) for p in model.staged_predict(Xt)])
            curves[name] = mse
            if not (np.all(np.isfinite(mse)) and mse[-1] < mse[0]):
                raise RuntimeError(f"{name}: the test error did not fall ({mse[0]:.3g} at "
                                   f"n={record[0]}, {mse[-1]:.3g} at n={record[-1]})")
            print(f"{name}: form={model.form_} L_N={model.max_level_} fit {seconds:.1f} s; "
                  f"test MSE at n={args.n}: {mse[-1]:.3g}; log-log slope n in [1e3, {args.n:.0e}]: "
                  f"{slope(record, mse, 1e3, args.n):.2f}, "
                  f"last decade: {slope(record, mse, args.n / 10, args.n):.2f}")
    print("n " + " ".join(f"{k[:22]:>24}" for k in curves))
    for i, n in enumerate(record):
        print(f"{n} " + " ".join(f"{c[i]:>24.4g}" for c in curves.values()))

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed, so no plot was written; install it with "
              "`pip install matplotlib` (or `pip install dkernel[plot]`) and run again")
        return
    fig, ax = plt.subplots(figsize=(7, 5))
    for name, mse in curves.items():
        ax.loglog(record, mse, marker="o", ms=3, label=name)
    ref = curves[next(iter(curves))]
    guide = ref[-1] * (record / record[-1]) ** (-2 / 3)
    ax.loglog(record, guide, "k--", lw=1, label="slope -2/3 (theory)")
    ax.set_xlabel("n (samples seen)")
    ax.set_ylabel("test MSE |bar f_n - f*|^2")
    ax.set_title("S^2, degree-10 target, noise U[-0.2, 0.2], s = 1")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
