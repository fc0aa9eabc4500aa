"""KernelPCA: kernel PCA by doubly stochastic gradients, power steps or an
exact solve on the pool (Xie, Liang & Song 2015, Alg. 1-2)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin

from dkernel.data.dataset import open_dataset
from dkernel.estimators.base import refuse_eager_output, validate_predict_input
from dkernel.estimators.components.base import _DOC_POWER_ATTRIBUTES, _ComponentsBase, _scores
from dkernel.estimators.fitting import FitContext, feature_error_doc, one_fit_at_a_time
from dkernel.estimators.spec import documented
from dkernel.features import FeatureMap
from dkernel.linalg import column_signs
from dkernel.solvers.components import ComponentProgram, centred_moments, rotate_pca


@documented
class KernelPCA(ClassNamePrefixFeaturesOutMixin, _ComponentsBase):
    _method = "kpca"
    _block_only = _ComponentsBase._block_only + ("ordering",)

    __doc__ = f"""Kernel PCA by doubly stochastic gradients (Xie, Liang & Song 2015, Alg. 1-2).

    Finds the top ``n_components`` eigenfunctions of the (centred) kernel
    covariance operator, ordered by a final k x k rotation (or individually by
    the GHA update, ``ordering="gha"``).

    Attributes
    ----------
    components_ : ndarray (n_features_, n_components)
        Coefficients over the pool of the eigenfunctions u_i(x) = phi(x)^T
        components_[:, i] (centred by ``mean_``).  The functions are what the
        fit pins down: their scores are uncorrelated, with the eigenvalues as
        variances, and they match a dense solve on the data.  The coefficient
        vectors are not RKHS-orthonormal: every step also adds SGD noise along
        pool directions the data barely excite, which changes the functions on
        the data by little but inflates the RKHS norms (D |components_[:, i]|^2
        was 7.4 and 3.3, not 1, for two components of 2048 features).
    explained_variance_ : ndarray (n_components,)
        Variance of each score, the eigenvalue estimates of the covariance operator.
{_DOC_POWER_ATTRIBUTES}    mean_ : ndarray (n_components,)
        Mean of the raw scores (subtracted by ``transform``; zero if not centred).
{feature_error_doc()}    history_ : list of dict
        Per epoch: ``epoch``, ``steps``, ``rows``, ``seconds`` and ``variance``,
        the variance the k scores capture on the epoch's mini-batches.

    Examples
    --------
    >>> import numpy as np
    >>> from distributed import Client
    >>> from dkernel import KernelPCA
    >>> X = np.random.default_rng(0).standard_normal((2000, 2))
    >>> with Client(n_workers=1, processes=False, dashboard_address=None) as client:
    ...     Z = KernelPCA(3, bandwidth=1.0, n_features=512, client=client).fit_transform(X)
    >>> Z.shape
    (2000, 3)
    """

    def __init__(self, n_components: int = 8, *, kernel: str = "gaussian",
                 bandwidth: float | str = "auto", n_features: int = 4096, block_size: int = 256,
                 batch_size: int | str = "auto", n_epochs: int = 5, step_size: float | str = "auto",
                 step_decay: float | str = "auto", center: bool = True, ordering: str = "rotate",
                 steps: str = "auto", lanes: int | str = "auto", random_state: int = 0,
                 client: Any = None, verbose: bool = False, checkpoint: str | None = None,
                 checkpoint_every: int = 0, resume: bool = False,
                 feature_cache: str = "auto") -> None:
        self._store_params(locals())

    @one_fit_at_a_time
    def fit(self, X: Any, y: Any = None) -> KernelPCA:
        """Fit on X (array, DataFrame or store path); y is ignored."""
        fit = FitContext(self, X, target="none")
        self._check_rows(fit.data.n_rows)  # before the cluster starts
        with fit:
            self.steps_ = steps = self._resolve_exact(self._resolve_steps(), fit.data.n_rows)
            sample = fit.sample()
            features, n_blocks = fit.feature_map(fit.bandwidth(sample))

            def block_program() -> ComponentProgram:
                self._block_step_size("kpca", [sample], [features], n_blocks)
                return ComponentProgram("kpca", (features,), n_blocks, int(self.n_components),
                                        self.step_size_, self.step_decay_,
                                        gha=self.ordering == "gha", label="kpca",
                                        center=bool(self.center), seed=fit.seed)
            state, total = self._fit_steps(fit, (features,), n_blocks, steps, block_program)
        mean, M = centred_moments(total, bool(self.center))
        E, lam = rotate_pca(M)
        E = E * column_signs(state["coef0"] @ E)  # a sign that does not hang on rounding
        self._set_fitted(features, state["coef0"] @ E, mean @ E, lam)
        return self

    def _set_fitted(
        self, features: FeatureMap, coef: np.ndarray, mean: np.ndarray, lam: np.ndarray
    ) -> None:
        self._keep_pool(features, coef.shape[0])
        self.components_, self.mean_, self.explained_variance_ = coef, mean, lam

    def transform(self, X: Any) -> Any:
        """Scores (n, n_components): projections on the eigenfunctions; lazy for dask input."""
        self._check_fitted("components_")
        X = validate_predict_input(self, X)
        refuse_eager_output(self, X)
        return _scores(self.features_, self.components_, self.mean_, X)

    @one_fit_at_a_time  # (another thread's fit between the fit and the transform)
    def fit_transform(self, X: Any, y: Any = None) -> Any:
        """Fit, then the scores of X (a store path: of its ``X``)."""
        refuse_eager_output(self, X)  # (before the fit, not after it)
        return self.fit(X).transform(X if not isinstance(X, str) else open_dataset(X).X)

    @property
    def _n_features_out(self) -> int:
        return self.components_.shape[1]

    def _get_model_state(self) -> tuple[dict, dict]:
        self._check_fitted("components_")
        return ({"components": self.components_, "mean": self.mean_,
                 "explained_variance": self.explained_variance_},
                {"features": self.features_.to_dict(), **self._saved_steps(),
                 **self._width_meta()})

    def _set_model_state(self, arrays: dict, meta: dict) -> None:
        self._set_fitted(FeatureMap.from_dict(meta["features"]), arrays["components"],
                         arrays["mean"], arrays["explained_variance"])
        self._set_width_meta(meta)
        self._load_steps(meta)
