"""StreamingKernelPCA: Oja's rule on seeded random features (Deng, Song, Wang, Zhang)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin, TransformerMixin

from dkernel.estimators.base import (
    BaseEstimator,
    apply_rows,
    refuse_eager_output,
    validate_predict_input,
)
from dkernel.estimators.components.base import check_rows
from dkernel.estimators.fitting import FitContext, feature_error_doc, one_fit_at_a_time
from dkernel.estimators.history import history_meta, set_history
from dkernel.estimators.order import warn_if_ordered
from dkernel.estimators.spec import documented, params_of
from dkernel.features import FeatureMap
from dkernel.linalg import column_signs
from dkernel.solvers import oja

#: n_passes="auto" streams at least this many rows, in at most _MAX_PASSES passes:
#: one pass over 300 rows missed exact kernel PCA by sin^2 0.56 and one over 2000
#: rows of 784 inputs by 0.19; 9 passes over the 2000 rows met it to 0.016, 8 and
#: 16 over the 300 rows to 0.012 and 0.031 (benchmarks/quality.py).  The cap keeps
#: a fit on a few dozen rows (scikit-learn's checks) to a few dozen tasks.
_STREAM_ROWS = 16384
_MAX_PASSES = 16


@documented
class StreamingKernelPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    __doc__ = f"""Streaming kernel PCA: Oja's rule on seeded random features (Deng, Song,
    Wang, Zhang).

    One pass over the chunks in order with O(D k) state; the blocked exact
    update of docs/design.md §2.5 (per-chunk Gram matrices built in parallel on the
    workers, only V threaded through the chunks); top-k by Oja's subspace
    rule with re-orthonormalisation.  Centred by default (a running mean,
    folded into the exact blocked update): the components are the top
    eigenvectors of the feature covariance, as in scikit-learn's KernelPCA;
    ``center=False`` gives the paper's uncentred E[z z^T].

    Attributes
    ----------
    components_ : ndarray (n_features_, n_components)
        Orthonormal directions in feature space, ordered.
    explained_variance_ : ndarray (n_components,)
        Rayleigh quotients over the second half of the stream.
{feature_error_doc()}    history_ : list of dict
        The one pass: ``epoch``, ``rows``, ``seconds`` (including the
        bandwidth sample) and ``variance``, the sum of ``explained_variance_``.
    mean_ : ndarray (n_features_,)
        Mean feature vector of the stream (zeros when ``center=False``);
        ``transform`` subtracts it.
    eta_ : float
        The step used (0 where solved exactly).
    n_passes_ : int
        Passes over the rows, as ``n_passes`` resolved; 0 where the rows were
        too few for Oja's rule (``n_passes``) and the components are the exact
        top eigenvectors of their features' covariance.
    """

    def __init__(self, n_components: int = 1, *, kernel: str = "gaussian",
                 bandwidth: float | str = "auto", n_features: int = 2048,
                 step_size: float | str = "auto", center: bool = True, block_rows: int = 512,
                 n_passes: int | str = "auto", random_state: int = 0, client: Any = None,
                 verbose: bool = False, checkpoint: str | None = None, checkpoint_every: int = 0,
                 resume: bool = False) -> None:
        self._store_params(locals())

    def _check_params(self) -> None:
        super()._check_params()
        if self.n_components > self.n_features:
            raise ValueError(
                f"n_components={self.n_components} exceeds n_features={self.n_features}")

    @one_fit_at_a_time
    def fit(self, X: Any, y: Any = None) -> StreamingKernelPCA:
        """One pass over X (array or store path; more on few rows, ``n_passes``);
        y is ignored."""
        fit = FitContext(self, X, target="none")
        check_rows(int(self.n_components), fit.data.n_rows, bool(self.center))
        with fit:
            data, center = fit.data, bool(self.center)
            t0 = time.perf_counter()
            sample = fit.sample()
            features, n_blocks = fit.feature_map(fit.bandwidth(sample), block_size=256)
            B = features.block_size
            auto_passes = min(_MAX_PASSES, max(1, math.ceil(_STREAM_ROWS / data.n_rows)))
            if (self.n_passes == self.step_size == "auto" and len(sample) == data.n_rows
                    and self.n_components < data.n_rows < _STREAM_ROWS / _MAX_PASSES
                    and not self._streaming_given()):
                # 16 passes would stream too few rows to converge (10 rows: the
                # second eigenvalue 40x too small); every row is in the sample
                self._fit_exact(features, n_blocks, sample, center, time.perf_counter() - t0)
                return self
            warn_if_ordered(data, fit.client, "X", "StreamingKernelPCA reads the rows in "
                            "order and Oja's rule follows them", sample=sample, seed=fit.seed)
            self.n_passes_ = passes = (int(self.n_passes) if self.n_passes != "auto"
                                       else auto_passes)
            if self.step_size == "auto":
                Zs = oja.features_of({"features": features, "n_blocks": n_blocks}, sample)
                lam, max_sq = oja.sample_spectrum(Zs, int(self.n_components), center)
                eta = oja.theorem_step(passes * data.n_rows, n_blocks * B, lam, max_sq)
            else:
                eta = float(self.step_size)
            payload = {"features": features, "n_blocks": n_blocks, "eta": eta,
                       "block_rows": int(self.block_rows), "n_total": passes * data.n_rows,
                       "center": center}
            state = oja.init_state(n_blocks * B, int(self.n_components),
                                   [self.random_state_, 0x0A1A], center)
            state = fit.engine.scan(data, oja.oja_prepare, oja.oja_fold, state, payload,
                                    n_epochs=passes, fingerprint=oja.fingerprint(payload),
                                    label="oja", pass_start=True,
                                    max_rows=oja.scan_rows(payload))
        V, lam = oja.ordered(state)
        V = V * column_signs(V)  # a sign that does not hang on rounding
        mean = state["S"] / max(int(state["n"]), 1) if center else np.zeros(V.shape[0])
        self._set_fitted(features, n_blocks, V, lam, eta, mean)
        # one stream: its length, and the variance the components capture over
        # the second half of the stream (the Rayleigh quotients above)
        self.history_ = [{"epoch": 1, "rows": passes * int(data.n_rows),
                          "seconds": time.perf_counter() - t0, "variance": float(lam.sum())}]
        return self

    def _streaming_given(self) -> list[str]:
        """Settings only the stream uses, given (the exact solve writes no
        checkpoint and has no blocks: they were accepted and ignored)."""
        default = {p.name: p.default for p in params_of(type(self))}
        return [n for n in ("block_rows", "checkpoint", "checkpoint_every", "resume")
                if getattr(self, n) != default[n]]

    def _fit_exact(self, features: FeatureMap, n_blocks: int, rows: np.ndarray, center: bool,
                   seconds: float) -> None:
        """The point Oja's rule converges to, from every row: the top eigenvectors
        of the (centred) feature covariance Z^T Z / n, through the n x n Gram."""
        Z = oja.features_of({"features": features, "n_blocks": n_blocks}, rows)
        Z = np.asarray(Z, dtype=np.float64)
        mean = Z.mean(axis=0) if center else np.zeros(Z.shape[1])
        Z -= mean
        lam, U = np.linalg.eigh(Z @ Z.T / len(Z))
        k = int(self.n_components)
        lam, U = np.maximum(lam[::-1][:k], 0.0), U[:, ::-1][:, :k]
        # Z^T u / |Z^T u|, orthonormal where lambda > 0; QR keeps a basis where a
        # lambda is ~0 (n_components at the centred rank: u is noise there)
        V, R = np.linalg.qr(Z.T @ U)
        V *= column_signs(V)  # as the streamed fit's
        self.n_passes_ = 0
        self._set_fitted(features, n_blocks, V.astype(np.float64), lam, 0.0, mean)
        self.history_ = [{"epoch": 1, "rows": int(len(Z)), "seconds": seconds,
                          "variance": float(lam.sum())}]

    def _set_fitted(
        self, features: FeatureMap, n_blocks: int, V: np.ndarray, lam: np.ndarray, eta: float,
        mean: np.ndarray,
    ) -> None:
        self._keep_pool(features, V.shape[0])
        self.n_blocks_ = int(n_blocks)
        self.components_, self.explained_variance_, self.mean_ = V, lam, mean
        self.eta_ = float(eta)

    def feature_map(self, X: Any) -> Any:
        """z(X), the fixed random feature map the components live in (NumPy input)."""
        return oja.features_of(
            {"features": self.features_, "n_blocks": self.n_blocks_}, np.asarray(X)
        )

    def transform(self, X: Any) -> Any:
        """Projections (z(X) - mean_) V, shape (n, n_components); lazy for dask input."""
        self._check_fitted("components_")
        X = validate_predict_input(self, X)
        refuse_eager_output(self, X)
        payload = {"features": self.features_, "n_blocks": self.n_blocks_}
        dt = self.features_.dtype
        V = self.components_.astype(dt)
        shift = (self.mean_ @ self.components_).astype(dt)  # (z - m) V = z V - m V
        return apply_rows(
            lambda Xb: _oja_block(Xb, payload, V, shift), X, V.shape[1], np.dtype(dt)
        )

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float32"]  # float32 scores (docs/design.md §4)
        return tags

    @property
    def _n_features_out(self) -> int:
        return self.components_.shape[1]

    def _get_model_state(self) -> tuple[dict, dict]:
        self._check_fitted("components_")
        return (
            {"components": self.components_, "explained_variance": self.explained_variance_,
             "mean": self.mean_},
            {
                "features": self.features_.to_dict(),
                "n_blocks": self.n_blocks_,
                "eta_": self.eta_,
                "n_passes_": getattr(self, "n_passes_", 1),
                **history_meta(self),
            },
        )

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        V = arrays["components"]
        self._set_fitted(
            FeatureMap.from_dict(meta["features"]),
            meta["n_blocks"],
            V,
            arrays["explained_variance"],
            meta.get("eta_", meta.get("step_size_")),  # files before eta_ named it step_size_
            arrays["mean"] if "mean" in arrays else np.zeros(V.shape[0]),
        )
        self.n_passes_ = int(meta.get("n_passes_", 1))  # files before n_passes made one
        set_history(self, meta)


def _oja_block(Xb: Any, payload: dict, V: np.ndarray, shift: np.ndarray) -> Any:
    return oja.features_of(payload, Xb) @ V - shift
