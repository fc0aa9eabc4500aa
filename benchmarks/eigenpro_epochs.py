"""Fashion-MNIST test accuracy of EigenPro (kernel form) after every epoch.

How many epochs the defaults need, and how the preconditioner's subsample
size changes that (the 4096-row default against EigenPro 2's 2000):

    python benchmarks/eigenpro_epochs.py --subsample 2000 4096

The estimator has no per-epoch callback for a test set, so this harness
wraps the program's end-of-epoch hook (``should_stop``) to score the 10k
test rows with the epoch's coefficients on the client.  Scoring adds ~10 s
an epoch; the fit's own timings are not what this measures.
"""

from __future__ import annotations

import argparse
import logging

import numpy as np
from _fashion import fashion_stores, load_arrays


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--data", default="/tmp/dkernel-fashion", help="folder for the zarr stores")
    p.add_argument("--bandwidth", type=float, default=5.0)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--subsample", type=int, nargs="+", default=[4096])
    args = p.parse_args()

    from distributed import Client, LocalCluster

    from dkernel import EigenProClassifier
    from dkernel.solvers import eigenpro as ep

    train, test = fashion_stores(args.data)
    Xte, yte = load_arrays(test)
    scores: list[float] = []
    end_of_epoch = ep.KernelEigenProProgram.should_stop

    def should_stop(self, state, epoch):  # noqa: ANN001, ANN202 - the wrapped hook
        f = ep.predict_kernel(Xte, self.centers, state["coef"], self.kernel, self.bandwidth)
        pred = np.asarray(self.encoding.classes)[np.argmax(f, axis=1)]
        scores.append(float((pred == yte).mean()))
        return end_of_epoch(self, state, epoch)

    ep.KernelEigenProProgram.should_stop = should_stop
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        for s in args.subsample:
            scores.clear()
            model = EigenProClassifier(kernel="gaussian", bandwidth=args.bandwidth,
                                       n_epochs=args.epochs, subsample_size=s, client=client)
            model.fit(train)
            print(f"subsample {s}: q={model.q_} m*={model.critical_batch_:.0f} test accuracy by "
                  f"epoch " + " ".join(f"{a:.4f}" for a in scores), flush=True)


if __name__ == "__main__":
    main()
