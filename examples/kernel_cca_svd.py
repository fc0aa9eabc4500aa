"""
Kernel CCA and kernel SVD of Fashion-MNIST's left and right halves
==================================================================

Two views of the same rows: the left and the right half of each image.

* :class:`dkernel.KernelCCA` finds the directions of the two kernel feature
  spaces whose projections correlate most (Xie, Liang & Song 2015, Alg. 4,
  with an EigenPro preconditioner by default); ``alpha`` regularises.
* :class:`dkernel.KernelSVD` finds the top singular vectors of the
  cross-covariance of the two feature spaces (Xie et al., Alg. 3).

The held-out correlations of CCA's pairs are measured on the test images;
linear CCA on the raw pixels is the baseline.

``DKERNEL_EXAMPLE_SMALL=1`` runs it on a small synthetic stand-in.
"""

import matplotlib.pyplot as plt
import numpy as np
from _fashion import LEFT, RIGHT, SMALL, check, fashion_mnist, size

from dkernel import KernelCCA, KernelSVD
from dkernel.data import open_dataset
from dkernel.engine import connect

K = size(20, 4)  # pairs of canonical directions


def linear_cca(A, B, k, reg=1e-4):
    """Directions (Wa, Wb) of regularised linear CCA: the top singular vectors
    of Caa^-1/2 Cab Cbb^-1/2, mapped back through the whitening."""
    A, B = A - A.mean(0), B - B.mean(0)
    def inv_sqrt(C):
        w, V = np.linalg.eigh(C + reg * np.eye(len(C)))
        return V / np.sqrt(w)
    Wa, Wb = inv_sqrt(A.T @ A / len(A)), inv_sqrt(B.T @ B / len(B))
    U, _, Vt = np.linalg.svd(Wa.T @ (A.T @ B / len(A)) @ Wb)
    return Wa @ U[:, :k], Wb @ Vt[:k].T

if __name__ == "__main__":
    train, test = fashion_mnist()
    X = open_dataset(train).X  # a lazy dask array of the store's rows
    X_test = open_dataset(test).X
    left, right = X[:, LEFT], X[:, RIGHT]  # two views of the same rows, still lazy
    left_test, right_test = X_test[:, LEFT], X_test[:, RIGHT]

    with connect() as client:
        cca = KernelCCA(n_components=K, alpha=1e-4, bandwidth=4.0, n_features=size(8192, 1024),
                        n_epochs=size(5, 2), client=client).fit(left, right)
        held_out = cca.canonical_correlations(left_test, right_test)
        svd = KernelSVD(n_components=4, bandwidth=4.0, n_features=size(4096, 512),
                        client=client).fit(left, right)
        x_scores, y_scores = svd.transform(left_test, right_test)
    print("KernelCCA held-out correlations:", np.round(held_out, 3))
    print(f"sum: {held_out.sum():.3f}")
    print("KernelSVD singular values:", np.round(svd.singular_values_, 5))

    # %%
    # Linear CCA of the raw pixels, for scale.
    Wa, Wb = linear_cca(left.compute(), right.compute(), K)
    a, b = left_test.compute() @ Wa, right_test.compute() @ Wb
    linear = np.array([np.corrcoef(a[:, i], b[:, i])[0, 1] for i in range(K)])
    print(f"linear CCA held-out correlation sum: {linear.sum():.3f}")
    check(held_out[0] > 0.5, f"the first canonical pair correlates only {held_out[0]:.3f}")
    check(SMALL or held_out.sum() > linear.sum(),
          f"KernelCCA ({held_out.sum():.2f}) should beat linear CCA ({linear.sum():.2f})")
    check(np.all(np.isfinite(x_scores)) and np.all(np.isfinite(y_scores)), "non-finite scores")

    # %%
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(range(1, K + 1), held_out, "o-", label="KernelCCA")
    ax1.plot(range(1, K + 1), np.sort(linear)[::-1], "s-", label="linear CCA")
    ax1.set_xlabel("pair")
    ax1.set_ylabel("held-out correlation")
    ax1.legend()
    ax2.scatter(np.asarray(x_scores)[:, 0], np.asarray(y_scores)[:, 0], s=3, alpha=0.4)
    ax2.set_xlabel("left half, first KernelSVD score")
    ax2.set_ylabel("right half, first KernelSVD score")
    fig.tight_layout()
    fig.savefig("kernel_cca_svd.png")
