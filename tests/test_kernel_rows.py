"""Stored kernel rows (dkernel.solvers.kernel_rows) against the dense kernel."""

from __future__ import annotations

import numpy as np
import pytest

from dkernel.kernels import kernel_matrix
from dkernel.solvers import kernel_rows as kr

# the error each storage mode may add to one kernel value k in [0, 1]
_BOUND = {"float32": 1e-6, "fixed16": 0.5 / 65535 + 1e-7, "bfloat16": 2.0**-8}


def _problem(seed=0, n=260, p=300, d=5):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    C = rng.standard_normal((p, d)).astype(np.float32)
    K = kernel_matrix(X.astype(np.float64), C.astype(np.float64), "gaussian", 1.5)
    return X, C, K, rng


@pytest.mark.parametrize("mode", ["float32", "fixed16", "bfloat16"])
def test_stored_values_are_within_the_modes_rounding(mode):
    X, C, K, _ = _problem()
    stored = kr.fill(X, C, (C * C).sum(axis=1), "gaussian", 1.5, mode)
    assert stored.dtype == (np.float32 if mode == "float32" else np.uint16)
    dense = kr._decode_rows(stored, np.arange(len(X)), mode, np.empty(K.shape, np.float32))
    dense = dense * kr.cache_scale(mode)
    err = np.abs(dense - K)
    # bfloat16's error is relative (2^-9 of k, rounded half up: <= 2^-8 k), the others absolute
    limit = _BOUND[mode] * (K if mode == "bfloat16" else 1.0) + 1e-6
    assert np.all(err <= limit)


@pytest.mark.parametrize("mode", ["float32", "fixed16", "bfloat16"])
def test_a_symmetric_fill_matches_the_dense_kernel_in_every_tile(mode, monkeypatch):
    # a diagonal block of the symmetric fill computes each tile's columns from its
    # first row on and copies the rest, transposed, from the tiles above it
    monkeypatch.setattr(kr, "TILE_ROWS", 16)
    monkeypatch.setattr(kr, "FILL_TILE_BYTES", 64)  # 16-row tiles: 17 of them, the last short
    X = np.random.default_rng(5).standard_normal((260, 4)).astype(np.float32) + 3
    K = kernel_matrix(X.astype(np.float64), X.astype(np.float64), "gaussian", 1.5)
    c = kr.centers_payload(X)
    stored = kr.fill(X, c["centers"], c["centers_sq"], "gaussian", 1.5, mode,
                     c["centers_shift"], symmetric=True)
    dense = kr._decode_rows(stored, np.arange(len(X)), mode,
                            np.empty(K.shape, np.float32)) * kr.cache_scale(mode)
    limit = _BOUND[mode] * (K if mode == "bfloat16" else 1.0) + 1e-6
    assert np.all(np.abs(dense - K) <= limit)


@pytest.mark.parametrize("apart", [False, True], ids=["gathered", "stored-apart"])
@pytest.mark.parametrize("mode", ["float32", "fixed16", "bfloat16"])
def test_row_gather_products_match_the_dense_kernel(mode, apart):
    X, C, K, rng = _problem(1)
    stored = kr.fill(X, C, (C * C).sum(axis=1), "gaussian", 1.5, mode)
    rows = rng.permutation(X.shape[0])[:200]  # unsorted, more than one 128-row tile
    sub = np.sort(rng.choice(C.shape[0], 90, replace=False))
    a = rng.standard_normal((C.shape[0], 3)).astype(np.float32)
    y = rng.standard_normal((len(rows), 3)).astype(np.float32)
    stored_sub = kr.subsample_columns(stored, sub) if apart else None
    g, kg = kr.rows_products(stored, mode, rows, a, y, sub, stored_sub)
    # each stored value is off by at most the mode's bound (times k for bfloat16), so
    # K a is off by at most bound * sum |a_j| per entry
    bound = _BOUND[mode] * np.abs(a).sum(axis=0) + 1e-4
    r = K[rows] @ a - y
    assert np.all(np.abs(g - r) <= bound)
    # kg = K(S, X_b) g: the stored values' error (bound) times |g|, plus K times g's error
    ks = K[np.ix_(rows, sub)]
    kg_bound = ((_BOUND[mode] + 1e-6) * np.abs(g).sum(axis=0)
                + np.abs(ks).T @ np.broadcast_to(bound, g.shape))
    assert kg.dtype == np.float64
    assert np.all(np.abs(kg - ks.T @ r) <= kg_bound)


@pytest.mark.parametrize("mode", ["float32", "fixed16", "bfloat16"])
def test_range_products_match_the_dense_kernel(mode):
    X, C, K, rng = _problem(2)
    stored = kr.fill(X, C, (C * C).sum(axis=1), "gaussian", 1.5, mode)
    v = rng.standard_normal((C.shape[0], 2)).astype(np.float32)
    Y = rng.standard_normal((X.shape[0], 2)).astype(np.float32)
    i, j = 37, 237
    r, w = kr.range_products(stored, mode, i, j, v, Y[i:j], np.empty((j - i, 2), np.float32))
    r_ref = K[i:j] @ v - Y[i:j]
    bound = _BOUND[mode] * np.abs(v).sum(axis=0) + 1e-4
    assert np.all(np.abs(r - r_ref) <= bound)
    # w = K^T r against the exact K and the r returned
    w_ref = K[i:j].T @ r.astype(np.float64)
    assert np.all(np.abs(w - w_ref) <= _BOUND[mode] * np.abs(r).sum(axis=0) + 1e-4)


