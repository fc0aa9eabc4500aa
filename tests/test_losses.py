"""Regression losses with parameters (Dai et al. section 4; scikit-learn's names)
against independent definitions, and quantile regression's coverage."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy.special import huber as scipy_huber
from sklearn.metrics import mean_pinball_loss

from dkernel import DSGClassifier, DSGRegressor, load_model
from dkernel.cli import main
from dkernel.data import write_store
from dkernel.losses import get_loss, loss_spec


def _residual_grid(kinks: list[float]) -> np.ndarray:
    """f - y values spread over [-3, 3], kept 1e-3 away from the loss's kinks so
    central differences see one smooth piece."""
    r = np.linspace(-3, 3, 601)
    for k in kinks:
        r = r[np.abs(r - k) > 1e-3]
    return r


def _numeric_derivative(fn, f: np.ndarray, y: np.ndarray, h: float = 1e-6) -> np.ndarray:
    return (fn(f + h, y)[0] - fn(f - h, y)[0]) / (2 * h)


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0])
def test_huber_value_and_derivative_match_its_definition(epsilon):
    fn = get_loss(loss_spec("huber", epsilon=epsilon))
    r = _residual_grid([-epsilon, epsilon])
    y = np.linspace(-1, 1, r.size)
    f = y + r
    value, dl = fn(f, y)
    # scipy.special.huber(delta, r) = r^2/2 inside, delta (|r| - delta/2) beyond
    np.testing.assert_allclose(value, scipy_huber(epsilon, r), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dl, _numeric_derivative(fn, f, y), rtol=1e-6, atol=1e-8)
    # the threshold is what the parameter says: linear growth of slope epsilon beyond it
    assert np.allclose(np.abs(dl[np.abs(r) > epsilon]), epsilon)


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.7])
def test_epsilon_insensitive_value_and_derivative_match_its_definition(epsilon):
    fn = get_loss(loss_spec("epsilon_insensitive", epsilon=epsilon))
    r = _residual_grid([-epsilon, epsilon, 0.0])
    y = np.cos(np.arange(r.size))
    f = y + r
    value, dl = fn(f, y)
    np.testing.assert_allclose(value, np.maximum(0, np.abs(r) - epsilon), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dl, _numeric_derivative(fn, f, y), rtol=1e-6, atol=1e-8)
    assert np.all(dl[np.abs(r) < epsilon] == 0)


@pytest.mark.parametrize("tau", [0.1, 0.5, 0.9])
def test_quantile_value_and_derivative_match_the_pinball_loss(tau):
    fn = get_loss(loss_spec("quantile", quantile=tau))
    r = _residual_grid([0.0])
    y = np.sin(np.arange(r.size))
    f = y + r
    value, dl = fn(f, y)
    for i in range(0, r.size, 50):  # scikit-learn's pinball loss, one point at a time
        assert value[i] == pytest.approx(mean_pinball_loss([y[i]], [f[i]], alpha=tau), abs=1e-12)
    np.testing.assert_allclose(dl, _numeric_derivative(fn, f, y), rtol=1e-6, atol=1e-8)
    # Dai et al. section 4: l' = 1 - tau above the target, -tau below
    np.testing.assert_allclose(dl, np.where(r > 0, 1 - tau, -tau))


def test_loss_functions_keep_float32():
    f = np.linspace(-2, 2, 9, dtype=np.float32)[:, None]
    y = np.zeros_like(f)
    for name in ("huber", "epsilon_insensitive", "quantile"):
        value, dl = get_loss(loss_spec(name, epsilon=0.3, quantile=0.8))(f, y)
        assert value.dtype == np.float32 and dl.dtype == np.float32, name


def test_loss_spec_travels_by_pickle_and_rejects_bad_parameters():
    spec = loss_spec("quantile", quantile=0.9, epsilon=3.0)  # epsilon ignored, as in sklearn
    assert spec == {"name": "quantile", "quantile": 0.9}
    back = pickle.loads(pickle.dumps(get_loss(spec)))
    assert back(np.array([0.0]), np.array([1.0]))[1][0] == pytest.approx(-0.9)
    assert loss_spec("squared", epsilon=0.5) == "squared"
    with pytest.raises(ValueError, match="quantile must be strictly between 0 and 1"):
        loss_spec("quantile", quantile=1.0)
    with pytest.raises(ValueError, match="epsilon must be >= 0"):
        loss_spec("huber", epsilon=-0.1)
    with pytest.raises(ValueError, match="takes no parameter 'quantile'"):
        get_loss({"name": "huber", "quantile": 0.5})
    with pytest.raises(ValueError, match="quantile must be strictly between"):
        DSGRegressor(loss="quantile", quantile=0).fit(np.zeros((4, 1)), np.zeros(4))


def _heteroscedastic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """y = sin(3x) + s(x) e with noise scale s(x) = 0.1 + 0.4 (x + 1) / 2 rising 5-fold."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 1))
    s = 0.1 + 0.2 * (x[:, 0] + 1)
    y = np.sin(3 * x[:, 0]) + s * rng.standard_normal(n)
    return x.astype(np.float32), y.astype(np.float32), s


