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
- :class:`KernelPCA`, :class:`KernelSVD`, :class:`KernelCCA` -- doubly
  stochastic kernel PCA / SVD / CCA (Xie, Liang & Song 2015)
- :class:`StreamingKernelPCA` -- streaming kernel PCA by Oja's rule (Deng et al.)

Model files: :func:`save_model`, :func:`load_model`.  Data: :func:`open_dataset`.
"""

from __future__ import annotations

import importlib
from typing import Any

from dkernel._version import __version__

# Imported on first use (PEP 562): ``dkernel fit`` checks its parameters
# before Dask and scikit-learn are loaded, and ``import dkernel`` stays cheap.
_WHERE = {"open_dataset": "dkernel.data", "load_model": "dkernel.io", "save_model": "dkernel.io",
          "DivergenceError": "dkernel.engine", "FitQualityWarning": "dkernel.engine",
          **dict.fromkeys(["KernelCCA", "KernelPCA", "KernelSVD", "StreamingKernelPCA",
                           "DSGClassifier", "DSGDensityRatio", "DSGOneClassSVM", "DSGRegressor",
                           "EigenProClassifier", "EigenProRegressor", "SphereRegressor"],
                          "dkernel.estimators")}

__all__ = ["__version__", *_WHERE]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:  # a subpackage, as ``dkernel.estimators`` after ``import dkernel``
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
