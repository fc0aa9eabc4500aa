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


#: Arrays a worker receives over the network can start at any byte of the
#: message buffer (distributed packs a message's frames back to back), even off
#: their itemsize.  OpenBLAS ran at half speed on such an operand: 2.6 s vs 1.3 s
#: for a (1024 x 784) @ (784 x 60000) float32 product on one core.  16 bytes is
#: what NumPy's own allocations give.
_ALIGNMENT = 16


def aligned(a: Any) -> Any:
    """``a``, or an aligned copy when ``a`` is a NumPy array that starts off a
    16-byte boundary (see ``_ALIGNMENT``); anything else unchanged."""
    if isinstance(a, np.ndarray) and a.ctypes.data % _ALIGNMENT:
        return a.copy(order="K")
    return a


def align_arrays(d: dict) -> dict:
    """Replace, in place, the misaligned NumPy values of ``d`` by aligned copies.

    In place on purpose: a payload broadcast once to a worker is the same
    object in every task there, so the copy is made once, not once per task."""
    for k, v in d.items():
        if isinstance(v, np.ndarray) and v.ctypes.data % _ALIGNMENT:
            d[k] = aligned(v)
    return d


def asarray_like(a: np.ndarray, like: Any) -> Any:
    """``a`` (a NumPy array) moved to the backend of ``like``."""
    xp = namespace(like)
    return a if xp is np else xp.asarray(a)


def to_numpy(a: Any) -> np.ndarray:
    """Bring a (possibly device) array back to host NumPy."""
    if namespace(a) is np:
        return np.asarray(a)
    return a.get()