@pytest.mark.parametrize("settings, message", [
    ({"quantile": 0.9}, "quantile=0.9 applies to loss='quantile', and the loss is 'squared'"),
    ({"loss": "quantile", "epsilon": 0.2}, "epsilon=0.2 applies to loss='huber' or"),
])
def test_a_loss_parameter_the_loss_would_ignore_is_refused(settings, message):
    # quantile=0.9 without loss="quantile" fitted the mean, bit for bit as the defaults
    X = np.random.default_rng(0).standard_normal((50, 3))
    with pytest.raises(ValueError, match=message):
        DSGRegressor(n_features=64, **settings).fit(X, X[:, 0])


def test_quantile_regression_at_0_9_covers_0_9_of_held_out_targets(client):
    X, y, _ = _heteroscedastic(6000, 0)
    Xt, yt, st = _heteroscedastic(20000, 1)
    # step_decay 0.1 (gamma_t ~ theta / t, Dai et al. Thm. 4): the pinball subgradient never
    # vanishes, so a slowly decaying step leaves last-iterate noise of order gamma
    # (measured: coverage of the median 0.58 at the default decay 1e-3, 0.51 at 0.1)
    kw = dict(loss="quantile", bandwidth=0.3, n_features=512, alpha=1e-5, n_epochs=8,
              batch_size=256, step_decay=0.1, client=client)
    q90 = DSGRegressor(quantile=0.9, **kw).fit(X, y)
    below = yt <= q90.predict(Xt)
    # the bar: 0.9 +- 0.03.  20k held-out points put the sampling error of the
    # coverage at sqrt(0.09 / 20000) = 0.002, so the rest of the band is the fit's.
    assert abs(below.mean() - 0.9) <= 0.03, below.mean()
    # conditional, not only marginal: the quantile follows the noise scale, so both the
    # quiet half (s < 0.3) and the noisy half hold ~0.9; a constant shift of the mean
    # over-covers the first and under-covers the second (0.96 / 0.84 for this data;
    # measured for the fit: 0.90 / 0.90)
    quiet = st < 0.3
    assert abs(below[quiet].mean() - 0.9) <= 0.05 and abs(below[~quiet].mean() - 0.9) <= 0.05, (
        below[quiet].mean(), below[~quiet].mean())
    q50 = DSGRegressor(quantile=0.5, **kw).fit(X, y)
    assert abs((yt <= q50.predict(Xt)).mean() - 0.5) <= 0.03


def test_bounded_gradient_losses_fit_targets_in_any_units(client):
    # a pinball step moves f by at most the step, whatever y's units: on y x 1e3
    # every quantile level fitted the mean (0.55 of y below 0.05, 0.5 and 0.95)
    rng = np.random.default_rng(9)
    X = rng.normal(size=(2000, 1))
    y = 1e3 * (X[:, 0] + rng.standard_exponential(2000))
    below = {}
    for q in (0.05, 0.95):
        m = DSGRegressor(loss="quantile", quantile=q, n_features=512, client=client).fit(X, y)
        below[q] = float(np.mean(y < m.predict(X)))
    assert below[0.05] < 0.3 and below[0.95] > 0.7, below  # measured 0.155 / 0.803 (held out)
    m = DSGRegressor(loss="epsilon_insensitive", n_features=512, client=client).fit(X, y)
    assert m.score(X, y) > 0.3  # 0.49 on y itself
    # each output takes the step of its own spread: the RMS of the spreads, one
    # step for all, took the unit-scale column of this y to R^2 -400
    Y = np.column_stack([y, np.sin(3 * X[:, 0])])
    m = DSGRegressor(loss="huber", n_features=512, client=client).fit(X, Y)
    r2 = 1 - np.mean((m.predict(X)[:, 1] - Y[:, 1]) ** 2) / np.var(Y[:, 1])
    assert r2 > 0.3, r2


