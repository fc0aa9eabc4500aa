"""Model files: a fitted estimator's state and parameters as a dkernel ``.npz``
(:mod:`dkernel.files`), and the registry that finds its class again.

A file records the class by its name, never by its module, so a file still
loads after a class moves between modules.  Every public estimator class of
dkernel registers its name when it is defined
(``BaseEstimator.__init_subclass__``); :mod:`dkernel.estimators` imports its
classes on first use, so :func:`estimator_class` imports every estimator
module before it looks a name up.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dkernel.engine.checkpoint import writer_versions
from dkernel.files import expands_user, write_npz_atomic

_CLASSES: dict[str, type] = {}


def register(cls: type) -> None:
    """Record a public dkernel estimator class under its name.  Private bases
    and subclasses defined outside dkernel are not model-file classes."""
    name = cls.__name__
    if name.startswith("_") or not cls.__module__.startswith("dkernel."):
        return
    known = _CLASSES.get(name)
    if known is not None and known.__module__ != cls.__module__:  # same module: a reload
        raise TypeError(f"two estimator classes are named {name!r} ({known.__module__} and "
                        f"{cls.__module__}); model files name the class, so rename one")
    _CLASSES[name] = cls


def estimator_class(name: str) -> type | None:
    """The registered estimator class called ``name``, None if there is none."""
    if name not in _CLASSES:
        import dkernel.estimators as estimators

        for public in estimators.__all__:  # defining a class registers it
            getattr(estimators, public)
    return _CLASSES.get(name)


@expands_user("path")
def write_model(estimator: Any, path: str | os.PathLike, *, exclusive: bool = False) -> None:
    """Save a fitted estimator to ``path`` (a ``.npz`` file), atomically;
    ``exclusive``: fail rather than replace a file there (the CLI without
    ``--overwrite``)."""
    arrays, meta = estimator._get_model_state()
    params = estimator.get_params()
    if not isinstance(params.get("random_state", 0), (int, np.integer)):
        # None / RandomState / Generator: the file keeps the integer seed the fit used
        params["random_state"] = getattr(estimator, "random_state_", None)
    if hasattr(estimator, "feature_names_in_"):  # DataFrame columns seen by fit
        meta = {**meta, "feature_names_in": [str(c) for c in estimator.feature_names_in_]}
    write_npz_atomic(path, arrays, {"kind": "model", "estimator": type(estimator).__name__,
                                    "params": _jsonable(params), "versions": writer_versions(),
                                    **meta}, exclusive=exclusive)


def _jsonable(params: dict) -> dict:
    out = {}
    for k, v in params.items():
        if k == "client" or callable(v):
            continue
        if isinstance(v, np.generic):
            v = v.item()
        out[k] = v
    return out


def checked_coef(coef: Any, block_size: int, ndim: int) -> np.ndarray:
    """A model file's pool coefficients (``ndim``: 2 with outputs, 1 a single
    function's), refused where they cannot be the
    model's: cut short (fewer rows than a block: no block at all, every
    prediction the same class), of another shape, or not finite."""
    coef, block_size = np.asarray(coef), int(block_size)
    if coef.ndim != ndim or coef.shape[0] < block_size or coef.shape[0] % block_size:
        raise ValueError(f"its coef has shape {coef.shape}, not (a multiple of its "
                         f"{block_size}-feature blocks{', outputs' if ndim == 2 else ''})")
    if coef.dtype.kind != "f" or not np.isfinite(coef).all():
        raise ValueError("its coef holds values that are not finite numbers")
    return coef
