"""dkernel: kernel methods at data-center scale on Dask.

Estimators (scikit-learn shaped): :class:`DSGRegressor`, :class:`DSGClassifier`.
Model files: :func:`save_model`, :func:`load_model`.  Data: :func:`open_dataset`.
"""

from dkernel._version import __version__
from dkernel.data import open_dataset
from dkernel.estimators import DSGClassifier, DSGRegressor
from dkernel.io import load_model, save_model

__all__ = ["__version__", "open_dataset", "DSGClassifier", "DSGRegressor", "load_model", "save_model"]
from dkernel.estimators import SphereRegressor  # noqa: E402,F401
__all__ += ["SphereRegressor"]
from dkernel.estimators import EigenProClassifier, EigenProRegressor  # noqa: E402,F401
__all__ += ["EigenProClassifier", "EigenProRegressor"]
