"""
Novelty detection with a doubly stochastic one-class SVM
========================================================

:class:`dkernel.DSGOneClassSVM` solves the one-class SVM (Schoelkopf et al.)
by doubly stochastic gradients (Dai et al. 2014, section 4): about a fraction
``nu`` of the training rows end below the learned offset.  Its interface is
scikit-learn's ``OneClassSVM``: ``predict`` gives +1 (inlier) or -1
(outlier), ``decision_function`` is negative outside.

Trained on a two-moon-like cloud in 2-D; new points inside the cloud and
uniform outliers around it are scored, against scikit-learn's exact
``OneClassSVM`` on the same kernel.

``DKERNEL_EXAMPLE_SMALL=1`` uses fewer rows.
"""

import matplotlib.pyplot as plt
import numpy as np
from _fashion import check, size
from sklearn.svm import OneClassSVM

from dkernel import DSGOneClassSVM
from dkernel.engine import connect

BANDWIDTH, NU = 0.5, 0.1


def cloud(n, rng):
    """Two noisy arcs."""
    t = rng.uniform(0, np.pi, n)
    upper = rng.random(n) < 0.5
    x = np.where(upper, np.cos(t), 1 - np.cos(t))
    y = np.where(upper, np.sin(t), 0.5 - np.sin(t))
    return (np.c_[x, y] + rng.normal(0, 0.1, (n, 2))).astype(np.float32)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    X = cloud(size(100_000, 4000), rng)
    X_new = cloud(1000, rng)
    X_out = rng.uniform([-1.5, -1.5], [2.5, 1.5], (1000, 2)).astype(np.float32)

    with connect() as client:
        # few rows take small batches, so that the offset gets enough steps
        ocsvm = DSGOneClassSVM(nu=NU, bandwidth=BANDWIDTH, n_features=size(4096, 1024),
                               batch_size=size("auto", 128), n_epochs=size(5, 10),
                               client=client).fit(X)
        inlier_rate = np.mean(np.asarray(ocsvm.predict(X_new)) == 1)
        flagged = np.mean(np.asarray(ocsvm.predict(X_out)) == -1)
        train_out = np.mean(np.asarray(ocsvm.predict(X)) == -1)
        xx, yy = np.meshgrid(np.linspace(-1.5, 2.5, 150), np.linspace(-1.5, 1.5, 120))
        grid = np.c_[xx.ravel(), yy.ravel()].astype(np.float32)
        f = np.asarray(ocsvm.decision_function(grid)).reshape(xx.shape)
    print(f"DSGOneClassSVM: {train_out:.3f} of training rows below the offset (nu = {NU}); "
          f"new inliers kept {inlier_rate:.3f}, uniform points flagged {flagged:.3f}")

    # scikit-learn's exact one-class SVM on a sample (it is O(n^2) in rows)
    n = size(5000, 1000)
    sk = OneClassSVM(nu=NU, gamma=1 / (2 * BANDWIDTH ** 2)).fit(X[:n])
    print(f"OneClassSVM on {n} rows: new inliers kept {np.mean(sk.predict(X_new) == 1):.3f}, "
          f"uniform points flagged {np.mean(sk.predict(X_out) == -1):.3f}")
    check(abs(train_out - NU) < 0.1, f"{train_out:.3f} of the rows are outliers, nu = {NU}")
    check(inlier_rate > 0.75 and flagged > 0.5,
          f"inliers kept {inlier_rate:.3f}, outliers flagged {flagged:.3f}")

    # %%
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.contourf(xx, yy, f, levels=20, cmap="Blues_r", alpha=0.8)
    ax.contour(xx, yy, f, levels=[0], colors="k")
    ax.contour(xx, yy, sk.decision_function(grid).reshape(xx.shape), levels=[0],
               colors="C1", linestyles="--")
    ax.scatter(*X[:500].T, s=2, c="w")
    ax.set_title("decision_function = 0: DSGOneClassSVM (black), OneClassSVM (orange)")
    fig.tight_layout()
    fig.savefig("novelty_detection.png")
