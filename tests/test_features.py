"""Seeded random features: regeneration, spectral correctness, dtype."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dkernel import DSGRegressor
from dkernel.engine.cluster import workers_info
from dkernel.features import FeatureMap, _weights
from dkernel.kernels import kernel_matrix


def _blocks_on_worker(fm: FeatureMap, X: np.ndarray, ids: list[int]) -> np.ndarray:
    return fm.blocks(X, ids)


def test_block_is_regenerated_bit_identically_on_every_worker(client):
    fm = FeatureMap("gaussian", 1.5, 7, 64, random_state=42)
    X = np.random.default_rng(0).standard_normal((50, 7)).astype(np.float32)
    here = fm.blocks(X, [0, 3, 11])
    workers = list(workers_info(client))
    assert len(workers) == 2
    there = [client.submit(_blocks_on_worker, fm, X, [0, 3, 11], workers=[w], pure=False).result()
             for w in workers]
    for arr in there:
        assert np.array_equal(arr, here)


_CORE_SCRIPT = """
import hashlib, sys
import numpy as np, threadpoolctl
from dkernel.features import FeatureMap
fm = FeatureMap("gaussian", 1.5, 37, 256, random_state=42)
X = np.random.default_rng(0).standard_normal((300, 37)).astype(np.float32)
np.save(sys.argv[1], fm.blocks(X, [0, 3, 11]))
arch = sorted({i.get("architecture") for i in threadpoolctl.threadpool_info()
               if i.get("internal_api") == "openblas"} - {None})
