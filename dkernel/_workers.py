"""What the scheduler says about its workers, and how long a wait on a
cluster of no workers may last.

Below the engine and the data layer, which both wait on tasks: a fit's steps
(:mod:`dkernel.engine.stall`) and the tasks that write a store
(:func:`dkernel.data.store.run_writes`).  Without such a limit a wait whose
workers were all lost lasted for ever: Dask keeps the tasks for a worker that
may come.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

#: Seconds a wait for a cluster that has no worker lasts before it stops
#: (``$DKERNEL_WORKER_TIMEOUT`` overrides it): long enough for a pod or a batch
#: job to start, short of the silent wait for ever that Dask's tasks would do.
WORKER_TIMEOUT = 300.0


def worker_timeout() -> float:
    """Seconds to wait for a first worker (and, mid-fit or mid-write, for one
    after all were lost): ``$DKERNEL_WORKER_TIMEOUT`` if set, else
    :data:`WORKER_TIMEOUT`; a value that is not a number of seconds >= 0 stops
    with an error naming the variable."""
    raw = os.environ.get("DKERNEL_WORKER_TIMEOUT")
    if raw is None:
        return WORKER_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (0 <= value < math.inf):
        raise ValueError(f"DKERNEL_WORKER_TIMEOUT={raw!r} is not a number of seconds >= 0; "
                         f"set it to e.g. {WORKER_TIMEOUT:g} (0: do not wait)")
    return value


def workers_info(client: Any) -> dict[str, dict]:
    """The scheduler's record of every worker now ({address: info}: status,
    memory, nthreads), asked afresh.  Not ``client.scheduler_info()``: that
    returns the client's cached identity, which a periodic refresh (distributed
    2026.8) may replace with one that lists no workers between the fetch and
    the return -- the kernel-row fill read it as "a worker left the cluster"
    and fell back to filling per chunk, in 2 runs of 2 at 63 lanes."""
    return client.sync(client.scheduler.identity, n_workers=-1).get("workers", {})


def workers_or_none(client: Any) -> dict[str, dict] | None:
    """:func:`workers_info`, or None when the scheduler is busy or gone (the
    caller's wait decides).  Not every error: distributed < 2025.4's TypeError
    switched the watchdog off for good, and a fit on paused workers waited for
    ever."""
    try:
        return workers_info(client)
    except (OSError, TimeoutError):
        return None


class NoWorkersWatch:
    """``check(workers, pending)`` between timed-out waits raises once the
    cluster has listed no worker for :func:`worker_timeout` seconds; ``where``
    opens the message ("the fit", "writing 'out.zarr'")."""

    def __init__(self, where: str, log: logging.Logger) -> None:
        self.where, self.log = where, log
        #: since when the scheduler has listed no worker (None: it has some)
        self.empty_since: float | None = None

    def check(self, workers: dict, pending: int) -> None:
        if workers:
            self.empty_since = None
            return
        now = time.monotonic()
        if self.empty_since is None:
            self.empty_since = now
            self.log.warning("%s: the cluster has no workers left; waiting up to %g s for one",
                             self.where, worker_timeout())
        waited = now - self.empty_since
        if waited >= worker_timeout():
            raise RuntimeError(
                f"{self.where} stopped: the cluster has had no workers for {waited:.0f} s "
                f"(they were lost) and {pending} of its tasks wait; start workers, or set "
                "DKERNEL_WORKER_TIMEOUT to wait longer")