def _peek(key):
    from dkernel.engine import cache

    return cache.peek(key)


@pytest.mark.parametrize("mode", ["float32", "fixed16"])
def test_symmetric_fill_stores_each_chunks_rows_from_one_block_per_pair(client, mode):
    # 5 chunks (the last short) over 2 workers: same-home and cross-home pairs
    from dkernel.data import open_dataset
    from dkernel.engine import Engine

    X = np.random.default_rng(3).standard_normal((700, 3)).astype(np.float32)
    data = open_dataset(X, chunk_rows=150)
    chunks, homes = Engine(client).resident_chunks(data)
    keys = [("symmetric-fill-test", mode, c) for c in range(data.n_chunks)]
    rows = list(data.row_chunks)
    assert kr.symmetric_fill(client, chunks, homes, rows, keys, "gaussian", 0.7, mode, owner="t")
    K = kernel_matrix(X.astype(np.float64), X.astype(np.float64), "gaussian", 0.7)
    offs = np.concatenate([[0], np.cumsum(rows)])
    try:
        for c in range(data.n_chunks):
            stored = client.submit(_peek, keys[c], workers=[homes[c]], pure=False).result()
            assert stored.shape == (rows[c], 700)
            got = kr._decode_rows(stored, np.arange(rows[c]), mode,
                                  np.empty(stored.shape, np.float32)) * kr.cache_scale(mode)
            # every column written (np.empty left nothing), each within the mode's rounding
            assert np.all(np.abs(got - K[offs[c] : offs[c + 1]]) <= _BOUND[mode] + 1e-6)
    finally:
        for h in set(homes):
            client.submit(kr._discard, keys, workers=[h], pure=False).result()


def test_kernel_eigenpro_is_bit_identical_on_one_or_two_workers(client):
    # the pair blocks are always X_a against X_b (a <= b), whichever worker
    # computes them, so the stored rows -- and the model -- do not depend on the cluster
    import logging

    import dask.array as da
    from distributed import Client, LocalCluster

    from dkernel import EigenProRegressor

    X = np.random.default_rng(4).standard_normal((900, 3)).astype(np.float32)
    y = np.sin(2 * X[:, 0])
    Xd, yd = da.from_array(X, chunks=(200, 3)), da.from_array(y, chunks=200)
    kw = dict(bandwidth=0.6, n_epochs=2, kernel_cache="fixed16", lanes=2, random_state=2)
    two = EigenProRegressor(client=client, **kw).fit(Xd, yd)
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as one_client:
        one = EigenProRegressor(client=one_client, **kw).fit(Xd, yd)
    assert np.array_equal(one.coef_, two.coef_)


def _entries_now():
    from dkernel.engine import cache

    return cache.stats()["entries"]


def test_a_fill_that_fails_leaves_no_rows_behind(client):
    # a pair task raises half-way: the rows already written are dropped on every
    # worker, and nothing was ever stored under the keys later lookups use
    from dkernel.data import open_dataset
    from dkernel.engine import Engine

    X = np.random.default_rng(5).standard_normal((400, 3)).astype(np.float32)
    data = open_dataset(X, chunk_rows=100)
    chunks, homes = Engine(client).resident_chunks(data)
    keys = [("failing-fill-test", c) for c in range(data.n_chunks)]
    before = client.run(_entries_now)
    with pytest.raises(ValueError, match="kernel"):
        kr.symmetric_fill(client, chunks, homes, list(data.row_chunks), keys, "no-such-kernel",
                          0.7, "fixed16", owner="failing")
    assert client.run(_entries_now) == before
    for c in range(data.n_chunks):
        assert client.submit(_peek, keys[c], workers=[homes[c]], pure=False).result() is None
    # rows another fit published under the same keys are left alone: it is using them
    client.gather([client.submit(_put, keys[c], workers=[homes[c]], pure=False)
                   for c in range(data.n_chunks)])
    with pytest.raises(ValueError, match="kernel"):
        kr.symmetric_fill(client, chunks, homes, list(data.row_chunks), keys, "no-such-kernel",
                          0.7, "fixed16", owner="failing-again")
    for c in range(data.n_chunks):
        kept = client.submit(_peek, keys[c], workers=[homes[c]], pure=False).result()
        assert kept is not None and kept[0] == 7
    client.gather([client.submit(_drop, keys[c], workers=[homes[c]], pure=False)
                   for c in range(data.n_chunks)])


def _put(key):
    from dkernel.engine import cache

    return cache.lookup_or_fill(key, lambda: np.full(4, 7.0), 32, owner="other-fit") is not None


def _drop(key):
    from dkernel.engine import cache

    return cache.discard(key)
