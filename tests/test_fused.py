"""The fused row-tile pass against a dense reference: same f, loss and
gradient as building Phi for every row at once."""

import numpy as np
import pytest

from dkernel.engine.program import Chunk
from dkernel.features import FeatureMap
from dkernel.solvers import fused
from dkernel.solvers.fused import pool_gradient


@pytest.mark.parametrize("rows", [None, "subset"])
@pytest.mark.parametrize("mode", ["off", "float32", "fixed16"])
def test_pool_gradient_matches_dense(rows, mode, monkeypatch):
    # tiles of 64 rows over 1000 rows: 16 tiles, the last one short
    monkeypatch.setattr(fused, "_TILE_BYTES", 64 * 4 * 384)
    monkeypatch.setattr(fused, "_MIN_BLOCK_TILE", 64)
    rng = np.random.default_rng(1)
    X = rng.standard_normal((1000, 5)).astype(np.float32)
    y = rng.standard_normal((1000, 2)).astype(np.float32)
    fm = FeatureMap("gaussian", 1.5, 5, 128, random_state=3)
    n_blocks = 3
    idx = None if rows is None else np.sort(rng.choice(1000, 700, replace=False))
    coef = rng.standard_normal((n_blocks * 128, 2)).astype(np.float32) * 0.1
    Y = y if idx is None else y[idx]

    def derivative(f, tile):
        r = f - Y[tile]
        return float(np.sum(r * r)), r

    chunk = Chunk(X, y, idx, ("fused-test", rows, mode), run="fused-test")
    grad, loss = pool_gradient(fm, chunk, n_blocks, coef, derivative, mode)

    Phi = fm.blocks(X if idx is None else X[idx], range(n_blocks)).astype(np.float64)
    r = Phi @ coef - Y
    # float32 features summed over 700-1000 rows: ~1e-5 relative
    # fixed16 stores each feature to 2.2e-5 (solvers/feature_cache.py): 5x the bounds
    wide = 5 if mode == "fixed16" else 1
    np.testing.assert_allclose(grad, Phi.T @ r, rtol=2e-4 * wide, atol=2e-3 * wide)
    assert loss == pytest.approx(float(np.sum(r * r)), rel=1e-4 * wide)
    assert fused.tile_rows(n_blocks * 128) == 64


@pytest.mark.parametrize("views", [1, 2])
@pytest.mark.parametrize("rows", [None, "subset"])
@pytest.mark.parametrize("mode", ["off", "float32", "fixed16"])
def test_power_partial_matches_dense_sums_of_every_view(views, rows, mode, monkeypatch):
    """The power steps' pass (KPCA: one view; KSVD and KCCA's whole-pool steps:
    two, their tiles side by side in separate scratch buffers) gives the
    uncentred sums H, H^T H, Phi_s^T H and Phi_s^T 1 of every view, H holding
    all views' scores, as the dense features do."""
    from dkernel.solvers.components import ALL_BLOCKS, power_partial

    monkeypatch.setattr(fused, "_TILE_BYTES", 64 * 4 * 384 * views)  # 64-row tiles
    monkeypatch.setattr(fused, "_MIN_BLOCK_TILE", 64)
    rng = np.random.default_rng(2)
    X = rng.standard_normal((1000, 5)).astype(np.float32)
    Y = rng.standard_normal((1000, 3)).astype(np.float32)
    n_blocks, k = 3, 2
    fms = [FeatureMap("gaussian", 1.5, a.shape[1], 128, random_state=3, stream=s)
           for s, a in enumerate((X, Y)[:views])]
    coefs = [rng.standard_normal((n_blocks * 128, k)).astype(np.float32) * 0.1 for _ in fms]
    idx = None if rows is None else np.sort(rng.choice(1000, 700, replace=False))
    chunk = Chunk(X, Y if views == 2 else None, idx, ("power-test", views, rows, mode),
                  run="power-test")
    payload = {"views": [{"features": f, "block": ALL_BLOCKS, "n_eval": n_blocks, "coef": c}
                         for f, c in zip(fms, coefs)], "cache": mode}
    out = power_partial(payload, chunk)

    pick = slice(None) if idx is None else idx
    Phis = [f.blocks(a[pick], range(n_blocks)).astype(np.float64) for f, a in zip(fms, (X, Y))]
    H = np.concatenate([P @ c for P, c in zip(Phis, coefs)], axis=1)
    assert out["count"] == H.shape[0]
    wide = 5 if mode == "fixed16" else 1  # fixed16: features to 2.2e-5
    np.testing.assert_allclose(out["H"], H.sum(0), rtol=1e-4 * wide, atol=1e-3 * wide)
    np.testing.assert_allclose(out["HH"], H.T @ H, rtol=1e-4 * wide, atol=1e-3 * wide)
    for s, P in enumerate(Phis):
        np.testing.assert_allclose(out[f"phi_sum{s}"], P.sum(0), rtol=1e-4 * wide,
                                   atol=1e-2 * wide)
        np.testing.assert_allclose(out[f"phiH{s}"], P.T @ H, rtol=2e-4 * wide,
                                   atol=2e-3 * wide)
