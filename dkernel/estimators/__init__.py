"""scikit-learn-shaped estimators wrapping the solvers."""

from dkernel.estimators.dsg import DSGClassifier, DSGRegressor
from dkernel.estimators.eigenpro import EigenProClassifier, EigenProRegressor
from dkernel.estimators.sphere import SphereRegressor

__all__ = [
    "DSGClassifier",
    "DSGRegressor",
    "EigenProClassifier",
    "EigenProRegressor",
    "SphereRegressor",
]
