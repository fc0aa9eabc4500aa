"""dkernel: kernel methods at data-center scale on Dask.

Estimators (scikit-learn shaped):

- :class:`DSGRegressor`, :class:`DSGClassifier` -- doubly stochastic functional
  gradients (Dai et al. 2014); ``DSGRegressor(loss="quantile", quantile=...)``
  for quantile regression, ``predict(X, return_std=True)`` for the GP posterior
- :class:`DSGOneClassSVM` (novelty detection) and :class:`DSGDensityRatio`
  (KL density ratio), Dai et al.'s other tasks
- :class:`EigenProRegressor`, :class:`EigenProClassifier` -- preconditioned
  kernel SGD (Ma & Belkin 2017)
- :class:`SphereRegressor` -- truncated kernel SGD on spheres (Bai & Shi)

Model files: :func:`save_model`, :func:`load_model`.  Data: :func:`open_dataset`.
"""

from dkernel._version import __version__
from dkernel.data import open_dataset
from dkernel.estimators import (
    KernelCCA,
    KernelPCA,
    KernelSVD,
    StreamingKernelPCA,
    DSGClassifier,
    DSGDensityRatio,
    DSGOneClassSVM,
    DSGRegressor,
    EigenProClassifier,
    EigenProRegressor,
    SphereRegressor,
)
from dkernel.engine import DivergenceError, FitQualityWarning
from dkernel.io import load_model, save_model

__all__ = [
    "__version__",
    "open_dataset",
    "load_model",
    "save_model",
    "DivergenceError",
    "FitQualityWarning",
    "KernelCCA",
    "KernelPCA",
    "KernelSVD",
    "StreamingKernelPCA",
    "DSGClassifier",
    "DSGDensityRatio",
    "DSGOneClassSVM",
    "DSGRegressor",
    "EigenProClassifier",
    "EigenProRegressor",
    "SphereRegressor",
]
