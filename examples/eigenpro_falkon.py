"""
EigenPro and the Nystrom / FALKON route
=======================================

:class:`dkernel.EigenProClassifier` fits the kernel model
f(x) = sum_j a_j k(x, c_j) on every row of the data, by one of two routes:

* **every row a center** (the default up to 100,000 rows): EigenPro
  iteration (Ma & Belkin 2017), mini-batch SGD preconditioned by the top
  eigenpairs of the kernel on a subsample, so the step can be large;
* **fewer centers than rows** (``n_centers < n``): Nystrom kernel ridge
  regression over all the rows, solved by FALKON (Rudi et al. 2017),
  conjugate gradient preconditioned with two Cholesky factors.  One epoch is
  one CG iteration, one pass over the data.

Both routes record ``solver_``, ``n_centers_`` and ``n_rows_used_``.

``DKERNEL_EXAMPLE_SMALL=1`` runs it on a small synthetic stand-in.
"""

import time

import matplotlib.pyplot as plt
from _fashion import SMALL, arrays, check, fashion_mnist, size

from dkernel import EigenProClassifier
from dkernel.engine import connect

if __name__ == "__main__":
    train, test = fashion_mnist()
    X_test, y_test = arrays(test)
    fits = {}
    with connect() as client:
        for label, n_centers in (("EigenPro, every row a center", None),
                                 ("FALKON, fewer centers", size(5000, 300))):
            t0 = time.perf_counter()
            model = EigenProClassifier(bandwidth=5.0, n_centers=n_centers,
                                       n_epochs=size(10, 5), client=client).fit(train)
            seconds = time.perf_counter() - t0
            accuracy = model.score(X_test, y_test)
            fits[label] = model
            print(f"{label}: solver_={model.solver_!r}, {model.n_centers_} centers, "
                  f"{model.n_rows_used_} rows used; test accuracy {accuracy:.4f} in "
                  f"{seconds:.1f} s")
            check(accuracy > 0.5, f"{label}: test accuracy {accuracy:.3f}")
            check(SMALL or accuracy > 0.85, f"{label}: test accuracy {accuracy:.3f} on "
                  "Fashion-MNIST is below 0.85")
    every_row, falkon = fits.values()
    check(every_row.solver_ == "eigenpro" and falkon.solver_ == "falkon",
          f"routes {every_row.solver_!r} and {falkon.solver_!r}")
    check(falkon.n_rows_used_ == every_row.n_rows_used_,
          "FALKON must train on every row, like EigenPro")

    # %%
    # Training loss per epoch on each route, and the preconditioner's spectrum:
    # EigenPro flattens the top q eigenvalues to the (q+1)-th, which is how
    # far its step can grow.
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label, model in fits.items():
        ax1.semilogy(range(1, len(model.history_) + 1), [h["loss"] for h in model.history_],
                     "o-", label=label)
    ax1.set_xlabel("epoch (FALKON: CG iteration)")
    ax1.set_ylabel("training loss")
    ax1.legend()
    ax2.semilogy(every_row.eigenvalues_, ".")
    ax2.axvline(every_row.q_, color="k", ls="--", label=f"q = {every_row.q_}")
    ax2.set_xlabel("index")
    ax2.set_ylabel("eigenvalue of K(S, S) / s")
    ax2.legend()
    fig.tight_layout()
    fig.savefig("eigenpro_falkon.png")
