"""
Gaussian-process posterior variance
===================================

Kernel ridge regression is the posterior mean of a Gaussian process; with
``posterior_variance=True``, :class:`dkernel.DSGRegressor` also keeps what
the posterior variance needs, and ``predict(X, return_std=True)`` returns
the mean and the posterior standard deviation of f(x), in y's units.  The
prior is f ~ GP(0, s^2 k) with s^2 estimated from y (``gp_amplitude_``) and
the noise variance is sigma^2 = n * alpha * s^2.

One-dimensional data with a gap: the band widens where there are no rows.
scikit-learn's exact ``GaussianProcessRegressor`` with the same kernel and
noise is drawn beside it, fitted on fewer rows (2000 of 50,000; 500 of 2000
small): exact GP regression is O(n^3).  With fewer rows its band is wider
where there are rows than the posterior on all of them, so the two bands
agree in shape, not in width.

``DKERNEL_EXAMPLE_SMALL=1`` uses fewer rows.
"""

import matplotlib.pyplot as plt
import numpy as np
from _fashion import check, size
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF

from dkernel import DSGRegressor
from dkernel.engine import connect

BANDWIDTH, NOISE = 0.5, 0.2

if __name__ == "__main__":
    rng = np.random.default_rng(0)
    n = size(50_000, 2000)
    x = np.concatenate([rng.uniform(-4, -1, n // 2), rng.uniform(1.5, 4, n - n // 2)])
    y = np.sin(2 * x) + NOISE * rng.standard_normal(n)
    X = x[:, None].astype(np.float32)
    grid = np.linspace(-5, 5, 300, dtype=np.float32)[:, None]
    alpha = NOISE ** 2 / n  # the noise-to-signal ratio sigma^2 / s^2 = n * alpha, at s = 1

    with connect() as client:
        gp = DSGRegressor(alpha=alpha, posterior_variance=True, bandwidth=BANDWIDTH,
                          n_features=size(2048, 512), n_epochs=size(10, 8),
                          client=client).fit(X, y)
        mean, std = (np.asarray(a) for a in gp.predict(grid, return_std=True))

    # the exact GP on a sample of the rows (it is O(n^3)), with the amplitude s^2
    # DSGRegressor estimated: its prior s^2 k and noise n * alpha * s^2
    m = size(2000, 500)
    s2 = gp.gp_amplitude_
    print(f"prior amplitude s^2 estimated from y: {s2:.3f}")
    exact = GaussianProcessRegressor(s2 * RBF(BANDWIDTH), alpha=NOISE ** 2 * s2, optimizer=None)
    exact.fit(X[:: n // m], y[:: n // m])
    mean_exact, std_exact = exact.predict(grid, return_std=True)

    in_gap, in_data = np.abs(grid[:, 0] - 0.25) < 0.5, np.abs(grid[:, 0] + 2.5) < 1
    print(f"posterior std in the data: {std[in_data].mean():.3f} (exact GP on {m} of the "
          f"{n} rows: "
          f"{std_exact[in_data].mean():.3f}); in the gap: {std[in_gap].mean():.3f} "
          f"({std_exact[in_gap].mean():.3f})")
    rmse = np.sqrt(np.mean((mean[in_data] - np.sin(2 * grid[in_data, 0])) ** 2))
    print(f"posterior mean against sin(2x) in the data: RMSE {rmse:.3f}")
    check(std[in_gap].mean() > 3 * std[in_data].mean(), "the band should widen in the gap")
    check(rmse < 0.2, f"posterior mean off by {rmse:.3f}")

    # %%
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.scatter(x[:: max(1, n // 500)], y[:: max(1, n // 500)], s=2, c="0.6", label="rows")
    ax.plot(grid, mean, "C0", label="DSGRegressor mean")
    ax.fill_between(grid[:, 0], mean - 2 * std, mean + 2 * std, color="C0", alpha=0.25,
                    label="+- 2 std")
    ax.plot(grid, mean_exact + 2 * std_exact, "C1--", lw=1,
            label=f"exact GP on {m} of the {n} rows +- 2 std")
    ax.plot(grid, mean_exact - 2 * std_exact, "C1--", lw=1)
    ax.set_ylim(-3, 3)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig("gp_variance.png")
