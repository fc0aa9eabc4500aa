"""scikit-learn-shaped estimators wrapping the solvers."""

from dkernel.estimators.components import KernelCCA, KernelPCA, KernelSVD, StreamingKernelPCA
from dkernel.estimators.dsg import DSGClassifier, DSGRegressor
from dkernel.estimators.eigenpro import EigenProClassifier, EigenProRegressor
from dkernel.estimators.sphere import SphereRegressor

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
