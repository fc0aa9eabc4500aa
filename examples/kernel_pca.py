"""
Kernel PCA on Fashion-MNIST
===========================

:class:`dkernel.KernelPCA` finds the top principal components of the
Gaussian kernel's feature space (Xie, Liang & Song 2015) on a pool of random
Fourier features.  It is centred (a streaming mean) and, by default, solves
exactly below 16,384 rows and takes whole-pool power steps above; the choice
is recorded as ``steps_``.  ``transform`` of a dask array is lazy.

The first two components of the test images, coloured by class, and the
variance each component captures.

``DKERNEL_EXAMPLE_SMALL=1`` runs it on a small synthetic stand-in.
"""

import matplotlib.pyplot as plt
import numpy as np
from _fashion import arrays, check, fashion_mnist, size

from dkernel import KernelPCA
from dkernel.data import open_dataset
from dkernel.engine import connect

CLASSES = ["T-shirt", "trouser", "pullover", "dress", "coat",
           "sandal", "shirt", "sneaker", "bag", "ankle boot"]

if __name__ == "__main__":
    train, test = fashion_mnist()
    _, y_test = arrays(test)
    with connect() as client:
        kpca = KernelPCA(n_components=8, bandwidth=5.0, n_features=size(4096, 1024),
                         client=client).fit(train)
        Z = kpca.transform(open_dataset(test).X).compute()  # lazy until compute()
    print(f"steps_={kpca.steps_!r}; explained variance of the 8 components:",
          np.round(kpca.explained_variance_, 4))
    check(np.all(np.isfinite(Z)), "non-finite projections")
    check(np.all(np.diff(kpca.explained_variance_) <= 1e-6),
          f"components out of order: {kpca.explained_variance_}")

    # %%
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for c in range(10):
        ax1.scatter(*Z[y_test == c, :2].T, s=3, alpha=0.5, label=CLASSES[c])
    ax1.set_xlabel("component 1")
    ax1.set_ylabel("component 2")
    ax1.legend(markerscale=4, fontsize=7)
    ax2.bar(range(1, 9), kpca.explained_variance_)
    ax2.set_xlabel("component")
    ax2.set_ylabel("explained variance")
    fig.tight_layout()
    fig.savefig("kernel_pca.png")
