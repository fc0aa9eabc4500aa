"""Model and checkpoint files: one ``.npz`` of arrays plus JSON metadata, never pickle.

A file holds named NumPy arrays and a ``__meta__`` entry (UTF-8 JSON stored
as a uint8 array) with the estimator class, its hyper-parameters, the seeds
and versions.  Files are written to a temporary name in the same folder and
renamed into place, so a reader never sees a half-written file and a failed
fit leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np

FORMAT = "dkernel-npz"
FORMAT_VERSION = 1


def _versions() -> dict[str, str]:
    import dask
    import distributed

    from dkernel import __version__

    return {"dkernel": __version__, "numpy": np.__version__, "dask": dask.__version__,
            "distributed": distributed.__version__}


def write_npz_atomic(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Write arrays + JSON meta to ``path`` atomically (temp file, fsync, rename)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "versions": _versions(), **meta}
    blob = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    for key in arrays:
        if key == "__meta__":
            raise ValueError("'__meta__' is reserved")
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, __meta__=blob, **{k: np.asarray(v) for k, v in arrays.items()})
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_npz(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """Arrays and metadata of a file written by :func:`write_npz_atomic`."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no model or checkpoint file at {path!r}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:
        raise ValueError(f"{path!r} is not a dkernel file ({exc})") from None
    if "__meta__" not in arrays:
        raise ValueError(f"{path!r} is not a dkernel file (no metadata)")
    meta = json.loads(arrays.pop("__meta__").tobytes().decode())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path!r} is not a dkernel file (format {meta.get('format')!r})")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{path!r} was written by a newer dkernel (format {meta['format_version']}); upgrade dkernel"
        )
    return arrays, meta


def save_model(estimator: Any, path: str | os.PathLike) -> None:
    """Save a fitted estimator to ``path`` (a ``.npz`` file), atomically."""
    arrays, meta = estimator._get_model_state()
    params = estimator.get_params()
    if not isinstance(params.get("random_state", 0), (int, np.integer)):
        # None / RandomState / Generator: the file keeps the integer seed the fit used
        params["random_state"] = getattr(estimator, "random_state_", None)
    if hasattr(estimator, "feature_names_in_"):  # DataFrame columns seen by fit
        meta = {**meta, "feature_names_in": [str(c) for c in estimator.feature_names_in_]}
    write_npz_atomic(path, arrays, {"kind": "model", "estimator": type(estimator).__name__,
                                    "params": _jsonable(params), **meta})


def load_model(path: str | os.PathLike) -> Any:
    """Load an estimator saved with :func:`save_model`."""
    from dkernel import estimators

    arrays, meta = read_npz(path)
    if meta.get("kind") != "model":
        raise ValueError(f"{os.fspath(path)!r} is a {meta.get('kind')}, not a model")
    cls = getattr(estimators, meta["estimator"], None)
    if cls is None:
        raise ValueError(f"{os.fspath(path)!r} holds an unknown estimator {meta['estimator']!r}")
    est = cls(**meta["params"])
    est._set_model_state(arrays, meta)
    if "feature_names_in" in meta:
        est.feature_names_in_ = np.asarray(meta["feature_names_in"], dtype=object)
    return est


def _jsonable(params: dict) -> dict:
    out = {}
    for k, v in params.items():
        if k == "client" or callable(v):
            continue
        if isinstance(v, np.generic):
            v = v.item()
        out[k] = v
    return out
