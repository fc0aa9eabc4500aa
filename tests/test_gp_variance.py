"""DSGRegressor's Gaussian-process posterior variance (Dai et al. App. D) against
the exact GP posterior of a dense solve."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF

from dkernel import DSGRegressor, load_model
from dkernel.kernels import kernel_matrix


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(n)
    return X.astype(np.float32), y.astype(np.float32)


def test_posterior_std_matches_the_exact_gaussian_process(client, tmp_path):
    X, y = _data(300, 0)
    # test points inside the data, at its edges and far outside (std -> 1)
    Xt = np.linspace(-4, 4, 81, dtype=np.float32)[:, None]
    bw, alpha = 0.5, 1e-4
    sigma2 = len(X) * alpha  # docs/design.md §2.2: nu = sigma^2 / n
    model = DSGRegressor(bandwidth=bw, alpha=alpha, n_features=2048, n_epochs=1,
                         posterior_variance=True, client=client)
    model.fit(da.from_array(X, chunks=(100, 1)), da.from_array(y, chunks=100))
    mean, std_y = model.predict(Xt, return_std=True)
    assert mean.shape == std_y.shape == (81,)
    # exact: k(x, x) - k*^T (K + sigma^2 I)^-1 k*, by a dense solve and by scikit-learn,
    # for the unit prior; the model's prior is s^2 k, s^2 = yc^T (K + sigma^2 I)^-1 yc / n
    Xd, Xtd = X.astype(np.float64), Xt.astype(np.float64)
    K = kernel_matrix(Xd, Xd, "gaussian", bw)
    Ks = kernel_matrix(Xtd, Xd, "gaussian", bw)
    exact_var = 1.0 - np.einsum("ij,ji->i", Ks, np.linalg.solve(K + sigma2 * np.eye(len(X)), Ks.T))
    gpr = GaussianProcessRegressor(RBF(bw), alpha=sigma2, optimizer=None).fit(Xd, y)
    np.testing.assert_allclose(gpr.predict(Xtd, return_std=True)[1] ** 2, exact_var, atol=1e-8)
    exact_std = np.sqrt(np.maximum(exact_var, 0))
    yc = y.astype(np.float64) - y.astype(np.float64).mean()
    exact_s2 = yc @ np.linalg.solve(K + sigma2 * np.eye(len(X)), yc) / len(X)
    # the random-feature kernel's amplitude against the exact kernel's: measured 2e-4 apart
    assert abs(model.gp_amplitude_ / exact_s2 - 1) < 0.01, (model.gp_amplitude_, exact_s2)
    std = std_y / np.sqrt(model.gp_amplitude_)  # the unit prior's, to compare with exact_std
    # 2048 random features: z.z' is off k by ~sqrt(0.5 / D) = 0.016 per entry.  Inside the
    # data and far outside that moves the std by ~1e-3 (measured median 0.0012); where
    # the data end (|x| ~ 2.5, std 0.5-0.8) the solve with the small noise sigma^2 = 0.03
    # amplifies it (measured max 0.022 at D = 2048 for two seeds; 0.03-0.05 at 1024)
    err = np.abs(std - exact_std)
    assert np.median(err) < 0.005 and err.max() < 0.04, (np.median(err), err.max())
    # the variance is the posterior's, not the prior's: small within the data, the prior
    # far outside; a model that ignored the data (std = 1) fails the first assertion
    inside = np.abs(Xt[:, 0]) < 1.8
    assert std[inside].max() < 0.2 and std[np.abs(Xt[:, 0]) > 3.5].min() > 0.95
    # lazy on dask input, saved with the model
    mean_d, std_d = model.predict(da.from_array(Xt, chunks=(40, 1)), return_std=True)
    assert isinstance(std_d, da.Array)
    np.testing.assert_allclose(std_d.compute(), std_y, rtol=1e-6)
    path = tmp_path / "gp.npz"
    model.save(str(path))
    np.testing.assert_array_equal(load_model(path).predict(Xt, return_std=True)[1], std_y)


def test_return_std_needs_the_posterior_variance_fit(client):
    X, y = _data(200, 1)
    model = DSGRegressor(bandwidth=0.5, n_features=256, n_epochs=1, client=client).fit(X, y)
    with pytest.raises(AttributeError, match="posterior_variance=True"):
        model.predict(X, return_std=True)
    with pytest.raises(ValueError, match="posterior_variance=True is the Gaussian-process"):
        DSGRegressor(loss="huber", posterior_variance=True).fit(X, y)
    with pytest.raises(ValueError, match="n_features <= 8192"):
        DSGRegressor(n_features=20000, posterior_variance=True).fit(X, y)


def test_posterior_variance_fit_takes_a_dataframe(client):
    import pandas as pd

    X, y = _data(200, 3)
    frame = pd.DataFrame(X, columns=["x"])
    kw = dict(bandwidth=0.5, alpha=1e-3, n_features=256, n_epochs=1, posterior_variance=True,
              client=client)
    from_frame = DSGRegressor(**kw).fit(frame, pd.Series(y))
    from_array = DSGRegressor(**kw).fit(X, y)
    assert list(from_frame.feature_names_in_) == ["x"]
    Xt = np.linspace(-3, 3, 13, dtype=np.float32)[:, None]
    # the same rows in the same order: the same posterior
    np.testing.assert_array_equal(from_frame.predict(pd.DataFrame(Xt, columns=["x"]),
                                                     return_std=True)[1],
                                  from_array.predict(Xt, return_std=True)[1])


def test_fewer_rows_than_features_give_the_same_posterior_as_the_covariance():
    # the order-n solve (n < D) against the D x D covariance's, on the same features
    from dkernel.solvers import gp

    rng = np.random.default_rng(5)
    Phi = (rng.standard_normal((120, 4)) @ rng.standard_normal((4, 300))
           + 0.1 * rng.standard_normal((120, 300))).astype(np.float32)
    P64 = Phi.astype(np.float64)
    y = np.stack([P64[:, :7].sum(axis=1), rng.standard_normal(120)], axis=1)
    for alpha in (1e-4, 1e-2):
        exact = gp.posterior_factor(P64.T @ P64, 120, alpha)  # float64 products
        a, s2_a = gp.posterior((Phi.T @ Phi).astype(np.float64), 120, alpha, P64.T @ y,
                               (y * y).sum(axis=0))
        b, s2_b = gp.posterior_from_rows(Phi, y, alpha)
        # measured: 8.6e-5 (covariance) and 1.5e-5 (rows) at alpha 1e-4, of entries <= 0.25;
        # the float32 covariance's rank-deficient tail keeps rounding noise as pairs
        err_a = np.abs(a @ a.T - exact @ exact.T).max()
        err_b = np.abs(b @ b.T - exact @ exact.T).max()
        assert err_b <= max(err_a, 1e-6) and err_b < 5e-5, (err_a, err_b)
        # the amplitude y^T (K + n alpha I)^-1 y / n, K = Phi Phi^T / D, by a dense solve
        K = P64 @ P64.T / Phi.shape[1]
        s2 = np.einsum("ij,ij->j", y, np.linalg.solve(K + 120 * alpha * np.eye(120), y)) / 120
        np.testing.assert_allclose(s2_b, s2, rtol=1e-8)
        np.testing.assert_allclose(s2_a, s2, rtol=1e-3)


@pytest.mark.parametrize("n_features", [4096, 1024], ids=["fewer-rows", "covariance"])
def test_the_std_at_a_small_alpha_is_the_exact_posteriors_not_zero(client, n_features):
    # var = z^T z - |F^T z|^2 cancelled near the training rows: alpha 1e-8 gave
    # std 0 (exact 3.9e-4), and the order-n path's float32 Gram made its
    # directions far from orthogonal (1.7x the exact std at alpha 1e-6)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 2))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_normal(2000)
    yc = y - y.mean()
    products = None  # (the pool is the same at both alphas: its products once)
    for alpha in (1e-6, 1e-8):
        model = DSGRegressor(alpha=alpha, bandwidth=1.0, n_features=n_features, n_epochs=1,
                             posterior_variance=True, random_state=0, client=client).fit(X, y)
        std = model.predict(X[:5], return_std=True)[1]
        nb = model.coef_.shape[0] // model.features_.block_size
        z = np.asarray(model.features_.transform(X[:5], nb), np.float64)
        if products is None:
            Phi = np.asarray(model.features_.transform(X, nb), np.float64)
            products = (z, Phi.T @ Phi, Phi @ Phi.T)
        assert np.array_equal(z, products[0])
        A = np.eye(n_features) + products[1] / (2000 * alpha)
        s2 = yc @ np.linalg.solve(products[2] + 2000 * alpha * np.eye(2000), yc) / 2000
        exact = np.sqrt(s2 * np.einsum("ij,ij->i", z, np.linalg.solve(A, z.T).T))
        # measured: equal to 6 digits on both paths at both alphas; the amplitude alone
        # to 1e-5 (the covariance's float32 products) and 1e-8 (the rows')
        np.testing.assert_allclose(model.gp_amplitude_, s2, rtol=1e-3)
        np.testing.assert_allclose(std, exact, rtol=1e-3)


def test_a_factor_with_columns_not_orthogonal_gives_the_same_std(client, tmp_path):
    # model files of the float32 order-n path hold factors whose columns are
    # far from orthogonal (max |U^T U - I| 0.96); the sum of parts read them
    # as std 35 where the prior is 1.  Loading makes them orthogonal, F F^T kept
    from dkernel.solvers import gp

    rng = np.random.default_rng(4)
    X = rng.standard_normal((300, 2))
    y = np.sin(X[:, 0])
    model = DSGRegressor(alpha=1e-4, bandwidth=1.0, n_features=512, n_epochs=1,
                         posterior_variance=True, random_state=0, client=client).fit(X, y)
    Xq = np.concatenate([X[:5], rng.standard_normal((5, 2)) * 3])
    want = model.predict(Xq, return_std=True)[1]
    F = model.gp_factor_
    M = np.linalg.qr(rng.standard_normal((F.shape[1], F.shape[1])))[0]
    mixed = F @ M  # the same F F^T, columns no longer orthogonal
    assert np.abs(mixed.T @ mixed - np.diag(np.diag(mixed.T @ mixed))).max() > 1e-3
    fixed = gp.orthonormal(mixed)
    np.testing.assert_allclose(fixed @ fixed.T, F @ F.T, atol=1e-10)
    model.gp_factor_ = mixed
    model.save(tmp_path / "m.npz")
    np.testing.assert_allclose(load_model(tmp_path / "m.npz").predict(Xq, return_std=True)[1],
                               want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("n_features", [1024, 256], ids=["fewer-rows", "covariance"])
def test_the_std_is_in_the_units_of_y(client, n_features):
    # the prior's amplitude comes from y: y x 1000 gives the same fit x 1000 and
    # std x 1000 (a unit prior's std stayed the same whatever y's scale, and on
    # the diabetes target, std 77, its 95% intervals held no test point)
    X, y = _data(500, 6)
    y = 3 * y + 40
    kw = dict(bandwidth=0.5, alpha=1e-4, n_features=n_features, n_epochs=1,
              posterior_variance=True, random_state=0, client=client)
    Xt = np.linspace(-3, 3, 25, dtype=np.float32)[:, None]
    mean, std = DSGRegressor(**kw).fit(X, y).predict(Xt, return_std=True)
    scaled = DSGRegressor(**kw).fit(X, 1000 * y)
    mean_k, std_k = scaled.predict(Xt, return_std=True)
    np.testing.assert_allclose(mean_k, 1000 * mean, rtol=1e-3)
    np.testing.assert_allclose(std_k, 1000 * std, rtol=1e-3)
    assert std_k.max() > 100


@pytest.mark.parametrize("n_features", [1024, 256], ids=["fewer-rows", "covariance"])
def test_the_amplitude_of_a_gaussian_process_draw_is_found(client, n_features):
    # y = f + e, f ~ GP(0, s^2 k) with s = 5 (an exact RBF kernel on 500 rows) and
    # e ~ N(0, n alpha s^2): the model's prior at the fit's noise-to-signal ratio.
    # One draw's maximum-likelihood s^2 is within a few 1/sqrt(n) of the truth
    # (measured 24.8-28.2 for s^2 = 25 over three draws, both paths), and the
    # random features' value within 1% of the exact kernel's (measured <= 0.8%)
    rng = np.random.default_rng(7)
    n, bw, alpha, s = 500, 0.5, 1e-3, 5.0
    X = rng.uniform(-3, 3, (n, 1))
    K = kernel_matrix(X, X, "gaussian", bw)
    f = s * np.linalg.cholesky(K + 1e-8 * np.eye(n)) @ rng.standard_normal(n)
    y = f + np.sqrt(n * alpha) * s * rng.standard_normal(n)
    model = DSGRegressor(bandwidth=bw, alpha=alpha, n_features=n_features, n_epochs=1,
                         posterior_variance=True, random_state=0, client=client).fit(X, y)
    assert 0.5 * s**2 < model.gp_amplitude_ < 2 * s**2, model.gp_amplitude_
    yc = y - y.mean()
    exact = yc @ np.linalg.solve(K + n * alpha * np.eye(n), yc) / n
    assert abs(model.gp_amplitude_ / exact - 1) < 0.03, (model.gp_amplitude_, exact)
    # far from the rows the std is the prior's, s
    far = model.predict(np.array([[10.0], [-10.0]]), return_std=True)[1]
    assert np.all((far > s / np.sqrt(2)) & (far < s * np.sqrt(2))), far


def test_each_output_of_a_2d_y_has_its_own_amplitude(client):
    X, y = _data(300, 8)
    Y = np.stack([y, 10 * y + 1], axis=1)
    kw = dict(bandwidth=0.5, alpha=1e-3, n_features=256, n_epochs=1, posterior_variance=True,
              random_state=0, client=client)
    model = DSGRegressor(**kw).fit(X, Y)
    one = DSGRegressor(**kw).fit(X, y)
    Xt = np.linspace(-3, 3, 7, dtype=np.float32)[:, None]
    mean, std = model.predict(Xt, return_std=True)
    # (n, n_outputs), as scikit-learn's GaussianProcessRegressor returns for 2-D y
    assert mean.shape == std.shape == (7, 2) and model.gp_amplitude_.shape == (2,)
    np.testing.assert_allclose(model.gp_amplitude_, one.gp_amplitude_ * np.array([1, 100]),
                               rtol=1e-6)
    np.testing.assert_allclose(std[:, 0], one.predict(Xt, return_std=True)[1], rtol=1e-6)
    np.testing.assert_allclose(std[:, 1], 10 * std[:, 0], rtol=1e-6)


def test_a_model_file_without_the_amplitude_loads_with_the_unit_prior(client, tmp_path):
    # files written before the amplitude was estimated hold the unit prior's factor:
    # they load with gp_amplitude_ 1.0 and give the std they gave then
    X, y = _data(200, 9)
    model = DSGRegressor(bandwidth=0.5, alpha=1e-3, n_features=256, n_epochs=1,
                         posterior_variance=True, random_state=0, client=client).fit(X, 50 * y)
    model.save(tmp_path / "new.npz")
    with np.load(tmp_path / "new.npz") as z:
        arrays = {k: z[k] for k in z.files if k != "gp_amplitude"}
    np.savez(tmp_path / "old.npz", **arrays)
    old = load_model(tmp_path / "old.npz")
    assert old.gp_amplitude_ == 1.0 and model.gp_amplitude_ > 100
    Xt = np.linspace(-3, 3, 7, dtype=np.float32)[:, None]
    unit = model.predict(Xt, return_std=True)[1] / np.sqrt(model.gp_amplitude_)
    np.testing.assert_allclose(old.predict(Xt, return_std=True)[1], unit, rtol=1e-6)
    np.testing.assert_array_equal(old.predict(Xt), model.predict(Xt))
