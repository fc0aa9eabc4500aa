"""Worker-resident cache of blocks derived from a data chunk (feature blocks
Phi(X_c) of a seed, kernel blocks K(X_c, C)).

Regenerating a block costs O(rows x width x d) flops every epoch; keeping it
turns later epochs into matrix-vector work (Falkon keeps K_nm in RAM when it
fits).  The cache is bounded: it may use ``fraction`` of the worker's memory
limit (dask config ``dkernel.cache-fraction``, default 0.4), evicts least
recently used blocks of *other* runs that have stopped asking for blocks
(``dkernel.cache-live-seconds``, 60 s: a fit still running on a shared
cluster keeps its blocks; a fit that has ended retires its own at once,
:func:`retire`), and :func:`lookup_or_fill` declines
blocks that do not fit so the caller computes only the rows it needs --
streaming recomputation with O(chunk + model) memory.  Values are pure
functions of their key, so a lost or evicted entry is simply recomputed.

Why a run never evicts its own blocks: a fit reads its chunks in a cycle
(every epoch the same blocks), and plain LRU on a cycle larger than the
budget evicts each block just before it is needed again -- a hit rate of
zero however close the budget is to the working set.  Keeping the blocks
that were filled first and declining the rest gives a hit rate of budget /
working set.  A block filled by an earlier run (another fit, or the same
fit before a restart) becomes the current run's on its first hit.  A block
two running fits share (the same data and seed) belongs to both: it stays
while either is running, and neither evicts it to make room.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import dask

from dkernel.backend import plain_pages
from dkernel.engine.settings import number

_DEFAULT_FRACTION = 0.4
_lock = threading.Lock()
_entries: OrderedDict[Hashable, Any] = OrderedDict()
_bytes = 0
_stats = {"hits": 0, "misses": 0, "declined": 0}
# Last time each owner asked for a block.  Blocks of an owner seen within
# ``dkernel.cache-live-seconds`` (default 60 s) belong to a fit that is still
# running -- possibly concurrently on the same worker -- and are not evicted
# by another owner: concurrent fits on a shared cluster share the budget
# first come, first served (a latecomer's blocks are declined and streamed)
# instead of evicting each other's working sets every step.
_seen: dict[Hashable, float] = {}
_DEFAULT_LIVE_SECONDS = 60.0


def budget() -> int:
    """Bytes this process may hold in the cache: its ``dkernel.cache-fraction``
    of its worker's memory limit."""
    fraction = number("dkernel.cache-fraction", _DEFAULT_FRACTION, 0.0, 1.0)
    try:
        from distributed import get_worker

        limit = get_worker().memory_manager.memory_limit
    except (ValueError, AttributeError):
        limit = None
    if not limit:
        import psutil

        limit = psutil.virtual_memory().total // 4
    return int(fraction * limit)


def headroom() -> int:
    """Bytes this process can add to the cache before Dask starts spilling:
    :func:`budget`, less what the process already holds beyond its cache when
    that would take it past the worker's spill threshold
    (``distributed.worker.memory.spill`` of the limit).  With a small limit the
    interpreter alone is a third of it (about 200 MB of 600 MB here), and a
    budget of 0.4 of the limit on top made the worker spill its chunks."""
    room = budget()
    try:
        from distributed import get_worker

        limit = get_worker().memory_manager.memory_limit
    except (ValueError, AttributeError):
        return room
    spill = dask.config.get("distributed.worker.memory.spill", 0.7)
    if not limit or not spill:
        return room
    import psutil

    held = psutil.Process().memory_info().rss - _bytes
    return max(0, min(room, int(float(spill) * limit) - held))


def budgets(client: Any) -> dict[str, int]:
    """Each worker's :func:`headroom`, asked as a task on it: the worker's memory
    limit is only visible inside a task (``client.run`` runs outside one).  A
    worker that leaves first (``--lifetime`` restarts it under another address,
    where its query, held to the old one, would wait for ever) is left out."""
    from dkernel.engine.cluster import require_workers
    from dkernel.engine.stall import PauseWatch, gather, wait_on

    # the client's settings, checked here (a worker's error named no key); each
    # worker answers with its own, which is what its cache will keep to
    number("dkernel.cache-fraction", _DEFAULT_FRACTION, 0.0, 1.0)
    number("dkernel.cache-live-seconds", _DEFAULT_LIVE_SECONDS)
    label = "the workers' memory query"
    while True:
        futs = {w: client.submit(headroom, workers=[w], allow_other_workers=False, pure=False)
                for w in sorted(client.nthreads())}
        watch = PauseWatch(client, label)
        while futs:
            try:
                wait_on(client, list(futs.values()), timeout=_QUERY_CHECK_SECONDS)
                break
            except TimeoutError:
                alive = set(client.nthreads())
                for w in [w for w, f in futs.items() if w not in alive and not f.done()]:
                    futs.pop(w).cancel()
                pending = [f for f in futs.values() if not f.done()]
                watch.check(len(pending), [f.key for f in pending])
        if futs:
            return dict(zip(futs, gather(client, list(futs.values()), label)))
        require_workers(client)  # (every worker left: ask those that came instead)


#: Seconds between checks that the workers asked still belong to the cluster.
_QUERY_CHECK_SECONDS = 5.0


