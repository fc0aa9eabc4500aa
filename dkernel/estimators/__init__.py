"""scikit-learn-shaped estimators wrapping the solvers.

The classes are imported on first use (PEP 562), so that the parameter spec
(:mod:`dkernel.estimators.spec`) and the CLI's checks run without importing
scikit-learn and Dask."""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module that defines it
_WHERE = {
    "KernelCCA": "components", "KernelPCA": "components", "KernelSVD": "components",
    "StreamingKernelPCA": "streaming", "DSGClassifier": "dsg", "DSGDensityRatio": "density_ratio",
    "DSGOneClassSVM": "novelty", "DSGRegressor": "dsg", "EigenProClassifier": "eigenpro",
    "EigenProRegressor": "eigenpro", "SphereRegressor": "sphere",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
