"""
Density ratio estimation
========================

:class:`dkernel.DSGDensityRatio` estimates r(x) = p(x) / q(x) from samples
of p (the numerator) and q (the denominator) alone, by the KL
(Nguyen-Wainwright-Jordan) objective on random features (Dai et al. 2014,
section 4).  Uses: covariate shift (weight training rows by r), two-sample
tests, outlier scores.

Here p = N(0.5, 0.6^2) and q = N(0, 1) in one dimension, where the true ratio
is known in closed form.

``DKERNEL_EXAMPLE_SMALL=1`` uses fewer rows.
"""

import matplotlib.pyplot as plt
import numpy as np
from _fashion import check, size

from dkernel import DSGDensityRatio
from dkernel.engine import connect

MU_P, SD_P = 0.5, 0.6


def true_ratio(x):
    p = np.exp(-0.5 * ((x - MU_P) / SD_P) ** 2) / SD_P
    q = np.exp(-0.5 * x ** 2)
    return p / q


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    n = size(200_000, 4000)
    X_p = rng.normal(MU_P, SD_P, (n, 1)).astype(np.float32)
    X_q = rng.normal(0, 1, (n, 1)).astype(np.float32)
    grid = np.linspace(-2, 2.5, 200, dtype=np.float32)[:, None]

    with connect() as client:
        ratio = DSGDensityRatio(bandwidth=0.5, n_features=size(2048, 512), n_epochs=size(5, 3),
                                client=client).fit(X_p, X_q)
        r_hat = np.asarray(ratio.predict_ratio(grid))
    r = true_ratio(grid[:, 0])
    # compare where q has most of its mass
    inner = np.abs(grid[:, 0]) < 1.5
    error = np.median(np.abs(np.log(r_hat[inner]) - np.log(r[inner])))
    print(f"median |log r_hat - log r| on [-1.5, 1.5]: {error:.3f}")
    check(error < 0.5, f"the estimated ratio is off by a factor exp({error:.2f}) at the median")

    # %%
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(grid, r, "k-", label="true p / q")
    ax.plot(grid, r_hat, "C0--", label="DSGDensityRatio")
    ax.set_xlabel("x")
    ax.set_ylabel("r(x)")
    ax.legend()
    fig.tight_layout()
    fig.savefig("density_ratio.png")