def _evictable(owner: Hashable | None, entry_owners: frozenset, now: float,
               live: float) -> bool:
    """Whether ``owner`` may evict a block of ``entry_owners`` (lock held): one
    that ``owner`` does not use, whose every user has not asked for a block in
    ``live`` seconds (or has retired).  A block kept only for its last user
    was evicted when that fit retired, though another fit sharing it was still
    running -- by a third fit, or by the sharer itself making room."""
    if owner is None:
        return True
    return owner not in entry_owners and all(
        now - _seen.get(o, -math.inf) > live for o in entry_owners)


def _owners(owner: Hashable | None, previous: frozenset = frozenset()) -> frozenset:
    """The users of a block ``owner`` touches (lock held): the running ones of
    ``previous`` (retired fits are dropped, so the set stays small) and it."""
    kept = frozenset(o for o in previous if o in _seen)
    return kept if owner is None else kept | {owner}


def _room(limit: int, owner: Hashable | None, now: float, live: float) -> int:
    """Bytes free once every entry ``owner`` may evict is gone (lock held)."""
    evictable = sum(v.nbytes for v, o in _entries.values() if _evictable(owner, o, now, live))
    return limit - _bytes + evictable


def lookup_or_fill(key: Hashable, compute: Callable[[], Any], nbytes: int,
                   owner: Hashable | None = None) -> Any | None:
    """The cached value of ``key``; else computed and stored if ``nbytes`` fits
    the budget once least recently used entries of other owners are evicted;
    else None (nothing computed).  ``owner`` names the run asking (None: any
    entry may be evicted, plain LRU)."""
    global _bytes
    live = number("dkernel.cache-live-seconds", _DEFAULT_LIVE_SECONDS)
    with _lock:
        now = time.monotonic()
        if owner is not None:
            _seen[owner] = now
        if key in _entries:
            _entries.move_to_end(key)
            value, old_owners = _entries[key]
            if owner is not None and owner not in old_owners:
                _entries[key] = (value, _owners(owner, old_owners))
            _stats["hits"] += 1
            return value
        limit = budget()
        if nbytes > _room(limit, owner, now, live):
            _stats["declined"] += 1
            return None
    with plain_pages():  # a block lives for the fit: its first touch is what costs
        value = compute()
    # threads filling at once may each have counted the same room: the budget
    # can be overrun by a block per worker thread, never more
    with _lock:
        _stats["misses"] += 1
        if key in _entries:  # filled by another thread meanwhile
            return _entries[key][0]
        for k in [k for k, (_, o) in _entries.items() if _evictable(owner, o, now, live)]:
            if _bytes + value.nbytes <= limit:
                break
            _bytes -= _entries.pop(k)[0].nbytes
        _entries[key] = (value, _owners(owner))
        _bytes += value.nbytes
    return value


def retire(owners: list) -> None:
    """Mark ``owners`` (finished fits) as no longer running: their blocks stay
    for a later fit to hit, but any other run may evict them at once.  Before,
    a finished fit's blocks counted as live for ``dkernel.cache-live-seconds``,
    so the next fit of a grid search found no room and streamed (the third of
    three back-to-back fits on 700 MB workers filled 0 blocks, declined 2482),
    and every fit left an entry here for good."""
    with _lock:
        for owner in owners:
            _seen.pop(owner, None)


def stats() -> dict[str, int]:
    """Hits, misses, declined requests, entries and bytes held (for tests and reports)."""
    with _lock:
        return {**_stats, "entries": len(_entries), "bytes": _bytes}


def clear() -> None:
    global _bytes
    with _lock:
        _entries.clear()
        _seen.clear()
        _bytes = 0
        for k in _stats:
            _stats[k] = 0


def peek(key: Hashable) -> Any | None:
    """The cached value of ``key`` (None if absent), counting no hit: for a
    pre-pass that writes into an entry it allocated.  The entry's owners count
    as running again (a fill longer than ``dkernel.cache-live-seconds`` kept
    its half-written blocks from other fits only until then)."""
    with _lock:
        entry = _entries.get(key)
        if entry is None:
            return None
        now = time.monotonic()
        for owner in entry[1]:
            if owner in _seen:  # (a retired owner stays retired)
                _seen[owner] = now
        return entry[0]


def discard(key: Hashable) -> bool:
    """Drop ``key`` if present (an entry a failed pre-pass left half written)."""
    global _bytes
    with _lock:
        entry = _entries.pop(key, None)
        if entry is None:
            return False
        _bytes -= entry[0].nbytes
        return True


def discard_matching(match: Callable[[Hashable], bool]) -> int:
    """Drop every entry whose key ``match`` accepts; returns how many."""
    global _bytes
    with _lock:
        keys = [k for k in _entries if match(k)]
        for k in keys:
            _bytes -= _entries.pop(k)[0].nbytes
        return len(keys)


def rename(old: Hashable, new: Hashable) -> bool:
    """Move the entry ``old`` to the key ``new`` (replacing one there): how a
    pre-pass publishes blocks it filled under a private key, so that a pass
    killed half-way leaves nothing a later lookup of ``new`` would trust."""
    global _bytes
    with _lock:
        entry = _entries.pop(old, None)
        if entry is None:
            return False
        replaced = _entries.pop(new, None)
        if replaced is not None:
            _bytes -= replaced[0].nbytes
        _entries[new] = entry
        return True
