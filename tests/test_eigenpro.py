"""EigenPro: preconditioner against dense references, acceleration over plain
SGD, the distributed eigensolver on both workers, estimators and model files."""

from __future__ import annotations

import numpy as np
import pytest

from dkernel import EigenProClassifier, EigenProRegressor, load_model
from dkernel.data import open_dataset
from dkernel.engine import Engine
from dkernel.features import FeatureMap
from dkernel.kernels import kernel_matrix
from dkernel.linalg import eigensystem, randomized_eigensystem
from dkernel.solvers.eigenpro import (
    KernelEigenProProgram,
    KernelPreconditioner,
    kernel_block,
    step_size,
)
from dkernel.solvers.eigenpro_rf import feature_block
from dkernel.solvers.targets import TargetEncoding


def _points(n, d, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, d)).astype(np.float32)


def _subsample_dataset(S, chunk_rows):
    return open_dataset(S, np.arange(S.shape[0]), chunk_rows=chunk_rows)


def test_kernel_preconditioner_eigenvalues_match_numpy_eigh(client):
    S = _points(300, 3)
    K = kernel_matrix(S.astype(np.float64), S.astype(np.float64), "gaussian", 0.7) / 300
    ref = np.linalg.eigh(K)[0][::-1]
    params = {"Z": S, "kernel": "gaussian", "bandwidth": 0.7}
    engine = Engine(client)
    dense = eigensystem(engine, _subsample_dataset(S, 64), kernel_block, params, 20, 300,
                        operator="rows", method="dense")
    rand = eigensystem(engine, _subsample_dataset(S, 64), kernel_block, params, 10, 300,
                       operator="rows", method="randomized")
    # dense: K is formed from float32 kernel rows, so eigenvalues carry an
    # absolute error <= |E|_2 <= s * 6e-8 / s ~ 1e-7; randomized with 20
    # oversamples and 2 power steps on a Gaussian spectrum: well under 1e-3.
    np.testing.assert_allclose(dense.values, ref[:20], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(rand.values, ref[:10], rtol=1e-3, atol=1e-6)
    assert dense.method == "dense" and rand.method == "randomized"


def test_feature_covariance_eigenvalues_match_numpy_eigh(client):
    X = _points(1000, 4, seed=1)
    fm = FeatureMap("gaussian", 1.0, 4, 128, random_state=3)
    Z = fm.transform(X, 2).astype(np.float64)
    ref = np.linalg.eigh(Z.T @ Z / 1000)[0][::-1]
    data = open_dataset(X, chunk_rows=250)
    eig = eigensystem(Engine(client), data, feature_block, {"features": fm, "n_blocks": 2}, 15, 256,
                      operator="gram", method="dense")
    np.testing.assert_allclose(eig.values, ref[:15], rtol=1e-4, atol=1e-6)  # float32 features
    assert eig.row_norm_max == pytest.approx((Z * Z).sum(axis=1).max(), rel=1e-4)


@pytest.mark.parametrize("method", ["dense", "randomized"])
def test_centred_feature_covariance_matches_numpy_eigh(client, method):
    # the mean direction dominates the uncentred Gram of random Fourier features;
    # center=True must remove it exactly (same pass, no extra read)
    X = _points(1000, 4, seed=1) + 0.5
    fm = FeatureMap("gaussian", 2.0, 4, 128, random_state=3)
    Z = fm.transform(X, 2).astype(np.float64)
    Zc = Z - Z.mean(axis=0)
    ref = np.linalg.eigh(Zc.T @ Zc / 1000)[0][::-1]
    uncentred_top = np.linalg.eigh(Z.T @ Z / 1000)[0][-1]
    assert uncentred_top > 2 * ref[0]  # the check below can tell the two apart
    data = open_dataset(X, chunk_rows=250)
    eig = eigensystem(Engine(client), data, feature_block, {"features": fm, "n_blocks": 2}, 6, 256,
                      operator="gram", center=True, method=method, n_iter=4)
    np.testing.assert_allclose(eig.values, ref[:6], rtol=1e-3, atol=1e-6)
    assert eig.row_norm_max == pytest.approx((Zc * Zc).sum(axis=1).max(), rel=1e-4)


def test_center_is_for_the_gram_operator_only(client):
    with pytest.raises(ValueError, match="center=True"):
        eigensystem(Engine(client), open_dataset(_points(10, 2, seed=0)), kernel_block, {}, 2, 10,
                    operator="rows", center=True)


def test_randomized_eigensolver_runs_on_both_workers(client):
    from distributed import get_task_stream

    S = _points(400, 3, seed=2)
    params = {"Z": S, "kernel": "gaussian", "bandwidth": 0.7}
    with get_task_stream(client) as ts:
        randomized_eigensystem(Engine(client), _subsample_dataset(S, 50), kernel_block, params, 8, 400,
                               operator="rows")
    workers = {t["worker"] for t in ts.data if "randomized-eigensystem" in str(t["key"])}
    assert len(workers) == 2, f"the kernel-column products ran on {workers} only"


@pytest.mark.parametrize("alpha", [1.0, 0.95])
def test_preconditioned_operator_top_eigenvalue_is_lambda_q_plus_1(alpha):
    # With the subsample = all n points, one full-batch EigenPro step maps the
    # residual r to (I - E D E^T K) r, so the iteration operator is P K / n.
    X = _points(200, 3, seed=4).astype(np.float64)
    n, q = 200, 12
    K = kernel_matrix(X, X, "gaussian", 0.6)
    w, V = np.linalg.eigh(K / n)
    w, V = w[::-1], V[:, ::-1]
    pre = KernelPreconditioner(w[: q + 1], V[:, :q], q, alpha)
    P = np.eye(n) - pre.correction(K)
    top = np.max(np.linalg.eigvals(P @ K / n).real)
    # exact eigenvectors: top eigenvalue lambda_1^(1-alpha) lambda_{q+1}^alpha (= lambda_{q+1} at alpha=1)
    assert top == pytest.approx(pre.new_top, rel=1e-8)
    if alpha == 1.0:
        assert top == pytest.approx(w[q], rel=1e-8)
    assert w[0] / top > 5  # the step can grow by that much (11.7 here)


def _epochs_to_solution(client, X, y, K, q, batch, tol, max_epochs):
    """Run the kernel-form program under the engine until |K a - y| / |y| <= tol."""
    n = X.shape[0]
    w, V = np.linalg.eigh(K.astype(np.float64) / n)
    w, V = w[::-1], V[:, ::-1]
    pre = KernelPreconditioner(w[: q + 1], V[:, :q], q, 1.0)
    enc = TargetEncoding("regression", offset=(0.0,))
    data = open_dataset(X, y, chunk_rows=n // 4)
    program = KernelEigenProProgram(X, np.arange(n), pre, "laplacian", 2.0, enc, 1.0, data.row_offsets(),
                                    "float32", "test-epochs")
    reached = []

    def on_epoch(state, epoch):
        err = np.linalg.norm(K @ state["coef"][:, 0] - y) / np.linalg.norm(y)
        if err <= tol and not reached:
            reached.append(epoch + 1)
            program.stop = True

    state = Engine(client).run_steps(data, program, n_epochs=max_epochs, batch_size=batch,
                                     random_state=0, on_epoch=on_epoch)
    return (reached[0] if reached else None), state["coef"][:, 0], pre


def test_eigenpro_reaches_exact_solution_in_far_fewer_epochs_than_sgd(client):
    # Laplacian kernel: K is well conditioned enough that the interpolating
    # solution a* = K^-1 y is a meaningful reference (dense solve).
    X = _points(256, 4, seed=5)
    y = np.sin(2 * X.sum(axis=1)).astype(np.float64)
    K = kernel_matrix(X.astype(np.float64), X.astype(np.float64), "laplacian", 2.0)
    a_star = np.linalg.solve(K, y)
    ep_epochs, a_ep, pre = _epochs_to_solution(client, X, y, K, q=40, batch=64, tol=1e-2, max_epochs=60)
    sgd_epochs, _, _ = _epochs_to_solution(client, X, y, K, q=0, batch=64, tol=1e-2, max_epochs=150)
    assert ep_epochs is not None, "EigenPro did not reach 1% residual in 60 epochs"
    ratio = (sgd_epochs or 150) / ep_epochs
    print(f"\nepochs to 1% residual: EigenPro {ep_epochs}, SGD {sgd_epochs or '>150'}; ratio >= {ratio:.1f}")
    assert ratio >= 5
    # and it is the exact solution's function: predictions on new points agree
    Xt = _points(200, 4, seed=6).astype(np.float64)
    Kt = kernel_matrix(Xt, X.astype(np.float64), "laplacian", 2.0)
    f_star, f_ep = Kt @ a_star, Kt @ a_ep
    assert np.linalg.norm(f_ep - f_star) / np.linalg.norm(f_star) < 0.05


def test_step_size_rule_matches_design_formulas():
    beta, lam = 1.0, 1e-3  # m* = 1001
    assert step_size(500, beta, lam) == 500
    assert step_size(2000, beta, lam) == pytest.approx(0.99 * 4000 / (1 + 1999e-3))


def test_regressor_fits_smooth_function_and_reports_its_settings(client, tmp_path):
    X = _points(1200, 3, seed=7)
    y = np.sin(3 * X[:, 0]) + X[:, 1] ** 2
    model = EigenProRegressor(bandwidth=0.5, n_epochs=4, client=client).fit(X, y)
    assert model.score(X, y) > 0.99
    assert 1 <= model.q_ < len(model.eigenvalues_)
    assert model.batch_size_ <= model.critical_batch_ + 1 and model.step_size_ > 0
    model.save(tmp_path / "ep.npz")
    loaded = load_model(tmp_path / "ep.npz")
    np.testing.assert_allclose(loaded.predict(X[:50]), model.predict(X[:50]), rtol=1e-6)
    assert loaded.q_ == model.q_ and loaded.step_size_ == model.step_size_


def test_cached_and_streamed_kernel_rows_give_the_same_model(client):
    X = _points(800, 3, seed=8)
    y = np.cos(2 * X[:, 0] * X[:, 2])
    kw = dict(bandwidth=0.5, n_epochs=2, client=client)
    a = EigenProRegressor(kernel_cache="float32", **kw).fit(X, y).coef_
    b = EigenProRegressor(kernel_cache="off", **kw).fit(X, y).coef_
    c = EigenProRegressor(kernel_cache="bfloat16", **kw).fit(X, y).coef_
    # same float32 kernel rows, only tiled differently: BLAS rounding only
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * np.abs(a).max())
    # bfloat16 rows (8-bit mantissa, relative error <= 2^-9): a close model
    assert np.linalg.norm(c - a) / np.linalg.norm(a) < 0.05


def test_classifier_kernel_and_feature_forms_with_early_stopping(client):
    rng = np.random.default_rng(9)
    X = rng.normal(size=(1000, 2))
    y = np.where(X[:, 0] * X[:, 1] > 0, 7, 3)
    kern = EigenProClassifier(bandwidth=1.0, n_epochs=6, early_stopping=True, client=client).fit(X, y)
    feat = EigenProClassifier(bandwidth=1.0, n_features=512, n_epochs=6, client=client).fit(X, y)
    assert kern.score(X, y) > 0.95 and feat.score(X, y) > 0.9
    assert 1 <= len(kern.validation_scores_) <= 6 and kern.best_epoch_ >= 1
    assert set(kern.predict(X[:20]).tolist()) <= {3, 7}


def test_centers_subsample_bounds_the_model(client):
    X = _points(1500, 2, seed=10)
    y = np.sin(4 * X[:, 0])
    model = EigenProRegressor(bandwidth=0.4, n_centers=400, n_epochs=4, client=client).fit(X, y)
    assert model.centers_.shape == (400, 2) and model.coef_.shape == (400, 1)
    assert model.score(X, y) > 0.95


def test_conflicting_forms_are_rejected():
    with pytest.raises(ValueError, match="not both"):
        EigenProRegressor(n_centers=10, n_features=64).fit(np.zeros((5, 2)), np.zeros(5))
