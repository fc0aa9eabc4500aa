"""Rows stored in an order (sorted by the target or by a column) are said, with
the fix: step-based and one-pass fits assume rows in random order
(dkernel.estimators.order)."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest

from dkernel import (
    DivergenceError,
    DSGClassifier,
    DSGRegressor,
    FitQualityWarning,
    SphereRegressor,
    StreamingKernelPCA,
)
from dkernel.estimators.order import _chunk_moments, between_share

ORDERED = "the rows are stored in an order of"


def _quiet_about_order(fit):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ORDERED)
        return fit()


def test_the_share_between_chunks_is_small_in_random_order_and_near_one_sorted():
    x = np.random.default_rng(0).normal(size=(4000, 2))
    chunks = np.array_split(np.arange(4000), 8)
    shuffled = between_share(np.concatenate([_chunk_moments(x[i]) for i in chunks]))
    assert np.all(shuffled < 10 * 7 / 3999)
    x = x[np.argsort(x[:, 0])]
    ordered = between_share(np.concatenate([_chunk_moments(x[i]) for i in chunks]))
    assert ordered[0] > 0.9 and ordered[1] < 0.01
    # far from the origin the same (squared deviations from each chunk's mean)
    moved = between_share(np.concatenate([_chunk_moments(x[i] + 1e9) for i in chunks]))
    np.testing.assert_allclose(moved, ordered, rtol=1e-6, atol=1e-6)


def test_a_classifier_on_rows_sorted_by_class_is_warned(client):
    # DSGClassifier(preconditioner=None) on class-sorted rows: 0.789 against 0.957
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3000, 3)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    kw = dict(n_features=64, n_epochs=1, preconditioner=None, client=client)
    order = np.argsort(y, kind="stable")
    with pytest.warns(FitQualityWarning, match=ORDERED + r" y: the means of its \d+ chunks") \
            as caught:
        DSGClassifier(**kw).fit(X[order], y[order])
    # it names the user's line that called fit, not a line of dkernel
    assert {w.filename for w in caught if ORDERED in str(w.message)} == {__file__}
    _quiet_about_order(lambda: DSGClassifier(**kw).fit(X, y))


def test_spherical_sgd_on_a_lazy_y_sorted_store_is_warned(client):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(2000, 3))
    y = np.sin(X[:, 0])
    order = np.argsort(y)
    with pytest.warns(FitQualityWarning, match=ORDERED + " y.*reads the rows in order"):
        SphereRegressor(client=client).fit(da.from_array(X[order], chunks=(250, 3)),
                                           da.from_array(y[order], chunks=250))
    _quiet_about_order(lambda: SphereRegressor(client=client).fit(
        da.from_array(X, chunks=(250, 3)), da.from_array(y, chunks=250)))


def test_oja_on_rows_sorted_by_a_column_is_warned(client):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(20000, 3)).astype(np.float32)
    kw = dict(bandwidth=1.5, n_features=128, n_passes=1, client=client)
    with pytest.warns(FitQualityWarning, match=ORDERED + " column 2 of X.*Oja's rule"):
        StreamingKernelPCA(2, **kw).fit(X[np.argsort(X[:, 2])])
    _quiet_about_order(lambda: StreamingKernelPCA(2, **kw).fit(X))


def test_oja_on_a_store_sorted_by_a_column_is_warned_from_the_sample(client, tmp_path):
    """A store's X is not read for the check (a pass would cost the fit's):
    the bandwidth's sample, a few rows of each chunk it reads, tells."""
    from dkernel.data import write_store

    rng = np.random.default_rng(3)
    X = rng.normal(size=(20000, 3)).astype(np.float32)
    kw = dict(bandwidth=1.5, n_features=128, n_passes=1, client=client)
    for chunk_rows in (5000, 200):  # 4 chunks; 100 chunks, of which the sample reads 64
        ordered = write_store(tmp_path / f"sorted{chunk_rows}.zarr", X[np.argsort(X[:, 1])],
                              chunk_rows=chunk_rows)
        with pytest.warns(FitQualityWarning, match=ORDERED + " column 1 of X.*Oja's rule"):
            StreamingKernelPCA(2, **kw).fit(ordered)
        shuffled = write_store(tmp_path / f"shuffled{chunk_rows}.zarr", X, chunk_rows=chunk_rows)
        _quiet_about_order(lambda s=shuffled: StreamingKernelPCA(2, **kw).fit(s))


def test_a_divergence_on_y_sorted_rows_says_to_shuffle_them_before_the_step_size(client):
    """DSGRegressor(preconditioner=None) on y-sorted rows diverged, and the
    error asked for a smaller step_size: the order is the cause."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20000, 8))
    y = np.sin(2 * X[:, 0]) + X[:, 1]
    order = np.argsort(y)
    kw = dict(n_features=1024, preconditioner=None, random_state=0, client=client)
    with pytest.warns(FitQualityWarning, match=ORDERED), \
            pytest.raises(DivergenceError, match="shuffle the rows.*order of y.*smaller step_size"):
        DSGRegressor(**kw).fit(X[order], y[order])
    assert _quiet_about_order(lambda: DSGRegressor(**kw).fit(X, y)).score(X, y) > 0.5
