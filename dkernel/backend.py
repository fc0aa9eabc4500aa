"""Array-namespace helpers so chunk math runs unchanged on NumPy and CuPy.

Chunk functions call :func:`namespace` on their input and use the returned
module (``numpy`` or ``cupy``) for every array operation; random weights are
always generated with NumPy (bit-identical everywhere) and moved with
:func:`asarray_like`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
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
#: what NumPy's own allocations give.  An array off its itemsize also rounds
#: differently: NumPy's matmul first copies it into C order, so a transposed view
#: (Oja's Z_b^T C) goes to BLAS untransposed, 3.3e-7 (relative, float32) away
#: from the aligned product -- a model would then depend on where a task ran.
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


def aligned_tree(obj: Any) -> Any:
    """``obj`` with every misaligned NumPy array in it, at any depth of dicts,
    lists and tuples, replaced by an aligned copy (:func:`aligned`).

    Not in place: a container is rebuilt only where something in it was
    copied, so an object that arrived aligned (or never travelled) is returned
    as it is, and a task result the worker still holds is never changed."""
    if isinstance(obj, np.ndarray):
        return aligned(obj)
    # plain containers only: a namedtuple or a dict subclass is passed through
    # as it is (rebuilt as a plain one it would lose its fields or its type)
    if type(obj) is dict:
        new = {k: aligned_tree(v) for k, v in obj.items()}
        return obj if all(new[k] is v for k, v in obj.items()) else new
    if type(obj) in (list, tuple):
        items = [aligned_tree(v) for v in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        return items if type(obj) is list else tuple(items)
    return obj


def asarray_like(a: np.ndarray, like: Any) -> Any:
    """``a`` (a NumPy array) moved to the backend of ``like``."""
    xp = namespace(like)
    return a if xp is np else xp.asarray(a)


def to_numpy(a: Any) -> np.ndarray:
    """Bring a (possibly device) array back to host NumPy."""
    if namespace(a) is np:
        return np.asarray(a)
    return a.get()


# --- fresh memory for long-lived blocks -------------------------------------------------
#: NumPy asks the kernel for transparent huge pages on every allocation of 4 MB
#: or more.  Where the kernel then compacts memory in the page fault (THP
#: "defrag" of always, madvise or defer+madvise: Ubuntu's default), a first
#: touch costs 0.17-2 s per GB (cheap only while free huge pages are at hand),
#: against 0.35-0.39 s per GB for plain pages (3 GB on a 2-core VM, three runs
#: each, alternating).  Fashion-MNIST, 2 workers: the fixed16 kernel-row fill
#: took 23.6-23.8 s without the advice and 28.0-33.2 s with it;
#: DSGClassifier(n_features=8192)'s first epoch, which fills the feature
#: cache, 5.1-5.4 s against 7.1-7.7 s.  Reading blocks back was 8-12% slower
#: on plain pages in a one-thread pass (decode and product over 1.9 GB); the
#: fits' later epochs showed no difference beyond noise.  By the one-thread
#: figure, a fit would need roughly 30 epochs before the advice paid for itself.
_HUGEPAGE_SETTER = getattr(getattr(getattr(np, "_core", None) or getattr(np, "core", None),
                                   "multiarray", None), "_set_madvise_hugepage", None)
_advice_lock = threading.Lock()
_advice_off = 0
_advice_before = True


def _compacts_in_fault(path: str = "/sys/kernel/mm/transparent_hugepage/defrag") -> bool:
    """Whether the kernel compacts memory synchronously for a region advised to use
    huge pages (the selected THP defrag mode, in brackets in the file)."""
    try:
        text = Path(path).read_text()
    except OSError:  # not Linux, or no THP: nothing to avoid
        return False
    mode = text[text.find("[") + 1 : text.find("]")] if "[" in text else text.strip()
    return mode in ("always", "madvise", "defer+madvise")


_COMPACTS = _compacts_in_fault()


@contextmanager
def plain_pages() -> Iterator[None]:
    """NumPy arrays allocated inside get no huge-page advice where that advice
    makes the first touch compact memory (see ``_HUGEPAGE_SETTER``'s comment);
    elsewhere, and without NumPy's private switch, nothing changes.  The switch is
    process-wide: a counter keeps it off until the last thread inside leaves."""
    global _advice_off, _advice_before
    if _HUGEPAGE_SETTER is None or not _COMPACTS:
        yield
        return
    with _advice_lock:
        if _advice_off == 0:
            _advice_before = _HUGEPAGE_SETTER(False)
        _advice_off += 1
    try:
        yield
    finally:
        with _advice_lock:
            _advice_off -= 1
            if _advice_off == 0:
                _HUGEPAGE_SETTER(_advice_before)


# --- the client's BLAS threads ----------------------------------------------------------
@contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS on one thread in this process while inside (``threadpoolctl``: the
    limit is process-wide, and the value found on entry is restored on exit).

    Not solved: two fits on two threads of one client overlap, the second
    saves the first one's 1 and restores it last, and the client's BLAS stays
    on one thread for the session (later fits' eigensolves then round
    differently).  A reference count (first in sets, last out restores) did
    not cure it: with OpenBLAS 0.3.30/0.3.31 a count raised from one thread
    does not take effect while the thread that lowered it is alive."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def on_one_blas_thread(method: Callable) -> Callable:
    """Run ``method`` with the client's BLAS on one thread.

    The client's work during a pass (each step's update: O(D q c) for a
    preconditioned step) is small, but a threaded BLAS call leaves OpenBLAS's
    helper threads spinning for a while after it returns, on the cores the
    workers compute on.  On the 2-core VM (DSG, 2M x 32, 2 workers, 16 steps)
    the client process burned 2.5-2.8 CPU seconds per fit with 2 BLAS threads
    and 1.1-1.3 with one, and the epoch took 4.3 s instead of 3.8 s.
    The limit is process-wide (:func:`one_blas_thread`): BLAS work in other
    client threads during the pass runs on one thread too.
    """
    @wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        with one_blas_thread():
            return method(*args, **kwargs)
    return run
