"""Zonal kernels on spheres: Gegenbauer recurrence, dimension counts, feature forms."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import scipy.special as sp

from dkernel.kernels.zonal import (
    ZonalFeatures,
    dim_harmonics,
    dim_polynomials,
    gegenbauer,
    gegenbauer_normalized,
    zonal_kernel,
    zonal_weights,
)
from dkernel.solvers.sphere import truncation_levels

T = np.linspace(-1.0, 1.0, 401)


def _on_sphere(n, d, seed):
    X = np.random.default_rng(seed).standard_normal((n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


@pytest.mark.parametrize("lam", [0.5, 1.0, 1.5, 2.5, 5.0, 10.0])
def test_gegenbauer_matches_scipy_to_1e12_up_to_degree_200(lam):
    # Error is measured relative to sup_[-1,1] |C_k| = C_k(1): pointwise relative
    # error is meaningless at the zeros.  Both sides are recurrences with
    # error ~k ulps, so 1e-12 leaves a margin of ~20 at k = 200.
    d = round(2 * lam + 2)
    P = gegenbauer_normalized(200, d, T)
    for k in range(201):
        ref = sp.eval_gegenbauer(k, lam, T)
        c1 = sp.eval_gegenbauer(k, lam, 1.0)
        assert np.max(np.abs(P[k] * c1 - ref)) <= 1e-12 * c1, k
        assert np.max(np.abs(gegenbauer(k, lam, T) - ref)) <= 1e-12 * c1, k


def test_d3_is_legendre_and_d2_is_chebyshev_to_1e12():
    P3 = gegenbauer_normalized(200, 3, T)
    P2 = gegenbauer_normalized(200, 2, T)
    for k in range(201):
        assert np.max(np.abs(P3[k] - sp.eval_legendre(k, T))) <= 1e-12
        assert np.max(np.abs(P2[k] - np.cos(k * np.arccos(T)))) <= 1e-12


def _explicit_sum(k, lam, t):
    # the textbook series C_k(t) = sum_j (-1)^j Gamma(k-j+lam)/(Gamma(lam) j! (k-2j)!) (2t)^(k-2j)
    return sum((-1) ** j * math.exp(math.lgamma(k - j + lam) - math.lgamma(lam) - math.lgamma(j + 1)
                                    - math.lgamma(k - 2 * j + 1)) * (2 * t) ** (k - 2 * j)
               for j in range(k // 2 + 1))


def test_recurrence_stays_accurate_where_explicit_sum_fails():
    mpmath.mp.dps = 60
    lam, ts = 1.5, [-0.93, -0.41, 0.05, 0.37, 0.88]
    for k in (60, 100, 200):
        c1 = float(mpmath.gegenbauer(k, lam, 1))
        exact = np.array([float(mpmath.gegenbauer(k, lam, t)) for t in ts])
        explicit = np.array([_explicit_sum(k, lam, t) for t in ts])
        ours = gegenbauer(k, lam, np.array(ts))
        assert np.max(np.abs(explicit - exact)) > 1e-3 * c1  # the sum has lost every digit
        assert np.max(np.abs(ours - exact)) <= 1e-13 * c1


def test_normalized_polynomial_is_finite_and_accurate_where_c_k_of_1_overflows():
    # d = 785 (MNIST through the stereographic map): C_200^391.5(1) ~ 1e240+ overflows
    # the unnormalised products; P_k stays in [-1, 1] and matches 60-digit mpmath.
    mpmath.mp.dps = 60
    lam, d, ts = 391.5, 785, [-0.9, -0.2, 0.3, 0.95, 0.999]
    P = gegenbauer_normalized(200, d, np.array(ts))
    assert np.all(np.isfinite(P)) and np.all(np.abs(P) <= 1.0)
    for k in (50, 200):
        exact = [float(mpmath.gegenbauer(k, lam, t) / mpmath.gegenbauer(k, lam, 1)) for t in ts]
        assert np.max(np.abs(P[k] - exact)) <= 1e-14


def test_dimension_counts_are_exact_integers():
    for L in range(30):
        assert dim_polynomials(L, 3) == (L + 1) ** 2
        assert dim_polynomials(L, 2) == 2 * L + 1
        for d in (2, 3, 4, 7, 785):
            assert dim_polynomials(L, d) == sum(dim_harmonics(k, d) for k in range(L + 1))
    # dim H_k on S^{d-1} = C(k+d-1, d-1) - C(k+d-3, d-1), exactly, far beyond float precision
    big = dim_harmonics(60, 785)
    assert isinstance(big, int) and big == math.comb(844, 784) - math.comb(842, 784)


def test_weights_are_formed_in_log_space_and_stay_finite():
    w = zonal_weights(60, 785, 1.0)
    assert np.all(np.isfinite(w)) and np.all(w > 0)
    # mu_k dim H_k = dim H_k / dim Pi_k^2 in closed form for d = 3, s = 1
    k = np.arange(40)
    np.testing.assert_allclose(zonal_weights(39, 3, 1.0), (2 * k + 1) / (k + 1.0) ** 4, rtol=1e-14)


@pytest.mark.parametrize("d,kind,L", [(2, "harmonic", 40), (3, "harmonic", 40), (2, "monomial", 8),
                                      (3, "monomial", 10), (5, "monomial", 6)])
def test_feature_forms_reproduce_every_truncated_kernel(d, kind, L):
    X, Z = _on_sphere(60, d, 0), _on_sphere(50, d, 1)
    f = ZonalFeatures(d, L, 1.0, kind)
    U, V, W = f.transform(X), f.transform(Z), f.level_weights()
    assert f.n_features == ZonalFeatures.n_features_for(d, L, kind)
    for level in range(L + 1):
        # |K| <= K(x,x) ~ 1.3; a few ulps per term of the feature sums
        np.testing.assert_allclose((U * W[level]) @ V.T, zonal_kernel(X, Z, s=1.0, degree=level),
                                   rtol=0, atol=1e-12)


def test_truncation_level_is_smallest_with_dim_at_least_n_theta_minus_one():
    n = np.arange(1, 200001)
    for d, theta in ((3, 1 / 3), (2, 0.5), (6, 0.4)):
        L = truncation_levels(n, d, theta)
        assert L[0] == 0 and np.all(np.diff(L) >= 0) and np.all(np.diff(L) <= 1)
        dims = np.array([dim_polynomials(int(v), d) for v in range(L.max() + 1)], dtype=float)
        target = n ** theta - 1
        assert np.all(dims[L] >= target)
        assert np.all((L == 0) | (dims[np.maximum(L - 1, 0)] < target))
    assert truncation_levels([10**5], 3, 1 / 3)[0] == 6  # (L+1)^2 >= 10^(5/3) - 1 = 45.4
    assert truncation_levels([10**5], 3, 1 / 3, max_degree=4)[0] == 4


def test_points_off_the_unit_sphere_are_refused_not_extended_three_ways():
    # at |x| = 2 the kernel clipped x.z (k(x, x) = 1.3), the harmonic features
    # gave 47 and the monomial ones 23, without a word
    from dkernel.kernels.zonal import ZonalFeatures, zonal_kernel

    X = np.random.default_rng(0).normal(size=(5, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    zonal_kernel(X, X, s=1.0, degree=3)
    for kind in ("harmonic", "monomial"):
        ZonalFeatures(3, 3, 1.0, kind).transform(X)
    with pytest.raises(ValueError, match=r"rows of X must lie on the unit sphere.*2 to 2"):
        zonal_kernel(2 * X, X, s=1.0, degree=3)
    for kind in ("harmonic", "monomial"):
        with pytest.raises(ValueError, match="unit sphere"):
            ZonalFeatures(3, 3, 1.0, kind).transform(2 * X)
