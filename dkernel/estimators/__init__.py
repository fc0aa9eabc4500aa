"""scikit-learn-shaped estimators wrapping the solvers."""

from dkernel.estimators.components import KernelCCA, KernelPCA, KernelSVD
from dkernel.estimators.dsg import DSGClassifier, DSGRegressor
from dkernel.estimators.eigenpro import EigenProClassifier, EigenProRegressor
from dkernel.estimators.sphere import SphereRegressor
from dkernel.estimators.streaming import StreamingKernelPCA

__all__ = [
    "KernelCCA",
    "KernelPCA",
    "KernelSVD",
    "StreamingKernelPCA",
    "DSGClassifier",
    "DSGRegressor",
    "EigenProClassifier",
    "EigenProRegressor",
    "SphereRegressor",
]