def _two_scales(n: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """X and the outputs [f, 1e3 f]: one signal in two units."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(n, 3))
    f = 2 * X[:, 0] + np.sin(X[:, 1]) + 0.3 * rng.normal(size=n)
    return X, np.column_stack([f, 1e3 * f])


@pytest.mark.parametrize("settings", [
    {"loss": "quantile", "quantile": 0.9},
    {"loss": "huber", "preconditioner": None, "average": True},  # Dai's Alg. 1: a scale an output
    {"loss": "epsilon_insensitive", "local_steps": 2},  # rounds of local steps
])
def test_each_output_of_a_bounded_gradient_loss_fits_as_it_would_alone(client, tmp_path,
                                                                        settings):
    # The automatic step follows y's spread; one step for all outputs, the smallest
    # column's, left [f, 1e3 f]'s second column at training R^2 0.001 under the
    # quantile loss (0.315 alone) with a FitQualityWarning.  Each output now takes
    # its own step, so it takes the steps it would take alone: the same model up
    # to float32 rounding (measured: 7e-6 of the column's spread at most).
    X, Y = _two_scales()
    kw = dict(n_features=256, n_epochs=2, client=client, **settings)
    both = DSGRegressor(**kw).fit(X, Y)
    P = both.predict(X)
    steps = []
    for k in range(2):
        alone = DSGRegressor(**kw).fit(X, Y[:, k])
        np.testing.assert_allclose(P[:, k], alone.predict(X), rtol=0, atol=1e-4 * Y[:, k].std())
        steps.append(alone.step_size_)
    assert both.step_size_ == pytest.approx(steps, rel=1e-12)
    path = str(tmp_path / "both.npz")
    both.save(path)
    loaded = load_model(path)
    assert loaded.step_size_ == both.step_size_
    np.testing.assert_array_equal(loaded.predict(X), P)


def test_outputs_with_their_own_steps_resume_to_the_uninterrupted_model(client, resume_mid_fit):
    # Alg. 1's scale s is one per output once the steps are (a (2,) array in the checkpoint)
    X, Y = _two_scales(600)
    kw = dict(loss="quantile", preconditioner=None, average=True, n_features=128,
              batch_size=100, n_epochs=1, client=client)
    full, resumed, step = resume_mid_fit(lambda **c: DSGRegressor(**kw, **c), X, Y)
    assert 0 < step < sum(h["steps"] for h in full.history_)
    np.testing.assert_allclose(resumed.coef_, full.coef_, rtol=1e-9, atol=1e-12)


def test_a_bounded_gradient_fit_that_stays_at_its_start_is_told_what_moves_it(client):
    # The advice was the divergence's, "set a smaller step_size", which only slows
    # a fit whose steps move f too little for y's units.  Measured (quantile, 2
    # epochs): y = 1e5 f ends at training R^2 0.006 with step_size * alpha = 0.99,
    # and at 0.605 with alpha = 1e-12.
    from dkernel import FitQualityWarning

    X, Y = _two_scales()
    kw = dict(loss="quantile", n_features=256, n_epochs=2, client=client)
    with pytest.warns(FitQualityWarning, match=r"ridge term wins; set a smaller alpha \(now 1e-06"):
        DSGRegressor(**kw).fit(X, 100 * Y[:, 1])
    with pytest.warns(FitQualityWarning, match=r"or set a larger one .* \(now 1\)"):
        DSGRegressor(step_size=1.0, **kw).fit(X, Y[:, 1])


def test_cli_passes_epsilon_and_quantile_and_saves_them(client, tmp_path, capsys):
    X, y, _ = _heteroscedastic(1000, 2)
    store = write_store(tmp_path / "h.zarr", X, y, chunk_rows=500)
    out = str(tmp_path / "q.npz")
    assert main(["fit", store, "--task", "regression", "--loss", "quantile", "--quantile", "0.8",
                 "--features", "128", "--epochs", "1", "--bandwidth", "0.3", "--out", out,
                 "--quiet", "--workers", "1"]) == 0
    model = load_model(out)
    assert model.quantile == 0.8 and model._loss_spec() == {"name": "quantile", "quantile": 0.8}
    capsys.readouterr()
    assert main(["fit", store, "--epsilon", "0.2", "--out", out + ".2.npz", "--quiet"]) != 0
    assert "--epsilon is a parameter of the regression losses" in capsys.readouterr().err
    assert "epsilon" not in DSGClassifier().get_params()