print(fm.weights_digest(), "arch=" + ",".join(arch))
"""


def test_features_across_blas_kernels_agree_to_float32_rounding(tmp_path):
    # Workers on other CPUs run other BLAS kernels: the weights (seeded NumPy
    # draws) are the same bits, but X W is summed in another order, so features
    # are equal to float32 rounding, not bit for bit (this machine, 4 OpenBLAS
    # kernels: max |dZ| = 5.4e-6 on features of size <= sqrt(2)).  Determinism
    # "on any cluster" therefore means clusters whose workers share a kernel.
    import os
    import subprocess
    import sys

    pytest.importorskip("threadpoolctl")
    out, arch = {}, {}
    for core in ("", "Haswell", "SandyBridge", "Prescott"):  # "": the CPU's own
        path = tmp_path / f"z{core}.npy"
        env = {**os.environ, "OPENBLAS_CORETYPE": core}
        res = subprocess.run([sys.executable, "-c", _CORE_SCRIPT, str(path)], env=env,
                             capture_output=True, text=True, check=True)
        digest, arch[core] = res.stdout.split()[-2:]
        out[core] = (digest, np.load(path))
    if len(set(arch.values())) < 2:
        pytest.skip(f"OPENBLAS_CORETYPE had no effect here: {arch}")
    digest0, Z0 = out[""]
    for core, (digest, Z) in out.items():
        assert digest == digest0  # the weights: bit-identical everywhere
        # t = x.w + b summed over 37 terms in another order differs by a few float32
        # ulps of |t| (~1e-6 each at |t| ~ 20); 2e-5 is ~4x the largest difference seen
        assert np.abs(Z - Z0).max() <= 2e-5, (core, np.abs(Z - Z0).max())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), block=st.integers(0, 10**6),
       kernel=st.sampled_from(["gaussian", "laplacian", "cauchy"]))
def test_weights_depend_only_on_seed_and_block_id(seed, block, kernel):
    args = (kernel, 2.0, 5, 16, "float32", seed, 0)
    W1, b1 = _weights(*args, block)
    _weights.cache_clear()
    W2, b2 = _weights(*args, block)
    assert np.array_equal(W1, W2) and np.array_equal(b1, b2)
    W3, _ = _weights(*args, block + 1)
    assert not np.array_equal(W1, W3)
    Ws, _ = _weights(kernel, 2.0, 5, 16, "float32", seed, 1, block)  # another stream
    assert not np.array_equal(W1, Ws)


@pytest.mark.parametrize("kernel", ["gaussian", "laplacian", "cauchy"])
def test_feature_map_approximates_kernel_with_error_falling_like_inverse_sqrt_D(kernel):
    X = np.random.default_rng(1).standard_normal((120, 4)).astype(np.float32)
    K = kernel_matrix(X.astype(np.float64), X.astype(np.float64), kernel, 2.0)
    Ds = [128, 512, 2048, 8192]
    errs = []
    for D in Ds:
        # average the RMS error over independent seeds: one draw is noisy
        e = [np.sqrt(np.mean((FeatureMap(kernel, 2.0, 4, 128, random_state=s).transform(X, D // 128)
                              .astype(np.float64) @ FeatureMap(kernel, 2.0, 4, 128, random_state=s)
                              .transform(X, D // 128).T.astype(np.float64) - K) ** 2))
             for s in range(4)]
        errs.append(np.mean(e))
    slope = np.polyfit(np.log(Ds), np.log(errs), 1)[0]
    # Monte-Carlo error of an average of D i.i.d. bounded terms: slope -1/2.
    assert -0.6 < slope < -0.4, (slope, errs)
    assert errs[-1] < 0.03


def test_features_stay_float32_without_upcast():
    fm = FeatureMap("gaussian", 1.0, 3, 32)
    Z = fm.transform(np.ones((4, 3), dtype=np.float64), 2)
    assert Z.dtype == np.float32


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "wide", 1e-20])
def test_nonsensical_bandwidth_is_rejected_with_its_value(bad):
    with pytest.raises(ValueError, match="bandwidth"):
        FeatureMap("gaussian", bad, 3, 32)


def test_a_bandwidth_whose_exponent_overflows_float32_is_refused_before_any_fit():
    # 1e-20: every kernel value NaN or 0, and EigenPro failed with "cannot
    # convert float NaN to integer" far from the cause
    from dkernel import DSGRegressor, EigenProRegressor, KernelPCA

    for est in (EigenProRegressor(bandwidth=1e-20), DSGRegressor(bandwidth=1e-20),
                KernelPCA(bandwidth=1e-20)):
        with pytest.raises(ValueError, match=r"bandwidth must be .*>= 1e-18.*got 1e-20"):
            est.fit(np.eye(3), np.ones(3)) if not isinstance(est, KernelPCA) else est.fit(np.eye(3))
    assert FeatureMap("gaussian", 1e-18, 3, 32).bandwidth == 1e-18


def test_unknown_kernel_names_the_choices():
    with pytest.raises(ValueError, match="gaussian, laplacian, cauchy"):
        FeatureMap("rbf", 1.0, 3, 32)


@pytest.mark.parametrize("kernel, digest", [
    ("gaussian", "a7507a60eb065a6befe9dd111bbe9df96628a8102d5c096f8d4b5454d49e81b6"),
    ("laplacian", "9a0f6724fcda7d411fdeaad8e3994e5b11d075b392c7807fcaf832b4a3f87bb0"),
    ("cauchy", "823d921c205d1d375c909c5b85b857465c48ab985b8cf2f28762bdcfaa310460"),
])
def test_weights_are_the_ones_every_saved_model_was_drawn_with(kernel, digest):
    # Golden digests recorded with NumPy 2.x (Philox + SeedSequence).  NumPy keeps
    # the bit generator's stream but not its samplers' across versions; should a
    # new NumPy draw other normals, saved models would predict with other
    # features.  This fails first, in CI; load_model refuses such a file.
    assert FeatureMap(kernel, 1.5, 7, 64, random_state=42).weights_digest() == digest


def test_a_model_whose_features_regenerate_differently_is_refused(client, tmp_path):
    import json

    from dkernel import DSGRegressor, load_model, save_model
    from dkernel.io import read_npz, write_npz_atomic

    X = np.random.default_rng(0).standard_normal((300, 3)).astype(np.float32)
    m = DSGRegressor(bandwidth=1.0, n_features=64, n_epochs=1, client=client).fit(X, X[:, 0])
    save_model(m, tmp_path / "m.npz")
    assert load_model(tmp_path / "m.npz").features_ == m.features_
    arrays, meta = read_npz(tmp_path / "m.npz")
    meta = json.loads(json.dumps(meta))
    meta["features"]["weights_sha256"] = "0" * 64  # what another sampler would give
    stamp = ("format", "format_version", "versions")
    write_npz_atomic(tmp_path / "bad.npz", arrays,
                     {k: v for k, v in meta.items() if k not in stamp})
    with pytest.raises(ValueError,
                       match="regenerated differently by NumPy .* load it with the NumPy"):
        load_model(tmp_path / "bad.npz")


def test_the_step_eigenvalue_is_the_features_own_where_a_narrow_kernel_makes_it_larger():
    # at a tenth of the median heuristic the 512 features' Gram is the kernel's
    # near-identity plus their noise: its lambda_1 is several times the exact
    # kernel's, and a step from the exact one diverged (DSGDensityRatio, KernelPCA)
    from dkernel.features import step_eigenvalue
    from dkernel.kernels import median_heuristic, top_eigenvalue

    S = np.random.default_rng(0).normal(size=(600, 4))
    median = median_heuristic(S, "gaussian")
    for scale, low, high in ((0.1, 1.5, 10.0), (1.0, 0.9, 1.1)):
        fm = FeatureMap("gaussian", scale * median, 4, 256, random_state=1)
        exact = top_eigenvalue(S, "gaussian", scale * median)
        ratio = fm.top_eigenvalue(S, 2) / exact
        assert low < ratio < high, (scale, ratio)
        assert step_eigenvalue(fm, 2, S) == max(exact, fm.top_eigenvalue(S, 2))
    # centred: the operator kernel PCA diagonalises, on centred features
    fm = FeatureMap("gaussian", median, 4, 256, random_state=1)
    Z = fm.transform(S, 8).astype(np.float64)
    Z -= Z.mean(axis=0)
    expected = np.linalg.eigvalsh(Z @ Z.T / len(S))[-1]
    assert fm.top_eigenvalue(S, 8, center=True) == pytest.approx(expected, rel=1e-5)


def test_the_median_heuristic_does_not_depend_on_where_the_data_sits():
    # |x|^2 + |z|^2 - 2 x.z cancelled in float64 far from the origin: unit-spread
    # rows 1e8 away gave 2.0 where the same rows at the origin give 1.5
    from dkernel.kernels import median_heuristic

    S = np.random.default_rng(0).normal(size=(300, 3))
    for kernel in ("gaussian", "laplacian"):
        assert median_heuristic(S + 1e8, kernel) == pytest.approx(
            median_heuristic(S, kernel), rel=1e-6)


def test_random_state_reaches_the_feature_seeds(client):
    # random_state reaches the features' seeds (fitting with seed 0 always
    # passed every other test)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = np.sin(X[:, 0])
    a, b = (DSGRegressor(n_features=64, n_epochs=1, random_state=s, client=client).fit(X, y)
            for s in (1, 2))
    assert (a.features_.random_state, b.features_.random_state) == (1, 2)
    assert a.features_.weights_digest() != b.features_.weights_digest()


def test_the_pools_error_against_the_kernel_falls_with_the_pool_and_grows_as_it_narrows():
    # the fit's check of its random features (FitContext.feature_map): at a quarter
    # of the median heuristic every random-feature model of the quality matrix
    # missed the exact kernel's, and the pool's Gram measured several times the
    # error it does at the median
    from dkernel.features import pool_error
    from dkernel.kernels import median_heuristic

    S = np.random.default_rng(1).normal(size=(300, 5))
    median = median_heuristic(S, "gaussian")
    err = {(D, r): pool_error(FeatureMap("gaussian", r * median, 5, 256, 0), D // 256, S, 0)
           for D in (1024, 4096, 16384) for r in (1.0, 0.25)}
    assert err[4096, 1.0] < 0.05 < 0.13 < err[4096, 0.25], err
    assert err[4096, 0.25] > 4 * err[4096, 1.0], err
    # a Monte-Carlo error: a pool 4x larger halves it (past 4096 features by that rule)
    assert 1.5 < err[1024, 0.25] / err[4096, 0.25] < 3, err
    assert err[16384, 0.25] == pytest.approx(err[4096, 0.25] / 2)
    assert pool_error(FeatureMap("gaussian", median, 5, 256, 0), 4, S[:20], 0) is None
