"""Worker-resident cache of blocks derived from a data chunk (feature blocks
Phi(X_c) of a seed, kernel blocks K(X_c, C)).

Regenerating a block costs O(rows x width x d) flops every epoch; keeping it
turns later epochs into matrix-vector work (Falkon keeps K_nm in RAM when it
fits).  The cache is bounded: it may use ``fraction`` of the worker's memory
limit (dask config ``dkernel.cache-fraction``, default 0.4), evicts least
recently used blocks, and :func:`lookup_or_fill` declines blocks that do not
fit so the caller computes only the rows it needs -- streaming recomputation
with O(chunk + model) memory.  Values are pure functions of their key, so a
lost or evicted entry is simply recomputed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable

import dask

_DEFAULT_FRACTION = 0.4
_lock = threading.Lock()
_entries: OrderedDict[Hashable, Any] = OrderedDict()
_bytes = 0
_stats = {"hits": 0, "misses": 0, "declined": 0}


def budget() -> int:
    """Bytes this process may hold in the cache."""
    fraction = float(dask.config.get("dkernel.cache-fraction", _DEFAULT_FRACTION))
    try:
        from distributed import get_worker

        limit = get_worker().memory_manager.memory_limit
    except (ValueError, AttributeError):
        limit = None
    if not limit:
        import psutil

        limit = psutil.virtual_memory().total // 4
    return int(fraction * limit)


def lookup_or_fill(key: Hashable, compute: Callable[[], Any], nbytes: int) -> Any | None:
    """The cached value of ``key``; computed and stored if ``nbytes`` fits the
    budget (evicting old entries); None if it cannot fit."""
    global _bytes
    with _lock:
        if key in _entries:
            _entries.move_to_end(key)
            _stats["hits"] += 1
            return _entries[key]
    limit = budget()
    if nbytes > limit:
        _stats["declined"] += 1
        return None
    value = compute()
    with _lock:
        _stats["misses"] += 1
        while _entries and _bytes + nbytes > limit:
            _, old = _entries.popitem(last=False)
            _bytes -= old.nbytes
        _entries[key] = value
        _bytes += value.nbytes
    return value


def stats() -> dict[str, int]:
    """Hits, misses, declined requests, entries and bytes held (for tests and reports)."""
    with _lock:
        return {**_stats, "entries": len(_entries), "bytes": _bytes}


def clear() -> None:
    global _bytes
    with _lock:
        _entries.clear()
        _bytes = 0
        for k in _stats:
            _stats[k] = 0
