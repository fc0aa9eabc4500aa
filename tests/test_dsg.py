"""Doubly stochastic gradient estimators against exact references."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from dkernel import DSGClassifier, DSGRegressor, load_model
from dkernel.datasets import make_blobs_classification, make_dai_ridge
from dkernel.kernels import kernel_matrix


def test_ridge_approaches_exact_kernel_ridge_as_features_and_iterations_grow(client):
    X, y = make_dai_ridge(1000, 2, random_state=0)
    Xt, _ = make_dai_ridge(400, 2, random_state=1)
    nu, bw, n = 1e-3, 1.0, len(X)
    # Exact minimiser of mean (f - y)^2 / 2 + nu/2 |f|^2 (centred targets): a = (K + n nu I)^-1 y.
    K = kernel_matrix(X.astype(np.float64), X.astype(np.float64), "gaussian", bw)
    a = np.linalg.solve(K + n * nu * np.eye(n), y - y.mean())
    exact = kernel_matrix(Xt.astype(np.float64), X.astype(np.float64), "gaussian", bw) @ a + y.mean()
    errs = []
    for D, epochs in [(256, 4), (1024, 15), (4096, 45)]:
        m = DSGRegressor(bandwidth=bw, alpha=nu, n_features=D, n_epochs=epochs, batch_size=100,
                         step_size=4.0, step_decay=0.01, client=client).fit(X, y)
        errs.append(np.linalg.norm(m.predict(Xt) - exact) / np.linalg.norm(exact - y.mean()))
    assert errs[0] > errs[1] > errs[2], errs
    # 4096 features leave a kernel approximation error of ~1/sqrt(4096) ~ 1.6%.
    assert errs[2] < 0.04, errs


def test_classifier_learns_a_nonlinear_rule_and_beats_a_linear_model(client):
    from sklearn.linear_model import LogisticRegression

    X, y = make_blobs_classification(3000, 8)
    Xt, yt = make_blobs_classification(1500, 8, random_state=1)
    m = DSGClassifier(n_features=1024, n_epochs=8, step_size=50.0, step_decay=0.0,
                      bandwidth=2.0, batch_size=256, client=client).fit(X, y)
    linear = LogisticRegression(max_iter=500).fit(X, y).score(Xt, yt)
    acc = m.score(Xt, yt)
    assert acc > linear + 0.15, (acc, linear)
    proba = m.predict_proba(Xt[:5])
    np.testing.assert_allclose(proba.sum(axis=1), 1, rtol=1e-5)
    assert set(np.unique(m.predict(Xt))) <= set(np.unique(y))


@pytest.mark.parametrize("loss,step_size", [("hinge", 20.0), ("logistic", 20.0), ("squared_hinge", 5.0)])
def test_binary_losses_train_a_separating_rule(client, loss, step_size):
    X, y = make_blobs_classification(1500, 5, n_classes=2)
    Xt, yt = make_blobs_classification(800, 5, n_classes=2, random_state=1)
    m = DSGClassifier(loss=loss, n_features=512, n_epochs=6, step_size=step_size, bandwidth=1.5, batch_size=128,
                      client=client).fit(X, y)
    assert m.coef_.shape[1] == 1
    assert m.score(Xt, yt) > 0.78  # an RBF SVC scores 0.88, a linear model ~0.55


def test_dask_input_gives_lazy_float32_predictions(client):
    X, y = make_dai_ridge(800, 3)
    Xd, yd = da.from_array(X, chunks=(200, 3)), da.from_array(y, chunks=200)
    m = DSGRegressor(n_features=256, n_epochs=1, client=client).fit(Xd, yd)
    p = m.predict(Xd)
    assert isinstance(p, da.Array) and p.dtype == np.float32
    np.testing.assert_allclose(p.compute(), m.predict(X), rtol=1e-5, atol=1e-6)


def test_model_file_round_trip_predicts_identically(client, tmp_path):
    X, y = make_blobs_classification(600, 4)
    m = DSGClassifier(n_features=256, n_epochs=1, client=client).fit(X, y)
    path = tmp_path / "m.npz"
    m.save(str(path))
    back = load_model(path)
    assert isinstance(back, DSGClassifier) and back.client is None
    assert np.array_equal(back.predict(X), m.predict(X))
    assert back.get_params()["n_features"] == 256


def test_sklearn_clone_and_params_contract():
    from sklearn.base import clone

    m = DSGRegressor(n_features=128, alpha=0.1)
    c = clone(m)
    assert c.get_params() == m.get_params() and c is not m
    assert "n_features=128" in repr(m)
    with pytest.raises(ValueError, match="no parameter 'n_feature'"):
        m.set_params(n_feature=3)


def test_auto_bandwidth_is_the_median_heuristic_computed_from_a_sample(client, tmp_path):
    from dkernel.data import write_store

    X, y = make_blobs_classification(2000, 6)
    path = write_store(tmp_path / "s.zarr", X, y, chunk_rows=500)
    m = DSGClassifier(n_features=128, n_epochs=1, client=client).fit(path)
    d = np.sqrt(((X[:300, None, :] - X[None, :300, :]) ** 2).sum(-1))
    expect = np.median(d[np.triu_indices(300, 1)]) / np.sqrt(2)
    assert m.bandwidth_ == pytest.approx(expect, rel=0.1)


def test_automatic_step_is_scaled_by_the_top_kernel_eigenvalue(client):
    from dkernel.estimators.dsg import _STEP_SCALE
    from dkernel.kernels import top_eigenvalue

    X, y = make_blobs_classification(1000, 5)
    m = DSGClassifier(n_features=256, n_epochs=1, bandwidth=1.5, client=client).fit(X, y)
    rng = np.random.default_rng([0, 0xBA4D])
    sample = X[np.sort(rng.choice(1000, 1000, replace=False))].astype(np.float64)
    assert m.step_size_ == pytest.approx(_STEP_SCALE["softmax"] / top_eigenvalue(sample, "gaussian", 1.5))
    K = np.exp(-((X[:, None] - X[None]) ** 2).sum(-1) / (2 * 1.5**2)) / len(X)
    assert top_eigenvalue(X, "gaussian", 1.5) == pytest.approx(np.linalg.eigvalsh(K)[-1], rel=1e-6)
