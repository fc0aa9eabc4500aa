"""scikit-learn-shaped estimators wrapping the solvers."""

from dkernel.estimators.dsg import DSGClassifier, DSGRegressor

__all__ = ["DSGClassifier", "DSGRegressor"]
from dkernel.estimators.sphere import SphereRegressor  # noqa: E402,F401
__all__ += ["SphereRegressor"]
from dkernel.estimators.eigenpro import EigenProClassifier, EigenProRegressor  # noqa: E402,F401
__all__ += ["EigenProClassifier", "EigenProRegressor"]
