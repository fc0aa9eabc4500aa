"""KernelCCA: kernel canonical correlation analysis of two views by doubly
stochastic gradients (Xie et al. 2015, Alg. 4), through EigenPro's
preconditioner or as printed."""

from __future__ import annotations

from typing import Any

import numpy as np

from dkernel.engine import Engine
from dkernel.engine.progress import phase
from dkernel.estimators.components.base import _DOC_TWO_VIEW_ERROR, _TwoViewBase
from dkernel.estimators.fitting import FitContext
from dkernel.estimators.sampling import check_finite_rows, gather_rows, sample_index
from dkernel.estimators.spec import documented
from dkernel.features import FeatureMap
from dkernel.solvers.components import pool_gram, regularized_cca
from dkernel.solvers.eigenpro_rf import FeaturePreconditioner, feature_preconditioner

#: Pool features used by KernelCCA's "subsample" start: the dense solve costs
#: O(n D0 m + m^3), m = min(n, D0) for n sampled rows (D0 where D0 / 2 < n < D0:
#: :func:`~dkernel.solvers.subspace.regularized_cca`), ~5 s for 8000 rows and
#: D0 = 2048 on two cores.
_INIT_FEATURES = 2048
#: The seed stream of the start's sampled rows.
_START_DOMAIN = 0x1417
#: Eigenpairs computed for KernelCCA's preconditioner: q stops where the critical
#: batch reaches batch_size (q = 16 at 256 rows, 55 at 1024 on Fashion-MNIST halves).
_PRECONDITIONER_PAIRS = 128


@documented
class KernelCCA(_TwoViewBase):
    __doc__ = f"""Kernel CCA by doubly stochastic gradients (Xie et al. 2015, Alg. 4).

    As in scikit-learn's CCA, ``fit(X, Y)``; ``transform(X, Y)`` returns the
    pair (x_scores, y_scores).  ``canonical_correlations(X, Y)`` measures the
    correlation of each pair on held-out data; ``score`` is their sum.

    Attributes
    ----------
    x_components_, y_components_ : ndarray (n_features_, n_components)
    correlations_ : ndarray (n_components,)
        Regularised canonical correlations on the training data.
{_DOC_TWO_VIEW_ERROR}    history_ : list of dict
        Per epoch: ``epoch``, ``steps``, ``rows``, ``seconds`` and
        ``correlation``, the sum of the canonical correlations of the scores
        on the epoch's mini-batches.
    preconditioners_ : tuple of FeaturePreconditioner or None
        Per view (fit only, not saved): the top q+1 eigenvalues, q eigenvectors
        and q of the preconditioner; None without ``preconditioner``.
    """
    _method = "kcca"
    _values_attr = "correlations_"

    def __init__(self, n_components: int = 4, *, kernel: str = "gaussian",
                 bandwidth: float | str = "auto", kernel_y: str | None = None,
                 bandwidth_y: float | str | None = None, alpha: float = 1e-3,
                 init: str = "subsample", init_rows: int = 8000,
                 preconditioner: str | None = "eigenpro", n_features: int = 4096,
                 block_size: int = 256, batch_size: int = 512, n_epochs: int = 5,
                 step_size: float | str = "auto", step_decay: float | str = "auto",
                 center: bool = True, lanes: int = 4, random_state: int = 0, client: Any = None,
                 verbose: bool = False, checkpoint: str | None = None, checkpoint_every: int = 0,
                 resume: bool = False,
                 feature_cache: str = "auto") -> None:
        self._store_params(locals())

    def _metrics(
        self, M: np.ndarray, A: np.ndarray, Bc: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        k = A.shape[1]
        a = float(self.alpha)
        return M[:k, :k] + a * pool_gram(A), M[k:, k:] + a * pool_gram(Bc)

    def _start(
        self, fit: FitContext, features: tuple, n_blocks: int
    ) -> tuple[tuple[np.ndarray, ...] | None, tuple[FeaturePreconditioner, ...] | None]:
        """The start and the preconditioners, both from one sample of ``init_rows`` rows."""
        if self.init != "subsample" and self.preconditioner is None:
            return None, None
        with phase(f"kcca: start and preconditioners from {self.init_rows} sampled rows "
                   "(on the client)", fit.engine.options.progress):
            return self._start_from_sample(fit, features, n_blocks)

    def _start_from_sample(
        self, fit: FitContext, features: tuple, n_blocks: int
    ) -> tuple[tuple[np.ndarray, ...] | None, tuple[FeaturePreconditioner, ...] | None]:
        # a seeded sample from at most 64 chunks (:func:`sample_index`): a uniform draw of
        # 8000 rows read every chunk of a large store, through dask's fancy indexing
        idx = sample_index(fit.data, self.random_state_, int(self.init_rows), _START_DOMAIN)
        Xs, Ys = gather_rows(fit.data, idx, fit.client, with_y=True)
        Xs, Ys = np.asarray(Xs, dtype=features[0].dtype), np.asarray(Ys, dtype=features[1].dtype)
        for name, S in (("X", Xs), ("y", Ys)):  # (a lazy view's NaN met scipy's Cholesky first)
            check_finite_rows(name, S, idx)
        init = self._initial(Xs, Ys, features, n_blocks) if self.init == "subsample" else None
        pre = None
        if self.preconditioner is not None:
            pre = tuple(self._preconditioner(fit.engine, S, f, n_blocks)
                        for S, f in zip((Xs, Ys), features))
        return init, pre

    def _preconditioner(
        self, engine: Engine, S: np.ndarray, features: FeatureMap, n_blocks: int
    ) -> FeaturePreconditioner:
        """EigenPro-RF's preconditioner (tau = 1) from the top eigenpairs of the
        (centred) pool covariance on the sampled rows; q is the largest with
        critical batch beta / lambda_q + 1 <= batch_size (Ma & Belkin: larger q
        buys nothing beyond the batch)."""
        pre, _, _ = feature_preconditioner(
            engine, S, features, n_blocks, _PRECONDITIONER_PAIRS,
            int(self.batch_size), 1.0, self.random_state_, center=bool(self.center),
            dtype="float64", label=f"kcca preconditioner (view {features.stream})")
        return pre

    def _initial(
        self, Xs: np.ndarray, Ys: np.ndarray, features: tuple, n_blocks: int
    ) -> tuple[np.ndarray, ...] | None:
        """Exact regularised CCA on ``init_rows`` sampled rows and the pool's first
        blocks (up to ``_INIT_FEATURES`` features), as pool coefficients.

        Xie's iteration moves along the i-th eigenfunction of C_XX at a speed
        ~ eta lambda_i (eta <= ~1 / lambda_1), so the canonical functions that
        live in low-variance directions take thousands of steps from a random
        start; a small exact solve puts them close and the stochastic steps
        then refine over all the data and the whole pool.
        """
        fx, fy = features
        B = fx.block_size
        nb0 = max(1, min(n_blocks, _INIT_FEATURES // B))
        if int(self.n_components) > nb0 * B:
            return None
        Fx = fx.transform(Xs, nb0)
        Fy = fy.transform(Ys, nb0)
        k = int(self.n_components)
        _, _, Wx, Wy = regularized_cca(Fx, Fy, float(self.alpha) or 1e-6, k)
        # z = phi / sqrt(D0) on the first nb0 blocks: scores z W = phi (W / sqrt(D0))
        scale = 1.0 / np.sqrt(nb0 * B)
        return Wx * scale, Wy * scale
