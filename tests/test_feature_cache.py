"""feature_cache: every feature solver fits the same model with its blocks kept
on the workers or regenerated, the choice is resolved from the workers' memory
and recorded, and a store whose blocks do not fit streams as before, without
spilling."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from distributed import Client, LocalCluster

from dkernel import (
    DSGDensityRatio,
    DSGOneClassSVM,
    DSGRegressor,
    EigenProRegressor,
    KernelCCA,
    KernelPCA,
    load_model,
)
from dkernel.datasets import make_store


def _data(n=3000, d=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, d)).astype(np.float32)
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.05 * rng.standard_normal(n)
    return X, y


def _chunked(path, X, y):
    """X, y as a zarr store of 4 chunks: a fit reads them from disk every epoch."""
    import zarr

    g = zarr.open_group(str(path), mode="w")
    g.create_array("X", data=X, chunks=(len(X) // 4, X.shape[1]))
    g.create_array("y", data=y, chunks=(len(y) // 4,))
    return str(path)


def _fits(make, fit):
    out = {}
    for mode in ("off", "float32", "fixed16"):
        est = make(mode)
        fit(est)
        out[mode] = est
    return out


def _same(a, b, rtol):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.abs(b).max())


CASES = {
    "dsg-preconditioned": (lambda m, c: DSGRegressor(n_features=512, n_epochs=3, feature_cache=m,
                                                      client=c), "coef_"),
    "dsg-blocks": (lambda m, c: DSGRegressor(n_features=512, n_epochs=2, preconditioner=None,
                                             feature_cache=m, client=c), "coef_"),
    "eigenpro-rf": (lambda m, c: EigenProRegressor(n_features=512, n_epochs=3, feature_cache=m,
                                                   client=c), "coef_"),
    "kpca-power": (lambda m, c: KernelPCA(4, n_features=512, n_epochs=2, steps="power",
                                          feature_cache=m, client=c), "components_"),
    "kcca": (lambda m, c: KernelCCA(2, n_features=512, n_epochs=2, feature_cache=m, client=c),
             "x_components_"),
    "one-class": (lambda m, c: DSGOneClassSVM(n_features=512, n_epochs=2, feature_cache=m,
                                              client=c), "coef_"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_model_with_the_cache_on_and_off(case, client, tmp_path):
    make, attr = CASES[case]
    X, y = _data()
    store = _chunked(tmp_path / "d.zarr", X, y)
    if case == "kcca":
        Y = np.c_[np.cos(3 * X[:, 0]), X[:, 1] ** 2].astype(np.float32)
        fit = lambda est: est.fit(X, Y)  # noqa: E731
    else:
        fit = lambda est: est.fit(store)  # noqa: E731
    models = _fits(lambda m: make(m, client), fit)
    for mode, est in models.items():
        assert est.feature_cache_ == mode
    # components: the subspace (signs and rotations within it are not the model)
    off, f32, f16 = (getattr(models[m], attr) for m in ("off", "float32", "fixed16"))
    if attr != "coef_":
        off, f32, f16 = (C @ C.T for C in (off, f32, f16))
    _same(f32, off, 2e-4)  # float32 rounding: the products sum in another order
    _same(f16, off, 2e-2)  # features to 2.2e-5: the model moves by about as much
    path = tmp_path / "m.npz"
    models["fixed16"].save(path)
    assert load_model(path).feature_cache_ == "fixed16"


def test_density_ratio_same_with_the_cache_on_and_off(client):
    X, _ = _data(2000)
    Z, _ = _data(2000, seed=1)
    fits = {m: DSGDensityRatio(n_features=512, n_epochs=2, feature_cache=m,
                               client=client).fit(X, Z * 0.8) for m in ("off", "float32")}
    _same(fits["float32"].coef_, fits["off"].coef_, 2e-4)


def test_auto_is_off_for_one_epoch_and_float32_when_it_fits(client, tmp_path):
    X, y = _data()
    store = _chunked(tmp_path / "d.zarr", X, y)
    one = DSGRegressor(n_features=256, n_epochs=1, client=client).fit(store)
    assert one.feature_cache_ == "off"
    two = DSGRegressor(n_features=256, n_epochs=2, client=client).fit(store)
    assert two.feature_cache_ == "float32"


def test_kernel_form_refuses_feature_cache():
    X, y = _data(200)
    with pytest.raises(ValueError, match="feature_cache='float32' applies to the random-feature"):
        EigenProRegressor(feature_cache="float32").fit(X, y)
    with pytest.raises(ValueError, match="kernel_cache='off' keeps the kernel form"):
        EigenProRegressor(n_features=256, kernel_cache="off").fit(X, y)


def _spilled(dask_worker) -> int:
    total = getattr(dask_worker.data, "spilled_total", None)
    return int(getattr(total, "disk", 0) or 0) if total is not None else 0


def test_blocks_larger_than_the_workers_stream_without_spilling(tmp_path):
    """Workers with a 1 GB limit (cache budget 400 MB, less what the process
    holds beyond 70% of the limit): 200k rows x 2048 features is 819 MB of
    float32 blocks a worker (410 MB as fixed16), so "auto" resolves to "off"
    and the fit streams; 120k rows (491 MB, 246 MB as fixed16) fit as fixed16."""
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GB",
                      dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        big = make_store(tmp_path / "big.zarr", 200_000, 8, chunk_rows=25_000,
                         kind="regression", client=client)
        kw = dict(n_features=2048, block_size=512, n_epochs=2, random_state=0, client=client)
        auto = DSGRegressor(**kw).fit(big)
        assert auto.feature_cache_ == "off"
        off = DSGRegressor(feature_cache="off", **kw).fit(big)
        np.testing.assert_array_equal(auto.coef_, off.coef_)
        small = make_store(tmp_path / "small.zarr", 120_000, 8, chunk_rows=15_000,
                           kind="regression", client=client)
        assert DSGRegressor(**kw).fit(small).feature_cache_ == "fixed16"
        assert sum(client.run(_spilled).values()) == 0


def test_a_resume_goes_on_with_the_cache_mode_its_checkpoint_records(client, resume_mid_fit,
                                                                    tmp_path):
    """The model depends on where the blocks lived; "auto" resolves from the
    workers' memory, so a resume on workers with less of it chose fixed16
    where the fit began on float32 and ended 6.3e-5 away, without a word.
    A resume at "auto" now takes the checkpoint's mode, and one given another
    mode is refused, naming the checkpoint's."""
    X, y = _data()
    modes = iter(["fixed16", "auto"])

    def make(**kw):
        return DSGRegressor(n_features=256, n_epochs=3, batch_size=512, lanes=2,
                            random_state=0, feature_cache=next(modes), client=client, **kw)

    full, resumed, _ = resume_mid_fit(make, X, y)
    assert full.feature_cache_ == resumed.feature_cache_ == "fixed16"
    np.testing.assert_array_equal(resumed.predict(X[:200]), full.predict(X[:200]))
    modes = iter(["fixed16", "float32"])
    (tmp_path / "mid.ckpt.npz").unlink()  # (the fixture's: the second run starts afresh)
    with pytest.raises(ValueError, match=r"cache: the checkpoint's 'fixed16', this fit's "
                                         r"'float32'.*resume with feature_cache='fixed16'"):
        resume_mid_fit(make, X, y)


def _set_spill(value):
    import dask

    dask.config.set({"distributed.worker.memory.spill": value})


def test_the_cache_room_stops_at_the_workers_spill_threshold(client):
    # a worker whose process already holds more than its spill threshold has no room:
    # the budget alone (0.4 of the limit) made it spill its chunks (cache.headroom);
    # with a threshold of 0.1% of the limit every worker's RSS is above it
    from dkernel.engine import cache

    old = client.run(lambda: __import__("dask").config.get("distributed.worker.memory.spill"))
    client.run(_set_spill, 0.001)
    try:
        rooms = cache.budgets(client)
    finally:
        client.run(_set_spill, next(iter(old.values())))
    assert rooms and all(v == 0 for v in rooms.values()), rooms
    assert all(v > 0 for v in cache.budgets(client).values())
