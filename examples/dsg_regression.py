"""
DSG regression on Fashion-MNIST: completing the right half of an image
======================================================================

:class:`dkernel.DSGRegressor` with several outputs: from the left half of a
Fashion-MNIST image (392 pixels) predict its right half, at half resolution
(14 x 7 = 98 outputs).  One kernel model serves every output: the random
features are shared and only the last layer has 98 columns.

scikit-learn's peer is Nystroem + ``Ridge`` on the same kernel.  Both are
scored by R^2 (averaged over the outputs) on the test images.

``DKERNEL_EXAMPLE_SMALL=1`` runs it on a small synthetic stand-in.
"""

import time

import matplotlib.pyplot as plt
import numpy as np
from _fashion import LEFT, RIGHT, SMALL, arrays, check, fashion_mnist, size
from sklearn.kernel_approximation import Nystroem
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline

from dkernel import DSGRegressor
from dkernel.engine import connect

BANDWIDTH = 4.0  # on the 392 pixels of a half image


if __name__ == "__main__":
    train, test = fashion_mnist()
    X_train, _ = arrays(train)
    X_test, _ = arrays(test)
    # (n, 28, 14) right half -> (n, 14, 2, 7, 2): average each 2 x 2 block
    Y_train = X_train[:, RIGHT].reshape(-1, 14, 2, 7, 2).mean(axis=(2, 4)).reshape(-1, 98)
    Y_test = X_test[:, RIGHT].reshape(-1, 14, 2, 7, 2).mean(axis=(2, 4)).reshape(-1, 98)
    L_train, L_test = X_train[:, LEFT], X_test[:, LEFT]

    # %%
    # NumPy input works as well as a store: dkernel chunks it by rows and
    # scatters it to the workers.
    with connect() as client:
        t0 = time.perf_counter()
        dsg = DSGRegressor(bandwidth=BANDWIDTH, n_features=size(8192, 1024), n_epochs=size(5, 3),
                           client=client).fit(L_train, Y_train)
        dsg_seconds = time.perf_counter() - t0
        dsg_r2 = dsg.score(L_test, Y_test)
        Y_dsg = np.asarray(dsg.predict(L_test[:8]))
    print(f"DSGRegressor: test R^2 {dsg_r2:.4f} in {dsg_seconds:.1f} s")

    t0 = time.perf_counter()
    sk = make_pipeline(Nystroem(gamma=1 / (2 * BANDWIDTH ** 2), n_components=size(4000, 300),
                                random_state=0), Ridge(alpha=1e-3))
    sk.fit(L_train, Y_train)
    sk_seconds = time.perf_counter() - t0
    sk_r2 = sk.score(L_test, Y_test)
    print(f"Nystroem + Ridge: test R^2 {sk_r2:.4f} in {sk_seconds:.1f} s")
    check(dsg_r2 > 0.2, f"DSG's test R^2 {dsg_r2:.3f}: the left half should predict the right")
    check(SMALL or dsg_r2 > 0.6, f"DSG's test R^2 {dsg_r2:.3f} on Fashion-MNIST is below 0.6")

    # %%
    # Eight test images: the true right half and DSG's completion beside the left half.
    fig, axes = plt.subplots(2, 8, figsize=(12, 3.4))
    for i in range(8):
        left = L_test[i].reshape(28, 14)
        for row, right in enumerate((Y_test[i], Y_dsg[i])):
            right = np.kron(right.reshape(14, 7), np.ones((2, 2)))  # back to 28 x 14
            axes[row, i].imshow(np.hstack([left, right]), cmap="gray_r", vmin=0, vmax=1)
            axes[row, i].axis("off")
    axes[0, 0].set_title("true", loc="left")
    axes[1, 0].set_title("DSG", loc="left")
    fig.tight_layout()
    fig.savefig("dsg_regression.png")
