"""Array-namespace helpers so chunk math runs unchanged on NumPy and CuPy.

Chunk functions call :func:`namespace` on their input and use the returned
module (``numpy`` or ``cupy``) for every array operation; random weights are
always generated with NumPy (bit-identical everywhere) and moved with
:func:`asarray_like`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np


def namespace(x: Any) -> ModuleType:
    """The array module (``numpy`` or ``cupy``) that owns ``x``."""
    mod = type(x).__module__
    if mod.startswith("cupy"):
        import cupy  # only imported when a CuPy array is actually seen

        return cupy
    return np


def asarray_like(a: np.ndarray, like: Any) -> Any:
    """``a`` (a NumPy array) moved to the backend of ``like``."""
    xp = namespace(like)
    return a if xp is np else xp.asarray(a)


def to_numpy(a: Any) -> np.ndarray:
    """Bring a (possibly device) array back to host NumPy."""
    if namespace(a) is np:
        return np.asarray(a)
    return a.get()
