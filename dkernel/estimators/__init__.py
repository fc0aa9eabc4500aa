"""scikit-learn-shaped estimators wrapping the solvers."""

from dkernel.estimators.components import KernelCCA, KernelPCA, KernelSVD
from dkernel.estimators.dsg import DSGClassifier, DSGRegressor
from dkernel.estimators.density_ratio import DSGDensityRatio
from dkernel.estimators.eigenpro import EigenProClassifier, EigenProRegressor
from dkernel.estimators.novelty import DSGOneClassSVM
from dkernel.estimators.sphere import SphereRegressor
from dkernel.estimators.streaming import StreamingKernelPCA

__all__ = [
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
