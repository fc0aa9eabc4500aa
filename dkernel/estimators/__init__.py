"""scikit-learn-shaped estimators wrapping the solvers."""

from dkernel.estimators.dsg import DSGClassifier, DSGRegressor

__all__ = ["DSGClassifier", "DSGRegressor"]
