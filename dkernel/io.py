"""Model files at the top of the package: :func:`save_model` and :func:`load_model`.

A model file is a dkernel ``.npz`` (:mod:`dkernel.files`: arrays plus JSON
metadata, never pickle, written atomically, local paths or fsspec URLs) that
names the estimator class, its hyper-parameters, its learned state and the
versions that wrote it.  Loading finds the class by that name in the registry
the estimator classes fill as :mod:`dkernel.estimators` defines them
(:mod:`dkernel.estimators.model_file`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import dkernel.estimators  # noqa: F401  (defining the classes registers their names)
from dkernel.estimators.model_file import estimator_class, write_model

# the file primitives, importable from here as before they moved to dkernel.files
from dkernel.files import expands_user, file_exists, is_url, read_npz, remove_file, write_npz_atomic

__all__ = ["load_model", "save_model", "file_exists", "is_url", "read_npz", "remove_file",
           "write_npz_atomic"]


#: Parameters a model file records but :func:`load_model` leaves at their
#: defaults: where the writing machine kept its checkpoints.
_NOT_RESTORED = ("checkpoint", "checkpoint_every", "resume")


@expands_user("path")
def save_model(estimator: Any, path: str | os.PathLike) -> None:
    """Save a fitted estimator to ``path`` (a ``.npz`` file), atomically."""
    write_model(estimator, path)


@expands_user("path")
def load_model(path: str | os.PathLike) -> Any:
    """Load an estimator saved with :func:`save_model`.

    The file's ``checkpoint``, ``checkpoint_every`` and ``resume`` are shown by
    ``dkernel info`` but not restored: they name a path on the machine that
    wrote the file, where a refit of the loaded model would write (or resume
    from) checkpoints.  Set them again to checkpoint a refit.
    """
    arrays, meta = read_npz(path)
    if meta.get("kind") != "model":
        raise ValueError(f"{os.fspath(path)!r} is a {meta.get('kind')}, not a model")
    if not isinstance(meta.get("estimator"), str) or not isinstance(meta.get("params"), dict):
        raise ValueError(f"{os.fspath(path)!r} is a model file without its estimator or "
                         "parameters; write it again with save_model() or dkernel fit")
    cls = estimator_class(meta["estimator"])
    if cls is None:
        wrote = meta.get("versions", {}).get("dkernel", "another version")
        raise ValueError(f"{os.fspath(path)!r} holds an estimator {meta['estimator']!r} that this "
                         f"dkernel does not have; load it with the dkernel that wrote it ({wrote})")
    wrote = meta.get("versions", {}).get("dkernel", "another version")
    unknown = sorted(set(meta["params"]) - set(cls._param_names()))
    if unknown:  # a newer writer's setting: this dkernel cannot tell what it changed
        raise ValueError(f"{os.fspath(path)!r} sets {', '.join(unknown)}, which this dkernel's "
                         f"{cls.__name__} does not have; load it with the dkernel that wrote "
                         f"it ({wrote})")
    params = {k: v for k, v in meta["params"].items() if k not in _NOT_RESTORED}
    try:
        est = cls(**params)
        # the parameters against the class's declarations, as a fit checks them:
        # a hand-edited value loaded and failed (or misbehaved) only at predict
        est._check_params()
        est._set_model_state(arrays, meta)
    except KeyError as exc:  # a damaged or hand-edited file ("dkernel: error: 'coef'")
        raise ValueError(f"{os.fspath(path)!r} is not a complete {cls.__name__} model file: it "
                         f"lacks {exc}; write it again with save_model() or dkernel fit") from None
    except (ValueError, TypeError) as exc:
        # arrays that disagree with the metadata (a short coef predicted one class for
        # every row), or metadata of the wrong types: name the file (the cause chained)
        raise ValueError(f"{os.fspath(path)!r} is not a usable {cls.__name__} model file: "
                         f"{exc}") from exc
    if "feature_names_in" in meta:
        est.feature_names_in_ = np.asarray(meta["feature_names_in"], dtype=object)
    seed = meta["params"].get("random_state")
    if isinstance(seed, int) and not hasattr(est, "random_state_"):
        est.random_state_ = seed  # (the file keeps the seed the fit used as its parameter)
    return est
